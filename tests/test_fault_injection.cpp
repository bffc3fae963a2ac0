// Fault injection (issue 15, defects 3, 4 and 5): this binary replaces the global operator new
// and, for every operation of the library, fails its 1st, 2nd, ... allocation in turn (counted
// over all threads of the process) until the operation runs without reaching the armed one.
// With 1 and 2 CPU threads, every failing call must return KVARN_ERR_OUT_OF_MEMORY, the process
// must live, and a managed cache must be byte-identical to before: the same statistics (so its
// pools lost no page or block), the same lengths and the same export of every sequence.
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "support/kvarn_test.h"

// ---- the allocation hook ----------------------------------------------------------------------

namespace {

std::atomic<long> g_countdown{-1};  // >= 0: the allocation that fails is this many ahead
std::atomic<long> g_fired{0};

bool ShouldFail() {
  if (g_countdown.load(std::memory_order_relaxed) < 0) return false;
  if (g_countdown.fetch_sub(1) == 0) {
    g_fired.fetch_add(1);
    return true;
  }
  return false;
}

void Arm(long n) {
  g_fired.store(0);
  g_countdown.store(n);
}

// Disarms; true if the armed allocation was reached (and failed).
bool Disarm() {
  g_countdown.store(-1);
  return g_fired.load() > 0;
}

void* Allocate(size_t n, size_t align) {
  if (ShouldFail()) return nullptr;
  if (n == 0) n = 1;
  if (align <= alignof(std::max_align_t)) return std::malloc(n);
  return std::aligned_alloc(align, (n + align - 1) / align * align);
}

void* AllocateOrThrow(size_t n, size_t align) {
  void* p = Allocate(n, align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(size_t n) { return AllocateOrThrow(n, 0); }
void* operator new[](size_t n) { return AllocateOrThrow(n, 0); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return Allocate(n, 0); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return Allocate(n, 0); }
void* operator new(size_t n, std::align_val_t a) {
  return AllocateOrThrow(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a) {
  return AllocateOrThrow(n, static_cast<size_t>(a));
}
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return Allocate(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return Allocate(n, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

constexpr int kLayers = 2, kHk = 2, kD = 64, kG = 64;
constexpr long kMaxSites = 100000;  // a bound on the loop, far above any operation's count

// Runs op with its allocation n failed, for n = 0, 1, ... until op reaches no armed allocation.
// check(status, fired) judges each run. Returns the number of allocation sites failed.
long ForEveryAllocation(const std::function<kvarn_status_t()>& op,
                        const std::function<void(kvarn_status_t, long)>& check,
                        const std::function<void()>& before_each = nullptr) {
  for (long n = 0; n < kMaxSites; ++n) {
    if (before_each) before_each();
    Arm(n);
    const kvarn_status_t st = op();
    const bool fired = Disarm();
    if (!fired) {
      EXPECT_EQ(st, KVARN_OK) << "without a failed allocation: " << kvarn_last_error();
      return n;
    }
    check(st, n);
    if (::testing::Test::HasFailure()) return n;
  }
  ADD_FAILURE() << "more than " << kMaxSites << " allocations";
  return kMaxSites;
}

std::vector<float> Tokens(size_t n, int salt) {
  std::vector<float> x(n * kHk * kD);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(((i + salt) * 2654435761u) % 1000) / 250.f - 2.f;
  }
  return x;
}

// What a cache looks like from outside: statistics, lengths and exports of known ids.
struct Snapshot {
  std::vector<int64_t> stats;
  std::vector<int64_t> lengths;
  std::vector<std::vector<uint8_t>> blobs;
  bool operator==(const Snapshot& o) const {
    return stats == o.stats && lengths == o.lengths && blobs == o.blobs;
  }
};

Snapshot Take(kvarn_cache_t* c, const std::vector<int64_t>& ids) {
  Snapshot s;
  kvarn_cache_stats_t st;
  st.size = sizeof st;
  EXPECT_EQ(kvarn_cache_get_stats(c, &st), KVARN_OK);
  s.stats = {st.sequences, st.tokens, st.committed_tokens, st.records, st.pages, st.bytes_used};
  for (int64_t id : ids) {
    for (int l = 0; l < kLayers; ++l) {
      int64_t t = -1, cm = -1;
      kvarn_cache_sequence_length(c, id, l, &t, &cm);
      s.lengths.push_back(t);
      s.lengths.push_back(cm);
    }
    size_t n = 0;
    if (kvarn_cache_export_sequence(c, id, nullptr, 0, &n) != KVARN_OK) {
      s.blobs.emplace_back();
      continue;
    }
    std::vector<uint8_t> b(n);
    EXPECT_EQ(kvarn_cache_export_sequence(c, id, b.data(), n, &n), KVARN_OK);
    s.blobs.push_back(std::move(b));
  }
  return s;
}

class FaultInjection : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ctx_ = kvt::MakeCpuContext(GetParam());
    ASSERT_NE(ctx_, nullptr);
    kvarn_cache_options_defaults(&opts_);
    ASSERT_EQ(kvarn_config_from_preset("k4v2_g64", kD, &opts_.config), KVARN_OK);
    opts_.num_layers = kLayers;
    opts_.num_kv_heads = kHk;
    opts_.max_tokens = 64 * 32;
    opts_.max_sequences = 8;
  }
  void TearDown() override {
    kvarn_cache_destroy(cache_);
    ctx_.reset();
  }

  // Not armed: only for building states.
  kvarn_status_t Append(int64_t id, int layer, size_t n, int salt, uint32_t flags) {
    const std::vector<float> k = Tokens(n, salt), v = Tokens(n, salt + 1);
    return kvarn_cache_append(cache_, id, layer, n, KVARN_DTYPE_F32, k.data(), v.data(), flags);
  }

  // A fresh cache with sequence 1 (100 committed tokens and 40 speculative ones in both layers)
  // and sequence 2 (150 committed).
  void Fresh() {
    kvarn_cache_destroy(cache_);
    cache_ = nullptr;
    ASSERT_EQ(kvarn_cache_create(ctx_.get(), &opts_, &cache_), KVARN_OK) << kvarn_last_error();
    ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
    ASSERT_EQ(kvarn_cache_add_sequence(cache_, 2), KVARN_OK);
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_EQ(Append(1, l, 100, l, 0), KVARN_OK) << kvarn_last_error();
      ASSERT_EQ(Append(2, l, 150, 10 + l, 0), KVARN_OK) << kvarn_last_error();
    }
    for (int l = 0; l < kLayers; ++l) {
      ASSERT_EQ(Append(1, l, 40, 7 + l, KVARN_APPEND_SPECULATIVE), KVARN_OK);
    }
  }

  // Every allocation of op failed in turn on a fresh cache: failures change nothing.
  long CacheOp(const char* what, const std::function<kvarn_status_t()>& op) {
    const std::vector<int64_t> ids = {1, 2, 3, 9};
    Snapshot before;
    const long sites = ForEveryAllocation(
        op,
        [&](kvarn_status_t st, long n) {
          if (st == KVARN_OK) return;  // the library recovered from the failed allocation
          EXPECT_EQ(st, KVARN_ERR_OUT_OF_MEMORY)
              << what << ", allocation " << n << ": " << kvarn_last_error();
          EXPECT_TRUE(Take(cache_, ids) == before) << what << ", allocation " << n;
        },
        [&] {
          Fresh();
          before = Take(cache_, ids);
        });
    total_sites_ += sites;
    return sites;
  }

  kvt::ContextPtr ctx_;
  kvarn_cache_t* cache_ = nullptr;
  kvarn_cache_options_t opts_;
  long total_sites_ = 0;
};

TEST_P(FaultInjection, ManagedCacheOperationsChangeNothingOnOutOfMemory) {
  // Everything the operations read is made before arming: only the library's allocations fail.
  const std::vector<float> k100 = Tokens(100, 3), v100 = Tokens(100, 4);
  const std::vector<float> k120 = Tokens(120, 5), v120 = Tokens(120, 6);
  const std::vector<float> q = Tokens(4, 99);  // [Hq = 8][D] floats: one decode query
  std::vector<float> out(8 * kD);
  std::vector<uint8_t> export_buffer(1 << 20);
  Fresh();
  size_t blob_bytes = 0;
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 2, nullptr, 0, &blob_bytes), KVARN_OK);
  std::vector<uint8_t> blob(blob_bytes);
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 2, blob.data(), blob.size(), &blob_bytes),
            KVARN_OK);

  EXPECT_GT(CacheOp("add_sequence", [&] { return kvarn_cache_add_sequence(cache_, 3); }), 0);
  // Completes tile 2 of sequence 2 (quantized into a record) and starts tile 3.
  EXPECT_GT(CacheOp("append",
                    [&] {
                      return kvarn_cache_append(cache_, 2, 0, 100, KVARN_DTYPE_F32, k100.data(),
                                                v100.data(), 0);
                    }),
            0);
  EXPECT_GT(CacheOp("append speculative",
                    [&] {
                      return kvarn_cache_append(cache_, 2, 1, 120, KVARN_DTYPE_F32, k120.data(),
                                                v120.data(), KVARN_APPEND_SPECULATIVE);
                    }),
            0);
  // Completes tile 1 of sequence 1 in both layers: one record block per layer.
  EXPECT_GT(CacheOp("commit", [&] { return kvarn_cache_commit(cache_, 1, 140); }), 0);
  CacheOp("commit nothing new", [&] { return kvarn_cache_commit(cache_, 1, 100); });
  EXPECT_GT(CacheOp("fork", [&] { return kvarn_cache_fork(cache_, 2, 3, -1); }), 0);
  EXPECT_GT(CacheOp("fork prefix", [&] { return kvarn_cache_fork(cache_, 2, 3, 64); }), 0);
  CacheOp("truncate tail", [&] { return kvarn_cache_truncate(cache_, 1, 70); });
  CacheOp("truncate records", [&] { return kvarn_cache_truncate(cache_, 2, 64); });
  CacheOp("remove", [&] { return kvarn_cache_remove_sequence(cache_, 2); });
  EXPECT_GT(
      CacheOp("import",
              [&] { return kvarn_cache_import_sequence(cache_, 9, blob.data(), blob.size()); }),
      0);
  EXPECT_GT(CacheOp("attention",
                    [&] {
                      kvarn_attention_params_t p;
                      kvarn_attention_params_defaults(&p);
                      p.num_q_heads = 8;
                      const int64_t id = 2;
                      return kvarn_cache_attention(cache_, 0, 1, &id, &p, q.data(), out.data(),
                                                   nullptr);
                    }),
            0);
  EXPECT_GT(CacheOp("export",
                    [&] {
                      size_t n = 0;
                      return kvarn_cache_export_sequence(cache_, 2, export_buffer.data(),
                                                         export_buffer.size(), &n);
                    }),
            0);
  std::printf(
      "[ fault    ] %d thread(s): %ld allocation sites failed in turn over the cache "
      "operations\n",
      GetParam(), total_sites_);
}

TEST_P(FaultInjection, CodecCallsReturnOutOfMemoryAndWriteNothing) {
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g64", kD, &cfg), KVARN_OK);
  size_t rb = 0;
  ASSERT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  const size_t tiles = 8;
  const std::vector<float> k = Tokens(tiles * kG / kHk, 1), v = Tokens(tiles * kG / kHk, 2);
  std::vector<uint8_t> rec(tiles * rb, 0xab);
  const long sites = ForEveryAllocation(
      [&] {
        return kvarn_quantize(ctx_.get(), &cfg, tiles, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                              rec.data(), rb);
      },
      [&](kvarn_status_t st, long n) {
        if (st == KVARN_OK) return;
        EXPECT_EQ(st, KVARN_ERR_OUT_OF_MEMORY) << "allocation " << n << ": " << kvarn_last_error();
        for (uint8_t b : rec) ASSERT_EQ(b, 0xab) << "allocation " << n;
      },
      [&] { std::fill(rec.begin(), rec.end(), uint8_t{0xab}); });
  EXPECT_GT(sites, 0);
  std::vector<float> kd(k.size()), vd(v.size());
  EXPECT_GT(ForEveryAllocation(
                [&] {
                  return kvarn_dequantize(ctx_.get(), &cfg, tiles, rec.data(), rb, 0,
                                          KVARN_DTYPE_F32, kd.data(), vd.data());
                },
                [&](kvarn_status_t st, long n) {
                  if (st != KVARN_OK) EXPECT_EQ(st, KVARN_ERR_OUT_OF_MEMORY) << n;
                }),
            0);
  std::vector<float> rot(k.size());
  ForEveryAllocation(
      [&] {
        return kvarn_rotate(ctx_.get(), kD, k.size() / kD, KVARN_DTYPE_F32, k.data(),
                            KVARN_DTYPE_F32, rot.data());
      },
      [&](kvarn_status_t st, long n) {
        if (st != KVARN_OK) EXPECT_EQ(st, KVARN_ERR_OUT_OF_MEMORY) << n;
      });
}

INSTANTIATE_TEST_SUITE_P(Threads, FaultInjection, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "_threads";
                         });

TEST(FaultInjectionContext, CreationFailsCleanlyAtEveryAllocation) {
  // A pool of 4 threads: failing the 2nd or 3rd thread's start used to leave started workers
  // waiting on a destroyed condition variable (a hang or std::terminate).
  for (int threads : {2, 4}) {
    const long sites = ForEveryAllocation(
        [&] {
          kvarn_context_options_t o;
          kvarn_context_options_defaults(&o);
          o.backend = KVARN_BACKEND_CPU;
          o.num_threads = threads;
          kvarn_context_t* c = nullptr;
          const kvarn_status_t st = kvarn_context_create(&o, &c);
          if (st == KVARN_OK) kvarn_context_destroy(c);
          return st;
        },
        [&](kvarn_status_t st, long n) {
          if (st != KVARN_OK) {
            EXPECT_EQ(st, KVARN_ERR_OUT_OF_MEMORY) << n << ": " << kvarn_last_error();
          }
        });
    EXPECT_GT(sites, threads - 1);
  }
}

}  // namespace
