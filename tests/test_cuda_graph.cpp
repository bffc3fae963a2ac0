// A whole decode step captured once in a CUDA graph and replayed: for every layer, append by
// slot, flush of the completed tiles and attention, all on the caller's stream with metadata in
// device memory (kvarn.h "plan / run"). 300 replays while sequences grow, finish and are
// replaced (the metadata arrays change between replays, the graph does not) give outputs and
// pools identical, bit for bit, to the same steps run uncaptured. Built with the CUDA backend
// only (it calls the CUDA runtime for streams and graphs); skips without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/decode_loop.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"

namespace {

using kvt::DeviceBuffer;

constexpr int kD = 128, kHk = 2, kGroup = 4, kHq = kHk * kGroup, kLayers = 2, kBatch = 32;

#define CUDA_ASSERT(call)                                                  \
  do {                                                                     \
    const cudaError_t e_ = (call);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_); \
  } while (0)

struct PlanDeleter {
  void operator()(kvarn_attention_plan_t* p) const { kvarn_attention_plan_destroy(p); }
};

// Everything one side (graph or eager) owns: pools per layer, metadata, inputs and outputs.
struct Side {
  Side(kvarn_context_t* ctx, const kvarn_config_t& cfg, const kvt::DecodeLoop& loop)
      : stride(kvt::RecordBytes(cfg)),
        token_indptr(ctx, (kBatch + 1) * 4),
        slot_mapping(ctx, kBatch * 4),
        flush_src(ctx, kBatch * 4),
        flush_dst(ctx, kBatch * 4),
        flush_seq(ctx, kBatch * 4),
        n_flush(ctx, 4),
        block_table(ctx, static_cast<size_t>(kBatch) * loop.max_blocks() * 4),
        seq_lens(ctx, kBatch * 4),
        record_tiles(ctx, kBatch * 4),
        status(ctx, kBatch * 4) {
    const size_t page_halves = static_cast<size_t>(loop.num_pages()) * kHk * cfg.tile_tokens * kD;
    for (int l = 0; l < kLayers; ++l) {
      records.emplace_back(
          new DeviceBuffer(ctx, static_cast<size_t>(loop.num_blocks()) * kHk * stride));
      k_pages.emplace_back(new DeviceBuffer(ctx, page_halves * 2));
      v_pages.emplace_back(new DeviceBuffer(ctx, page_halves * 2));
      k.emplace_back(new DeviceBuffer(ctx, kBatch * kHk * kD * 2));
      v.emplace_back(new DeviceBuffer(ctx, kBatch * kHk * kD * 2));
      q.emplace_back(new DeviceBuffer(ctx, kBatch * kHq * kD * 2));
      out.emplace_back(new DeviceBuffer(ctx, kBatch * kHq * kD * 2));
      lse.emplace_back(new DeviceBuffer(ctx, kBatch * kHq * 4));
      // Both sides start from the same bytes, so the pools can be compared whole at the end.
      for (auto* b : {records.back().get(), k_pages.back().get(), v_pages.back().get()}) {
        cudaMemset(b->get(), 0, b->bytes());
      }
    }
    cudaDeviceSynchronize();
  }
  size_t stride;
  DeviceBuffer token_indptr, slot_mapping, flush_src, flush_dst, flush_seq, n_flush, block_table,
      seq_lens, record_tiles, status;
  std::vector<std::unique_ptr<DeviceBuffer>> records, k_pages, v_pages, k, v, q, out, lse;
};

// Host arrays in pinned memory, so the per-step uploads are asynchronous copies.
template <typename T>
struct Pinned {
  explicit Pinned(size_t n) : n(n) {
    if (cudaMallocHost(&p, n * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~Pinned() { cudaFreeHost(p); }
  T* p = nullptr;
  size_t n;
};

class CudaGraph : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = kvt::MakeCudaContext();
    if (!ctx_) GTEST_SKIP() << "no CUDA device here: " << kvarn_last_error();
    cfg_ = kvt::PresetConfig("k4v2_g64", kD);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_) cudaStreamDestroy(stream_);
  }

  kvarn_paged_kv_t View(Side& s, const kvt::DecodeLoop& loop, int layer) {
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = kHk;
    kv.batch = kBatch;
    kv.records = s.records[layer]->get();
    kv.record_stride = s.stride;
    kv.num_record_blocks = loop.num_blocks();
    kv.k_pages = s.k_pages[layer]->get();
    kv.v_pages = s.v_pages[layer]->get();
    kv.num_pages = loop.num_pages();
    kv.block_table = static_cast<const int32_t*>(s.block_table.get());
    kv.max_blocks_per_seq = loop.max_blocks();
    kv.seq_lens = static_cast<const int32_t*>(s.seq_lens.get());
    kv.record_tiles = static_cast<const int32_t*>(s.record_tiles.get());
    return kv;
  }

  // One decode step on the test's stream: only asynchronous, capturable work.
  kvarn_status_t EnqueueStep(Side& s, const kvt::DecodeLoop& loop,
                             const kvarn_attention_plan_t* plan, void* flush_ws,
                             size_t flush_ws_bytes, void* attn_ws, size_t attn_ws_bytes) {
    if (cudaMemsetAsync(s.status.get(), 0, kBatch * 4, stream_) != cudaSuccess) {
      return KVARN_ERR_DEVICE;
    }
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.stream = stream_;
    launch.seq_status = static_cast<int32_t*>(s.status.get());
    for (int l = 0; l < kLayers; ++l) {
      kvarn_paged_kv_t kv = View(s, loop, l);
      launch.workspace = nullptr;
      launch.workspace_bytes = 0;
      kvarn_status_t st = kvarn_paged_append_run(
          ctx_.get(), &cfg_, &kv, &launch, static_cast<const int32_t*>(s.token_indptr.get()),
          static_cast<const int32_t*>(s.slot_mapping.get()), kBatch, KVARN_DTYPE_BF16,
          s.k[l]->get(), s.v[l]->get());
      if (st != KVARN_OK) return st;
      launch.workspace = flush_ws;
      launch.workspace_bytes = flush_ws_bytes;
      st = kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, &launch, kBatch,
                                 static_cast<const int32_t*>(s.n_flush.get()),
                                 static_cast<const int32_t*>(s.flush_src.get()),
                                 static_cast<const int32_t*>(s.flush_dst.get()),
                                 static_cast<const int32_t*>(s.flush_seq.get()));
      if (st != KVARN_OK) return st;
      launch.workspace = attn_ws;
      launch.workspace_bytes = attn_ws_bytes;
      st = kvarn_paged_attention_run(ctx_.get(), plan, &kv, &launch, nullptr, s.q[l]->get(),
                                     s.out[l]->get(), static_cast<float*>(s.lse[l]->get()));
      if (st != KVARN_OK) return st;
    }
    return KVARN_OK;
  }

  kvt::ContextPtr ctx_;
  kvarn_config_t cfg_{};
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaGraph, ThreeHundredReplaysEqualTheUncapturedSteps) {
  KVT_SEEDED_RNG(rng, 0);
  kvt::DecodeLoopSpec spec;
  spec.batch = kBatch;
  spec.min_len = 20;
  spec.max_len = 400;
  spec.idle_prob = 0.3;
  kvt::DecodeLoop loop(cfg_, spec, rng.Next());
  Side graph_side(ctx_.get(), cfg_, loop), eager_side(ctx_.get(), cfg_, loop);

  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kBatch;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = loop.max_blocks();
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  ap.q_dtype = KVARN_DTYPE_BF16;
  ap.out_dtype = KVARN_DTYPE_BF16;
  kvarn_attention_plan_t* raw = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw);
  size_t attn_bytes = 0, flush_bytes = 0;
  KVT_ASSERT_OK(kvarn_attention_plan_workspace_size(plan.get(), &attn_bytes));
  KVT_ASSERT_OK(kvarn_paged_flush_workspace_size(&cfg_, kHk, kBatch, &flush_bytes));
  DeviceBuffer attn_ws_g(ctx_.get(), attn_bytes + 1), attn_ws_e(ctx_.get(), attn_bytes + 1);
  DeviceBuffer flush_ws_g(ctx_.get(), flush_bytes), flush_ws_e(ctx_.get(), flush_bytes);

  // Capture one step of the graph side; nothing runs until the first replay.
  cudaGraph_t graph = nullptr;
  CUDA_ASSERT(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
  const kvarn_status_t cst = EnqueueStep(graph_side, loop, plan.get(), flush_ws_g.get(),
                                         flush_bytes, attn_ws_g.get(), attn_bytes + 1);
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  ASSERT_EQ(cst, KVARN_OK) << "during capture: " << kvarn_last_error();
  ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
  cudaGraphExec_t exec = nullptr;
  CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  CUDA_ASSERT(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_GE(nodes, static_cast<size_t>(1 + kLayers * 5));  // memset + append 2, flush 2, attention

  // Host staging for a step's metadata and inputs (pinned), uploaded to both sides.
  const size_t tok = static_cast<size_t>(kBatch) * kHk * kD,
               qn = static_cast<size_t>(kBatch) * kHq * kD;
  Pinned<int32_t> meta(4 * kBatch + 1 + 1 + 3 * kBatch +
                       static_cast<size_t>(kBatch) * loop.max_blocks());
  Pinned<uint16_t> inputs(kLayers * (2 * tok + qn));
  ASSERT_TRUE(meta.p && inputs.p);
  std::vector<uint16_t> out_g(qn), out_e(qn);
  std::vector<float> lse_g(static_cast<size_t>(kBatch) * kHq), lse_e(lse_g.size());
  int flushed = 0;
  for (int step = 0; step < 300; ++step) {
    kvt::StepMeta m;
    loop.Next(&m);
    flushed += m.n_flush[0];
    for (size_t i = 0; i < inputs.n; ++i) {
      inputs.p[i] = kvt::FloatToBf16(static_cast<float>(rng.Normal() * (i % 3 == 0 ? 0.3 : 1.5)));
    }
    for (Side* s : {&graph_side, &eager_side}) {
      // Upload through the pinned buffer, in stream order (what an engine does before a replay).
      auto put = [&](DeviceBuffer& dst, const std::vector<int32_t>& src, size_t at) {
        std::memcpy(meta.p + at, src.data(), src.size() * 4);
        return cudaMemcpyAsync(dst.get(), meta.p + at, src.size() * 4, cudaMemcpyHostToDevice,
                               stream_);
      };
      size_t at = 0;
      const std::pair<DeviceBuffer*, const std::vector<int32_t>*> arrays[] = {
          {&s->token_indptr, &m.token_indptr}, {&s->slot_mapping, &m.slot_mapping},
          {&s->flush_src, &m.flush_src},       {&s->flush_dst, &m.flush_dst},
          {&s->flush_seq, &m.flush_seq},       {&s->n_flush, &m.n_flush},
          {&s->block_table, &m.block_table},   {&s->seq_lens, &m.seq_lens},
          {&s->record_tiles, &m.record_tiles}};
      for (const auto& a : arrays) {
        CUDA_ASSERT(put(*a.first, *a.second, at));
        at += a.second->size();
      }
      for (int l = 0; l < kLayers; ++l) {
        const uint16_t* base = inputs.p + l * (2 * tok + qn);
        CUDA_ASSERT(
            cudaMemcpyAsync(s->k[l]->get(), base, tok * 2, cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(
            cudaMemcpyAsync(s->v[l]->get(), base + tok, tok * 2, cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(cudaMemcpyAsync(s->q[l]->get(), base + 2 * tok, qn * 2, cudaMemcpyHostToDevice,
                                    stream_));
      }
      if (s == &graph_side) {
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
      } else {
        KVT_ASSERT_OK(EnqueueStep(eager_side, loop, plan.get(), flush_ws_e.get(), flush_bytes,
                                  attn_ws_e.get(), attn_bytes + 1));
      }
      // The pinned staging is reused by the other side: wait for the copies to land.
      CUDA_ASSERT(cudaStreamSynchronize(stream_));
    }
    for (int l = 0; l < kLayers; ++l) {
      CUDA_ASSERT(
          cudaMemcpy(out_g.data(), graph_side.out[l]->get(), qn * 2, cudaMemcpyDeviceToHost));
      CUDA_ASSERT(
          cudaMemcpy(out_e.data(), eager_side.out[l]->get(), qn * 2, cudaMemcpyDeviceToHost));
      CUDA_ASSERT(cudaMemcpy(lse_g.data(), graph_side.lse[l]->get(), lse_g.size() * 4,
                             cudaMemcpyDeviceToHost));
      CUDA_ASSERT(cudaMemcpy(lse_e.data(), eager_side.lse[l]->get(), lse_e.size() * 4,
                             cudaMemcpyDeviceToHost));
      ASSERT_EQ(out_g, out_e) << "step " << step << " layer " << l;
      ASSERT_EQ(std::memcmp(lse_g.data(), lse_e.data(), lse_g.size() * 4), 0)
          << "step " << step << " layer " << l;
    }
    std::vector<int32_t> status(kBatch);
    CUDA_ASSERT(
        cudaMemcpy(status.data(), graph_side.status.get(), kBatch * 4, cudaMemcpyDeviceToHost));
    for (int b = 0; b < kBatch; ++b) ASSERT_EQ(status[b], 0) << "step " << step << " slot " << b;
  }
  KVT_EXPECT_OK(kvarn_context_synchronize(ctx_.get()));  // no sticky device error either
  EXPECT_GT(flushed, 50);
  EXPECT_GT(loop.finished(), 10);
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(graph_side.records[l]->Download<uint8_t>(),
              eager_side.records[l]->Download<uint8_t>());
    EXPECT_EQ(graph_side.k_pages[l]->Download<uint8_t>(),
              eager_side.k_pages[l]->Download<uint8_t>());
    EXPECT_EQ(graph_side.v_pages[l]->Download<uint8_t>(),
              eager_side.v_pages[l]->Download<uint8_t>());
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

// kvarn_context_error_word: a data error found on the device (a block-table entry outside the
// pool, in a call without a status array) shows in the word without any kvarn synchronization
// (read here with the CUDA runtime, as an engine would); kvarn_context_synchronize then reports it
// and clears the word.
// One side of the one-pool test: the layer's pools and the step's arrays (all context memory).
struct OnePoolSide {
  OnePoolSide(kvarn_context_t* ctx, size_t record_bytes, size_t slot_bytes, size_t table_entries,
              int batch, size_t max_tokens, size_t af_ws, size_t attn_ws)
      : records(ctx, std::vector<uint8_t>(record_bytes, 0xA5)),
        states(ctx, std::vector<uint8_t>(slot_bytes, 0x5A)),
        table(ctx, table_entries * 4),
        lens(ctx, batch * 4),
        rtiles(ctx, batch * 4),
        committed(ctx, batch * 4),
        slots(ctx, batch * 4),
        indptr(ctx, (batch + 1) * 4),
        k(ctx, max_tokens * kHk * kD * 4),
        v(ctx, max_tokens * kHk * kD * 4),
        q(ctx, max_tokens * kHq * kD * 4),
        out(ctx, std::vector<float>(max_tokens * kHq * kD, 0.f)),
        lse(ctx, std::vector<float>(max_tokens * kHq, 0.f)),
        af_ws(ctx, af_ws),
        attn_ws(ctx, attn_ws + 1) {}
  DeviceBuffer records, states, table, lens, rtiles, committed, slots, indptr, k, v, q, out, lse,
      af_ws, attn_ws;
};

TEST_F(CudaGraph, OnePoolMixedStepsReplayBitEqualToEager) {
  // The one-pool model's step as an engine captures it: the append-flush of every sequence's new
  // tokens (decode rows and prefill chunks of up to 160 tokens, committed at once, into slots of
  // G rows) then one attention call over records and slots under an extend plan sized by the
  // engine's maxima (1024 query tokens per sequence and per step: the device-built work list
  // launches the step's rows). Captured once; 300 replays with new lengths, tables and tokens,
  // sequences finishing and new ones taking their slots, equal bit for bit the eager calls:
  // outputs, lse, records, slots and record_tiles.
  KVT_SEEDED_RNG(rng, 0);
  kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", kD);
  cfg.sink_tiles = 0;
  const int G = cfg.tile_tokens, B = 6, max_chunk = 160, max_len = 6 * G;
  const size_t max_tokens = static_cast<size_t>(B) * max_chunk;
  const int max_blocks = max_len / G + 2, num_blocks = B * max_blocks;
  const size_t stride = (kvt::RecordBytes(cfg) + 15) / 16 * 16;
  size_t slot_bytes = 0, af_bytes = 0, attn_bytes = 0;
  KVT_ASSERT_OK(kvarn_tail_state_bytes(&cfg, kHk, 1, 16, &slot_bytes));
  KVT_ASSERT_OK(
      kvarn_paged_append_flush_tail_workspace_size(&cfg, kHk, B, 1, max_tokens, &af_bytes));
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = B;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = max_blocks;
  shape.max_q_per_seq = 1024;
  shape.max_total_q = 1024;
  kvarn_attention_plan_t* raw = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg, &shape, &ap, &raw));
  std::unique_ptr<kvarn_attention_plan_t, PlanDeleter> plan(raw);
  KVT_ASSERT_OK(kvarn_attention_plan_workspace_size(plan.get(), &attn_bytes));
  OnePoolSide graph_side(ctx_.get(), num_blocks * kHk * stride, B * slot_bytes,
                         static_cast<size_t>(B) * max_blocks, B, 1024, af_bytes, attn_bytes),
      eager_side(ctx_.get(), num_blocks * kHk * stride, B * slot_bytes,
                 static_cast<size_t>(B) * max_blocks, B, 1024, af_bytes, attn_bytes);
  const std::vector<int32_t> slots = {3, 5, 0, 1, 4, 2};
  const auto enqueue = [&](OnePoolSide& s) -> kvarn_status_t {
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = kHk;
    kv.batch = B;
    kv.records = s.records.get();
    kv.record_stride = stride;
    kv.num_record_blocks = num_blocks;
    kv.block_table = static_cast<const int32_t*>(s.table.get());
    kv.max_blocks_per_seq = max_blocks;
    kv.seq_lens = static_cast<const int32_t*>(s.lens.get());
    kv.record_tiles = static_cast<const int32_t*>(s.rtiles.get());
    kvarn_tail_state_t tail;
    kvarn_tail_state_defaults(&tail);
    tail.states = s.states.get();
    tail.slot_bytes = slot_bytes;
    tail.max_step_tokens = 1;
    tail.num_slots = B;
    tail.slots = static_cast<const int32_t*>(s.slots.get());
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.stream = stream_;
    launch.workspace = s.af_ws.get();
    launch.workspace_bytes = s.af_ws.bytes();
    const auto* indptr = static_cast<const int32_t*>(s.indptr.get());
    kvarn_status_t st = kvarn_paged_append_flush_tail_run(
        ctx_.get(), &cfg, &kv, &tail, &launch, indptr, max_tokens, KVARN_DTYPE_F32, s.k.get(),
        s.v.get(), static_cast<const int32_t*>(s.committed.get()),
        static_cast<int32_t*>(s.rtiles.get()));
    if (st != KVARN_OK) return st;
    launch.workspace = s.attn_ws.get();
    launch.workspace_bytes = s.attn_ws.bytes();
    return kvarn_paged_attention_tail_run(ctx_.get(), plan.get(), &kv, &tail, &launch, indptr,
                                          s.q.get(), s.out.get(), static_cast<float*>(s.lse.get()));
  };
  // Host state: lengths, the block table, each sequence's prompt and final length.
  std::vector<int32_t> lens(B, 0), rt(B, 0), table(static_cast<size_t>(B) * max_blocks, -1),
      prompt(B), target(B);
  std::vector<int32_t> free_blocks;
  for (int i = num_blocks - 1; i >= 0; --i) free_blocks.push_back(i);
  const auto start = [&](int b) {
    prompt[b] = static_cast<int32_t>(rng.Int(1, 4 * G));
    target[b] = prompt[b] + static_cast<int32_t>(rng.Int(1, 40));
  };
  for (int b = 0; b < B; ++b) start(b);
  for (OnePoolSide* s : {&graph_side, &eager_side}) {
    s->slots.Upload(slots);
    s->rtiles.Upload(rt);
  }
  cudaGraphExec_t exec = nullptr;
  int chunks = 0, finished = 0;
  for (int step = 0; step < 300; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<int32_t> indptr(B + 1, 0);
    for (int b = 0; b < B; ++b) {
      int n = lens[b] < prompt[b] ? std::min<int>(prompt[b] - lens[b], rng.Int(1, max_chunk)) : 1;
      chunks += n > 1;
      for (int64_t tile = lens[b] / G; tile <= (lens[b] + n - 1) / G; ++tile) {
        int32_t& e = table[static_cast<size_t>(b) * max_blocks + tile];
        if (e >= 0) continue;
        ASSERT_FALSE(free_blocks.empty());
        e = free_blocks.back();
        free_blocks.pop_back();
      }
      lens[b] += n;
      indptr[b + 1] = indptr[b] + n;
    }
    const size_t total = static_cast<size_t>(indptr[B]);
    std::vector<float> k(max_tokens * kHk * kD), v(k.size()),
        q(static_cast<size_t>(1024) * kHq * kD);
    for (auto& x : k) x = static_cast<float>(rng.Normal());
    for (auto& x : v) x = static_cast<float>(rng.Normal());
    for (auto& x : q) x = static_cast<float>(0.3 * rng.Normal());
    for (OnePoolSide* s : {&graph_side, &eager_side}) {
      s->table.Upload(table);
      s->lens.Upload(lens);
      s->committed.Upload(lens);  // every token committed at once
      s->indptr.Upload(indptr);
      s->k.Upload(k);
      s->v.Upload(v);
      s->q.Upload(q);
    }
    if (step == 0) {  // capture (runs nothing), after the arrays hold a real step
      cudaGraph_t graph = nullptr;
      CUDA_ASSERT(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal));
      const kvarn_status_t cst = enqueue(graph_side);
      const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      ASSERT_EQ(cst, KVARN_OK) << "during capture: " << kvarn_last_error();
      ASSERT_EQ(end, cudaSuccess) << cudaGetErrorString(end);
      CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));
      CUDA_ASSERT(cudaGraphDestroy(graph));
    }
    CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
    KVT_ASSERT_OK(enqueue(eager_side));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    KVT_ASSERT_OK(kvarn_context_synchronize(ctx_.get()));
    const auto out_g = graph_side.out.Download<float>(), out_e = eager_side.out.Download<float>();
    ASSERT_EQ(std::memcmp(out_g.data(), out_e.data(), total * kHq * kD * 4), 0) << "out";
    const auto lse_g = graph_side.lse.Download<float>(), lse_e = eager_side.lse.Download<float>();
    ASSERT_EQ(std::memcmp(lse_g.data(), lse_e.data(), total * kHq * 4), 0) << "lse";
    for (size_t i = 0; i < total * kHq * kD; ++i) ASSERT_TRUE(std::isfinite(out_g[i])) << i;
    const auto rt_g = graph_side.rtiles.Download<int32_t>();
    ASSERT_EQ(rt_g, eager_side.rtiles.Download<int32_t>());
    for (int b = 0; b < B; ++b) ASSERT_EQ(rt_g[b], lens[b] / G) << "sequence " << b;
    ASSERT_EQ(graph_side.records.Download<uint8_t>(), eager_side.records.Download<uint8_t>());
    ASSERT_EQ(graph_side.states.Download<uint8_t>(), eager_side.states.Download<uint8_t>());
    rt = rt_g;
    // Finished sequences leave (their blocks freed); a new request takes the slot.
    for (int b = 0; b < B; ++b) {
      if (lens[b] < target[b]) continue;
      for (int t = 0; t < max_blocks; ++t) {
        int32_t& e = table[static_cast<size_t>(b) * max_blocks + t];
        if (e >= 0) free_blocks.push_back(e);
        e = -1;
      }
      lens[b] = rt[b] = 0;
      start(b);
      ++finished;
    }
    for (OnePoolSide* s : {&graph_side, &eager_side}) s->rtiles.Upload(rt);
  }
  CUDA_ASSERT(cudaGraphExecDestroy(exec));
  EXPECT_GT(chunks, 20);
  EXPECT_GT(finished, 10);
}

TEST(CudaErrorWord, ShowsADeviceErrorBeforeSynchronizeAndClearsAtIt) {
  kvt::ContextPtr ctx = kvt::MakeCudaContext();
  if (!ctx) GTEST_SKIP() << "no CUDA device here: " << kvarn_last_error();
  auto cpu = kvt::MakeCpuContext();
  kvt::Rng rng(91);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  kvt::PagedCacheSpec spec;
  spec.lens = {900, 300};
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg, spec, rng, &pc));
  pc.block_table[2] = 1 << 20;  // sequence 0, tile 2: outside both pools
  kvt::DevicePagedCache dc(ctx.get(), pc);
  const int32_t* word = nullptr;
  ASSERT_EQ(kvarn_context_error_word(ctx.get(), &word), KVARN_OK) << kvarn_last_error();
  ASSERT_NE(word, nullptr);
  int32_t host = -1;
  ASSERT_EQ(cudaMemcpy(&host, word, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 0);
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = 8;
  size_t ws = 0;
  ASSERT_EQ(kvarn_paged_attention_workspace_size(ctx.get(), &cfg, &dc.kv, &p, 2, &ws), KVARN_OK);
  DeviceBuffer dq(ctx.get(), std::vector<float>(2 * 8 * 128, 0.5f));
  DeviceBuffer dout(ctx.get(), 2 * 8 * 128 * 4), dws(ctx.get(), std::max<size_t>(ws, 1));
  ASSERT_EQ(kvarn_paged_attention(ctx.get(), &cfg, &dc.kv, &p, dq.get(), dout.get(), nullptr,
                                  ws ? dws.get() : nullptr, ws),
            KVARN_OK)
      << kvarn_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the engine's own wait, not kvarn's
  ASSERT_EQ(cudaMemcpy(&host, word, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_context_synchronize(ctx.get()), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(kvarn_last_error()).find("block_table"), std::string::npos)
      << kvarn_last_error();
  ASSERT_EQ(cudaMemcpy(&host, word, sizeof host, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(host, 0);
  EXPECT_EQ(kvarn_context_synchronize(ctx.get()), KVARN_OK);
}

}  // namespace
