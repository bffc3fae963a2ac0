// What the attention kernels share: their parameters (one struct for every kernel, passed by
// value), the work-item layout, query loading and output addressing, and the host helper that
// prepares a kernel's shared memory. Included by attention_kernels.cu (the general kernel, the
// extend kernel, the merge, planning) and by the attention_mma_d*.cu translation units (the
// tensor-core decode family, one head dim each, compiled in parallel).
#pragma once

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>

#include "backends/gpu/gpu_common.cuh"

namespace kvarn {
namespace gpu {

struct AttnParams {
  // Cache.
  const uint8_t* records;
  size_t record_stride;
  int32_t num_record_blocks;
  const __half* k_pages;
  const __half* v_pages;
  int32_t num_pages;
  const int32_t* block_table;
  int32_t max_blocks;
  const int32_t* seq_lens;
  const int32_t* record_tiles;
  int32_t Hk;
  // The per-request tail state (kvarn_experimental.h), or tail_states NULL: tiles past
  // record_tiles[b] are rows of slot tail_slots[b] ([2][Hk][tail_cap][D] halves, K then V) instead
  // of pages, and there is no sink.
  const __half* tail_states;
  size_t tail_slot_elems;
  int32_t tail_cap;
  int32_t num_tail_slots;
  const int32_t* tail_slots;
  // Config.
  int32_t D, G, log2D, kbits, vbits, sink_tiles;
  int32_t off_kcodes, off_ka, off_kz, off_kc, off_vcodes, off_vc, off_va, off_vz;
  bool k_rotate, v_rotate;
  // Queries.
  const void* q;
  int64_t q_stride;  // elements between query tokens (Hq * D: dense)
  kvarn_dtype_t q_dtype;
  const int32_t* q_indptr;  // device copy, or NULL = decode
  int32_t Hq, group;
  int32_t chunks_per_seq;
  float scale;
  // Model variants (kvarn_attention_params_t, every kernel): sink logits [Hq] or NULL, window W
  // (0 = full), softcap c (0 = off), prefix mode.
  const float* sinks;
  int32_t window;
  float softcap;
  bool prefix;
  // Outputs.
  void* out;
  int64_t out_stride;  // elements between output tokens (Hq * D: dense)
  kvarn_dtype_t out_dtype;
  float* lse;
  int32_t splits, tiles_per_split;
  float* part_ml;   // [rows_total][splits][2] (m, l) when splits > 1
  float* part_acc;  // [rows_total][splits][D]
  DeviceErrorWords* errors;
  // kvarn_paged_attention_run: per-sequence faults, and the plan's bounds on the device-resident
  // q_indptr (0 / -1: no bound, the host checked q_indptr).
  int32_t* seq_status;
  int32_t max_q_per_seq;
  int32_t max_total_q;
  int32_t batch;
  // The device-built work list of an extend run: entry z of the grid's z axis is the item
  // b * chunks_per_seq + chunk, or -1 (nothing to do); NULL: z is the item itself.
  const int32_t* work_list;
  bool bulk_ring;  // tensor-core kernel: sm_90 bulk copies feed the record ring (else cp.async)
};

namespace {

constexpr int kThreads = 128;  // 4 warps per work item
constexpr int kRows = 8;       // query rows per work item

// A bad table entry or length of sequence b: its status entry, or the context's sticky words.
__device__ __forceinline__ void ReportAttentionError(const AttnParams& P, int b,
                                                     DeviceErrorKind what, int32_t detail) {
  ReportSequenceError(P.seq_status, P.errors, b, KVARN_ERR_INVALID_ARGUMENT, what, b, detail);
}

__device__ __forceinline__ float LoadElem(const void* p, size_t i, kvarn_dtype_t dt) {
  if (dt == KVARN_DTYPE_F32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  if (dt == KVARN_DTYPE_F16) return __half2float(__ushort_as_half(bits));
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);  // bf16
}

__device__ __forceinline__ void StoreElem(void* p, size_t i, kvarn_dtype_t dt, float x) {
  if (dt == KVARN_DTYPE_F32) {
    static_cast<float*>(p)[i] = x;
  } else if (dt == KVARN_DTYPE_F16) {
    static_cast<__half*>(p)[i] = __float2half_rn(x);
  } else {
    // bf16, round to nearest even (NaN stays NaN).
    uint32_t u = __float_as_uint(x);
    uint16_t r = (u & 0x7fffffffu) > 0x7f800000u
                     ? static_cast<uint16_t>((u >> 16) | 0x40u)
                     : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    static_cast<uint16_t*>(p)[i] = r;
  }
}

__device__ __forceinline__ float HalfAt(const uint8_t* base, int i) {
  return __half2float(reinterpret_cast<const __half*>(base)[i]);
}

// In-place Walsh-Hadamard transform of n rows of D floats in shared memory, scaled 1/sqrt(D).
__device__ void BlockFwht(float* rows, int n, int D, int log2D) {
  const float norm = rsqrtf(static_cast<float>(D));
  for (int s = 0; s < log2D; ++s) {
    const int h = 1 << s;
    __syncthreads();
    for (int idx = threadIdx.x; idx < n * (D / 2); idx += blockDim.x) {
      const int r = idx / (D / 2), j = idx % (D / 2);
      const int i0 = (j / h) * 2 * h + (j % h);
      float* x = rows + r * D;
      const float a = x[i0], b = x[i0 + h];
      x[i0] = a + b;
      x[i0 + h] = a - b;
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < n * D; idx += blockDim.x) rows[idx] *= norm;
  __syncthreads();
}

// The CTA's work item (split, KV head, sequence, chunk of chunk_rows query rows) and its sequence's
// lengths, read from device memory. False when there is nothing to do: the chunk lies past the
// sequence's rows, or the lengths are inconsistent (then reported once per sequence).
struct WorkItem {
  int split, h, b, chunk;
  int N;       // cached tokens
  int rt;      // record tiles
  int q0, nq;  // first query token, query tokens
  int row0;    // first row (query token x head of the group) of the chunk
  int nrows;   // valid rows of the chunk (<= chunk_rows)
  int tiles;   // tiles of the sequence
};

__device__ __forceinline__ bool ReadWorkItem(const AttnParams& P, int G, int chunk_rows,
                                             WorkItem* w) {
  w->split = blockIdx.x;
  w->h = blockIdx.y;
  int item = static_cast<int>(blockIdx.z);
  if (P.work_list != nullptr) {
    item = P.work_list[item];
    if (item < 0) return false;
  }
  w->b = item / P.chunks_per_seq;
  w->chunk = item % P.chunks_per_seq;
  const int b = w->b;
  // A sequence that faulted (in this call or an earlier one of the step) is skipped.
  if (P.seq_status != nullptr && P.seq_status[b] != 0) return false;
  w->N = P.seq_lens[b];
  w->rt = P.record_tiles[b];
  w->q0 = P.q_indptr ? P.q_indptr[b] : b;
  w->nq = P.q_indptr ? P.q_indptr[b + 1] - w->q0 : 1;
  const bool reporter = threadIdx.x == 0 && w->split == 0 && w->h == 0 && w->chunk == 0;
  // A device-resident q_indptr is checked against the plan's bounds (rows of q/out, chunks).
  if (P.max_q_per_seq > 0 &&
      (w->q0 < 0 || w->nq < 0 || w->nq > P.max_q_per_seq || w->q0 > P.max_total_q - w->nq)) {
    if (reporter) ReportAttentionError(P, b, kErrQueryLen, w->nq);
    return false;
  }
  const int rows_b = w->nq * P.group;
  w->row0 = w->chunk * chunk_rows;
  if (w->row0 >= rows_b) return false;    // this sequence has fewer query rows
  w->tiles = w->N / G + (w->N % G != 0);  // no N + G - 1: N may be near INT32_MAX
  if (w->N < 0 || w->tiles > P.max_blocks || w->rt < 0 ||
      (w->rt > 0 && P.sink_tiles + w->rt > w->N / G)) {
    if (reporter) ReportAttentionError(P, b, kErrSeqLen, w->N);
    return false;
  }
  // Tail state: the tokens past the records must fit their slot, which must exist.
  if (P.tail_states != nullptr && w->N > w->rt * G) {
    const int slot = P.tail_slots[b];
    if (w->N - w->rt * G > P.tail_cap) {
      if (reporter) ReportAttentionError(P, b, kErrSeqLen, w->N);
      return false;
    }
    if (slot < 0 || slot >= P.num_tail_slots) {
      if (reporter) ReportAttentionError(P, b, kErrTailSlot, slot);
      return false;
    }
  }
  // N == 0 is a padding slot: no keys, so its rows get zeros and lse -inf. In prefix mode the
  // queries follow the cache instead of being its last tokens.
  if (!P.prefix && w->nq > w->N && w->N > 0) {
    if (reporter) ReportAttentionError(P, b, kErrQueryLen, w->nq);
    return false;
  }
  w->nrows = min(chunk_rows, rows_b - w->row0);
  return true;
}

// The fp16 rows of head h of an unquantized tile (sink or tail): a page of the block table, or
// rows of the sequence's tail slot (checked by ReadWorkItem). False, with nothing set, when the
// page is outside its pool. A tail tile may end past the slot's last row: read only its `valid`
// rows (rows past them may belong to the next slot, or lie past the allocation).
__device__ __forceinline__ bool FpTileRows(const AttnParams& P, const WorkItem& w,
                                           const int32_t* table, int tile, int G, int D,
                                           const __half** kp, const __half** vp) {
  if (P.tail_states != nullptr) {
    const size_t head =
        static_cast<size_t>(w.h) * P.tail_cap + static_cast<size_t>(tile - w.rt) * G;
    *kp = P.tail_states + static_cast<size_t>(P.tail_slots[w.b]) * P.tail_slot_elems + head * D;
    *vp = *kp + static_cast<size_t>(P.Hk) * P.tail_cap * D;
    return true;
  }
  const int id = table[tile];
  if (id < 0 || id >= P.num_pages) return false;
  const size_t off = (static_cast<size_t>(id) * P.Hk + w.h) * G * D;
  *kp = P.k_pages + off;
  *vp = P.v_pages + off;
  return true;
}

// The keys query token i of the work item may see, [lo, limit) (docs/FORMAT.md section 9.1:
// causal, aligned to the sequence end, or after it in prefix mode; a sliding window raises lo).
__device__ __forceinline__ void TokenKeys(const AttnParams& P, const WorkItem& w, int i, int* lo,
                                          int* limit) {
  // In 64 bits: N + i may pass INT32_MAX in prefix mode.
  const int64_t pos = P.prefix ? int64_t{w.N} + i : int64_t{w.N} - w.nq + i;
  *limit = P.prefix ? w.N : static_cast<int>(pos + 1);
  *lo = P.window > 0 ? static_cast<int>(max(min(pos - P.window + 1, int64_t{w.N}), int64_t{0})) : 0;
}

// Row r of the chunk: its global output row (token * Hq + head; -1 for padding rows) and the
// keys it may see, [lo, limit) (both 0 for padding rows).
__device__ __forceinline__ void SetRow(const AttnParams& P, const WorkItem& w, int r, int* qrow,
                                       int* limit, int* lo = nullptr) {
  int first = 0;
  if (r < w.nrows) {
    const int row = w.row0 + r, i = row / P.group, g = row % P.group;
    qrow[r] = (w.q0 + i) * P.Hq + w.h * P.group + g;
    TokenKeys(P, w, i, &first, &limit[r]);
  } else {
    qrow[r] = -1;
    limit[r] = 0;
  }
  if (lo != nullptr) lo[r] = first;
}

// The first tile a work item's rows may see: its first row (the chunk's earliest query token)
// has the smallest window start. Splits count tiles from here, so a window layer's CTAs share its
// window, not its whole context (PlanFor sizes them with VisibleTiles).
__device__ __forceinline__ int FirstVisibleTile(const AttnParams& P, const WorkItem& w, int G) {
  int lo = 0, limit = 0;
  TokenKeys(P, w, w.row0 / P.group, &lo, &limit);
  return lo / G;
}

// A score after the logit softcap c: c tanh(s / c). The tensor-core kernels keep their scores in
// the log2 domain (times log2 e), where the same formula holds with c log2 e. tanh(y) as
// 1 - 2 / (e^2y + 1) from the approximate exp2 and reciprocal: a few instructions and no branch
// in the kernels' unrolled score loops (tanhf spills their registers), with an absolute error
// near 1e-7, which is what a softmax sees of a logit (c * 1e-7; scores are fp32 to ~1e-7 of
// their size anyway). Saturates to +-c; a NaN stays NaN (masked later where it may occur).
__device__ __forceinline__ float Softcap(float s, float c) {
  const float e = exp2f(2.8853900817779268f * __fdividef(s, c));  // e^(2 s / c)
  return c * (1.f - __fdividef(2.f, e + 1.f));
}

// Folds a sink logit (a softmax denominator term with no value; -inf = none) into a row's
// running max m and sum l, all in one domain (natural or log2, by `exp`); returns the factor
// the row's accumulated values take.
template <class Exp>
__device__ __forceinline__ float FoldSink(float sink, float* m, float* l, Exp exp) {
  if (sink == -INFINITY) return 1.f;
  const float m_new = fmaxf(*m, sink);
  const float alpha = *m == -INFINITY ? 0.f : exp(*m - m_new);
  *l = *l * alpha + exp(sink - m_new);
  *m = m_new;
  return alpha;
}

// Element (global row `row` = token * Hq + head, channel d) of q or out, whose tokens are
// `stride` elements apart.
__device__ __forceinline__ size_t RowElement(int row, int Hq, int64_t stride, int D, int d) {
  return static_cast<size_t>(row / Hq) * static_cast<size_t>(stride) +
         static_cast<size_t>(row % Hq) * D + d;
}

// q[kRows][D] <- the rows' queries (0 for padding rows), rotated when K is, times `scale`.
// Call with the whole CTA after qrow is set and visible.
__device__ __forceinline__ void LoadQueries(const AttnParams& P, const int* qrow, int D,
                                            float scale, float* q) {
  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    q[idx] =
        qrow[r] >= 0 ? LoadElem(P.q, RowElement(qrow[r], P.Hq, P.q_stride, D, d), P.q_dtype) : 0.f;
  }
  if (P.k_rotate) BlockFwht(q, kRows, D, P.log2D);
  for (int idx = threadIdx.x; idx < kRows * D; idx += blockDim.x) q[idx] *= scale;
}

// Programmatic dependent launch (sm_90): the merge kernel is launched while the attention grid
// drains, and waits for its completion (and memory) before reading the partials.
#if KVARN_GPU_HAS_MMA  // called by the tensor-core kernel only
__device__ __forceinline__ void LaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
#endif

constexpr int kMaxDevices = 64;

// Raises kKernel's dynamic shared-memory limit to kSmem once per device and returns its resident
// CTAs per SM (0 if it cannot run). Done outside any stream work, so launches stay capturable.
template <auto kKernel, size_t kSmem, unsigned kCtaThreads>
int PrepareKernel(int device) {
  static std::atomic<int> ctas[kMaxDevices];  // 0 = not yet, -1 = cannot run
  if (device < 0 || device >= kMaxDevices) return 0;
  int n = ctas[device].load(std::memory_order_acquire);
  if (n != 0) return std::max(n, 0);
  n = -1;
  if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(kSmem)) == cudaSuccess) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kCtaThreads, kSmem) ==
            cudaSuccess &&
        per_sm > 0) {
      n = per_sm;
    }
  }
  cudaGetLastError();  // a failure here is reported by the launch, not left sticky
  ctas[device].store(n, std::memory_order_release);
  return std::max(n, 0);
}

}  // namespace
}  // namespace gpu
}  // namespace kvarn
