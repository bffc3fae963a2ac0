// Layer 1 through the public API: quantize / dequantize round trips for every bit width, tile
// size and head dim, dtypes, record strides, the cache frame, ablations, determinism, thread
// independence, and failures that must leave the output untouched (docs/FORMAT.md sections 3-7).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace {

using kvt::IsError;
using kvt::MakeConfig;

const char* DtypeName(kvarn_dtype_t t) {
  return t == KVARN_DTYPE_F32 ? "f32" : t == KVARN_DTYPE_F16 ? "f16" : "bf16";
}

// Unrotated K and V of n tiles ([n][G][D]) with outlier channels and token spread, rounded to
// `dtype`, and their encoding.
struct Inputs {
  std::vector<float> k, v;      // values as the library sees them
  std::vector<uint8_t> kb, vb;  // encoded as dtype
};

Inputs MakeInputs(kvt::Rng& rng, int n_tiles, int G, int D, kvarn_dtype_t dtype,
                  const kvt::KVShape& ks = kvt::KVShape{}, const kvt::KVShape& vs = {}) {
  Inputs in;
  kvt::KVShape v_shape = vs;
  v_shape.outlier = 5;
  for (int t = 0; t < n_tiles; ++t) {
    // Each tile from its own channel profile, like different heads/layers.
    const auto k = kvt::MakeTokens(rng, G, D, ks);
    const auto v = kvt::MakeTokens(rng, G, D, v_shape);
    in.k.insert(in.k.end(), k.begin(), k.end());
    in.v.insert(in.v.end(), v.begin(), v.end());
  }
  in.k = kvt::RoundTo(in.k, dtype);
  in.v = kvt::RoundTo(in.v, dtype);
  in.kb = kvt::Encode(in.k, dtype);
  in.vb = kvt::Encode(in.v, dtype);
  return in;
}

// fp16 of x rotated (the cache frame), rounded to fp16 by the library's own kvarn_rotate.
std::vector<uint16_t> CacheFrame(kvarn_context_t* ctx, const std::vector<float>& x, int D,
                                 bool rotate) {
  std::vector<uint16_t> out(x.size());
  if (rotate) {
    EXPECT_EQ(
        kvarn_rotate(ctx, D, x.size() / D, KVARN_DTYPE_F32, x.data(), KVARN_DTYPE_F16, out.data()),
        KVARN_OK);
  } else {
    for (size_t i = 0; i < x.size(); ++i) out[i] = kvt::FloatToHalf(x[i]);
  }
  return out;
}

// ---- round trips over every shape --------------------------------------------------------------

struct CodecParam {
  int D, G, kb, vb;
  kvarn_dtype_t dtype;
};

void PrintTo(const CodecParam& p, std::ostream* os) {
  *os << "D" << p.D << " G" << p.G << " k" << p.kb << "v" << p.vb << " dtype " << p.dtype;
}

std::vector<CodecParam> CodecParams() {
  std::vector<CodecParam> v;
  const kvarn_dtype_t dtypes[] = {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16};
  int i = 0;
  for (int D : {64, 80, 96, 128, 256, 512}) {
    for (int G : {64, 128}) {
      for (int kb : {2, 4, 8}) {
        for (int vb : {2, 4, 8}) v.push_back({D, G, kb, vb, dtypes[i++ % 3]});
      }
    }
  }
  return v;
}

std::string CodecName(const ::testing::TestParamInfo<CodecParam>& p) {
  return "D" + std::to_string(p.param.D) + "_G" + std::to_string(p.param.G) + "_k" +
         std::to_string(p.param.kb) + "v" + std::to_string(p.param.vb) + "_" +
         DtypeName(p.param.dtype);
}

// Relative L2 reconstruction error a tensor of `bits` bits may have on these inputs.
double ErrorBound(int bits) { return bits == 2 ? 0.75 : bits == 4 ? 0.2 : 0.012; }

class CodecRoundTrip : public ::testing::TestWithParam<CodecParam> {};

TEST_P(CodecRoundTrip, DequantizeReconstructsTheInput) {
  const CodecParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(p.D, p.G, p.kb, p.vb);
  const int n = 3;
  const Inputs in = MakeInputs(rng, n, p.G, p.D, p.dtype);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> rec(n * rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, p.dtype, in.kb.data(), in.vb.data(),
                               KVARN_CODEC_DEFAULT, rec.data(), rb));
  std::vector<float> k(in.k.size()), v(in.v.size());
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, KVARN_CODEC_DEFAULT,
                                 KVARN_DTYPE_F32, k.data(), v.data()));
  const size_t tile = static_cast<size_t>(p.G) * p.D;
  for (int t = 0; t < n; ++t) {
    const std::vector<float> kt(k.begin() + t * tile, k.begin() + (t + 1) * tile);
    const std::vector<float> ki(in.k.begin() + t * tile, in.k.begin() + (t + 1) * tile);
    const std::vector<float> vt(v.begin() + t * tile, v.begin() + (t + 1) * tile);
    const std::vector<float> vi(in.v.begin() + t * tile, in.v.begin() + (t + 1) * tile);
    const double ek = kvt::RelL2(kt, ki), ev = kvt::RelL2(vt, vi);
    EXPECT_LE(ek, ErrorBound(p.kb)) << "K of tile " << t;
    EXPECT_LE(ev, ErrorBound(p.vb)) << "V of tile " << t;
    RecordProperty("k_rel_l2_tile" + std::to_string(t), std::to_string(ek));
    RecordProperty("v_rel_l2_tile" + std::to_string(t), std::to_string(ev));
  }
}

TEST_P(CodecRoundTrip, CacheFrameDequantizeFollowsTheRecordFormat) {
  // kvarn_dequantize with KVARN_CODEC_CACHE_FRAME is (code*a + z)*c of the record's own bytes,
  // and without it, that tile multiplied by H.
  const CodecParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(p.D, p.G, p.kb, p.vb);
  const int n = 2;
  const Inputs in = MakeInputs(rng, n, p.G, p.D, p.dtype);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> rec(n * rb);
  KVT_ASSERT_OK(
      kvarn_quantize(ctx.get(), &cfg, n, p.dtype, in.kb.data(), in.vb.data(), 0, rec.data(), rb));
  const size_t tile = static_cast<size_t>(p.G) * p.D;
  std::vector<float> kc(n * tile), vc(n * tile), ku(n * tile), vu(n * tile);
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, KVARN_CODEC_CACHE_FRAME,
                                 KVARN_DTYPE_F32, kc.data(), vc.data()));
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, KVARN_CODEC_DEFAULT,
                                 KVARN_DTYPE_F32, ku.data(), vu.data()));
  for (int t = 0; t < n; ++t) {
    const auto r = kvt::DecodeRecord(rec.data() + t * rb, p.D, p.G, p.kb, p.vb);
    for (int tok = 0; tok < p.G; ++tok) {
      std::vector<double> krow(p.D), vrow(p.D);
      for (int d = 0; d < p.D; ++d) {
        const size_t e = t * tile + static_cast<size_t>(tok) * p.D + d;
        krow[d] = r.K(tok, d);
        vrow[d] = r.V(tok, d);
        ASSERT_NEAR(kc[e], krow[d], 1e-6 * std::fabs(krow[d]) + 1e-30);
        ASSERT_NEAR(vc[e], vrow[d], 1e-6 * std::fabs(vrow[d]) + 1e-30);
      }
      kvt::HadamardDouble(krow.data(), p.D);
      kvt::HadamardDouble(vrow.data(), p.D);
      const std::vector<float> kg(ku.begin() + t * tile + tok * p.D,
                                  ku.begin() + t * tile + (tok + 1) * p.D);
      const std::vector<float> vg(vu.begin() + t * tile + tok * p.D,
                                  vu.begin() + t * tile + (tok + 1) * p.D);
      ASSERT_LE(kvt::RelL2(kg, krow), 1e-5) << "tile " << t << " token " << tok;
      ASSERT_LE(kvt::RelL2(vg, vrow), 1e-5) << "tile " << t << " token " << tok;
    }
  }
}

TEST_P(CodecRoundTrip, QuantizeEqualsCacheFrameQuantizeOfRotatedFp16) {
  // kvarn_quantize rotates and rounds to fp16 exactly as the cache stores vectors, so giving it
  // those fp16 values with KVARN_CODEC_CACHE_FRAME yields the same bytes.
  const CodecParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(p.D, p.G, p.kb, p.vb);
  const int n = 2;
  const Inputs in = MakeInputs(rng, n, p.G, p.D, p.dtype);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> a(n * rb), b(n * rb, 1);
  KVT_ASSERT_OK(
      kvarn_quantize(ctx.get(), &cfg, n, p.dtype, in.kb.data(), in.vb.data(), 0, a.data(), rb));
  const auto kh = CacheFrame(ctx.get(), in.k, p.D, true);
  const auto vh = CacheFrame(ctx.get(), in.v, p.D, true);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F16, kh.data(), vh.data(),
                               KVARN_CODEC_CACHE_FRAME, b.data(), rb));
  EXPECT_EQ(a, b);
}

TEST_P(CodecRoundTrip, DequantizeOutputDtypesRoundTheF32Result) {
  const CodecParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(p.D, p.G, p.kb, p.vb);
  const Inputs in = MakeInputs(rng, 1, p.G, p.D, p.dtype);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> rec(rb);
  KVT_ASSERT_OK(
      kvarn_quantize(ctx.get(), &cfg, 1, p.dtype, in.kb.data(), in.vb.data(), 0, rec.data(), rb));
  const size_t tile = static_cast<size_t>(p.G) * p.D;
  for (uint32_t flags : {KVARN_CODEC_DEFAULT, KVARN_CODEC_CACHE_FRAME}) {
    std::vector<float> k32(tile), v32(tile);
    KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, 1, rec.data(), rb, flags, KVARN_DTYPE_F32,
                                   k32.data(), v32.data()));
    for (kvarn_dtype_t dt : {KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
      std::vector<uint16_t> k16(tile), v16(tile);
      KVT_ASSERT_OK(
          kvarn_dequantize(ctx.get(), &cfg, 1, rec.data(), rb, flags, dt, k16.data(), v16.data()));
      for (size_t e = 0; e < tile; ++e) {
        const uint16_t wk =
            dt == KVARN_DTYPE_F16 ? kvt::FloatToHalf(k32[e]) : kvt::FloatToBf16(k32[e]);
        const uint16_t wv =
            dt == KVARN_DTYPE_F16 ? kvt::FloatToHalf(v32[e]) : kvt::FloatToBf16(v32[e]);
        ASSERT_EQ(k16[e], wk) << DtypeName(dt) << " K element " << e;
        ASSERT_EQ(v16[e], wv) << DtypeName(dt) << " V element " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllShapes, CodecRoundTrip, ::testing::ValuesIn(CodecParams()), CodecName);

// ---- presets x D: strides, determinism, threads ------------------------------------------------

class CodecPreset : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  kvarn_config_t Config() const {
    return kvt::PresetConfig(std::get<0>(GetParam()), std::get<1>(GetParam()));
  }
};

TEST_P(CodecPreset, RecordStridePaddingIsUntouched) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = Config();
  const int D = cfg.head_dim, G = cfg.tile_tokens, n = 3;
  const Inputs in = MakeInputs(rng, n, G, D, KVARN_DTYPE_F32);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> dense(n * rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                               dense.data(), rb));
  for (size_t pad : {size_t{1}, size_t{8}, size_t{100}, rb}) {
    const size_t stride = rb + pad;
    std::vector<uint8_t> padded(n * stride, 0xA5);
    KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                                 padded.data(), stride));
    for (int t = 0; t < n; ++t) {
      EXPECT_EQ(std::memcmp(padded.data() + t * stride, dense.data() + t * rb, rb), 0)
          << "record " << t << " with stride " << stride;
      for (size_t b = rb; b < stride; ++b) {
        ASSERT_EQ(padded[t * stride + b], 0xA5) << "padding byte " << b << " of record " << t;
      }
    }
    // Dequantize reads the strided records the same way.
    const size_t tile = static_cast<size_t>(G) * D;
    std::vector<float> k1(n * tile), k2(n * tile), v1(n * tile), v2(n * tile);
    KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, dense.data(), rb, 0, KVARN_DTYPE_F32,
                                   k1.data(), v1.data()));
    KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, padded.data(), stride, 0, KVARN_DTYPE_F32,
                                   k2.data(), v2.data()));
    EXPECT_EQ(k1, k2);
    EXPECT_EQ(v1, v2);
  }
}

TEST_P(CodecPreset, SameInputGivesSameBytesTwice) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = Config();
  const int n = 4;
  const Inputs in = MakeInputs(rng, n, cfg.tile_tokens, cfg.head_dim, KVARN_DTYPE_F16);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> a(n * rb, 0), b(n * rb, 0xFF);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F16, in.kb.data(), in.vb.data(), 0,
                               a.data(), rb));
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F16, in.kb.data(), in.vb.data(), 0,
                               b.data(), rb));
  EXPECT_EQ(a, b);
  // A tile's record does not depend on the other tiles of the batch.
  std::vector<uint8_t> one(rb);
  const size_t tile_bytes = static_cast<size_t>(cfg.tile_tokens) * cfg.head_dim * 2;
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F16, in.kb.data() + 2 * tile_bytes,
                               in.vb.data() + 2 * tile_bytes, 0, one.data(), rb));
  EXPECT_EQ(std::memcmp(one.data(), a.data() + 2 * rb, rb), 0);
}

TEST_P(CodecPreset, RecordsIndependentOfThreadCount) {
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = Config();
  const int n = 7;
  const Inputs in = MakeInputs(rng, n, cfg.tile_tokens, cfg.head_dim, KVARN_DTYPE_F32);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> ref;
  std::vector<float> ref_k;
  for (int threads : {1, 2, 5}) {
    auto ctx = kvt::MakeCpuContext(threads);
    int32_t got = 0;
    KVT_ASSERT_OK(kvarn_context_get_num_threads(ctx.get(), &got));
    EXPECT_EQ(got, threads);
    std::vector<uint8_t> rec(n * rb);
    KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                                 rec.data(), rb));
    std::vector<float> k(in.k.size());
    KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, 0, KVARN_DTYPE_F32, k.data(),
                                   nullptr));
    if (ref.empty()) {
      ref = rec;
      ref_k = k;
    } else {
      EXPECT_EQ(rec, ref) << threads << " threads";
      EXPECT_EQ(k, ref_k) << threads << " threads";
    }
  }
}

TEST_P(CodecPreset, DequantizeWithOneNullOutputWritesTheOther) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = Config();
  const int n = 2;
  const Inputs in = MakeInputs(rng, n, cfg.tile_tokens, cfg.head_dim, KVARN_DTYPE_F32);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> rec(n * rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                               rec.data(), rb));
  std::vector<float> k(in.k.size()), v(in.v.size()), k_only(in.k.size()), v_only(in.v.size());
  KVT_ASSERT_OK(
      kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, 0, KVARN_DTYPE_F32, k.data(), v.data()));
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, 0, KVARN_DTYPE_F32,
                                 k_only.data(), nullptr));
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, rec.data(), rb, 0, KVARN_DTYPE_F32, nullptr,
                                 v_only.data()));
  EXPECT_EQ(k, k_only);
  EXPECT_EQ(v, v_only);
}

INSTANTIATE_TEST_SUITE_P(PresetsAndHeadDims, CodecPreset,
                         ::testing::Combine(::testing::Values("k4v2_g128", "k4v2_g64", "k4v4_g128",
                                                              "k4v4_g64", "k2v2_g128", "k8v8_g128"),
                                            ::testing::Values(64, 80, 96, 128, 256, 512)),
                         [](const auto& p) {
                           return std::get<0>(p.param) + "_D" +
                                  std::to_string(std::get<1>(p.param));
                         });

// ---- ablations ---------------------------------------------------------------------------------

class Ablation : public ::testing::TestWithParam<int> {};  // head dim

TEST_P(Ablation, NoRotationCacheFrameEqualsUnrotated) {
  // With both tensors unrotated, the cache frame is the input frame: dequantize with and without
  // KVARN_CODEC_CACHE_FRAME agree bit for bit, and quantize of the input equals quantize of its
  // fp16 values in the cache frame.
  const int D = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg =
      MakeConfig(D, 128, 4, 2, 8, 1, KVARN_ABLATE_NO_ROTATION, KVARN_ABLATE_NO_ROTATION);
  const int n = 2;
  const Inputs in = MakeInputs(rng, n, 128, D, KVARN_DTYPE_F32);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<uint8_t> a(n * rb), b(n * rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                               a.data(), rb));
  const auto kh = CacheFrame(ctx.get(), in.k, D, false), vh = CacheFrame(ctx.get(), in.v, D, false);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F16, kh.data(), vh.data(),
                               KVARN_CODEC_CACHE_FRAME, b.data(), rb));
  EXPECT_EQ(a, b);
  std::vector<float> k1(in.k.size()), v1(in.k.size()), k2(in.k.size()), v2(in.k.size());
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, a.data(), rb, KVARN_CODEC_DEFAULT,
                                 KVARN_DTYPE_F32, k1.data(), v1.data()));
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, n, a.data(), rb, KVARN_CODEC_CACHE_FRAME,
                                 KVARN_DTYPE_F32, k2.data(), v2.data()));
  EXPECT_EQ(k1, k2);
  EXPECT_EQ(v1, v2);
  // And the reconstruction is close to the unrotated input (no H anywhere).
  EXPECT_LE(kvt::RelL2(k1, in.k), ErrorBound(4) * 2);
}

TEST_P(Ablation, RotationFlagsApplyPerTensor) {
  // K rotated, V not (and the reverse): each tensor follows its own flag, the other is unchanged
  // from the fully rotated / fully unrotated config.
  const int D = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const int n = 2;
  const Inputs in = MakeInputs(rng, n, 128, D, KVARN_DTYPE_F32);
  const kvarn_config_t both = MakeConfig(D, 128, 4, 2);
  const kvarn_config_t none =
      MakeConfig(D, 128, 4, 2, 8, 1, KVARN_ABLATE_NO_ROTATION, KVARN_ABLATE_NO_ROTATION);
  const kvarn_config_t k_only = MakeConfig(D, 128, 4, 2, 8, 1, 0, KVARN_ABLATE_NO_ROTATION);
  const kvarn_config_t v_only = MakeConfig(D, 128, 4, 2, 8, 1, KVARN_ABLATE_NO_ROTATION, 0);
  const size_t rb = kvt::RecordBytes(both);
  auto quant = [&](const kvarn_config_t& c) {
    std::vector<uint8_t> r(n * rb);
    EXPECT_EQ(kvarn_quantize(ctx.get(), &c, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                             r.data(), rb),
              KVARN_OK);
    return r;
  };
  const auto rb_both = quant(both), rb_none = quant(none), rb_k = quant(k_only),
             rb_v = quant(v_only);
  size_t v_off = 0, v_len = 0;
  KVT_ASSERT_OK(kvarn_record_field(&both, KVARN_FIELD_V_CODES, &v_off, &v_len));
  for (int t = 0; t < n; ++t) {
    const uint8_t* b = rb_both.data() + t * rb;
    const uint8_t* z = rb_none.data() + t * rb;
    const uint8_t* k = rb_k.data() + t * rb;
    const uint8_t* v = rb_v.data() + t * rb;
    // K part: [0, v_off); V part: [v_off, rb).
    EXPECT_EQ(std::memcmp(k, b, v_off), 0) << "K of K-rotated config";
    EXPECT_EQ(std::memcmp(k + v_off, z + v_off, rb - v_off), 0) << "V of K-rotated config";
    EXPECT_EQ(std::memcmp(v, z, v_off), 0) << "K of V-rotated config";
    EXPECT_EQ(std::memcmp(v + v_off, b + v_off, rb - v_off), 0) << "V of V-rotated config";
    EXPECT_NE(std::memcmp(b, z, v_off), 0) << "rotation changed nothing";
  }
  // Dequantize un-rotates only the rotated tensor.
  std::vector<float> kc(in.k.size()), vc(in.k.size()), ku(in.k.size()), vu(in.k.size());
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &k_only, n, rb_k.data(), rb, KVARN_CODEC_CACHE_FRAME,
                                 KVARN_DTYPE_F32, kc.data(), vc.data()));
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &k_only, n, rb_k.data(), rb, KVARN_CODEC_DEFAULT,
                                 KVARN_DTYPE_F32, ku.data(), vu.data()));
  EXPECT_EQ(vc, vu) << "V is not rotated: no un-rotation";
  EXPECT_NE(kc, ku) << "K is rotated: un-rotated on output";
  EXPECT_LE(kvt::RelL2(ku, in.k), ErrorBound(4));
  EXPECT_LE(kvt::RelL2(vu, in.v), ErrorBound(2));
}

TEST_P(Ablation, NoNormalizationStoresUnitScalesAndPlainRtnCodes) {
  // Without normalization: token scales c (K) and channel scales c' (V) are exactly 1.0, and the
  // codes are plain per-row RTN of the cache-frame tile (docs/FORMAT.md section 5).
  const int D = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const int G = 128, n = 2;
  const Inputs in = MakeInputs(rng, n, G, D, KVARN_DTYPE_F32);
  for (uint32_t which = 1; which <= 3; ++which) {
    const uint32_t kf = (which & 1) ? KVARN_ABLATE_NO_NORMALIZATION : 0u;
    const uint32_t vf = (which & 2) ? KVARN_ABLATE_NO_NORMALIZATION : 0u;
    const kvarn_config_t cfg = MakeConfig(D, G, 4, 2, 8, 1, kf, vf);
    const size_t rb = kvt::RecordBytes(cfg);
    std::vector<uint8_t> rec(n * rb);
    KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                                 rec.data(), rb));
    const auto kh = CacheFrame(ctx.get(), in.k, D, true), vh = CacheFrame(ctx.get(), in.v, D, true);
    for (int t = 0; t < n; ++t) {
      const auto r = kvt::DecodeRecord(rec.data() + t * rb, D, G, 4, 2);
      bool k_ones = true, v_ones = true;
      for (uint16_t c : r.k_c) k_ones = k_ones && c == 0x3c00;
      for (uint16_t c : r.v_c) v_ones = v_ones && c == 0x3c00;
      EXPECT_EQ(k_ones, kf != 0) << "K token scales, which=" << which;
      EXPECT_EQ(v_ones, vf != 0) << "V channel scales, which=" << which;
      // Plain RTN, rows of the cache-frame tile, computed here.
      auto rtn = [&](const std::vector<uint16_t>& x, bool k_orient, int bits,
                     const std::vector<uint8_t>& codes, const std::vector<uint16_t>& a,
                     const std::vector<uint16_t>& z) {
        const int R = k_orient ? D : G, C = k_orient ? G : D;
        const float qmax = static_cast<float>((1 << bits) - 1);
        for (int i = 0; i < R; ++i) {
          auto at = [&](int j) {
            const int tok = k_orient ? j : i, ch = k_orient ? i : j;
            return kvt::HalfToFloat(x[(static_cast<size_t>(t) * G + tok) * D + ch]);
          };
          float lo = at(0), hi = at(0);
          for (int j = 1; j < C; ++j) {
            lo = std::min(lo, at(j));
            hi = std::max(hi, at(j));
          }
          const float step = std::max((hi - lo) / qmax, 1e-10f);
          ASSERT_EQ(a[i], kvt::FloatToHalf(step)) << "row " << i;
          ASSERT_EQ(z[i], kvt::FloatToHalf(lo)) << "row " << i;
          for (int j = 0; j < C; ++j) {
            const float q = std::min(std::max(std::nearbyint((at(j) - lo) / step), 0.f), qmax);
            ASSERT_EQ(codes[static_cast<size_t>(i) * C + j], static_cast<uint8_t>(q))
                << "row " << i << " column " << j;
          }
        }
      };
      if (kf) rtn(kh, true, 4, r.k_codes, r.k_a, r.k_z);
      if (vf) rtn(vh, false, 2, r.v_codes, r.v_a, r.v_z);
    }
  }
}

TEST_P(Ablation, ZeroIterationsEqualsNoNormalization) {
  const int D = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const Inputs in = MakeInputs(rng, 2, 64, D, KVARN_DTYPE_BF16);
  const kvarn_config_t t0 = MakeConfig(D, 64, 4, 4, 0);
  const kvarn_config_t nn =
      MakeConfig(D, 64, 4, 4, 8, 1, KVARN_ABLATE_NO_NORMALIZATION, KVARN_ABLATE_NO_NORMALIZATION);
  const size_t rb = kvt::RecordBytes(t0);
  std::vector<uint8_t> a(2 * rb), b(2 * rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &t0, 2, KVARN_DTYPE_BF16, in.kb.data(), in.vb.data(), 0,
                               a.data(), rb));
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &nn, 2, KVARN_DTYPE_BF16, in.kb.data(), in.vb.data(), 0,
                               b.data(), rb));
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, Ablation, ::testing::Values(64, 80, 96, 128, 256, 512),
                         [](const auto& p) { return "D" + std::to_string(p.param); });

TEST(Normalization, ReducesTheErrorOnOutlierTokens) {
  // What KVarN is for (docs/FORMAT.md section 1): with rare large tokens, normalization lowers the
  // reconstruction error compared with plain RTN.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  kvt::KVShape s;
  s.spike_prob = 0.03;
  s.spike = 30;
  const int n = 8;
  const Inputs in = MakeInputs(rng, n, 128, 128, KVARN_DTYPE_F32, s, s);
  auto err = [&](const kvarn_config_t& c) {
    const size_t rb = kvt::RecordBytes(c);
    std::vector<uint8_t> rec(n * rb);
    EXPECT_EQ(kvarn_quantize(ctx.get(), &c, n, KVARN_DTYPE_F32, in.kb.data(), in.vb.data(), 0,
                             rec.data(), rb),
              KVARN_OK);
    std::vector<float> k(in.k.size()), v(in.v.size());
    EXPECT_EQ(
        kvarn_dequantize(ctx.get(), &c, n, rec.data(), rb, 0, KVARN_DTYPE_F32, k.data(), v.data()),
        KVARN_OK);
    return std::make_pair(kvt::RelL2(k, in.k), kvt::RelL2(v, in.v));
  };
  const auto kvarn = err(MakeConfig(128, 128, 4, 2));
  const auto plain = err(MakeConfig(128, 128, 4, 2, 8, 1, KVARN_ABLATE_NO_NORMALIZATION,
                                    KVARN_ABLATE_NO_NORMALIZATION));
  RecordProperty("kvarn_k", std::to_string(kvarn.first));
  RecordProperty("plain_k", std::to_string(plain.first));
  RecordProperty("kvarn_v", std::to_string(kvarn.second));
  RecordProperty("plain_v", std::to_string(plain.second));
  // K is quantized per channel over tokens, where rare large tokens stretch every row's range:
  // the token scales of normalization fix that. V is per token already: about equal.
  EXPECT_LT(kvarn.first, 0.8 * plain.first);
  EXPECT_LT(kvarn.second, 1.05 * plain.second);
}

// ---- failures leave the output untouched -----------------------------------------------------

class QuantizeFailure : public ::testing::TestWithParam<kvarn_dtype_t> {};

TEST_P(QuantizeFailure, NonFiniteInputFailsAndWritesNothing) {
  const kvarn_dtype_t dt = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(128, 64, 4, 2);
  const int n = 3;
  const size_t rb = kvt::RecordBytes(cfg), stride = rb + 16;
  const size_t tile = 64 * 128;
  for (int which = 0; which < 2; ++which) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      Inputs in = MakeInputs(rng, n, 64, 128, dt);
      std::vector<float>& x = which ? in.v : in.k;
      x[2 * tile + 37 * 128 + 5] = bad;  // tile 2, token 37, channel 5
      in.kb = kvt::Encode(in.k, dt);
      in.vb = kvt::Encode(in.v, dt);
      std::vector<uint8_t> rec(n * stride, 0x5C);
      const auto before = rec;
      EXPECT_TRUE(IsError(
          kvarn_quantize(ctx.get(), &cfg, n, dt, in.kb.data(), in.vb.data(), 0, rec.data(), stride),
          KVARN_ERR_NON_FINITE, "nan"))
          << (which ? "v" : "k") << " = " << bad;
      EXPECT_EQ(rec, before) << "records written by a failing quantize";
      EXPECT_TRUE(IsError(kvarn_quantize(ctx.get(), &cfg, n, dt, in.kb.data(), in.vb.data(),
                                         KVARN_CODEC_CACHE_FRAME, rec.data(), stride),
                          KVARN_ERR_NON_FINITE));
      EXPECT_EQ(rec, before);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantizeFailure,
                         ::testing::Values(KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16),
                         [](const auto& p) { return std::string(DtypeName(p.param)); });

TEST(QuantizeOverflow, ValuesBeyondFp16AfterRotationFailAndWriteNothing) {
  // 60000 in every channel fits fp16, but its rotation (60000 * sqrt(D) in channel 0) does not.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(128, 64, 4, 2);
  const size_t rb = kvt::RecordBytes(cfg);
  for (kvarn_dtype_t dt : {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
    Inputs in = MakeInputs(rng, 2, 64, 128, dt);
    for (int d = 0; d < 128; ++d) in.k[64 * 128 + 10 * 128 + d] = 60000.f;  // tile 1, token 10
    in.k = kvt::RoundTo(in.k, dt);
    in.kb = kvt::Encode(in.k, dt);
    std::vector<uint8_t> rec(2 * rb, 0x77);
    const auto before = rec;
    EXPECT_TRUE(IsError(
        kvarn_quantize(ctx.get(), &cfg, 2, dt, in.kb.data(), in.vb.data(), 0, rec.data(), rb),
        KVARN_ERR_OVERFLOW, "fp16"))
        << DtypeName(dt);
    EXPECT_EQ(rec, before);
    // Unrotated, 60000 fits: the same tile quantizes without rotation.
    const kvarn_config_t norot =
        MakeConfig(128, 64, 4, 2, 8, 1, KVARN_ABLATE_NO_ROTATION, KVARN_ABLATE_NO_ROTATION);
    KVT_EXPECT_OK(
        kvarn_quantize(ctx.get(), &norot, 2, dt, in.kb.data(), in.vb.data(), 0, rec.data(), rb));
  }
}

TEST(QuantizeOverflow, CacheFrameValuesBeyondFp16FailAndWriteNothing) {
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(64, 64, 4, 2);
  const size_t rb = kvt::RecordBytes(cfg);
  for (float big : {65520.f, -70000.f, 1e30f}) {
    std::vector<float> k(64 * 64, 1.f), v(64 * 64, 1.f);
    v[100] = big;
    std::vector<uint8_t> rec(rb, 0x42);
    const auto before = rec;
    EXPECT_TRUE(IsError(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(),
                                       KVARN_CODEC_CACHE_FRAME, rec.data(), rb),
                        KVARN_ERR_OVERFLOW))
        << big;
    EXPECT_EQ(rec, before);
  }
  // 65504 is the largest finite half and fits.
  std::vector<float> k(64 * 64, 1.f), v(64 * 64, 1.f);
  v[100] = 65504.f;
  std::vector<uint8_t> rec(rb);
  KVT_EXPECT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(),
                               KVARN_CODEC_CACHE_FRAME, rec.data(), rb));
}

// A K tile in the cache frame whose absorbed zero overflows fp16 although every input fits:
// token 0 holds -60000 in every channel (a column of std 0, so its scale s_c = e^-0.3 < 1), the
// other tokens N(0, 25). After balancing, channel rows have s_r at the top of the std clamp and
// z = s_r * lo = -60000 / e^-0.3 = -81000 < -65504.
std::vector<float> AbsorbedOverflowTile(kvt::Rng& rng, int G, int D) {
  std::vector<float> k(static_cast<size_t>(G) * D);
  for (int t = 0; t < G; ++t) {
    for (int d = 0; d < D; ++d) {
      k[static_cast<size_t>(t) * D + d] = t == 0 ? -60000.f : static_cast<float>(5 * rng.Normal());
    }
  }
  return k;
}

TEST(QuantizeOverflow, AbsorbedZeroBeyondFp16FailsAndWritesNothing) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const int D = 128, G = 128;
  const kvarn_config_t cfg = MakeConfig(D, G, 4, 2);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<float> k = AbsorbedOverflowTile(rng, G, D);
  std::vector<float> v(k.size());
  for (float& x : v) x = static_cast<float>(rng.Normal());
  // Tile 0 is fine, tile 1 overflows: nothing at all is written.
  std::vector<float> k2(v.begin(), v.end()), v2(v);
  k2.insert(k2.end(), k.begin(), k.end());
  v2.insert(v2.end(), v.begin(), v.end());
  std::vector<uint8_t> rec(2 * rb, 0x3D);
  const auto before = rec;
  EXPECT_TRUE(IsError(kvarn_quantize(ctx.get(), &cfg, 2, KVARN_DTYPE_F32, k2.data(), v2.data(),
                                     KVARN_CODEC_CACHE_FRAME, rec.data(), rb),
                      KVARN_ERR_OVERFLOW, "fp16"));
  EXPECT_EQ(rec, before);
  // Without normalization the same tile fits (z = lo = -60000).
  const kvarn_config_t nn = MakeConfig(D, G, 4, 2, 8, 1, KVARN_ABLATE_NO_NORMALIZATION, 0);
  KVT_EXPECT_OK(kvarn_quantize(ctx.get(), &nn, 2, KVARN_DTYPE_F32, k2.data(), v2.data(),
                               KVARN_CODEC_CACHE_FRAME, rec.data(), rb));
}

TEST(QuantizeEdges, ZeroTilesIsANoOp) {
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(128, 128, 4, 2);
  const size_t rb = kvt::RecordBytes(cfg);
  KVT_EXPECT_OK(
      kvarn_quantize(ctx.get(), &cfg, 0, KVARN_DTYPE_F32, nullptr, nullptr, 0, nullptr, rb));
  KVT_EXPECT_OK(
      kvarn_dequantize(ctx.get(), &cfg, 0, nullptr, rb, 0, KVARN_DTYPE_F32, nullptr, nullptr));
}

TEST(QuantizeEdges, ConstantTileRoundTripsExactly) {
  // Every row constant: step floors at 1e-10, codes are 0 and z holds the value.
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = MakeConfig(64, 64, 2, 2);
  const size_t rb = kvt::RecordBytes(cfg);
  std::vector<float> k(64 * 64, 0.75f), v(64 * 64, -3.5f);
  std::vector<uint8_t> rec(rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(),
                               KVARN_CODEC_CACHE_FRAME, rec.data(), rb));
  std::vector<float> ko(k.size()), vo(v.size());
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, 1, rec.data(), rb, KVARN_CODEC_CACHE_FRAME,
                                 KVARN_DTYPE_F32, ko.data(), vo.data()));
  for (size_t e = 0; e < k.size(); ++e) {
    ASSERT_NEAR(ko[e], 0.75f, 1e-3f) << e;
    ASSERT_NEAR(vo[e], -3.5f, 4e-3f) << e;
  }
  // An all-zero tile reconstructs to exact zeros.
  std::fill(k.begin(), k.end(), 0.f);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), k.data(),
                               KVARN_CODEC_DEFAULT, rec.data(), rb));
  KVT_ASSERT_OK(kvarn_dequantize(ctx.get(), &cfg, 1, rec.data(), rb, 0, KVARN_DTYPE_F32, ko.data(),
                                 vo.data()));
  for (size_t e = 0; e < k.size(); ++e) ASSERT_EQ(ko[e], 0.f);
}

}  // namespace
