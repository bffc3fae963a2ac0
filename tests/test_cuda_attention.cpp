// CUDA paged attention against the float64 reference over the same dequantized cache and against
// the CPU reference backend. The cache is built on the CPU through the public layer-2 calls (the
// CPU is the oracle), copied to the device, and read there through device block tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ostream>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/attention_check.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/rng.h"

namespace {

using kvt::DeviceBuffer;

using DeviceCache = kvt::DevicePagedCache;

::testing::AssertionResult RunCuda(kvarn_context_t* ctx, DeviceCache& dc, const kvt::PagedCache& pc,
                                   const kvt::Queries& q, int Hq, kvarn_dtype_t out_dtype,
                                   int num_splits, float scale, kvt::AttnOutput* r,
                                   const kvt::AttnVariant& variant = {}) {
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  variant.Apply(&p);
  // Sink logits live in the context's memory.
  DeviceBuffer dsinks(ctx, std::max<size_t>(variant.sinks.size(), 1) * sizeof(float));
  if (!variant.sinks.empty()) {
    dsinks.Upload(variant.sinks);
    p.sinks = static_cast<const float*>(dsinks.get());
  }
  p.num_q_heads = Hq;
  p.scale = scale;
  p.q_indptr = q.indptr.empty() ? nullptr : q.indptr.data();
  p.q_dtype = q.dtype;
  p.out_dtype = out_dtype;
  p.num_splits = num_splits;
  size_t ws = 0;
  if (kvarn_paged_attention_workspace_size(ctx, &pc.cfg, &dc.kv, &p, q.total, &ws) != KVARN_OK) {
    return ::testing::AssertionFailure() << "workspace_size: " << kvarn_last_error();
  }
  const size_t out_bytes = q.total * Hq * pc.D * kvt::DtypeBytes(out_dtype);
  DeviceBuffer dq(ctx, q.bytes), dout(ctx, out_bytes), dlse(ctx, q.total * Hq * sizeof(float));
  DeviceBuffer dws(ctx, std::max<size_t>(ws, 1));
  // Poison the outputs: every element must be written.
  dout.Upload(std::vector<uint8_t>(out_bytes, 0xEE));
  dlse.Upload(std::vector<float>(q.total * Hq, -12345.f));
  kvarn_status_t st =
      kvarn_paged_attention(ctx, &pc.cfg, &dc.kv, &p, dq.get(), dout.get(),
                            static_cast<float*>(dlse.get()), ws ? dws.get() : nullptr, ws);
  if (st != KVARN_OK) {
    return ::testing::AssertionFailure() << "kvarn_paged_attention: " << kvarn_last_error();
  }
  if (kvarn_context_synchronize(ctx) != KVARN_OK) {
    return ::testing::AssertionFailure() << "synchronize: " << kvarn_last_error();
  }
  r->dtype = out_dtype;
  r->out = dout.Download<uint8_t>();
  r->lse = dlse.Download<float>();
  return ::testing::AssertionSuccess();
}

struct Case {
  std::string name;
  std::string preset = "k4v2_g128";
  int D = 128;
  int Hk = 2;
  int group = 4;
  int sink = 1;
  std::vector<int> lens;
  std::vector<int> q_lens;  // empty = decode
  kvarn_dtype_t q_dtype = KVARN_DTYPE_F32;
  kvarn_dtype_t out_dtype = KVARN_DTYPE_F32;
  int splits = 0;
  int flush_lag = 0;
  // record_stride = record bytes + this; a multiple of 16 lets the tensor-core kernels run,
  // others take the general kernel.
  int stride_padding = 16;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::vector<Case> Cases() {
  std::vector<Case> cs;
  const char* presets[] = {"k4v2_g128", "k4v2_g64",  "k4v4_g128",
                           "k4v4_g64",  "k2v2_g128", "k8v8_g128"};
  for (const char* p : presets) {
    Case c;
    c.name = std::string(p) + "_decode";
    c.preset = p;
    c.lens = {1, 129, 300, 700};
    cs.push_back(c);
    c.name = std::string(p) + "_extend";
    c.q_lens = {1, 2, 64, 130};
    cs.push_back(c);
  }
  for (int D : {64, 256, 512}) {
    Case c;
    c.name = "D" + std::to_string(D);
    c.D = D;
    c.lens = {200, 513, 1029};
    c.q_lens = {1, 5, 3};
    cs.push_back(c);
  }
  for (int group : {1, 7, 8}) {
    Case c;
    c.name = "gqa" + std::to_string(group);
    c.group = group;
    c.Hk = group == 7 ? 1 : 3;
    c.lens = {1, 127, 129, 1000, 2049};
    c.q_lens = {1, 9, 5, 40, 17};
    cs.push_back(c);
    c.name = "gqa" + std::to_string(group) + "_decode";
    c.q_lens = {};
    cs.push_back(c);
  }
  {
    Case c;
    c.name = "mqa32";  // more query heads per KV head than rows per work item
    c.group = 32;
    c.Hk = 1;
    c.lens = {300, 77};
    c.q_lens = {2, 1};
    cs.push_back(c);
  }
  {
    Case c;
    c.name = "sink0_lag2_fp16io";
    c.sink = 0;
    c.flush_lag = 2;
    c.q_dtype = KVARN_DTYPE_F16;
    c.out_dtype = KVARN_DTYPE_F16;
    c.lens = {700, 1100};
    c.q_lens = {5, 2};
    cs.push_back(c);
  }
  {
    Case c;
    c.name = "sink3_bf16io";
    c.sink = 3;
    c.q_dtype = KVARN_DTYPE_BF16;
    c.out_dtype = KVARN_DTYPE_BF16;
    c.lens = {1500, 33, 900};
    c.q_lens = {2, 1, 4};
    cs.push_back(c);
  }
  {
    Case c;
    c.name = "long32k_splits";
    c.Hk = 2;
    c.lens = {32768 + 77, 4000};
    cs.push_back(c);
    c.name = "long32k_explicit7";
    c.splits = 7;
    cs.push_back(c);
  }
  {
    Case c;
    c.name = "k4v2_unaligned_stride";  // the general kernel on the design point
    c.stride_padding = 8;
    c.lens = {1, 129, 300, 700};
    c.q_lens = {1, 3, 64, 130};
    cs.push_back(c);
  }
  {
    // One split per sequence: the tensor-core kernel's record ring wraps its stages many times
    // (G 128: two warps per record; G 64: one), decode and extend.
    Case c;
    c.name = "k4v2_g128_ring_one_split";
    c.lens = {20000 + 33, 5000};
    c.q_lens = {3, 1};
    c.splits = 1;
    cs.push_back(c);
    c.name = "k4v2_g64_ring_one_split";
    c.preset = "k4v2_g64";
    c.lens = {9000 + 5, 777};
    c.q_lens = {};
    cs.push_back(c);
  }
  {
    // The tensor-core extend kernel (128 query rows per CTA; from 32 rows per sequence): long
    // ragged chunks over several CTAs, both tile sizes, explicit and single splits, GQA 7, fp16
    // and bf16 io, no sink and unflushed tiles. (KVARN_CUDA_EXTEND=off runs the same cases on
    // the decode kernels.)
    Case c;
    c.name = "long_extend_g128";
    c.Hk = 1;
    c.lens = {8192 + 50, 3000, 700};
    c.q_lens = {512, 77, 33};
    cs.push_back(c);
    c.name = "long_extend_g64";
    c.preset = "k4v2_g64";
    cs.push_back(c);
    c = Case{};
    c.name = "extend_splits7";
    c.lens = {20000 + 33, 5000};
    c.q_lens = {40, 130};
    c.splits = 7;
    cs.push_back(c);
    c = Case{};
    c.name = "extend_one_split_gqa7";
    c.group = 7;
    c.Hk = 1;
    c.lens = {6000 + 3, 1500};
    c.q_lens = {100, 19};
    c.splits = 1;
    cs.push_back(c);
    c = Case{};
    c.name = "extend_fp16io_sink0_lag2";
    c.sink = 0;
    c.flush_lag = 2;
    c.q_dtype = KVARN_DTYPE_F16;
    c.out_dtype = KVARN_DTYPE_F16;
    c.lens = {700, 1100};
    c.q_lens = {64, 40};
    cs.push_back(c);
    c = Case{};
    c.name = "extend_bf16io_sink3_g64";
    c.preset = "k4v2_g64";
    c.sink = 3;
    c.q_dtype = KVARN_DTYPE_BF16;
    c.out_dtype = KVARN_DTYPE_BF16;
    c.lens = {1500, 900};
    c.q_lens = {48, 100};
    cs.push_back(c);
  }
  {
    // The tensor-core decode family, every (D, G, key bits, value bits) it has (D512 G128 with
    // 8-bit keys falls to the general kernel: its record ring does not fit), with the GQA ratios
    // engines use; every other case extends (off D128 k4v2 extend rows run on the decode kernels).
    // Lengths: a partial tail, exact tiles, a sink-only sequence, records wrapping the ring.
    const int ratios[] = {1, 2, 3, 4, 5, 7, 8, 12, 16, 20, 32, 64};
    int n = 0;
    for (int D : {64, 128, 256, 512}) {
      for (int G : {64, 128}) {
        for (int kb : {2, 4, 8}) {
          for (int vb : {2, 4, 8}) {
            const int group = ratios[n % 12];
            Case c;
            c.preset =
                "k" + std::to_string(kb) + "v" + std::to_string(vb) + "_g" + std::to_string(G);
            c.D = D;
            c.group = group;
            c.Hk = group >= 16 ? 1 : 2;
            c.name =
                "family_d" + std::to_string(D) + "_" + c.preset + "_gqa" + std::to_string(group);
            c.lens = {G - 5, 13 * G + 7, 3 * G, 30 * G + 1};
            if (n % 2 == 1) {
              c.name += "_extend";
              c.q_lens = {1, 3, 2, 7};
            }
            if (n % 5 == 0) c.splits = 1;  // one split: the ring wraps its stages many times
            cs.push_back(c);
            ++n;
          }
        }
      }
    }
    // Long contexts on the family off the design point (split choice, many ring wraps).
    Case c;
    c.name = "family_long32k_d256_k4v4";
    c.preset = "k4v4_g128";
    c.D = 256;
    c.Hk = 1;
    c.group = 2;
    c.lens = {32768 + 77, 4000};
    cs.push_back(c);
    c.name = "family_long32k_d64_k8v8_gqa8";
    c.preset = "k8v8_g128";
    c.D = 64;
    c.group = 8;
    cs.push_back(c);
    c.name = "family_long32k_d512_k2v2";
    c.preset = "k2v2_g128";
    c.D = 512;
    c.group = 1;
    cs.push_back(c);
  }
  {
    // The benchmark's design-point shape at 128k (8 KV heads, auto splits): many stages per
    // split with 4 record groups over 7 stages, where a consumer can reach a stage two phases
    // ahead of its record's copy (device run 1 of session 8 faulted here).
    Case c;
    c.name = "long128k_hk8_decode";
    c.Hk = 8;
    c.lens = {131072};
    cs.push_back(c);
  }
  {
    Case c;
    c.name = "long128k_decode";
    c.Hk = 1;
    c.lens = {131072};
    cs.push_back(c);
  }
  return cs;
}

class CudaAttention : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttention, MatchesFloat64AndTheCpuReference) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  const Case& c = GetParam();
  auto cpu = kvt::MakeCpuContext();
  kvt::Rng rng(0xC0DA + std::hash<std::string>{}(c.name));
  kvarn_config_t cfg = kvt::PresetConfig(c.preset, c.D);
  cfg.sink_tiles = c.sink;
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = c.Hk;
  spec.lens = c.lens;
  spec.flush_lag = c.flush_lag;
  spec.stride_padding = c.stride_padding;
  spec.max_chunk = std::max(300, *std::max_element(c.lens.begin(), c.lens.end()) / 8);
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg, spec, rng, &pc));
  const int Hq = c.Hk * c.group;
  const kvt::Queries q =
      kvt::MakeQueries(rng, c.q_lens, static_cast<int>(c.lens.size()), Hq, c.D, c.q_dtype);

  DeviceCache dc(gpu.get(), pc);
  kvt::AttnOutput got, again, ref_cpu;
  ASSERT_TRUE(RunCuda(gpu.get(), dc, pc, q, Hq, c.out_dtype, c.splits, 0.f, &got));
  const kvt::AttnErrors e = kvt::CompareWithReference(cpu.get(), pc, q, Hq, 0.f, got);
  const double tol = c.out_dtype == KVARN_DTYPE_F32 ? 2e-3 : 4e-3;  // + output rounding
  EXPECT_LE(e.total, tol) << c.name;
  EXPECT_LE(e.worst_row, 5 * tol) << c.name;
  // The tensor-core path multiplies fp16 operands (queries split hi + lo, probabilities in
  // fp16): its log-sum-exp agrees to a few 1e-4 (worst 5.4e-4 on the H200, device run 5), the
  // general kernel's to ~1e-6.
  EXPECT_LE(e.worst_lse, 1e-3) << c.name;
  std::printf("[ errors   ] %s: total %.2e, worst row %.2e, worst lse %.2e\n", c.name.c_str(),
              e.total, e.worst_row, e.worst_lse);

  // Same answer as the CPU backend, and the same bytes run to run.
  ASSERT_TRUE(kvt::RunAttention(cpu.get(), pc, q, Hq, c.out_dtype, c.splits, 0.f, &ref_cpu));
  EXPECT_LE(kvt::OutputDistance(got, ref_cpu, q.total * Hq * c.D), tol) << c.name;
  ASSERT_TRUE(RunCuda(gpu.get(), dc, pc, q, Hq, c.out_dtype, c.splits, 0.f, &again));
  EXPECT_EQ(got.out, again.out) << "not deterministic";
  EXPECT_EQ(got.lse, again.lse) << "lse not deterministic";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttention, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// The model variants on the kernel the plan chooses (the tensor-core decode family or extend
// kernel; the general kernel under KVARN_CUDA_ATTENTION=generic): gpt-oss, Gemma 2/3 and prefix
// shapes, windows around a tile, against float64 and the CPU backend.
using kvt::VariantCase;

class CudaAttentionVariants : public ::testing::TestWithParam<VariantCase> {};

TEST_P(CudaAttentionVariants, MatchFloat64AndTheCpuBackend) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  const VariantCase& c = GetParam();
  auto cpu = kvt::MakeCpuContext();
  kvt::Rng rng(0xA11 + std::hash<std::string>{}(c.name));
  kvt::VariantCaseData data;
  ASSERT_TRUE(kvt::MakeVariantCase(c, rng, 16, &data));  // aligned pools
  kvt::PagedCache& pc = data.pc;
  const int Hq = data.Hq;
  const kvt::AttnVariant& v = data.v;
  const kvt::Queries& q = data.q;
  DeviceCache dc(gpu.get(), pc);
  kvt::AttnOutput got, ref_cpu;
  ASSERT_TRUE(RunCuda(gpu.get(), dc, pc, q, Hq, KVARN_DTYPE_F32, c.splits, c.scale, &got, v));
  const kvt::AttnErrors e = kvt::CompareWithReference(cpu.get(), pc, q, Hq, c.scale, got, v);
  EXPECT_LE(e.total, 2e-3);
  EXPECT_LE(e.worst_row, 1e-2);
  EXPECT_LE(e.worst_lse, 1e-4);
  ASSERT_TRUE(
      kvt::RunAttention(cpu.get(), pc, q, Hq, KVARN_DTYPE_F32, c.splits, c.scale, &ref_cpu, v));
  EXPECT_LE(kvt::OutputDistance(got, ref_cpu, q.total * Hq * c.D), 2e-3);
  std::printf("[ errors   ] %s: total %.2e, worst row %.2e, worst lse %.2e\n", c.name.c_str(),
              e.total, e.worst_row, e.worst_lse);
}

std::vector<VariantCase> VariantCases() {
  return {
      {"gptoss_window_sinks_decode",
       "k4v2_g128",
       64,
       2,
       8,
       {1, 129, 1000, 9000},
       {},
       128,
       0,
       true,
       false,
       0.f,
       0},
      {"gptoss_window_sinks_extend_split1",
       "k4v2_g128",
       64,
       2,
       8,
       {129, 1000, 9000},
       {3, 40, 130},
       128,
       0,
       true,
       false,
       0.f,
       1},
      {"gptoss_full_sinks_split5",
       "k4v2_g128",
       64,
       2,
       8,
       {300, 9000},
       {},
       0,
       0,
       true,
       false,
       0.f,
       5},
      {"gemma2_softcap_window",
       "k4v2_g128",
       256,
       2,
       2,
       {5000, 300},
       {3, 17},
       4096,
       50.f,
       false,
       false,
       0.f,
       0},
      {"gemma3_window_k4v4",
       "k4v4_g128",
       256,
       2,
       2,
       {3000, 700},
       {},
       1024,
       0,
       false,
       false,
       0.f,
       0},
      {"window_1_g64",
       "k4v2_g64",
       128,
       2,
       3,
       {129, 500, 64},
       {4, 2, 64},
       1,
       0,
       false,
       false,
       0.f,
       0},
      {"window_129_k2v2",
       "k2v2_g128",
       128,
       2,
       7,
       {129, 500, 64},
       {4, 2, 64},
       129,
       0,
       true,
       false,
       0.f,
       0},
      {"prefix_window_sinks",
       "k8v8_g128",
       128,
       2,
       4,
       {1, 300, 1000},
       {5, 200, 33},
       150,
       0,
       true,
       true,
       0.f,
       0},
      // The tensor-core extend kernel (D128 k4v2, 32 or more rows per sequence).
      {"extend_d128_window_sinks_softcap",
       "k4v2_g128",
       128,
       2,
       4,
       {5000, 700, 64},
       {64, 200, 40},
       300,
       30.f,
       true,
       false,
       0.f,
       0},
      {"extend_d128_g64_prefix_window_split3",
       "k4v2_g64",
       128,
       2,
       2,
       {3000, 129},
       {100, 40},
       500,
       0,
       true,
       true,
       0.f,
       3},
      {"d512_window_sinks", "k2v2_g128", 512, 1, 4, {4000, 300}, {}, 1000, 0, true, false, 0.f, 0},
      {"prefix_decode_softcap",
       "k4v4_g128",
       64,
       2,
       8,
       {257, 900},
       {},
       0,
       20.f,
       false,
       true,
       0.f,
       3},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAttentionVariants, ::testing::ValuesIn(VariantCases()),
                         [](const ::testing::TestParamInfo<VariantCase>& i) {
                           return i.param.name;
                         });

TEST(CudaAttentionErrors, BadBlockTableEntryIsReportedAtSynchronize) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  auto cpu = kvt::MakeCpuContext();
  kvt::Rng rng(77);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  kvt::PagedCacheSpec spec;
  spec.lens = {600};
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg, spec, rng, &pc));
  pc.block_table[2] = pc.num_blocks + 5;  // a record tile pointing outside the pool
  DeviceCache dc(gpu.get(), pc);
  const kvt::Queries q = kvt::MakeQueries(rng, {}, 1, 8, 128, KVARN_DTYPE_F32);
  kvt::AttnOutput r;
  const ::testing::AssertionResult run =
      RunCuda(gpu.get(), dc, pc, q, 8, KVARN_DTYPE_F32, 0, 0.f, &r);
  ASSERT_FALSE(run);
  EXPECT_NE(std::string(run.message()).find("block_table"), std::string::npos) << run.message();
  // The sticky error is cleared once reported.
  EXPECT_EQ(kvarn_context_synchronize(gpu.get()), KVARN_OK) << kvarn_last_error();
}

// A bad record entry deep inside one long split: the ring skips that tile (its stage is
// released without a copy) and goes on; the launch neither hangs nor reads out of bounds.
TEST(CudaAttentionErrors, BadEntryInsideALongSplitIsSkippedAndReported) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  auto cpu = kvt::MakeCpuContext();
  kvt::Rng rng(79);
  for (const char* preset : {"k4v2_g128", "k4v2_g64"}) {
    const kvarn_config_t cfg = kvt::PresetConfig(preset, 128);
    kvt::PagedCacheSpec spec;
    spec.lens = {12000};
    spec.max_chunk = 1500;
    spec.stride_padding = 16;  // 16-byte records: the tensor-core kernel
    kvt::PagedCache pc;
    ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg, spec, rng, &pc));
    pc.block_table[41] = -3;
    pc.block_table[42] = pc.num_blocks;
    DeviceCache dc(gpu.get(), pc);
    const kvt::Queries q = kvt::MakeQueries(rng, {}, 1, 8, 128, KVARN_DTYPE_F32);
    kvt::AttnOutput r;
    const ::testing::AssertionResult run =
        RunCuda(gpu.get(), dc, pc, q, 8, KVARN_DTYPE_F32, 1, 0.f, &r);
    ASSERT_FALSE(run) << preset;
    EXPECT_NE(std::string(run.message()).find("block_table"), std::string::npos) << run.message();
    EXPECT_EQ(kvarn_context_synchronize(gpu.get()), KVARN_OK) << kvarn_last_error();
  }
}

TEST(CudaAttentionErrors, SmallWorkspaceIsRejected) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  auto cpu = kvt::MakeCpuContext();
  kvt::Rng rng(78);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  kvt::PagedCacheSpec spec;
  spec.lens = {9000};
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg, spec, rng, &pc));
  DeviceCache dc(gpu.get(), pc);
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = 8;
  size_t ws = 0;
  ASSERT_EQ(kvarn_paged_attention_workspace_size(gpu.get(), &pc.cfg, &dc.kv, &p, 1, &ws), KVARN_OK);
  ASSERT_GT(ws, 0u) << "a long single sequence must be split";
  DeviceBuffer dq(gpu.get(), 8 * 128 * 4), dout(gpu.get(), 8 * 128 * 4), dws(gpu.get(), ws);
  EXPECT_TRUE(kvt::IsError(kvarn_paged_attention(gpu.get(), &pc.cfg, &dc.kv, &p, dq.get(),
                                                 dout.get(), nullptr, dws.get(), ws - 1),
                           KVARN_ERR_BUFFER_TOO_SMALL, "workspace"));
}

// Every variant runs on the tensor-core kernels the plan would choose without it (no silent
// fallback to the general kernel): decode on the decode family, extend (D128 k4v2, 32 or more
// rows) on the extend kernel. KVARN_CUDA_ATTENTION=generic forces the general kernel.
TEST(CudaAttentionVariantPlans, VariantsKeepTheTensorCoreKernels) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  const char* forced = std::getenv("KVARN_CUDA_ATTENTION");
  if (forced != nullptr && std::string(forced) == "generic")
    GTEST_SKIP() << "general kernel forced";
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  DeviceBuffer dsinks(gpu.get(), 32 * 4);
  for (int variant = 0; variant < 5; ++variant) {
    for (int max_q : {0, 64}) {  // decode, extend
      SCOPED_TRACE("variant " + std::to_string(variant) + ", max_q " + std::to_string(max_q));
      kvarn_attention_params_t p;
      kvarn_attention_params_defaults(&p);
      p.num_q_heads = 32;
      if (variant == 1) p.sinks = static_cast<const float*>(dsinks.get());
      if (variant == 2) p.sliding_window = 128;
      if (variant == 3) p.logit_softcap = 30.f;
      if (variant == 4) p.mode = KVARN_ATTENTION_PREFIX;
      kvarn_attention_shape_t shape;
      kvarn_attention_shape_defaults(&shape);
      shape.batch = 4;
      shape.num_kv_heads = 8;
      shape.max_blocks_per_seq = 256;
      shape.max_q_per_seq = max_q;
      shape.max_total_q = max_q == 0 ? 0 : 4 * max_q;
      kvarn_attention_plan_t* plan = nullptr;
      ASSERT_EQ(kvarn_attention_plan_create(gpu.get(), &cfg, &shape, &p, &plan), KVARN_OK)
          << kvarn_last_error();
      const char* kernel = nullptr;
      ASSERT_EQ(kvarn_attention_plan_kernel(plan, &kernel), KVARN_OK);
      EXPECT_STREQ(kernel, max_q == 0 ? "cuda-tensor-core-decode" : "cuda-tensor-core-extend");
      kvarn_attention_plan_destroy(plan);
    }
  }
}

}  // namespace
