// The managed cache on CUDA against the same cache on the CPU: random sequences of add, append
// (committed and speculative), commit, truncate, fork, remove, export/import, with the same
// statuses, lengths and statistics on both, and attention outputs that agree. Records made on
// the GPU may differ from the CPU's in rare codes and in how scales split between rows and
// columns (docs/FORMAT.md section 4), so exactness is checked through an export of the GPU
// sequence imported into a CPU cache: the same records must give the same attention there.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/fp.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/rng.h"

namespace {

using kvt::DeviceBuffer;

struct CacheDeleter {
  void operator()(kvarn_cache_t* c) const { kvarn_cache_destroy(c); }
};
using CachePtr = std::unique_ptr<kvarn_cache_t, CacheDeleter>;

constexpr int kD = 128, kHk = 2, kGroup = 4, kLayers = 2;

CachePtr MakeCache(kvarn_context_t* ctx, const char* preset) {
  kvarn_cache_options_t o;
  kvarn_cache_options_defaults(&o);
  EXPECT_EQ(kvarn_config_from_preset(preset, kD, &o.config), KVARN_OK);
  o.num_layers = kLayers;
  o.num_kv_heads = kHk;
  o.max_tokens = 6000;
  o.max_sequences = 8;
  kvarn_cache_t* c = nullptr;
  EXPECT_EQ(kvarn_cache_create(ctx, &o, &c), KVARN_OK) << kvarn_last_error();
  return CachePtr(c);
}

struct Pair {
  kvarn_context_t* gpu;
  kvarn_cache_t* cg;  // on the GPU
  kvarn_cache_t* cc;  // on the CPU
};

// Attention of layer `layer` for `ids` on both caches: returns the relative L2 distance.
double AttentionDistance(const Pair& p, kvt::Rng& rng, int layer, const std::vector<int64_t>& ids,
                         std::vector<float>* gpu_out = nullptr,
                         std::vector<float>* q_out = nullptr) {
  const int Hq = kHk * kGroup;
  std::vector<float> q(ids.size() * Hq * kD);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = Hq;
  std::vector<float> out_c(q.size(), -7.f);
  EXPECT_EQ(kvarn_cache_attention(p.cc, layer, ids.size(), ids.data(), &ap, q.data(), out_c.data(),
                                  nullptr),
            KVARN_OK)
      << kvarn_last_error();
  DeviceBuffer dq(p.gpu, q), dout(p.gpu, q.size() * sizeof(float));
  dout.Upload(std::vector<float>(q.size(), -7.f));
  EXPECT_EQ(kvarn_cache_attention(p.cg, layer, ids.size(), ids.data(), &ap, dq.get(), dout.get(),
                                  nullptr),
            KVARN_OK)
      << kvarn_last_error();
  const std::vector<float> out_g = dout.Download<float>();
  if (gpu_out) *gpu_out = out_g;
  if (q_out) *q_out = q;
  double num = 0, den = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    num += (out_g[i] - out_c[i]) * double(out_g[i] - out_c[i]);
    den += double(out_c[i]) * out_c[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

void ExpectSameStats(const Pair& p) {
  kvarn_cache_stats_t a, b;
  a.size = b.size = sizeof a;
  ASSERT_EQ(kvarn_cache_get_stats(p.cg, &a), KVARN_OK);
  ASSERT_EQ(kvarn_cache_get_stats(p.cc, &b), KVARN_OK);
  EXPECT_EQ(a.sequences, b.sequences);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.committed_tokens, b.committed_tokens);
  EXPECT_EQ(a.records, b.records);
  EXPECT_EQ(a.pages, b.pages);
  EXPECT_EQ(a.bytes_used, b.bytes_used);
}

class CudaCache : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaCache, RandomOperationsMatchTheCpuCache) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  auto cpu = kvt::MakeCpuContext();
  CachePtr cg = MakeCache(gpu.get(), GetParam()), cc = MakeCache(cpu.get(), GetParam());
  ASSERT_TRUE(cg && cc);
  const Pair p{gpu.get(), cg.get(), cc.get()};
  kvt::Rng rng(0xCAC4E + std::string(GetParam()).size());
  std::vector<int64_t> live;
  int64_t next_id = 100;
  kvt::KVShape shape{5.0, 3, 0.3, 4.0, 0.01, 0.3, 1.0};
  int attention_checks = 0;
  for (int step = 0; step < 80; ++step) {
    const int op = static_cast<int>(rng.Int(0, 9));
    SCOPED_TRACE("step " + std::to_string(step) + " op " + std::to_string(op));
    if (live.empty() || op == 0) {
      const int64_t id = next_id++;
      const kvarn_status_t a = kvarn_cache_add_sequence(p.cg, id);
      ASSERT_EQ(a, kvarn_cache_add_sequence(p.cc, id));
      if (a == KVARN_OK) live.push_back(id);
      continue;
    }
    const int64_t id = live[rng.Int(0, live.size() - 1)];
    if (op <= 4) {  // append to every layer
      const int n = static_cast<int>(rng.Int(1, 300));
      const uint32_t flags = rng.Uniform() < 0.2 ? KVARN_APPEND_SPECULATIVE : 0u;
      for (int layer = 0; layer < kLayers; ++layer) {
        std::vector<float> k = kvt::MakeTokens(rng, n * kHk, kD, shape);
        std::vector<float> v = kvt::MakeTokens(rng, n * kHk, kD, shape);
        DeviceBuffer dk(p.gpu, k), dv(p.gpu, v);
        const kvarn_status_t a =
            kvarn_cache_append(p.cg, id, layer, n, KVARN_DTYPE_F32, dk.get(), dv.get(), flags);
        const std::string msg = kvarn_last_error();
        const kvarn_status_t b =
            kvarn_cache_append(p.cc, id, layer, n, KVARN_DTYPE_F32, k.data(), v.data(), flags);
        ASSERT_EQ(a, b) << msg << " / " << kvarn_last_error();
      }
    } else if (op == 5) {
      int64_t len = 0, committed = 0;
      ASSERT_EQ(kvarn_cache_sequence_length(p.cc, id, 0, &len, &committed), KVARN_OK);
      ASSERT_EQ(kvarn_cache_commit(p.cg, id, len), kvarn_cache_commit(p.cc, id, len));
    } else if (op == 6) {
      int64_t len = 0, committed = 0;
      ASSERT_EQ(kvarn_cache_sequence_length(p.cc, id, 0, &len, &committed), KVARN_OK);
      const int64_t n = rng.Int(0, len);
      ASSERT_EQ(kvarn_cache_truncate(p.cg, id, n), kvarn_cache_truncate(p.cc, id, n));
    } else if (op == 7) {
      const int64_t dst = next_id++;
      const kvarn_status_t a = kvarn_cache_fork(p.cg, id, dst, -1);
      ASSERT_EQ(a, kvarn_cache_fork(p.cc, id, dst, -1)) << kvarn_last_error();
      if (a == KVARN_OK) live.push_back(dst);
    } else if (op == 8 && live.size() > 2) {
      ASSERT_EQ(kvarn_cache_remove_sequence(p.cg, id), kvarn_cache_remove_sequence(p.cc, id));
      live.erase(std::find(live.begin(), live.end(), id));
    } else {
      // Attention over every non-empty sequence, both layers.
      std::vector<int64_t> ids;
      for (int64_t s : live) {
        int64_t len = 0, committed = 0;
        ASSERT_EQ(kvarn_cache_sequence_length(p.cc, s, 0, &len, &committed), KVARN_OK);
        int64_t len1 = 0;
        ASSERT_EQ(kvarn_cache_sequence_length(p.cc, s, 1, &len1, &committed), KVARN_OK);
        if (len > 0 && len1 > 0) ids.push_back(s);
      }
      if (ids.empty()) continue;
      for (int layer = 0; layer < kLayers; ++layer) {
        EXPECT_LE(AttentionDistance(p, rng, layer, ids), 5e-3) << "layer " << layer;
      }
      ++attention_checks;
    }
    ExpectSameStats(p);
  }
  EXPECT_GT(attention_checks, 3);

  // Exactness through export: a GPU sequence imported into a CPU cache attends the same.
  for (int64_t id : live) {
    int64_t len = 0, committed = 0;
    ASSERT_EQ(kvarn_cache_sequence_length(p.cg, id, 0, &len, &committed), KVARN_OK);
    if (committed == 0 || len != committed) continue;
    size_t bytes = 0;
    ASSERT_EQ(kvarn_cache_export_sequence(p.cg, id, nullptr, 0, &bytes), KVARN_OK)
        << kvarn_last_error();
    std::vector<uint8_t> blob(bytes);
    ASSERT_EQ(kvarn_cache_export_sequence(p.cg, id, blob.data(), bytes, &bytes), KVARN_OK);
    CachePtr imported = MakeCache(cpu.get(), GetParam());
    ASSERT_EQ(kvarn_cache_import_sequence(imported.get(), id, blob.data(), bytes), KVARN_OK)
        << kvarn_last_error();
    const Pair q{gpu.get(), cg.get(), imported.get()};
    for (int layer = 0; layer < kLayers; ++layer) {
      EXPECT_LE(AttentionDistance(q, rng, layer, {id}), 2e-3) << "sequence " << id;
    }
    // And back onto the GPU under another id.
    ASSERT_EQ(kvarn_cache_import_sequence(p.cg, next_id, blob.data(), bytes), KVARN_OK)
        << kvarn_last_error();
    std::vector<uint8_t> again(bytes);
    ASSERT_EQ(kvarn_cache_export_sequence(p.cg, next_id, again.data(), bytes, &bytes), KVARN_OK);
    EXPECT_EQ(again, blob) << "export(import(blob)) must give the blob back";
    ASSERT_EQ(kvarn_cache_remove_sequence(p.cg, next_id++), KVARN_OK);
    break;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaCache,
                         ::testing::Values("k4v2_g128", "k4v2_g64", "k2v2_g128"));

TEST(CudaCacheErrors, NonFiniteAppendLeavesTheCacheAsItWas) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  CachePtr cg = MakeCache(gpu.get(), "k4v2_g128");
  ASSERT_TRUE(cg);
  kvt::Rng rng(9);
  ASSERT_EQ(kvarn_cache_add_sequence(cg.get(), 1), KVARN_OK);
  const int n = 200;
  std::vector<float> k = kvt::MakeTokens(rng, n * kHk, kD, {}), v = k;
  {
    DeviceBuffer dk(gpu.get(), k), dv(gpu.get(), v);
    ASSERT_EQ(kvarn_cache_append(cg.get(), 1, 0, n, KVARN_DTYPE_F32, dk.get(), dv.get(), 0),
              KVARN_OK)
        << kvarn_last_error();
  }
  size_t bytes = 0;
  ASSERT_EQ(kvarn_cache_export_sequence(cg.get(), 1, nullptr, 0, &bytes), KVARN_OK);
  std::vector<uint8_t> before(bytes);
  ASSERT_EQ(kvarn_cache_export_sequence(cg.get(), 1, before.data(), bytes, &bytes), KVARN_OK);
  // 100 more tokens complete tile 1 (a flush); one NaN in the last must stop all of it.
  std::vector<float> k2 = kvt::MakeTokens(rng, 100 * kHk, kD, {}), v2 = k2;
  k2[99 * kHk * kD + 5] = std::nanf("");
  DeviceBuffer dk(gpu.get(), k2), dv(gpu.get(), v2);
  EXPECT_TRUE(
      kvt::IsError(kvarn_cache_append(cg.get(), 1, 0, 100, KVARN_DTYPE_F32, dk.get(), dv.get(), 0),
                   KVARN_ERR_NON_FINITE, ""));
  int64_t len = -1, committed = -1;
  ASSERT_EQ(kvarn_cache_sequence_length(cg.get(), 1, 0, &len, &committed), KVARN_OK);
  EXPECT_EQ(len, n);
  EXPECT_EQ(committed, n);
  std::vector<uint8_t> after(bytes);
  size_t bytes_after = 0;
  ASSERT_EQ(kvarn_cache_export_sequence(cg.get(), 1, after.data(), bytes, &bytes_after), KVARN_OK);
  EXPECT_EQ(bytes_after, bytes);
  EXPECT_EQ(after, before);
  // The context is clean afterwards.
  EXPECT_EQ(kvarn_context_synchronize(gpu.get()), KVARN_OK) << kvarn_last_error();
}

}  // namespace
