// The CUDA codec (rotate, quantize, dequantize, paged append and flush) against the CPU scalar
// reference through the public API (docs/FORMAT.md section 10): >= 99.99% identical
// codes, per-tile reconstruction within relative L2 2e-2 of the CPU's, mean quantization error
// within 0.1% of the CPU's; rotation and dequantization of the same records equal to the CPU's;
// deterministic bytes; every failure reported with nothing written. Skipped without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/fp.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/reference.h"
#include "support/rng.h"

namespace {

using kvt::DeviceBuffer;
using kvt::IsError;
using kvt::MakeConfig;

const char* DtypeName(kvarn_dtype_t t) {
  return t == KVARN_DTYPE_F32 ? "f32" : t == KVARN_DTYPE_F16 ? "f16" : "bf16";
}

kvarn_context_t* Cpu() {
  static kvt::ContextPtr cpu = kvt::MakeCpuContext();
  return cpu.get();
}

// Unrotated K and V of n tiles ([n][G][D]) with outlier channels, per-channel offsets, token
// spread and rare spikes (each tile its own channel profile), rounded to dtype.
struct Inputs {
  std::vector<float> k, v;      // values as the library sees them
  std::vector<uint8_t> kb, vb;  // encoded as dtype
};

Inputs MakeInputs(kvt::Rng& rng, size_t n_tiles, int G, int D, kvarn_dtype_t dtype) {
  Inputs in;
  kvt::KVShape ks, vs;
  vs.outlier = 5;
  vs.offset = 0.2;
  for (size_t t = 0; t < n_tiles; ++t) {
    const auto k = kvt::MakeTokens(rng, G, D, ks);
    const auto v = kvt::MakeTokens(rng, G, D, vs);
    in.k.insert(in.k.end(), k.begin(), k.end());
    in.v.insert(in.v.end(), v.begin(), v.end());
  }
  in.k = kvt::RoundTo(in.k, dtype);
  in.v = kvt::RoundTo(in.v, dtype);
  in.kb = kvt::Encode(in.k, dtype);
  in.vb = kvt::Encode(in.v, dtype);
  return in;
}

// Tiles so that one comparison counts at least ~600k codes.
size_t TilesFor(int D, int G) {
  return std::max<size_t>(4, 600000 / (2 * static_cast<size_t>(D) * G) + 1);
}

std::vector<uint8_t> CpuQuantize(const kvarn_config_t& cfg, size_t n, kvarn_dtype_t dt,
                                 const Inputs& in, uint32_t flags, size_t stride) {
  std::vector<uint8_t> rec(n * stride, 0xA5);
  EXPECT_EQ(
      kvarn_quantize(Cpu(), &cfg, n, dt, in.kb.data(), in.vb.data(), flags, rec.data(), stride),
      KVARN_OK)
      << kvarn_last_error();
  return rec;
}

std::vector<uint8_t> GpuQuantize(kvarn_context_t* gpu, const kvarn_config_t& cfg, size_t n,
                                 kvarn_dtype_t dt, const Inputs& in, uint32_t flags,
                                 size_t stride) {
  DeviceBuffer k(gpu, in.kb), v(gpu, in.vb);
  DeviceBuffer rec(gpu, std::vector<uint8_t>(n * stride, 0xA5));
  EXPECT_EQ(kvarn_quantize(gpu, &cfg, n, dt, k.get(), v.get(), flags, rec.get(), stride), KVARN_OK)
      << kvarn_last_error();
  return rec.Download<uint8_t>();
}

// GPU records vs CPU records of the same inputs: identical codes (count), per-tile
// reconstruction (both dequantized by the CPU, cache frame), mean squared error against the
// inputs (original frame, or the cache frame when `cache_frame_inputs`).
struct Parity {
  size_t codes = 0, diff = 0;
  double worst_tile_rel = 0;
  double err_cpu = 0, err_gpu = 0;
  size_t padding_changed = 0;
};

Parity Compare(const kvarn_config_t& cfg, size_t n, const std::vector<uint8_t>& rc,
               const std::vector<uint8_t>& rg, size_t stride, const Inputs& in,
               bool cache_frame_inputs) {
  Parity p;
  const int D = cfg.head_dim, G = cfg.tile_tokens;
  const size_t rb = kvt::RecordBytes(cfg);
  const size_t tile = static_cast<size_t>(G) * D;
  for (size_t t = 0; t < n; ++t) {
    const kvt::DecodedRecord a =
        kvt::DecodeRecord(rc.data() + t * stride, D, G, cfg.key_bits, cfg.value_bits);
    const kvt::DecodedRecord b =
        kvt::DecodeRecord(rg.data() + t * stride, D, G, cfg.key_bits, cfg.value_bits);
    for (size_t i = 0; i < a.k_codes.size(); ++i) p.diff += a.k_codes[i] != b.k_codes[i];
    for (size_t i = 0; i < a.v_codes.size(); ++i) p.diff += a.v_codes[i] != b.v_codes[i];
    p.codes += a.k_codes.size() + a.v_codes.size();
    for (size_t i = rb; i < stride; ++i) p.padding_changed += rg[t * stride + i] != 0xA5;
  }
  for (int frame = 0; frame < 2; ++frame) {
    const uint32_t flags = frame == 0 ? KVARN_CODEC_CACHE_FRAME : 0u;
    std::vector<float> kc(n * tile), vc(n * tile), kg(n * tile), vg(n * tile);
    EXPECT_EQ(kvarn_dequantize(Cpu(), &cfg, n, rc.data(), stride, flags, KVARN_DTYPE_F32, kc.data(),
                               vc.data()),
              KVARN_OK);
    EXPECT_EQ(kvarn_dequantize(Cpu(), &cfg, n, rg.data(), stride, flags, KVARN_DTYPE_F32, kg.data(),
                               vg.data()),
              KVARN_OK);
    if (frame == 0) {
      for (size_t t = 0; t < n; ++t) {
        for (int which = 0; which < 2; ++which) {
          const std::vector<float>& c = which ? vc : kc;
          const std::vector<float>& g = which ? vg : kg;
          std::vector<float> ct(c.begin() + t * tile, c.begin() + (t + 1) * tile);
          std::vector<float> gt(g.begin() + t * tile, g.begin() + (t + 1) * tile);
          p.worst_tile_rel = std::max(p.worst_tile_rel, kvt::RelL2(gt, ct));
        }
      }
    }
    if ((frame == 0) == cache_frame_inputs) {
      for (size_t i = 0; i < n * tile; ++i) {
        const double ek = kc[i] - in.k[i], ev = vc[i] - in.v[i];
        const double gk = kg[i] - in.k[i], gv = vg[i] - in.v[i];
        p.err_cpu += ek * ek + ev * ev;
        p.err_gpu += gk * gk + gv * gv;
      }
    }
  }
  return p;
}

void ExpectParity(const Parity& p, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_GT(p.codes, 0u);
  EXPECT_LE(p.diff, p.codes / 10000) << p.diff << " of " << p.codes << " codes differ";
  EXPECT_LE(p.worst_tile_rel, 2e-2);
  EXPECT_GT(p.err_cpu, 0.0);
  // Never worse than the reference by more than 0.1%; the GPU may pick other best iterates on
  // near-ties (docs/FORMAT.md section 4), which on the H200 made it up to 0.19% *better* for
  // k8v8 D64 (device run 5), so the other side is bounded at 0.5%.
  EXPECT_LE(p.err_gpu - p.err_cpu, 1e-3 * p.err_cpu)
      << "mean squared error gpu " << p.err_gpu << " vs cpu " << p.err_cpu;
  EXPECT_LE(p.err_cpu - p.err_gpu, 5e-3 * p.err_cpu)
      << "mean squared error gpu " << p.err_gpu << " vs cpu " << p.err_cpu;
  EXPECT_EQ(p.padding_changed, 0u) << "bytes past the record (stride padding) were written";
}

// ---- rotate -----------------------------------------------------------------------------------

class CudaRotate : public ::testing::TestWithParam<std::tuple<int, kvarn_dtype_t, kvarn_dtype_t>> {
};

TEST_P(CudaRotate, EqualsCpuBitForBit) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const auto [D, in_dt, out_dt] = GetParam();
  for (size_t rows : {size_t{1}, size_t{7}, size_t{1001}}) {
    auto x = kvt::RoundTo(kvt::MakeTokens(rng, static_cast<int>(rows), D, kvt::KVShape{}), in_dt);
    const auto xb = kvt::Encode(x, in_dt);
    const size_t out_bytes = rows * D * kvt::DtypeBytes(out_dt);
    std::vector<uint8_t> cpu(out_bytes);
    KVT_ASSERT_OK(kvarn_rotate(Cpu(), D, rows, in_dt, xb.data(), out_dt, cpu.data()));
    // Aligned device pointers, then pointers 8 bytes off 16-byte alignment (no vector loads).
    for (size_t offset : {size_t{0}, size_t{8}}) {
      DeviceBuffer in(gpu.get(), xb.size() + 16), out(gpu.get(), out_bytes + 16);
      uint8_t* in_p = static_cast<uint8_t*>(in.get()) + offset;
      uint8_t* out_p = static_cast<uint8_t*>(out.get()) + offset;
      KVT_ASSERT_OK(
          kvarn_memory_copy(gpu.get(), in_p, xb.data(), xb.size(), KVARN_COPY_HOST_TO_DEVICE));
      KVT_ASSERT_OK(kvarn_rotate(gpu.get(), D, rows, in_dt, in_p, out_dt, out_p));
      std::vector<uint8_t> got(out_bytes);
      KVT_ASSERT_OK(
          kvarn_memory_copy(gpu.get(), got.data(), out_p, out_bytes, KVARN_COPY_DEVICE_TO_HOST));
      EXPECT_EQ(got, cpu) << "rows " << rows << " offset " << offset;
      if (in_dt == out_dt) {  // in place
        KVT_ASSERT_OK(kvarn_rotate(gpu.get(), D, rows, in_dt, in_p, in_dt, in_p));
        KVT_ASSERT_OK(
            kvarn_memory_copy(gpu.get(), got.data(), in_p, out_bytes, KVARN_COPY_DEVICE_TO_HOST));
        EXPECT_EQ(got, cpu) << "in place, rows " << rows << " offset " << offset;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllShapes, CudaRotate,
    ::testing::Combine(::testing::Values(64, 128, 256, 512),
                       ::testing::Values(KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16),
                       ::testing::Values(KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16)),
    [](const auto& info) {
      return "D" + std::to_string(std::get<0>(info.param)) + "_" +
             DtypeName(std::get<1>(info.param)) + "_to_" + DtypeName(std::get<2>(info.param));
    });

TEST(CudaRotateEdges, RotatingTwiceRestoresTheInput) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const int D = 256;
  const size_t rows = 333;
  const auto x = kvt::MakeTokens(rng, static_cast<int>(rows), D, kvt::KVShape{});
  DeviceBuffer buf(gpu.get(), x);
  KVT_ASSERT_OK(
      kvarn_rotate(gpu.get(), D, rows, KVARN_DTYPE_F32, buf.get(), KVARN_DTYPE_F32, buf.get()));
  const auto once = buf.Download<float>();
  EXPECT_GT(kvt::RelL2(once, x), 0.1);  // it did rotate
  KVT_ASSERT_OK(
      kvarn_rotate(gpu.get(), D, rows, KVARN_DTYPE_F32, buf.get(), KVARN_DTYPE_F32, buf.get()));
  EXPECT_LT(kvt::RelL2(buf.Download<float>(), x), 1e-6);
}

// ---- quantize parity --------------------------------------------------------------------------

class CudaQuantize : public ::testing::TestWithParam<std::tuple<std::string, int, kvarn_dtype_t>> {
};

TEST_P(CudaQuantize, MatchesCpuReference) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const auto [preset, D, dt] = GetParam();
  const kvarn_config_t cfg = kvt::PresetConfig(preset, D);
  const size_t n = TilesFor(D, cfg.tile_tokens);
  const size_t rb = kvt::RecordBytes(cfg);
  const Inputs in = MakeInputs(rng, n, cfg.tile_tokens, D, dt);
  // A packed stride (16-byte copies) and one with 6 bytes of padding (byte copies).
  for (size_t stride : {rb, rb + 6}) {
    const auto rc = CpuQuantize(cfg, n, dt, in, 0, stride);
    const auto rg = GpuQuantize(gpu.get(), cfg, n, dt, in, 0, stride);
    ExpectParity(Compare(cfg, n, rc, rg, stride, in, false), preset + " D" + std::to_string(D) +
                                                                 " " + DtypeName(dt) + " stride " +
                                                                 std::to_string(stride));
  }
}

INSTANTIATE_TEST_SUITE_P(AllPresets, CudaQuantize,
                         ::testing::Combine(::testing::Values("k4v2_g128", "k4v2_g64", "k4v4_g128",
                                                              "k4v4_g64", "k2v2_g128", "k8v8_g128"),
                                            ::testing::Values(64, 128, 256, 512),
                                            ::testing::Values(KVARN_DTYPE_F32, KVARN_DTYPE_F16,
                                                              KVARN_DTYPE_BF16)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_D" +
                                  std::to_string(std::get<1>(info.param)) + "_" +
                                  DtypeName(std::get<2>(info.param));
                         });

TEST(CudaQuantizeAblations, EveryFlagAndIterationCountMatchesCpu) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  struct Case {
    int D, G, kb, vb, iters;
    uint32_t kf, vf;
  };
  const uint32_t NR = KVARN_ABLATE_NO_ROTATION, NN = KVARN_ABLATE_NO_NORMALIZATION;
  const Case cases[] = {
      {128, 128, 4, 2, 8, NR, 0},
      {128, 128, 4, 2, 8, 0, NR},
      {128, 128, 4, 2, 8, NN, 0},
      {128, 128, 4, 2, 8, 0, NN},
      {128, 128, 4, 2, 8, NR | NN, NR | NN},
      {64, 64, 2, 2, 8, NR, NN},
      {512, 128, 4, 4, 8, NN, NR},
      {128, 128, 4, 2, 0, 0, 0},
      {128, 64, 4, 2, 1, 0, 0},
      {128, 128, 4, 2, 16, 0, 0},
      {256, 128, 8, 8, 32, 0, 0},
      {64, 128, 4, 2, 3, 0, 0},
  };
  for (const Case& c : cases) {
    const kvarn_config_t cfg = MakeConfig(c.D, c.G, c.kb, c.vb, c.iters, 1, c.kf, c.vf);
    const size_t n = TilesFor(c.D, c.G);
    const size_t rb = kvt::RecordBytes(cfg);
    const Inputs in = MakeInputs(rng, n, c.G, c.D, KVARN_DTYPE_F32);
    const auto rc = CpuQuantize(cfg, n, KVARN_DTYPE_F32, in, 0, rb);
    const auto rg = GpuQuantize(gpu.get(), cfg, n, KVARN_DTYPE_F32, in, 0, rb);
    const Parity p = Compare(cfg, n, rc, rg, rb, in, false);
    const std::string what = "D" + std::to_string(c.D) + " G" + std::to_string(c.G) + " k" +
                             std::to_string(c.kb) + "v" + std::to_string(c.vb) + " T" +
                             std::to_string(c.iters) + " kflags " + std::to_string(c.kf) +
                             " vflags " + std::to_string(c.vf);
    ExpectParity(p, what);
    // Without normalization (or T = 0) the scales are 1 on both sides: codes are identical.
    if ((c.kf & NN) && (c.vf & NN)) EXPECT_EQ(p.diff, 0u) << what;
    if (c.iters == 0) EXPECT_EQ(p.diff, 0u) << what;
  }
}

TEST(CudaQuantizeCacheFrame, MatchesCpuOnFp16CacheFrameInputs) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  for (int D : {64, 128, 512}) {
    const kvarn_config_t cfg = MakeConfig(D, 128, 4, 2);
    const size_t n = TilesFor(D, 128);
    const size_t rb = kvt::RecordBytes(cfg);
    Inputs raw = MakeInputs(rng, n, 128, D, KVARN_DTYPE_F32);
    // The cache frame: rotated and rounded to fp16 by the CPU.
    std::vector<uint16_t> kh(raw.k.size()), vh(raw.v.size());
    KVT_ASSERT_OK(kvarn_rotate(Cpu(), D, raw.k.size() / D, KVARN_DTYPE_F32, raw.k.data(),
                               KVARN_DTYPE_F16, kh.data()));
    KVT_ASSERT_OK(kvarn_rotate(Cpu(), D, raw.v.size() / D, KVARN_DTYPE_F32, raw.v.data(),
                               KVARN_DTYPE_F16, vh.data()));
    for (kvarn_dtype_t dt : {KVARN_DTYPE_F16, KVARN_DTYPE_F32}) {
      Inputs in;
      for (size_t i = 0; i < kh.size(); ++i) in.k.push_back(kvt::HalfToFloat(kh[i]));
      for (size_t i = 0; i < vh.size(); ++i) in.v.push_back(kvt::HalfToFloat(vh[i]));
      in.kb = kvt::Encode(in.k, dt);
      in.vb = kvt::Encode(in.v, dt);
      const auto rc = CpuQuantize(cfg, n, dt, in, KVARN_CODEC_CACHE_FRAME, rb);
      const auto rg = GpuQuantize(gpu.get(), cfg, n, dt, in, KVARN_CODEC_CACHE_FRAME, rb);
      ExpectParity(Compare(cfg, n, rc, rg, rb, in, true),
                   "D" + std::to_string(D) + " " + DtypeName(dt));
    }
  }
}

TEST(CudaQuantizeDeterminism, SameBytesTwiceAndWhateverTheBatch) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(128, 128, 4, 2);
  const size_t n = 37, rb = kvt::RecordBytes(cfg);
  const Inputs in = MakeInputs(rng, n, 128, 128, KVARN_DTYPE_BF16);
  const auto a = GpuQuantize(gpu.get(), cfg, n, KVARN_DTYPE_BF16, in, 0, rb);
  const auto b = GpuQuantize(gpu.get(), cfg, n, KVARN_DTYPE_BF16, in, 0, rb);
  EXPECT_EQ(a, b);
  // Tile 5 alone gives the bytes it got in the batch.
  Inputs one;
  const size_t tile_bytes = 128 * 128 * 2;
  one.kb.assign(in.kb.begin() + 5 * tile_bytes, in.kb.begin() + 6 * tile_bytes);
  one.vb.assign(in.vb.begin() + 5 * tile_bytes, in.vb.begin() + 6 * tile_bytes);
  const auto c = GpuQuantize(gpu.get(), cfg, 1, KVARN_DTYPE_BF16, one, 0, rb);
  EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin() + 5 * rb));
}

// ---- dequantize -------------------------------------------------------------------------------

class CudaDequantize : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CudaDequantize, SameRecordsGiveTheCpuTiles) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const auto [preset, D] = GetParam();
  for (uint32_t kflags : {0u, static_cast<uint32_t>(KVARN_ABLATE_NO_ROTATION)}) {
    kvarn_config_t cfg = kvt::PresetConfig(preset, D);
    cfg.key_flags = kflags;
    const int G = cfg.tile_tokens;
    const size_t n = 6, rb = kvt::RecordBytes(cfg), stride = rb + 2;
    const Inputs in = MakeInputs(rng, n, G, D, KVARN_DTYPE_F32);
    const auto rec = CpuQuantize(cfg, n, KVARN_DTYPE_F32, in, 0, stride);
    DeviceBuffer drec(gpu.get(), rec);
    const size_t elems = n * G * D;
    for (uint32_t flags : {0u, static_cast<uint32_t>(KVARN_CODEC_CACHE_FRAME)}) {
      for (kvarn_dtype_t dt : {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
        const size_t bytes = elems * kvt::DtypeBytes(dt);
        std::vector<uint8_t> kc(bytes), vc(bytes);
        KVT_ASSERT_OK(
            kvarn_dequantize(Cpu(), &cfg, n, rec.data(), stride, flags, dt, kc.data(), vc.data()));
        for (int which_null = -1; which_null < 2; ++which_null) {
          DeviceBuffer dk(gpu.get(), std::vector<uint8_t>(bytes, 0x5A));
          DeviceBuffer dv(gpu.get(), std::vector<uint8_t>(bytes, 0x5A));
          KVT_ASSERT_OK(kvarn_dequantize(gpu.get(), &cfg, n, drec.get(), stride, flags, dt,
                                         which_null == 0 ? nullptr : dk.get(),
                                         which_null == 1 ? nullptr : dv.get()));
          const auto kg = dk.Download<uint8_t>(), vg = dv.Download<uint8_t>();
          const std::string what = std::string(DtypeName(dt)) + " flags " + std::to_string(flags) +
                                   " kflags " + std::to_string(kflags) + " null " +
                                   std::to_string(which_null);
          for (int which = 0; which < 2; ++which) {
            const auto& g = which ? vg : kg;
            const auto& c = which ? vc : kc;
            if (which_null == which) {
              EXPECT_EQ(g, std::vector<uint8_t>(bytes, 0x5A)) << what << ": written though NULL";
              continue;
            }
            // Within fp32 rounding of the CPU's values (the same unfused operations give the
            // same bits; allow one rounding of the tile's scale either way).
            const auto gd = kvt::Decode(g.data(), elems, dt), cd = kvt::Decode(c.data(), elems, dt);
            double max_abs = 0;
            for (double x : cd) max_abs = std::max(max_abs, std::fabs(x));
            size_t bad = 0;
            for (size_t i = 0; i < elems; ++i) {
              const double ulp = dt == KVARN_DTYPE_F32   ? 0.0
                                 : dt == KVARN_DTYPE_F16 ? kvt::HalfUlp(cd[i])
                                                         : kvt::Bf16Ulp(cd[i]);
              bad += std::fabs(gd[i] - cd[i]) > ulp + 4e-7 * max_abs;
            }
            EXPECT_EQ(bad, 0u) << what << (which ? " v" : " k");
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllPresets, CudaDequantize,
                         ::testing::Combine(::testing::Values("k4v2_g128", "k4v2_g64", "k4v4_g128",
                                                              "k4v4_g64", "k2v2_g128", "k8v8_g128"),
                                            ::testing::Values(64, 128, 256, 512)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_D" +
                                  std::to_string(std::get<1>(info.param));
                         });

// ---- paged append + flush ---------------------------------------------------------------------

// The same appends and flushes on a CPU cache (host memory) and a GPU cache (device memory):
// pages must be identical bytes, records at parity.
struct TwinCache {
  kvarn_config_t cfg;
  int D, G, Hk, batch, max_blocks, num_pages, num_blocks;
  size_t stride;
  std::vector<int32_t> block_table, seq_lens, record_tiles;
  kvt::PagedCache host;  // CPU side: its vectors are the pools
  DeviceBuffer *k_pages = nullptr, *v_pages = nullptr, *records = nullptr, *table = nullptr,
               *lens = nullptr, *rtiles = nullptr;

  kvarn_paged_kv_t CpuView() {
    host.block_table = block_table;
    host.seq_lens = seq_lens;
    host.record_tiles = record_tiles;
    return host.View();
  }
  kvarn_paged_kv_t GpuView() {
    table->Upload(block_table);
    lens->Upload(seq_lens);
    rtiles->Upload(record_tiles);
    kvarn_paged_kv_t kv = host.View();
    kv.records = records->get();
    kv.k_pages = k_pages->get();
    kv.v_pages = v_pages->get();
    kv.block_table = static_cast<const int32_t*>(table->get());
    kv.seq_lens = static_cast<const int32_t*>(lens->get());
    kv.record_tiles = static_cast<const int32_t*>(rtiles->get());
    return kv;
  }
};

void RunTwin(kvarn_context_t* gpu, const kvarn_config_t& cfg, int Hk, const std::vector<int>& lens,
             kvarn_dtype_t dt, kvt::Rng& rng) {
  const int D = cfg.head_dim, G = cfg.tile_tokens, batch = static_cast<int>(lens.size());
  int max_tiles = 1, total_tiles = 0, total_records = 0;
  for (int n : lens) {
    max_tiles = std::max(max_tiles, (n + G - 1) / G);
    total_tiles += (n + G - 1) / G;
    total_records += std::max(0, n / G - cfg.sink_tiles);
  }
  TwinCache c;
  c.cfg = cfg;
  c.host = kvt::SmallPagedCache(cfg, Hk, batch, max_tiles + 1, total_tiles + 2, total_records + 2);
  c.block_table.assign(static_cast<size_t>(batch) * (max_tiles + 1), 0);
  c.seq_lens.assign(batch, 0);
  c.record_tiles.assign(batch, 0);
  std::vector<int32_t> pages(total_tiles + 2), blocks(total_records + 2);
  for (size_t i = 0; i < pages.size(); ++i) pages[i] = static_cast<int32_t>(i);
  for (size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<int32_t>(i);
  rng.Shuffle(pages.data(), pages.size());
  rng.Shuffle(blocks.data(), blocks.size());
  for (int b = 0, next = 0; b < batch; ++b) {
    for (int t = 0; t < (lens[b] + G - 1) / G; ++t) {
      c.block_table[static_cast<size_t>(b) * (max_tiles + 1) + t] = pages[next++];
    }
  }
  DeviceBuffer kp(gpu, c.host.k_pages), vp(gpu, c.host.v_pages), rec(gpu, c.host.records);
  DeviceBuffer table(gpu, c.block_table), dlens(gpu, c.seq_lens), rt(gpu, c.record_tiles);
  c.k_pages = &kp, c.v_pages = &vp, c.records = &rec, c.table = &table, c.lens = &dlens,
  c.rtiles = &rt;

  std::vector<kvt::ChannelProfile> prof;
  kvt::KVShape shape;
  for (int i = 0; i < 2 * batch * Hk; ++i) prof.push_back(kvt::MakeProfile(rng, D, shape));
  for (int round = 0;; ++round) {
    std::vector<int32_t> indptr(1, 0);
    std::vector<float> k, v, tok(D);
    bool any = false;
    std::vector<int> chunk(batch);
    for (int b = 0; b < batch; ++b) {
      const int remaining = lens[b] - c.seq_lens[b];
      chunk[b] = remaining > 0 ? static_cast<int>(rng.Int(0, std::min(remaining, 150))) : 0;
      if (remaining > 0 && round > 50) chunk[b] = remaining;
      any |= remaining > 0;
      for (int i = 0; i < chunk[b]; ++i) {
        for (int h = 0; h < Hk; ++h) {
          kvt::FillToken(rng, prof[(b * Hk + h) * 2], shape, tok.data(), D);
          k.insert(k.end(), tok.begin(), tok.end());
          kvt::FillToken(rng, prof[(b * Hk + h) * 2 + 1], shape, tok.data(), D);
          v.insert(v.end(), tok.begin(), tok.end());
        }
      }
      indptr.push_back(indptr.back() + chunk[b]);
    }
    if (!any) break;
    const auto kb = kvt::Encode(kvt::RoundTo(k, dt), dt), vb = kvt::Encode(kvt::RoundTo(v, dt), dt);
    kvarn_paged_kv_t ckv = c.CpuView();
    KVT_ASSERT_OK(kvarn_paged_append(Cpu(), &cfg, &ckv, indptr.data(), dt, kb.data(), vb.data()));
    if (!kb.empty()) {
      DeviceBuffer dk(gpu, kb), dv(gpu, vb);
      kvarn_paged_kv_t gkv = c.GpuView();
      KVT_ASSERT_OK(kvarn_paged_append(gpu, &cfg, &gkv, indptr.data(), dt, dk.get(), dv.get()));
      KVT_ASSERT_OK(kvarn_context_synchronize(gpu));
    }
    for (int b = 0; b < batch; ++b) c.seq_lens[b] += chunk[b];
    // Flush the complete non-sink tiles (several sequences per call).
    std::vector<int32_t> src, dst;
    std::vector<std::pair<int, int>> where;
    for (int b = 0; b < batch; ++b) {
      for (int t = cfg.sink_tiles + c.record_tiles[b]; t < c.seq_lens[b] / G; ++t) {
        src.push_back(c.block_table[static_cast<size_t>(b) * (max_tiles + 1) + t]);
        dst.push_back(blocks.back());
        blocks.pop_back();
        where.emplace_back(b, t);
      }
    }
    if (src.empty()) continue;
    ckv = c.CpuView();
    KVT_ASSERT_OK(kvarn_paged_flush(Cpu(), &cfg, &ckv, src.size(), src.data(), dst.data()));
    kvarn_paged_kv_t gkv = c.GpuView();
    KVT_ASSERT_OK(kvarn_paged_flush(gpu, &cfg, &gkv, src.size(), src.data(), dst.data()));
    for (size_t i = 0; i < src.size(); ++i) {
      c.block_table[static_cast<size_t>(where[i].first) * (max_tiles + 1) + where[i].second] =
          dst[i];
      ++c.record_tiles[where[i].first];
    }
  }
  // Pages: the same bytes (rotation and fp16 rounding are exact on both sides), poison included.
  EXPECT_EQ(kp.Download<uint16_t>(), c.host.k_pages);
  EXPECT_EQ(vp.Download<uint16_t>(), c.host.v_pages);
  // Records: parity, record blocks never written keep their poison.
  const auto rg = rec.Download<uint8_t>();
  const size_t n_rec = static_cast<size_t>(total_records + 2) * Hk;
  size_t codes = 0, diff = 0;
  double worst = 0;
  const size_t tile = static_cast<size_t>(G) * D;
  std::vector<float> kc(tile), vc(tile), kg(tile), vg(tile);
  for (size_t r = 0; r < n_rec; ++r) {
    const uint8_t* a = c.host.records.data() + r * c.host.stride;
    const uint8_t* g = rg.data() + r * c.host.stride;
    if (a[0] == kvt::kPoisonByte &&
        std::all_of(a, a + c.host.stride, [](uint8_t x) { return x == kvt::kPoisonByte; })) {
      EXPECT_TRUE(std::equal(a, a + c.host.stride, g))
          << "record " << r << " written by the GPU only";
      continue;
    }
    const auto da = kvt::DecodeRecord(a, D, G, cfg.key_bits, cfg.value_bits);
    const auto dg = kvt::DecodeRecord(g, D, G, cfg.key_bits, cfg.value_bits);
    for (size_t i = 0; i < da.k_codes.size(); ++i) diff += da.k_codes[i] != dg.k_codes[i];
    for (size_t i = 0; i < da.v_codes.size(); ++i) diff += da.v_codes[i] != dg.v_codes[i];
    codes += da.k_codes.size() + da.v_codes.size();
    KVT_EXPECT_OK(kvarn_dequantize(Cpu(), &cfg, 1, a, c.host.stride, KVARN_CODEC_CACHE_FRAME,
                                   KVARN_DTYPE_F32, kc.data(), vc.data()));
    KVT_EXPECT_OK(kvarn_dequantize(Cpu(), &cfg, 1, g, c.host.stride, KVARN_CODEC_CACHE_FRAME,
                                   KVARN_DTYPE_F32, kg.data(), vg.data()));
    worst = std::max({worst, kvt::RelL2(kg, kc), kvt::RelL2(vg, vc)});
    EXPECT_TRUE(std::equal(a + c.host.record_bytes, a + c.host.stride, g + c.host.record_bytes))
        << "stride padding of record " << r;
  }
  EXPECT_GT(codes, 0u);
  EXPECT_LE(diff, codes / 10000) << diff << " of " << codes << " codes differ";
  EXPECT_LE(worst, 2e-2);
}

TEST(CudaPaged, AppendAndFlushMatchCpu) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  RunTwin(gpu.get(), MakeConfig(128, 128, 4, 2), 8, {700, 130, 1, 1024, 0, 257}, KVARN_DTYPE_F16,
          rng);
  RunTwin(gpu.get(), MakeConfig(64, 64, 2, 2, 8, 0), 3, {300, 64, 129}, KVARN_DTYPE_F32, rng);
  RunTwin(gpu.get(), MakeConfig(512, 128, 8, 8), 2, {400, 260}, KVARN_DTYPE_BF16, rng);
  RunTwin(gpu.get(), MakeConfig(256, 64, 4, 4, 8, 2, KVARN_ABLATE_NO_ROTATION, 0), 4, {333, 640},
          KVARN_DTYPE_F32, rng);
}

TEST(CudaPaged, FlushIsDeterministic) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(128, 128, 4, 2);
  const int Hk = 4, pages = 6, D = 128, G = 128;
  kvt::PagedCache c = kvt::SmallPagedCache(cfg, Hk, 1, 1, pages, pages);
  for (int p = 0; p < pages; ++p) {
    for (int h = 0; h < Hk; ++h) {
      const auto k = kvt::MakeTokens(rng, G, D, kvt::KVShape{});
      const auto v = kvt::MakeTokens(rng, G, D, kvt::KVShape{});
      for (int i = 0; i < G * D; ++i) {
        c.KPage(p, h)[i] = kvt::FloatToHalf(k[i]);
        c.VPage(p, h)[i] = kvt::FloatToHalf(v[i]);
      }
    }
  }
  DeviceBuffer kp(gpu.get(), c.k_pages), vp(gpu.get(), c.v_pages);
  const int32_t src[] = {3, 0, 5, 1, 2, 4}, dst[] = {0, 1, 2, 3, 4, 5};
  std::vector<uint8_t> first;
  for (int rep = 0; rep < 2; ++rep) {
    DeviceBuffer rec(gpu.get(), c.records);
    kvarn_paged_kv_t kv = c.View();
    kv.k_pages = kp.get();
    kv.v_pages = vp.get();
    kv.records = rec.get();
    KVT_ASSERT_OK(kvarn_paged_flush(gpu.get(), &cfg, &kv, pages, src, dst));
    if (rep == 0) {
      first = rec.Download<uint8_t>();
    } else {
      EXPECT_EQ(rec.Download<uint8_t>(), first);
    }
  }
}

// ---- errors -----------------------------------------------------------------------------------

TEST(CudaErrors, QuantizeNonFiniteInputWritesNothing) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(128, 64, 4, 2);
  const size_t n = 3, rb = kvt::RecordBytes(cfg);
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    for (int which = 0; which < 2; ++which) {
      Inputs in = MakeInputs(rng, n, 64, 128, KVARN_DTYPE_F32);
      (which ? in.v : in.k)[2 * 64 * 128 + 17 * 128 + 5] = bad;  // tile 2, token 17
      in.kb = kvt::Encode(in.k, KVARN_DTYPE_F32);
      in.vb = kvt::Encode(in.v, KVARN_DTYPE_F32);
      DeviceBuffer k(gpu.get(), in.kb), v(gpu.get(), in.vb);
      const std::vector<uint8_t> poison(n * rb, 0x3C);
      DeviceBuffer rec(gpu.get(), poison);
      EXPECT_TRUE(IsError(
          kvarn_quantize(gpu.get(), &cfg, n, KVARN_DTYPE_F32, k.get(), v.get(), 0, rec.get(), rb),
          KVARN_ERR_NON_FINITE, "tile 2"));
      EXPECT_EQ(rec.Download<uint8_t>(), poison);
      KVT_EXPECT_OK(kvarn_context_synchronize(gpu.get()));  // nothing left sticky
    }
  }
}

TEST(CudaErrors, QuantizeOverflowWritesNothing) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  // (a) 60000 in every channel fits fp16 but its rotation does not.
  {
    const kvarn_config_t cfg = MakeConfig(128, 64, 4, 2);
    const size_t rb = kvt::RecordBytes(cfg);
    Inputs in = MakeInputs(rng, 2, 64, 128, KVARN_DTYPE_F16);
    for (int d = 0; d < 128; ++d) in.k[64 * 128 + 10 * 128 + d] = 60000.f;
    in.kb = kvt::Encode(in.k, KVARN_DTYPE_F16);
    DeviceBuffer k(gpu.get(), in.kb), v(gpu.get(), in.vb);
    const std::vector<uint8_t> poison(2 * rb, 0x77);
    DeviceBuffer rec(gpu.get(), poison);
    EXPECT_TRUE(IsError(
        kvarn_quantize(gpu.get(), &cfg, 2, KVARN_DTYPE_F16, k.get(), v.get(), 0, rec.get(), rb),
        KVARN_ERR_OVERFLOW, "fp16"));
    EXPECT_EQ(rec.Download<uint8_t>(), poison);
  }
  // (b) An absorbed zero beyond fp16 (test_codec_api.cpp, AbsorbedOverflowTile), tile 1 of 2.
  {
    const int D = 128, G = 128;
    const kvarn_config_t cfg = MakeConfig(D, G, 4, 2);
    const size_t rb = kvt::RecordBytes(cfg);
    std::vector<float> k(2 * G * D), v(2 * G * D);
    for (auto& x : v) x = static_cast<float>(rng.Normal());
    for (int i = 0; i < G * D; ++i) k[i] = static_cast<float>(rng.Normal());
    for (int t = 0; t < G; ++t) {
      for (int d = 0; d < D; ++d) {
        k[G * D + t * D + d] = t == 0 ? -60000.f : static_cast<float>(5 * rng.Normal());
      }
    }
    DeviceBuffer dk(gpu.get(), k), dv(gpu.get(), v);
    const std::vector<uint8_t> poison(2 * rb, 0x3D);
    DeviceBuffer rec(gpu.get(), poison);
    EXPECT_TRUE(IsError(kvarn_quantize(gpu.get(), &cfg, 2, KVARN_DTYPE_F32, dk.get(), dv.get(),
                                       KVARN_CODEC_CACHE_FRAME, rec.get(), rb),
                        KVARN_ERR_OVERFLOW, "fp16"));
    EXPECT_EQ(rec.Download<uint8_t>(), poison);
    // Without normalization the same tile fits.
    const kvarn_config_t nn = MakeConfig(D, G, 4, 2, 8, 1, KVARN_ABLATE_NO_NORMALIZATION, 0);
    KVT_EXPECT_OK(kvarn_quantize(gpu.get(), &nn, 2, KVARN_DTYPE_F32, dk.get(), dv.get(),
                                 KVARN_CODEC_CACHE_FRAME, rec.get(), rb));
  }
}

// One sequence of 0 tokens with pages 0 and 1, and a device twin of the small cache.
struct DeviceSmallCache {
  kvt::PagedCache c;
  std::unique_ptr<DeviceBuffer> kp, vp, rec, table, lens, rt;
  DeviceSmallCache(kvarn_context_t* gpu, const kvarn_config_t& cfg, int hk, int batch,
                   int blocks_per_seq, int pages, int record_blocks)
      : c(kvt::SmallPagedCache(cfg, hk, batch, blocks_per_seq, pages, record_blocks)) {
    kp = std::make_unique<DeviceBuffer>(gpu, c.k_pages);
    vp = std::make_unique<DeviceBuffer>(gpu, c.v_pages);
    rec = std::make_unique<DeviceBuffer>(gpu, c.records);
    table = std::make_unique<DeviceBuffer>(gpu, c.block_table);
    lens = std::make_unique<DeviceBuffer>(gpu, c.seq_lens);
    rt = std::make_unique<DeviceBuffer>(gpu, c.record_tiles);
  }
  kvarn_paged_kv_t View() {
    table->Upload(c.block_table);
    lens->Upload(c.seq_lens);
    rt->Upload(c.record_tiles);
    kvarn_paged_kv_t kv = c.View();
    kv.k_pages = kp->get();
    kv.v_pages = vp->get();
    kv.records = rec->get();
    kv.block_table = static_cast<const int32_t*>(table->get());
    kv.seq_lens = static_cast<const int32_t*>(lens->get());
    kv.record_tiles = static_cast<const int32_t*>(rt->get());
    return kv;
  }
};

TEST(CudaErrors, AppendBadRowsFailAtSynchronizeAndWriteNothing) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(128, 64, 4, 2);
  const int Hk = 2, D = 128;
  struct Case {
    float value;
    bool all_channels;
    kvarn_status_t want;
    const char* needle;  // the message names the token (global index 9) and head 1
  };
  const Case cases[] = {{NAN, false, KVARN_ERR_NON_FINITE, "token 9, head 1"},
                        {INFINITY, false, KVARN_ERR_NON_FINITE, "token 9, head 1"},
                        {60000.f, true, KVARN_ERR_OVERFLOW, "9, head 1"},
                        {1e6f, false, KVARN_ERR_OVERFLOW, "9, head 1"}};
  for (const Case& bc : cases) {
    DeviceSmallCache s(gpu.get(), cfg, Hk, 2, 2, 4, 1);
    s.c.block_table = {0, 1, 2, 3};
    s.c.seq_lens = {10, 60};
    const std::vector<int32_t> indptr = {0, 5, 12};  // sequence 1 crosses into its second page
    std::vector<float> k = kvt::MakeTokens(rng, 12 * Hk, D, kvt::KVShape{});
    std::vector<float> v = kvt::MakeTokens(rng, 12 * Hk, D, kvt::KVShape{});
    float* row = v.data() + (9 * Hk + 1) * D;  // token 9, head 1
    for (int d = 0; d < D; ++d) {
      if (bc.all_channels || d == 3) row[d] = bc.value;
    }
    DeviceBuffer dk(gpu.get(), k), dv(gpu.get(), v);
    kvarn_paged_kv_t kv = s.View();
    KVT_EXPECT_OK(kvarn_paged_append(gpu.get(), &cfg, &kv, indptr.data(), KVARN_DTYPE_F32, dk.get(),
                                     dv.get()));
    EXPECT_TRUE(IsError(kvarn_context_synchronize(gpu.get()), bc.want, bc.needle)) << bc.value;
    EXPECT_EQ(s.kp->Download<uint16_t>(), s.c.k_pages);
    EXPECT_EQ(s.vp->Download<uint16_t>(), s.c.v_pages);
    KVT_EXPECT_OK(kvarn_context_synchronize(gpu.get()));  // reported once
    // The same append without the bad row succeeds and writes.
    for (int d = 0; d < D; ++d) row[d] = 1.f;
    dv.Upload(v);
    KVT_EXPECT_OK(kvarn_paged_append(gpu.get(), &cfg, &kv, indptr.data(), KVARN_DTYPE_F32, dk.get(),
                                     dv.get()));
    KVT_EXPECT_OK(kvarn_context_synchronize(gpu.get()));
    EXPECT_NE(s.kp->Download<uint16_t>(), s.c.k_pages);
  }
}

TEST(CudaErrors, AppendBadDeviceTablesFailAtSynchronizeAndWriteNothing) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(64, 64, 4, 2);
  const int Hk = 1, D = 64;
  struct Case {
    std::vector<int32_t> table, lens, rtiles;
    const char* needle;
  };
  const Case cases[] = {
      {{0, 4}, {60, 0}, {0, 0}, "block_table"},   // page 4 of a pool of 4 (touched tile 1)
      {{0, -1}, {60, 0}, {0, 0}, "block_table"},  // negative page id
      {{0, 1}, {-5, 0}, {0, 0}, "seq_lens"},      // negative length
      {{0, 1}, {100, 0}, {0, 0}, "tile 2"},       // positions 128.. beyond 2 blocks per seq
      {{0, 1}, {60, 0}, {-1, 0}, "record_tiles"},
  };
  for (const Case& bc : cases) {
    DeviceSmallCache s(gpu.get(), cfg, Hk, 1, 2, 4, 1);
    s.c.block_table = bc.table;
    s.c.seq_lens = {bc.lens[0]};
    s.c.record_tiles = {bc.rtiles[0]};
    const std::vector<int32_t> indptr = {0, 30};
    DeviceBuffer dk(gpu.get(), kvt::MakeTokens(rng, 30, D, kvt::KVShape{}));
    DeviceBuffer dv(gpu.get(), kvt::MakeTokens(rng, 30, D, kvt::KVShape{}));
    kvarn_paged_kv_t kv = s.View();
    KVT_EXPECT_OK(kvarn_paged_append(gpu.get(), &cfg, &kv, indptr.data(), KVARN_DTYPE_F32, dk.get(),
                                     dv.get()));
    EXPECT_TRUE(
        IsError(kvarn_context_synchronize(gpu.get()), KVARN_ERR_INVALID_ARGUMENT, bc.needle))
        << bc.needle;
    EXPECT_EQ(s.kp->Download<uint16_t>(), s.c.k_pages) << bc.needle;
    EXPECT_EQ(s.vp->Download<uint16_t>(), s.c.v_pages) << bc.needle;
  }
}

TEST(CudaErrors, AppendHostChecksFailAtOnce) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(64, 64, 4, 2);
  DeviceSmallCache s(gpu.get(), cfg, 1, 2, 2, 4, 1);
  s.c.block_table = {0, 1, 2, 3};
  DeviceBuffer dk(gpu.get(), kvt::MakeTokens(rng, 8, 64, kvt::KVShape{}));
  DeviceBuffer dv(gpu.get(), kvt::MakeTokens(rng, 8, 64, kvt::KVShape{}));
  kvarn_paged_kv_t kv = s.View();
  const std::vector<int32_t> decreasing = {0, 5, 3}, nonzero = {1, 4, 8};
  EXPECT_TRUE(IsError(kvarn_paged_append(gpu.get(), &cfg, &kv, decreasing.data(), KVARN_DTYPE_F32,
                                         dk.get(), dv.get()),
                      KVARN_ERR_INVALID_ARGUMENT, "decrease"));
  EXPECT_TRUE(IsError(
      kvarn_paged_append(gpu.get(), &cfg, &kv, nonzero.data(), KVARN_DTYPE_F32, dk.get(), dv.get()),
      KVARN_ERR_INVALID_ARGUMENT, "token_indptr[0]"));
  KVT_EXPECT_OK(kvarn_context_synchronize(gpu.get()));
  EXPECT_EQ(s.kp->Download<uint16_t>(), s.c.k_pages);
}

TEST(CudaErrors, PendingAppendErrorSurvivesASuccessfulQuantize) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(64, 64, 4, 2);
  DeviceSmallCache s(gpu.get(), cfg, 1, 1, 2, 4, 1);
  s.c.block_table = {0, 7};  // page 7 of 4
  s.c.seq_lens = {60};
  const std::vector<int32_t> indptr = {0, 10};
  DeviceBuffer dk(gpu.get(), kvt::MakeTokens(rng, 10, 64, kvt::KVShape{}));
  DeviceBuffer dv(gpu.get(), kvt::MakeTokens(rng, 10, 64, kvt::KVShape{}));
  kvarn_paged_kv_t kv = s.View();
  // The quantize's buffers are uploaded first: a memory copy synchronizes, and would report the
  // pending error itself (docs/API.md, GPU contexts).
  const Inputs in = MakeInputs(rng, 2, 64, 64, KVARN_DTYPE_F32);
  const size_t rb = kvt::RecordBytes(cfg);
  DeviceBuffer qk(gpu.get(), in.kb), qv(gpu.get(), in.vb);
  DeviceBuffer rec(gpu.get(), std::vector<uint8_t>(2 * rb, 0xA5));
  KVT_EXPECT_OK(
      kvarn_paged_append(gpu.get(), &cfg, &kv, indptr.data(), KVARN_DTYPE_F32, dk.get(), dv.get()));
  // A good quantize in between returns OK and leaves the pending error for the synchronize.
  KVT_EXPECT_OK(
      kvarn_quantize(gpu.get(), &cfg, 2, KVARN_DTYPE_F32, qk.get(), qv.get(), 0, rec.get(), rb));
  EXPECT_TRUE(
      IsError(kvarn_context_synchronize(gpu.get()), KVARN_ERR_INVALID_ARGUMENT, "block_table"));
  ExpectParity(Compare(cfg, 2, CpuQuantize(cfg, 2, KVARN_DTYPE_F32, in, 0, rb),
                       rec.Download<uint8_t>(), rb, in, false),
               "quantize after a failed append");
  EXPECT_EQ(s.kp->Download<uint16_t>(), s.c.k_pages);
}

TEST(CudaErrors, FlushBadPagesWriteNothing) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = MakeConfig(128, 128, 4, 2);
  const int Hk = 2, D = 128, G = 128;
  DeviceSmallCache s(gpu.get(), cfg, Hk, 1, 2, 3, 3);
  for (int p = 0; p < 3; ++p) {
    for (int h = 0; h < Hk; ++h) {
      for (int i = 0; i < G * D; ++i) {
        s.c.KPage(p, h)[i] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
        s.c.VPage(p, h)[i] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
      }
    }
  }
  // Page 2, head 1 of V holds an Inf.
  s.c.VPage(2, 1)[77 * D + 3] = 0x7c00;
  s.kp->Upload(s.c.k_pages);
  s.vp->Upload(s.c.v_pages);
  kvarn_paged_kv_t kv = s.View();
  const int32_t src[] = {0, 2}, dst[] = {1, 2};
  EXPECT_TRUE(IsError(kvarn_paged_flush(gpu.get(), &cfg, &kv, 2, src, dst), KVARN_ERR_NON_FINITE,
                      "page 2, head 1"));
  EXPECT_EQ(s.rec->Download<uint8_t>(), s.c.records);
  // Host-side id checks.
  const int32_t bad_src[] = {0, 3}, bad_dst[] = {1, -1};
  EXPECT_TRUE(IsError(kvarn_paged_flush(gpu.get(), &cfg, &kv, 2, bad_src, dst),
                      KVARN_ERR_INVALID_ARGUMENT, "src_pages[1]"));
  EXPECT_TRUE(IsError(kvarn_paged_flush(gpu.get(), &cfg, &kv, 2, src, bad_dst),
                      KVARN_ERR_INVALID_ARGUMENT, "dst_blocks[1]"));
  EXPECT_EQ(s.rec->Download<uint8_t>(), s.c.records);
  // The good page alone flushes.
  KVT_EXPECT_OK(kvarn_paged_flush(gpu.get(), &cfg, &kv, 1, src, dst));
  EXPECT_NE(s.rec->Download<uint8_t>(), s.c.records);
  KVT_EXPECT_OK(kvarn_context_synchronize(gpu.get()));
}

// Head dims 80 and 96 have CPU kernels only (docs/FORMAT.md section 3): every GPU entry point
// (codec, append, flush, attention, plan, run, managed cache) refuses them with
// KVARN_ERR_UNSUPPORTED and a message naming the head dim, and writes nothing.
TEST(CudaErrors, HeadDims80And96AreRefusedByEveryEntryPoint) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  for (int D : {80, 96}) {
    SCOPED_TRACE(::testing::Message() << "D" << D);
    const std::string needle = "head_dim " + std::to_string(D);
    const char* n = needle.c_str();
    const kvarn_config_t cfg = MakeConfig(D, 64, 4, 2);
    const size_t rb = kvt::RecordBytes(cfg);
    const Inputs in = MakeInputs(rng, 2, 64, D, KVARN_DTYPE_F32);
    DeviceBuffer dk(gpu.get(), in.kb), dv(gpu.get(), in.vb);
    const std::vector<uint8_t> rec0(2 * rb, 0xA5);
    DeviceBuffer rec(gpu.get(), rec0);
    EXPECT_TRUE(IsError(
        kvarn_rotate(gpu.get(), D, 128, KVARN_DTYPE_F32, dk.get(), KVARN_DTYPE_F32, dv.get()),
        KVARN_ERR_UNSUPPORTED, n));
    EXPECT_TRUE(IsError(
        kvarn_quantize(gpu.get(), &cfg, 2, KVARN_DTYPE_F32, dk.get(), dv.get(), 0, rec.get(), rb),
        KVARN_ERR_UNSUPPORTED, n));
    EXPECT_TRUE(IsError(
        kvarn_dequantize(gpu.get(), &cfg, 2, rec.get(), rb, 0, KVARN_DTYPE_F32, dk.get(), dv.get()),
        KVARN_ERR_UNSUPPORTED, n));
    EXPECT_EQ(rec.Download<uint8_t>(), rec0);
    EXPECT_EQ(dk.Download<uint8_t>(), in.kb);
    EXPECT_EQ(dv.Download<uint8_t>(), in.vb);

    DeviceSmallCache s(gpu.get(), cfg, 1, 1, 2, 4, 1);
    s.c.block_table = {0, 1};
    kvarn_paged_kv_t kv = s.View();
    const std::vector<int32_t> indptr = {0, 8}, src = {0}, dst = {0};
    EXPECT_TRUE(IsError(kvarn_paged_append(gpu.get(), &cfg, &kv, indptr.data(), KVARN_DTYPE_F32,
                                           dk.get(), dv.get()),
                        KVARN_ERR_UNSUPPORTED, n));
    EXPECT_TRUE(IsError(kvarn_paged_flush(gpu.get(), &cfg, &kv, 1, src.data(), dst.data()),
                        KVARN_ERR_UNSUPPORTED, n));
    kvarn_attention_params_t p;
    kvarn_attention_params_defaults(&p);
    p.num_q_heads = 1;
    size_t ws = 0;
    EXPECT_TRUE(IsError(kvarn_paged_attention_workspace_size(gpu.get(), &cfg, &kv, &p, 1, &ws),
                        KVARN_ERR_UNSUPPORTED, n));
    DeviceBuffer dq(gpu.get(), kvt::MakeTokens(rng, 1, D, kvt::KVShape{}));
    DeviceBuffer dout(gpu.get(), std::vector<float>(D, 7.f));
    EXPECT_TRUE(IsError(
        kvarn_paged_attention(gpu.get(), &cfg, &kv, &p, dq.get(), dout.get(), nullptr, nullptr, 0),
        KVARN_ERR_UNSUPPORTED, n));
    EXPECT_EQ(dout.Download<float>(), std::vector<float>(D, 7.f));
    kvarn_attention_shape_t shape;
    kvarn_attention_shape_defaults(&shape);
    shape.batch = 1;
    shape.num_kv_heads = 1;
    shape.max_blocks_per_seq = 2;
    kvarn_attention_plan_t* plan = nullptr;
    EXPECT_TRUE(IsError(kvarn_attention_plan_create(gpu.get(), &cfg, &shape, &p, &plan),
                        KVARN_ERR_UNSUPPORTED, n));
    EXPECT_EQ(plan, nullptr);
    kvarn_attention_plan_destroy(plan);

    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    DeviceBuffer d_indptr(gpu.get(), indptr);
    DeviceBuffer d_slots(gpu.get(), std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
    EXPECT_TRUE(IsError(kvarn_paged_append_run(gpu.get(), &cfg, &kv, &launch,
                                               static_cast<const int32_t*>(d_indptr.get()),
                                               static_cast<const int32_t*>(d_slots.get()), 8,
                                               KVARN_DTYPE_F32, dk.get(), dv.get()),
                        KVARN_ERR_UNSUPPORTED, n));
    size_t flush_ws = 0;
    KVT_ASSERT_OK(kvarn_paged_flush_workspace_size(&cfg, 1, 1, &flush_ws));
    DeviceBuffer d_ws(gpu.get(), flush_ws > 0 ? flush_ws : 16);
    launch.workspace = d_ws.get();
    launch.workspace_bytes = d_ws.bytes();
    DeviceBuffer d_count(gpu.get(), std::vector<int32_t>{1});
    DeviceBuffer d_src(gpu.get(), src), d_dst(gpu.get(), dst);
    EXPECT_TRUE(IsError(kvarn_paged_flush_run(gpu.get(), &cfg, &kv, &launch, 1,
                                              static_cast<const int32_t*>(d_count.get()),
                                              static_cast<const int32_t*>(d_src.get()),
                                              static_cast<const int32_t*>(d_dst.get()), nullptr),
                        KVARN_ERR_UNSUPPORTED, n));
    KVT_EXPECT_OK(kvarn_context_synchronize(gpu.get()));
    EXPECT_EQ(s.kp->Download<uint16_t>(), s.c.k_pages);
    EXPECT_EQ(s.rec->Download<uint8_t>(), s.c.records);

    // The managed cache: its first append reaches the backend and is refused.
    kvarn_cache_options_t o;
    kvarn_cache_options_defaults(&o);
    o.config = cfg;
    o.num_kv_heads = 1;
    kvarn_cache_t* cache = nullptr;
    const kvarn_status_t created = kvarn_cache_create(gpu.get(), &o, &cache);
    if (created == KVARN_OK) {
      KVT_EXPECT_OK(kvarn_cache_add_sequence(cache, 1));
      EXPECT_TRUE(
          IsError(kvarn_cache_append(cache, 1, 0, 8, KVARN_DTYPE_F32, dk.get(), dv.get(), 0),
                  KVARN_ERR_UNSUPPORTED, n));
      kvarn_cache_destroy(cache);
    } else {
      EXPECT_TRUE(IsError(created, KVARN_ERR_UNSUPPORTED, n));
    }
  }
}

}  // namespace
