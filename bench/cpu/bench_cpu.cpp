// CPU benchmarks of the public API (Google Benchmark). Each benchmark runs at one ISA level
// (label "isa=..."; chosen with kvarn_set_max_cpu_isa) and reports the bytes it moves and, for
// attention, the flops, so every figure can be read against the roofline measured in the same
// run (BM_ReadBandwidth; the fp32 FMA peak). bench/cpu/run.sh runs them and appends the table to
// bench/RESULTS.md.
//   kvarn-bench-cpu --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <kvarn/kvarn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// ISA argument of the benchmarks: 0 = scalar reference, 1 = AVX2, 2 = AVX-512, 3 = NEON.
kvarn_cpu_isa_t IsaArg(int64_t a) {
  switch (a) {
    case 1:
      return KVARN_CPU_ISA_AVX2;
    case 2:
      return KVARN_CPU_ISA_AVX512;
    case 3:
      return KVARN_CPU_ISA_NEON;
    default:
      return KVARN_CPU_ISA_SCALAR;
  }
}

// A CPU context at `isa` (0 threads = all cores); NULL with an error on the state when this
// machine or build cannot run it.
kvarn_context_t* MakeContext(benchmark::State& state, int threads, int64_t isa_arg) {
  const kvarn_cpu_isa_t isa = IsaArg(isa_arg);
  kvarn_set_max_cpu_isa(isa);
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  o.num_threads = threads;
  kvarn_context_t* c = nullptr;
  const kvarn_status_t st = kvarn_context_create(&o, &c);
  kvarn_set_max_cpu_isa(kvarn_cpu_isa_best());
  kvarn_cpu_isa_t got = KVARN_CPU_ISA_NONE;
  if (st == KVARN_OK) kvarn_context_get_cpu_isa(c, &got);
  if (st != KVARN_OK || got != isa) {
    state.SkipWithError((std::string("ISA ") + kvarn_cpu_isa_name(isa) + " not available").c_str());
    kvarn_context_destroy(c);
    return nullptr;
  }
  return c;
}

std::vector<float> Randn(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

const char* PresetArg(int64_t a) {
  return a == 0 ? "k4v2_g128" : a == 1 ? "k4v4_g128" : "k4v2_g64";
}

// The ISA levels this machine can run, for the benchmarks' argument lists.
std::vector<int64_t> Isas(bool with_scalar) {
  std::vector<int64_t> v;
  if (with_scalar) v.push_back(0);
  const kvarn_cpu_isa_t best = kvarn_cpu_isa_best();
  if (best == KVARN_CPU_ISA_AVX512) v.push_back(1);
  if (best == KVARN_CPU_ISA_AVX512 || best == KVARN_CPU_ISA_AVX2)
    v.push_back(best == KVARN_CPU_ISA_AVX512 ? 2 : 1);
  if (best == KVARN_CPU_ISA_NEON) v.push_back(3);
  return v;
}

void Label(benchmark::State& state, const std::string& what, int64_t isa_arg) {
  state.SetLabel(what + " isa=" + kvarn_cpu_isa_name(IsaArg(isa_arg)));
}

// ---- codec ------------------------------------------------------------------------------------

// Quantize: records per second, D128, fp32 input (rotation included); args: threads, preset, isa.
void BM_Quantize(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const char* preset = PresetArg(state.range(1));
  kvarn_context_t* ctx = MakeContext(state, threads, state.range(2));
  if (ctx == nullptr) return;
  kvarn_config_t cfg;
  kvarn_config_from_preset(preset, 128, &cfg);
  size_t rb = 0;
  kvarn_record_bytes(&cfg, &rb);
  const size_t tiles = 32;
  const auto k = Randn(tiles * cfg.tile_tokens * 128, 1), v = Randn(k.size(), 2);
  std::vector<uint8_t> rec(tiles * rb);
  for (auto _ : state) {
    if (kvarn_quantize(ctx, &cfg, tiles, KVARN_DTYPE_F32, k.data(), v.data(), 0, rec.data(), rb) !=
        KVARN_OK) {
      state.SkipWithError(kvarn_last_error());
      break;
    }
  }
  state.counters["records/s"] = benchmark::Counter(static_cast<double>(tiles * state.iterations()),
                                                   benchmark::Counter::kIsRate);
  Label(state, preset, state.range(2));
  kvarn_context_destroy(ctx);
}

void QuantizeArgs(benchmark::internal::Benchmark* b) {
  for (int64_t isa : Isas(true)) {
    for (int64_t preset : {0, 1, 2}) {
      b->Args({1, preset, isa});
      if (isa != 0) b->Args({2, preset, isa});
    }
  }
}
BENCHMARK(BM_Quantize)->Apply(QuantizeArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

// Dequantize (cache frame + un-rotation to fp32), 1 thread, k4v2_g128 D128; arg: isa.
void BM_Dequantize(benchmark::State& state) {
  kvarn_context_t* ctx = MakeContext(state, 1, state.range(0));
  if (ctx == nullptr) return;
  kvarn_config_t cfg;
  kvarn_config_from_preset("k4v2_g128", 128, &cfg);
  size_t rb = 0;
  kvarn_record_bytes(&cfg, &rb);
  const size_t tiles = 16;
  const auto k = Randn(tiles * 128 * 128, 1), v = Randn(k.size(), 2);
  std::vector<uint8_t> rec(tiles * rb);
  kvarn_quantize(ctx, &cfg, tiles, KVARN_DTYPE_F32, k.data(), v.data(), 0, rec.data(), rb);
  std::vector<float> ko(k.size()), vo(k.size());
  for (auto _ : state) {
    kvarn_dequantize(ctx, &cfg, tiles, rec.data(), rb, 0, KVARN_DTYPE_F32, ko.data(), vo.data());
  }
  state.counters["records/s"] = benchmark::Counter(static_cast<double>(tiles * state.iterations()),
                                                   benchmark::Counter::kIsRate);
  Label(state, "k4v2_g128", state.range(0));
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_Dequantize)->ArgsProduct({Isas(true)})->UseRealTime()->Unit(benchmark::kMillisecond);

// Hadamard rotation of fp16 rows (D128), 1 thread: the cache's append path; arg: isa.
void BM_Rotate(benchmark::State& state) {
  kvarn_context_t* ctx = MakeContext(state, 1, state.range(0));
  if (ctx == nullptr) return;
  const size_t rows = 8192;
  std::vector<uint16_t> x(rows * 128), y(x.size());
  std::mt19937 rng(7);
  for (auto& h : x) h = static_cast<uint16_t>(0x3000 + (rng() & 0x7ff) + ((rng() & 1) << 15));
  for (auto _ : state) {
    kvarn_rotate(ctx, 128, rows, KVARN_DTYPE_F16, x.data(), KVARN_DTYPE_F16, y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * rows * 128 * 2 * 2));
  Label(state, "D128 f16", state.range(0));
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_Rotate)->ArgsProduct({Isas(true)})->UseRealTime();

// ---- layer 2: append, flush, attention over engine-owned pools -------------------------------

// A paged cache for `batch` sequences of `len` tokens, Hk 8, D128, k4v2_g128, 1 sink tile. With
// `quantized`, the complete non-sink tiles are records (copies of a few real records); otherwise
// every tile is an fp16 page (the uncompressed baseline over the same context).
struct Pools {
  kvarn_config_t cfg{};
  int Hk = 8, D = 128, G = 128, batch = 0;
  size_t rb = 0;
  std::vector<uint8_t> records;
  std::vector<uint16_t> k_pages, v_pages;
  std::vector<int32_t> table, seq_lens, record_tiles;
  int max_blocks = 0, num_pages = 0, num_blocks = 0;
  double bytes_read = 0;  // per attention call

  kvarn_paged_kv_t View() {
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = Hk;
    kv.batch = batch;
    kv.records = records.empty() ? nullptr : records.data();
    kv.record_stride = rb;
    kv.num_record_blocks = num_blocks;
    kv.k_pages = k_pages.data();
    kv.v_pages = v_pages.data();
    kv.num_pages = num_pages;
    kv.block_table = table.data();
    kv.max_blocks_per_seq = max_blocks;
    kv.seq_lens = seq_lens.data();
    kv.record_tiles = record_tiles.data();
    return kv;
  }
};

void FillHalves(std::vector<uint16_t>& x, unsigned seed) {
  // Normal(0,1) values as fp16 (what rotated K/V look like), from a 64k-entry table.
  const auto base = Randn(65536 + 4096, seed);
  std::vector<uint16_t> h(base.size());
  for (size_t i = 0; i < base.size(); ++i) {
    // round-to-nearest fp16 via the library would need a context; a truncating conversion is
    // enough for timing data
    uint32_t u;
    std::memcpy(&u, &base[i], 4);
    const int e = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
    h[i] = e <= 0 ? static_cast<uint16_t>((u >> 16) & 0x8000)
                  : static_cast<uint16_t>(((u >> 16) & 0x8000) | (e << 10) | ((u >> 13) & 0x3ff));
  }
  std::mt19937 rng(seed);
  for (size_t i = 0; i < x.size(); i += 4096) {
    const size_t n = std::min<size_t>(4096, x.size() - i);
    std::memcpy(x.data() + i, h.data() + (rng() & 0xffff), n * 2);
  }
}

bool MakePools(kvarn_context_t* ctx, int64_t len, int batch, bool quantized, Pools* p) {
  kvarn_config_from_preset("k4v2_g128", 128, &p->cfg);
  kvarn_record_bytes(&p->cfg, &p->rb);
  const int G = p->G, Hk = p->Hk, D = p->D;
  p->batch = batch;
  const int tiles = static_cast<int>((len + G - 1) / G);
  const int rec_tiles = quantized ? std::max<int>(0, static_cast<int>(len / G) - 1) : 0;
  p->max_blocks = tiles;
  p->num_blocks = batch * rec_tiles;
  p->num_pages = batch * (tiles - rec_tiles);
  p->k_pages.resize(static_cast<size_t>(p->num_pages) * Hk * G * D);
  p->v_pages.resize(p->k_pages.size());
  FillHalves(p->k_pages, 11);
  FillHalves(p->v_pages, 12);
  if (p->num_blocks > 0) {
    // 16 distinct real records (2 blocks of 8 heads), repeated.
    const size_t distinct = 16;
    const auto k = Randn(distinct * G * D, 3), v = Randn(k.size(), 4);
    std::vector<uint8_t> rec(distinct * p->rb);
    if (kvarn_quantize(ctx, &p->cfg, distinct, KVARN_DTYPE_F32, k.data(), v.data(), 0, rec.data(),
                       p->rb) != KVARN_OK) {
      return false;
    }
    p->records.resize(static_cast<size_t>(p->num_blocks) * Hk * p->rb);
    for (size_t r = 0; r < static_cast<size_t>(p->num_blocks) * Hk; ++r) {
      std::memcpy(p->records.data() + r * p->rb, rec.data() + (r % distinct) * p->rb, p->rb);
    }
  }
  p->table.resize(static_cast<size_t>(batch) * tiles);
  int page = 0, block = 0;
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < tiles; ++t) {
      const bool is_rec = t >= 1 && t < 1 + rec_tiles;
      p->table[static_cast<size_t>(b) * tiles + t] = is_rec ? block++ : page++;
    }
  }
  p->seq_lens.assign(batch, static_cast<int32_t>(len));
  p->record_tiles.assign(batch, rec_tiles);
  const double page_tokens = static_cast<double>(len) - static_cast<double>(rec_tiles) * G;
  p->bytes_read = batch * Hk * (rec_tiles * static_cast<double>(p->rb) + page_tokens * D * 2 * 2);
  return true;
}

// Times decode attention with params `ap` over the pools, `batch` random queries of
// ap.num_q_heads heads (the benchmark's loop).
void TimeDecode(benchmark::State& state, kvarn_context_t* ctx, Pools& p,
                const kvarn_attention_params_t& ap, int batch) {
  const auto q = Randn(static_cast<size_t>(batch) * ap.num_q_heads * p.D, 5);
  std::vector<float> out(q.size());
  kvarn_paged_kv_t kv = p.View();
  for (auto _ : state) {
    if (kvarn_paged_attention(ctx, &p.cfg, &kv, &ap, q.data(), out.data(), nullptr, nullptr, 0) !=
        KVARN_OK) {
      state.SkipWithError(kvarn_last_error());
      break;
    }
  }
}

// Decode attention, Hq 32, Hk 8, D128; args: context tokens, batch, cache kind (0 = k4v2_g128
// records + fp16 sink/tail, 1 = fp16 pages only: the uncompressed baseline), isa, threads
// (0 = all cores; the 1-thread runs give per-core figures whose CPU time does not depend on
// other load on the machine).
void BM_DecodeAttention(benchmark::State& state) {
  const int64_t len = state.range(0) + 1;  // the context plus the token being decoded
  const int batch = static_cast<int>(state.range(1));
  const bool quantized = state.range(2) == 0;
  kvarn_context_t* ctx = MakeContext(state, static_cast<int>(state.range(4)), state.range(3));
  if (ctx == nullptr) return;
  Pools p;
  if (!MakePools(ctx, len, batch, quantized, &p)) {
    state.SkipWithError(kvarn_last_error());
    kvarn_context_destroy(ctx);
    return;
  }
  const int Hq = 32;
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = Hq;
  TimeDecode(state, ctx, p, ap, batch);
  const double flops = 4.0 * batch * Hq * static_cast<double>(len) * p.D;
  state.counters["MB_read"] = p.bytes_read / 1e6;
  state.counters["read_GB/s"] =
      benchmark::Counter(p.bytes_read * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  Label(state, quantized ? "k4v2_g128" : "fp16", state.range(3));
  kvarn_context_destroy(ctx);
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  const int64_t best = Isas(false).back();
  for (int64_t len : {4096, 32768, 131072}) {
    for (int64_t batch : {1, 8}) {
      b->Args({len, batch, 0, best, 0});
      // The fp16 baseline at 128k x 8 would need 4.3 GB of pages: batch 1 only there.
      if (!(len == 131072 && batch == 8)) b->Args({len, batch, 1, best, 0});
    }
  }
  // Per core: one thread, 32k, batch 1, both caches.
  b->Args({32768, 1, 0, best, 1});
  b->Args({32768, 1, 1, best, 1});
  // SIMD vs scalar (scalar at 4k and 32k, batch 1); AVX2 next to AVX-512.
  for (int64_t isa : Isas(true)) {
    if (isa == best) continue;
    b->Args({4096, 1, 0, isa, 0});
    b->Args({32768, 1, 0, isa, 0});
    b->Args({32768, 1, 0, isa, 1});
  }
}
BENCHMARK(BM_DecodeAttention)->Apply(DecodeArgs)->UseRealTime()->Unit(benchmark::kMillisecond);

// Decode attention with the model variants (docs/API.md "Model variants"), k4v2_g128, Hq 32,
// Hk 8, D128, batch 1, one thread (per-core figures); args: context tokens, sliding window (0 =
// full), sinks (0/1), softcap (0 or the value), isa. A window layer should cost its window
// (W / G + 1 tiles per sequence), not its context; sinks and softcap should cost little.
void BM_DecodeAttentionVariant(benchmark::State& state) {
  const int64_t len = state.range(0) + 1;
  kvarn_context_t* ctx = MakeContext(state, 1, state.range(4));
  if (ctx == nullptr) return;
  Pools p;
  if (!MakePools(ctx, len, 1, true, &p)) {
    state.SkipWithError(kvarn_last_error());
    kvarn_context_destroy(ctx);
    return;
  }
  const int Hq = 32;
  const auto sinks = Randn(Hq, 6);
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = Hq;
  ap.sliding_window = static_cast<int32_t>(state.range(1));
  ap.sinks = state.range(2) ? sinks.data() : nullptr;
  ap.logit_softcap = static_cast<float>(state.range(3));
  TimeDecode(state, ctx, p, ap, 1);
  std::string label = "k4v2_g128";
  if (ap.sliding_window > 0) label += " window " + std::to_string(ap.sliding_window);
  if (ap.sinks != nullptr) label += " sinks";
  if (ap.logit_softcap > 0) label += " softcap";
  Label(state, label, state.range(4));
  kvarn_context_destroy(ctx);
}

void VariantArgs(benchmark::internal::Benchmark* b) {
  const int64_t best = Isas(false).back();
  for (int64_t len : {32768, 131072}) {
    b->Args({len, 0, 0, 0, best});     // plain
    b->Args({len, 128, 1, 0, best});   // gpt-oss window layer
    b->Args({len, 1024, 0, 0, best});  // Gemma 3 window layer
    b->Args({len, 0, 1, 0, best});     // gpt-oss full layer (sinks)
    b->Args({len, 0, 0, 50, best});    // Gemma 2 softcap, full
  }
}
BENCHMARK(BM_DecodeAttentionVariant)
    ->Apply(VariantArgs)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Append (rotation + fp16 rounding into pages) of 256 tokens x 8 heads, 1 thread; arg: isa.
void BM_PagedAppend(benchmark::State& state) {
  kvarn_context_t* ctx = MakeContext(state, 1, state.range(0));
  if (ctx == nullptr) return;
  Pools p;
  MakePools(ctx, 2048, 1, false, &p);
  const int n = 256;
  const auto k = Randn(static_cast<size_t>(n) * p.Hk * p.D, 8), v = Randn(k.size(), 9);
  const int32_t indptr[2] = {0, n};
  p.seq_lens[0] = 512;  // append positions 512..767
  kvarn_paged_kv_t kv = p.View();
  for (auto _ : state) {
    kvarn_paged_append(ctx, &p.cfg, &kv, indptr, KVARN_DTYPE_F32, k.data(), v.data());
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
  Label(state, "Hk8 D128", state.range(0));
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_PagedAppend)->ArgsProduct({Isas(true)})->UseRealTime();

// Flush of 2 pages (16 records, Hk 8) into record blocks, 1 thread; arg: isa.
void BM_PagedFlush(benchmark::State& state) {
  kvarn_context_t* ctx = MakeContext(state, 1, state.range(0));
  if (ctx == nullptr) return;
  Pools p;
  MakePools(ctx, 1024, 1, true, &p);  // 8 tiles: sink page + 7 record tiles
  kvarn_paged_kv_t kv = p.View();
  const int32_t src[2] = {0, 0}, dst[2] = {0, 1};
  for (auto _ : state) kvarn_paged_flush(ctx, &p.cfg, &kv, 2, src, dst);
  state.counters["records/s"] =
      benchmark::Counter(16.0 * state.iterations(), benchmark::Counter::kIsRate);
  Label(state, "k4v2_g128", state.range(0));
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_PagedFlush)->ArgsProduct({Isas(true)})->UseRealTime()->Unit(benchmark::kMillisecond);

// ---- rooflines --------------------------------------------------------------------------------

// A STREAM-like read of 256 MiB (sum of 64-bit words, several independent accumulators), single
// thread and all threads.
void BM_ReadBandwidth(benchmark::State& state) {
  const size_t words = (256u << 20) / 8;
  static std::vector<uint64_t> buf(words, 1);
  const int threads = static_cast<int>(state.range(0));
  for (auto _ : state) {
    std::vector<uint64_t> partial(threads, 0);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const size_t b = words * t / threads, e = words * (t + 1) / threads;
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        for (size_t i = b; i + 4 <= e; i += 4) {
          a0 += buf[i];
          a1 += buf[i + 1];
          a2 += buf[i + 2];
          a3 += buf[i + 3];
        }
        partial[t] = a0 + a1 + a2 + a3;
      });
    }
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(partial.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * words * 8));
}
BENCHMARK(BM_ReadBandwidth)
    ->Arg(1)
    ->Arg(static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// The compute roofline: fp32 FMA throughput of the widest vectors this CPU has, 12 independent
// accumulators per thread; reports GFLOP/s (2 flops per lane per FMA).
#if defined(__x86_64__)
__attribute__((target("avx512f"))) float FmaLoop512(int64_t n) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  float s = 0;
  for (int i = 0; i < 12; ++i) s += _mm512_reduce_add_ps(a[i]);
  return s;
}
__attribute__((target("avx2,fma"))) float FmaLoop256(int64_t n) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
  for (int64_t k = 0; k < n; ++k) {
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  alignas(32) float out[8];
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  _mm256_store_ps(out, s);
  return out[0];
}
#endif

void BM_FmaPeak(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = 1 << 20;
  int lanes = 0;
#if defined(__x86_64__)
  const bool avx512 = kvarn_cpu_isa_best() == KVARN_CPU_ISA_AVX512;
  const bool avx2 = kvarn_cpu_isa_best() == KVARN_CPU_ISA_AVX2;
  lanes = avx512 ? 16 : avx2 ? 8 : 0;
#endif
  if (lanes == 0) {
    state.SkipWithError("no x86 FMA vectors on this machine");
    return;
  }
  for (auto _ : state) {
    std::vector<std::thread> pool;
    std::vector<float> sink(threads);
    if (threads == 1) {  // in the calling thread, so the CPU time is that of the work
#if defined(__x86_64__)
      sink[0] = lanes == 16 ? FmaLoop512(n) : FmaLoop256(n);
#endif
      benchmark::DoNotOptimize(sink.data());
      continue;
    }
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
#if defined(__x86_64__)
        sink[t] = lanes == 16 ? FmaLoop512(n) : FmaLoop256(n);
#endif
      });
    }
    for (auto& th : pool) th.join();
    benchmark::DoNotOptimize(sink.data());
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * lanes * 12 * static_cast<double>(n) * threads * state.iterations() / 1e9,
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_FmaPeak)
    ->Arg(1)
    ->Arg(static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())))
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
