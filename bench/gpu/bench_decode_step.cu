// A whole decode step through the capturable layer 2 (kvarn.h "plan / run"), eager against one
// CUDA graph replay: for each of L layers, append one token per sequence by slot, flush one
// completed tile (an upper bound: at G 128 a batch of 32 completes 0.25 tiles per step on
// average), and attention over the quantized cache. Batch 32, 32k context, Hk 8, Hq 32, D 128,
// k4v2_g128. The layers share one pool (the bytes read per layer are the same as with a pool
// per layer, and 0.9 GB per layer is far beyond L2), so the pools fit any batch/context here.
//
//   bench_decode_step [--batch B] [--ctx N] [--layers L] [--steps S]
//
// Modes: host-list (kvarn_paged_append / kvarn_paged_flush / kvarn_paged_attention, the flush
// waiting for the device per layer), eager (the run calls, no waits), graph (one replay per
// step), graph-fork (each layer's flush on a second stream, off the critical path), graph-nf
// (the first graph when no tile completes: the device count is 0). Prints the
// time per step of back-to-back steps (steps per second), the host time to enqueue one step on
// an idle queue, and attention alone per layer.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "bench/gpu/bench_util.h"
#include "kvarn/kvarn.h"

namespace {

void* Alloc(kvarn_context_t* ctx, size_t bytes) {
  void* p = nullptr;
  CHECK_KV(kvarn_memory_alloc(ctx, bytes, &p));
  return p;
}

template <typename T>
void* Upload(kvarn_context_t* ctx, const std::vector<T>& host) {
  void* p = Alloc(ctx, host.size() * sizeof(T));
  CHECK_KV(
      kvarn_memory_copy(ctx, p, host.data(), host.size() * sizeof(T), KVARN_COPY_HOST_TO_DEVICE));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int B = 32, ctx_len = 32768, layers = 32, steps = 50;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--batch"))
      B = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--ctx"))
      ctx_len = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--layers"))
      layers = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(argv[++i]);
  }
  const int D = 128, G = 128, Hq = 32, Hk = 8;
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CUDA;
  kvarn_context_t* ctx = nullptr;
  CHECK_KV(kvarn_context_create(&o, &ctx));
  kvarn_config_t cfg;
  CHECK_KV(kvarn_config_from_preset("k4v2_g128", D, &cfg));
  size_t rb = 0;
  CHECK_KV(kvarn_record_bytes(&cfg, &rb));
  const size_t stride = (rb + 15) / 16 * 16;

  // Pools: per sequence a sink page, a tail page holding the new token, records in between,
  // plus one spare block the flushed tile is written to.
  const int tiles = (ctx_len + G - 1) / G;
  const int rec_tiles = tiles - cfg.sink_tiles - 1;
  const int blocks = B * rec_tiles + 1, pages = 2 * B;
  const size_t page_bytes = size_t(Hk) * G * D * 2;
  const size_t pool_bytes = size_t(blocks) * Hk * stride;
  void* records = Alloc(ctx, pool_bytes);
  kvarn_bench::FillWithCopies(ctx, records, pool_bytes,
                              kvarn_bench::QuantizedRecords(cfg, stride, 256));
  const std::vector<uint16_t> hp = kvarn_bench::RandomHalves(pages * page_bytes / 2, 11);
  void* kp = Upload(ctx, hp);
  void* vp = Upload(ctx, hp);
  std::vector<int32_t> table(size_t(B) * tiles), lens(B, ctx_len), rt(B, rec_tiles);
  std::vector<int32_t> perm(B * rec_tiles);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  for (int b = 0; b < B; ++b) {
    table[size_t(b) * tiles] = 2 * b;
    for (int i = 0; i < rec_tiles; ++i) table[size_t(b) * tiles + 1 + i] = perm[b * rec_tiles + i];
    table[size_t(b) * tiles + tiles - 1] = 2 * b + 1;
  }
  // Step metadata: one token per sequence at the last position of its tail page; one flush
  // entry (the tail page of sequence 0 into the spare block).
  std::vector<int32_t> indptr(B + 1), slots(B);
  for (int b = 0; b <= B; ++b) indptr[b] = b;
  for (int b = 0; b < B; ++b) slots[b] = (2 * b + 1) * G + (ctx_len - 1) % G;
  void* d_table = Upload(ctx, table);
  void* d_lens = Upload(ctx, lens);
  void* d_rt = Upload(ctx, rt);
  void* d_indptr = Upload(ctx, indptr);
  void* d_slots = Upload(ctx, slots);
  void* d_count = Upload(ctx, std::vector<int32_t>{1});
  void* d_no_flush = Upload(ctx, std::vector<int32_t>{0});
  std::vector<int32_t> lens_before(B, ctx_len - 1);
  void* d_lens_before = Upload(ctx, lens_before);
  void* d_src = Upload(ctx, std::vector<int32_t>(B, 1));
  void* d_dst = Upload(ctx, std::vector<int32_t>(B, blocks - 1));
  void* d_seq = Upload(ctx, std::vector<int32_t>(B, 0));
  void* d_status = Upload(ctx, std::vector<int32_t>(B, 0));
  std::vector<uint16_t> hkv(size_t(B) * Hk * D), hq(size_t(B) * Hq * D);
  for (size_t i = 0; i < hkv.size(); ++i)
    hkv[i] = static_cast<uint16_t>(0x3000 + (i * 7919) % 0x0c00);
  for (size_t i = 0; i < hq.size(); ++i)
    hq[i] = static_cast<uint16_t>(0x3000 + (i * 104729) % 0x0c00);
  void* d_k = Upload(ctx, hkv);
  void* d_v = Upload(ctx, hkv);
  void* d_q = Upload(ctx, hq);
  void* d_out = Alloc(ctx, hq.size() * 2);

  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = Hk;
  kv.batch = B;
  kv.records = records;
  kv.record_stride = stride;
  kv.num_record_blocks = blocks;
  kv.k_pages = kp;
  kv.v_pages = vp;
  kv.num_pages = pages;
  kv.block_table = static_cast<const int32_t*>(d_table);
  kv.max_blocks_per_seq = tiles;
  kv.seq_lens = static_cast<const int32_t*>(d_lens);
  kv.record_tiles = static_cast<const int32_t*>(d_rt);
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = B;
  shape.num_kv_heads = Hk;
  shape.max_blocks_per_seq = tiles;
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = Hq;
  ap.q_dtype = KVARN_DTYPE_F16;
  ap.out_dtype = KVARN_DTYPE_F16;
  kvarn_attention_plan_t* plan = nullptr;
  CHECK_KV(kvarn_attention_plan_create(ctx, &cfg, &shape, &ap, &plan));
  size_t attn_ws = 0, flush_ws = 0;
  CHECK_KV(kvarn_attention_plan_workspace_size(plan, &attn_ws));
  CHECK_KV(kvarn_paged_flush_workspace_size(&cfg, Hk, B, &flush_ws));
  void* d_attn_ws = Alloc(ctx, attn_ws + 256);
  void* d_flush_ws = Alloc(ctx, flush_ws);

  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.stream = stream;
  launch.seq_status = static_cast<int32_t*>(d_status);
  auto step = [&] {
    for (int l = 0; l < layers; ++l) {
      launch.workspace = nullptr;
      launch.workspace_bytes = 0;
      CHECK_KV(kvarn_paged_append_run(
          ctx, &cfg, &kv, &launch, static_cast<const int32_t*>(d_indptr),
          static_cast<const int32_t*>(d_slots), B, KVARN_DTYPE_F16, d_k, d_v));
      launch.workspace = d_flush_ws;
      launch.workspace_bytes = flush_ws;
      CHECK_KV(kvarn_paged_flush_run(
          ctx, &cfg, &kv, &launch, B, static_cast<const int32_t*>(d_count),
          static_cast<const int32_t*>(d_src), static_cast<const int32_t*>(d_dst),
          static_cast<const int32_t*>(d_seq)));
      launch.workspace = d_attn_ws;
      launch.workspace_bytes = attn_ws + 256;
      CHECK_KV(kvarn_paged_attention_run(ctx, plan, &kv, &launch, nullptr, d_q, d_out, nullptr));
    }
  };
  // The same step through the host-list calls (the API before the run calls): append at
  // seq_lens (one length array before, one after), a host flush list (the call waits for the
  // device to report), host-sized attention.
  kvarn_paged_kv_t kv_before = kv;
  kv_before.seq_lens = static_cast<const int32_t*>(d_lens_before);
  const int32_t flush_src = 1, flush_dst = blocks - 1;
  size_t host_ws = 0;
  CHECK_KV(kvarn_paged_attention_workspace_size(ctx, &cfg, &kv, &ap, B, &host_ws));
  void* d_host_ws = Alloc(ctx, host_ws + 256);
  auto host_list_step = [&] {
    for (int l = 0; l < layers; ++l) {
      CHECK_KV(kvarn_paged_append(ctx, &cfg, &kv_before, indptr.data(), KVARN_DTYPE_F16, d_k, d_v));
      CHECK_KV(kvarn_paged_flush(ctx, &cfg, &kv, 1, &flush_src, &flush_dst));
      CHECK_KV(kvarn_paged_attention(ctx, &cfg, &kv, &ap, d_q, d_out, nullptr, d_host_ws,
                                     host_ws + 256));
    }
  };
  // Attention alone, for the per-layer comparison with the fp16 baseline.
  auto attention_only = [&] {
    for (int l = 0; l < layers; ++l) {
      CHECK_KV(kvarn_paged_attention_run(ctx, plan, &kv, &launch, nullptr, d_q, d_out, nullptr));
    }
  };
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  // Device time per step (back-to-back steps), and the host time to enqueue one step when the
  // queue is empty (what a step costs the CPU, not hidden behind a full launch queue).
  auto time_it = [&](auto&& body, double* host_ms) {
    body();  // warm up
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_KV(kvarn_context_synchronize(ctx));
    std::vector<double> enqueue;
    for (int rep = 0; rep < 7; ++rep) {
      const auto h0 = std::chrono::steady_clock::now();
      body();
      const auto h1 = std::chrono::steady_clock::now();
      enqueue.push_back(std::chrono::duration<double, std::milli>(h1 - h0).count());
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_KV(kvarn_context_synchronize(ctx));
    }
    std::sort(enqueue.begin(), enqueue.end());
    std::vector<float> ms;
    for (int rep = 0; rep < 5; ++rep) {
      const auto h0 = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) body();
      CHECK_CUDA(cudaStreamSynchronize(stream));
      CHECK_KV(kvarn_context_synchronize(ctx));
      const auto h1 = std::chrono::steady_clock::now();
      ms.push_back(
          static_cast<float>(std::chrono::duration<double, std::milli>(h1 - h0).count() / steps));
    }
    std::sort(ms.begin(), ms.end());
    if (host_ms) *host_ms = enqueue[enqueue.size() / 2];
    return static_cast<double>(ms[ms.size() / 2]);
  };
  double eager_host = 0, graph_host = 0, list_host = 0, nf_host = 0;
  const double host_list = time_it(host_list_step, &list_host);
  const double eager = time_it(step, &eager_host);
  const double attn = time_it(attention_only, nullptr);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  size_t nodes = 0;
  CHECK_CUDA(cudaGraphGetNodes(graph, nullptr, &nodes));
  const double replay = time_it([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, &graph_host);
  // The flush off the critical path: attention reads the completed tile from its page in this
  // step (the engine points the table at the record from the next step on), so each layer's
  // flush runs on a second stream, forked after the layer's append and joined at the end of the
  // step. (Here the layers share one pool, so a flush may read a page the next layer's append
  // writes: harmless for timing; an engine has a pool per layer.)
  cudaStream_t side;
  CHECK_CUDA(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  auto step_forked = [&] {
    for (int l = 0; l < layers; ++l) {
      launch.stream = stream;
      launch.workspace = nullptr;
      launch.workspace_bytes = 0;
      CHECK_KV(kvarn_paged_append_run(
          ctx, &cfg, &kv, &launch, static_cast<const int32_t*>(d_indptr),
          static_cast<const int32_t*>(d_slots), B, KVARN_DTYPE_F16, d_k, d_v));
      CHECK_CUDA(cudaEventRecord(fork, stream));
      CHECK_CUDA(cudaStreamWaitEvent(side, fork, 0));
      launch.stream = side;
      launch.workspace = d_flush_ws;
      launch.workspace_bytes = flush_ws;
      CHECK_KV(kvarn_paged_flush_run(
          ctx, &cfg, &kv, &launch, B, static_cast<const int32_t*>(d_count),
          static_cast<const int32_t*>(d_src), static_cast<const int32_t*>(d_dst),
          static_cast<const int32_t*>(d_seq)));
      launch.stream = stream;
      launch.workspace = d_attn_ws;
      launch.workspace_bytes = attn_ws + 256;
      CHECK_KV(kvarn_paged_attention_run(ctx, plan, &kv, &launch, nullptr, d_q, d_out, nullptr));
    }
    CHECK_CUDA(cudaEventRecord(join, side));
    CHECK_CUDA(cudaStreamWaitEvent(stream, join, 0));
  };
  cudaGraph_t graph_fork;
  cudaGraphExec_t exec_fork;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step_forked();
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph_fork));
  CHECK_CUDA(cudaGraphInstantiate(&exec_fork, graph_fork, 0));
  double fork_host = 0;
  const double replay_fork =
      time_it([&] { CHECK_CUDA(cudaGraphLaunch(exec_fork, stream)); }, &fork_host);
  // The same graph when no tile completes (the device count is 0): most steps of a batch.
  CHECK_CUDA(cudaMemcpy(d_count, d_no_flush, 4, cudaMemcpyDeviceToDevice));
  const double replay_nf = time_it([&] { CHECK_CUDA(cudaGraphLaunch(exec, stream)); }, &nf_host);
  CHECK_KV(kvarn_context_synchronize(ctx));
  std::vector<int32_t> status(B);
  CHECK_KV(kvarn_memory_copy(ctx, status.data(), d_status, B * 4, KVARN_COPY_DEVICE_TO_HOST));
  for (int b = 0; b < B; ++b) {
    if (status[b] != 0) {
      std::fprintf(stderr, "sequence %d faulted with status %d\n", b, status[b]);
      return 1;
    }
  }
  const double bytes =
      double(B) * Hk * (double(rec_tiles) * rb + 2.0 * (ctx_len - rec_tiles * G) * D * 2);
  std::printf(
      "decode step: batch %d, context %d, %d layers (append + flush of one tile + "
      "attention per layer), %zu graph nodes\n",
      B, ctx_len, layers, nodes);
  std::printf("%-10s %12s %12s %14s %14s\n", "mode", "ms/step", "steps/s", "host ms/step",
              "ms/layer");
  std::printf("%-10s %12.3f %12.1f %14.3f %14.4f\n", "host-list", host_list, 1e3 / host_list,
              list_host, host_list / layers);
  std::printf("%-10s %12.3f %12.1f %14.3f %14.4f\n", "eager", eager, 1e3 / eager, eager_host,
              eager / layers);
  std::printf("%-10s %12.3f %12.1f %14.3f %14.4f\n", "graph", replay, 1e3 / replay, graph_host,
              replay / layers);
  std::printf("%-10s %12.3f %12.1f %14.3f %14.4f\n", "graph-fork", replay_fork, 1e3 / replay_fork,
              fork_host, replay_fork / layers);
  std::printf("%-10s %12.3f %12.1f %14.3f %14.4f\n", "graph-nf", replay_nf, 1e3 / replay_nf,
              nf_host, replay_nf / layers);
  std::printf("attention alone: %.4f ms/layer, %.2f TB/s over %.1f MB per layer\n", attn / layers,
              bytes / (attn / layers * 1e-3) / 1e12, bytes / 1e6);
  std::printf("csv,decode_step,%d,%d,%d,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f\n", B, ctx_len, layers,
              host_list, eager, replay, replay_nf, list_host, eager_host, graph_host);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaGraphExecDestroy(exec_fork);
  cudaGraphDestroy(graph_fork);
  kvarn_attention_plan_destroy(plan);
  kvarn_context_destroy(ctx);
  return 0;
}
