// One context per thread from 8 threads at once gives the same results as one thread
// (bench/RESULTS.md, Targets: reliability), and a context's thread count never changes a result.
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>

#include <random>
#include <thread>
#include <vector>

namespace {

struct Result {
  std::vector<uint8_t> records;
  std::vector<float> attention;
};

// Quantizes tiles with the codec and runs decode attention through a managed cache.
Result RunPipeline(int num_threads, const std::vector<float>& k, const std::vector<float>& v,
                   const std::vector<float>& q, size_t tokens) {
  const int D = 128, Hk = 2, Hq = 14;  // GQA 7
  Result r;
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  o.num_threads = num_threads;
  kvarn_context_t* ctx = nullptr;
  EXPECT_EQ(kvarn_context_create(&o, &ctx), KVARN_OK);
  kvarn_config_t cfg;
  EXPECT_EQ(kvarn_config_from_preset("k4v2_g128", D, &cfg), KVARN_OK);
  size_t rb = 0;
  EXPECT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  const size_t tiles = tokens / 128;
  r.records.resize(tiles * rb);
  // The codec takes [tiles][G][D]: use head 0's rows as a flat list of tokens of one head.
  std::vector<float> k0(tokens * D), v0(tokens * D);
  for (size_t t = 0; t < tokens; ++t) {
    std::copy(&k[t * Hk * D], &k[t * Hk * D] + D, &k0[t * D]);
    std::copy(&v[t * Hk * D], &v[t * Hk * D] + D, &v0[t * D]);
  }
  EXPECT_EQ(kvarn_quantize(ctx, &cfg, tiles, KVARN_DTYPE_F32, k0.data(), v0.data(), 0,
                           r.records.data(), rb),
            KVARN_OK);
  kvarn_cache_options_t co;
  kvarn_cache_options_defaults(&co);
  co.config = cfg;
  co.num_kv_heads = Hk;
  co.max_tokens = static_cast<int64_t>(tokens) + 256;
  kvarn_cache_t* cache = nullptr;
  EXPECT_EQ(kvarn_cache_create(ctx, &co, &cache), KVARN_OK);
  EXPECT_EQ(kvarn_cache_add_sequence(cache, 0), KVARN_OK);
  EXPECT_EQ(kvarn_cache_append(cache, 0, 0, tokens, KVARN_DTYPE_F32, k.data(), v.data(), 0),
            KVARN_OK);
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = Hq;
  r.attention.resize(Hq * D);
  const int64_t id = 0;
  EXPECT_EQ(kvarn_cache_attention(cache, 0, 1, &id, &p, q.data(), r.attention.data(), nullptr),
            KVARN_OK);
  kvarn_cache_destroy(cache);
  kvarn_context_destroy(ctx);
  return r;
}

TEST(Concurrency, EightThreadsWithOwnContextsMatchOneThread) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const size_t tokens = 128 * 9 + 37;
  std::vector<float> k(tokens * 2 * 128), v(k.size()), q(14 * 128);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  for (float& x : q) x = nd(rng);
  const Result ref = RunPipeline(1, k, v, q, tokens);
  std::vector<Result> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] { results[i] = RunPipeline(1 + i % 3, k, v, q, tokens); });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(results[i].records, ref.records) << "thread " << i;
    EXPECT_EQ(results[i].attention, ref.attention) << "thread " << i;
  }
}

}  // namespace
