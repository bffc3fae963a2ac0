// fp16 / bf16 conversions of core/half.h: round to nearest even, subnormals, overflow, NaN
// (docs/FORMAT.md sections 3 and 6: every backend rounds to fp16 the same way).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/half.h"
#include "support/fp.h"
#include "support/rng.h"

namespace {

using kvarn::bf16_to_float;
using kvarn::float_to_bf16;
using kvarn::float_to_half;
using kvarn::half_to_float;

float F(uint32_t bits) { return kvt::BitsFloat(bits); }

TEST(Half, HalfToFloatIsExactForAllPatterns) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (kvt::HalfIsNan(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
      continue;
    }
    const double expect = kvt::HalfToDouble(static_cast<uint16_t>(h));
    ASSERT_EQ(static_cast<double>(f), expect) << "half 0x" << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;  // -0 stays -0
  }
}

TEST(Half, ExhaustiveHalfFloatHalfRoundTrip) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t back = float_to_half(half_to_float(static_cast<uint16_t>(h)));
    if (kvt::HalfIsNan(static_cast<uint16_t>(h))) {
      EXPECT_TRUE(kvt::HalfIsNan(back)) << "NaN 0x" << std::hex << h << " -> 0x" << back;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(back, h) << "0x" << std::hex << h;
    }
  }
}

TEST(Half, RoundsToNearestEvenAtEveryMidpoint) {
  // For every pair of adjacent finite positive halves, the float exactly halfway between them
  // rounds to the one with an even mantissa; one float ulp either side rounds to the nearer one.
  for (uint32_t h = 0; h < 0x7bff; ++h) {
    const double lo = kvt::HalfToDouble(static_cast<uint16_t>(h));
    const double hi = kvt::HalfToDouble(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: halves have 11 bits
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
    ASSERT_EQ(float_to_half(mid), even) << "midpoint above 0x" << std::hex << h;
    ASSERT_EQ(float_to_half(-mid), even | 0x8000) << "midpoint above -0x" << std::hex << h;
    ASSERT_EQ(float_to_half(std::nextafter(mid, 0.f)), h) << std::hex << h;
    ASSERT_EQ(float_to_half(std::nextafter(mid, INFINITY)), h + 1) << std::hex << h;
  }
}

TEST(Half, NamedCases) {
  EXPECT_EQ(float_to_half(0.f), 0x0000);
  EXPECT_EQ(float_to_half(-0.f), 0x8000);
  EXPECT_EQ(float_to_half(1.f), 0x3c00);
  EXPECT_EQ(float_to_half(1.f + 0x1p-11f), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(float_to_half(1.f + 3 * 0x1p-11f), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(float_to_half(65504.f), 0x7bff);             // largest finite half
  EXPECT_EQ(float_to_half(65519.996f), 0x7bff);          // just below the overflow midpoint
  EXPECT_EQ(float_to_half(65520.f), 0x7c00);             // the midpoint rounds to inf (even)
  EXPECT_EQ(float_to_half(-65520.f), 0xfc00);
  EXPECT_EQ(float_to_half(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(float_to_half(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
  // Subnormals: the smallest is 2^-24; 2^-25 is a tie between 0 and 2^-24 and goes to 0.
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);
  EXPECT_EQ(float_to_half(std::nextafter(0x1p-25f, 1.f)), 0x0001);
  EXPECT_EQ(float_to_half(1.5f * 0x1p-24f), 0x0002);      // tie between 1 and 2 units -> 2
  EXPECT_EQ(float_to_half(2.5f * 0x1p-24f), 0x0002);      // tie between 2 and 3 units -> 2
  EXPECT_EQ(float_to_half(0x1p-14f - 0x1p-25f), 0x0400);  // tie at the normal boundary -> even
  EXPECT_EQ(float_to_half(0x1p-14f), 0x0400);             // smallest normal
  EXPECT_EQ(float_to_half(1e-30f), 0x0000);
  EXPECT_EQ(float_to_half(-1e-30f), 0x8000);
  EXPECT_EQ(float_to_half(F(0x00000001u)), 0x0000);  // float subnormal
  EXPECT_TRUE(kvt::HalfIsNan(float_to_half(NAN)));
  EXPECT_TRUE(kvt::HalfIsNan(float_to_half(F(0x7f800001u))));  // signalling NaN stays NaN
  EXPECT_TRUE(kvt::HalfIsNan(float_to_half(F(0xff800001u))));
  EXPECT_TRUE(kvt::HalfIsNan(float_to_half(F(0x7f802000u))));  // payload only in low bits
}

TEST(Half, FloatToHalfMatchesOracleOverFloatSweep) {
  // Every 1009th float bit pattern (4.3M values, all exponents and signs) against the independent
  // double-arithmetic oracle, and against the compiler's _Float16 when it has one.
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 1009) {
    const float f = F(static_cast<uint32_t>(u));
    const uint16_t got = float_to_half(f);
    if (std::isnan(f)) {
      if (!kvt::HalfIsNan(got)) ++mismatches;
      continue;
    }
    const uint16_t want = kvt::FloatToHalf(f);
    if (got != want && mismatches++ < 10) {
      ADD_FAILURE() << "float 0x" << std::hex << u << ": got 0x" << got << ", want 0x" << want;
    }
#if defined(__FLT16_MANT_DIG__)
    _Float16 hw = static_cast<_Float16>(f);
    uint16_t hwb;
    std::memcpy(&hwb, &hw, 2);
    if (got != hwb && mismatches++ < 10) {
      ADD_FAILURE() << "float 0x" << std::hex << u << ": got 0x" << got << ", _Float16 0x" << hwb;
    }
#endif
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Half, OracleAgreesWithCompilerFloat16) {
#if defined(__FLT16_MANT_DIG__)
  KVT_SEEDED_RNG(rng, 0);
  for (int i = 0; i < 1000000; ++i) {
    const float f = F(static_cast<uint32_t>(rng.Next()));
    if (std::isnan(f)) continue;
    _Float16 hw = static_cast<_Float16>(f);
    uint16_t hwb;
    std::memcpy(&hwb, &hw, 2);
    ASSERT_EQ(kvt::FloatToHalf(f), hwb) << std::hex << kvt::FloatBits(f);
  }
#else
  GTEST_SKIP() << "the compiler has no _Float16";
#endif
}

TEST(Bf16, ExhaustiveBf16FloatBf16RoundTrip) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = bf16_to_float(static_cast<uint16_t>(b));
    ASSERT_EQ(kvt::FloatBits(f), b << 16);
    const uint16_t back = float_to_bf16(f);
    if (kvt::Bf16IsNan(static_cast<uint16_t>(b))) {
      EXPECT_TRUE(kvt::Bf16IsNan(back)) << std::hex << b << " -> " << back;
    } else {
      ASSERT_EQ(back, b) << std::hex << b;
    }
  }
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.f + 0x1p-8f), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(float_to_bf16(1.f + 3 * 0x1p-8f), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(std::nextafter(1.f + 0x1p-8f, 2.f)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(float_to_bf16(F(0x7f7f7fffu)), 0x7f7f);  // below the midpoint: finite
  EXPECT_EQ(float_to_bf16(F(0x00008000u)), 0x0000);  // subnormal tie -> even (0)
  EXPECT_EQ(float_to_bf16(F(0x00018000u)), 0x0002);  // subnormal tie -> even (2)
  EXPECT_EQ(float_to_bf16(F(0x00008001u)), 0x0001);
  EXPECT_EQ(float_to_bf16(-0.f), 0x8000);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_TRUE(kvt::Bf16IsNan(float_to_bf16(NAN)));
  EXPECT_TRUE(kvt::Bf16IsNan(float_to_bf16(F(0x7f800001u))));  // would truncate to inf
  EXPECT_TRUE(kvt::Bf16IsNan(float_to_bf16(F(0xff800001u))));
}

TEST(Bf16, FloatToBf16MatchesOracleOverFloatSweep) {
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 1013) {
    const float f = F(static_cast<uint32_t>(u));
    const uint16_t got = float_to_bf16(f);
    if (std::isnan(f)) {
      if (!kvt::Bf16IsNan(got)) ++mismatches;
      continue;
    }
    const uint16_t want = kvt::FloatToBf16(f);
    if (got != want && mismatches++ < 10) {
      ADD_FAILURE() << "float 0x" << std::hex << u << ": got 0x" << got << ", want 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

}  // namespace
