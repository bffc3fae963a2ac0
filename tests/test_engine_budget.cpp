// What an engine must reserve per request, per layer and KV head, for N tokens (issue 23's
// compression target, docs/ENGINES.md "Byte budget"): computed from kvarn_record_bytes for the
// memory model of today's layer 2 (two pools) and for the engine-native model (one block pool
// plus a fixed per-request tail state). The ratios are the table of README.md and
// bench/RESULTS.md; this test pins them, so a change of the record format or of the models shows
// up here and in the docs together.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/kvarn_test.h"

namespace {

struct Budget {
  double two_pools;       // today: sink page + records + 2 tail pages reserved per request
  double one_pool;        // engine-native: records of every complete tile + an fp16 tail slot
  double one_pool_tail8;  // the same with an int8 tail slot (row_bits 8; CPU)
};

// Bytes per KV head; N a multiple of nothing in particular. fp16 K+V: 4 * D bytes per token.
Budget Ratios(const kvarn_config_t& cfg, int64_t N, int step_tokens) {
  const int64_t D = cfg.head_dim, G = cfg.tile_tokens, S = cfg.sink_tiles;
  const double fp16 = 4.0 * D * N;
  const double rec = static_cast<double>(kvt::RecordBytes(cfg));
  const double page = 4.0 * D * G;  // one fp16 K+V page of G tokens
  const int64_t complete = N / G;
  // Today (kvarn_cache_create's reservation, and what layer 2 needs with the flush off the
  // critical path): the sink pages, the records of complete tiles past the sink, 2 tail pages.
  const int64_t records = complete > S ? complete - S : 0;
  const double two_pools = S * page + records * rec + 2 * page;
  // Engine-native: every complete tile is a record block (sink 0, or a sink at the layer's
  // preset); the tail slot holds the G - 1 committed tokens of the partial tile plus the step's
  // new ones, rounded up to a multiple of 8 tokens.
  const int64_t tail_tokens = (G - 1 + step_tokens + 7) / 8 * 8;
  kvarn_config_t one_pool_cfg = cfg;
  one_pool_cfg.sink_tiles = 0;
  size_t slot_bytes = 0;  // the experimental size function, for one KV head
  EXPECT_EQ(kvarn_tail_state_bytes(&one_pool_cfg, 1, step_tokens, 16, &slot_bytes), KVARN_OK);
  EXPECT_EQ(slot_bytes, static_cast<size_t>(4 * D * tail_tokens));
  const double one_pool = complete * rec + static_cast<double>(slot_bytes);
  // An int8 tail: D bytes per token per tensor plus an fp16 scale per token and tensor.
  size_t slot8_bytes = 0;
  EXPECT_EQ(kvarn_tail_state_bytes(&one_pool_cfg, 1, step_tokens, 8, &slot8_bytes), KVARN_OK);
  EXPECT_EQ(slot8_bytes, static_cast<size_t>(2 * (D + 2) * tail_tokens));
  const double one_pool_tail8 = complete * rec + static_cast<double>(slot8_bytes);
  return {fp16 / two_pools, fp16 / one_pool, fp16 / one_pool_tail8};
}

TEST(EngineBudget, CompressionCountingEverythingAnEngineReserves) {
  kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  ASSERT_EQ(kvt::RecordBytes(cfg), 13824u);
  const int64_t lens[] = {512, 2048, 8192, 32768};
  // README.md "Memory an engine reserves" (two decimals, as printed there).
  const double want_two_pools[] = {1.10, 2.60, 3.93, 4.51};
  const double want_one_pool[] = {2.17, 3.66, 4.41, 4.65};
  const double want_tail8[] = {2.96, 4.12, 4.57, 4.70};
  const double target[] = {2.4, 3.8, 4.5, 4.7};  // issue 23
  for (int i = 0; i < 4; ++i) {
    const Budget b = Ratios(cfg, lens[i], 1);
    std::printf(
        "N %6lld: two pools %.2fx, one pool + fp16 tail %.2fx, + 8-bit tail %.2fx "
        "(target %.1fx)\n",
        static_cast<long long>(lens[i]), b.two_pools, b.one_pool, b.one_pool_tail8, target[i]);
    EXPECT_NEAR(b.two_pools, want_two_pools[i], 0.005) << lens[i];
    EXPECT_NEAR(b.one_pool, want_one_pool[i], 0.005) << lens[i];
    EXPECT_NEAR(b.one_pool_tail8, want_tail8[i], 0.005) << lens[i];
    // The finding the table states: an fp16 tail slot of G tokens cannot reach the targets.
    EXPECT_LT(b.one_pool, target[i]) << lens[i];
  }
}

TEST(EngineBudget, TheTwoPoolModelMatchesTheManagedCacheReservation) {
  // kvarn_cache_create reserves sink_tiles + 2 pages per sequence and a record pool for
  // max_tokens: with one sequence and max_tokens = N - G (the tiles past the sink), its
  // bytes_capacity per layer and KV head is the two-pool figure above.
  auto ctx = kvt::MakeCpuContext(1);
  for (int64_t N : {512, 2048}) {
    kvarn_cache_options_t opt;
    kvarn_cache_options_defaults(&opt);
    opt.config = kvt::PresetConfig("k4v2_g128", 128);
    opt.num_layers = 1;
    opt.num_kv_heads = 1;
    opt.max_sequences = 1;
    opt.max_tokens = N - 128;
    kvarn_cache_t* cache = nullptr;
    KVT_ASSERT_OK(kvarn_cache_create(ctx.get(), &opt, &cache));
    kvarn_cache_stats_t st;
    st.size = sizeof st;
    KVT_ASSERT_OK(kvarn_cache_get_stats(cache, &st));
    kvarn_cache_destroy(cache);
    const double ratio =
        4.0 * 128 * static_cast<double>(N) / static_cast<double>(st.bytes_capacity);
    EXPECT_NEAR(ratio, Ratios(opt.config, N, 1).two_pools, 1e-9) << N;
  }
}

}  // namespace
