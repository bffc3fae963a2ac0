// The attention variants of today's open models (kvarn_attention_params_t: learned sinks, sliding
// window, logit softcap, prefix mode) on the CPU backend, at every ISA level this host runs,
// against float64 attention over the same dequantized cache (support/attention_check.h):
// gpt-oss, Gemma 2 and Gemma 3 shapes, windows below, at and above a tile, ragged batches, decode
// and extend, forced split-K; prefix mode merged with an fp16 attention over the new tokens equals
// one causal extend; tiles outside every window are never read; bad arguments are refused with
// nothing written; the plan/run path and the managed cache give the same results.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/attention_check.h"
#include "support/kvarn_test.h"

namespace {

using kvt::AttnVariant;
using kvt::VariantCase;

constexpr double kTolRow = 1e-3;  // docs/FORMAT.md section 10, CPU, fp32 output
constexpr double kTolLse = 1e-4;

// A context whose calls run `isa`, or NULL when this host or build cannot (the ISA cap is
// process-wide: set for the creation, then restored).
kvt::ContextPtr IsaContext(kvarn_cpu_isa_t isa) {
  EXPECT_EQ(kvarn_set_max_cpu_isa(isa), KVARN_OK);
  kvt::ContextPtr ctx = kvt::MakeCpuContext(2);
  EXPECT_EQ(kvarn_set_max_cpu_isa(kvarn_cpu_isa_best()), KVARN_OK);
  kvarn_cpu_isa_t got = KVARN_CPU_ISA_NONE;
  EXPECT_EQ(kvarn_context_get_cpu_isa(ctx.get(), &got), KVARN_OK);
  if (got != isa) return nullptr;
  return ctx;
}

constexpr kvarn_cpu_isa_t kIsas[] = {KVARN_CPU_ISA_SCALAR, KVARN_CPU_ISA_AVX2, KVARN_CPU_ISA_AVX512,
                                     KVARN_CPU_ISA_NEON};

std::vector<VariantCase> Cases() {
  return {
      // gpt-oss: D64, GQA 8, learned sinks, a 128-token window on every other layer.
      {"gptoss_window_decode",
       "k4v2_g128",
       64,
       2,
       8,
       {1, 100, 128, 129, 1000, 2100},
       {},
       128,
       0,
       true,
       false,
       0},
      {"gptoss_window_extend",
       "k4v2_g128",
       64,
       2,
       8,
       {1, 100, 128, 129, 1000, 2100},
       {1, 5, 16, 1, 40, 129},
       128,
       0,
       true,
       false,
       0},
      {"gptoss_full_extend", "k4v2_g128", 64, 2, 8, {300, 2100}, {7, 33}, 0, 0, true, false, 0},
      // Gemma 3: D256, a 1024-token window, a query scale that is not 1/sqrt(D).
      {"gemma3_window_decode",
       "k4v2_g128",
       256,
       2,
       2,
       {1500, 3000, 700},
       {},
       1024,
       0,
       false,
       false,
       0.0772f},
      {"gemma3_window_extend",
       "k4v4_g128",
       256,
       2,
       2,
       {1500, 3000, 700},
       {9, 130, 2},
       1024,
       0,
       false,
       false,
       0.0772f},
      // Gemma 2: softcap 50 and a 4096 window; a tight softcap that bends most scores.
      {"gemma2_softcap_window",
       "k4v2_g128",
       256,
       2,
       2,
       {5000, 4097, 300},
       {3, 1, 17},
       4096,
       50.f,
       false,
       false,
       0},
      {"softcap_tight_sinks", "k8v8_g128", 128, 2, 4, {700, 260}, {12, 3}, 0, 2.f, true, false, 0},
      // Windows below, at and above a tile (G 128 and G 64), and one longer than any context.
      {"window_1", "k4v4_g128", 128, 2, 3, {129, 500, 64}, {4, 2, 64}, 1, 0, false, false, 0},
      {"window_127", "k4v4_g128", 128, 2, 3, {129, 500, 64}, {4, 2, 64}, 127, 0, false, false, 0},
      {"window_128", "k4v2_g64", 128, 2, 7, {129, 500, 64}, {4, 2, 64}, 128, 0, false, false, 0},
      {"window_129", "k2v2_g128", 128, 2, 3, {129, 500, 64}, {4, 2, 64}, 129, 0, true, false, 0},
      {"window_385", "k4v2_g128", 128, 1, 5, {1300, 385, 386}, {}, 385, 0, false, false, 0},
      {"window_past_context",
       "k4v2_g128",
       128,
       2,
       2,
       {1300, 40},
       {6, 40},
       100000,
       0,
       true,
       false,
       0},
      // Phi-3-mini-4k: head dim 96 (Paley x Sylvester rotation), MHA, window 2047; D80 likewise.
      {"phi3_d96_mha_window", "k4v2_g128", 96, 4, 1, {2100, 300}, {5, 2}, 2047, 0, false, false, 0},
      {"d80_sinks_window", "k4v4_g64", 80, 2, 4, {700, 90}, {}, 200, 0, true, false, 0},
      // Prefix mode: the queries follow the cache.
      {"prefix_decode", "k4v2_g128", 128, 2, 4, {1, 300, 1000}, {}, 0, 0, false, true, 0},
      {"prefix_extend_window_sinks",
       "k8v8_g64",
       128,
       2,
       4,
       {1, 300, 1000},
       {5, 200, 33},
       150,
       0,
       true,
       true,
       0},
      {"prefix_softcap", "k4v4_g128", 64, 2, 8, {257, 900}, {3, 64}, 0, 20.f, false, true, 0},
  };
}

class Variants : public ::testing::TestWithParam<VariantCase> {};

TEST_P(Variants, MatchFloat64AtEveryIsaAndSplit) {
  const VariantCase& c = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  kvt::VariantCaseData s;
  ASSERT_TRUE(kvt::MakeVariantCase(c, rng, 8, &s));
  int levels = 0;
  for (kvarn_cpu_isa_t isa : kIsas) {
    kvt::ContextPtr ctx = IsaContext(isa);
    if (!ctx) continue;
    ++levels;
    SCOPED_TRACE(std::string("ISA ") + kvarn_cpu_isa_name(isa));
    for (const int splits : {0, 3}) {  // automatic, and three forced: the merge keeps the variant
      SCOPED_TRACE("num_splits " + std::to_string(splits));
      kvt::AttnOutput r;
      ASSERT_TRUE(
          kvt::RunAttention(ctx.get(), s.pc, s.q, s.Hq, KVARN_DTYPE_F32, splits, c.scale, &r, s.v));
      const kvt::AttnErrors e =
          kvt::CompareWithReference(ctx.get(), s.pc, s.q, s.Hq, c.scale, r, s.v);
      EXPECT_LE(e.worst_row, kTolRow);
      EXPECT_LE(e.total, kTolRow);
      EXPECT_LE(e.worst_lse, kTolLse);
      if (splits == 0) {
        RecordProperty(std::string("worst_row_") + kvarn_cpu_isa_name(isa),
                       std::to_string(e.worst_row));
      }
    }
  }
  EXPECT_GE(levels, 2);  // scalar and at least one SIMD level on any host this library targets
}

// The variant must change the result (a test that passes with the variant ignored proves
// nothing): against the same mode without sinks, window and softcap.
TEST_P(Variants, DifferFromTheSameModeWithoutThem) {
  const VariantCase& c = GetParam();
  if (!c.sinks && c.softcap == 0 && (c.window == 0 || c.window >= 100000)) {
    GTEST_SKIP() << "nothing but the mode (prefix mode is checked by the merge test)";
  }
  KVT_SEEDED_RNG(rng, 1);
  kvt::VariantCaseData s;
  ASSERT_TRUE(kvt::MakeVariantCase(c, rng, 8, &s));
  auto ctx = kvt::MakeCpuContext(2);
  AttnVariant mode_only;
  mode_only.prefix = c.prefix;
  kvt::AttnOutput with, without;
  ASSERT_TRUE(
      kvt::RunAttention(ctx.get(), s.pc, s.q, s.Hq, KVARN_DTYPE_F32, 0, c.scale, &with, s.v));
  ASSERT_TRUE(kvt::RunAttention(ctx.get(), s.pc, s.q, s.Hq, KVARN_DTYPE_F32, 0, c.scale, &without,
                                mode_only));
  EXPECT_GT(kvt::OutputDistance(with, without, s.q.total * s.Hq * s.pc.D), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Cases, Variants, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<VariantCase>& info) {
                           return info.param.name;
                         });

// Prefix mode over the cached prefix, merged by lse with attention over the new tokens (done
// here in float64 as an engine's own fp16 kernel would), equals one causal extend over the cache
// holding prefix and new tokens; sinks are counted once (in the prefix call) and the window
// applies to both parts.
TEST(AttentionVariants, PrefixMergedWithNewTokenAttentionEqualsCausalExtend) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  for (const int window : {0, 200}) {
    SCOPED_TRACE("window " + std::to_string(window));
    const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 64);
    kvt::PagedCacheSpec spec;
    spec.num_kv_heads = 2;
    spec.lens = {700, 1500, 300};
    spec.flush_lag = 2;  // the prefix view's record tiles stay complete tiles of its lengths
    kvt::PagedCache pc;
    ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
    const std::vector<int> q_lens = {40, 129, 300};  // the new tokens (the last one: no prefix)
    const int Hk = pc.Hk, group = 8, Hq = Hk * group, D = pc.D;
    const kvt::Queries q = kvt::MakeQueries(rng, q_lens, pc.batch, Hq, D, KVARN_DTYPE_F32);
    AttnVariant causal;
    causal.sinks = kvt::SinkLogits(rng, Hq);
    causal.window = window;
    kvt::AttnOutput whole;
    ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &whole, causal));

    kvt::PagedCache prefix = pc;  // the same blocks, lengths without the new tokens
    for (int b = 0; b < pc.batch; ++b) prefix.seq_lens[b] = pc.seq_lens[b] - q_lens[b];
    AttnVariant pv = causal;
    pv.prefix = true;
    kvt::AttnOutput head;
    ASSERT_TRUE(kvt::RunAttention(ctx.get(), prefix, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &head, pv));

    const double scale = 1.0 / std::sqrt(static_cast<double>(D));
    const std::vector<double> out_whole =
        kvt::Decode(whole.out.data(), q.total * Hq * D, KVARN_DTYPE_F32);
    const std::vector<double> out_head =
        kvt::Decode(head.out.data(), q.total * Hq * D, KVARN_DTYPE_F32);
    double worst = 0, worst_lse = 0;
    for (int b = 0; b < pc.batch; ++b) {
      const int64_t N = prefix.seq_lens[b], n = q_lens[b];
      for (int h = 0; h < Hk; ++h) {
        std::vector<float> K, V;
        ASSERT_TRUE(pc.CacheFrame(ctx.get(), b, h, &K, &V));
        for (int64_t i = 0; i < n; ++i) {
          const int64_t p = N + i;
          const int64_t lo = window > 0 ? std::max<int64_t>(N, p - window + 1) : N;
          for (int g = 0; g < group; ++g) {
            const size_t row = static_cast<size_t>((q.indptr[b] + i) * Hq + h * group + g);
            std::vector<double> qr(q.values.begin() + row * D, q.values.begin() + (row + 1) * D);
            kvt::HadamardDouble(qr.data(), D);
            // The new tokens [lo, p], no sink: the engine's own kernel.
            const kvt::RefAttentionOut tail = kvt::RefAttentionKeys(
                qr.data(), K.data(), V.data(), lo, p + 1, D, scale, 0.0, -INFINITY, true);
            const double l1 = head.lse[row], l2 = tail.lse;
            const double m = std::max(l1, l2);
            const double w1 = std::exp(l1 - m), w2 = std::exp(l2 - m);
            double num = 0, den = 0;
            for (int d = 0; d < D; ++d) {
              const double merged = (out_head[row * D + d] * w1 + tail.o[d] * w2) / (w1 + w2);
              num += (merged - out_whole[row * D + d]) * (merged - out_whole[row * D + d]);
              den += out_whole[row * D + d] * out_whole[row * D + d];
            }
            worst = std::max(worst, std::sqrt(num / den));
            const double lse = m + std::log(w1 + w2);
            worst_lse = std::max(worst_lse, std::fabs(lse - whole.lse[row]) / (1 + std::fabs(lse)));
          }
        }
      }
    }
    // Both sides are fp32 over the same cache values: only the summation order differs.
    EXPECT_LE(worst, 2e-5);
    EXPECT_LE(worst_lse, 2e-6);
    RecordProperty("worst_row_window_" + std::to_string(window), std::to_string(worst));
  }
}

// A window layer's cost is its window: every record and page wholly before the first query's
// window is poisoned (NaN scales, NaN halves) and the results stay bit-identical.
TEST(AttentionVariants, TilesOutsideEveryWindowAreNeverRead) {
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.lens = {3000, 2000, 700};
  spec.flush_lag = 1;  // some out-of-window tiles are still fp16 pages
  auto build = kvt::MakeCpuContext(2);
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(build.get(), cfg, spec, rng, &pc));
  const int Hq = 8, window = 300;
  for (const std::vector<int>& q_lens : {std::vector<int>{}, std::vector<int>{20, 1, 300}}) {
    SCOPED_TRACE(q_lens.empty() ? "decode" : "extend");
    const kvt::Queries q = kvt::MakeQueries(rng, q_lens, pc.batch, Hq, pc.D, KVARN_DTYPE_F32);
    AttnVariant v;
    v.window = window;
    v.sinks = kvt::SinkLogits(rng, Hq);
    kvt::PagedCache poisoned = pc;
    int poisoned_tiles = 0;
    for (int b = 0; b < pc.batch; ++b) {
      const int64_t nq = q_lens.empty() ? 1 : q_lens[b];
      const int64_t first_key = v.Keys(pc.seq_lens[b], nq, 0).first;
      for (int tile = 0; (tile + 1) * int64_t{pc.G} <= first_key; ++tile) {
        const int32_t id = pc.Block(b, tile);
        if (pc.IsRecordTile(b, tile)) {
          auto at = poisoned.records.begin() + static_cast<size_t>(id) * pc.Hk * pc.stride;
          std::fill(at, at + static_cast<size_t>(pc.Hk) * pc.stride, uint8_t{0xFF});
        } else {
          for (int h = 0; h < pc.Hk; ++h) {
            std::fill(poisoned.KPage(id, h), poisoned.KPage(id, h) + pc.G * pc.D, kvt::kPoisonHalf);
            std::fill(poisoned.VPage(id, h), poisoned.VPage(id, h) + pc.G * pc.D, kvt::kPoisonHalf);
          }
        }
        ++poisoned_tiles;
      }
    }
    ASSERT_GE(poisoned_tiles, 20);

    for (kvarn_cpu_isa_t isa : kIsas) {
      kvt::ContextPtr ctx = IsaContext(isa);
      if (!ctx) continue;
      SCOPED_TRACE(std::string("ISA ") + kvarn_cpu_isa_name(isa));
      kvt::AttnOutput clean, dirty;
      ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &clean, v));
      ASSERT_TRUE(
          kvt::RunAttention(ctx.get(), poisoned, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &dirty, v));
      EXPECT_EQ(clean.out, dirty.out);
      EXPECT_EQ(0, std::memcmp(clean.lse.data(), dirty.lse.data(), clean.lse.size() * 4));
      // And the poison is real: without the window the call reads it.
      kvt::AttnOutput full;
      ASSERT_TRUE(kvt::RunAttention(ctx.get(), poisoned, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &full));
      const std::vector<double> full_out =
          kvt::Decode(full.out.data(), q.total * Hq * pc.D, KVARN_DTYPE_F32);
      size_t nans = 0;
      for (double x : full_out) nans += std::isnan(x);
      for (float x : full.lse) nans += std::isnan(x);
      EXPECT_GT(nans, 0u);
    }
  }
}

// Out-of-range variant fields are refused with a message, before anything is written.
TEST(AttentionVariants, BadArgumentsAreRefusedWithNothingWritten) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 64);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = 1;
  spec.lens = {300, 20};
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  const int Hq = 2;
  const kvt::Queries q = kvt::MakeQueries(rng, {}, pc.batch, Hq, pc.D, KVARN_DTYPE_F32);
  std::vector<float> nan_sinks = {0.5f, NAN};
  struct Bad {
    const char* what;
    void (*set)(kvarn_attention_params_t*, std::vector<float>*);
    const char* message;
  };
  const Bad bad[] = {
      {"window -1",
       [](kvarn_attention_params_t* p, std::vector<float>*) { p->sliding_window = -1; },
       "sliding_window"},
      {"softcap -1",
       [](kvarn_attention_params_t* p, std::vector<float>*) { p->logit_softcap = -1; },
       "logit_softcap"},
      {"softcap nan",
       [](kvarn_attention_params_t* p, std::vector<float>*) { p->logit_softcap = NAN; },
       "logit_softcap"},
      {"softcap inf",
       [](kvarn_attention_params_t* p, std::vector<float>*) { p->logit_softcap = INFINITY; },
       "logit_softcap"},
      {"mode 2",
       [](kvarn_attention_params_t* p, std::vector<float>*) {
         const int32_t two = 2;
         std::memcpy(&p->mode, &two, sizeof two);
       },
       "mode"},
      {"mode -1",
       [](kvarn_attention_params_t* p, std::vector<float>*) {
         const int32_t minus_one = -1;
         std::memcpy(&p->mode, &minus_one, sizeof minus_one);
       },
       "mode"},
      {"sink nan", [](kvarn_attention_params_t* p, std::vector<float>* s) { p->sinks = s->data(); },
       "sinks[1]"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    kvarn_attention_params_t p;
    kvarn_attention_params_defaults(&p);
    p.num_q_heads = Hq;
    b.set(&p, &nan_sinks);
    kvarn_paged_kv_t kv = pc.View();
    std::vector<float> out(q.total * Hq * pc.D, 7.f), lse(q.total * Hq, 7.f);
    EXPECT_TRUE(kvt::IsError(kvarn_paged_attention(ctx.get(), &pc.cfg, &kv, &p, q.bytes.data(),
                                                   out.data(), lse.data(), nullptr, 0),
                             KVARN_ERR_INVALID_ARGUMENT, b.message));
    for (float x : out) ASSERT_EQ(x, 7.f);
    for (float x : lse) ASSERT_EQ(x, 7.f);
  }
}

// A caller built against the header before the variant fields (a smaller params->size) gets
// plain causal attention, whatever lies past its struct.
TEST(AttentionVariants, OlderCallersGetPlainCausalAttention) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 64);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = 1;
  spec.lens = {700, 20};
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  const int Hq = 2;
  const kvt::Queries q = kvt::MakeQueries(rng, {}, pc.batch, Hq, pc.D, KVARN_DTYPE_F32);
  kvt::AttnOutput plain;
  ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &plain));
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = Hq;
  p.sliding_window = 5;  // past the old size: must not be read
  p.logit_softcap = 1.f;
  p.size = offsetof(kvarn_attention_params_t, sinks);
  kvarn_paged_kv_t kv = pc.View();
  std::vector<float> out(q.total * Hq * pc.D), lse(q.total * Hq);
  KVT_ASSERT_OK(kvarn_paged_attention(ctx.get(), &pc.cfg, &kv, &p, q.bytes.data(), out.data(),
                                      lse.data(), nullptr, 0));
  EXPECT_EQ(0, std::memcmp(out.data(), plain.out.data(), plain.out.size()));
}

// The capturable plan/run path and the managed cache carry the variants: the same bits as
// kvarn_paged_attention (plan/run) and float64 agreement (managed cache).
TEST(AttentionVariants, PlanRunAndManagedCacheCarryTheVariants) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.lens = {900, 260, 1};
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  const int Hq = 8;
  const std::vector<int> q_lens = {30, 2, 1};
  const kvt::Queries q = kvt::MakeQueries(rng, q_lens, pc.batch, Hq, pc.D, KVARN_DTYPE_F32);
  AttnVariant v;
  v.sinks = kvt::SinkLogits(rng, Hq);
  v.window = 200;
  v.softcap = 8.f;
  kvt::AttnOutput direct;
  ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &direct, v));

  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = Hq;
  v.Apply(&ap);
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = pc.batch;
  shape.num_kv_heads = pc.Hk;
  shape.max_blocks_per_seq = pc.max_blocks;
  shape.max_q_per_seq = 40;
  shape.max_total_q = static_cast<int64_t>(q.total);
  kvarn_attention_plan_t* raw = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &cfg, &shape, &ap, &raw));
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(kvarn_attention_plan_workspace_size(raw, &ws_bytes));
  std::vector<uint8_t> ws(ws_bytes);
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace = ws_bytes ? ws.data() : nullptr;
  launch.workspace_bytes = ws_bytes;
  kvarn_paged_kv_t kv = pc.View();
  std::vector<float> out(q.total * Hq * pc.D, 7.f), lse(q.total * Hq, 7.f);
  const kvarn_status_t st = kvarn_paged_attention_run(ctx.get(), raw, &kv, &launch, q.indptr.data(),
                                                      q.bytes.data(), out.data(), lse.data());
  kvarn_attention_plan_destroy(raw);
  KVT_ASSERT_OK(st);
  EXPECT_EQ(0, std::memcmp(out.data(), direct.out.data(), direct.out.size()));
  EXPECT_EQ(0, std::memcmp(lse.data(), direct.lse.data(), direct.lse.size() * 4));

  // The managed cache: one sequence of 700 tokens, a decode query with the variants.
  kvarn_cache_options_t co;
  kvarn_cache_options_defaults(&co);
  co.config = cfg;
  co.num_layers = 1;
  co.num_kv_heads = 2;
  co.max_tokens = 2048;
  co.max_sequences = 2;
  kvarn_cache_t* cache = nullptr;
  KVT_ASSERT_OK(kvarn_cache_create(ctx.get(), &co, &cache));
  const int64_t id = 1;
  const int n = 700;
  // [n][Hk][D]: two heads' tokens interleaved.
  std::vector<float> k = kvt::MakeTokens(rng, n * 2, pc.D, kvt::KVShape{}),
                     vv = kvt::MakeTokens(rng, n * 2, pc.D, kvt::KVShape{});
  kvarn_status_t cst = kvarn_cache_add_sequence(cache, id);
  if (cst == KVARN_OK) {
    cst = kvarn_cache_append(cache, id, 0, n, KVARN_DTYPE_F32, k.data(), vv.data(),
                             KVARN_APPEND_DEFAULT);
  }
  std::vector<float> qd(static_cast<size_t>(Hq) * pc.D), o_var(qd.size()), o_plain(qd.size());
  for (float& x : qd) x = static_cast<float>(rng.Normal());
  float l_var[8], l_plain[8];
  if (cst == KVARN_OK) {
    cst = kvarn_cache_attention(cache, 0, 1, &id, &ap, qd.data(), o_var.data(), l_var);
  }
  kvarn_attention_params_t plain;
  kvarn_attention_params_defaults(&plain);
  plain.num_q_heads = Hq;
  if (cst == KVARN_OK) {
    cst = kvarn_cache_attention(cache, 0, 1, &id, &plain, qd.data(), o_plain.data(), l_plain);
  }
  kvarn_cache_destroy(cache);
  KVT_ASSERT_OK(cst);
  EXPECT_GT(kvt::RelL2(o_var, o_plain), 1e-3);  // the variants reached the kernel
  for (int h = 0; h < Hq; ++h) EXPECT_TRUE(std::isfinite(l_var[h]));
}

// gpt-oss's window layers at 128k: learned sinks and a 128-token window over a 128k context
// (only the last tiles are read: 3 s on 2 cores, so in the default run), decode and extend,
// against float64.
TEST(AttentionVariants, Window128WithSinksAt128kMatchesFloat64Reference) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 64);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.lens = {131072, 131072 - 77, 5000};
  spec.max_chunk = 16384;
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  const int Hq = 16;
  kvt::AttnVariant v;
  v.window = 128;
  for (int h = 0; h < Hq; ++h) v.sinks.push_back(static_cast<float>(rng.Normal() + 1.0));
  for (const std::vector<int>& q_lens : {std::vector<int>{}, std::vector<int>{16, 300, 5}}) {
    SCOPED_TRACE(q_lens.empty() ? "decode" : "extend");
    const kvt::Queries q = kvt::MakeQueries(rng, q_lens, pc.batch, Hq, pc.D, KVARN_DTYPE_F32);
    kvt::AttnOutput r;
    ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &r, v));
    const kvt::AttnErrors e = kvt::CompareWithReference(ctx.get(), pc, q, Hq, 0.f, r, v);
    EXPECT_LE(e.worst_row, 1e-3);
    EXPECT_LE(e.worst_lse, 1e-4);
  }
}

}  // namespace
