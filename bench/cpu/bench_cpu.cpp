// CPU benchmarks of the public API (Google Benchmark). Each benchmark reports the bytes it moves
// so the figure can be read against the machine's read bandwidth (bench/RESULTS.md).
//   kvarn-bench-cpu --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <kvarn/kvarn.h>

#include <cmath>
#include <random>
#include <thread>
#include <vector>

namespace {

kvarn_context_t* MakeContext(int threads) {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  o.num_threads = threads;
  kvarn_context_t* c = nullptr;
  if (kvarn_context_create(&o, &c) != KVARN_OK) return nullptr;
  return c;
}

std::vector<float> Randn(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  return x;
}

// Quantize: records per second, D128, args: threads, preset index.
void BM_Quantize(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const char* preset = state.range(1) == 0   ? "k4v2_g128"
                       : state.range(1) == 1 ? "k4v4_g128"
                                             : "k4v2_g64";
  kvarn_context_t* ctx = MakeContext(threads);
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
  state.SetLabel(preset);
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_Quantize)
    ->ArgsProduct({{1, 2}, {0, 1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Decode attention through the managed cache: Hq 32, Hk 8, D128, k4v2_g128; args: context, batch.
void BM_DecodeAttention(benchmark::State& state) {
  const int64_t ctx_len = state.range(0);
  const int batch = static_cast<int>(state.range(1));
  const int Hk = 8, Hq = 32, D = 128;
  kvarn_context_t* ctx = MakeContext(0);
  kvarn_cache_options_t o;
  kvarn_cache_options_defaults(&o);
  o.num_kv_heads = Hk;
  o.max_tokens = ctx_len * batch + 1024;
  o.max_sequences = batch;
  kvarn_cache_t* cache = nullptr;
  if (kvarn_cache_create(ctx, &o, &cache) != KVARN_OK) {
    state.SkipWithError(kvarn_last_error());
    return;
  }
  const int64_t chunk = 4096;
  const auto k = Randn(chunk * Hk * D, 3), v = Randn(k.size(), 4);
  std::vector<int64_t> ids(batch);
  for (int b = 0; b < batch; ++b) {
    ids[b] = b;
    kvarn_cache_add_sequence(cache, b);
    for (int64_t t = 0; t < ctx_len; t += chunk) {
      kvarn_cache_append(cache, b, 0, std::min(chunk, ctx_len - t), KVARN_DTYPE_F32, k.data(),
                         v.data(), 0);
    }
  }
  const auto q = Randn(static_cast<size_t>(batch) * Hq * D, 5);
  std::vector<float> out(q.size());
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = Hq;
  for (auto _ : state) {
    if (kvarn_cache_attention(cache, 0, batch, ids.data(), &p, q.data(), out.data(), nullptr) !=
        KVARN_OK) {
      state.SkipWithError(kvarn_last_error());
      break;
    }
  }
  kvarn_cache_stats_t s;
  s.size = sizeof s;
  kvarn_cache_get_stats(cache, &s);
  state.counters["cache_MB"] = static_cast<double>(s.bytes_used) / 1e6;
  state.counters["read_GB/s"] = benchmark::Counter(
      static_cast<double>(s.bytes_used) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  kvarn_cache_destroy(cache);
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_DecodeAttention)
    ->Args({4096, 1})
    ->Args({32768, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Hadamard rotation of fp16 rows (D128): the cache's append path.
void BM_Rotate(benchmark::State& state) {
  kvarn_context_t* ctx = MakeContext(1);
  const size_t rows = 8192;
  std::vector<uint16_t> x(rows * 128, 0x3c00), y(x.size());
  for (auto _ : state) {
    kvarn_rotate(ctx, 128, rows, KVARN_DTYPE_F16, x.data(), KVARN_DTYPE_F16, y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * rows * 128 * 2 * 2));
  kvarn_context_destroy(ctx);
}
BENCHMARK(BM_Rotate)->UseRealTime();

// The roofline for memory-bound kernels: a STREAM-like read of 256 MiB (sum of 64-bit words,
// several independent accumulators), single thread and all threads.
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
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
