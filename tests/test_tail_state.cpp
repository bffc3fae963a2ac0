// The per-request tail state (kvarn_experimental.h, docs/ENGINES.md): one block pool of records
// plus a fixed-size tail slot per request, append by lengths, a flush of the committed complete
// tiles from device lengths (no host list), attention over blocks and slots. An engine-shaped
// loop with speculative tokens and rollback, sequences finishing and being replaced, runs against
// the managed cache (layer 3) doing the same steps: every attention output and lse is bit-equal.
// CPU; the GPU backend runs the same steps in tests/test_cuda_tail_state.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/fp.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"

namespace {

using kvt::IsError;

constexpr int kD = 128, kHk = 2, kGroup = 2, kHq = kHk * kGroup;
constexpr int kBatch = 6, kMaxStep = 3;

struct PlanDeleter {
  void operator()(kvarn_attention_plan_t* p) const { kvarn_attention_plan_destroy(p); }
};
struct CacheDeleter {
  void operator()(kvarn_cache_t* c) const { kvarn_cache_destroy(c); }
};

std::vector<float> Random(kvt::Rng& rng, size_t n, double scale) {
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(scale * rng.Normal());
  return x;
}

kvarn_config_t SinkFree() {
  kvarn_config_t cfg = kvt::PresetConfig("k4v2_g64", kD);
  cfg.sink_tiles = 0;  // the sink is a block like any other tile
  return cfg;
}

// One layer of the one-pool model and its per-sequence metadata (host memory: CPU context).
struct OnePool {
  OnePool(const kvarn_config_t& cfg, int max_blocks, int max_step = kMaxStep, int row_bits = 16)
      : cfg(cfg),
        G(cfg.tile_tokens),
        max_blocks(max_blocks),
        max_step(max_step),
        row_bits(row_bits) {
    record_stride = kvt::RecordBytes(cfg);
    num_blocks = kBatch * max_blocks;
    records.assign(static_cast<size_t>(num_blocks) * kHk * record_stride, 0xA5);
    EXPECT_EQ(kvarn_tail_state_bytes(&cfg, kHk, max_step, row_bits, &slot_bytes), KVARN_OK);
    states.assign(kBatch * slot_bytes / 2, 0x7e00);  // NaN: rows past a sequence are never read
    table.assign(static_cast<size_t>(kBatch) * max_blocks, -1);  // -1: no block yet
    lens.assign(kBatch, 0);
    committed.assign(kBatch, 0);
    rtiles.assign(kBatch, 0);
    slots.resize(kBatch);
    for (int b = 0; b < kBatch; ++b) slots[b] = kBatch - 1 - b;  // any assignment works
    for (int r = num_blocks - 1; r >= 0; --r) free_blocks.push_back(r);
  }
  kvarn_paged_kv_t View() {
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = kHk;
    kv.batch = kBatch;
    kv.records = records.data();
    kv.record_stride = record_stride;
    kv.num_record_blocks = num_blocks;
    kv.block_table = table.data();
    kv.max_blocks_per_seq = max_blocks;
    kv.seq_lens = lens.data();
    kv.record_tiles = rtiles.data();
    return kv;
  }
  kvarn_tail_state_t Tail() {
    kvarn_tail_state_t t;
    kvarn_tail_state_defaults(&t);
    t.states = states.data();
    t.slot_bytes = slot_bytes;
    t.max_step_tokens = max_step;
    t.num_slots = kBatch;
    t.slots = slots.data();
    t.row_bits = row_bits;
    return t;
  }
  int32_t& Entry(int b, int tile) { return table[static_cast<size_t>(b) * max_blocks + tile]; }
  // A block for each tile that tokens [lens, lens + n) touch (kept across a rollback).
  void Reserve(int b, int n) {
    if (n <= 0) return;
    for (int64_t tile = lens[b] / G; tile <= (lens[b] + n - 1) / G; ++tile) {
      int32_t& e = Entry(b, static_cast<int>(tile));
      if (e >= 0) continue;
      ASSERT_FALSE(free_blocks.empty());
      e = free_blocks.back();
      free_blocks.pop_back();
    }
  }
  void Release(int b) {
    for (int t = 0; t < max_blocks; ++t) {
      if (Entry(b, t) >= 0) free_blocks.push_back(Entry(b, t));
      Entry(b, t) = -1;
    }
    lens[b] = committed[b] = rtiles[b] = 0;
  }

  kvarn_config_t cfg;
  int G, max_blocks, max_step, row_bits, num_blocks;
  size_t record_stride, slot_bytes = 0;
  std::vector<uint8_t> records;
  std::vector<uint16_t> states;
  std::vector<int32_t> table, lens, committed, rtiles, slots, free_blocks;
};

TEST(TailState, SpeculativeLoopMatchesTheManagedCache) {
  // 250 steps of 6 sequences: each appends 1..3 tokens (a token and up to 2 drafts), attends
  // (extend: one query per new token), keeps 1..n of them (the rest is rolled back by a length
  // change) and flushes its committed complete tiles; a sequence finishes at 150..260 tokens and
  // a new one takes its slot. The managed cache does the same with speculative appends, commit
  // and truncate: outputs and lse agree bit for bit every step.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = SinkFree();
  const int G = cfg.tile_tokens, max_len = 260, max_blocks = (max_len + kMaxStep) / G + 1;
  OnePool pool(cfg, max_blocks);
  kvarn_cache_options_t opt;
  kvarn_cache_options_defaults(&opt);
  opt.config = cfg;
  opt.num_layers = 1;
  opt.num_kv_heads = kHk;
  opt.max_tokens = kBatch * (max_len + G);
  opt.max_sequences = kBatch;
  kvarn_cache_t* raw_cache = nullptr;
  KVT_ASSERT_OK(kvarn_cache_create(ctx.get(), &opt, &raw_cache));
  std::unique_ptr<kvarn_cache_t, CacheDeleter> cache(raw_cache);
  std::vector<int64_t> ids(kBatch), target(kBatch);
  int64_t next_id = 100;
  for (int b = 0; b < kBatch; ++b) {
    ids[b] = next_id++;
    target[b] = rng.Int(150, max_len);
    KVT_ASSERT_OK(kvarn_cache_add_sequence(cache.get(), ids[b]));
  }
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = max_blocks;
  shape.max_q_per_seq = kMaxStep;
  shape.max_total_q = kBatch * kMaxStep;
  kvarn_attention_plan_t* raw_plan = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &cfg, &shape, &ap, &raw_plan));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw_plan);
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_workspace_size(&cfg, kHk, kBatch, kMaxStep, &ws_bytes));
  std::vector<uint8_t> ws(ws_bytes);
  std::vector<int32_t> status(kBatch, 0);
  int flushed_tiles = 0, rolled_back = 0, finished = 0;
  for (int step = 0; step < 250; ++step) {
    // Finished sequences leave; a new one takes the slot.
    for (int b = 0; b < kBatch; ++b) {
      if (pool.committed[b] < target[b]) continue;
      pool.Release(b);
      KVT_ASSERT_OK(kvarn_cache_remove_sequence(cache.get(), ids[b]));
      ids[b] = next_id++;
      target[b] = rng.Int(150, max_len);
      KVT_ASSERT_OK(kvarn_cache_add_sequence(cache.get(), ids[b]));
      ++finished;
    }
    std::vector<int32_t> indptr(kBatch + 1, 0), n_new(kBatch);
    for (int b = 0; b < kBatch; ++b) {
      n_new[b] = static_cast<int32_t>(rng.Int(1, kMaxStep));
      indptr[b + 1] = indptr[b] + n_new[b];
    }
    const size_t tokens = static_cast<size_t>(indptr[kBatch]);
    const auto k = Random(rng, tokens * kHk * kD, 2.0), v = Random(rng, tokens * kHk * kD, 1.0);
    const auto q = Random(rng, tokens * kHq * kD, 0.3);
    // The one-pool step: lengths after the append, append, attention.
    for (int b = 0; b < kBatch; ++b) {
      pool.Reserve(b, n_new[b]);
      pool.lens[b] += n_new[b];
    }
    kvarn_paged_kv_t kv = pool.View();
    kvarn_tail_state_t tail = pool.Tail();
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.seq_status = status.data();
    KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(),
                                              tokens, KVARN_DTYPE_F32, k.data(), v.data()));
    std::vector<float> out(static_cast<size_t>(shape.max_total_q) * kHq * kD),
        lse(static_cast<size_t>(shape.max_total_q) * kHq);
    KVT_ASSERT_OK(kvarn_paged_attention_tail_run(ctx.get(), plan.get(), &kv, &tail, &launch,
                                                 indptr.data(), q.data(), out.data(), lse.data()));
    // The managed cache: speculative appends, attention over the same queries.
    for (int b = 0; b < kBatch; ++b) {
      KVT_ASSERT_OK(kvarn_cache_append(cache.get(), ids[b], 0, n_new[b], KVARN_DTYPE_F32,
                                       k.data() + static_cast<size_t>(indptr[b]) * kHk * kD,
                                       v.data() + static_cast<size_t>(indptr[b]) * kHk * kD,
                                       KVARN_APPEND_SPECULATIVE));
    }
    std::vector<float> ref_out(out.size()), ref_lse(lse.size());
    kvarn_attention_params_t cap = ap;
    cap.q_indptr = indptr.data();
    KVT_ASSERT_OK(kvarn_cache_attention(cache.get(), 0, kBatch, ids.data(), &cap, q.data(),
                                        ref_out.data(), ref_lse.data()));
    ASSERT_EQ(std::memcmp(out.data(), ref_out.data(), tokens * kHq * kD * 4), 0) << "step " << step;
    ASSERT_EQ(std::memcmp(lse.data(), ref_lse.data(), tokens * kHq * 4), 0) << "step " << step;
    // Verification keeps 1..n_new tokens: commit them, roll the rest back (a length change),
    // then flush the committed complete tiles from the lengths.
    for (int b = 0; b < kBatch; ++b) {
      const int keep = static_cast<int>(rng.Int(1, n_new[b]));
      rolled_back += n_new[b] - keep;
      pool.committed[b] += keep;
      pool.lens[b] = pool.committed[b];
      KVT_ASSERT_OK(kvarn_cache_commit(cache.get(), ids[b], pool.committed[b]));
      KVT_ASSERT_OK(kvarn_cache_truncate(cache.get(), ids[b], pool.committed[b]));
    }
    const std::vector<int32_t> rt_before = pool.rtiles;
    launch.workspace = ws.data();
    launch.workspace_bytes = ws.size();
    KVT_ASSERT_OK(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                             pool.committed.data(), pool.rtiles.data()));
    for (int b = 0; b < kBatch; ++b) {
      ASSERT_EQ(pool.rtiles[b], pool.committed[b] / G) << "step " << step << " sequence " << b;
      flushed_tiles += pool.rtiles[b] - rt_before[b];
    }
    ASSERT_EQ(status, std::vector<int32_t>(kBatch, 0)) << "step " << step;
  }
  EXPECT_GT(flushed_tiles, 20);
  EXPECT_GT(rolled_back, 100);
  EXPECT_GT(finished, 3);
}

TEST(TailState, ChunkedPrefillMixedWithDecodeMatchesTheManagedCache) {
  // Slots sized for 64 tokens a step: each new request prefills a 100..300-token prompt in
  // chunks of up to 64 tokens while the other sequences decode one token a step, all in one
  // extend call per step (append, flush, attention); a request finishes after 20..60 decoded
  // tokens and a new prompt takes its slot. Against the managed cache doing the same appends:
  // outputs and lse bit-equal.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = SinkFree();
  constexpr int kChunk = 64;
  const int G = cfg.tile_tokens, max_len = 360, max_blocks = max_len / G + 2;
  OnePool pool(cfg, max_blocks, kChunk);
  kvarn_cache_options_t opt;
  kvarn_cache_options_defaults(&opt);
  opt.config = cfg;
  opt.num_layers = 1;
  opt.num_kv_heads = kHk;
  opt.max_tokens = kBatch * (max_len + 2 * G);
  opt.max_sequences = kBatch;
  kvarn_cache_t* raw_cache = nullptr;
  KVT_ASSERT_OK(kvarn_cache_create(ctx.get(), &opt, &raw_cache));
  std::unique_ptr<kvarn_cache_t, CacheDeleter> cache(raw_cache);
  std::vector<int64_t> ids(kBatch), prompt(kBatch), target(kBatch);
  int64_t next_id = 1;
  const auto start = [&](int b) {
    ids[b] = next_id++;
    prompt[b] = rng.Int(100, 300);
    target[b] = prompt[b] + rng.Int(20, 60);
    return kvarn_cache_add_sequence(cache.get(), ids[b]);
  };
  for (int b = 0; b < kBatch; ++b) KVT_ASSERT_OK(start(b));
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = max_blocks;
  shape.max_q_per_seq = kChunk;
  shape.max_total_q = kBatch * kChunk;
  kvarn_attention_plan_t* raw_plan = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &cfg, &shape, &ap, &raw_plan));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw_plan);
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_workspace_size(&cfg, kHk, kBatch, kChunk, &ws_bytes));
  std::vector<uint8_t> ws(ws_bytes);
  int mixed_steps = 0, finished = 0;
  for (int step = 0; step < 200; ++step) {
    for (int b = 0; b < kBatch; ++b) {
      if (pool.lens[b] < target[b]) continue;
      pool.Release(b);
      KVT_ASSERT_OK(kvarn_cache_remove_sequence(cache.get(), ids[b]));
      KVT_ASSERT_OK(start(b));
      ++finished;
    }
    std::vector<int32_t> indptr(kBatch + 1, 0), n_new(kBatch);
    int prefilling = 0;
    for (int b = 0; b < kBatch; ++b) {
      const int64_t left = prompt[b] - pool.lens[b];
      n_new[b] = left > 0 ? static_cast<int32_t>(std::min<int64_t>(left, rng.Int(1, kChunk))) : 1;
      prefilling += left > 0;
      indptr[b + 1] = indptr[b] + n_new[b];
    }
    mixed_steps += prefilling > 0 && prefilling < kBatch;
    const size_t tokens = static_cast<size_t>(indptr[kBatch]);
    const auto k = Random(rng, tokens * kHk * kD, 2.0), v = Random(rng, tokens * kHk * kD, 1.0);
    const auto q = Random(rng, tokens * kHq * kD, 0.3);
    for (int b = 0; b < kBatch; ++b) {
      pool.Reserve(b, n_new[b]);
      pool.lens[b] += n_new[b];
    }
    kvarn_paged_kv_t kv = pool.View();
    kvarn_tail_state_t tail = pool.Tail();
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(),
                                              tokens, KVARN_DTYPE_F32, k.data(), v.data()));
    // The tokens are committed at once: flush before attention, which then reads this step's
    // completed tiles as records, as the managed cache does.
    pool.committed = pool.lens;
    launch.workspace = ws.data();
    launch.workspace_bytes = ws.size();
    KVT_ASSERT_OK(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                             pool.committed.data(), pool.rtiles.data()));
    std::vector<float> out(static_cast<size_t>(shape.max_total_q) * kHq * kD),
        lse(static_cast<size_t>(shape.max_total_q) * kHq);
    KVT_ASSERT_OK(kvarn_paged_attention_tail_run(ctx.get(), plan.get(), &kv, &tail, &launch,
                                                 indptr.data(), q.data(), out.data(), lse.data()));
    for (int b = 0; b < kBatch; ++b) {
      ASSERT_EQ(pool.rtiles[b], pool.lens[b] / G);
      KVT_ASSERT_OK(kvarn_cache_append(cache.get(), ids[b], 0, n_new[b], KVARN_DTYPE_F32,
                                       k.data() + static_cast<size_t>(indptr[b]) * kHk * kD,
                                       v.data() + static_cast<size_t>(indptr[b]) * kHk * kD,
                                       KVARN_APPEND_DEFAULT));
    }
    std::vector<float> ref_out(out.size()), ref_lse(lse.size());
    kvarn_attention_params_t cap = ap;
    cap.q_indptr = indptr.data();
    KVT_ASSERT_OK(kvarn_cache_attention(cache.get(), 0, kBatch, ids.data(), &cap, q.data(),
                                        ref_out.data(), ref_lse.data()));
    ASSERT_EQ(std::memcmp(out.data(), ref_out.data(), tokens * kHq * kD * 4), 0) << "step " << step;
    ASSERT_EQ(std::memcmp(lse.data(), ref_lse.data(), tokens * kHq * 4), 0) << "step " << step;
  }
  EXPECT_GT(mixed_steps, 20);
  EXPECT_GT(finished, 5);
}

TEST(TailState, PrefixBlocksAreSharedMovedAndRecomputedBitForBit) {
  // The engine operations of the one-pool model on three slots of one batch, all fed the same
  // tokens and queries once aligned, attending in one call each step:
  //   A: a request growing from 0 tokens;
  //   B: a prefix-cache hit: its table names A's first blocks (sink included: sink 0), its slot
  //      starts empty; it catches up with A's tokens past the prefix, then follows A;
  //   C: A's blocks and slot copied to other block ids and another slot (a KV connector moving
  //      the request), later preempted (released) and recomputed from A's token history.
  // Every step the three sequences' outputs and lse are bit-equal; the shared blocks never
  // change (no flush writes a block it does not own).
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = SinkFree();
  const int G = cfg.tile_tokens;
  OnePool pool(cfg, 8);
  constexpr int A = 0, B = 2, C = 4;  // the other slots are padding (no tokens)
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = pool.max_blocks;
  shape.max_q_per_seq = kMaxStep;
  shape.max_total_q = kBatch * kMaxStep;
  kvarn_attention_plan_t* raw_plan = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &cfg, &shape, &ap, &raw_plan));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw_plan);
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_workspace_size(&cfg, kHk, kBatch, kMaxStep, &ws_bytes));
  std::vector<uint8_t> ws(ws_bytes);
  const size_t row = static_cast<size_t>(kHk) * kD;
  std::vector<float> hist_k, hist_v;  // A's tokens, [n][Hk][D]

  // One step: sequence b appends tokens [from, from + n[b]) of A's history (fresh tokens are
  // drawn for A first); returns the outputs [token][Hq][D] and lse per sequence.
  struct Result {
    std::vector<std::vector<float>> out, lse;
  };
  const auto step = [&](const std::vector<int>& n, const std::vector<int64_t>& from, Result* r) {
    std::vector<int32_t> indptr(kBatch + 1, 0);
    for (int b = 0; b < kBatch; ++b) indptr[b + 1] = indptr[b] + n[b];
    const size_t tokens = static_cast<size_t>(indptr[kBatch]);
    std::vector<float> k(tokens * row), v(tokens * row);
    const auto q1 = Random(rng, static_cast<size_t>(kMaxStep) * kHq * kD, 0.3);
    std::vector<float> q(tokens * kHq * kD);
    for (int b = 0; b < kBatch; ++b) {
      for (int i = 0; i < n[b]; ++i) {
        const size_t t = static_cast<size_t>(indptr[b]) + i, src = from[b] + i;
        if (src * row >= hist_k.size()) {  // A's new token
          const auto nk = Random(rng, row, 2.0), nv = Random(rng, row, 1.0);
          hist_k.insert(hist_k.end(), nk.begin(), nk.end());
          hist_v.insert(hist_v.end(), nv.begin(), nv.end());
        }
        std::copy_n(hist_k.data() + src * row, row, k.data() + t * row);
        std::copy_n(hist_v.data() + src * row, row, v.data() + t * row);
        // The query of position `src`: the same for every sequence at that position.
        std::copy_n(q1.data() + static_cast<size_t>(i) * kHq * kD, kHq * kD,
                    q.data() + t * kHq * kD);
      }
      pool.Reserve(b, n[b]);
      pool.lens[b] += n[b];
    }
    kvarn_paged_kv_t kv = pool.View();
    kvarn_tail_state_t tail = pool.Tail();
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(),
                                              tokens, KVARN_DTYPE_F32, k.data(), v.data()));
    std::vector<float> out(static_cast<size_t>(shape.max_total_q) * kHq * kD),
        lse(static_cast<size_t>(shape.max_total_q) * kHq);
    KVT_ASSERT_OK(kvarn_paged_attention_tail_run(ctx.get(), plan.get(), &kv, &tail, &launch,
                                                 indptr.data(), q.data(), out.data(), lse.data()));
    r->out.assign(kBatch, {});
    r->lse.assign(kBatch, {});
    for (int b = 0; b < kBatch; ++b) {
      r->out[b].assign(out.begin() + static_cast<size_t>(indptr[b]) * kHq * kD,
                       out.begin() + static_cast<size_t>(indptr[b + 1]) * kHq * kD);
      r->lse[b].assign(lse.begin() + static_cast<size_t>(indptr[b]) * kHq,
                       lse.begin() + static_cast<size_t>(indptr[b + 1]) * kHq);
    }
    pool.committed = pool.lens;
    launch.workspace = ws.data();
    launch.workspace_bytes = ws.size();
    KVT_ASSERT_OK(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                             pool.committed.data(), pool.rtiles.data()));
  };
  const auto grow = [&](int b, int64_t target) {  // b catches up with A's history
    while (pool.lens[b] < target) {
      std::vector<int> n(kBatch, 0);
      std::vector<int64_t> from(kBatch, 0);
      n[b] = static_cast<int>(std::min<int64_t>(kMaxStep, target - pool.lens[b]));
      from[b] = pool.lens[b];
      Result r;
      step(n, from, &r);
    }
  };
  // Copies sequence `src` into slot `dst` with fresh blocks (a KV connector moving it).
  const auto move = [&](int src, int dst) {
    pool.Release(dst);
    for (int t = 0; t < pool.rtiles[src]; ++t) {
      const int32_t to = pool.free_blocks.back();
      pool.free_blocks.pop_back();
      pool.Entry(dst, t) = to;
      const size_t bytes = kHk * pool.record_stride;
      std::memcpy(pool.records.data() + to * bytes,
                  pool.records.data() + static_cast<size_t>(pool.Entry(src, t)) * bytes, bytes);
    }
    const size_t slot = pool.slot_bytes / 2;
    std::copy_n(pool.states.begin() + pool.slots[src] * slot, slot,
                pool.states.begin() + pool.slots[dst] * slot);
    pool.lens[dst] = pool.lens[src];
    pool.committed[dst] = pool.committed[src];
    pool.rtiles[dst] = pool.rtiles[src];
  };

  grow(A, 200);  // 3 complete tiles (blocks) and 8 tail rows
  ASSERT_EQ(pool.rtiles[A], 3);
  // B: a prefix hit on A's 3 blocks.
  for (int t = 0; t < 3; ++t) pool.Entry(B, t) = pool.Entry(A, t);
  pool.lens[B] = pool.committed[B] = 3 * G;
  pool.rtiles[B] = 3;
  std::vector<std::vector<uint8_t>> prefix;
  for (int t = 0; t < 3; ++t) {
    const uint8_t* p =
        pool.records.data() + static_cast<size_t>(pool.Entry(A, t)) * kHk * pool.record_stride;
    prefix.emplace_back(p, p + kHk * pool.record_stride);
  }
  grow(B, 200);
  move(A, C);
  int compared = 0;
  for (int s = 0; s < 120; ++s) {
    if (s == 60) {  // C is preempted and recomputed from A's tokens
      pool.Release(C);
      const int64_t len = pool.lens[A];
      grow(C, len);
      ASSERT_EQ(pool.rtiles[C], pool.rtiles[A]);
    }
    const int n = static_cast<int>(rng.Int(1, kMaxStep));
    std::vector<int> ns(kBatch, 0);
    std::vector<int64_t> from(kBatch, 0);
    for (int b : {A, B, C}) {
      ns[b] = n;
      from[b] = pool.lens[A];
    }
    Result r;
    step(ns, from, &r);
    for (int b : {B, C}) {
      ASSERT_EQ(r.out[b], r.out[A]) << "step " << s << " sequence " << b;
      ASSERT_EQ(r.lse[b], r.lse[A]) << "step " << s << " sequence " << b;
    }
    ++compared;
  }
  EXPECT_EQ(compared, 120);
  EXPECT_GE(pool.rtiles[A], 6);
  for (int t = 0; t < 3; ++t) {
    const uint8_t* p =
        pool.records.data() + static_cast<size_t>(pool.Entry(A, t)) * kHk * pool.record_stride;
    EXPECT_TRUE(std::equal(prefix[t].begin(), prefix[t].end(), p)) << "shared block " << t;
  }
}

// The bytes of the rows of sequence b's slot that hold tokens ([0, lens - rtiles * G)), K and V
// of every head: fp16 rows, or int8 codes and fp16 scales (kvarn_experimental.h's layout).
std::vector<uint8_t> SlotRows(const OnePool& p, int b) {
  const size_t rows = static_cast<size_t>(p.lens[b] - int64_t{p.rtiles[b]} * p.G);
  const size_t value_bytes = p.row_bits == 8 ? 1 : 2;
  const size_t row_bytes = p.row_bits == 8 ? kD + 2 : 2 * kD;
  const size_t cap = p.slot_bytes / (2 * kHk * row_bytes);
  const uint8_t* slot = reinterpret_cast<const uint8_t*>(p.states.data()) +
                        static_cast<size_t>(p.slots[b]) * p.slot_bytes;
  std::vector<uint8_t> out;
  for (size_t head = 0; head < 2 * kHk; ++head) {  // K heads, then V heads
    const uint8_t* values = slot + head * cap * kD * value_bytes;
    out.insert(out.end(), values, values + rows * kD * value_bytes);
    if (p.row_bits == 8) {
      const uint8_t* scales = slot + 2 * kHk * cap * kD + head * cap * 2;
      out.insert(out.end(), scales, scales + rows * 2);
    }
  }
  return out;
}

// The tail slot's row format: fp16 rows (16) or int8 rows with an fp16 scale (8).
class TailRowBits : public ::testing::TestWithParam<int> {};

TEST_P(TailRowBits, AppendFlushEqualsAppendThenFlushWithALargeSlot) {
  // Two copies of one engine: `wide` has slots for 320 tokens a step and runs append, flush;
  // `narrow` has slots for 4 (decode with 3 drafts) and runs kvarn_paged_append_flush_tail_run,
  // one call for any prefill chunk. Each step mixes prefill chunks of 1..320 tokens (committed
  // at once) with speculative steps of 1..4 tokens (committed after attention: 1..n kept, the
  // rest rolled back, then a flush, in `narrow` the same call with no tokens); sequences finish
  // and new prompts take their slots. Every step: attention outputs and lse, record_tiles, the
  // records of every block and the slot rows bit-equal between the two.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = SinkFree();
  constexpr int kChunk = 320, kSpec = 4;
  const int G = cfg.tile_tokens, max_len = 1100, max_blocks = (max_len + kChunk) / G + 2;
  OnePool wide(cfg, max_blocks, kChunk, GetParam()), narrow(cfg, max_blocks, kSpec, GetParam());
  ASSERT_LT(narrow.slot_bytes * 4, wide.slot_bytes);
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = max_blocks;
  shape.max_q_per_seq = kChunk;
  shape.max_total_q = kBatch * kChunk;
  kvarn_attention_plan_t* raw_plan = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &cfg, &shape, &ap, &raw_plan));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw_plan);
  size_t wide_ws = 0, narrow_ws = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_workspace_size(&cfg, kHk, kBatch, kChunk, &wide_ws));
  KVT_ASSERT_OK(kvarn_paged_append_flush_tail_workspace_size(&cfg, kHk, kBatch, kSpec,
                                                             shape.max_total_q, &narrow_ws));
  std::vector<uint8_t> ws_w(wide_ws), ws_n(narrow_ws);
  std::vector<int64_t> prompt(kBatch), target(kBatch);
  const auto start = [&](int b) {
    prompt[b] = rng.Int(1, 700);
    target[b] = prompt[b] + rng.Int(10, 200);
  };
  for (int b = 0; b < kBatch; ++b) start(b);
  int long_chunks = 0, rolled_back = 0, finished = 0;
  for (int step = 0; step < 160; ++step) {
    for (int b = 0; b < kBatch; ++b) {
      if (narrow.committed[b] < target[b]) continue;
      wide.Release(b);
      narrow.Release(b);
      start(b);
      ++finished;
    }
    std::vector<int32_t> indptr(kBatch + 1, 0), n_new(kBatch);
    std::vector<char> prefill(kBatch);
    for (int b = 0; b < kBatch; ++b) {
      const int64_t left = prompt[b] - narrow.lens[b];
      prefill[b] = left > 0;
      n_new[b] = static_cast<int32_t>(prefill[b] ? std::min<int64_t>(left, rng.Int(1, kChunk))
                                                 : rng.Int(1, kSpec));
      long_chunks += n_new[b] > narrow.G;
      indptr[b + 1] = indptr[b] + n_new[b];
    }
    const size_t tokens = static_cast<size_t>(indptr[kBatch]);
    const auto k = Random(rng, tokens * kHk * kD, 2.0), v = Random(rng, tokens * kHk * kD, 1.0);
    const auto q = Random(rng, tokens * kHq * kD, 0.3);
    for (OnePool* p : {&wide, &narrow}) {
      for (int b = 0; b < kBatch; ++b) {
        p->Reserve(b, n_new[b]);
        p->lens[b] += n_new[b];
        if (prefill[b]) p->committed[b] = p->lens[b];  // a prompt chunk is committed at once
      }
    }
    std::vector<std::vector<float>> outs, lses;
    for (OnePool* p : {&wide, &narrow}) {
      kvarn_paged_kv_t kv = p->View();
      kvarn_tail_state_t tail = p->Tail();
      kvarn_launch_t launch;
      kvarn_launch_defaults(&launch);
      std::vector<uint8_t>& ws = p == &wide ? ws_w : ws_n;
      launch.workspace = ws.data();
      launch.workspace_bytes = ws.size();
      if (p == &wide) {
        KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                                  indptr.data(), tokens, KVARN_DTYPE_F32, k.data(),
                                                  v.data()));
        KVT_ASSERT_OK(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                                 p->committed.data(), p->rtiles.data()));
      } else {
        KVT_ASSERT_OK(kvarn_paged_append_flush_tail_run(
            ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(), tokens, KVARN_DTYPE_F32, k.data(),
            v.data(), p->committed.data(), p->rtiles.data()));
      }
      std::vector<float> out(tokens * kHq * kD), lse(tokens * kHq);
      KVT_ASSERT_OK(kvarn_paged_attention_tail_run(ctx.get(), plan.get(), &kv, &tail, &launch,
                                                   indptr.data(), q.data(), out.data(),
                                                   lse.data()));
      outs.push_back(out);
      lses.push_back(lse);
    }
    ASSERT_EQ(outs[0], outs[1]) << "step " << step;
    ASSERT_EQ(lses[0], lses[1]) << "step " << step;
    // Verification of the speculative steps, then the flush of what it committed.
    for (int b = 0; b < kBatch; ++b) {
      if (prefill[b]) continue;
      const int keep = static_cast<int>(rng.Int(1, n_new[b]));
      rolled_back += n_new[b] - keep;
      for (OnePool* p : {&wide, &narrow}) {
        p->committed[b] += keep;
        p->lens[b] = p->committed[b];
      }
    }
    for (OnePool* p : {&wide, &narrow}) {
      kvarn_paged_kv_t kv = p->View();
      kvarn_tail_state_t tail = p->Tail();
      kvarn_launch_t launch;
      kvarn_launch_defaults(&launch);
      std::vector<uint8_t>& ws = p == &wide ? ws_w : ws_n;
      launch.workspace = ws.data();
      launch.workspace_bytes = ws.size();
      if (p == &wide) {
        KVT_ASSERT_OK(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                                 p->committed.data(), p->rtiles.data()));
      } else {  // no tokens: a flush
        KVT_ASSERT_OK(kvarn_paged_append_flush_tail_run(
            ctx.get(), &cfg, &kv, &tail, &launch, nullptr, 0, KVARN_DTYPE_F32, nullptr, nullptr,
            p->committed.data(), p->rtiles.data()));
      }
    }
    ASSERT_EQ(wide.rtiles, narrow.rtiles) << "step " << step;
    for (int b = 0; b < kBatch; ++b) {
      ASSERT_EQ(narrow.rtiles[b], narrow.committed[b] / G) << "step " << step;
      ASSERT_EQ(SlotRows(wide, b), SlotRows(narrow, b)) << "step " << step << " sequence " << b;
      for (int tile = 0; tile < narrow.rtiles[b]; ++tile) {
        const size_t at = static_cast<size_t>(narrow.Entry(b, tile)) * kHk * narrow.record_stride;
        ASSERT_EQ(std::memcmp(wide.records.data() + at, narrow.records.data() + at,
                              kHk * narrow.record_stride),
                  0)
            << "step " << step << " sequence " << b << " tile " << tile;
      }
    }
  }
  EXPECT_GT(long_chunks, 20);
  EXPECT_GT(rolled_back, 50);
  EXPECT_GT(finished, 3);
}

INSTANTIATE_TEST_SUITE_P(Rows, TailRowBits, ::testing::Values(16, 8),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return i.param == 8 ? std::string("int8") : std::string("fp16");
                         });

TEST(TailState, Int8RowsFollowTheFormat) {
  // Appended rows in an int8 slot are, byte for byte, the format of kvarn_experimental.h applied
  // to the fp16 cache-frame row (kvarn_rotate to fp16): scale = fp16(max |r| / 127), codes =
  // rint(r / scale) clamped to [-127, 127]. Values span a wide range (a 1000x outlier row).
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(1);
  const kvarn_config_t cfg = SinkFree();
  OnePool pool(cfg, 2, 40, 8);
  ASSERT_EQ(pool.slot_bytes, 2u * kHk * 104 * (kD + 2));  // cap = 63 + 40 rounded up to 104
  const int n = 37;
  std::vector<int32_t> indptr(kBatch + 1, 0);
  indptr[1] = n;
  for (int b = 1; b <= kBatch; ++b) indptr[b] = n;
  pool.lens[0] = n;
  auto k = Random(rng, static_cast<size_t>(n) * kHk * kD, 1.0);
  auto v = Random(rng, k.size(), 0.01);
  for (int d = 0; d < kD; ++d) k[static_cast<size_t>(5 * kHk) * kD + d] *= 1000.f;
  kvarn_paged_kv_t kv = pool.View();
  kvarn_tail_state_t tail = pool.Tail();
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(), n,
                                            KVARN_DTYPE_F32, k.data(), v.data()));
  std::vector<uint8_t> want;
  for (int which = 0; which < 2; ++which) {
    for (int h = 0; h < kHk; ++h) {
      std::vector<float> rows(static_cast<size_t>(n) * kD);
      for (int t = 0; t < n; ++t) {
        std::memcpy(rows.data() + static_cast<size_t>(t) * kD,
                    (which ? v : k).data() + (static_cast<size_t>(t) * kHk + h) * kD, 4 * kD);
      }
      std::vector<uint16_t> r16(rows.size());
      KVT_ASSERT_OK(kvarn_rotate(ctx.get(), kD, n, KVARN_DTYPE_F32, rows.data(), KVARN_DTYPE_F16,
                                 r16.data()));
      for (int t = 0; t < n; ++t) {
        float amax = 0.f;
        for (int d = 0; d < kD; ++d)
          amax = std::max(amax, std::fabs(kvt::HalfToFloat(r16[t * kD + d])));
        const uint16_t scale_h = kvt::FloatToHalf(amax / 127.f);
        const float scale = kvt::HalfToFloat(scale_h);
        for (int d = 0; d < kD; ++d) {
          const float q = std::nearbyint(kvt::HalfToFloat(r16[t * kD + d]) / scale);
          want.push_back(static_cast<uint8_t>(static_cast<int8_t>(std::clamp(q, -127.f, 127.f))));
        }
        want.push_back(static_cast<uint8_t>(scale_h & 0xff));
        want.push_back(static_cast<uint8_t>(scale_h >> 8));
      }
    }
  }
  // SlotRows gives, per head, the codes of the rows then their scales: reorder `want` to match.
  std::vector<uint8_t> want_layout;
  for (size_t head = 0; head < 2 * kHk; ++head) {
    const uint8_t* rows = want.data() + head * n * (kD + 2);
    for (int t = 0; t < n; ++t)
      want_layout.insert(want_layout.end(), rows + t * (kD + 2), rows + t * (kD + 2) + kD);
    for (int t = 0; t < n; ++t)
      want_layout.insert(want_layout.end(), rows + t * (kD + 2) + kD, rows + t * (kD + 2) + kD + 2);
  }
  EXPECT_EQ(SlotRows(pool, 0), want_layout);
}

TEST(TailState, Int8RowsStayCloseToFp16Rows) {
  // Attention over tail rows only (every sequence shorter than a tile: no record yet), the same
  // tokens in an fp16 and an int8 slot: the outputs differ by the int8 rows' rounding alone.
  // (Past the first tile the records are quantized from the int8 rows, and a 2-4-bit record
  // magnifies a small change of its input into whole-step code changes: how much that costs is
  // an accuracy question, measured on a real model in docs/ENGINES.md.)
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = SinkFree();
  const int G = cfg.tile_tokens;
  OnePool f16(cfg, 2, G, 16), i8(cfg, 2, G, 8);
  EXPECT_LT(static_cast<double>(i8.slot_bytes), 0.52 * static_cast<double>(f16.slot_bytes));
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = 2;
  shape.max_q_per_seq = G;
  shape.max_total_q = kBatch * G;
  kvarn_attention_plan_t* raw_plan = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &cfg, &shape, &ap, &raw_plan));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw_plan);
  std::vector<int32_t> indptr(kBatch + 1, 0);
  for (int b = 0; b < kBatch; ++b) indptr[b + 1] = indptr[b] + static_cast<int>(rng.Int(1, G - 1));
  const size_t tokens = static_cast<size_t>(indptr[kBatch]);
  const auto k = Random(rng, tokens * kHk * kD, 2.0), v = Random(rng, tokens * kHk * kD, 1.0);
  const auto q = Random(rng, tokens * kHq * kD, 0.3);
  std::vector<std::vector<float>> outs;
  for (OnePool* p : {&f16, &i8}) {
    for (int b = 0; b < kBatch; ++b) {
      p->Reserve(b, indptr[b + 1] - indptr[b]);
      p->lens[b] = indptr[b + 1] - indptr[b];
    }
    kvarn_paged_kv_t kv = p->View();
    kvarn_tail_state_t tail = p->Tail();
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(),
                                              tokens, KVARN_DTYPE_F32, k.data(), v.data()));
    std::vector<float> out(tokens * kHq * kD);
    KVT_ASSERT_OK(kvarn_paged_attention_tail_run(ctx.get(), plan.get(), &kv, &tail, &launch,
                                                 indptr.data(), q.data(), out.data(), nullptr));
    outs.push_back(out);
  }
  double worst_row = 0, sum_err = 0, sum_ref = 0;
  for (size_t r = 0; r < tokens * kHq; ++r) {
    double norm = 0, err = 0;
    for (int d = 0; d < kD; ++d) {
      const double a = outs[0][r * kD + d], b = outs[1][r * kD + d];
      norm = std::max(norm, std::fabs(a));
      err = std::max(err, std::fabs(a - b));
      sum_err += (a - b) * (a - b);
      sum_ref += a * a;
    }
    worst_row = std::max(worst_row, err / norm);
  }
  const double rel_l2 = std::sqrt(sum_err / sum_ref);
  std::printf("int8 vs fp16 tail rows: worst row %.2e, relative L2 %.2e\n", worst_row, rel_l2);
  EXPECT_GT(rel_l2, 0.0);   // the int8 rows are not the fp16 ones
  EXPECT_LT(rel_l2, 1e-2);  // observed 7.0e-3 - 7.2e-3 over seeds
  EXPECT_LT(worst_row, 3e-2);
}

TEST(TailState, AppendFlushFaultsStayInTheirSequence) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(2);
  const kvarn_config_t cfg = SinkFree();
  const int G = cfg.tile_tokens;
  OnePool pool(cfg, 6, 1);  // slots of G rows: decode-sized
  // Every sequence holds 10 tokens (in its slot) and appends 2G + 7: two tiles to flush, 17 rows
  // stay in the slot.
  const int before = 10, m = 2 * G + 7;
  auto k = Random(rng, static_cast<size_t>(kBatch) * m * kHk * kD, 1.0);
  const auto v = Random(rng, k.size(), 1.0);
  std::vector<int32_t> indptr(kBatch + 1);
  for (int b = 0; b <= kBatch; ++b) indptr[b] = b * m;
  std::vector<uint8_t> ws;
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(
      kvarn_paged_append_flush_tail_workspace_size(&cfg, kHk, kBatch, 1, kBatch * m, &ws_bytes));
  ws.resize(ws_bytes);
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace = ws.data();
  launch.workspace_bytes = ws.size();
  {  // the first 10 tokens of each sequence: an append_flush that flushes nothing
    for (int b = 0; b < kBatch; ++b) {
      pool.Reserve(b, before + m);
      pool.lens[b] = before;
    }
    std::vector<int32_t> first(kBatch + 1);
    for (int b = 0; b <= kBatch; ++b) first[b] = b * before;
    const auto k0 = Random(rng, static_cast<size_t>(kBatch) * before * kHk * kD, 1.0);
    kvarn_paged_kv_t kv = pool.View();
    kvarn_tail_state_t tail = pool.Tail();
    pool.committed = pool.lens;
    KVT_ASSERT_OK(kvarn_paged_append_flush_tail_run(
        ctx.get(), &cfg, &kv, &tail, &launch, first.data(), first[kBatch], KVARN_DTYPE_F32,
        k0.data(), k0.data(), pool.committed.data(), pool.rtiles.data()));
    EXPECT_EQ(pool.rtiles, std::vector<int32_t>(kBatch, 0));
  }
  k[(static_cast<size_t>(indptr[1]) + 70) * kHk * kD + 5] = NAN;  // sequence 1: a NaN key
  for (int b = 0; b < kBatch; ++b) pool.lens[b] += m;
  pool.committed = pool.lens;
  pool.committed[2] = pool.lens[2] + 1;  // sequence 2: committed past seq_lens
  pool.committed[3] = before + 3;        // sequence 3: all 2G + 17 rows stay: more than the slot
  pool.Entry(4, 1) = pool.num_blocks;    // sequence 4: its second tile's block is outside
  std::vector<int32_t> status(kBatch, 0);
  status[5] = KVARN_ERR_CAPACITY;  // the engine faulted sequence 5 itself
  launch.seq_status = status.data();
  kvarn_paged_kv_t kv = pool.View();
  kvarn_tail_state_t tail = pool.Tail();
  const std::vector<uint16_t> states0 = pool.states;
  const std::vector<uint8_t> records0 = pool.records;
  std::vector<int32_t> rt_out(kBatch, -7);
  launch.workspace_bytes = ws.size() - 1;
  EXPECT_TRUE(
      IsError(kvarn_paged_append_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(),
                                                indptr[kBatch], KVARN_DTYPE_F32, k.data(), v.data(),
                                                pool.committed.data(), rt_out.data()),
              KVARN_ERR_BUFFER_TOO_SMALL, "kvarn_paged_append_flush_tail_workspace_size"));
  EXPECT_EQ(rt_out, std::vector<int32_t>(kBatch, -7));
  launch.workspace_bytes = ws.size();
  KVT_ASSERT_OK(kvarn_paged_append_flush_tail_run(
      ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(), indptr[kBatch], KVARN_DTYPE_F32,
      k.data(), v.data(), pool.committed.data(), rt_out.data()));
  EXPECT_EQ(status, (std::vector<int32_t>{0, KVARN_ERR_NON_FINITE, KVARN_ERR_INVALID_ARGUMENT,
                                          KVARN_ERR_INVALID_ARGUMENT, KVARN_ERR_INVALID_ARGUMENT,
                                          KVARN_ERR_CAPACITY}));
  EXPECT_EQ(rt_out, (std::vector<int32_t>{2, 0, 0, 0, 0, 0}));
  const size_t slot_halves = pool.slot_bytes / 2;
  for (int b = 1; b < kBatch; ++b) {  // the faulty sequences' slots and blocks are as before
    const size_t s0 = static_cast<size_t>(pool.slots[b]) * slot_halves;
    EXPECT_TRUE(std::equal(states0.begin() + s0, states0.begin() + s0 + slot_halves,
                           pool.states.begin() + s0))
        << "sequence " << b;
    for (int tile = 0; tile < 2; ++tile) {
      const int32_t id = pool.Entry(b, tile);
      if (id < 0 || id >= pool.num_blocks) continue;
      const size_t at = static_cast<size_t>(id) * kHk * pool.record_stride;
      EXPECT_EQ(
          std::memcmp(records0.data() + at, pool.records.data() + at, kHk * pool.record_stride), 0)
          << "sequence " << b << " tile " << tile;
    }
  }
  // Sequence 0: its second tile (positions G .. 2G-1, all appended now) is the codec's record of
  // those tokens, and its slot holds the last 17 rows.
  {
    std::vector<uint8_t> want(kHk * pool.record_stride);
    for (int h = 0; h < kHk; ++h) {
      std::vector<float> kt(static_cast<size_t>(G) * kD), vt(kt.size());
      for (int t = 0; t < G; ++t) {
        for (int d = 0; d < kD; ++d) {
          const size_t src = ((static_cast<size_t>(G - before) + t) * kHk + h) * kD + d;
          kt[static_cast<size_t>(t) * kD + d] = k[src];
          vt[static_cast<size_t>(t) * kD + d] = v[src];
        }
      }
      KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, kt.data(), vt.data(), 0,
                                   want.data() + h * pool.record_stride, pool.record_stride));
    }
    const size_t at = static_cast<size_t>(pool.Entry(0, 1)) * kHk * pool.record_stride;
    EXPECT_EQ(std::memcmp(pool.records.data() + at, want.data(), want.size()), 0);
    pool.rtiles = rt_out;
    EXPECT_EQ(SlotRows(pool, 0).size(), 2u * kHk * 17 * kD * 2);  // fp16 rows
  }
  // Argument errors: NULL committed, NULL k with tokens.
  launch.seq_status = nullptr;
  EXPECT_TRUE(IsError(kvarn_paged_append_flush_tail_run(
                          ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(), indptr[kBatch],
                          KVARN_DTYPE_F32, k.data(), v.data(), nullptr, rt_out.data()),
                      KVARN_ERR_INVALID_ARGUMENT, "committed"));
  EXPECT_TRUE(IsError(kvarn_paged_append_flush_tail_run(
                          ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(), indptr[kBatch],
                          KVARN_DTYPE_F32, nullptr, v.data(), pool.committed.data(), rt_out.data()),
                      KVARN_ERR_INVALID_ARGUMENT, "k or v"));
}

TEST(TailState, FaultsStayInTheirSequenceAndBadArgumentsAreRefused) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext(1);
  const kvarn_config_t cfg = SinkFree();
  const int G = cfg.tile_tokens;
  OnePool pool(cfg, 4);
  // Every sequence holds G - 1 committed tokens and gets one more: one tile each to flush.
  std::vector<int32_t> indptr(kBatch + 1);
  for (int b = 0; b <= kBatch; ++b) indptr[b] = b * G;
  for (int b = 0; b < kBatch; ++b) pool.Reserve(b, G);
  for (int b = 0; b < kBatch; ++b) pool.lens[b] = G;
  auto k = Random(rng, static_cast<size_t>(kBatch) * G * kHk * kD, 1.0);
  const auto v = Random(rng, k.size(), 1.0);
  k[(static_cast<size_t>(indptr[2]) + 5) * kHk * kD + 3] = NAN;  // sequence 2: a NaN key
  kvarn_paged_kv_t kv = pool.View();
  kvarn_tail_state_t tail = pool.Tail();
  std::vector<int32_t> status(kBatch, 0);
  status[4] = KVARN_ERR_CAPACITY;  // the engine faulted sequence 4 itself
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.seq_status = status.data();
  const std::vector<uint16_t> states0 = pool.states;
  KVT_ASSERT_OK(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &tail, &launch, indptr.data(),
                                            indptr[kBatch], KVARN_DTYPE_F32, k.data(), v.data()));
  EXPECT_EQ(status[2], KVARN_ERR_NON_FINITE);
  const size_t slot_halves = pool.slot_bytes / 2;
  for (int b : {2, 4}) {  // their slots are as before
    const size_t s0 = static_cast<size_t>(pool.slots[b]) * slot_halves;
    EXPECT_TRUE(std::equal(states0.begin() + s0, states0.begin() + s0 + slot_halves,
                           pool.states.begin() + s0))
        << "sequence " << b;
  }
  // Flush: sequence 1's block entry is outside the pool; the others flush their tile.
  pool.committed = pool.lens;
  pool.Entry(1, 0) = pool.num_blocks + 3;
  std::vector<uint8_t> ws(1);
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_workspace_size(&cfg, kHk, kBatch, kMaxStep, &ws_bytes));
  ws.resize(ws_bytes);
  launch.workspace = ws.data();
  launch.workspace_bytes = ws_bytes - 1;
  std::vector<int32_t> rt_out(kBatch, -7);
  EXPECT_TRUE(IsError(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                                 pool.committed.data(), rt_out.data()),
                      KVARN_ERR_BUFFER_TOO_SMALL, "kvarn_paged_flush_tail_workspace_size"));
  launch.workspace_bytes = ws_bytes;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_run(ctx.get(), &cfg, &kv, &tail, &launch,
                                           pool.committed.data(), rt_out.data()));
  EXPECT_EQ(status, (std::vector<int32_t>{0, KVARN_ERR_INVALID_ARGUMENT, KVARN_ERR_NON_FINITE, 0,
                                          KVARN_ERR_CAPACITY, 0}));
  EXPECT_EQ(rt_out, (std::vector<int32_t>{1, 0, 0, 1, 0, 1}));
  // A flushed tile's record equals the codec's record of the same tokens (cache frame).
  {
    const int b = 3;
    std::vector<uint8_t> want(kHk * pool.record_stride);
    for (int h = 0; h < kHk; ++h) {
      std::vector<float> kt(static_cast<size_t>(G) * kD), vt(kt.size());
      for (int t = 0; t < G; ++t) {
        for (int d = 0; d < kD; ++d) {
          const size_t src = ((static_cast<size_t>(indptr[b]) + t) * kHk + h) * kD + d;
          kt[static_cast<size_t>(t) * kD + d] = k[src];
          vt[static_cast<size_t>(t) * kD + d] = v[src];
        }
      }
      KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, kt.data(), vt.data(), 0,
                                   want.data() + h * pool.record_stride, pool.record_stride));
    }
    const size_t block = static_cast<size_t>(pool.Entry(b, 0));
    EXPECT_EQ(std::memcmp(pool.records.data() + block * kHk * pool.record_stride, want.data(),
                          want.size()),
              0);
  }

  // Argument errors.
  kvarn_config_t with_sink = cfg;
  with_sink.sink_tiles = 1;
  size_t bytes = 0;
  EXPECT_TRUE(IsError(kvarn_tail_state_bytes(&with_sink, kHk, 1, 16, &bytes), KVARN_ERR_UNSUPPORTED,
                      "sink_tiles"));
  EXPECT_TRUE(IsError(kvarn_tail_state_bytes(&cfg, kHk, 0, 16, &bytes), KVARN_ERR_INVALID_ARGUMENT,
                      "max_step_tokens"));
  KVT_ASSERT_OK(kvarn_tail_state_bytes(&cfg, kHk, 1, 16, &bytes));
  EXPECT_EQ(bytes, 2u * kHk * 64 * kD * 2);  // cap = G - 1 + 1 = 64 rows
  KVT_ASSERT_OK(kvarn_tail_state_bytes(&cfg, kHk, kMaxStep, 0, &bytes));
  EXPECT_EQ(bytes, 2u * kHk * 72 * kD * 2);  // 66 rows, rounded up to 72
  EXPECT_TRUE(IsError(kvarn_tail_state_bytes(&cfg, kHk, 1, 12, &bytes), KVARN_ERR_INVALID_ARGUMENT,
                      "row_bits"));
  KVT_ASSERT_OK(kvarn_tail_state_bytes(&cfg, kHk, kMaxStep, 8, &bytes));
  EXPECT_EQ(bytes, 2u * kHk * 72 * (kD + 2));  // int8 codes and an fp16 scale per row
  KVT_ASSERT_OK(kvarn_tail_state_bytes(&cfg, kHk, kMaxStep, 0, &bytes));
  kvarn_tail_state_t odd = tail;
  odd.row_bits = 12;
  EXPECT_TRUE(
      IsError(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &odd, &launch, indptr.data(),
                                          indptr[kBatch], KVARN_DTYPE_F32, k.data(), v.data()),
              KVARN_ERR_INVALID_ARGUMENT, "row_bits"));
  kvarn_tail_state_t small = tail;
  small.slot_bytes = bytes - 2;
  EXPECT_TRUE(
      IsError(kvarn_paged_append_tail_run(ctx.get(), &cfg, &kv, &small, &launch, indptr.data(),
                                          indptr[kBatch], KVARN_DTYPE_F32, k.data(), v.data()),
              KVARN_ERR_INVALID_ARGUMENT, "slot_bytes"));
  // Attention with a plan whose config has a sink tile: refused.
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = pool.max_blocks;
  kvarn_attention_plan_t* p = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx.get(), &with_sink, &shape, &ap, &p));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(p);
  std::vector<float> q(static_cast<size_t>(kBatch) * kHq * kD), out(q.size());
  EXPECT_TRUE(IsError(kvarn_paged_attention_tail_run(ctx.get(), plan.get(), &kv, &tail, &launch,
                                                     nullptr, q.data(), out.data(), nullptr),
                      KVARN_ERR_UNSUPPORTED, "sink_tiles"));
}

}  // namespace
