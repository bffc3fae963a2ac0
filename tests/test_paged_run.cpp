// The capturable layer 2 (kvarn.h "plan / run") on every backend here, CPU and GPU (the GPU
// instances skip without a device): a decode loop driven through device-resident metadata gives
// bit for bit what the host-list calls give over the same steps; padding slots are skipped;
// per-sequence faults stay in their sequence; argument errors are refused up front.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/decode_loop.h"
#include "support/fp.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace {

using kvt::DeviceBuffer;
using kvt::IsError;

constexpr int kD = 128, kHk = 2, kGroup = 3, kHq = kHk * kGroup;

struct PlanDeleter {
  void operator()(kvarn_attention_plan_t* p) const { kvarn_attention_plan_destroy(p); }
};
using PlanPtr = std::unique_ptr<kvarn_attention_plan_t, PlanDeleter>;

kvt::ContextPtr MakeContext(kvarn_backend_t backend) {
  return backend == KVARN_BACKEND_CPU ? kvt::MakeCpuContext() : kvt::MakeCudaContext();
}

// One layer's pools and every per-step array in the context's memory, plus the host copies the
// checks read back.
struct Layer {
  Layer(kvarn_context_t* ctx, const kvarn_config_t& cfg, const kvt::DecodeLoop& loop)
      : stride(kvt::RecordBytes(cfg) + 16),
        records(ctx, std::vector<uint8_t>(loop.num_blocks() * kHk * stride, kvt::kPoisonByte)),
        k_pages(ctx, std::vector<uint16_t>(
                         static_cast<size_t>(loop.num_pages()) * kHk * cfg.tile_tokens * kD,
                         kvt::kPoisonHalf)),
        v_pages(ctx, k_pages.Download<uint16_t>()) {}
  size_t stride;
  DeviceBuffer records, k_pages, v_pages;
};

struct Step {
  Step(kvarn_context_t* ctx, const kvt::DecodeLoop& loop)
      : B(loop.batch()),
        token_indptr(ctx, (B + 1) * 4),
        slot_mapping(ctx, B * 4),
        flush_src(ctx, B * 4),
        flush_dst(ctx, B * 4),
        flush_seq(ctx, B * 4),
        n_flush(ctx, 4),
        block_table(ctx, static_cast<size_t>(B) * loop.max_blocks() * 4),
        seq_lens(ctx, B * 4),
        record_tiles(ctx, B * 4),
        status(ctx, B * 4),
        k(ctx, static_cast<size_t>(B) * kHk * kD * 4),
        v(ctx, static_cast<size_t>(B) * kHk * kD * 4),
        q(ctx, static_cast<size_t>(B) * kHq * kD * 4),
        out(ctx, static_cast<size_t>(B) * kHq * kD * 4),
        lse(ctx, static_cast<size_t>(B) * kHq * 4) {
    status.Upload(std::vector<int32_t>(B, 0));  // the engine clears the status array
  }
  int B;
  DeviceBuffer token_indptr, slot_mapping, flush_src, flush_dst, flush_seq, n_flush, block_table,
      seq_lens, record_tiles, status, k, v, q, out, lse;

  void Upload(const kvt::StepMeta& m) {
    token_indptr.Upload(m.token_indptr);
    slot_mapping.Upload(m.slot_mapping);
    flush_src.Upload(m.flush_src);
    flush_dst.Upload(m.flush_dst);
    flush_seq.Upload(m.flush_seq);
    n_flush.Upload(m.n_flush);
    block_table.Upload(m.block_table);
    seq_lens.Upload(m.seq_lens);
    record_tiles.Upload(m.record_tiles);
  }
};

kvarn_paged_kv_t View(Layer& L, Step& s, const kvt::DecodeLoop& loop) {
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = kHk;
  kv.batch = loop.batch();
  kv.records = L.records.get();
  kv.record_stride = L.stride;
  kv.num_record_blocks = loop.num_blocks();
  kv.k_pages = L.k_pages.get();
  kv.v_pages = L.v_pages.get();
  kv.num_pages = loop.num_pages();
  kv.block_table = static_cast<const int32_t*>(s.block_table.get());
  kv.max_blocks_per_seq = loop.max_blocks();
  kv.seq_lens = static_cast<const int32_t*>(s.seq_lens.get());
  kv.record_tiles = static_cast<const int32_t*>(s.record_tiles.get());
  return kv;
}

std::vector<float> Random(kvt::Rng& rng, size_t n, double scale) {
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(scale * rng.Normal());
  return x;
}

class PagedRun : public ::testing::TestWithParam<kvarn_backend_t> {
 protected:
  void SetUp() override {
    ctx_ = MakeContext(GetParam());
    if (!ctx_) GTEST_SKIP() << "no GPU backend/device here: " << kvarn_last_error();
    cfg_ = kvt::PresetConfig("k4v2_g64", kD);
  }

  PlanPtr MakeDecodePlan(const kvt::DecodeLoop& loop) {
    kvarn_attention_shape_t shape;
    kvarn_attention_shape_defaults(&shape);
    shape.batch = loop.batch();
    shape.num_kv_heads = kHk;
    shape.max_blocks_per_seq = loop.max_blocks();
    kvarn_attention_params_t ap;
    kvarn_attention_params_defaults(&ap);
    ap.num_q_heads = kHq;
    kvarn_attention_plan_t* p = nullptr;
    EXPECT_EQ(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &p), KVARN_OK)
        << kvarn_last_error();
    return PlanPtr(p);
  }

  // The step through the capturable calls: append by slot, flush of the device list, attention.
  void RunStep(Layer& L, Step& s, const kvt::DecodeLoop& loop, const kvarn_attention_plan_t* plan,
               DeviceBuffer& flush_ws, DeviceBuffer& attn_ws, bool with_status) {
    kvarn_paged_kv_t kv = View(L, s, loop);
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.seq_status = with_status ? static_cast<int32_t*>(s.status.get()) : nullptr;
    KVT_ASSERT_OK(kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, &launch,
                                         static_cast<const int32_t*>(s.token_indptr.get()),
                                         static_cast<const int32_t*>(s.slot_mapping.get()),
                                         loop.batch(), KVARN_DTYPE_F32, s.k.get(), s.v.get()));
    launch.workspace = flush_ws.get();
    launch.workspace_bytes = flush_ws.bytes();
    KVT_ASSERT_OK(kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, &launch, loop.batch(),
                                        static_cast<const int32_t*>(s.n_flush.get()),
                                        static_cast<const int32_t*>(s.flush_src.get()),
                                        static_cast<const int32_t*>(s.flush_dst.get()),
                                        static_cast<const int32_t*>(s.flush_seq.get())));
    launch.workspace = attn_ws.get();
    launch.workspace_bytes = attn_ws.bytes();
    KVT_ASSERT_OK(kvarn_paged_attention_run(ctx_.get(), plan, &kv, &launch, nullptr, s.q.get(),
                                            s.out.get(), static_cast<float*>(s.lse.get())));
  }

  size_t FlushWorkspace(const kvt::DecodeLoop& loop) {
    size_t n = 0;
    EXPECT_EQ(kvarn_paged_flush_workspace_size(&cfg_, kHk, loop.batch(), &n), KVARN_OK);
    return n;
  }
  size_t AttentionWorkspace(const kvarn_attention_plan_t* plan) {
    size_t n = 0;
    EXPECT_EQ(kvarn_attention_plan_workspace_size(plan, &n), KVARN_OK);
    return n == 0 ? 1 : n;
  }

  kvt::ContextPtr ctx_;
  kvarn_config_t cfg_{};
};

TEST_P(PagedRun, DecodeLoopMatchesTheHostListCalls) {
  // 300 steps of 12 slots (sequences of 60..250 tokens, G 64: tiles complete, sequences finish
  // and are replaced, idle slots are padding), once through the run calls and once through
  // kvarn_paged_append / kvarn_paged_flush / kvarn_paged_attention with host lists: outputs,
  // lse and both pools agree bit for bit.
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 12;
  spec.min_len = 60;
  spec.max_len = 250;
  spec.idle_prob = 0.6;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Layer run_layer(ctx_.get(), cfg_, loop), host_layer(ctx_.get(), cfg_, loop);
  Step run_step(ctx_.get(), loop), host_step(ctx_.get(), loop);
  PlanPtr plan = MakeDecodePlan(loop);
  ASSERT_TRUE(plan);
  DeviceBuffer flush_ws(ctx_.get(), FlushWorkspace(loop));
  DeviceBuffer attn_ws(ctx_.get(), AttentionWorkspace(plan.get()));
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  size_t host_ws_bytes = 0;
  {
    kvarn_paged_kv_t kv = View(host_layer, host_step, loop);
    KVT_ASSERT_OK(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, &ap, loop.batch(),
                                                       &host_ws_bytes));
  }
  DeviceBuffer host_ws(ctx_.get(), host_ws_bytes == 0 ? 1 : host_ws_bytes);
  int flushes = 0, padded = 0;
  for (int step = 0; step < 300; ++step) {
    kvt::StepMeta m;
    loop.Next(&m);
    const auto k = Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 2.0);
    const auto v = Random(rng, k.size(), 1.0);
    const auto q = Random(rng, static_cast<size_t>(loop.batch()) * kHq * kD, 0.3);
    for (Step* s : {&run_step, &host_step}) {
      s->k.Upload(k);
      s->v.Upload(v);
      s->q.Upload(q);
    }
    run_step.Upload(m);
    RunStep(run_layer, run_step, loop, plan.get(), flush_ws, attn_ws, true);

    // The same step through the host-list calls: tokens are compacted (no padding rows).
    host_step.seq_lens.Upload(m.seq_lens_before);
    host_step.block_table.Upload(m.block_table_before);
    host_step.record_tiles.Upload(m.record_tiles_before);
    kvarn_paged_kv_t kv = View(host_layer, host_step, loop);
    KVT_ASSERT_OK(kvarn_paged_append(ctx_.get(), &cfg_, &kv, m.token_indptr.data(), KVARN_DTYPE_F32,
                                     host_step.k.get(), host_step.v.get()));
    if (m.n_flush[0] > 0) {
      KVT_ASSERT_OK(kvarn_paged_flush(ctx_.get(), &cfg_, &kv, m.n_flush[0], m.flush_src.data(),
                                      m.flush_dst.data()));
      ++flushes;
    }
    host_step.seq_lens.Upload(m.seq_lens);
    host_step.block_table.Upload(m.block_table);
    host_step.record_tiles.Upload(m.record_tiles);
    KVT_ASSERT_OK(kvarn_paged_attention(
        ctx_.get(), &cfg_, &kv, &ap, host_step.q.get(), host_step.out.get(),
        static_cast<float*>(host_step.lse.get()), host_ws.get(), host_ws.bytes()));
    KVT_ASSERT_OK(kvarn_context_synchronize(ctx_.get()));
    const auto out = run_step.out.Download<float>(), lse = run_step.lse.Download<float>();
    ASSERT_EQ(std::memcmp(out.data(), host_step.out.Download<float>().data(), out.size() * 4), 0)
        << "step " << step;
    ASSERT_EQ(std::memcmp(lse.data(), host_step.lse.Download<float>().data(), lse.size() * 4), 0)
        << "step " << step;
    const auto status = run_step.status.Download<int32_t>();
    for (int b = 0; b < loop.batch(); ++b) {
      ASSERT_EQ(status[b], 0) << "step " << step << " sequence " << b;
      if (m.seq_lens[b] != 0) continue;
      ++padded;  // a padding slot: zero output rows, lse -inf
      for (int r = b * kHq; r < (b + 1) * kHq; ++r) {
        ASSERT_TRUE(std::isinf(lse[r]) && lse[r] < 0) << "step " << step << " slot " << b;
        for (int d = 0; d < kD; ++d) ASSERT_EQ(out[static_cast<size_t>(r) * kD + d], 0.f);
      }
    }
  }
  EXPECT_GT(flushes, 3);
  EXPECT_GT(padded, 3);
  EXPECT_GT(loop.finished(), 3);
  for (auto pair : {std::make_pair(&run_layer.records, &host_layer.records),
                    std::make_pair(&run_layer.k_pages, &host_layer.k_pages),
                    std::make_pair(&run_layer.v_pages, &host_layer.v_pages)}) {
    EXPECT_EQ(pair.first->Download<uint8_t>(), pair.second->Download<uint8_t>());
  }
}

// Advances two identical caches through `steps` clean steps of `loop`.
struct Twin {
  Twin(kvarn_context_t* ctx, const kvarn_config_t& cfg, const kvt::DecodeLoop& loop)
      : a(ctx, cfg, loop), b(ctx, cfg, loop), sa(ctx, loop), sb(ctx, loop) {}
  Layer a, b;
  Step sa, sb;
};

TEST_P(PagedRun, FaultsStayInTheirSequence) {
  // A batch of 32 after 70 clean steps; then one step where sequence f1 has a NaN key row, f2 a
  // write slot outside the pool, f3 could not get a page (the engine marks it
  // KVARN_ERR_CAPACITY before the step), f4 a flush entry outside the record pool and f5 a
  // corrupt block-table entry. Each gets its own status; the pools hold exactly what the clean
  // step writes for the other sequences and nothing for the faulty ones (f5's attention fault
  // changes no memory: its append and flush happened); the other sequences' outputs equal the
  // clean step's bit for bit.
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 32;
  spec.min_len = 120;
  spec.max_len = 400;
  spec.idle_prob = 0.0;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Twin t(ctx_.get(), cfg_, loop);
  PlanPtr plan = MakeDecodePlan(loop);
  ASSERT_TRUE(plan);
  DeviceBuffer flush_ws(ctx_.get(), FlushWorkspace(loop));
  DeviceBuffer attn_ws(ctx_.get(), AttentionWorkspace(plan.get()));
  kvt::StepMeta m;
  std::vector<float> k, v, q;
  auto draw = [&] {
    loop.Next(&m);
    k = Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 2.0);
    v = Random(rng, k.size(), 1.0);
    q = Random(rng, static_cast<size_t>(loop.batch()) * kHq * kD, 0.3);
  };
  for (int step = 0; step < 70; ++step) {
    draw();
    for (Step* s : {&t.sa, &t.sb}) {
      s->Upload(m);
      s->k.Upload(k);
      s->v.Upload(v);
      s->q.Upload(q);
    }
    RunStep(t.a, t.sa, loop, plan.get(), flush_ws, attn_ws, true);
    RunStep(t.b, t.sb, loop, plan.get(), flush_ws, attn_ws, true);
  }
  // The faulty step: find a step where some sequence completes a tile.
  for (int tries = 0; tries < 200; ++tries) {
    draw();
    if (m.n_flush[0] >= 2) break;
    for (Step* s : {&t.sa, &t.sb}) {
      s->Upload(m);
      s->k.Upload(k);
      s->v.Upload(v);
      s->q.Upload(q);
    }
    RunStep(t.a, t.sa, loop, plan.get(), flush_ws, attn_ws, true);
    RunStep(t.b, t.sb, loop, plan.get(), flush_ws, attn_ws, true);
  }
  ASSERT_GE(m.n_flush[0], 2) << "no step completed two tiles";
  const int f4 = m.flush_seq[0];
  int f1 = -1, f2 = -1, f3 = -1, f5 = -1;
  for (int b = 0, picked = 0; b < loop.batch() && picked < 4; ++b) {
    if (b == f4 || b == m.flush_seq[1]) continue;
    int* which[] = {&f1, &f2, &f3, &f5};
    *which[picked++] = b;
  }
  ASSERT_GE(f5, 0);
  // Memory before the step, and the clean step on twin b.
  const auto rec0 = t.a.records.Download<uint8_t>();
  const auto kp0 = t.a.k_pages.Download<uint16_t>();
  for (Step* s : {&t.sa, &t.sb}) {
    s->Upload(m);
    s->v.Upload(v);
    s->q.Upload(q);
  }
  t.sb.k.Upload(k);
  RunStep(t.b, t.sb, loop, plan.get(), flush_ws, attn_ws, true);
  // The faults, on twin a.
  std::vector<float> kbad = k;
  kbad[(static_cast<size_t>(m.token_indptr[f1]) * kHk + 1) * kD + 5] = NAN;
  t.sa.k.Upload(kbad);
  kvt::StepMeta bad = m;
  bad.slot_mapping[m.token_indptr[f2]] = loop.num_pages() * cfg_.tile_tokens + 3;
  bad.flush_dst[0] = loop.num_blocks() + 1;
  bad.block_table[static_cast<size_t>(f5) * loop.max_blocks()] = loop.num_pages() + 7;
  t.sa.Upload(bad);
  std::vector<int32_t> status0(loop.batch(), 0);
  status0[f3] = KVARN_ERR_CAPACITY;
  t.sa.status.Upload(status0);
  RunStep(t.a, t.sa, loop, plan.get(), flush_ws, attn_ws, true);
  KVT_ASSERT_OK(kvarn_context_synchronize(ctx_.get()));

  const auto status = t.sa.status.Download<int32_t>();
  for (int b = 0; b < loop.batch(); ++b) {
    const int32_t want = b == f1   ? KVARN_ERR_NON_FINITE
                         : b == f2 ? KVARN_ERR_INVALID_ARGUMENT
                         : b == f3 ? KVARN_ERR_CAPACITY
                         : b == f4 ? KVARN_ERR_INVALID_ARGUMENT
                         : b == f5 ? KVARN_ERR_INVALID_ARGUMENT
                                   : 0;
    EXPECT_EQ(status[b], want) << "sequence " << b;
  }
  // Outputs of the healthy sequences equal the clean step's.
  const auto out_a = t.sa.out.Download<float>(), out_b = t.sb.out.Download<float>();
  const auto lse_a = t.sa.lse.Download<float>(), lse_b = t.sb.lse.Download<float>();
  for (int b = 0; b < loop.batch(); ++b) {
    if (status[b] != 0) continue;
    const size_t r0 = static_cast<size_t>(b) * kHq;
    ASSERT_EQ(std::memcmp(out_a.data() + r0 * kD, out_b.data() + r0 * kD, kHq * kD * 4), 0)
        << "sequence " << b;
    ASSERT_EQ(std::memcmp(lse_a.data() + r0, lse_b.data() + r0, kHq * 4), 0) << "sequence " << b;
  }
  // Pages: each token slot of the step holds the clean step's token, or (faulty sequences) what
  // it held before.
  const auto kp_a = t.a.k_pages.Download<uint16_t>(), kp_b = t.b.k_pages.Download<uint16_t>();
  const int G = cfg_.tile_tokens;
  const size_t page_elems = static_cast<size_t>(kHk) * G * kD;
  for (int b = 0; b < loop.batch(); ++b) {
    const int32_t slot = m.slot_mapping[m.token_indptr[b]];
    const bool kept = b == f1 || b == f2 || b == f3;
    for (int h = 0; h < kHk; ++h) {
      const size_t off = (slot / G) * page_elems + (static_cast<size_t>(h) * G + slot % G) * kD;
      const auto& want = kept ? kp0 : kp_b;
      ASSERT_EQ(std::memcmp(kp_a.data() + off, want.data() + off, kD * 2), 0)
          << "sequence " << b << (kept ? " (faulty)" : "");
    }
  }
  // Records: the flush entries of f4 (its bad entry 0) and of the sequences whose append failed
  // wrote nothing; the others wrote the clean records.
  const auto rec_a = t.a.records.Download<uint8_t>(), rec_b = t.b.records.Download<uint8_t>();
  const size_t block_bytes = kHk * t.a.stride;
  for (int i = 0; i < m.n_flush[0]; ++i) {
    const int b = m.flush_seq[i];
    const size_t off = static_cast<size_t>(m.flush_dst[i]) * block_bytes;
    const bool kept = b == f1 || b == f2 || b == f3 || b == f4;
    const auto& want = kept ? rec0 : rec_b;
    EXPECT_EQ(std::memcmp(rec_a.data() + off, want.data() + off, block_bytes), 0)
        << "flush entry " << i;
  }
  std::vector<uint8_t> rec_a_rest = rec_a, rec_b_rest = rec_b;
  for (int i = 0; i < m.n_flush[0]; ++i) {
    const size_t off = static_cast<size_t>(m.flush_dst[i]) * block_bytes;
    std::memset(rec_a_rest.data() + off, 0, block_bytes);
    std::memset(rec_b_rest.data() + off, 0, block_bytes);
  }
  EXPECT_EQ(rec_a_rest, rec_b_rest) << "a record outside the step's flush list changed";
}

TEST_P(PagedRun, WithoutAStatusArrayAFaultFailsTheCall) {
  // No seq_status: one NaN row fails the whole append (the CPU at once, a GPU at the next
  // synchronize) and no page changes; a bad flush count fails the flush the same way.
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 6;
  spec.idle_prob = 0.0;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Layer L(ctx_.get(), cfg_, loop);
  Step s(ctx_.get(), loop);
  kvt::StepMeta m;
  loop.Next(&m);
  s.Upload(m);
  auto k = Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 1.0);
  k[kD * 3 + 1] = INFINITY;
  s.k.Upload(k);
  s.v.Upload(Random(rng, k.size(), 1.0));
  const auto before = L.k_pages.Download<uint8_t>();
  kvarn_paged_kv_t kv = View(L, s, loop);
  const kvarn_status_t st = kvarn_paged_append_run(
      ctx_.get(), &cfg_, &kv, nullptr, static_cast<const int32_t*>(s.token_indptr.get()),
      static_cast<const int32_t*>(s.slot_mapping.get()), loop.batch(), KVARN_DTYPE_F32, s.k.get(),
      s.v.get());
  if (GetParam() == KVARN_BACKEND_CPU) {
    EXPECT_TRUE(IsError(st, KVARN_ERR_NON_FINITE, "NaN or Inf"));
  } else {
    KVT_EXPECT_OK(st);
    EXPECT_TRUE(IsError(kvarn_context_synchronize(ctx_.get()), KVARN_ERR_NON_FINITE, "NaN or Inf"));
  }
  EXPECT_EQ(L.k_pages.Download<uint8_t>(), before);

  s.n_flush.Upload(std::vector<int32_t>{loop.batch() + 1});
  DeviceBuffer ws(ctx_.get(), FlushWorkspace(loop));
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace = ws.get();
  launch.workspace_bytes = ws.bytes();
  const auto rec_before = L.records.Download<uint8_t>();
  const kvarn_status_t fst = kvarn_paged_flush_run(
      ctx_.get(), &cfg_, &kv, &launch, loop.batch(), static_cast<const int32_t*>(s.n_flush.get()),
      static_cast<const int32_t*>(s.flush_src.get()),
      static_cast<const int32_t*>(s.flush_dst.get()), nullptr);
  if (GetParam() == KVARN_BACKEND_CPU) {
    EXPECT_TRUE(IsError(fst, KVARN_ERR_INVALID_ARGUMENT, "n_tiles"));
  } else {
    KVT_EXPECT_OK(fst);
    EXPECT_TRUE(
        IsError(kvarn_context_synchronize(ctx_.get()), KVARN_ERR_INVALID_ARGUMENT, "n_tiles"));
  }
  EXPECT_EQ(L.records.Download<uint8_t>(), rec_before);
  KVT_EXPECT_OK(kvarn_context_synchronize(ctx_.get()));  // the error was reported once
}

TEST_P(PagedRun, PlanNamesItsKernelAndRefusesAPoolItCannotRead) {
  // The plan says which kernel it runs; a tensor-core plan over a pool whose record stride is
  // not a multiple of 16 is refused (never a silent fall back to the general kernel), and the
  // same pool with an aligned stride runs.
  KVT_SEEDED_RNG(rng, 0);
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  for (size_t padding : {8, 16}) {
    kvt::PagedCacheSpec spec;
    spec.num_kv_heads = kHk;
    spec.lens = {300, 129};
    spec.stride_padding = padding;
    kvt::PagedCache pc;
    auto cpu = kvt::MakeCpuContext();
    ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg_, spec, rng, &pc));
    kvt::DevicePagedCache dev(ctx_.get(), pc);
    kvarn_paged_kv_t kv = dev.kv;
    kvarn_attention_shape_t shape;
    kvarn_attention_shape_defaults(&shape);
    shape.batch = pc.batch;
    shape.num_kv_heads = kHk;
    shape.max_blocks_per_seq = pc.max_blocks;
    kvarn_attention_plan_t* raw = nullptr;
    KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw));
    PlanPtr plan(raw);
    const char* kernel = nullptr;
    KVT_ASSERT_OK(kvarn_attention_plan_kernel(plan.get(), &kernel));
    ASSERT_NE(kernel, nullptr);
    const bool tensor_core = std::string(kernel).find("tensor-core") != std::string::npos;
    if (GetParam() == KVARN_BACKEND_CPU) {
      EXPECT_STREQ(kernel, "cpu");
    } else {
#if defined(KVT_GPU_BACKEND_ROCM)
      EXPECT_STREQ(kernel, "cuda-general");  // no tensor-core path under HIP
#else
      EXPECT_STREQ(kernel, "cuda-tensor-core-decode");  // the design point on sm_80+
#endif
    }
    const auto q = Random(rng, static_cast<size_t>(pc.batch) * kHq * kD, 0.3);
    DeviceBuffer dq(ctx_.get(), q), out(ctx_.get(), std::vector<float>(q.size(), 7.f));
    DeviceBuffer ws(ctx_.get(), AttentionWorkspace(plan.get()));
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.workspace = ws.get();
    launch.workspace_bytes = ws.bytes();
    const kvarn_status_t st = kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch,
                                                        nullptr, dq.get(), out.get(), nullptr);
    if (tensor_core && padding % 16 != 0) {
      EXPECT_TRUE(IsError(st, KVARN_ERR_INVALID_ARGUMENT, "16-byte"));
      EXPECT_EQ(out.Download<float>(), std::vector<float>(q.size(), 7.f));  // nothing written
    } else {
      KVT_EXPECT_OK(st);
      KVT_EXPECT_OK(kvarn_context_synchronize(ctx_.get()));
      EXPECT_NE(out.Download<float>(), std::vector<float>(q.size(), 7.f));
    }
  }
  const char* name = nullptr;
  EXPECT_EQ(kvarn_attention_plan_kernel(nullptr, &name), KVARN_ERR_INVALID_ARGUMENT);
}

TEST_P(PagedRun, ExtendPlanMatchesTheHostIndptrCall) {
  // An extend plan (up to 40 query tokens per sequence, q_indptr in context memory) over a
  // ragged batch gives what kvarn_paged_attention with a host q_indptr gives; rows past
  // q_indptr[batch] are left as they were.
  KVT_SEEDED_RNG(rng, 0);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = kHk;
  spec.lens = {300, 41, 777, 64, 129};
  spec.flush_lag = 1;
  spec.stride_padding = 16;  // aligned: the GPU plan takes a tensor-core kernel
  kvt::PagedCache pc;
  auto cpu = kvt::MakeCpuContext();
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg_, spec, rng, &pc));
  const std::vector<int32_t> q_indptr = {0, 40, 41, 60, 60, 97};
  const int64_t max_total_q = 100;
  kvt::DevicePagedCache dev(ctx_.get(), pc);
  kvarn_paged_kv_t kv = dev.kv;
  DeviceBuffer d_indptr(ctx_.get(), q_indptr);
  const auto q = Random(rng, static_cast<size_t>(max_total_q) * kHq * kD, 0.3);
  DeviceBuffer dq(ctx_.get(), q), out_run(ctx_.get(), std::vector<float>(q.size(), 7.f)),
      out_host(ctx_.get(), std::vector<float>(q.size(), 7.f));
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = pc.batch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = pc.max_blocks;
  shape.max_q_per_seq = 40;
  shape.max_total_q = max_total_q;
  kvarn_attention_plan_t* raw = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw));
  PlanPtr plan(raw);
  DeviceBuffer ws(ctx_.get(), AttentionWorkspace(plan.get()));
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace = ws.get();
  launch.workspace_bytes = ws.bytes();
  KVT_ASSERT_OK(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch,
                                          static_cast<const int32_t*>(d_indptr.get()), dq.get(),
                                          out_run.get(), nullptr));
  ap.q_indptr = q_indptr.data();
  size_t host_ws = 0;
  KVT_ASSERT_OK(
      kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, &ap, q_indptr.back(), &host_ws));
  DeviceBuffer hws(ctx_.get(), host_ws == 0 ? 1 : host_ws);
  KVT_ASSERT_OK(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &ap, dq.get(), out_host.get(),
                                      nullptr, hws.get(), hws.bytes()));
  const auto a = out_run.Download<float>(), b = out_host.Download<float>();
  const size_t used = static_cast<size_t>(q_indptr.back()) * kHq * kD;
  // The same kernels and splits (they do not depend on the row count): bit for bit.
  EXPECT_EQ(std::memcmp(a.data(), b.data(), used * 4), 0);
  for (size_t i = used; i < a.size(); ++i) ASSERT_EQ(a[i], 7.f) << "row past q_indptr[batch]";
}

TEST_P(PagedRun, ArgumentErrorsAreRefusedUpFront) {
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 4;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Layer L(ctx_.get(), cfg_, loop);
  Step s(ctx_.get(), loop);
  PlanPtr plan = MakeDecodePlan(loop);
  ASSERT_TRUE(plan);
  kvarn_paged_kv_t kv = View(L, s, loop);
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  const auto* ip = static_cast<const int32_t*>(s.token_indptr.get());
  const auto* sl = static_cast<const int32_t*>(s.slot_mapping.get());
  float* lse = static_cast<float*>(s.lse.get());
  // The plan's shape against the kv.
  kvarn_paged_kv_t other = kv;
  other.batch = 3;
  EXPECT_TRUE(IsError(kvarn_paged_attention_run(ctx_.get(), plan.get(), &other, &launch, nullptr,
                                                s.q.get(), s.out.get(), lse),
                      KVARN_ERR_INVALID_ARGUMENT, "plan's shape"));
  EXPECT_TRUE(IsError(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch, ip, s.q.get(),
                                                s.out.get(), lse),
                      KVARN_ERR_INVALID_ARGUMENT, "decode plan"));
  EXPECT_TRUE(IsError(kvarn_paged_attention_run(ctx_.get(), nullptr, &kv, &launch, nullptr,
                                                s.q.get(), s.out.get(), lse),
                      KVARN_ERR_INVALID_ARGUMENT, "plan"));
  EXPECT_TRUE(IsError(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch, nullptr,
                                                nullptr, s.out.get(), lse),
                      KVARN_ERR_INVALID_ARGUMENT, "q or out"));
  // A plan belongs to its context.
  auto cpu2 = kvt::MakeCpuContext(1);
  EXPECT_TRUE(IsError(kvarn_paged_attention_run(cpu2.get(), plan.get(), &kv, &launch, nullptr,
                                                s.q.get(), s.out.get(), lse),
                      KVARN_ERR_INVALID_ARGUMENT, "another context"));
  // Plans: q_indptr comes at run time; the shape is checked.
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = 4;
  shape.num_kv_heads = 5;
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_plan_t* p = nullptr;
  EXPECT_TRUE(IsError(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &p),
                      KVARN_ERR_INVALID_ARGUMENT, "num_kv_heads"));
  shape.num_kv_heads = kHk;
  const int32_t host_indptr[5] = {0, 1, 2, 3, 4};
  ap.q_indptr = host_indptr;
  EXPECT_TRUE(IsError(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &p),
                      KVARN_ERR_INVALID_ARGUMENT, "q_indptr"));
  ap.q_indptr = nullptr;
  shape.max_q_per_seq = -1;
  EXPECT_TRUE(IsError(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &p),
                      KVARN_ERR_INVALID_ARGUMENT, "max_q_per_seq"));
  EXPECT_EQ(p, nullptr);
  // Workspaces too small.
  size_t need = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_workspace_size(&cfg_, kHk, 4, &need));
  EXPECT_EQ(need % 256, 0u);
  EXPECT_GE(need, 4 * kHk * kvt::RecordBytes(cfg_));
  launch.workspace = s.out.get();
  launch.workspace_bytes = need - 1;
  EXPECT_TRUE(
      IsError(kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, &launch, 4,
                                    static_cast<const int32_t*>(s.n_flush.get()), ip, ip, nullptr),
              KVARN_ERR_BUFFER_TOO_SMALL, "kvarn_paged_flush_workspace_size"));
  // A status array needs the flush entries' sequences.
  launch.workspace_bytes = need;
  launch.seq_status = static_cast<int32_t*>(s.status.get());
  EXPECT_TRUE(
      IsError(kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, &launch, 4,
                                    static_cast<const int32_t*>(s.n_flush.get()), ip, ip, nullptr),
              KVARN_ERR_INVALID_ARGUMENT, "tile_seqs"));
  // Append: NULL lists, an unknown dtype.
  EXPECT_TRUE(IsError(kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, &launch, ip, nullptr, 4,
                                             KVARN_DTYPE_F32, s.k.get(), s.v.get()),
                      KVARN_ERR_INVALID_ARGUMENT, "slot_mapping"));
  int32_t bad_dtype = 9;
  kvarn_dtype_t dt;
  std::memcpy(&dt, &bad_dtype, sizeof dt);
  EXPECT_TRUE(IsError(
      kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, &launch, ip, sl, 4, dt, s.k.get(), s.v.get()),
      KVARN_ERR_INVALID_ARGUMENT, "dtype"));
  // Growable launch struct: a caller compiled before seq_status existed (size up to `stream`)
  // gets no status array; a larger struct with a non-zero tail is refused.
  struct Bigger {
    kvarn_launch_t l;
    uint64_t extra;
  } big;
  std::memset(&big, 0, sizeof big);
  big.l.size = sizeof big;
  big.extra = 1;
  EXPECT_TRUE(IsError(kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, &big.l, ip, sl, 4,
                                             KVARN_DTYPE_F32, s.k.get(), s.v.get()),
                      KVARN_ERR_UNSUPPORTED, "launch"));
}

TEST_P(PagedRun, AppendAndFlushReadNoTables) {
  // kvarn.h: append by slot and the device-list flush read no block_table, seq_lens or
  // record_tiles, so an engine may leave them NULL in the kv it passes to them.
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 3;
  spec.idle_prob = 0.0;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Layer L(ctx_.get(), cfg_, loop);
  Step s(ctx_.get(), loop);
  kvt::StepMeta m;
  loop.Next(&m);
  s.Upload(m);
  s.k.Upload(Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 1.0));
  s.v.Upload(Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 1.0));
  kvarn_paged_kv_t kv = View(L, s, loop);
  kv.block_table = nullptr;
  kv.seq_lens = nullptr;
  kv.record_tiles = nullptr;
  const auto before = L.k_pages.Download<uint16_t>();
  KVT_ASSERT_OK(kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, nullptr,
                                       static_cast<const int32_t*>(s.token_indptr.get()),
                                       static_cast<const int32_t*>(s.slot_mapping.get()),
                                       loop.batch(), KVARN_DTYPE_F32, s.k.get(), s.v.get()));
  DeviceBuffer ws(ctx_.get(), FlushWorkspace(loop));
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace = ws.get();
  launch.workspace_bytes = ws.bytes();
  KVT_ASSERT_OK(kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, &launch, loop.batch(),
                                      static_cast<const int32_t*>(s.n_flush.get()),
                                      static_cast<const int32_t*>(s.flush_src.get()),
                                      static_cast<const int32_t*>(s.flush_dst.get()), nullptr));
  KVT_ASSERT_OK(kvarn_context_synchronize(ctx_.get()));
  // Each sequence's first token landed in its slot (the pool held NaN there before).
  const auto after = L.k_pages.Download<uint16_t>();
  const int G = cfg_.tile_tokens;
  for (int b = 0; b < loop.batch(); ++b) {
    const int32_t slot = m.slot_mapping[m.token_indptr[b]];
    const size_t off = (slot / G) * static_cast<size_t>(kHk) * G * kD + (slot % G) * size_t{kD};
    EXPECT_EQ(before[off], kvt::kPoisonHalf);
    EXPECT_NE(after[off], kvt::kPoisonHalf) << "sequence " << b;
  }
}

// ---- Layouts an engine passes as they are: strided token rows, int64 lists (issue 23) ----------

std::vector<int64_t> Wide(const std::vector<int32_t>& x) { return {x.begin(), x.end()}; }

// The strided and the dense call agree: bit for bit on the CPU; on a GPU within the tensor-core
// kernel's error (kvarn.h: dense q/out may take the tensor-core kernels, strided ones take the
// general kernel, whose fp32 arithmetic is not the same).
::testing::AssertionResult SameAttention(kvarn_backend_t backend, const std::vector<double>& got,
                                         const std::vector<double>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  if (backend == KVARN_BACKEND_CPU) {
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] != want[i]) {
        return ::testing::AssertionFailure()
               << "element " << i << ": " << got[i] << " vs " << want[i];
      }
    }
    return ::testing::AssertionSuccess();
  }
  const double err = kvt::RelL2(got, want);
  if (err <= 1e-2) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative L2 error " << err << " > 1e-2";
}

TEST_P(PagedRun, StridedRowsAndInt64ListsMatchTheDenseStep) {
  // 300 decode steps of 12 slots, twice: dense int32 (RunStep), and with q, k, v as views of one
  // fused qkv buffer ([B][(Hq + 2 Hk) D], vLLM's qkv projection), out as rows of a wider buffer,
  // and slot_mapping and the flush lists as int64. Pools agree bit for bit, outputs and lse too
  // on the CPU (GPU: SameAttention); the out buffer's gap columns are never written.
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 12;
  spec.min_len = 130;
  spec.max_len = 250;
  spec.idle_prob = 0.2;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  const int B = loop.batch();
  constexpr int kQ = kHq * kD, kK = kHk * kD;
  constexpr int kQkvRow = kQ + 2 * kK, kOutRow = kQ + 40;
  Layer dense(ctx_.get(), cfg_, loop), strided(ctx_.get(), cfg_, loop);
  Step sd(ctx_.get(), loop), ss(ctx_.get(), loop);
  DeviceBuffer qkv(ctx_.get(), static_cast<size_t>(B) * kQkvRow * 4),
      wide_out(ctx_.get(), std::vector<float>(static_cast<size_t>(B) * kOutRow, 7.f)),
      slots64(ctx_.get(), B * 8), src64(ctx_.get(), B * 8), dst64(ctx_.get(), B * 8),
      seq64(ctx_.get(), B * 8);
  PlanPtr plan = MakeDecodePlan(loop);
  ASSERT_TRUE(plan);
  DeviceBuffer flush_ws(ctx_.get(), FlushWorkspace(loop));
  DeviceBuffer attn_ws(ctx_.get(), AttentionWorkspace(plan.get()));
  int flushes = 0;
  for (int step = 0; step < 300; ++step) {
    kvt::StepMeta m;
    loop.Next(&m);
    const auto k = Random(rng, static_cast<size_t>(B) * kK, 2.0);
    const auto v = Random(rng, k.size(), 1.0);
    const auto q = Random(rng, static_cast<size_t>(B) * kQ, 0.3);
    sd.Upload(m);
    sd.k.Upload(k);
    sd.v.Upload(v);
    sd.q.Upload(q);
    RunStep(dense, sd, loop, plan.get(), flush_ws, attn_ws, true);
    flushes += m.n_flush[0] > 0;

    std::vector<float> fused(static_cast<size_t>(B) * kQkvRow);
    for (int b = 0; b < B; ++b) {
      float* row = fused.data() + static_cast<size_t>(b) * kQkvRow;
      std::copy_n(q.data() + static_cast<size_t>(b) * kQ, kQ, row);
      std::copy_n(k.data() + static_cast<size_t>(b) * kK, kK, row + kQ);
      std::copy_n(v.data() + static_cast<size_t>(b) * kK, kK, row + kQ + kK);
    }
    qkv.Upload(fused);
    ss.Upload(m);
    slots64.Upload(Wide(m.slot_mapping));
    src64.Upload(Wide(m.flush_src));
    dst64.Upload(Wide(m.flush_dst));
    seq64.Upload(Wide(m.flush_seq));
    kvarn_paged_kv_t kv = View(strided, ss, loop);
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.seq_status = static_cast<int32_t*>(ss.status.get());
    launch.q_row_stride = launch.k_row_stride = launch.v_row_stride = kQkvRow;
    launch.out_row_stride = kOutRow;
    launch.index_type = KVARN_INDEX_INT64;
    const auto* base = static_cast<const float*>(qkv.get());
    KVT_ASSERT_OK(kvarn_paged_append_run(
        ctx_.get(), &cfg_, &kv, &launch, static_cast<const int32_t*>(ss.token_indptr.get()),
        static_cast<const int32_t*>(slots64.get()), B, KVARN_DTYPE_F32, base + kQ, base + kQ + kK));
    launch.workspace = flush_ws.get();
    launch.workspace_bytes = flush_ws.bytes();
    KVT_ASSERT_OK(kvarn_paged_flush_run(
        ctx_.get(), &cfg_, &kv, &launch, B, static_cast<const int32_t*>(ss.n_flush.get()),
        static_cast<const int32_t*>(src64.get()), static_cast<const int32_t*>(dst64.get()),
        static_cast<const int32_t*>(seq64.get())));
    launch.workspace = attn_ws.get();
    launch.workspace_bytes = attn_ws.bytes();
    KVT_ASSERT_OK(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch, nullptr, base,
                                            wide_out.get(), static_cast<float*>(ss.lse.get())));
    KVT_ASSERT_OK(kvarn_context_synchronize(ctx_.get()));

    const auto want = sd.out.Download<float>(), got = wide_out.Download<float>();
    for (int b = 0; b < B; ++b) {
      const float* row = got.data() + static_cast<size_t>(b) * kOutRow;
      const float* ref = want.data() + static_cast<size_t>(b) * kQ;
      ASSERT_TRUE(SameAttention(GetParam(), {row, row + kQ}, {ref, ref + kQ}))
          << "step " << step << " slot " << b;
      for (int c = kQ; c < kOutRow; ++c) ASSERT_EQ(row[c], 7.f) << "a gap column was written";
    }
    const auto lse_got = ss.lse.Download<float>(), lse_want = sd.lse.Download<float>();
    for (size_t r = 0; r < lse_want.size(); ++r) {
      if (GetParam() == KVARN_BACKEND_CPU || std::isinf(lse_want[r])) {
        ASSERT_EQ(lse_got[r], lse_want[r]) << "step " << step << " row " << r;
      } else {
        ASSERT_NEAR(lse_got[r], lse_want[r], 1e-2) << "step " << step << " row " << r;
      }
    }
    ASSERT_EQ(ss.status.Download<int32_t>(), std::vector<int32_t>(B, 0)) << "step " << step;
  }
  EXPECT_GT(flushes, 3);
  EXPECT_EQ(strided.records.Download<uint8_t>(), dense.records.Download<uint8_t>());
  EXPECT_EQ(strided.k_pages.Download<uint8_t>(), dense.k_pages.Download<uint8_t>());
  EXPECT_EQ(strided.v_pages.Download<uint8_t>(), dense.v_pages.Download<uint8_t>());
}

TEST_P(PagedRun, StridedExtendMatchesTheDenseExtend) {
  // An extend plan over a ragged batch, q and out rows spaced wider than dense (fp16 q, bf16
  // out): the same outputs as the dense call (SameAttention), and the gaps and rows past
  // q_indptr[batch] keep what they held.
  KVT_SEEDED_RNG(rng, 0);
  kvt::PagedCacheSpec spec;
  spec.stride_padding = 16;  // aligned: the GPU plan takes a tensor-core kernel
  spec.num_kv_heads = kHk;
  spec.lens = {300, 41, 777, 129};
  spec.flush_lag = 1;
  kvt::PagedCache pc;
  auto cpu = kvt::MakeCpuContext();
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg_, spec, rng, &pc));
  const std::vector<int32_t> q_indptr = {0, 33, 34, 60, 80};
  const int64_t rows = 90;
  constexpr int kQ = kHq * kD, kQStride = kQ + 8 * kD, kOutStride = kQ + 24;
  kvt::DevicePagedCache dev(ctx_.get(), pc);
  kvarn_paged_kv_t kv = dev.kv;
  DeviceBuffer d_indptr(ctx_.get(), q_indptr);
  std::vector<uint16_t> q_dense(static_cast<size_t>(rows) * kQ),
      q_wide(static_cast<size_t>(rows) * kQStride, 0x7e00);  // NaN in the gaps: never read
  for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
    for (int c = 0; c < kQ; ++c) {
      const uint16_t h = kvt::FloatToHalf(static_cast<float>(0.3 * rng.Normal()));
      q_dense[r * kQ + c] = h;
      q_wide[r * kQStride + c] = h;
    }
  }
  DeviceBuffer dq(ctx_.get(), q_dense), dq_wide(ctx_.get(), q_wide),
      out_dense(ctx_.get(), std::vector<uint16_t>(static_cast<size_t>(rows) * kQ, 0x1234)),
      out_wide(ctx_.get(), std::vector<uint16_t>(static_cast<size_t>(rows) * kOutStride, 0x1234));
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  ap.q_dtype = KVARN_DTYPE_F16;
  ap.out_dtype = KVARN_DTYPE_BF16;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = pc.batch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = pc.max_blocks;
  shape.max_q_per_seq = 40;
  shape.max_total_q = rows;
  kvarn_attention_plan_t* raw = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw));
  PlanPtr plan(raw);
  DeviceBuffer ws(ctx_.get(), AttentionWorkspace(plan.get()));
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace = ws.get();
  launch.workspace_bytes = ws.bytes();
  const auto* ip = static_cast<const int32_t*>(d_indptr.get());
  KVT_ASSERT_OK(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch, ip, dq.get(),
                                          out_dense.get(), nullptr));
  launch.q_row_stride = kQStride;
  launch.out_row_stride = kOutStride;
  KVT_ASSERT_OK(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch, ip, dq_wide.get(),
                                          out_wide.get(), nullptr));
  const auto a = out_dense.Download<uint16_t>(), b = out_wide.Download<uint16_t>();
  const size_t used = static_cast<size_t>(q_indptr.back());
  std::vector<double> got, want;
  for (size_t r = 0; r < static_cast<size_t>(rows); ++r) {
    for (int c = 0; c < kOutStride; ++c) {
      const uint16_t x = b[r * kOutStride + c];
      if (r < used && c < kQ) {
        got.push_back(kvt::Bf16ToFloat(x));
        want.push_back(kvt::Bf16ToFloat(a[r * kQ + c]));
      } else {
        ASSERT_EQ(x, 0x1234) << "row " << r << " column " << c << " was written";
      }
    }
  }
  EXPECT_TRUE(SameAttention(GetParam(), got, want));
}

TEST_P(PagedRun, MixedBatchUnderLoosePlanMatchesTheTightPlan) {
  // A mixed step (decode rows and prefill chunks) under one plan sized by an engine's maxima
  // (any sequence up to 4096 query tokens, 12 sequences) gives what a plan sized for the step
  // gives: the GPU launches only the work items that hold rows (a work list built on the device
  // from q_indptr), not 12 x the longest sequence's row chunks. Sequences the step leaves out
  // (no query tokens) and rows past q_indptr[batch] are not written. A plan whose work cannot fit
  // one grid is refused at creation.
  KVT_SEEDED_RNG(rng, 0);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = kHk;
  spec.lens = {300, 41, 777, 64, 129, 200, 513, 90, 130, 131, 260, 70};
  spec.flush_lag = 1;
  spec.stride_padding = 16;  // aligned: the GPU plan takes a tensor-core kernel
  kvt::PagedCache pc;
  auto cpu = kvt::MakeCpuContext();
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg_, spec, rng, &pc));
  // Decode rows, two chunks (70 and 64 tokens), sequences with no rows this step.
  const std::vector<int32_t> q_indptr = {0, 1, 2, 72, 73, 73, 74, 138, 139, 140, 140, 141, 142};
  const int64_t rows = 160;
  kvt::DevicePagedCache dev(ctx_.get(), pc);
  kvarn_paged_kv_t kv = dev.kv;
  DeviceBuffer d_indptr(ctx_.get(), q_indptr);
  const auto q = Random(rng, static_cast<size_t>(rows) * kHq * kD, 0.3);
  DeviceBuffer dq(ctx_.get(), q);
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  std::vector<std::vector<float>> outs;
  for (const int max_q : {70, 4096}) {
    kvarn_attention_shape_t shape;
    kvarn_attention_shape_defaults(&shape);
    shape.batch = pc.batch;
    shape.num_kv_heads = kHk;
    shape.max_blocks_per_seq = pc.max_blocks;
    shape.max_q_per_seq = max_q;
    shape.max_total_q = rows;
    kvarn_attention_plan_t* raw = nullptr;
    KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw));
    PlanPtr plan(raw);
    DeviceBuffer ws(ctx_.get(), AttentionWorkspace(plan.get()));
    DeviceBuffer out(ctx_.get(), std::vector<float>(q.size(), 7.f));
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.workspace = ws.get();
    launch.workspace_bytes = ws.bytes();
    KVT_ASSERT_OK(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch,
                                            static_cast<const int32_t*>(d_indptr.get()), dq.get(),
                                            out.get(), nullptr));
    outs.push_back(out.Download<float>());
  }
  const size_t used = static_cast<size_t>(q_indptr.back()) * kHq * kD;
  for (size_t i = used; i < outs[1].size(); ++i) ASSERT_EQ(outs[1][i], 7.f) << "past q_indptr";
  std::vector<double> got(outs[1].begin(), outs[1].begin() + used),
      want(outs[0].begin(), outs[0].begin() + used);
  for (double x : got) ASSERT_TRUE(std::isfinite(x));
  EXPECT_TRUE(SameAttention(GetParam(), got, want));
  if (GetParam() != KVARN_BACKEND_CPU) {
    // 4096 sequences of up to 2^20 query rows in all: more work items than a grid holds.
    kvarn_attention_shape_t huge;
    kvarn_attention_shape_defaults(&huge);
    huge.batch = 4096;
    huge.num_kv_heads = kHk;
    huge.max_blocks_per_seq = 64;
    huge.max_q_per_seq = 8192;
    huge.max_total_q = int64_t{1} << 22;
    kvarn_attention_plan_t* raw = nullptr;
    EXPECT_TRUE(IsError(kvarn_attention_plan_create(ctx_.get(), &cfg_, &huge, &ap, &raw),
                        KVARN_ERR_UNSUPPORTED, "65535"));
  }
}

TEST_P(PagedRun, FinishedRequestsFlushWithoutASequence) {
  // tile_seqs[i] = -1: a flush entry of a request that has left the batch (its last tile, kept
  // for prefix caching). It is flushed whatever the status array holds (here its old slot is
  // already faulted), and writes the same record as a host-list flush; a fault of such an entry
  // cannot go to a status entry, so it fails the whole call, which then writes nothing.
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 6;
  spec.idle_prob = 0.0;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Layer L(ctx_.get(), cfg_, loop);
  Step s(ctx_.get(), loop);
  const int G = cfg_.tile_tokens, B = loop.batch();
  // Two complete pages of random tokens, written through the codec's input path (append).
  kvarn_paged_kv_t kv = View(L, s, loop);
  std::vector<int32_t> indptr = {0, 2 * G}, slots(2 * G);
  for (int t = 0; t < 2 * G; ++t) slots[t] = t;  // pages 0 and 1
  DeviceBuffer d_indptr(ctx_.get(), indptr), d_slots(ctx_.get(), slots),
      k(ctx_.get(), Random(rng, static_cast<size_t>(2 * G) * kHk * kD, 1.0)),
      v(ctx_.get(), Random(rng, static_cast<size_t>(2 * G) * kHk * kD, 1.0));
  kvarn_paged_kv_t one = kv;
  one.batch = 1;
  KVT_ASSERT_OK(kvarn_paged_append_run(
      ctx_.get(), &cfg_, &one, nullptr, static_cast<const int32_t*>(d_indptr.get()),
      static_cast<const int32_t*>(d_slots.get()), 2 * G, KVARN_DTYPE_F32, k.get(), v.get()));
  // Entry 0: page 0 -> block 3, no sequence; entry 1: page 1 -> block 4, sequence 2.
  std::vector<int32_t> status0(B, 0);
  status0[0] = KVARN_ERR_CAPACITY;  // the finished request's old slot, already reused and faulted
  s.status.Upload(status0);
  DeviceBuffer n(ctx_.get(), std::vector<int32_t>{2}), src(ctx_.get(), std::vector<int32_t>{0, 1}),
      dst(ctx_.get(), std::vector<int32_t>{3, 4}), seqs(ctx_.get(), std::vector<int32_t>{-1, 2});
  DeviceBuffer ws(ctx_.get(), FlushWorkspace(loop));
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.seq_status = static_cast<int32_t*>(s.status.get());
  launch.workspace = ws.get();
  launch.workspace_bytes = ws.bytes();
  const auto flush = [&] {
    return kvarn_paged_flush_run(
        ctx_.get(), &cfg_, &kv, &launch, B, static_cast<const int32_t*>(n.get()),
        static_cast<const int32_t*>(src.get()), static_cast<const int32_t*>(dst.get()),
        static_cast<const int32_t*>(seqs.get()));
  };
  const auto before = L.records.Download<uint8_t>();
  KVT_ASSERT_OK(flush());
  KVT_ASSERT_OK(kvarn_context_synchronize(ctx_.get()));
  EXPECT_EQ(s.status.Download<int32_t>(), status0);
  // The same records through the host-list flush, on a copy of the pools.
  Layer ref(ctx_.get(), cfg_, loop);
  ref.k_pages.Upload(L.k_pages.Download<uint8_t>());
  ref.v_pages.Upload(L.v_pages.Download<uint8_t>());
  kvarn_paged_kv_t rkv = View(ref, s, loop);
  const int32_t hsrc[2] = {0, 1}, hdst[2] = {3, 4};
  KVT_ASSERT_OK(kvarn_paged_flush(ctx_.get(), &cfg_, &rkv, 2, hsrc, hdst));
  const auto got = L.records.Download<uint8_t>();
  EXPECT_EQ(got, ref.records.Download<uint8_t>());
  EXPECT_NE(got, before);

  // A bad ownerless entry (block outside the pool) fails the call: nothing is written, no
  // status entry changes.
  L.records.Upload(before);
  dst.Upload(std::vector<int32_t>{loop.num_blocks() + 5, 4});
  const kvarn_status_t st = flush();
  if (GetParam() == KVARN_BACKEND_CPU) {
    EXPECT_TRUE(IsError(st, KVARN_ERR_INVALID_ARGUMENT, "outside its pool"));
  } else {
    KVT_EXPECT_OK(st);
    EXPECT_TRUE(IsError(kvarn_context_synchronize(ctx_.get()), KVARN_ERR_INVALID_ARGUMENT, ""));
  }
  EXPECT_EQ(L.records.Download<uint8_t>(), before);
  EXPECT_EQ(s.status.Download<int32_t>(), status0);
  // -2 is not a sequence either.
  dst.Upload(std::vector<int32_t>{3, 4});
  seqs.Upload(std::vector<int32_t>{-2, 2});
  const kvarn_status_t st2 = flush();
  if (GetParam() == KVARN_BACKEND_CPU) {
    EXPECT_TRUE(IsError(st2, KVARN_ERR_INVALID_ARGUMENT, "tile_seqs"));
  } else {
    KVT_EXPECT_OK(st2);
    EXPECT_TRUE(
        IsError(kvarn_context_synchronize(ctx_.get()), KVARN_ERR_INVALID_ARGUMENT, "tile_seqs"));
  }
  EXPECT_EQ(L.records.Download<uint8_t>(), before);
}

TEST_P(PagedRun, LayoutArgumentErrorsAreRefusedUpFront) {
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = 4;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Layer L(ctx_.get(), cfg_, loop);
  Step s(ctx_.get(), loop);
  PlanPtr plan = MakeDecodePlan(loop);
  ASSERT_TRUE(plan);
  kvarn_paged_kv_t kv = View(L, s, loop);
  const auto* ip = static_cast<const int32_t*>(s.token_indptr.get());
  const auto* sl = static_cast<const int32_t*>(s.slot_mapping.get());
  const auto append = [&](const kvarn_launch_t& l) {
    return kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, &l, ip, sl, 4, KVARN_DTYPE_F32, s.k.get(),
                                  s.v.get());
  };
  const auto attend = [&](const kvarn_launch_t& l) {
    return kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &l, nullptr, s.q.get(),
                                     s.out.get(), nullptr);
  };
  kvarn_launch_t l;
  kvarn_launch_defaults(&l);
  l.k_row_stride = -1;
  EXPECT_TRUE(IsError(append(l), KVARN_ERR_INVALID_ARGUMENT, "k_row_stride"));
  l.k_row_stride = kHk * kD - 1;  // rows would overlap
  EXPECT_TRUE(IsError(append(l), KVARN_ERR_INVALID_ARGUMENT, "k_row_stride"));
  l.k_row_stride = 0;
  l.v_row_stride = INT64_MAX / 2;
  EXPECT_TRUE(IsError(append(l), KVARN_ERR_INVALID_ARGUMENT, "address space"));
  kvarn_launch_defaults(&l);
  l.out_row_stride = kHq * kD - 8;
  EXPECT_TRUE(IsError(attend(l), KVARN_ERR_INVALID_ARGUMENT, "out_row_stride"));
  l.out_row_stride = 0;
  l.q_row_stride = 1;
  EXPECT_TRUE(IsError(attend(l), KVARN_ERR_INVALID_ARGUMENT, "q_row_stride"));
  // A call ignores the strides of tensors it does not take: append with q/out strides set.
  kvarn_launch_defaults(&l);
  l.q_row_stride = 1;
  l.out_row_stride = 1;
  kvt::StepMeta m;
  loop.Next(&m);
  s.Upload(m);
  s.k.Upload(Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 1.0));
  s.v.Upload(Random(rng, static_cast<size_t>(loop.batch()) * kHk * kD, 1.0));
  KVT_EXPECT_OK(append(l));
  // index_type: a value outside the enumeration, an int64 list that is not 8-byte aligned.
  kvarn_launch_defaults(&l);
  const int32_t bad_type = 2;
  std::memcpy(&l.index_type, &bad_type, sizeof bad_type);
  EXPECT_TRUE(IsError(append(l), KVARN_ERR_INVALID_ARGUMENT, "index_type"));
  l.index_type = KVARN_INDEX_INT64;
  DeviceBuffer slots64(ctx_.get(), 4 * 8 + 8);
  const auto* misaligned =
      reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(slots64.get()) + 4);
  EXPECT_TRUE(IsError(kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, &l, ip, misaligned, 4,
                                             KVARN_DTYPE_F32, s.k.get(), s.v.get()),
                      KVARN_ERR_INVALID_ARGUMENT, "8-byte aligned"));
  KVT_EXPECT_OK(kvarn_context_synchronize(ctx_.get()));
}

INSTANTIATE_TEST_SUITE_P(Backends, PagedRun, ::testing::Values(KVARN_BACKEND_CPU, kvt::kGpuBackend),
                         [](const ::testing::TestParamInfo<kvarn_backend_t>& i) {
                           return std::string(kvarn_backend_name(i.param));
                         });

}  // namespace
