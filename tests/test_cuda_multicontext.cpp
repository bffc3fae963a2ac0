// One process, several CUDA contexts: contexts bound to device ordinals (invalid ones refused),
// several contexts on one device used from several threads at once, every device giving the
// results device 0 gives, and memory of the wrong device or plain host memory refused with a
// clear status instead of a fault. Device-count dependent cases skip with the reason.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/rng.h"

namespace {

using kvt::DeviceBuffer;
using kvt::IsError;

constexpr int kD = 128, kHk = 2, kGroup = 7, kLayers = 2, kTiles = 3;
constexpr int kTokens = 128 * 5 + 37;  // records, a partial tail and a sink

int CudaDeviceCount() {
  for (int32_t i = 0; i < kvarn_backend_count(); ++i) {
    kvarn_backend_info_t info;
    info.size = sizeof info;
    if (kvarn_backend_get_info(i, &info) == KVARN_OK && info.backend == kvt::kGpuBackend) {
      return info.available ? info.device_count : 0;
    }
  }
  return 0;
}

kvt::ContextPtr MakeCudaContextOn(int device) {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = kvt::kGpuBackend;
  o.device = device;
  kvarn_context_t* c = nullptr;
  EXPECT_EQ(kvarn_context_create(&o, &c), KVARN_OK) << kvarn_last_error();
  return kvt::ContextPtr(c);
}

struct CacheDeleter {
  void operator()(kvarn_cache_t* c) const { kvarn_cache_destroy(c); }
};

// What one engine thread does with its context: quantize tiles, fill a managed cache and run
// extend + decode attention over it. Everything comes back to the host for comparison.
struct Result {
  std::vector<uint8_t> records;
  std::vector<float> attention;
  bool operator==(const Result& o) const {
    return records == o.records && attention == o.attention;
  }
};

Result RunWorkload(kvarn_context_t* ctx, uint64_t seed) {
  Result r;
  kvt::Rng rng(seed);
  kvarn_config_t cfg;
  EXPECT_EQ(kvarn_config_from_preset("k4v2_g128", kD, &cfg), KVARN_OK);
  size_t rb = 0;
  EXPECT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);

  std::vector<float> k(kTiles * 128 * kD), v(k.size());
  for (auto& x : k) x = static_cast<float>(rng.Normal() * (rng.Bernoulli(0.02) ? 8 : 1));
  for (auto& x : v) x = static_cast<float>(rng.Normal());
  DeviceBuffer dk(ctx, k), dv(ctx, v), drec(ctx, kTiles * rb);
  EXPECT_EQ(
      kvarn_quantize(ctx, &cfg, kTiles, KVARN_DTYPE_F32, dk.get(), dv.get(), 0, drec.get(), rb),
      KVARN_OK)
      << kvarn_last_error();
  r.records = drec.Download<uint8_t>();

  kvarn_cache_options_t o;
  kvarn_cache_options_defaults(&o);
  o.config = cfg;
  o.num_layers = kLayers;
  o.num_kv_heads = kHk;
  o.max_tokens = 4096;
  o.max_sequences = 2;
  kvarn_cache_t* raw = nullptr;
  EXPECT_EQ(kvarn_cache_create(ctx, &o, &raw), KVARN_OK) << kvarn_last_error();
  std::unique_ptr<kvarn_cache_t, CacheDeleter> cache(raw);
  if (!cache) return r;
  EXPECT_EQ(kvarn_cache_add_sequence(cache.get(), 3), KVARN_OK);
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<float> ck(static_cast<size_t>(kTokens) * kHk * kD), cv(ck.size());
    for (auto& x : ck) x = static_cast<float>(rng.Normal());
    for (auto& x : cv) x = static_cast<float>(rng.Normal());
    DeviceBuffer dck(ctx, ck), dcv(ctx, cv);
    EXPECT_EQ(kvarn_cache_append(cache.get(), 3, layer, kTokens, KVARN_DTYPE_F32, dck.get(),
                                 dcv.get(), 0),
              KVARN_OK)
        << kvarn_last_error();
  }
  EXPECT_EQ(kvarn_cache_commit(cache.get(), 3, kTokens), KVARN_OK) << kvarn_last_error();
  const int64_t id = 3;
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHk * kGroup;
  std::vector<float> q(static_cast<size_t>(ap.num_q_heads) * kD);
  for (auto& x : q) x = static_cast<float>(rng.Normal());
  DeviceBuffer dq(ctx, q), dout(ctx, q.size() * sizeof(float));
  for (int layer = 0; layer < kLayers; ++layer) {
    EXPECT_EQ(kvarn_cache_attention(cache.get(), layer, 1, &id, &ap, dq.get(), dout.get(), nullptr),
              KVARN_OK)
        << kvarn_last_error();
    const std::vector<float> out = dout.Download<float>();
    r.attention.insert(r.attention.end(), out.begin(), out.end());
  }
  return r;
}

TEST(CudaMultiContext, InvalidDeviceOrdinalsAreRejected) {
  KVT_CUDA_CONTEXT_OR_SKIP(probe);
  const int n = CudaDeviceCount();
  ASSERT_GE(n, 1);
  for (int32_t bad : {-1, n, n + 5, std::numeric_limits<int32_t>::max()}) {
    kvarn_context_options_t o;
    kvarn_context_options_defaults(&o);
    o.backend = kvt::kGpuBackend;
    o.device = bad;
    kvarn_context_t* c = nullptr;
    EXPECT_TRUE(IsError(kvarn_context_create(&o, &c), KVARN_ERR_INVALID_ARGUMENT, "device")) << bad;
    EXPECT_EQ(c, nullptr);
  }
  for (int d = 0; d < n; ++d) {
    kvt::ContextPtr ctx = MakeCudaContextOn(d);
    ASSERT_TRUE(ctx);
    int32_t got = -1;
    ASSERT_EQ(kvarn_context_get_device(ctx.get(), &got), KVARN_OK);
    EXPECT_EQ(got, d);
  }
}

TEST(CudaMultiContext, TwoContextsOnOneDeviceFromTwoThreadsMatchOneContext) {
  KVT_CUDA_CONTEXT_OR_SKIP(ref_ctx);
  const uint64_t seeds[2] = {0x5eed01, 0x5eed02};
  const Result want[2] = {RunWorkload(ref_ctx.get(), seeds[0]),
                          RunWorkload(ref_ctx.get(), seeds[1])};
  ASSERT_FALSE(want[0].attention.empty());
  ASSERT_FALSE(want[0] == want[1]);  // different inputs give different results

  kvt::ContextPtr ctx[2] = {MakeCudaContextOn(0), MakeCudaContextOn(0)};
  ASSERT_TRUE(ctx[0] && ctx[1]);
  constexpr int kRounds = 4;
  std::vector<Result> got[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) got[t].push_back(RunWorkload(ctx[t].get(), seeds[t]));
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 2; ++t) {
    ASSERT_EQ(got[t].size(), static_cast<size_t>(kRounds));
    for (int i = 0; i < kRounds; ++i)
      EXPECT_TRUE(got[t][i] == want[t]) << "thread " << t << " round " << i;
  }
}

TEST(CudaMultiContext, HostMemoryIsRefusedAndTheContextStaysUsable) {
  KVT_CUDA_CONTEXT_OR_SKIP(ctx);
  const Result before = RunWorkload(ctx.get(), 77);
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", kD, &cfg), KVARN_OK);
  size_t rb = 0;
  ASSERT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  std::vector<float> host(128 * kD, 1.0f);
  DeviceBuffer dk(ctx.get(), host), drec(ctx.get(), rb);
  EXPECT_TRUE(IsError(
      kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, dk.get(), host.data(), 0, drec.get(), rb),
      KVARN_ERR_INVALID_ARGUMENT, "v is host memory"));
  std::vector<uint8_t> host_rec(rb);
  EXPECT_TRUE(IsError(kvarn_dequantize(ctx.get(), &cfg, 1, host_rec.data(), rb, 0, KVARN_DTYPE_F32,
                                       dk.get(), nullptr),
                      KVARN_ERR_INVALID_ARGUMENT, "records is host memory"));
  EXPECT_TRUE(IsError(
      kvarn_rotate(ctx.get(), kD, 128, KVARN_DTYPE_F32, dk.get(), KVARN_DTYPE_F32, host.data()),
      KVARN_ERR_INVALID_ARGUMENT, "out is host memory"));
  EXPECT_TRUE(IsError(
      kvarn_memory_copy(ctx.get(), host.data(), host_rec.data(), 16, KVARN_COPY_DEVICE_TO_DEVICE),
      KVARN_ERR_INVALID_ARGUMENT, "host memory"));
  EXPECT_TRUE(kvarn_context_synchronize(ctx.get()) == KVARN_OK) << kvarn_last_error();
  EXPECT_TRUE(RunWorkload(ctx.get(), 77) == before);
}

TEST(CudaMultiContext, EveryDeviceMatchesDeviceZeroConcurrently) {
  KVT_CUDA_CONTEXT_OR_SKIP(probe);
  const int n = CudaDeviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << n;
  const Result want = RunWorkload(probe.get(), 991);
  std::vector<kvt::ContextPtr> ctx;
  for (int d = 0; d < n; ++d) ctx.push_back(MakeCudaContextOn(d));
  std::vector<Result> got(n);
  std::vector<std::thread> threads;
  for (int d = 0; d < n; ++d) {
    threads.emplace_back([&, d] { got[d] = RunWorkload(ctx[d].get(), 991); });
  }
  for (auto& th : threads) th.join();
  for (int d = 0; d < n; ++d) EXPECT_TRUE(got[d] == want) << "device " << d;
}

TEST(CudaMultiContext, MemoryOfAnotherDeviceIsRefused) {
  KVT_CUDA_CONTEXT_OR_SKIP(ctx0);
  const int n = CudaDeviceCount();
  if (n < 2) GTEST_SKIP() << "needs 2 CUDA devices, this machine has " << n;
  kvt::ContextPtr ctx1 = MakeCudaContextOn(1);
  ASSERT_TRUE(ctx1);
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", kD, &cfg), KVARN_OK);
  size_t rb = 0;
  ASSERT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  std::vector<float> host(128 * kD, 0.5f);
  DeviceBuffer k0(ctx0.get(), host), k1(ctx1.get(), host), rec0(ctx0.get(), rb);
  EXPECT_TRUE(IsError(
      kvarn_quantize(ctx0.get(), &cfg, 1, KVARN_DTYPE_F32, k0.get(), k1.get(), 0, rec0.get(), rb),
      KVARN_ERR_INVALID_ARGUMENT, "device 1"));
  EXPECT_TRUE(
      IsError(kvarn_memory_copy(ctx0.get(), rec0.get(), k1.get(), 16, KVARN_COPY_DEVICE_TO_DEVICE),
              KVARN_ERR_INVALID_ARGUMENT, "device 1"));
  // Both contexts still work.
  EXPECT_TRUE(RunWorkload(ctx0.get(), 5) == RunWorkload(ctx1.get(), 5));
}

}  // namespace
