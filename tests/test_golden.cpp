// The golden records (tests/data/golden, from an independent reference implementation): for every
// file, quantize the unrotated inputs with T = 8 and compare codes, per-tile reconstructions and
// the mean quantization error with the golden records (tests/data/golden/README.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"
#include "support/safetensors.h"

namespace {

const std::string kGoldenDir = std::string(KVARN_TEST_DATA_DIR) + "/golden/";

struct GoldenEntry {
  std::string file, preset, inputs;
  int D = 0, G = 0, kb = 0, vb = 0, iterations = 0, tiles = 0;
  size_t record_bytes = 0;
};

void PrintTo(const GoldenEntry& e, std::ostream* os) { *os << e.file; }

std::vector<GoldenEntry> LoadIndex() {
  std::vector<GoldenEntry> out;
  try {
    const kvt::Json idx = kvt::ParseJson(kvt::ReadFile(kGoldenDir + "index.json"));
    for (const kvt::Json& e : idx.arr) {
      GoldenEntry g;
      g.file = e.At("file").Str();
      g.preset = e.At("preset").Str();
      g.inputs = e.At("inputs").Str();
      g.D = static_cast<int>(e.At("head_dim").Int());
      g.G = static_cast<int>(e.At("tile_tokens").Int());
      g.kb = static_cast<int>(e.At("key_bits").Int());
      g.vb = static_cast<int>(e.At("value_bits").Int());
      g.iterations = static_cast<int>(e.At("iterations").Int());
      g.tiles = static_cast<int>(e.At("tiles").Int());
      g.record_bytes = static_cast<size_t>(e.At("record_bytes").Int());
      out.push_back(g);
    }
  } catch (const std::exception&) {
    // GoldenIndex.ListsTheGoldenFiles reports the failure.
  }
  return out;
}

TEST(GoldenIndex, ListsTheGoldenFiles) {
  const kvt::Json idx = kvt::ParseJson(kvt::ReadFile(kGoldenDir + "index.json"));
  ASSERT_EQ(idx.kind, kvt::Json::kArray);
  EXPECT_GE(idx.arr.size(), 10u);
  EXPECT_EQ(LoadIndex().size(), idx.arr.size());
}

class Golden : public ::testing::TestWithParam<GoldenEntry> {
 protected:
  void SetUp() override {
    const GoldenEntry& g = GetParam();
    const auto tensors = kvt::ReadSafetensors(kGoldenDir + g.file);
    ASSERT_EQ(tensors.count("k"), 1u);
    ASSERT_EQ(tensors.count("v"), 1u);
    ASSERT_EQ(tensors.count("record"), 1u);
    const kvt::Tensor& k = tensors.at("k");
    const kvt::Tensor& v = tensors.at("v");
    const kvt::Tensor& r = tensors.at("record");
    ASSERT_EQ(k.dtype, "F16");
    ASSERT_EQ(v.dtype, "F16");
    ASSERT_EQ(r.dtype, "U8");
    const std::vector<int64_t> kshape = {g.tiles, g.G, g.D};
    ASSERT_EQ(k.shape, kshape);
    ASSERT_EQ(v.shape, kshape);
    const std::vector<int64_t> rshape = {g.tiles, static_cast<int64_t>(g.record_bytes)};
    ASSERT_EQ(r.shape, rshape);
    k_ = k.data;
    v_ = v.data;
    golden_ = r.data;
    cfg_ = kvt::PresetConfig(g.preset, g.D);
    cfg_.iterations = g.iterations;
    ASSERT_EQ(cfg_.key_bits, g.kb);
    ASSERT_EQ(cfg_.value_bits, g.vb);
    ASSERT_EQ(cfg_.tile_tokens, g.G);
    ASSERT_EQ(kvt::RecordBytes(cfg_), g.record_bytes);
    ctx_ = kvt::MakeCpuContext();
    ASSERT_NE(ctx_, nullptr);
    ours_.assign(g.tiles * g.record_bytes, 0);
    KVT_ASSERT_OK(kvarn_quantize(ctx_.get(), &cfg_, g.tiles, KVARN_DTYPE_F16, k_.data(), v_.data(),
                                 KVARN_CODEC_DEFAULT, ours_.data(), g.record_bytes));
  }

  // The cache-frame input: each token rotated (fp32 product) and rounded to fp16, by
  // kvarn_rotate. [tiles][G][D] halves.
  std::vector<uint16_t> Rotated(const std::vector<uint8_t>& x) {
    const GoldenEntry& g = GetParam();
    std::vector<uint16_t> out(static_cast<size_t>(g.tiles) * g.G * g.D);
    EXPECT_EQ(kvarn_rotate(ctx_.get(), g.D, static_cast<size_t>(g.tiles) * g.G, KVARN_DTYPE_F16,
                           x.data(), KVARN_DTYPE_F16, out.data()),
              KVARN_OK)
        << kvarn_last_error();
    return out;
  }

  kvarn_config_t cfg_{};
  kvt::ContextPtr ctx_;
  std::vector<uint8_t> k_, v_, golden_, ours_;
};

TEST_P(Golden, CodesMatchAtLeast9999PerMille) {
  const GoldenEntry& g = GetParam();
  size_t same = 0, total = 0;
  for (int t = 0; t < g.tiles; ++t) {
    const auto a = kvt::DecodeRecord(ours_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    const auto b = kvt::DecodeRecord(golden_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    for (size_t i = 0; i < a.k_codes.size(); ++i) same += a.k_codes[i] == b.k_codes[i];
    for (size_t i = 0; i < a.v_codes.size(); ++i) same += a.v_codes[i] == b.v_codes[i];
    total += a.k_codes.size() + a.v_codes.size();
  }
  const double frac = static_cast<double>(same) / total;
  RecordProperty("identical_code_fraction", std::to_string(frac));
  EXPECT_GE(frac, 0.9999) << (total - same) << " of " << total << " codes differ";
}

TEST_P(Golden, TileReconstructionsWithin2PercentRelL2) {
  const GoldenEntry& g = GetParam();
  for (int t = 0; t < g.tiles; ++t) {
    const auto a = kvt::DecodeRecord(ours_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    const auto b = kvt::DecodeRecord(golden_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    std::vector<double> ka, kb, va, vb;
    for (int tok = 0; tok < g.G; ++tok) {
      for (int d = 0; d < g.D; ++d) {
        ka.push_back(a.K(tok, d));
        kb.push_back(b.K(tok, d));
        va.push_back(a.V(tok, d));
        vb.push_back(b.V(tok, d));
      }
    }
    EXPECT_LE(kvt::RelL2(ka, kb), 2e-2) << "K of tile " << t;
    EXPECT_LE(kvt::RelL2(va, vb), 2e-2) << "V of tile " << t;
  }
}

TEST_P(Golden, MeanQuantizationErrorWithinOnePermilleOfGolden) {
  // The mean absolute error of the reconstruction against the cache-frame (rotated fp16) input,
  // over the whole file, K and V separately, within 0.1% of the golden records'. The mean squared
  // error may only be lower than 0.1% above the golden one: on near-tie iterates (docs/FORMAT.md
  // section 4) the fp16 rounding of the scales changes, which with 8-bit codes moves the MSE of
  // a file by about 0.1% either way (k8v8_g128_d128_gauss: K MSE 0.14% below the golden one).
  const GoldenEntry& g = GetParam();
  const std::vector<uint16_t> kr = Rotated(k_), vr = Rotated(v_);
  struct Err {
    double abs = 0, sq = 0;
  } ok, gk, ov, gv;
  auto add = [](Err& e, double d) {
    e.abs += std::fabs(d);
    e.sq += d * d;
  };
  for (int t = 0; t < g.tiles; ++t) {
    const auto a = kvt::DecodeRecord(ours_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    const auto b = kvt::DecodeRecord(golden_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    for (int tok = 0; tok < g.G; ++tok) {
      for (int d = 0; d < g.D; ++d) {
        const size_t e = (static_cast<size_t>(t) * g.G + tok) * g.D + d;
        const double xk = kvt::HalfToDouble(kr[e]), xv = kvt::HalfToDouble(vr[e]);
        add(ok, a.K(tok, d) - xk);
        add(gk, b.K(tok, d) - xk);
        add(ov, a.V(tok, d) - xv);
        add(gv, b.V(tok, d) - xv);
      }
    }
  }
  RecordProperty("k_mean_abs_error_ratio", std::to_string(ok.abs / gk.abs));
  RecordProperty("v_mean_abs_error_ratio", std::to_string(ov.abs / gv.abs));
  RecordProperty("k_mse_ratio", std::to_string(ok.sq / gk.sq));
  RecordProperty("v_mse_ratio", std::to_string(ov.sq / gv.sq));
  EXPECT_LE(std::fabs(ok.abs / gk.abs - 1), 1e-3)
      << "K mean abs error " << ok.abs << " golden " << gk.abs;
  EXPECT_LE(std::fabs(ov.abs / gv.abs - 1), 1e-3)
      << "V mean abs error " << ov.abs << " golden " << gv.abs;
  EXPECT_LE(ok.sq / gk.sq, 1 + 1e-3) << "K squared error above the golden one";
  EXPECT_LE(ov.sq / gv.sq, 1 + 1e-3) << "V squared error above the golden one";
}

TEST_P(Golden, RotatingFirstWithKvarnRotateGivesTheSameRecords) {
  // kvarn_rotate to fp16 + KVARN_CODEC_CACHE_FRAME is exactly what kvarn_quantize does itself.
  const GoldenEntry& g = GetParam();
  const std::vector<uint16_t> kr = Rotated(k_), vr = Rotated(v_);
  std::vector<uint8_t> again(ours_.size(), 0);
  KVT_ASSERT_OK(kvarn_quantize(ctx_.get(), &cfg_, g.tiles, KVARN_DTYPE_F16, kr.data(), vr.data(),
                               KVARN_CODEC_CACHE_FRAME, again.data(), g.record_bytes));
  EXPECT_EQ(again, ours_);
}

TEST_P(Golden, DequantizeOfGoldenRecordsFollowsTheFormat) {
  // kvarn_dequantize reads the golden bytes as the spec says: (code*a + z)*c in the cache frame.
  const GoldenEntry& g = GetParam();
  const size_t n = static_cast<size_t>(g.tiles) * g.G * g.D;
  std::vector<float> k(n), v(n);
  KVT_ASSERT_OK(kvarn_dequantize(ctx_.get(), &cfg_, g.tiles, golden_.data(), g.record_bytes,
                                 KVARN_CODEC_CACHE_FRAME, KVARN_DTYPE_F32, k.data(), v.data()));
  for (int t = 0; t < g.tiles; ++t) {
    const auto b = kvt::DecodeRecord(golden_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    for (int tok = 0; tok < g.G; ++tok) {
      for (int d = 0; d < g.D; ++d) {
        const size_t e = (static_cast<size_t>(t) * g.G + tok) * g.D + d;
        ASSERT_NEAR(k[e], b.K(tok, d), 1e-6 * std::fabs(b.K(tok, d)) + 1e-30) << t << " " << e;
        ASSERT_NEAR(v[e], b.V(tok, d), 1e-6 * std::fabs(b.V(tok, d)) + 1e-30) << t << " " << e;
      }
    }
  }
}

TEST_P(Golden, QuantizationErrorIsSmall) {
  // A sanity bound tying the comparison to the inputs: the relative reconstruction error of each
  // file is what its bit width allows (golden and ours alike).
  const GoldenEntry& g = GetParam();
  const std::vector<uint16_t> kr = Rotated(k_), vr = Rotated(v_);
  std::vector<double> kx, vx, ka, va;
  for (int t = 0; t < g.tiles; ++t) {
    const auto a = kvt::DecodeRecord(ours_.data() + t * g.record_bytes, g.D, g.G, g.kb, g.vb);
    for (int tok = 0; tok < g.G; ++tok) {
      for (int d = 0; d < g.D; ++d) {
        const size_t e = (static_cast<size_t>(t) * g.G + tok) * g.D + d;
        kx.push_back(kvt::HalfToDouble(kr[e]));
        vx.push_back(kvt::HalfToDouble(vr[e]));
        ka.push_back(a.K(tok, d));
        va.push_back(a.V(tok, d));
      }
    }
  }
  auto bound = [](int bits) { return bits == 2 ? 0.6 : bits == 4 ? 0.15 : 0.01; };
  const double ek = kvt::RelL2(ka, kx), ev = kvt::RelL2(va, vx);
  RecordProperty("k_rel_l2", std::to_string(ek));
  RecordProperty("v_rel_l2", std::to_string(ev));
  EXPECT_LE(ek, bound(g.kb));
  EXPECT_LE(ev, bound(g.vb));
}

INSTANTIATE_TEST_SUITE_P(Files, Golden, ::testing::ValuesIn(LoadIndex()),
                         [](const ::testing::TestParamInfo<GoldenEntry>& p) {
                           std::string n = p.param.file.substr(0, p.param.file.find('.'));
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
