// Layer 2 through the public API: paged caches built with kvarn_paged_append + kvarn_paged_flush
// (shuffled page and record ids, sink tiles 0/1/2), then decode and extend attention checked
// against float64 attention over the same dequantized cache (docs/FORMAT.md sections 8-9,
// section 10: relative L2 <= 1e-3 on CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/attention_check.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace {

using kvt::AttnOutput;
using kvt::IsError;
using kvt::PagedCache;
using kvt::PagedCacheSpec;
using kvt::Queries;

constexpr double kTolF32 = 1e-3;  // docs/FORMAT.md section 10, CPU
// lse: |lse - ref| <= 1e-4 * (1 + |ref|). An lse error of x is a relative error of about x in
// every output weight, so 1e-4 keeps well inside the 1e-3 output target; the scale term allows
// for fp32 rounding of large scores.
constexpr double kTolLse = 1e-4;

const char* DtypeName(kvarn_dtype_t t) {
  return t == KVARN_DTYPE_F32 ? "f32" : t == KVARN_DTYPE_F16 ? "f16" : "bf16";
}

// Output tolerance: the fp32 target plus one rounding to the output dtype.
double OutTol(kvarn_dtype_t t) {
  return kTolF32 + (t == KVARN_DTYPE_F16 ? 0x1p-11 : t == KVARN_DTYPE_BF16 ? 0x1p-8 : 0.0);
}

struct AttnCase {
  std::string name;
  std::string preset = "k4v2_g128";
  int D = 128;
  int Hk = 2, gqa = 4;
  int sink = 1;
  std::vector<int> lens;
  std::vector<int> q_lens;  // empty = decode
  kvarn_dtype_t kv_dtype = KVARN_DTYPE_F32, q_dtype = KVARN_DTYPE_F32, out_dtype = KVARN_DTYPE_F32;
  int splits = 0;
  uint32_t kflags = 0, vflags = 0;
  float scale = 0.f;
  bool flush = true;
  int flush_lag = 0;
  int max_chunk = 300;
};

std::ostream& operator<<(std::ostream& os, const AttnCase& c) { return os << c.name; }

struct Built {
  kvt::ContextPtr ctx;
  PagedCache pc;
  Queries q;
  int Hq = 0;
};

::testing::AssertionResult Build(const AttnCase& c, kvt::Rng& rng, Built* out,
                                 int num_threads = 0) {
  out->ctx = kvt::MakeCpuContext(num_threads);
  kvarn_config_t cfg = kvt::PresetConfig(c.preset, c.D);
  cfg.sink_tiles = c.sink;
  cfg.key_flags = c.kflags;
  cfg.value_flags = c.vflags;
  PagedCacheSpec spec;
  spec.num_kv_heads = c.Hk;
  spec.lens = c.lens;
  spec.dtype = c.kv_dtype;
  spec.flush = c.flush;
  spec.flush_lag = c.flush_lag;
  spec.max_chunk = c.max_chunk;
  auto st = kvt::BuildPagedCache(out->ctx.get(), cfg, spec, rng, &out->pc);
  if (!st) return st;
  out->Hq = c.Hk * c.gqa;
  out->q =
      kvt::MakeQueries(rng, c.q_lens, static_cast<int>(c.lens.size()), out->Hq, c.D, c.q_dtype);
  return ::testing::AssertionSuccess();
}

class Attention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(Attention, MatchesFloat64ReferenceOverTheDequantizedCache) {
  const AttnCase& c = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  // Records were really used where they should be.
  int records = 0;
  for (int i = 0; i < b.pc.batch; ++i) {
    records += b.pc.record_tiles[i];
    if (c.flush && c.flush_lag == 0) {
      EXPECT_EQ(b.pc.record_tiles[i], std::max(0, c.lens[i] / b.pc.G - c.sink)) << "sequence " << i;
    }
  }
  RecordProperty("record_tiles", records);
  AttnOutput r;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, c.out_dtype, c.splits, c.scale, &r));
  const kvt::AttnErrors e = kvt::CompareWithReference(b.ctx.get(), b.pc, b.q, b.Hq, c.scale, r);
  RecordProperty("worst_row_rel_l2", std::to_string(e.worst_row));
  RecordProperty("total_rel_l2", std::to_string(e.total));
  RecordProperty("worst_lse_rel", std::to_string(e.worst_lse));
  RecordProperty("max_abs_lse", std::to_string(e.max_abs_lse));
  EXPECT_LE(e.worst_row, OutTol(c.out_dtype));
  EXPECT_LE(e.total, OutTol(c.out_dtype));
  EXPECT_LE(e.worst_lse, kTolLse);
}

std::vector<AttnCase> Cases() {
  std::vector<AttnCase> v;
  // Every preset and head dim, decode and extend, ragged with odd lengths.
  for (const char* preset :
       {"k4v2_g128", "k4v2_g64", "k4v4_g128", "k4v4_g64", "k2v2_g128", "k8v8_g128"}) {
    for (int D : {64, 80, 96, 128, 256, 512}) {
      AttnCase c;
      c.preset = preset;
      c.D = D;
      c.lens = {1, 129, 300, 700};
      c.name = std::string(preset) + "_D" + std::to_string(D) + "_decode";
      v.push_back(c);
      c.q_lens = {1, 2, 64, 130};
      c.name = std::string(preset) + "_D" + std::to_string(D) + "_extend";
      v.push_back(c);
    }
  }
  // GQA ratios x sink tiles, decode and extend over a ragged batch up to 2049 tokens.
  for (int gqa : {1, 4, 7, 8}) {
    for (int sink : {0, 1, 2}) {
      AttnCase c;
      c.gqa = gqa;
      c.sink = sink;
      c.lens = {1, 127, 129, 1000, 2049};
      c.name = "gqa" + std::to_string(gqa) + "_sink" + std::to_string(sink) + "_decode";
      v.push_back(c);
      c.q_lens = {1, 9, 5, 40, 17};
      c.name = "gqa" + std::to_string(gqa) + "_sink" + std::to_string(sink) + "_extend";
      v.push_back(c);
    }
  }
  // Head dims 80 and 96 at GQA 1, and Phi-3-mini's attention: D 96, 32 KV heads, MHA 32/32.
  for (int D : {80, 96}) {
    for (int gqa : {1, 4}) {
      AttnCase c;
      c.D = D;
      c.gqa = gqa;
      c.lens = {1, 127, 129, 700};
      c.name = "D" + std::to_string(D) + "_gqa" + std::to_string(gqa) + "_decode";
      v.push_back(c);
      c.q_lens = {1, 9, 64, 33};
      c.name = "D" + std::to_string(D) + "_gqa" + std::to_string(gqa) + "_extend";
      v.push_back(c);
    }
  }
  for (const char* preset : {"k4v2_g128", "k4v4_g64"}) {
    AttnCase c;
    c.preset = preset;
    c.D = 96;
    c.Hk = 32;
    c.gqa = 1;
    c.lens = {300, 1, 517};
    c.name = std::string("phi3_D96_mha32_") + preset + "_decode";
    v.push_back(c);
    c.q_lens = {7, 1, 130};
    c.name = std::string("phi3_D96_mha32_") + preset + "_extend";
    v.push_back(c);
  }
  {
    AttnCase c;  // GQA 7 with one KV head, odd head count
    c.Hk = 3;
    c.gqa = 7;
    c.lens = {385, 128, 256};
    c.q_lens = {3, 128, 1};
    c.name = "hk3_gqa7_extend_full_tiles";
    v.push_back(c);
  }
  {
    AttnCase c;  // extend over the whole sequence: causal prefill of every token
    c.lens = {129, 300};
    c.q_lens = {129, 300};
    c.name = "extend_whole_sequences";
    v.push_back(c);
  }
  {
    AttnCase c;  // some sequences without query tokens
    c.lens = {500, 7, 260};
    c.q_lens = {0, 7, 0};
    c.name = "extend_some_sequences_without_queries";
    v.push_back(c);
  }
  {
    AttnCase c;  // a few thousand tokens, single KV head, automatic split-K
    c.Hk = 1;
    c.gqa = 8;
    c.lens = {4173, 8000};
    c.max_chunk = 2000;
    c.name = "long_8k_decode";
    v.push_back(c);
    c.q_lens = {3, 16};
    c.name = "long_8k_extend";
    v.push_back(c);
  }
  {
    AttnCase c;  // single token sequences only
    c.lens = {1, 1, 1};
    c.name = "one_token_sequences";
    v.push_back(c);
  }
  // Query and output dtypes, with K/V appended as f16 / bf16.
  const kvarn_dtype_t dts[] = {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16};
  for (kvarn_dtype_t qd : dts) {
    for (kvarn_dtype_t od : dts) {
      AttnCase c;
      c.lens = {200, 513};
      c.q_lens = {2, 5};
      c.q_dtype = qd;
      c.out_dtype = od;
      c.kv_dtype = qd == KVARN_DTYPE_F32 ? KVARN_DTYPE_F16 : qd;
      c.name = std::string("q_") + DtypeName(qd) + "_out_" + DtypeName(od);
      v.push_back(c);
    }
  }
  // Ablations: K rotated and V not, and the reverse; neither; no normalization.
  const struct {
    const char* name;
    uint32_t k, v;
  } abl[] = {{"k_rotated_v_not", 0, KVARN_ABLATE_NO_ROTATION},
             {"v_rotated_k_not", KVARN_ABLATE_NO_ROTATION, 0},
             {"no_rotation", KVARN_ABLATE_NO_ROTATION, KVARN_ABLATE_NO_ROTATION},
             {"no_normalization", KVARN_ABLATE_NO_NORMALIZATION, KVARN_ABLATE_NO_NORMALIZATION},
             {"no_rotation_no_normalization", 3, 3}};
  for (const auto& a : abl) {
    AttnCase c;
    c.kflags = a.k;
    c.vflags = a.v;
    c.lens = {300, 1000};
    c.name = std::string(a.name) + "_decode";
    v.push_back(c);
    c.q_lens = {4, 33};
    c.name = std::string(a.name) + "_extend";
    v.push_back(c);
  }
  {
    AttnCase c;  // an explicit softmax scale
    c.lens = {400, 90};
    c.q_lens = {3, 1};
    c.scale = 0.05f;
    c.name = "explicit_scale";
    v.push_back(c);
  }
  {
    AttnCase c;  // complete tiles left as fp16 pages (the engine has not flushed them yet)
    c.lens = {700, 1100};
    c.flush_lag = 2;
    c.q_lens = {5, 2};
    c.name = "complete_tiles_not_flushed";
    v.push_back(c);
    c.flush = false;
    c.flush_lag = 0;
    c.name = "pages_only";
    v.push_back(c);
  }
  for (int splits : {1, 7, 1000}) {
    AttnCase c;
    c.lens = {1500, 33, 900};
    c.q_lens = {2, 1, 4};
    c.splits = splits;
    c.name = "splits" + std::to_string(splits);
    v.push_back(c);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, Attention, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AttnCase>& p) { return p.param.name; });

// ---- properties between runs ------------------------------------------------------------------

TEST(AttentionSplits, ExplicitSplitsAgreeWithAutomatic) {
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {2500, 700, 129};
  c.q_lens = {3, 2, 1};
  c.max_chunk = 1000;
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  const size_t n = b.q.total * b.Hq * c.D;
  AttnOutput automatic;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &automatic));
  for (int splits : {1, 2, 7, 20, 64}) {
    AttnOutput r;
    ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, splits, 0, &r));
    EXPECT_LE(kvt::OutputDistance(r, automatic, n), 1e-5) << splits << " splits";
    for (size_t i = 0; i < r.lse.size(); ++i) {
      ASSERT_NEAR(r.lse[i], automatic.lse[i], 1e-5 * std::max(1.f, std::fabs(automatic.lse[i])))
          << splits << " splits, row " << i;
    }
  }
}

TEST(AttentionDeterminism, IndependentOfThreadCount) {
  // Contexts with 1, 2 and 5 threads give the same records and the same output bytes.
  AttnCase c;
  c.lens = {1200, 1, 450, 2000};
  c.q_lens = {4, 1, 3, 2};
  c.max_chunk = 700;
  std::vector<Built> runs(3);
  const int threads[] = {1, 2, 5};
  for (int i = 0; i < 3; ++i) {
    kvt::Rng rng(kvt::TestSeed());  // the same cache each time
    ASSERT_TRUE(Build(c, rng, &runs[i], threads[i]));
  }
  for (int i = 1; i < 3; ++i) {
    EXPECT_EQ(runs[i].pc.records, runs[0].pc.records) << threads[i] << " threads";
    EXPECT_EQ(runs[i].pc.k_pages, runs[0].pc.k_pages) << threads[i] << " threads";
  }
  for (int splits : {0, 3}) {
    std::vector<AttnOutput> out(3);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(kvt::RunAttention(runs[i].ctx.get(), runs[i].pc, runs[i].q, runs[i].Hq,
                                    KVARN_DTYPE_F32, splits, 0, &out[i]));
    }
    for (int i = 1; i < 3; ++i) {
      EXPECT_EQ(out[i].out, out[0].out) << threads[i] << " threads, splits " << splits;
      EXPECT_EQ(out[i].lse, out[0].lse) << threads[i] << " threads, splits " << splits;
    }
  }
}

TEST(AttentionDeterminism, SameOutputTwice) {
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {777, 300};
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  AttnOutput x, y;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &x));
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &y));
  EXPECT_EQ(x.out, y.out);
  EXPECT_EQ(x.lse, y.lse);
}

TEST(AttentionDeterminism, IndependentOfBatchComposition) {
  // A sequence's output does not depend on the other sequences of the batch (decode).
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {900, 260, 5};
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  AttnOutput all;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &all));
  const size_t row = static_cast<size_t>(b.Hq) * c.D * 4;
  for (int s = 0; s < 3; ++s) {
    PagedCache one = b.pc;
    one.batch = 1;
    one.block_table.assign(b.pc.block_table.begin() + s * b.pc.max_blocks,
                           b.pc.block_table.begin() + (s + 1) * b.pc.max_blocks);
    one.seq_lens = {b.pc.seq_lens[s]};
    one.record_tiles = {b.pc.record_tiles[s]};
    Queries q = b.q;
    q.total = 1;
    q.bytes.assign(b.q.bytes.begin() + s * row, b.q.bytes.begin() + (s + 1) * row);
    AttnOutput r;
    ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), one, q, b.Hq, KVARN_DTYPE_F32, 0, 0, &r));
    EXPECT_EQ(std::memcmp(r.out.data(), all.out.data() + s * row, row), 0) << "sequence " << s;
  }
}

TEST(AttentionDtypes, LowPrecisionOutputsAreTheRoundedF32Output) {
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {600, 77};
  c.q_lens = {3, 2};
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  AttnOutput f32;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &f32));
  const size_t n = b.q.total * b.Hq * c.D;
  const std::vector<double> ref = kvt::Decode(f32.out.data(), n, KVARN_DTYPE_F32);
  for (kvarn_dtype_t dt : {KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
    AttnOutput lo;
    ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, dt, 0, 0, &lo));
    const std::vector<double> got = kvt::Decode(lo.out.data(), n, dt);
    for (size_t i = 0; i < n; ++i) {
      const double ulp = dt == KVARN_DTYPE_F16 ? kvt::HalfUlp(ref[i]) : kvt::Bf16Ulp(ref[i]);
      ASSERT_LE(std::fabs(got[i] - ref[i]), 0.5 * ulp) << DtypeName(dt) << " element " << i;
    }
    EXPECT_EQ(lo.lse, f32.lse);
  }
}

TEST(AttentionEdges, EmptyBatchIsANoOp) {
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(128, 128, 4, 2);
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = 2;
  kv.batch = 0;
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = 8;
  float out[4] = {1, 2, 3, 4};
  KVT_EXPECT_OK(kvarn_paged_attention(ctx.get(), &cfg, &kv, &p, out, out, nullptr, nullptr, 0));
  EXPECT_EQ(out[0], 1.f);
}

TEST(AttentionEdges, LseIsOptional) {
  // lse = NULL computes the same outputs.
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {300, 64};
  c.q_lens = {2, 3};
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  AttnOutput with;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &with));
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = b.Hq;
  p.q_indptr = b.q.indptr.data();
  kvarn_paged_kv_t kv = b.pc.View();
  size_t ws = 0;
  KVT_ASSERT_OK(
      kvarn_paged_attention_workspace_size(b.ctx.get(), &b.pc.cfg, &kv, &p, b.q.total, &ws));
  std::vector<uint8_t> workspace(ws), out(with.out.size(), 0);
  KVT_ASSERT_OK(kvarn_paged_attention(b.ctx.get(), &b.pc.cfg, &kv, &p, b.q.bytes.data(), out.data(),
                                      nullptr, ws ? workspace.data() : nullptr, ws));
  EXPECT_EQ(out, with.out);
}

TEST(AttentionEdges, OneTokenGivesItsValue) {
  // softmax over one key is 1: the output is that token's V (un-rotated), lse its scaled score.
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {1};
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  AttnOutput r;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &r));
  const std::vector<double> out = kvt::Decode(r.out.data(), b.Hq * c.D, KVARN_DTYPE_F32);
  for (int hq = 0; hq < b.Hq; ++hq) {
    const int h = hq / c.gqa;
    // The appended value itself (the page holds it rotated and rounded to fp16).
    const float* v = b.pc.v_in[0].data() + static_cast<size_t>(h) * c.D;
    for (int d = 0; d < c.D; ++d) {
      ASSERT_NEAR(out[hq * c.D + d], v[d], 2e-3 * (std::fabs(v[d]) + 1)) << hq << " " << d;
    }
  }
}

TEST(AttentionEdges, RecordsAreReadNotTheirOldPages) {
  // After a flush the builder fills the old page with NaN; attention must read the record, and
  // never the unwritten slots of the tail page (also NaN).
  KVT_SEEDED_RNG(rng, 0);
  AttnCase c;
  c.lens = {1000, 300};
  c.q_lens = {2, 1};
  Built b;
  ASSERT_TRUE(Build(c, rng, &b));
  size_t nan_pages = 0;
  for (uint16_t h : b.pc.k_pages) nan_pages += h == kvt::kPoisonHalf;
  ASSERT_GT(nan_pages, 0u);
  AttnOutput r;
  ASSERT_TRUE(kvt::RunAttention(b.ctx.get(), b.pc, b.q, b.Hq, KVARN_DTYPE_F32, 0, 0, &r));
  for (double x : kvt::Decode(r.out.data(), b.q.total * b.Hq * c.D, KVARN_DTYPE_F32)) {
    ASSERT_TRUE(std::isfinite(x));
  }
  for (float l : r.lse) ASSERT_TRUE(std::isfinite(l));
}

}  // namespace
