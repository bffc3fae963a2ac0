// kvarn_baseline_roundtrip: the per-token RTN and fp8 e4m3 baselines of the accuracy study,
// checked against values computed independently here (exhaustive e4m3 grid, hand examples) and
// on every error path.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kvarn/kvarn_experimental.h"
#include "support/kvarn_test.h"
#include "support/rng.h"

namespace {

using kvt::IsError;

struct E4m3 {
  double value;
  int bits;
};

// Every finite e4m3 value (OCP FN: bias 7, 0x7f/0xff are NaN), decoded from its bits, ascending
// (-0 dropped).
std::vector<E4m3> AllE4m3() {
  std::vector<E4m3> all;
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7f) == 0x7f || bits == 0x80) continue;
    const int sign = bits >> 7, exp = (bits >> 3) & 0xf, mant = bits & 7;
    const double mag =
        exp == 0 ? mant * std::ldexp(1.0, -9) : (1.0 + mant / 8.0) * std::ldexp(1.0, exp - 7);
    all.push_back({sign ? -mag : mag, bits});
  }
  std::sort(all.begin(), all.end(), [](const E4m3& a, const E4m3& b) { return a.value < b.value; });
  return all;
}

std::vector<float> Roundtrip(kvarn_baseline_t method, int bits, const std::vector<float>& in,
                             int cols) {
  std::vector<float> out(in.size(), -7.0f);
  EXPECT_EQ(kvarn_baseline_roundtrip(method, bits, in.size() / cols, cols, in.data(), out.data()),
            KVARN_OK)
      << kvarn_last_error();
  return out;
}

TEST(BaselineFp8, EveryE4m3ValueIsAFixedPointAtUnitScale) {
  // A row whose absmax is 448 has scale exactly 1, so every e4m3 value must come back unchanged.
  const std::vector<E4m3> all = AllE4m3();
  ASSERT_EQ(all.size(), 253u);  // 256 codes - 2 NaNs - (-0)
  for (const E4m3& e : all) {
    const std::vector<float> row = {448.0f, static_cast<float>(e.value)};
    const std::vector<float> out = Roundtrip(KVARN_BASELINE_FP8_E4M3, 0, row, 2);
    EXPECT_EQ(out[0], 448.0f);
    EXPECT_EQ(out[1], static_cast<float>(e.value)) << e.value;
  }
}

TEST(BaselineFp8, RoundsToTheNearestValueTiesToEven) {
  const std::vector<E4m3> grid = AllE4m3();
  kvt::Rng rng(0xf8e4);
  for (size_t i = 0; i + 1 < grid.size(); ++i) {
    const E4m3 lo = grid[i], hi = grid[i + 1];
    // The midpoint goes to the neighbour whose code is even (mantissa ending in 0).
    const double mid = 0.5 * (lo.value + hi.value);
    const double even = (lo.bits & 1) == 0 ? lo.value : hi.value;
    EXPECT_EQ(Roundtrip(KVARN_BASELINE_FP8_E4M3, 0, {448.0f, static_cast<float>(mid)}, 2)[1],
              static_cast<float>(even))
        << mid;
    // Any other point in (lo, hi) goes to the nearer end.
    const double x = lo.value + rng.Uniform(0.01, 0.99) * (hi.value - lo.value);
    if (x == mid) continue;
    const double nearer = (x - lo.value < hi.value - x) ? lo.value : hi.value;
    EXPECT_EQ(Roundtrip(KVARN_BASELINE_FP8_E4M3, 0, {448.0f, static_cast<float>(x)}, 2)[1],
              static_cast<float>(nearer))
        << x;
  }
  // Ties: 1 + 1/16 lies between 1 (mantissa 000) and 1.125 (001): goes to 1.
  EXPECT_EQ(Roundtrip(KVARN_BASELINE_FP8_E4M3, 0, {448.0f, 1.0625f}, 2)[1], 1.0f);
  // 1.1875 lies between 1.125 (001) and 1.25 (010): goes to 1.25.
  EXPECT_EQ(Roundtrip(KVARN_BASELINE_FP8_E4M3, 0, {448.0f, 1.1875f}, 2)[1], 1.25f);
}

TEST(BaselineFp8, ScalesEachRowByItsAbsmax) {
  kvt::Rng rng(81);
  const int cols = 128, rows = 64;
  std::vector<float> in(rows * cols);
  for (int r = 0; r < rows; ++r) {
    const double mag = std::pow(10.0, rng.Uniform(-3, 3));
    for (int c = 0; c < cols; ++c) in[r * cols + c] = static_cast<float>(mag * rng.Normal());
  }
  const std::vector<float> out = Roundtrip(KVARN_BASELINE_FP8_E4M3, 0, in, cols);
  for (int r = 0; r < rows; ++r) {
    double err = 0, sig = 0;
    for (int c = 0; c < cols; ++c) {
      const double e = out[r * cols + c] - in[r * cols + c];
      err += e * e;
      sig += double(in[r * cols + c]) * in[r * cols + c];
    }
    // 3 mantissa bits: relative error per element <= 2^-4, so relative MSE well under 4e-3.
    EXPECT_LT(err / sig, 4e-3) << "row " << r;
    EXPECT_GT(err / sig, 1e-5) << "row " << r << ": fp8 cannot be this accurate";
  }
}

TEST(BaselineRtn, HandExamples) {
  // zero = 0, scale = 1: the integers 0..3 are exact at 2 bits.
  EXPECT_EQ(Roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, 2, {0, 1, 2, 3}, 4),
            (std::vector<float>{0, 1, 2, 3}));
  // range [-1, 2] at 2 bits: scale 1, codes of 0.5 -> 1.5 is a tie at 1.5 - (-1) = 1.5 -> 2 (even).
  EXPECT_EQ(Roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, 2, {-1, 2, 0.5f, 0.4f}, 4),
            (std::vector<float>{-1, 2, 1, 0}));
  // A constant row comes back exactly (as its fp16 value).
  EXPECT_EQ(Roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, 4, {3, 3, 3}, 3),
            (std::vector<float>{3, 3, 3}));
}

TEST(BaselineRtn, ErrorWithinHalfAStepAndRowsIndependent) {
  kvt::Rng rng(4242);
  for (int bits : {2, 3, 4, 8}) {
    const int cols = 96, rows = 33;
    std::vector<float> in(rows * cols);
    for (float& x : in) x = static_cast<float>(rng.Normal() * rng.Uniform(0.1, 5));
    const std::vector<float> out = Roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, bits, in, cols);
    for (int r = 0; r < rows; ++r) {
      float lo = in[r * cols], hi = lo;
      for (int c = 0; c < cols; ++c) {
        lo = std::min(lo, in[r * cols + c]);
        hi = std::max(hi, in[r * cols + c]);
      }
      const double step = (hi - lo) / ((1 << bits) - 1);
      for (int c = 0; c < cols; ++c) {
        // half a step, plus the fp16 rounding of the zero and the scale
        EXPECT_LE(std::fabs(out[r * cols + c] - in[r * cols + c]),
                  0.5 * step + 1e-3 * (std::fabs(lo) + std::fabs(hi)))
            << "bits " << bits << " row " << r;
      }
      // The same row alone gives the same result (no state across rows).
      const std::vector<float> row(in.begin() + r * cols, in.begin() + (r + 1) * cols);
      const std::vector<float> alone = Roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, bits, row, cols);
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), out.begin() + r * cols));
    }
  }
}

TEST(BaselineApi, InPlaceEqualsOutOfPlace) {
  kvt::Rng rng(7);
  std::vector<float> in(4 * 64);
  for (float& x : in) x = static_cast<float>(rng.Normal());
  for (kvarn_baseline_t m : {KVARN_BASELINE_PER_TOKEN_RTN, KVARN_BASELINE_FP8_E4M3}) {
    const std::vector<float> out = Roundtrip(m, 4, in, 64);
    std::vector<float> inplace = in;
    ASSERT_EQ(kvarn_baseline_roundtrip(m, 4, 4, 64, inplace.data(), inplace.data()), KVARN_OK);
    EXPECT_EQ(inplace, out);
  }
}

TEST(BaselineApi, BadInputIsRejectedAndNothingIsWritten) {
  std::vector<float> in = {1, 2, 3, 4}, out(4, -7.0f);
  const std::vector<float> untouched(4, -7.0f);
  EXPECT_TRUE(IsError(
      kvarn_baseline_roundtrip(static_cast<kvarn_baseline_t>(9), 4, 1, 4, in.data(), out.data()),
      KVARN_ERR_INVALID_ARGUMENT, "method"));
  for (int bits : {0, 1, 9}) {
    EXPECT_TRUE(IsError(
        kvarn_baseline_roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, bits, 1, 4, in.data(), out.data()),
        KVARN_ERR_INVALID_ARGUMENT, "bits"));
  }
  EXPECT_TRUE(
      IsError(kvarn_baseline_roundtrip(KVARN_BASELINE_FP8_E4M3, 0, 1, 0, in.data(), out.data()),
              KVARN_ERR_INVALID_ARGUMENT, "cols"));
  EXPECT_TRUE(
      IsError(kvarn_baseline_roundtrip(KVARN_BASELINE_FP8_E4M3, 0, 1, 4, nullptr, out.data()),
              KVARN_ERR_INVALID_ARGUMENT, "NULL"));
  EXPECT_TRUE(IsError(
      kvarn_baseline_roundtrip(KVARN_BASELINE_FP8_E4M3, 0, std::numeric_limits<size_t>::max() / 2,
                               4, in.data(), out.data()),
      KVARN_ERR_INVALID_ARGUMENT, "overflow"));
  in[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(IsError(
      kvarn_baseline_roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, 4, 1, 4, in.data(), out.data()),
      KVARN_ERR_NON_FINITE));
  in[3] = 1e6f;
  EXPECT_TRUE(
      IsError(kvarn_baseline_roundtrip(KVARN_BASELINE_FP8_E4M3, 0, 1, 4, in.data(), out.data()),
              KVARN_ERR_OVERFLOW));
  EXPECT_EQ(out, untouched);
  // Zero rows is a valid no-op.
  EXPECT_EQ(kvarn_baseline_roundtrip(KVARN_BASELINE_FP8_E4M3, 0, 0, 4, nullptr, nullptr), KVARN_OK);
}

}  // namespace
