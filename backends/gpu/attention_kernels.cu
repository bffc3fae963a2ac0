// Decode and extend attention over records + fp16 pages on CUDA (docs/FORMAT.md section 9).
//
// Work item = (sequence b, KV head h, split s, row chunk c). The rows of a sequence are its
// (query token i, query head g of the KV head) pairs, kRows per chunk, so every record is read
// once per KV head for all the query heads that share it (GQA of any ratio). The scales are
// folded into the inner products, so the loops run on the integer codes:
//   score(t) = c_t * (sum_d (q_d a_d) code[d,t] + sum_d q_d z_d)
//   sum_t p_t V'[t,:] = c' * (sum_t (p_t a'_t) code[t,:] + sum_t p_t z'_t)
// with an fp32 online softmax per row. Splits cover fixed tile ranges chosen from the shape
// only (max_blocks_per_seq and the device's SM count), never from seq_lens (device memory), so
// the launch needs no host synchronization and can be captured in a CUDA graph; a merge kernel
// combines the splits by log-sum-exp.
//
// Block tables, seq_lens and record_tiles are read on the device; bad entries are reported
// through the context's sticky error words (gpu_common.cuh) and the bad tiles skipped.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backends/gpu/attention_common.cuh"
#include "backends/gpu/attention_mma_family.h"
#include "backends/gpu/gpu_common.cuh"
#include "backends/gpu/gpu_ops.h"

namespace kvarn {
namespace gpu {
namespace {

struct Smem {
  float* q;      // [kRows][D] rotated query * scale
  float* qa;     // [D][kRows] q_d * a_d of the current record
  float* acc;    // [kRows][D]
  float* p;      // [kRows][G] scores, then probabilities
  float* ka;     // [D]
  float* kz;     // [D]
  float* vc;     // [D]
  float* kc;     // [G]
  float* va;     // [G]
  float* vz;     // [G]
  float* m;      // [kRows]
  float* l;      // [kRows]
  float* alpha;  // [kRows]
  float* qz;     // [kRows]
  float* pz;     // [kRows]
  int* limit;    // [kRows] keys visible to each row end before limit; 0 for padding rows
  int* qrow;     // [kRows] global output row (token * Hq + head), -1 for padding rows
  int* lo;       // [kRows] and start at lo (a sliding window; else 0)
};

__host__ __device__ inline size_t SmemBytes(int D, int G) {
  return sizeof(float) * (3 * kRows * D + kRows * G + 3 * D + 3 * G + 5 * kRows) +
         sizeof(int) * 3 * kRows;
}

__device__ Smem CarveSmem(unsigned char* raw, int D, int G) {
  Smem s;
  float* f = reinterpret_cast<float*>(raw);
  s.q = f;
  f += kRows * D;
  s.qa = f;
  f += kRows * D;
  s.acc = f;
  f += kRows * D;
  s.p = f;
  f += kRows * G;
  s.ka = f;
  f += D;
  s.kz = f;
  f += D;
  s.vc = f;
  f += D;
  s.kc = f;
  f += G;
  s.va = f;
  f += G;
  s.vz = f;
  f += G;
  s.m = f;
  f += kRows;
  s.l = f;
  f += kRows;
  s.alpha = f;
  f += kRows;
  s.qz = f;
  f += kRows;
  s.pz = f;
  f += kRows;
  s.limit = reinterpret_cast<int*>(f);
  s.qrow = s.limit + kRows;
  s.lo = s.qrow + kRows;
  return s;
}

__device__ __forceinline__ int Code(const uint8_t* row, int idx, int bits) {
  const int per = 8 / bits;
  return (row[idx / per] >> ((idx % per) * bits)) & ((1 << bits) - 1);
}

__global__ void __launch_bounds__(kThreads) AttentionKernel(AttnParams P) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = P.D, G = P.G;
  Smem S = CarveSmem(smem_raw, D, G);
  const int tid = threadIdx.x;
  WorkItem w;
  if (!ReadWorkItem(P, G, kRows, &w)) return;
  const int split = w.split, h = w.h, b = w.b, N = w.N, rt = w.rt, tiles = w.tiles;

  // Rows: (query token i, head g) of this KV head; load, rotate and scale the queries.
  if (tid < kRows) {
    SetRow(P, w, tid, S.qrow, S.limit, S.lo);
    S.m[tid] = -INFINITY;
    S.l[tid] = 0.f;
  }
  for (int idx = tid; idx < kRows * D; idx += kThreads) S.acc[idx] = 0.f;
  __syncthreads();
  LoadQueries(P, S.qrow, D, P.scale, S.q);
  __syncthreads();

  // Tiles wholly before the first row's window are never read.
  const int t_begin = FirstVisibleTile(P, w, G) + split * P.tiles_per_split;
  const int t_end = min(tiles, t_begin + P.tiles_per_split);
  const int32_t* table = P.block_table + static_cast<size_t>(b) * P.max_blocks;
  const int warp = tid / kWarpSize, lane = tid % kWarpSize;
  constexpr int kWarps = kThreads / kWarpSize;

  for (int tile = t_begin; tile < t_end; ++tile) {
    const bool is_record = tile >= P.sink_tiles && tile < P.sink_tiles + rt;
    const int id = table[tile];
    const __half* kp = nullptr;
    const __half* vp = nullptr;
    if (is_record ? id < 0 || id >= P.num_record_blocks
                  : !FpTileRows(P, w, table, tile, G, D, &kp, &vp)) {
      if (tid == 0) ReportAttentionError(P, b, kErrBlockTable, tile);
      continue;
    }
    const int key0 = tile * G;
    const uint8_t* rec = nullptr;
    if (is_record) {
      rec = P.records + (static_cast<size_t>(id) * P.Hk + h) * P.record_stride;
      for (int d = tid; d < D; d += kThreads) {
        S.ka[d] = HalfAt(rec + P.off_ka, d);
        S.kz[d] = HalfAt(rec + P.off_kz, d);
        S.vc[d] = HalfAt(rec + P.off_vc, d);
      }
      for (int t = tid; t < G; t += kThreads) {
        S.kc[t] = HalfAt(rec + P.off_kc, t);
        S.va[t] = HalfAt(rec + P.off_va, t);
        S.vz[t] = HalfAt(rec + P.off_vz, t);
      }
      __syncthreads();
      // qa[d][r] = q_r,d * a_d; qz[r] = sum_d q_r,d z_d (one warp per row).
      for (int idx = tid; idx < kRows * D; idx += kThreads) {
        const int d = idx / kRows, r = idx % kRows;
        S.qa[idx] = S.q[r * D + d] * S.ka[d];
      }
      for (int r = warp; r < kRows; r += kWarps) {
        float acc = 0.f;
        for (int d = lane; d < D; d += kWarpSize) acc += S.q[r * D + d] * S.kz[d];
        for (int o = kWarpSize / 2; o > 0; o /= 2) acc += __shfl_xor_sync(kFullMask, acc, o);
        if (lane == 0) S.qz[r] = acc;
      }
      __syncthreads();
    }

    // Scores: one thread per token (and, for G < kThreads, several threads per token over
    // interleaved channel ranges, combined in shared memory through the qa area's reuse order).
    for (int t = tid; t < G; t += kThreads) {
      float s[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) s[r] = 0.f;
      if (is_record) {
        const uint8_t* kcodes = rec + P.off_kcodes;
        const int row_bytes = G * P.kbits / 8;
        for (int d = 0; d < D; ++d) {
          const float c =
              static_cast<float>(Code(kcodes + static_cast<size_t>(d) * row_bytes, t, P.kbits));
          const float4* qa4 = reinterpret_cast<const float4*>(S.qa + d * kRows);
          const float4 x = qa4[0], y = qa4[1];
          s[0] += x.x * c;
          s[1] += x.y * c;
          s[2] += x.z * c;
          s[3] += x.w * c;
          s[4] += y.x * c;
          s[5] += y.y * c;
          s[6] += y.z * c;
          s[7] += y.w * c;
        }
        const float kc = S.kc[t];
#pragma unroll
        for (int r = 0; r < kRows; ++r) s[r] = kc * (s[r] + S.qz[r]);
      } else if (key0 + t < N) {  // rows past the sequence end are masked and never read
        const uint4* krow = reinterpret_cast<const uint4*>(kp + static_cast<size_t>(t) * D);
        for (int d8 = 0; d8 < D / 8; ++d8) {
          const uint4 u = krow[d8];
          const __half2* hh = reinterpret_cast<const __half2*>(&u);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 kv = __half22float2(hh[j]);
            const int d = d8 * 8 + 2 * j;
#pragma unroll
            for (int r = 0; r < kRows; ++r)
              s[r] += S.q[r * D + d] * kv.x + S.q[r * D + d + 1] * kv.y;
          }
        }
      }
      if (P.softcap > 0.f) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) s[r] = Softcap(s[r], P.softcap);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int key = key0 + t;
        S.p[r * G + t] = key < S.limit[r] && key >= S.lo[r] ? s[r] : -INFINITY;
      }
    }
    __syncthreads();

    // Online softmax per row (one warp per row).
    for (int r = warp; r < kRows; r += kWarps) {
      float mx = -INFINITY;
      for (int t = lane; t < G; t += kWarpSize) mx = fmaxf(mx, S.p[r * G + t]);
      for (int o = kWarpSize / 2; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, o));
      const float m_old = S.m[r];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.f, pz = 0.f;
      for (int t = lane; t < G; t += kWarpSize) {
        const float e = m_new == -INFINITY ? 0.f : __expf(S.p[r * G + t] - m_new);
        if (is_record) {
          pz += e * S.vz[t];
          S.p[r * G + t] = e * S.va[t];  // fold a'_t into the probability
        } else {
          S.p[r * G + t] = e;
        }
        sum += e;
      }
      for (int o = kWarpSize / 2; o > 0; o /= 2) {
        sum += __shfl_xor_sync(kFullMask, sum, o);
        pz += __shfl_xor_sync(kFullMask, pz, o);
      }
      __syncwarp();  // every lane has read m[r] before lane 0 replaces it
      if (lane == 0) {
        const float alpha = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
        S.alpha[r] = alpha;
        S.l[r] = S.l[r] * alpha + sum;
        S.m[r] = m_new;
        S.pz[r] = pz;
      }
    }
    __syncthreads();

    // Values: one thread per channel.
    for (int d = tid; d < D; d += kThreads) {
      float v[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) v[r] = 0.f;
      if (is_record) {
        const uint8_t* vcodes = rec + P.off_vcodes;
        const int row_bytes = D * P.vbits / 8;
        for (int t = 0; t < G; ++t) {
          const float c =
              static_cast<float>(Code(vcodes + static_cast<size_t>(t) * row_bytes, d, P.vbits));
#pragma unroll
          for (int r = 0; r < kRows; ++r) v[r] += S.p[r * G + t] * c;
        }
        const float vc = S.vc[d];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          S.acc[r * D + d] = S.acc[r * D + d] * S.alpha[r] + vc * (v[r] + S.pz[r]);
        }
      } else {
        // Page slots past the sequence end may hold anything (even NaN): never read them.
        const int valid = min(G, N - key0);
        for (int t = 0; t < valid; ++t) {
          const float x = __half2float(vp[static_cast<size_t>(t) * D + d]);
#pragma unroll
          for (int r = 0; r < kRows; ++r) v[r] += S.p[r * G + t] * x;
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r) S.acc[r * D + d] = S.acc[r * D + d] * S.alpha[r] + v[r];
      }
    }
    __syncthreads();
  }

  if (P.splits > 1) {
    // Partial state for the merge kernel (an empty split has m = -inf).
    for (int idx = tid; idx < kRows * D; idx += kThreads) {
      const int r = idx / D, d = idx % D;
      if (S.qrow[r] < 0) continue;
      P.part_acc[(static_cast<size_t>(S.qrow[r]) * P.splits + split) * D + d] = S.acc[idx];
    }
    if (tid < kRows && S.qrow[tid] >= 0) {
      float* ml = P.part_ml + (static_cast<size_t>(S.qrow[tid]) * P.splits + split) * 2;
      ml[0] = S.m[tid];
      ml[1] = S.l[tid];
    }
    return;
  }
  // One split: fold in the sink logit (a denominator term with no value), normalize,
  // un-rotate, store.
  if (tid < kRows) {
    const float sink =
        P.sinks != nullptr && S.qrow[tid] >= 0 ? P.sinks[S.qrow[tid] % P.Hq] : -INFINITY;
    S.alpha[tid] = FoldSink(sink, &S.m[tid], &S.l[tid], [](float x) { return __expf(x); });
  }
  __syncthreads();
  for (int idx = tid; idx < kRows * D; idx += kThreads) {
    const int r = idx / D;
    S.acc[idx] = S.l[r] > 0.f ? S.acc[idx] * S.alpha[r] / S.l[r] : 0.f;
  }
  if (P.v_rotate) BlockFwht(S.acc, kRows, D, P.log2D);
  __syncthreads();
  for (int idx = tid; idx < kRows * D; idx += kThreads) {
    const int r = idx / D, d = idx % D;
    if (S.qrow[r] >= 0) {
      StoreElem(P.out, RowElement(S.qrow[r], P.Hq, P.out_stride, D, d), P.out_dtype, S.acc[idx]);
    }
  }
  if (P.lse && tid < kRows && S.qrow[tid] >= 0) {
    P.lse[S.qrow[tid]] = S.m[tid] + logf(S.l[tid]);
  }
}

// Programmatic dependent launch (sm_90): the merge kernel is launched while the attention grid
// drains, and waits for its completion (and memory) before reading the partials.
__device__ __forceinline__ void WaitForPrimaryGrid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Sum or maximum over the CTA (kThreads threads), the result in every thread.
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float x, float* scratch) {
  for (int o = kWarpSize / 2; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(kFullMask, x, o);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  __syncthreads();  // scratch may still be read by a previous reduction
  if (threadIdx.x % kWarpSize == 0) scratch[threadIdx.x / kWarpSize] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kThreads / kWarpSize; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  return x;
}

// Merges the splits of one output row (query token, query head) by log-sum-exp: thread s
// weighs split s (splits <= 64 < kThreads), then each thread sums its channels over the splits.
__global__ void __launch_bounds__(kThreads) MergeKernel(AttnParams P, int rows_total) {
  WaitForPrimaryGrid();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* o = reinterpret_cast<float*>(smem_raw);  // [D]
  __shared__ float w_s[64];
  __shared__ float scratch[kThreads / kWarpSize];
  const int row = blockIdx.x;
  if (row >= rows_total) return;
  // Under an extend plan the rows past this step's queries are not written.
  if (P.max_q_per_seq > 0 && row >= static_cast<int64_t>(P.q_indptr[P.batch]) * P.Hq) return;
  const int D = P.D, splits = P.splits, s = threadIdx.x;
  const float* ml = P.part_ml + static_cast<size_t>(row) * splits * 2;
  const float m = s < splits ? ml[2 * s] : -INFINITY;
  const float l = s < splits ? ml[2 * s + 1] : 0.f;
  // A sink logit joins the max and the denominator with no value.
  const float sink = P.sinks != nullptr ? P.sinks[row % P.Hq] : -INFINITY;
  const float M = fmaxf(BlockReduce<true>(m, scratch), sink);
  const float w = m == -INFINITY ? 0.f : __expf(m - M);
  if (s < splits) w_s[s] = w;
  const float L = BlockReduce<false>(l * w, scratch) +  // also orders the w_s stores
                  (sink == -INFINITY ? 0.f : __expf(sink - M));
  if (P.lse && s == 0) P.lse[row] = M + logf(L);
  const float* part = P.part_acc + static_cast<size_t>(row) * splits * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
#pragma unroll 8
    for (int k = 0; k < splits; ++k) {
      const float x = part[static_cast<size_t>(k) * D + d];
      acc += w_s[k] == 0.f ? 0.f : x * w_s[k];  // an empty split's partial is never read as NaN
    }
    o[d] = L > 0.f ? acc / L : 0.f;
  }
  if (P.v_rotate) BlockFwht(o, 1, D, P.log2D);
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    StoreElem(P.out, RowElement(row, P.Hq, P.out_stride, D, d), P.out_dtype, o[d]);
  }
}

using Plan = AttentionPlan;  // core/backend.h: what a plan decides, kept by the C API's plan

size_t Align256(size_t x) { return (x + 255) / 256 * 256; }

// Whether the tensor-core decode kernel family has this shape (alignment aside: a misaligned
// pool falls back to the general kernel with the same plan, so the workspace size never depends
// on pointers). Under HIP the tensor-core kernels are not built (inline PTX), so no shape has it.
bool MmaShape(const CudaState* st, const Config& cfg);

// The tensor-core extend kernel's shapes: D128, G 64/128, k4v2.
bool ExtendMmaShape(const CudaState* st, const Config& cfg) {
  return MmaShape(st, cfg) && cfg.D == 128 && cfg.key_bits == 4 && cfg.value_bits == 2;
}

// The kernel-selection switches for tests and comparisons (backends/gpu/README.md), read once.
bool EnvEquals(const char* name, const char* value) {
  const char* e = std::getenv(name);
  return e != nullptr && std::string(e) == value;
}

// KVARN_CUDA_ATTENTION=generic: the general kernel for every shape.
bool ForcedGeneric() {
  static const bool forced = EnvEquals("KVARN_CUDA_ATTENTION", "generic");
  return forced;
}

// KVARN_CUDA_WORK_LIST=off: extend grids cover batch x chunks_per_seq as before the device-built
// work list (for before/after comparisons).
bool WorkListOff() {
  static const bool off = EnvEquals("KVARN_CUDA_WORK_LIST", "off");
  return off;
}

// KVARN_CUDA_DECODE_ROWS=split: in an extend run on the tensor-core extend kernel, sequences of
// one query token go to the decode kernel (a second work list and launch, same splits, one
// merge). Off by default until its suites have run on a device.
bool DecodeRowsSplit() {
  static const bool on = EnvEquals("KVARN_CUDA_DECODE_ROWS", "split");
  return on;
}

int MmaCtasPerSm(CudaState* st, const Config& cfg);
int MmaRecordsPerIteration(const Config& cfg);  // records a tensor-core CTA consumes at once
int ExtendCtasPerSm(CudaState* st, int G);
constexpr int kExtendCtaRows = 64;  // query rows per CTA of the extend kernel (ext::kCtaRows)

// Whether the tensor-core extend kernel takes an extend batch whose longest sequence has
// max_rows query rows (tokens x query heads per KV head): from 32 rows on, one 64-row CTA per
// chunk beats the decode kernel's 8-row chunks, which re-read every record per chunk.
// KVARN_CUDA_EXTEND=off keeps the decode kernels (tests compare the two).
bool ExtendShape(const CudaState* st, const Config& cfg, int max_rows) {
  static const bool disabled = EnvEquals("KVARN_CUDA_EXTEND", "off");
  return !disabled && ExtendMmaShape(st, cfg) && max_rows >= 32;
}

// Splits per (sequence, KV head, row chunk) work item for the tensor-core kernels, whose CTAs
// take a fixed time per tile: the count fills whole waves of `resident` CTAs. The cost of s
// splits is (waves of CTAs) x (CTA iterations per split, `per_iteration` tiles each, + ~2 of
// ring fill and setup), plus one for the merge pass when s > 1. Between counts of equal cost
// that fit one wave, the larger wins: a CTA's records go through its groups one after another,
// which the cost counts as one iteration (measured on an H100, k4v2 D128: batch 1 at 1k tokens,
// 20.5 us with 8 splits against 29.3 us with 1; batch 8 at 1k, 29.2 us with 4 against 30.5).
int WholeWaveSplits(int64_t resident, int per_iteration, int64_t items, int max_tiles) {
  const int cap = std::min(64, max_tiles);
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= cap; ++s) {
    const int per_split = (max_tiles + s - 1) / s;
    const int splits = (max_tiles + per_split - 1) / per_split;
    if (splits != s) continue;  // the same as a smaller count
    const int64_t waves = (items * s + resident - 1) / resident;
    const int64_t cost = waves * ((per_split + per_iteration - 1) / per_iteration + 2) + (s > 1);
    if (cost < best_cost || (cost == best_cost && waves == 1)) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

// Splits for the decode kernels: the tensor-core kernel consumes MmaRecordsPerIteration records
// per CTA iteration; the general kernel keeps its rule: enough work items to fill the device
// twice over, at least 4 tiles per split.
int ChooseSplits(CudaState* st, const Config& cfg, int64_t items, int max_tiles, bool general) {
  if (general || !MmaShape(st, cfg)) {
    const int cap = std::min(64, max_tiles);
    const int64_t want =
        (2 * static_cast<int64_t>(st->sm_count) + items - 1) / std::max<int64_t>(items, 1);
    return static_cast<int>(
        std::max<int64_t>(1, std::min<int64_t>({want, (max_tiles + 3) / 4, cap})));
  }
  return WholeWaveSplits(static_cast<int64_t>(MmaCtasPerSm(st, cfg)) * st->sm_count,
                         MmaRecordsPerIteration(cfg), items, max_tiles);
}

// Splits for the extend kernel: compute bound, one tile per CTA iteration.
int ChooseExtendSplits(CudaState* st, const Config& cfg, int64_t items, int max_tiles) {
  return WholeWaveSplits(static_cast<int64_t>(ExtendCtasPerSm(st, cfg.G)) * st->sm_count, 1, items,
                         max_tiles);
}

// The grid's z extent (work items) a launch under plan `p` may use; CUDA allows 65535.
int64_t GridItems(const Plan& p, int batch) {
  return p.work_items > 0 ? std::max(p.work_items, p.decode_items)
                          : int64_t{batch} * std::max(p.chunks_per_seq, p.decode_chunks_per_seq);
}

Status CheckGridItems(const Plan& p, int batch) {
  const int64_t z = GridItems(p, batch);
  if (z <= 65535) return Status::Ok();
  return Unsupported("this attention shape needs " + std::to_string(z) +
                     " work items per KV head and split, more than a CUDA grid's 65535; "
                     "plan fewer query tokens (max_total_q) or sequences per call");
}

// The plan of a shape: max_q query tokens in the longest sequence (1 for decode), total_q in
// all, extend = queries come with a q_indptr. run_plan: for kvarn_paged_attention_run, which
// refuses a pool its kernel cannot read, so only the plan's own row chunking launches (a direct
// call over a misaligned pool falls back to the general kernel and its chunking).
Plan PlanFor(Context* ctx, const Config& cfg, int batch, int num_kv_heads, int max_blocks,
             const AttentionArgs& args, bool extend, int max_q, size_t total_q, bool run_plan) {
  const int group = args.num_q_heads / num_kv_heads;
  Plan p;
  const int max_rows = max_q * group;
  // The general kernel when forced (KVARN_CUDA_ATTENTION=generic, tests compare the two).
  const bool general = ForcedGeneric();
  p.decode_chunks_per_seq = std::max(1, (max_rows + kRows - 1) / kRows);
  p.extend = extend && !general && ExtendShape(State(ctx), cfg, max_rows);
  p.chunks_per_seq =
      p.extend ? (max_rows + kExtendCtaRows - 1) / kExtendCtaRows : p.decode_chunks_per_seq;
  // The tiles one work item may visit, counted from its first visible one (FirstVisibleTile):
  // the whole table, or a sliding window plus the spread of the chunk's query tokens and a tile
  // of misalignment at each end.
  int max_tiles = std::max(1, max_blocks);
  if (args.sliding_window > 0) {
    const int64_t chunk_tokens = std::min(max_q, p.extend ? kExtendCtaRows : kRows);
    const int64_t span = (int64_t{args.sliding_window} + chunk_tokens - 2) / cfg.G + 2;
    max_tiles = static_cast<int>(std::min<int64_t>(max_tiles, span));
  }
  // An extend launches the items of the work list built on the device from q_indptr: those that
  // can hold rows, at most sum_b ceil(rows_b / chunk_rows) <= total_q * group / chunk_rows +
  // batch (for either chunking the launch may use), not batch x the longest sequence's chunks.
  int64_t grid_items = static_cast<int64_t>(batch) * p.chunks_per_seq;
  if (extend && !WorkListOff()) {
    const auto bound = [&](int64_t chunks_per_seq, int chunk_rows) {
      return std::min<int64_t>(int64_t{batch} * chunks_per_seq,
                               static_cast<int64_t>(total_q) * group / chunk_rows + batch);
    };
    grid_items = bound(p.chunks_per_seq, p.extend ? kExtendCtaRows : kRows);
    p.work_items = std::max<int64_t>(
        1, run_plan ? grid_items : std::max(grid_items, bound(p.decode_chunks_per_seq, kRows)));
    p.list_bytes = Align256(static_cast<size_t>(p.work_items) * sizeof(int32_t));
    if (p.extend && DecodeRowsSplit()) {
      p.decode_items = std::max<int64_t>(1, int64_t{batch} * ((group + kRows - 1) / kRows));
      p.decode_list_bytes = Align256(static_cast<size_t>(p.decode_items) * sizeof(int32_t));
    }
  }
  const int64_t items = grid_items * num_kv_heads;
  int splits = std::min({args.num_splits, max_tiles, 64});
  if (args.num_splits <= 0) {
    splits = p.extend ? ChooseExtendSplits(State(ctx), cfg, items, max_tiles)
                      : ChooseSplits(State(ctx), cfg, items, max_tiles, general);
  }
  p.tiles_per_split = (max_tiles + splits - 1) / splits;
  p.splits = (max_tiles + p.tiles_per_split - 1) / p.tiles_per_split;
  p.rows_total = total_q * static_cast<size_t>(args.num_q_heads);
  if (p.splits > 1) {
    p.ml_bytes = Align256(p.rows_total * p.splits * 2 * sizeof(float));
    p.acc_bytes = Align256(p.rows_total * p.splits * cfg.D * sizeof(float));
  }
  p.workspace = p.ml_bytes + p.acc_bytes + p.list_bytes + p.decode_list_bytes;
  p.needs_aligned_pool = MmaShape(State(ctx), cfg) && !general;
  p.kernel = !p.needs_aligned_pool ? "cuda-general"
             : p.extend            ? "cuda-tensor-core-extend"
                                   : "cuda-tensor-core-decode";
  return p;
}

// The plan of one kvarn_paged_attention call, whose q_indptr is host memory (copied into the
// workspace for the kernels).
Status MakePlan(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                size_t total_q, Plan* plan) {
  int max_q = 1;
  if (args.q_indptr) {
    if (args.q_indptr[0] != 0) return InvalidArgument("q_indptr[0] must be 0");
    max_q = 0;
    for (int b = 0; b < kv.batch; ++b) {
      const int nq = args.q_indptr[b + 1] - args.q_indptr[b];
      if (nq < 0) return InvalidArgument("q_indptr must not decrease");
      max_q = std::max(max_q, nq);
    }
  }
  Plan p = PlanFor(ctx, cfg, kv.batch, kv.num_kv_heads, kv.max_blocks_per_seq, args,
                   args.q_indptr != nullptr, max_q, total_q, false);
  if (args.q_indptr) p.indptr_bytes = Align256((kv.batch + 1) * sizeof(int32_t));
  p.workspace += p.indptr_bytes;
  KVARN_RETURN_IF_ERROR(CheckGridItems(p, kv.batch));
  *plan = p;
  return Status::Ok();
}

int Log2(int x) {
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}

}  // namespace
}  // namespace gpu
}  // namespace kvarn

#if KVARN_GPU_HAS_MMA
#include "backends/gpu/attention_extend.cuh"
#endif

namespace kvarn {
namespace gpu {
namespace {

#if KVARN_GPU_HAS_MMA

// KVARN_CUDA_SLICE=64: the decode family's narrow variant for D 128 and 256 (64 channels per
// warp, twice the warps per record; tests and benchmarks compare the two).
bool NarrowSlices() {
  static const bool narrow = EnvEquals("KVARN_CUDA_SLICE", "64");
  return narrow;
}

// f(std::integral_constant<int, D>{}) for a head dim of the decode family (one translation
// unit each, attention_mma_d<D>.cu); `otherwise` for any other D.
template <class R, class F>
R WithFamilyHeadDim(int D, R otherwise, F&& f) {
  switch (D) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 256:
      return f(std::integral_constant<int, 256>{});
    case 512:
      return f(std::integral_constant<int, 512>{});
    default:
      return otherwise;
  }
}

// The decode family's member for cfg, if it has one.
bool FamilyMember(const Config& cfg, mma::FamilyInfo* info) {
  return WithFamilyHeadDim(cfg.D, false, [&](auto d) {
    return mma::FamilyHas<decltype(d)::value>(cfg.G, cfg.key_bits, cfg.value_bits, NarrowSlices(),
                                              info);
  });
}

bool MmaShape(const CudaState* st, const Config& cfg) {
  mma::FamilyInfo info;
  return st->cc_major >= 8 && FamilyMember(cfg, &info) &&
         static_cast<size_t>(info.record_bytes) == cfg.record_bytes();
}

// On sm_90 the record ring is fed by bulk copies; KVARN_CUDA_RING=cpasync forces the sm_80
// cp.async ring there (tests run both).
bool UseBulkRing(const CudaState* st) {
  static const bool forced_cpasync = EnvEquals("KVARN_CUDA_RING", "cpasync");
  return st->cc_major >= 9 && !forced_cpasync;
}

template <int G>
int PrepareExtend(int device) {
  return PrepareKernel<ext::ExtendAttentionKernel<G>, sizeof(ext::ExtendSmem<G>),
                       ext::kWarps * kWarpSize>(device);
}

int MmaCtasPerSm(CudaState* st, const Config& cfg) {
  DeviceGuard guard(st->device);
  const int n = WithFamilyHeadDim(cfg.D, 0, [&](auto d) {
    return mma::FamilyCtasPerSm<decltype(d)::value>(st->device, cfg.G, cfg.key_bits, cfg.value_bits,
                                                    NarrowSlices());
  });
  return std::max(n, 1);
}

int MmaRecordsPerIteration(const Config& cfg) {
  mma::FamilyInfo info;
  FamilyMember(cfg, &info);
  return info.groups;
}

static_assert(ext::kCtaRows == kExtendCtaRows, "the plan's row chunks are the kernel's CTAs");

int ExtendCtasPerSm(CudaState* st, int G) {
  DeviceGuard guard(st->device);
  const int n = G == 128 ? PrepareExtend<128>(st->device) : PrepareExtend<64>(st->device);
  return std::max(n, 1);
}

template <int G>
Status LaunchExtend(CudaState* st, const AttnParams& P, dim3 grid) {
  const size_t smem = sizeof(ext::ExtendSmem<G>);
  if (PrepareExtend<G>(st->device) == 0) {
    return {KVARN_ERR_DEVICE, "the tensor-core extend kernel cannot run on this device (" +
                                  std::to_string(smem) + " bytes of shared memory per CTA)"};
  }
  ext::ExtendAttentionKernel<G><<<grid, ext::kWarps * kWarpSize, smem, st->stream>>>(P);
  return CheckLaunch("ExtendAttentionKernel");
}

Status LaunchMma(CudaState* st, const Config& cfg, AttnParams& P, dim3 grid) {
  P.bulk_ring = UseBulkRing(st);
  const Status none = {KVARN_ERR_INTERNAL, "no tensor-core attention kernel for this shape"};
  return WithFamilyHeadDim(cfg.D, none, [&](auto d) {
    return mma::FamilyLaunch<decltype(d)::value>(st, cfg.G, cfg.key_bits, cfg.value_bits,
                                                 NarrowSlices(), P, grid);
  });
}

#else  // no tensor-core kernel (HIP): the general kernel takes every shape

bool MmaShape(const CudaState*, const Config&) { return false; }
int MmaCtasPerSm(CudaState*, const Config&) { return 1; }
int ExtendCtasPerSm(CudaState*, int) { return 1; }
template <int G>
Status LaunchExtend(CudaState*, const AttnParams&, dim3) {
  return {KVARN_ERR_INTERNAL, "this build has no tensor-core extend kernel"};
}
int MmaRecordsPerIteration(const Config&) { return 1; }
Status LaunchMma(CudaState*, const Config&, AttnParams&, dim3) {
  return {KVARN_ERR_INTERNAL, "this build has no tensor-core attention kernel"};
}

#endif  // KVARN_GPU_HAS_MMA

}  // namespace

Status AttentionWorkspace(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const AttentionArgs& args, size_t total_q, size_t* bytes) {
  Plan p;
  KVARN_RETURN_IF_ERROR(MakePlan(ctx, cfg, kv, args, total_q, &p));
  *bytes = p.workspace;
  return Status::Ok();
}

Status LaunchGeneric(CudaState* st, const Config& cfg, const AttnParams& P, dim3 grid);

namespace {

// The kernels' parameters of one call under `plan`; the workspace is carved for the splits'
// partial results.
AttnParams MakeParams(CudaState* st, const Config& cfg, const PagedKV& kv,
                      const AttentionArgs& args, const Plan& plan, const void* q, void* out,
                      float* lse, uint8_t* ws) {
  AttnParams P{};
  P.records = kv.records;
  P.record_stride = kv.record_stride;
  P.num_record_blocks = kv.num_record_blocks;
  P.k_pages = reinterpret_cast<const __half*>(kv.k_pages);
  P.v_pages = reinterpret_cast<const __half*>(kv.v_pages);
  P.num_pages = kv.num_pages;
  P.block_table = kv.block_table;
  P.max_blocks = kv.max_blocks_per_seq;
  P.seq_lens = kv.seq_lens;
  P.record_tiles = kv.record_tiles;
  P.Hk = kv.num_kv_heads;
  P.tail_states = reinterpret_cast<const __half*>(kv.tail_states);
  P.tail_slot_elems = kv.tail_slot_elems;
  P.tail_cap = kv.tail_cap;
  P.num_tail_slots = kv.num_tail_slots;
  P.tail_slots = kv.tail_slots;
  P.D = cfg.D;
  P.G = cfg.G;
  P.log2D = Log2(cfg.D);
  P.kbits = cfg.key_bits;
  P.vbits = cfg.value_bits;
  P.sink_tiles = cfg.sink_tiles;
  const RecordLayout& L = cfg.layout;
  P.off_kcodes = static_cast<int32_t>(L.offset[KVARN_FIELD_K_CODES]);
  P.off_ka = static_cast<int32_t>(L.offset[KVARN_FIELD_K_SCALE]);
  P.off_kz = static_cast<int32_t>(L.offset[KVARN_FIELD_K_ZERO]);
  P.off_kc = static_cast<int32_t>(L.offset[KVARN_FIELD_K_TOKEN_SCALE]);
  P.off_vcodes = static_cast<int32_t>(L.offset[KVARN_FIELD_V_CODES]);
  P.off_vc = static_cast<int32_t>(L.offset[KVARN_FIELD_V_CHANNEL_SCALE]);
  P.off_va = static_cast<int32_t>(L.offset[KVARN_FIELD_V_SCALE]);
  P.off_vz = static_cast<int32_t>(L.offset[KVARN_FIELD_V_ZERO]);
  P.k_rotate = cfg.k_rotate;
  P.v_rotate = cfg.v_rotate;
  P.q = q;
  P.q_stride = args.q_row_stride;
  P.q_dtype = args.q_dtype;
  P.Hq = args.num_q_heads;
  P.group = args.num_q_heads / kv.num_kv_heads;
  P.scale = args.scale;
  P.sinks = args.sinks;
  P.window = args.sliding_window;
  P.softcap = args.logit_softcap;
  P.prefix = args.prefix;
  P.out = out;
  P.out_stride = args.out_row_stride;
  P.out_dtype = args.out_dtype;
  P.lse = lse;
  P.splits = plan.splits;
  P.tiles_per_split = plan.tiles_per_split;
  P.errors = st->errors;
  P.batch = kv.batch;
  P.max_total_q = -1;
  if (plan.splits > 1) {
    P.part_ml = reinterpret_cast<float*>(ws);
    P.part_acc = reinterpret_cast<float*>(ws + plan.ml_bytes);
  }
  if (plan.list_bytes > 0) {  // after the partials and the q_indptr copy
    P.work_list =
        reinterpret_cast<const int32_t*>(ws + plan.ml_bytes + plan.acc_bytes + plan.indptr_bytes);
  }
  return P;
}

// The work list of an extend (one CTA of kListThreads): sequence b gets items b * chunks_per_seq
// + [0, ceil(q rows / chunk_rows)), at least chunk 0 (whose CTA reports a bad q_indptr range)
// and at most chunks_per_seq; a sequence already faulted (seq_status) gets none. Entries past
// the last item are -1. Items past n_items (only a q_indptr inconsistent with the plan's bounds,
// which chunk 0 of a sequence reports) are left out.
constexpr int kListThreads = 1024;

// With decode.list (KVARN_CUDA_DECODE_ROWS=split), sequences of one query token go to a second
// list in the decode kernel's chunking (decode.chunks_per_seq chunks of kRows rows) instead.
struct DecodeList {
  int32_t* list = nullptr;
  int32_t chunks_per_seq = 1, n_items = 0;
};

__global__ void __launch_bounds__(kListThreads)
    BuildWorkListKernel(const AttnParams P, int chunk_rows, int32_t n_items, int32_t* list,
                        const DecodeList decode) {
  __shared__ int32_t scan[kListThreads];
  int32_t carry = 0, carry_d = 0;
  for (int b0 = 0; b0 < P.batch; b0 += kListThreads) {
    const int b = b0 + static_cast<int>(threadIdx.x);
    int32_t mine = 0, mine_d = 0;
    if (b < P.batch && (P.seq_status == nullptr || P.seq_status[b] == 0)) {
      const int64_t nq = int64_t{P.q_indptr[b + 1]} - P.q_indptr[b], rows = nq * P.group;
      if (decode.list != nullptr && nq == 1) {
        mine_d =
            static_cast<int32_t>(min((rows + kRows - 1) / kRows, int64_t{decode.chunks_per_seq}));
      } else {
        mine = static_cast<int32_t>(
            max(int64_t{1}, min((rows + chunk_rows - 1) / chunk_rows, int64_t{P.chunks_per_seq})));
      }
    }
    int32_t total = 0, total_d = 0;
    const int32_t first = carry + CtaExclusiveScan(mine, scan, &total);
    const int32_t first_d = carry_d + CtaExclusiveScan(mine_d, scan, &total_d);
    for (int32_t c = 0; c < mine && first + c < n_items; ++c) {
      list[first + c] = b * P.chunks_per_seq + c;
    }
    for (int32_t c = 0; c < mine_d && first_d + c < decode.n_items; ++c) {
      decode.list[first_d + c] = b * decode.chunks_per_seq + c;
    }
    carry = min(carry + total, n_items);
    carry_d = min(carry_d + total_d, decode.n_items);
  }
  for (int32_t i = carry + static_cast<int32_t>(threadIdx.x); i < n_items; i += kListThreads) {
    list[i] = -1;
  }
  for (int32_t i = carry_d + static_cast<int32_t>(threadIdx.x); i < decode.n_items;
       i += kListThreads) {
    decode.list[i] = -1;
  }
}

// Launches the attention kernel the plan and the pool's alignment choose, then the merge.
// Every work item of a valid row writes its split's partial, an empty split as m = -inf.
Status LaunchAttention(CudaState* st, const Config& cfg, const PagedKV& kv, const Plan& plan,
                       AttnParams& P) {
  // Every kernel addresses q and out rows by their strides (RowElement). The plan chose the
  // tensor-core kernels (its shape, no variant, no KVARN_CUDA_ATTENTION=generic); they take the
  // call when every pointer they read with 16-byte copies is 16-byte aligned (a direct call
  // over a misaligned pool falls back to the general kernel; a run is refused earlier).
  const bool mma = plan.needs_aligned_pool && PoolsAligned16(kv);
  P.chunks_per_seq = plan.extend && mma ? plan.chunks_per_seq : plan.decode_chunks_per_seq;
  int64_t items = int64_t{kv.batch} * P.chunks_per_seq;
  DecodeList decode;
  if (P.work_list != nullptr) {
    items = plan.work_items;
    if (plan.decode_items > 0 && plan.extend && mma) {  // after the first list (PlanFor)
      decode.list = const_cast<int32_t*>(P.work_list) + plan.list_bytes / sizeof(int32_t);
      decode.chunks_per_seq = plan.decode_chunks_per_seq;
      decode.n_items = static_cast<int32_t>(plan.decode_items);
    }
    BuildWorkListKernel<<<1, kListThreads, 0, st->stream>>>(
        P, plan.extend && mma ? kExtendCtaRows : kRows, static_cast<int32_t>(items),
        const_cast<int32_t*>(P.work_list), decode);
    KVARN_RETURN_IF_ERROR(CheckLaunch("BuildWorkListKernel"));
  }
  const dim3 grid(plan.splits, kv.num_kv_heads, static_cast<unsigned>(items));
  if (plan.extend && mma) {
    KVARN_RETURN_IF_ERROR(cfg.G == 128 ? LaunchExtend<128>(st, P, grid)
                                       : LaunchExtend<64>(st, P, grid));
    if (decode.list != nullptr) {  // the one-token sequences, same splits (one merge below)
      AttnParams Pd = P;
      Pd.chunks_per_seq = decode.chunks_per_seq;
      Pd.work_list = decode.list;
      KVARN_RETURN_IF_ERROR(LaunchMma(
          st, cfg, Pd, dim3(plan.splits, kv.num_kv_heads, static_cast<unsigned>(decode.n_items))));
    }
  } else if (mma) {
    KVARN_RETURN_IF_ERROR(LaunchMma(st, cfg, P, grid));
  } else {
    KVARN_RETURN_IF_ERROR(LaunchGeneric(st, cfg, P, grid));
  }
  if (plan.splits == 1) return Status::Ok();
#if KVARN_GPU_HIP
  // No programmatic dependent launch: stream order makes the merge wait for the partials
  // (WaitForPrimaryGrid compiles to nothing off sm_90).
  MergeKernel<<<static_cast<unsigned>(plan.rows_total), kThreads, cfg.D * sizeof(float),
                st->stream>>>(P, static_cast<int>(plan.rows_total));
  return CheckLaunch("MergeKernel");
#else
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(static_cast<unsigned>(plan.rows_total));
  lc.blockDim = dim3(kThreads);
  lc.dynamicSmemBytes = cfg.D * sizeof(float);
  lc.stream = st->stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  lc.attrs = attr;
  lc.numAttrs = st->cc_major >= 9 ? 1 : 0;
  return CudaError(cudaLaunchKernelEx(&lc, MergeKernel, P, static_cast<int>(plan.rows_total)),
                   "cudaLaunchKernelEx(MergeKernel)");
#endif
}

}  // namespace

Status PagedAttention(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                      const void* q, void* out, float* lse, void* workspace,
                      size_t workspace_bytes) {
  CudaState* st = State(ctx);
  const size_t total_q =
      args.q_indptr ? static_cast<size_t>(args.q_indptr[kv.batch]) : static_cast<size_t>(kv.batch);
  Plan plan;
  KVARN_RETURN_IF_ERROR(MakePlan(ctx, cfg, kv, args, total_q, &plan));
  if (workspace_bytes < plan.workspace || (plan.workspace > 0 && workspace == nullptr)) {
    return {KVARN_ERR_BUFFER_TOO_SMALL,
            "workspace of " + std::to_string(workspace_bytes) + " bytes; this shape needs " +
                std::to_string(plan.workspace) + " (kvarn_paged_attention_workspace_size)"};
  }
  if (kv.batch == 0 || total_q == 0) return Status::Ok();
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  AttnParams P = MakeParams(st, cfg, kv, args, plan, q, out, lse, ws);
  if (args.q_indptr) {
    int32_t* d_indptr = reinterpret_cast<int32_t*>(ws + plan.ml_bytes + plan.acc_bytes);
    KVARN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_indptr, args.q_indptr,
                                               (kv.batch + 1) * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, st->stream));
    P.q_indptr = d_indptr;
  }
  return LaunchAttention(st, cfg, kv, plan, P);
}

Status AttentionPlanFor(Context* ctx, const Config& cfg, const AttentionShape& shape,
                        const AttentionArgs& args, AttentionPlan* plan) {
  const bool extend = !shape.decode();
  *plan = PlanFor(ctx, cfg, shape.batch, shape.num_kv_heads, shape.max_blocks_per_seq, args, extend,
                  extend ? shape.max_q_per_seq : 1, static_cast<size_t>(shape.max_total_q), true);
  return CheckGridItems(*plan, shape.batch);
}

Status PagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const AttentionShape& shape, const AttentionArgs& args,
                         const AttentionPlan& plan, const LaunchArgs& launch,
                         const int32_t* q_indptr, const void* q, void* out, float* lse) {
  CudaState* st = State(ctx);
  AttnParams P =
      MakeParams(st, cfg, kv, args, plan, q, out, lse, static_cast<uint8_t*>(launch.workspace));
  P.seq_status = launch.seq_status;
  if (!shape.decode()) {
    P.q_indptr = q_indptr;
    P.max_q_per_seq = shape.max_q_per_seq;
    P.max_total_q = static_cast<int32_t>(shape.max_total_q);
    // Sequences whose query rows are not their own fault before any kernel writes a row (the
    // kernels' own range check of ReadWorkItem sees one sequence at a time).
    KVARN_RETURN_IF_ERROR(CheckIndptr(st, q_indptr, kv.batch, shape.max_total_q, launch.seq_status,
                                      IndptrKind::kQuery));
  }
  return LaunchAttention(st, cfg, kv, plan, P);
}

Status LaunchGeneric(CudaState* st, const Config& cfg, const AttnParams& P, dim3 grid) {
  const size_t smem = SmemBytes(cfg.D, cfg.G);
  if (smem > 48 * 1024) {
    if (smem > static_cast<size_t>(st->max_smem_optin)) {
      return Unsupported("attention for D " + std::to_string(cfg.D) + ", G " +
                         std::to_string(cfg.G) + " needs " + std::to_string(smem) +
                         " bytes of shared memory; this device allows " +
                         std::to_string(st->max_smem_optin));
    }
    KVARN_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
        AttentionKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  }
  AttentionKernel<<<grid, kThreads, smem, st->stream>>>(P);
  return CheckLaunch("AttentionKernel");
}

}  // namespace gpu
}  // namespace kvarn
