// Shared by the GPU benchmarks over the public API: fatal checks, and pools filled with real
// records (a few hundred quantized tiles replicated; attention's speed does not depend on the
// values, only on their being finite) and random fp16 pages.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "kvarn/kvarn.h"

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)
#define CHECK_KV(x)                                                                       \
  do {                                                                                    \
    kvarn_status_t s_ = (x);                                                              \
    if (s_ != KVARN_OK) {                                                                 \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, kvarn_last_error()); \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

namespace kvarn_bench {

// `n` records of random K/V (quantized on the CPU), `stride` bytes apart.
inline std::vector<uint8_t> QuantizedRecords(const kvarn_config_t& cfg, size_t stride, int n) {
  std::vector<uint8_t> records(n * stride, 0);
  kvarn_context_options_t co;
  kvarn_context_options_defaults(&co);
  co.backend = KVARN_BACKEND_CPU;
  kvarn_context_t* cpu = nullptr;
  CHECK_KV(kvarn_context_create(&co, &cpu));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> k(size_t(n) * cfg.tile_tokens * cfg.head_dim), v(k.size());
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  CHECK_KV(
      kvarn_quantize(cpu, &cfg, n, KVARN_DTYPE_F32, k.data(), v.data(), 0, records.data(), stride));
  kvarn_context_destroy(cpu);
  return records;
}

// Fills `bytes` of device memory at `dst` with copies of `unique`, doubling the copied prefix.
inline void FillWithCopies(kvarn_context_t* ctx, void* dst, size_t bytes,
                           const std::vector<uint8_t>& unique) {
  const size_t first = std::min(unique.size(), bytes);
  CHECK_KV(kvarn_memory_copy(ctx, dst, unique.data(), first, KVARN_COPY_HOST_TO_DEVICE));
  for (size_t done = first; done < bytes;) {
    const size_t n = std::min(done, bytes - done);
    CHECK_KV(kvarn_memory_copy(ctx, static_cast<uint8_t*>(dst) + done, dst, n,
                               KVARN_COPY_DEVICE_TO_DEVICE));
    done += n;
  }
}

// `n` fp16 values drawn from a standard normal distribution.
inline std::vector<uint16_t> RandomHalves(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> h(n);
  for (auto& x : h) x = kvarn::float_to_half(nd(rng));
  return h;
}

// The kernel an attention plan of this shape chooses (kvarn_attention_plan_kernel), shown
// beside each timing so a row never hides a slow path.
inline std::string PlannedKernel(kvarn_context_t* ctx, const kvarn_config_t& cfg,
                                 const kvarn_paged_kv_t& kv, const kvarn_attention_params_t& p,
                                 int nq) {
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = kv.batch;
  shape.num_kv_heads = kv.num_kv_heads;
  shape.max_blocks_per_seq = kv.max_blocks_per_seq;
  shape.max_q_per_seq = nq > 1 ? nq : 0;
  shape.max_total_q = static_cast<int64_t>(kv.batch) * nq;
  kvarn_attention_params_t planned = p;
  planned.q_indptr = nullptr;
  kvarn_attention_plan_t* plan = nullptr;
  CHECK_KV(kvarn_attention_plan_create(ctx, &cfg, &shape, &planned, &plan));
  const char* name = nullptr;
  CHECK_KV(kvarn_attention_plan_kernel(plan, &name));
  const std::string out = name;
  kvarn_attention_plan_destroy(plan);
  return out;
}

}  // namespace kvarn_bench
