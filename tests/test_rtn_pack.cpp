// Round-to-nearest per row (docs/FORMAT.md section 5), scale absorption (section 6) and bit
// packing (section 7): the CPU reference pieces, then the same through a real kvarn_quantize of
// crafted tiles whose codes and bytes are known in advance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backends/cpu/normalize.h"
#include "backends/cpu/record_codec.h"
#include "backends/cpu/rtn_pack.h"
#include "core/config.h"
#include "core/half.h"
#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/kvarn_test.h"

namespace {

using kvarn::cpu::PackRows;
using kvarn::cpu::RoundToNearestRows;
using kvarn::cpu::UnpackRows;

// ---- RTN ------------------------------------------------------------------------------------

TEST(Rtn, TiesRoundHalfToEven) {
  // lo = 0, hi = 15, 4 bits: step = 1 exactly, so (B - lo) / step is the value itself and the
  // x.5 values are exact ties. Half to even: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4, ...
  // (roundf would give 1, 2, 3, 4, ...).
  const float row[16] = {0,    0.5f, 1.5f, 2.5f,  3.5f,  4.5f,  5.5f,  6.5f,
                         7.5f, 8.5f, 9.5f, 10.5f, 13.5f, 14.5f, 14.5f, 15};
  const uint8_t want[16] = {0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 14, 14, 14, 15};
  uint8_t codes[16];
  float lo, step;
  RoundToNearestRows(row, 1, 16, 4, codes, &lo, &step);
  EXPECT_EQ(lo, 0.f);
  EXPECT_EQ(step, 1.f);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(codes[j], want[j]) << "column " << j;
}

TEST(Rtn, TiesRoundHalfToEvenTwoBitsWithOffset) {
  // lo = -3, hi = 3, 2 bits: step = 2; values -2, 0, 2 sit at exact .5 ties.
  const float row[6] = {-3, -2, 0, 2, 3, 1};
  // (x + 3) / 2 = 0, 0.5, 1.5, 2.5, 3, 2 -> 0, 0, 2, 2, 3, 2
  const uint8_t want[6] = {0, 0, 2, 2, 3, 2};
  uint8_t codes[6];
  float lo, step;
  RoundToNearestRows(row, 1, 6, 2, codes, &lo, &step);
  EXPECT_EQ(lo, -3.f);
  EXPECT_EQ(step, 2.f);
  for (int j = 0; j < 6; ++j) EXPECT_EQ(codes[j], want[j]) << "column " << j;
}

TEST(Rtn, ConstantRowUsesTheStepFloor) {
  for (int bits : {2, 4, 8}) {
    const float row[8] = {5, 5, 5, 5, 5, 5, 5, 5};
    uint8_t codes[8];
    float lo, step;
    RoundToNearestRows(row, 1, 8, bits, codes, &lo, &step);
    EXPECT_EQ(lo, 5.f);
    EXPECT_EQ(step, 1e-10f);
    for (uint8_t c : codes) EXPECT_EQ(c, 0);
  }
  // A spread below qmax * 1e-10 also floors the step; codes stay inside [0, qmax].
  const float tiny[4] = {0, 1e-10f, 2e-10f, 2.9e-10f};
  uint8_t codes[4];
  float lo, step;
  RoundToNearestRows(tiny, 1, 4, 2, codes, &lo, &step);
  EXPECT_EQ(step, 1e-10f);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[3], 3);
}

TEST(Rtn, CodesSpanTheRangeAndStayClamped) {
  // Random rows: min -> 0, max -> qmax, every code in [0, qmax], and each code is the nearest
  // level (|x - (lo + code * step)| <= step / 2, up to fp32 rounding).
  KVT_SEEDED_RNG(rng, 0);
  for (int bits : {2, 4, 8}) {
    const int qmax = (1 << bits) - 1;
    const int R = 64, C = 128;
    std::vector<float> B(R * C);
    for (float& x : B) x = static_cast<float>(rng.Normal() * std::exp(2 * rng.Normal()));
    std::vector<uint8_t> codes(R * C);
    std::vector<float> lo(R), step(R);
    RoundToNearestRows(B.data(), R, C, bits, codes.data(), lo.data(), step.data());
    for (int i = 0; i < R; ++i) {
      const float* row = B.data() + i * C;
      const float mn = *std::min_element(row, row + C), mx = *std::max_element(row, row + C);
      EXPECT_EQ(lo[i], mn);
      EXPECT_EQ(step[i], std::max((mx - mn) / qmax, 1e-10f));
      for (int j = 0; j < C; ++j) {
        const int c = codes[i * C + j];
        ASSERT_LE(c, qmax);
        // Codes come from the fp32 lo and step: rint((x - lo) / step), computed the same way.
        ASSERT_EQ(c, static_cast<int>(std::nearbyint((row[j] - mn) / step[i])));
        if (row[j] == mn) EXPECT_EQ(c, 0);
        if (row[j] == mx) EXPECT_EQ(c, qmax);
        EXPECT_LE(std::fabs(row[j] - (lo[i] + c * step[i])), 0.5 * step[i] * (1 + 1e-5));
      }
    }
  }
}

// ---- scale absorption ---------------------------------------------------------------------

TEST(Absorption, StoresRowScaleTimesStepAndZeroAsFp16) {
  // a = fp16(s_r * step), z = fp16(s_r * lo), c = fp16(s_c), with s_r, s_c from NormalizeTile and
  // lo, step from RTN of the balanced tile (docs/FORMAT.md section 6).
  KVT_SEEDED_RNG(rng, 0);
  for (int bits : {2, 4, 8}) {
    const int R = 128, C = 64;
    std::vector<float> M(R * C);
    for (int i = 0; i < R; ++i) {
      const double rs = std::exp(rng.Normal());
      for (int j = 0; j < C; ++j) M[i * C + j] = static_cast<float>(rs * (rng.Normal() + 0.3));
    }
    kvarn::cpu::TileScratch s;
    std::vector<uint8_t> codes(R * C);
    std::vector<uint16_t> a(R), z(R), c(C);
    ASSERT_TRUE(kvarn::cpu::QuantizeMatrix(M.data(), R, C, bits, true, 8, s, codes.data(), a.data(),
                                           z.data(), c.data())
                    .ok());
    std::vector<float> s_r(R), s_c(C), X;
    kvarn::cpu::NormalizeTile(M.data(), R, C, 8, s_r.data(), s_c.data(), X);
    std::vector<float> B(R * C);
    for (int i = 0; i < R; ++i) {
      for (int j = 0; j < C; ++j) B[i * C + j] = (M[i * C + j] / s_c[j]) / s_r[i];
    }
    std::vector<uint8_t> want_codes(R * C);
    std::vector<float> lo(R), step(R);
    RoundToNearestRows(B.data(), R, C, bits, want_codes.data(), lo.data(), step.data());
    EXPECT_EQ(codes, want_codes);
    for (int i = 0; i < R; ++i) {
      EXPECT_EQ(a[i], kvt::FloatToHalf(s_r[i] * step[i])) << "row " << i;
      EXPECT_EQ(z[i], kvt::FloatToHalf(s_r[i] * lo[i])) << "row " << i;
    }
    for (int j = 0; j < C; ++j) EXPECT_EQ(c[j], kvt::FloatToHalf(s_c[j])) << "column " << j;
  }
}

TEST(Absorption, WithoutNormalizationScalesAreOne) {
  KVT_SEEDED_RNG(rng, 0);
  const int R = 64, C = 128;
  std::vector<float> M(R * C);
  for (float& x : M) x = static_cast<float>(3 * rng.Normal());
  kvarn::cpu::TileScratch s;
  std::vector<uint8_t> codes(R * C);
  std::vector<uint16_t> a(R), z(R), c(C);
  ASSERT_TRUE(kvarn::cpu::QuantizeMatrix(M.data(), R, C, 4, false, 8, s, codes.data(), a.data(),
                                         z.data(), c.data())
                  .ok());
  std::vector<uint8_t> want(R * C);
  std::vector<float> lo(R), step(R);
  RoundToNearestRows(M.data(), R, C, 4, want.data(), lo.data(), step.data());
  EXPECT_EQ(codes, want);
  for (int i = 0; i < R; ++i) {
    EXPECT_EQ(a[i], kvt::FloatToHalf(step[i]));
    EXPECT_EQ(z[i], kvt::FloatToHalf(lo[i]));
  }
  for (uint16_t v : c) EXPECT_EQ(v, 0x3c00);
}

TEST(Absorption, ValuesBeyondFp16FailWithOverflow) {
  // An absorbed zero beyond 65504 must not be stored silently.
  const int R = 64, C = 64;
  std::vector<float> M(R * C, 1.f);
  for (int j = 0; j < C; ++j) M[5 * C + j] = -70000.f + j;  // row 5: lo = -70000
  kvarn::cpu::TileScratch s;
  std::vector<uint8_t> codes(R * C);
  std::vector<uint16_t> a(R), z(R), c(C);
  const auto st = kvarn::cpu::QuantizeMatrix(M.data(), R, C, 4, false, 8, s, codes.data(), a.data(),
                                             z.data(), c.data());
  EXPECT_EQ(st.code(), KVARN_ERR_OVERFLOW);
  EXPECT_NE(st.message().find("fp16"), std::string::npos) << st.message();
}

// ---- packing: hand-computed golden vectors --------------------------------------------------

TEST(Pack, TwoBitCodesGoLeastSignificantFirst) {
  // code c at column c sits in byte c/4 at bit (c mod 4) * 2.
  const uint8_t codes[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  // byte 0 = 0 | 1<<2 | 2<<4 | 3<<6 = 0b11'10'01'00 = 0xE4; byte 1 = 3 | 2<<2 | 1<<4 = 0x1B
  const uint8_t want[2] = {0xE4, 0x1B};
  uint8_t out[2] = {0xFF, 0xFF};
  PackRows(codes, 1, 8, 2, out);
  EXPECT_EQ(out[0], want[0]);
  EXPECT_EQ(out[1], want[1]);
  uint8_t back[8];
  UnpackRows(want, 1, 8, 2, back);
  EXPECT_EQ(std::memcmp(back, codes, 8), 0);
}

TEST(Pack, FourBitEvenColumnIsTheLowNibble) {
  const uint8_t codes[6] = {0x1, 0x2, 0xA, 0xF, 0x0, 0x7};
  const uint8_t want[3] = {0x21, 0xFA, 0x70};
  uint8_t out[3];
  PackRows(codes, 1, 6, 4, out);
  EXPECT_EQ(std::memcmp(out, want, 3), 0)
      << std::hex << int(out[0]) << " " << int(out[1]) << " " << int(out[2]);
  uint8_t back[6];
  UnpackRows(want, 1, 6, 4, back);
  EXPECT_EQ(std::memcmp(back, codes, 6), 0);
}

TEST(Pack, EightBitIsOneCodePerByte) {
  const uint8_t codes[4] = {0, 255, 17, 128};
  uint8_t out[4];
  PackRows(codes, 1, 4, 8, out);
  EXPECT_EQ(std::memcmp(out, codes, 4), 0);
}

TEST(Pack, RowsArePackedOneAfterAnother) {
  // Two rows of 8 two-bit codes: 2 bytes per row.
  const uint8_t codes[16] = {0, 1, 2, 3, 0, 1, 2, 3,   // row 0
                             3, 3, 3, 3, 1, 0, 0, 0};  // row 1
  const uint8_t want[4] = {0xE4, 0xE4, 0xFF, 0x01};
  uint8_t out[4];
  PackRows(codes, 2, 8, 2, out);
  EXPECT_EQ(std::memcmp(out, want, 4), 0);
}

// R x C of the K (D x G) and V (G x D) code fields, D 80 and 96 included.
const std::pair<int, int> kPackShapes[] = {{128, 128}, {64, 128}, {128, 64}, {512, 64}, {64, 512},
                                           {80, 64},   {64, 80},  {96, 128}, {128, 96}};

TEST(Pack, UnpackInvertsPackForEveryShape) {
  KVT_SEEDED_RNG(rng, 0);
  for (int bits : {2, 4, 8}) {
    for (auto rc : kPackShapes) {
      const int R = rc.first, C = rc.second;
      std::vector<uint8_t> codes(R * C), packed(R * C * bits / 8), back(R * C);
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng.Int(0, (1 << bits) - 1));
      PackRows(codes.data(), R, C, bits, packed.data());
      UnpackRows(packed.data(), R, C, bits, back.data());
      ASSERT_EQ(back, codes) << bits << " bits, " << R << "x" << C;
      // And the test-side unpacker (from the spec) agrees.
      ASSERT_EQ(kvt::UnpackCodes(packed.data(), R, C, bits), codes);
    }
  }
}

// ---- packing through a real quantize of crafted tiles -------------------------------------

// The code of row r, column c in the crafted tiles: each row holds 0 and qmax (so lo = 0 and
// step = 1 exactly) and a pattern elsewhere.
int CraftedCode(int r, int c, int qmax) {
  if (c == 0) return 0;
  if (c == 1) return qmax;
  return (5 * c + 3 * r) % (qmax + 1);
}

class CraftedTile : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(CraftedTile, QuantizeWritesTheExpectedBytes) {
  // Inputs are small integers given in the cache frame (no rotation) with normalization ablated,
  // so RTN reproduces them exactly: K channel d of token t holds CraftedCode(d, t) (K rows are
  // channels, codes run over tokens), V token t channel d holds CraftedCode(t, d) (V rows are
  // tokens, codes run over channels).
  const int bits = std::get<0>(GetParam()), D = std::get<1>(GetParam()),
            G = std::get<2>(GetParam());
  const int qmax = (1 << bits) - 1;
  const kvarn_config_t cfg = kvt::MakeConfig(D, G, bits, bits, 8, 1, KVARN_ABLATE_NO_NORMALIZATION,
                                             KVARN_ABLATE_NO_NORMALIZATION);
  std::vector<float> k(static_cast<size_t>(G) * D), v(k.size());
  for (int t = 0; t < G; ++t) {
    for (int d = 0; d < D; ++d) {
      k[static_cast<size_t>(t) * D + d] = static_cast<float>(CraftedCode(d, t, qmax));
      v[static_cast<size_t>(t) * D + d] = static_cast<float>(CraftedCode(t, d, qmax));
    }
  }
  auto ctx = kvt::MakeCpuContext();
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> rec(rb, 0xAB);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(),
                               KVARN_CODEC_CACHE_FRAME, rec.data(), rb));
  // Expected packed bytes, built byte by byte from the rule "column c in byte c / (8/b) at bit
  // (c mod (8/b)) * b".
  const int per = 8 / bits;
  size_t off = 0;
  for (int d = 0; d < D; ++d) {
    for (int byte = 0; byte < G / per; ++byte) {
      int want = 0;
      for (int s = 0; s < per; ++s) want |= CraftedCode(d, byte * per + s, qmax) << (s * bits);
      ASSERT_EQ(rec[off++], want) << "K channel " << d << " byte " << byte;
    }
  }
  auto half_at = [&](size_t o) { return static_cast<uint16_t>(rec[o] | (rec[o + 1] << 8)); };
  for (int d = 0; d < D; ++d, off += 2) ASSERT_EQ(half_at(off), 0x3c00) << "K a[" << d << "] = 1";
  for (int d = 0; d < D; ++d, off += 2) ASSERT_EQ(half_at(off), 0x0000) << "K z[" << d << "] = 0";
  for (int t = 0; t < G; ++t, off += 2) ASSERT_EQ(half_at(off), 0x3c00) << "K c[" << t << "] = 1";
  for (int t = 0; t < G; ++t) {
    for (int byte = 0; byte < D / per; ++byte) {
      int want = 0;
      for (int s = 0; s < per; ++s) want |= CraftedCode(t, byte * per + s, qmax) << (s * bits);
      ASSERT_EQ(rec[off++], want) << "V token " << t << " byte " << byte;
    }
  }
  for (int d = 0; d < D; ++d, off += 2) ASSERT_EQ(half_at(off), 0x3c00) << "V c'[" << d << "]";
  for (int t = 0; t < G; ++t, off += 2) ASSERT_EQ(half_at(off), 0x3c00) << "V a'[" << t << "]";
  for (int t = 0; t < G; ++t, off += 2) ASSERT_EQ(half_at(off), 0x0000) << "V z'[" << t << "]";
  EXPECT_EQ(off, rb);
}

INSTANTIATE_TEST_SUITE_P(BitsAndShapes, CraftedTile,
                         ::testing::Combine(::testing::Values(2, 4, 8),
                                            ::testing::Values(64, 80, 96, 128, 256, 512),
                                            ::testing::Values(64, 128)),
                         [](const auto& p) {
                           return "b" + std::to_string(std::get<0>(p.param)) + "_D" +
                                  std::to_string(std::get<1>(p.param)) + "_G" +
                                  std::to_string(std::get<2>(p.param));
                         });

TEST(CraftedTileBytes, FirstBytesOfK4V2D64G64) {
  // Literal expected bytes, computed by hand from CraftedCode for 4-bit K and 2-bit V.
  // K channel 0: tokens 0..5 have codes 0, 15, (10+0)%16=10, 15, (20)%16=4, (25)%16=9
  //   -> bytes 0xF0, 0xFA, 0x94. K channel 1: 0, 15, (10+3)=13, (15+3)=18%16=2 -> 0xF0, 0x2D.
  // V token 0 (2 bits): channels 0..7 have codes 0, 3, 10%4=2, 15%4=3, 20%4=0, 25%4=1, 30%4=2,
  //   35%4=3 -> byte 0 = 0 | 3<<2 | 2<<4 | 3<<6 = 0xEC, byte 1 = 0 | 1<<2 | 2<<4 | 3<<6 = 0xE4.
  const int D = 64, G = 64;
  const kvarn_config_t cfg = kvt::MakeConfig(D, G, 4, 2, 8, 1, KVARN_ABLATE_NO_NORMALIZATION,
                                             KVARN_ABLATE_NO_NORMALIZATION);
  std::vector<float> k(G * D), v(G * D);
  for (int t = 0; t < G; ++t) {
    for (int d = 0; d < D; ++d) {
      k[t * D + d] = static_cast<float>(CraftedCode(d, t, 15));
      v[t * D + d] = static_cast<float>(CraftedCode(t, d, 3));
    }
  }
  auto ctx = kvt::MakeCpuContext();
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> rec(rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(),
                               KVARN_CODEC_CACHE_FRAME, rec.data(), rb));
  EXPECT_EQ(rec[0], 0xF0);
  EXPECT_EQ(rec[1], 0xFA);
  EXPECT_EQ(rec[2], 0x94);
  const size_t k_row = G / 2;  // bytes per K channel
  EXPECT_EQ(rec[k_row + 0], 0xF0);
  EXPECT_EQ(rec[k_row + 1], 0x2D);
  size_t v_off = 0, v_len = 0;
  KVT_ASSERT_OK(kvarn_record_field(&cfg, KVARN_FIELD_V_CODES, &v_off, &v_len));
  EXPECT_EQ(rec[v_off + 0], 0xEC);
  EXPECT_EQ(rec[v_off + 1], 0xE4);
}

}  // namespace
