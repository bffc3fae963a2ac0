// Decode attention over a KVarN cache on CUDA (the target shapes of bench/RESULTS.md): time per
// call, bytes read, achieved bandwidth against the HBM peak and against a read-only kernel
// measured in the same run, and the kernel the plan chose. Uses the public C API for attention;
// CUDA events for timing.
//
//   bench_cuda_attention [--quick] [--csv FILE] [--shape BATCH CTX [NEW_TOKENS]]
//                        [--preset P] [--head-dim D] [--heads HQ HK] [--decode-grid]
//                        [--no-read-bw] [--graph] [--window W] [--sinks] [--softcap C]
//                        [--splits S]
//
// --graph: decode shapes run through the plan/run calls captured in a CUDA graph, one attention
// call per replay (as an engine replays its step; sdpa_baseline.py --graph does the same).
// --splits S: num_splits for every shape (0 = the plan's choice), to study the split count.
// --decode-grid: decode at batch 1, 8, 32 over 1k, 4k, 32k and 128k tokens (the issue's grid).
// --window W, --sinks, --softcap C: the model variants (docs/API.md "Model variants"); "MB read"
// counts only the tiles a window reaches (sdpa_baseline.py --window reads the same keys in fp16).
// The defaults are the design point: k4v2_g128, D 128, 32 query and 8 KV heads.
//
// The pools hold real records: a few hundred tiles of synthetic K/V are quantized through
// kvarn_quantize and replicated over the pool (attention's speed does not depend on the values,
// only on their being finite), block tables are random permutations.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu/bench_util.h"
#include "kvarn/kvarn.h"

namespace {

__global__ void ReadKernel(const uint4* p, size_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;  // keeps the loads alive
}

// Read bandwidth of this device, bytes/s (median of several runs over 4 GB).
double MeasureReadBandwidth() {
  const size_t bytes = size_t{4} << 30;
  void* buf;
  uint32_t* sink;
  CHECK_CUDA(cudaMalloc(&buf, bytes));
  CHECK_CUDA(cudaMalloc(&sink, 4));
  CHECK_CUDA(cudaMemset(buf, 1, bytes));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    CHECK_CUDA(cudaEventRecord(a));
    ReadKernel<<<sms * 8, 512>>>(static_cast<const uint4*>(buf), bytes / 16, sink);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaFree(buf));
  CHECK_CUDA(cudaFree(sink));
  return bytes / (ms[ms.size() / 2] * 1e-3);
}

struct Shape {
  int batch, ctx;
  int nq = 1;  // query tokens per sequence (1 = decode; more = extend, causal at the end)
};

// Median ms per call of `call` (after 3 warm-up calls), on the default stream.
double TimeCalls(kvarn_context_t* ctx, const std::function<void()>& call, int iters) {
  for (int i = 0; i < 3; ++i) call();
  CHECK_KV(kvarn_context_synchronize(ctx));
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
  std::vector<float> ms;
  for (int rep = 0; rep < 5; ++rep) {
    CHECK_CUDA(cudaEventRecord(ev0));
    for (int i = 0; i < iters; ++i) call();
    CHECK_CUDA(cudaEventRecord(ev1));
    CHECK_CUDA(cudaEventSynchronize(ev1));
    float t;
    CHECK_CUDA(cudaEventElapsedTime(&t, ev0, ev1));
    ms.push_back(t / iters);
  }
  CHECK_CUDA(cudaEventDestroy(ev0));
  CHECK_CUDA(cudaEventDestroy(ev1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// A run call under a plan of `shape` (its workspace allocated here); returns the plan's kernel.
struct RunCall {
  kvarn_context_t* ctx;
  kvarn_attention_plan_t* plan = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  RunCall(kvarn_context_t* c, const kvarn_config_t& cfg, const kvarn_attention_shape_t& shape,
          const kvarn_attention_params_t& p)
      : ctx(c) {
    CHECK_KV(kvarn_attention_plan_create(ctx, &cfg, &shape, &p, &plan));
    CHECK_KV(kvarn_attention_plan_workspace_size(plan, &ws_bytes));
    if (ws_bytes) CHECK_KV(kvarn_memory_alloc(ctx, ws_bytes, &ws));
  }
  ~RunCall() {
    kvarn_attention_plan_destroy(plan);
    if (ws) kvarn_memory_free(ctx, ws);
  }
  void operator()(const kvarn_paged_kv_t& kv, const int32_t* q_indptr, const void* q,
                  void* out) const {
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.workspace = ws;
    launch.workspace_bytes = ws_bytes;
    CHECK_KV(kvarn_paged_attention_run(ctx, plan, &kv, &launch, q_indptr, q, out, nullptr));
  }
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* csv_path = nullptr;
  int only_batch = 0, only_ctx = 0, only_nq = 1;
  const char* preset = "k4v2_g128";
  int D = 128, Hq = 32, Hk = 8;
  bool decode_grid = false, read_bw_wanted = true, graph = false;
  // --mixed: one engine step of 32 decode rows and 2 prefill chunks of 512 tokens over 8k-token
  // sequences: one run call under a plan sized by engine maxima (8192 query tokens per sequence
  // and per step), under a plan sized for the step, and as separate decode and extend calls.
  bool mixed = false;
  int window = 0;
  bool with_sinks = false;
  float softcap = 0.f;
  int splits = 0;  // --splits S: the plan's split count (0 = its own choice)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--decode-grid")) decode_grid = true;
    if (!std::strcmp(argv[i], "--no-read-bw")) read_bw_wanted = false;
    if (!std::strcmp(argv[i], "--graph")) graph = true;
    if (!std::strcmp(argv[i], "--mixed")) mixed = true;
    if (!std::strcmp(argv[i], "--preset") && i + 1 < argc) preset = argv[++i];
    if (!std::strcmp(argv[i], "--head-dim") && i + 1 < argc) D = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--heads") && i + 2 < argc) {
      Hq = std::atoi(argv[++i]);
      Hk = std::atoi(argv[++i]);
    }
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv_path = argv[++i];
    if (!std::strcmp(argv[i], "--window") && i + 1 < argc) window = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--sinks")) with_sinks = true;
    if (!std::strcmp(argv[i], "--splits") && i + 1 < argc) splits = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--softcap") && i + 1 < argc) softcap = std::atof(argv[++i]);
    if (!std::strcmp(argv[i], "--shape") && i + 2 < argc) {  // one shape (profiling)
      only_batch = std::atoi(argv[++i]);
      only_ctx = std::atoi(argv[++i]);
      if (i + 1 < argc && argv[i + 1][0] != '-') only_nq = std::atoi(argv[++i]);
    }
  }
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CUDA;
  kvarn_context_t* ctx = nullptr;
  CHECK_KV(kvarn_context_create(&o, &ctx));
  kvarn_config_t cfg;
  CHECK_KV(kvarn_config_from_preset(preset, D, &cfg));
  const int G = cfg.tile_tokens;
  size_t rb = 0;
  CHECK_KV(kvarn_record_bytes(&cfg, &rb));
  const size_t stride = (rb + 15) / 16 * 16;

  // A few hundred real records (quantized on the CPU from random data).
  const std::vector<uint8_t> unique = kvarn_bench::QuantizedRecords(cfg, stride, 256);

  const double read_bw = read_bw_wanted ? MeasureReadBandwidth() : 4.3e12;
  std::printf("device read bandwidth (read-only kernel, 4 GB): %.2f TB/s%s\n", read_bw / 1e12,
              read_bw_wanted ? "" : " (not measured: --no-read-bw)");
  std::printf("%s D%d Hq %d Hk %d\n", preset, D, Hq, Hk);
  const bool variants = window > 0 || with_sinks || softcap > 0.f;
  void* sinks = nullptr;
  if (variants) {
    std::printf("variants: window %d, sinks %s, softcap %g\n", window, with_sinks ? "yes" : "no",
                softcap);
    if (with_sinks) {
      std::vector<float> h(Hq);
      for (int h_i = 0; h_i < Hq; ++h_i) h[h_i] = 0.5f + 0.1f * static_cast<float>(h_i % 7);
      CHECK_KV(kvarn_memory_alloc(ctx, h.size() * 4, &sinks));
      CHECK_KV(kvarn_memory_copy(ctx, sinks, h.data(), h.size() * 4, KVARN_COPY_HOST_TO_DEVICE));
    }
  }

  std::vector<Shape> shapes;
  for (int b : {1, 8, 32}) {
    for (int c : {4096, 32768, 131072}) {
      if (quick && c > 32768) continue;
      shapes.push_back({b, c});
    }
  }
  shapes.push_back({1, 32768 + 2048, 2048});  // extend: 2k new tokens over 32k cached
  shapes.push_back({8, 8192 + 512, 512});     // extend: chunked prefill of 8 sequences
  if (decode_grid) {
    shapes.clear();
    for (int b : {1, 8, 32}) {
      for (int c : {1024, 4096, 32768, 131072}) shapes.push_back({b, c});
    }
  }
  if (only_batch > 0) shapes = {{only_batch, only_ctx, only_nq}};
  if (mixed) shapes = {{34, 8192, 512}};
  FILE* csv = csv_path ? std::fopen(csv_path, "w") : nullptr;
  if (csv) {
    std::fprintf(csv, "preset,D,hq,hk,batch,ctx,nq,ms,bytes,tbps,peak_frac,read_frac,kernel\n");
  }
  std::printf("%6s %7s %9s %10s %8s %8s %8s  %s\n", "batch", "ctx", "ms", "MB read", "TB/s", "/4.8",
              "/read", "kernel");
  cudaStream_t call_stream = nullptr;  // --graph: the stream the replays run on
  cudaEvent_t ev0, ev1;
  CHECK_CUDA(cudaEventCreate(&ev0));
  CHECK_CUDA(cudaEventCreate(&ev1));
  for (const Shape& s : shapes) {
    const int tiles = (s.ctx + G - 1) / G;
    const int rec_tiles = std::max(0, tiles - cfg.sink_tiles - 1);  // sink and last tile: fp16
    const int blocks = std::max(1, s.batch * rec_tiles);
    const int pages = s.batch * 2;
    void *records, *kp, *vp, *table, *lens, *rt, *q, *out, *ws = nullptr;
    CHECK_KV(kvarn_memory_alloc(ctx, size_t(blocks) * Hk * stride, &records));
    const size_t page_bytes = size_t(Hk) * G * D * 2;
    CHECK_KV(kvarn_memory_alloc(ctx, pages * page_bytes, &kp));
    CHECK_KV(kvarn_memory_alloc(ctx, pages * page_bytes, &vp));
    kvarn_bench::FillWithCopies(ctx, records, size_t(blocks) * Hk * stride, unique);
    {
      const std::vector<uint16_t> hp = kvarn_bench::RandomHalves(pages * page_bytes / 2, 11);
      CHECK_KV(kvarn_memory_copy(ctx, kp, hp.data(), hp.size() * 2, KVARN_COPY_HOST_TO_DEVICE));
      CHECK_KV(kvarn_memory_copy(ctx, vp, hp.data(), hp.size() * 2, KVARN_COPY_HOST_TO_DEVICE));
    }
    std::vector<int32_t> h_table(size_t(s.batch) * tiles), h_lens(s.batch, s.ctx),
        h_rt(s.batch, rec_tiles);
    std::vector<int32_t> perm(blocks);
    for (int i = 0; i < blocks; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
    for (int b = 0; b < s.batch; ++b) {
      h_table[size_t(b) * tiles] = 2 * b;  // sink page
      for (int i = 0; i < rec_tiles; ++i)
        h_table[size_t(b) * tiles + 1 + i] = perm[b * rec_tiles + i];
      if (tiles > 1) h_table[size_t(b) * tiles + tiles - 1] = 2 * b + 1;  // tail page
    }
    CHECK_KV(kvarn_memory_alloc(ctx, h_table.size() * 4, &table));
    CHECK_KV(kvarn_memory_alloc(ctx, s.batch * 4, &lens));
    CHECK_KV(kvarn_memory_alloc(ctx, s.batch * 4, &rt));
    CHECK_KV(kvarn_memory_copy(ctx, table, h_table.data(), h_table.size() * 4,
                               KVARN_COPY_HOST_TO_DEVICE));
    CHECK_KV(kvarn_memory_copy(ctx, lens, h_lens.data(), s.batch * 4, KVARN_COPY_HOST_TO_DEVICE));
    CHECK_KV(kvarn_memory_copy(ctx, rt, h_rt.data(), s.batch * 4, KVARN_COPY_HOST_TO_DEVICE));
    std::vector<int32_t> q_indptr(s.batch + 1);
    for (int b = 0; b <= s.batch; ++b) q_indptr[b] = b * s.nq;
    if (mixed) {  // sequences 0..31 decode, the last two prefill s.nq tokens
      for (int b = 0; b <= s.batch; ++b) q_indptr[b] = std::min(b, 32) + std::max(0, b - 32) * s.nq;
    }
    const size_t total_q = static_cast<size_t>(q_indptr[s.batch]);
    std::vector<uint16_t> hq(total_q * Hq * D, 0x3c00);  // 1.0
    for (size_t i = 0; i < hq.size(); ++i)
      hq[i] = static_cast<uint16_t>(0x3000 + (i * 7919) % 0x0c00);
    CHECK_KV(kvarn_memory_alloc(ctx, hq.size() * 2, &q));
    CHECK_KV(kvarn_memory_alloc(ctx, hq.size() * 2, &out));
    CHECK_KV(kvarn_memory_copy(ctx, q, hq.data(), hq.size() * 2, KVARN_COPY_HOST_TO_DEVICE));

    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = Hk;
    kv.batch = s.batch;
    kv.records = records;
    kv.record_stride = stride;
    kv.num_record_blocks = blocks;
    kv.k_pages = kp;
    kv.v_pages = vp;
    kv.num_pages = pages;
    kv.block_table = static_cast<const int32_t*>(table);
    kv.max_blocks_per_seq = tiles;
    kv.seq_lens = static_cast<const int32_t*>(lens);
    kv.record_tiles = static_cast<const int32_t*>(rt);
    kvarn_attention_params_t p;
    kvarn_attention_params_defaults(&p);
    p.num_q_heads = Hq;
    p.num_splits = splits;
    p.sinks = static_cast<const float*>(sinks);
    p.sliding_window = window;
    p.logit_softcap = softcap;
    p.q_dtype = KVARN_DTYPE_F16;
    p.out_dtype = KVARN_DTYPE_F16;
    p.q_indptr = s.nq > 1 ? q_indptr.data() : nullptr;
    if (mixed) {
      void* d_indptr = nullptr;
      CHECK_KV(kvarn_memory_alloc(ctx, q_indptr.size() * 4, &d_indptr));
      CHECK_KV(kvarn_memory_copy(ctx, d_indptr, q_indptr.data(), q_indptr.size() * 4,
                                 KVARN_COPY_HOST_TO_DEVICE));
      const std::vector<int32_t> chunk_indptr = {0, s.nq, 2 * s.nq};
      void* d_chunk_indptr = nullptr;
      CHECK_KV(kvarn_memory_alloc(ctx, 12, &d_chunk_indptr));
      CHECK_KV(kvarn_memory_copy(ctx, d_chunk_indptr, chunk_indptr.data(), 12,
                                 KVARN_COPY_HOST_TO_DEVICE));
      kvarn_attention_params_t rp = p;
      rp.q_indptr = nullptr;
      kvarn_attention_shape_t shape;
      kvarn_attention_shape_defaults(&shape);
      shape.batch = s.batch;
      shape.num_kv_heads = Hk;
      shape.max_blocks_per_seq = tiles;
      kvarn_attention_shape_t loose = shape, tight = shape, dec = shape, ext = shape;
      loose.max_q_per_seq = 8192;
      loose.max_total_q = 8192;
      tight.max_q_per_seq = s.nq;
      tight.max_total_q = static_cast<int64_t>(total_q);
      dec.batch = 32;
      ext.batch = 2;
      ext.max_q_per_seq = s.nq;
      ext.max_total_q = 2 * s.nq;
      const RunCall loose_call(ctx, cfg, loose, rp), tight_call(ctx, cfg, tight, rp),
          dec_call(ctx, cfg, dec, rp), ext_call(ctx, cfg, ext, rp);
      // The two chunks' view: the last two sequences' table rows, lengths, queries and outputs.
      kvarn_paged_kv_t kv_dec = kv, kv_ext = kv;
      kv_dec.batch = 32;
      kv_ext.batch = 2;
      kv_ext.block_table = static_cast<const int32_t*>(table) + size_t(32) * tiles;
      kv_ext.seq_lens = static_cast<const int32_t*>(lens) + 32;
      kv_ext.record_tiles = static_cast<const int32_t*>(rt) + 32;
      const size_t row = size_t(Hq) * D * 2;  // bytes of one query token
      const auto ip = static_cast<const int32_t*>(d_indptr);
      const double t_loose = TimeCalls(
          ctx, [&] { loose_call(kv, ip, q, out); }, 50);
      const double t_tight = TimeCalls(
          ctx, [&] { tight_call(kv, ip, q, out); }, 50);
      const double t_sep = TimeCalls(
          ctx,
          [&] {
            dec_call(kv_dec, nullptr, q, out);
            ext_call(kv_ext, static_cast<const int32_t*>(d_chunk_indptr),
                     static_cast<const char*>(q) + 32 * row, static_cast<char*>(out) + 32 * row);
          },
          50);
      std::printf("mixed step (32 decode rows + 2 x %d-token chunks, %d-token sequences, %s):\n",
                  s.nq, s.ctx, preset);
      std::printf("  one call, plan sized by maxima (8192/seq, 8192/step): %.4f ms\n", t_loose);
      std::printf("  one call, plan sized for the step:                    %.4f ms\n", t_tight);
      std::printf("  decode call + extend call:                            %.4f ms\n", t_sep);
      for (void* ptr : {d_indptr, d_chunk_indptr}) kvarn_memory_free(ctx, ptr);
      for (void* ptr : {records, kp, vp, table, lens, rt, q, out}) kvarn_memory_free(ctx, ptr);
      continue;
    }
    size_t ws_bytes = 0;
    CHECK_KV(kvarn_paged_attention_workspace_size(ctx, &cfg, &kv, &p, total_q, &ws_bytes));
    const std::string kernel = kvarn_bench::PlannedKernel(ctx, cfg, kv, p, s.nq);
    if (ws_bytes) CHECK_KV(kvarn_memory_alloc(ctx, ws_bytes, &ws));
    std::function<void()> call = [&] {
      CHECK_KV(kvarn_paged_attention(ctx, &cfg, &kv, &p, q, out, nullptr, ws, ws_bytes));
    };
    // --graph (decode): the plan/run call captured once, each timed call one replay.
    kvarn_attention_plan_t* plan = nullptr;
    cudaGraphExec_t exec = nullptr;
    void* plan_ws = nullptr;
    if (graph && s.nq == 1) {
      kvarn_attention_shape_t shape;
      kvarn_attention_shape_defaults(&shape);
      shape.batch = s.batch;
      shape.num_kv_heads = Hk;
      shape.max_blocks_per_seq = tiles;
      kvarn_attention_params_t planned = p;
      planned.q_indptr = nullptr;
      CHECK_KV(kvarn_attention_plan_create(ctx, &cfg, &shape, &planned, &plan));
      size_t plan_ws_bytes = 0;
      CHECK_KV(kvarn_attention_plan_workspace_size(plan, &plan_ws_bytes));
      if (plan_ws_bytes) CHECK_KV(kvarn_memory_alloc(ctx, plan_ws_bytes, &plan_ws));
      kvarn_launch_t launch;
      kvarn_launch_defaults(&launch);
      cudaStream_t gs;  // a stream of our own: the legacy default stream cannot be captured
      CHECK_CUDA(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
      launch.stream = gs;
      launch.workspace = plan_ws;
      launch.workspace_bytes = plan_ws_bytes;
      CHECK_KV(kvarn_paged_attention_run(ctx, plan, &kv, &launch, nullptr, q, out, nullptr));
      CHECK_CUDA(cudaStreamSynchronize(gs));
      cudaGraph_t g;
      CHECK_CUDA(cudaStreamBeginCapture(gs, cudaStreamCaptureModeThreadLocal));
      CHECK_KV(kvarn_paged_attention_run(ctx, plan, &kv, &launch, nullptr, q, out, nullptr));
      CHECK_CUDA(cudaStreamEndCapture(gs, &g));
      CHECK_CUDA(cudaGraphInstantiate(&exec, g, 0));
      CHECK_CUDA(cudaGraphDestroy(g));
      call = [&, gs] { CHECK_CUDA(cudaGraphLaunch(exec, gs)); };
      call_stream = gs;  // the timing events go on it too
    }
    for (int i = 0; i < 3; ++i) call();
    CHECK_KV(kvarn_context_synchronize(ctx));
    if (call_stream) CHECK_CUDA(cudaStreamSynchronize(call_stream));
    const int iters = s.ctx * s.batch >= (1 << 20) ? 20 : 100;
    std::vector<float> ms;
    for (int rep = 0; rep < 5; ++rep) {
      CHECK_CUDA(cudaEventRecord(ev0, call_stream));
      for (int i = 0; i < iters; ++i) call();
      CHECK_CUDA(cudaEventRecord(ev1, call_stream));
      CHECK_CUDA(cudaEventSynchronize(ev1));
      float t;
      CHECK_CUDA(cudaEventElapsedTime(&t, ev0, ev1));
      ms.push_back(t / iters);
    }
    CHECK_KV(kvarn_context_synchronize(ctx));
    if (exec) {
      CHECK_CUDA(cudaGraphExecDestroy(exec));
      CHECK_CUDA(cudaStreamDestroy(call_stream));
      kvarn_attention_plan_destroy(plan);
      kvarn_memory_free(ctx, plan_ws);
      call_stream = nullptr;
    }
    std::sort(ms.begin(), ms.end());
    const double t = ms[ms.size() / 2];
    // Bytes of the tiles the call reads: all of them, or from the first query's window on.
    const int first_key = window > 0 ? std::max(0, s.ctx - s.nq - window + 1) : 0;
    double per_head = 0;
    for (int t = first_key / G; t < tiles; ++t) {
      const bool is_record = t >= cfg.sink_tiles && t < cfg.sink_tiles + rec_tiles;
      per_head += is_record ? double(rb) : 2.0 * std::min(G, s.ctx - t * G) * D * 2;
    }
    const double bytes = double(s.batch) * Hk * per_head;
    const double bw = bytes / (t * 1e-3);
    std::printf("%6d %7d%s %9.4f %10.1f %8.3f %7.1f%% %7.1f%%  %s\n", s.batch, s.ctx,
                s.nq > 1 ? (" q" + std::to_string(s.nq)).c_str() : "", t, bytes / 1e6, bw / 1e12,
                100 * bw / 4.8e12, 100 * bw / read_bw, kernel.c_str());
    if (csv) {
      std::fprintf(csv, "%s,%d,%d,%d,%d,%d,%d,%.5f,%.0f,%.4f,%.4f,%.4f,%s\n", preset, D, Hq, Hk,
                   s.batch, s.ctx, s.nq, t, bytes, bw / 1e12, bw / 4.8e12, bw / read_bw,
                   kernel.c_str());
    }
    for (void* ptr : {records, kp, vp, table, lens, rt, q, out, ws}) {
      if (ptr) kvarn_memory_free(ctx, ptr);
    }
  }
  if (csv) std::fclose(csv);
  if (sinks) kvarn_memory_free(ctx, sinks);
  kvarn_context_destroy(ctx);
  return 0;
}
