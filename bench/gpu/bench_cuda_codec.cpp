// Throughput of the CUDA codec through the public API (bench/RESULTS.md, Targets):
//   flush:  records/s of kvarn_paged_flush (D128 G128 k4v2 by default, >= 16k records per
//           call), target >= 1.0 M records/s on an H200; the roofline printed beside it is the
//           bytes moved (fp16 pages read + records written) over the measured D2D copy bandwidth.
//   rotate: GB/s of kvarn_rotate (read + write bytes) vs a plain device-to-device copy of the
//           same bytes measured in the same run (kvarn_memory_copy), target >= 80%.
// Host timing around calls that synchronize (flush returns synchronously; rotate is followed by
// kvarn_context_synchronize), median of several repetitions after a warm-up.
//
// Usage: kvarn-bench-cuda-codec [--tiles N] [--heads H] [--D d] [--preset name] [--reps R]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.h"
#include "kvarn/kvarn.h"

namespace {

#define CHECK(call)                                                                 \
  do {                                                                              \
    const kvarn_status_t st_ = (call);                                              \
    if (st_ != KVARN_OK) {                                                          \
      std::fprintf(stderr, "%s failed: %s (%s)\n", #call, kvarn_status_string(st_), \
                   kvarn_last_error());                                             \
      std::exit(1);                                                                 \
    }                                                                               \
  } while (0)

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename F>
double MedianSeconds(int reps, F&& f) {
  f();  // warm-up (allocations, first launch)
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double t0 = Now();
    f();
    t.push_back(Now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Deterministic pseudo-random fp16 values with channel outliers (so normalization works).
void FillPages(std::vector<uint16_t>& pages, int D) {
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < pages.size(); ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    const double u = static_cast<double>(s >> 11) * 0x1.0p-53;
    const int d = static_cast<int>(i % D);
    const double scale = (d % 37 == 0) ? 20.0 : 1.0 + 0.5 * std::sin(d);
    pages[i] = kvarn::float_to_half(static_cast<float>(scale * (2.0 * u - 1.0) + 0.1 * scale));
  }
}

}  // namespace

int main(int argc, char** argv) {
  int tiles = 2048, heads = 8, D = 128, reps = 5;
  std::string preset = "k4v2_g128";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tiles") tiles = std::atoi(argv[i + 1]);
    if (a == "--heads") heads = std::atoi(argv[i + 1]);
    if (a == "--D") D = std::atoi(argv[i + 1]);
    if (a == "--reps") reps = std::atoi(argv[i + 1]);
    if (a == "--preset") preset = argv[i + 1];
  }
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CUDA;
  kvarn_context_t* ctx = nullptr;
  CHECK(kvarn_context_create(&o, &ctx));
  kvarn_config_t cfg;
  CHECK(kvarn_config_from_preset(preset.c_str(), D, &cfg));
  size_t rb = 0;
  CHECK(kvarn_record_bytes(&cfg, &rb));
  const int G = cfg.tile_tokens;

  // ---- device copy bandwidth (the roofline of both figures) ----
  const size_t copy_bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  CHECK(kvarn_memory_alloc(ctx, copy_bytes, &a));
  CHECK(kvarn_memory_alloc(ctx, copy_bytes, &b));
  {
    std::vector<uint16_t> host(copy_bytes / 2);
    FillPages(host, D);
    CHECK(kvarn_memory_copy(ctx, a, host.data(), copy_bytes, KVARN_COPY_HOST_TO_DEVICE));
  }
  const double t_copy = MedianSeconds(
      reps, [&] { CHECK(kvarn_memory_copy(ctx, b, a, copy_bytes, KVARN_COPY_DEVICE_TO_DEVICE)); });
  const double copy_gbs = 2.0 * copy_bytes / t_copy / 1e9;
  std::printf("device copy D2D: %.1f GB/s (read + write, %zu MiB)\n", copy_gbs, copy_bytes >> 20);

  // ---- rotate ----
  for (kvarn_dtype_t dt : {KVARN_DTYPE_F16, KVARN_DTYPE_F32}) {
    const size_t esize = dt == KVARN_DTYPE_F32 ? 4 : 2;
    const size_t rows = copy_bytes / (esize * D);
    const double t_oop = MedianSeconds(reps, [&] {
      CHECK(kvarn_rotate(ctx, D, rows, dt, a, dt, b));
      CHECK(kvarn_context_synchronize(ctx));
    });
    const double t_ip = MedianSeconds(reps, [&] {
      CHECK(kvarn_rotate(ctx, D, rows, dt, b, dt, b));
      CHECK(kvarn_context_synchronize(ctx));
    });
    const double gbs = 2.0 * copy_bytes / t_oop / 1e9, gbs_ip = 2.0 * copy_bytes / t_ip / 1e9;
    std::printf(
        "rotate D%d %s: %.1f GB/s out of place (%.0f%% of D2D copy), %.1f GB/s in place "
        "(%.0f%%), %zu rows [target >= 80%%]\n",
        D, dt == KVARN_DTYPE_F32 ? "f32" : "f16", gbs, 100.0 * gbs / copy_gbs, gbs_ip,
        100.0 * gbs_ip / copy_gbs, rows);
  }
  kvarn_memory_free(ctx, a);
  kvarn_memory_free(ctx, b);

  // ---- flush ----
  const size_t page_halves = static_cast<size_t>(heads) * G * D;
  const size_t items = static_cast<size_t>(tiles) * heads;
  void *kp = nullptr, *vp = nullptr, *rec = nullptr;
  CHECK(kvarn_memory_alloc(ctx, tiles * page_halves * 2, &kp));
  CHECK(kvarn_memory_alloc(ctx, tiles * page_halves * 2, &vp));
  CHECK(kvarn_memory_alloc(ctx, items * rb, &rec));
  {
    std::vector<uint16_t> host(tiles * page_halves);
    FillPages(host, D);
    CHECK(kvarn_memory_copy(ctx, kp, host.data(), host.size() * 2, KVARN_COPY_HOST_TO_DEVICE));
    std::reverse(host.begin(), host.end());
    CHECK(kvarn_memory_copy(ctx, vp, host.data(), host.size() * 2, KVARN_COPY_HOST_TO_DEVICE));
  }
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = heads;
  kv.batch = 0;
  kv.records = rec;
  kv.record_stride = rb;
  kv.num_record_blocks = tiles;
  kv.k_pages = kp;
  kv.v_pages = vp;
  kv.num_pages = tiles;
  std::vector<int32_t> src(tiles), dst(tiles);
  for (int i = 0; i < tiles; ++i) src[i] = i, dst[i] = tiles - 1 - i;
  const double t_flush = MedianSeconds(
      reps, [&] { CHECK(kvarn_paged_flush(ctx, &cfg, &kv, tiles, src.data(), dst.data())); });
  const double rps = items / t_flush;
  const double bytes = static_cast<double>(items) * (2.0 * G * D * 2 + rb);
  std::printf(
      "flush %s D%d: %.3f M records/s (%zu records per call, %.2f ms) [target >= 1.0 M/s]; "
      "%.1f GB/s moved = %.1f%% of D2D copy bandwidth\n",
      preset.c_str(), D, rps / 1e6, items, t_flush * 1e3, bytes / t_flush / 1e9,
      100.0 * bytes / t_flush / 1e9 / copy_gbs);
  kvarn_memory_free(ctx, kp);
  kvarn_memory_free(ctx, vp);
  kvarn_memory_free(ctx, rec);
  kvarn_context_destroy(ctx);
  return 0;
}
