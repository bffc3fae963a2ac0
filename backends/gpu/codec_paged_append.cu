// Layer-2 append of the CUDA backend: new tokens, rotated and rounded to fp16, into the pages.
// kvarn_paged_append takes positions from seq_lens and block_table with a host token_indptr;
// kvarn_paged_append_run takes a slot per token and everything else from device memory.
//
// Asynchronous and CUDA-graph capturable (no host sync, no allocation, no host->device copy): the
// host token_indptr travels by value in the kernel parameters (chunks of kSeqsPerLaunch
// sequences). A validate kernel checks the device tables for every position touched and every
// row (finite, fits fp16 after rotation) and reports through the sticky error words; the write
// kernels return at once if anything was reported, so a failed append writes nothing. The error
// surfaces at the next kvarn_context_synchronize / kvarn_memory_copy.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "backends/gpu/gpu_common.cuh"
#include "backends/gpu/gpu_ops.h"
#include "backends/gpu/hadamard_fwht.cuh"

namespace kvarn {
namespace gpu {
namespace {

constexpr int kSeqsPerLaunch = 480;  // keeps the parameters under the classic 4 KiB

struct AppendChunk {
  int32_t first_seq;  // sequence of indptr[0]
  int32_t n_seq;
  int32_t indptr[kSeqsPerLaunch + 1];  // token_indptr[first_seq .. first_seq + n_seq]
};

struct AppendArgs {
  const void* src[2];     // k, v: [tokens][Hk][D] of dtype
  int64_t row_stride[2];  // elements between the tokens of k, v (Hk * D: dense)
  kvarn_dtype_t dtype;
  bool vec;
  bool rotate[2];
  float scale;
  uint16_t* pages[2];
  int num_pages;
  int hk;
  int G;
  int sink_tiles;
  const int32_t* block_table;
  int max_blocks;
  const int32_t* seq_lens;
  const int32_t* record_tiles;
  DeviceErrorWords* errors;
};

// The sequence (index into chunk.indptr) of chunk-local token `i` (absolute token index).
__device__ __forceinline__ int SeqOf(const AppendChunk& ch, int32_t i) {
  int lo = 0, hi = ch.n_seq - 1;  // largest b with indptr[b] <= i
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (ch.indptr[mid] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Loads row (token i, head h) of k or v, rotates it if asked, and rounds it to fp16 (x then
// holds the fp16 values). nf: the row holds a NaN/Inf; of: a value does not fit fp16.
template <int D, typename Args>
__device__ __forceinline__ void ConvertRow(const Args& a, int which, int32_t i, int h, bool valid,
                                           int ld, float (&x)[RowLayout<D>::kPerLane],
                                           uint16_t (&hbits)[RowLayout<D>::kPerLane], bool* nf,
                                           bool* of) {
  using L = RowLayout<D>;
  const size_t row = static_cast<size_t>(i) * static_cast<size_t>(a.row_stride[which]) +
                     static_cast<size_t>(h) * D;
#pragma unroll
  for (int c = 0; c < L::kChunks; ++c) {
    if (valid) {
      Load8(a.dtype, which ? a.src[1] : a.src[0], row + L::Channel(ld, c), a.vec, &x[c * 8]);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) x[c * 8 + e] = 0.f;
    }
  }
  bool n = false, o = false;
#pragma unroll
  for (int j = 0; j < L::kPerLane; ++j) n |= !isfinite(x[j]);
  if (which ? a.rotate[1] : a.rotate[0]) FwhtRow<D>(x, ld, a.scale);
#pragma unroll
  for (int j = 0; j < L::kPerLane; ++j) {
    hbits[j] = FloatToHalfBits(x[j]);
    o |= !HalfBitsFinite(hbits[j]);
  }
  *nf = RowAny<D>(n);
  *of = RowAny<D>(o) && !*nf;
}

// Rows of a chunk: r = (token * Hk + h) * 2 + which, token relative to indptr[0].
template <int D>
__global__ void __launch_bounds__(256)
    AppendValidateKernel(const AppendArgs a, const AppendChunk ch) {
  using L = RowLayout<D>;
  const size_t gtid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n_threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  // Tables of the sequences (CheckPagedTables of the CPU, for the positions touched).
  for (size_t sb = gtid; sb < static_cast<size_t>(ch.n_seq); sb += n_threads) {
    const int b = ch.first_seq + static_cast<int>(sb);
    const int64_t n = a.seq_lens[b];
    const int64_t rt = a.record_tiles[b];
    const int32_t count = ch.indptr[sb + 1] - ch.indptr[sb];
    if (n < 0) {
      ReportDeviceError(a.errors, KVARN_ERR_INVALID_ARGUMENT, kErrSeqLen, b,
                        static_cast<int32_t>(n));
      continue;
    }
    if (rt < 0 || (rt > 0 && a.sink_tiles + rt > n / a.G)) {
      ReportDeviceError(a.errors, KVARN_ERR_INVALID_ARGUMENT, kErrSeqLen, b,
                        static_cast<int32_t>(rt));
      continue;
    }
    if (count <= 0) continue;
    const int64_t last = n + count;  // exclusive
    for (int64_t tile = n / a.G; tile <= (last - 1) / a.G; ++tile) {
      if (tile >= a.max_blocks) {
        ReportDeviceError(a.errors, KVARN_ERR_INVALID_ARGUMENT, kErrBlockTable, b,
                          static_cast<int32_t>(tile));
        break;
      }
      const int32_t page = a.block_table[static_cast<size_t>(b) * a.max_blocks + tile];
      if (page < 0 || page >= a.num_pages) {
        ReportDeviceError(a.errors, KVARN_ERR_INVALID_ARGUMENT, kErrBlockTable, b,
                          static_cast<int32_t>(tile));
        break;
      }
    }
  }
  // Rows: finite, and representable in fp16 after rotation.
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = gtid / kWarpSize, n_warps = n_threads / kWarpSize;
  const size_t rows = static_cast<size_t>(ch.indptr[ch.n_seq] - ch.indptr[0]) * a.hk * 2;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < rows; r0 += n_warps * L::kRowsPerWarp) {
    const size_t r = r0 + lt;
    const bool valid = r < rows;
    const int which = static_cast<int>(r & 1);
    const int h = static_cast<int>((r >> 1) % a.hk);
    const int32_t i = ch.indptr[0] + static_cast<int32_t>((r >> 1) / a.hk);
    float x[L::kPerLane];
    uint16_t hb[L::kPerLane];
    bool nf, of;
    ConvertRow<D>(a, which, i, h, valid, ld, x, hb, &nf, &of);
    if (valid && ld == 0 && (nf || of)) {
      ReportDeviceError(a.errors, nf ? KVARN_ERR_NON_FINITE : KVARN_ERR_OVERFLOW,
                        nf ? kErrNonFinite : kErrOverflow, i, h);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(256) AppendWriteKernel(const AppendArgs a, const AppendChunk ch) {
  using L = RowLayout<D>;
  if (*static_cast<const volatile int32_t*>(&a.errors->launch_flag) != 0) return;
  const size_t gtid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n_threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = gtid / kWarpSize, n_warps = n_threads / kWarpSize;
  const size_t rows = static_cast<size_t>(ch.indptr[ch.n_seq] - ch.indptr[0]) * a.hk * 2;
  const size_t page_elems = static_cast<size_t>(a.hk) * a.G * D;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < rows; r0 += n_warps * L::kRowsPerWarp) {
    const size_t r = r0 + lt;
    const bool valid = r < rows;
    const int which = static_cast<int>(r & 1);
    const int h = static_cast<int>((r >> 1) % a.hk);
    const int32_t i = ch.indptr[0] + static_cast<int32_t>((r >> 1) / a.hk);
    float x[L::kPerLane];
    uint16_t hb[L::kPerLane];
    bool nf, of;
    ConvertRow<D>(a, which, i, h, valid, ld, x, hb, &nf, &of);
    if (!valid) continue;
    const int sb = SeqOf(ch, i);
    const int b = ch.first_seq + sb;
    const int64_t pos = static_cast<int64_t>(a.seq_lens[b]) + (i - ch.indptr[sb]);
    const int32_t page = a.block_table[static_cast<size_t>(b) * a.max_blocks + pos / a.G];
    uint16_t* dst = (which ? a.pages[1] : a.pages[0]) + page * page_elems +
                    (static_cast<size_t>(h) * a.G + static_cast<size_t>(pos % a.G)) * D;
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) Store8Halves(dst + L::Channel(ld, c), &hb[c * 8]);
  }
}

float RotationScale(int D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

// ---- append by slot (kvarn_paged_append_run) --------------------------------------------------
// Everything comes from device memory; rows are (token, head, K or V) over max_tokens tokens.
// A token belongs to the sequence whose token_indptr range holds it (none: skipped).

struct SlotAppendArgs {
  const void* src[2];     // k, v: [max_tokens][Hk][D] of dtype
  int64_t row_stride[2];  // elements between the tokens of k, v
  kvarn_dtype_t dtype;
  bool vec;
  bool rotate[2];
  float scale;
  uint16_t* pages[2];
  int64_t num_slots;  // num_pages * G
  int hk;
  int G;
  int batch;
  int32_t max_tokens;
  const int32_t* indptr;  // [batch + 1]
  const void* slots;      // [max_tokens] int32, or int64 when slots64
  bool slots64;
  int32_t* seq_status;  // [batch] or NULL
  DeviceErrorWords* errors;
  // The tail-state append (kvarn_paged_append_tail_run) when tail_states is set: positions come
  // from the lengths after the append instead of slots, rows of slot tail_slots[b].
  uint16_t* tail_states;
  size_t tail_slot_elems;
  int32_t tail_cap;
  int32_t num_tail_slots;
  const int32_t* tail_slots;
  const int32_t* seq_lens;
  const int32_t* record_tiles;
  // The staging of kvarn_paged_append_flush_tail_run when set: token t's rows go to
  // staging[which][t][h] (fp16 [2][max_tokens][Hk][D]) whatever its position.
  uint16_t* staging;
};

// The sequence owning token t, or -1 (past the last range, or the ranges are not sorted there).
__device__ __forceinline__ int OwnerOf(const SlotAppendArgs& a, int32_t t) {
  int lo = 0, hi = a.batch - 1;  // largest b with indptr[b] <= t
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (a.indptr[mid] <= t) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return a.indptr[lo] <= t && t < a.indptr[lo + 1] ? lo : -1;
}

__device__ __forceinline__ int64_t SlotAt(const SlotAppendArgs& a, int32_t t) {
  return a.slots64 ? static_cast<const int64_t*>(a.slots)[t]
                   : static_cast<const int32_t*>(a.slots)[t];
}

__device__ __forceinline__ bool SequenceSkipped(const SlotAppendArgs& a, int b) {
  return a.seq_status != nullptr && a.seq_status[b] != 0;
}

// Where token t of sequence b goes: a slot of the page pool (slot mapping; -1 = skipped), or,
// with the tail state, (slot index, row) packed as slot * tail_cap + row. *bad: the detail of a
// destination outside its pool (0 = none): kErrSlot, kErrTailSlot or kErrTailRow in *what.
__device__ __forceinline__ int64_t DestinationOf(const SlotAppendArgs& a, int b, int32_t t,
                                                 DeviceErrorKind* what, int32_t* detail) {
  *what = kErrNone;
  if (a.staging != nullptr) return t;
  if (a.tail_states == nullptr) {
    const int64_t slot = SlotAt(a, t);
    if (slot < -1 || slot >= a.num_slots) {
      *what = kErrSlot;
      // The detail word is int32: an int64 slot past it reads as INT32_MAX / INT32_MIN.
      *detail = static_cast<int32_t>(slot > INT32_MAX   ? INT32_MAX
                                     : slot < INT32_MIN ? INT32_MIN
                                                        : slot);
    }
    return slot;
  }
  // Token t is at position seq_lens[b] - (indptr[b + 1] - t), row position - record_tiles[b] * G.
  const int32_t slot = a.tail_slots[b];
  const int64_t rt = a.record_tiles[b];
  const int64_t row = int64_t{a.seq_lens[b]} - (a.indptr[b + 1] - t) - rt * a.G;
  if (slot < 0 || slot >= a.num_tail_slots) {
    *what = kErrTailSlot;
    *detail = slot;
  } else if (rt < 0 || row < 0 || row >= a.tail_cap) {
    *what = kErrTailRow;
    *detail = static_cast<int32_t>(row < INT32_MIN ? INT32_MIN : row > INT32_MAX ? INT32_MAX : row);
  }
  return *what == kErrNone ? int64_t{slot} * a.tail_cap + row : -2;
}

// The fp16 row of head h, K or V, at destination `dest` (DestinationOf, valid).
__device__ __forceinline__ uint16_t* DestinationRow(const SlotAppendArgs& a, int64_t dest, int h,
                                                    int which, int D) {
  if (a.staging != nullptr) {
    return a.staging +
           ((static_cast<size_t>(which) * a.max_tokens + static_cast<size_t>(dest)) * a.hk + h) * D;
  }
  if (a.tail_states == nullptr) {
    const size_t page = static_cast<size_t>(dest / a.G), pos = static_cast<size_t>(dest % a.G);
    return (which ? a.pages[1] : a.pages[0]) + page * a.hk * a.G * D +
           (static_cast<size_t>(h) * a.G + pos) * D;
  }
  const size_t slot = static_cast<size_t>(dest / a.tail_cap),
               row = static_cast<size_t>(dest % a.tail_cap);
  return a.tail_states + slot * a.tail_slot_elems +
         ((static_cast<size_t>(which) * a.hk + h) * a.tail_cap + row) * D;
}

template <int D>
__global__ void __launch_bounds__(256) SlotAppendValidateKernel(const SlotAppendArgs a) {
  using L = RowLayout<D>;
  // The ranges were checked before (CheckIndptr): a sequence with a bad one is skipped (or,
  // without a status array, the write kernel writes nothing).
  const size_t gtid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n_threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = gtid / kWarpSize, n_warps = n_threads / kWarpSize;
  const size_t rows = static_cast<size_t>(a.max_tokens) * a.hk * 2;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < rows; r0 += n_warps * L::kRowsPerWarp) {
    const size_t r = r0 + lt;
    const int32_t t = static_cast<int32_t>((r >> 1) / a.hk);
    const int b = r < rows ? OwnerOf(a, t) : -1;
    DeviceErrorKind what = kErrNone;
    int32_t detail = 0;
    const int64_t dest = b >= 0 ? DestinationOf(a, b, t, &what, &detail) : -1;
    // Rows of skipped tokens are converted as zeros (the row shuffles need every lane).
    const bool valid = b >= 0 && dest != -1 && !SequenceSkipped(a, b);
    const int which = static_cast<int>(r & 1);
    const int h = static_cast<int>((r >> 1) % a.hk);
    float x[L::kPerLane];
    uint16_t hb[L::kPerLane];
    bool nf, of;
    ConvertRow<D>(a, which, t, h, valid, ld, x, hb, &nf, &of);
    if (!valid || ld != 0) continue;
    if (what != kErrNone) {
      // A tail error names the sequence (as the CPU's message does), a slot error the token.
      ReportSequenceError(a.seq_status, a.errors, b, KVARN_ERR_INVALID_ARGUMENT, what,
                          what == kErrSlot ? t : b, detail);
    } else if (nf || of) {
      ReportSequenceError(a.seq_status, a.errors, b, nf ? KVARN_ERR_NON_FINITE : KVARN_ERR_OVERFLOW,
                          nf ? kErrNonFinite : kErrOverflow, t, h);
    }
  }
}

template <int D>
__global__ void __launch_bounds__(256) SlotAppendWriteKernel(const SlotAppendArgs a) {
  using L = RowLayout<D>;
  // Without a status array any fault fails the whole call.
  if (a.seq_status == nullptr &&
      *static_cast<const volatile int32_t*>(&a.errors->launch_flag) != 0) {
    return;
  }
  const size_t gtid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t n_threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = gtid / kWarpSize, n_warps = n_threads / kWarpSize;
  const size_t rows = static_cast<size_t>(a.max_tokens) * a.hk * 2;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < rows; r0 += n_warps * L::kRowsPerWarp) {
    const size_t r = r0 + lt;
    const int32_t t = static_cast<int32_t>((r >> 1) / a.hk);
    const int b = r < rows ? OwnerOf(a, t) : -1;
    DeviceErrorKind what = kErrNone;
    int32_t detail = 0;
    const int64_t dest = b >= 0 ? DestinationOf(a, b, t, &what, &detail) : -1;
    const bool valid = b >= 0 && dest >= 0 && what == kErrNone && !SequenceSkipped(a, b);
    const int which = static_cast<int>(r & 1);
    const int h = static_cast<int>((r >> 1) % a.hk);
    float x[L::kPerLane];
    uint16_t hb[L::kPerLane];
    bool nf, of;
    ConvertRow<D>(a, which, t, h, valid, ld, x, hb, &nf, &of);
    if (!valid) continue;
    uint16_t* dst = DestinationRow(a, dest, h, which, D);
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) Store8Halves(dst + L::Channel(ld, c), &hb[c * 8]);
  }
}

// The validate-then-write pair of an append by slot or into the tail slots.
Status LaunchSlotAppend(Context* ctx, const Config& cfg, const PagedKV& kv,
                        const LaunchArgs& launch, const SlotAppendArgs& a, size_t max_tokens) {
  CudaState* s = State(ctx);
  const int32_t* token_indptr = a.indptr;
  if (launch.seq_status == nullptr) KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  KVARN_RETURN_IF_ERROR(CheckIndptr(s, token_indptr, kv.batch, static_cast<int64_t>(max_tokens),
                                    launch.seq_status, IndptrKind::kToken));
  return DispatchHeadDim(cfg.D, [&](auto d) -> Status {
    constexpr int kD = decltype(d)::value;
    const size_t rows = max_tokens * static_cast<size_t>(kv.num_kv_heads) * 2;
    const size_t rows_per_warp = LaunchRowsPerWarp<kD>(s);
    size_t blocks = ((rows + rows_per_warp - 1) / rows_per_warp + 7) / 8;
    blocks = std::max<size_t>(blocks, 1);
    blocks = std::min<size_t>(blocks, static_cast<size_t>(std::max(s->sm_count, 1)) * 8);
    const unsigned grid = static_cast<unsigned>(blocks);
    SlotAppendValidateKernel<kD><<<grid, 256, 0, s->stream>>>(a);
    KVARN_RETURN_IF_ERROR(CheckLaunch("SlotAppendValidateKernel"));
    SlotAppendWriteKernel<kD><<<grid, 256, 0, s->stream>>>(a);
    return CheckLaunch("SlotAppendWriteKernel");
  });
}

}  // namespace

Status PagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                      const int32_t* token_indptr, const int32_t* slot_mapping, size_t max_tokens,
                      kvarn_dtype_t dtype, const void* k, const void* v) {
  if (!Aligned16(kv.k_pages) || !Aligned16(kv.v_pages)) {
    return InvalidArgument("k_pages and v_pages must be 16-byte aligned on a CUDA context");
  }
  CudaState* s = State(ctx);
  SlotAppendArgs a{};
  a.src[0] = k;
  a.src[1] = v;
  a.row_stride[0] = launch.k_row_stride;
  a.row_stride[1] = launch.v_row_stride;
  a.dtype = dtype;
  // 16-byte loads need every row start 16-byte aligned too (rows start at multiples of 8).
  a.vec =
      Aligned16(k) && Aligned16(v) && launch.k_row_stride % 8 == 0 && launch.v_row_stride % 8 == 0;
  a.rotate[0] = cfg.k_rotate;
  a.rotate[1] = cfg.v_rotate;
  a.scale = RotationScale(cfg.D);
  a.pages[0] = kv.k_pages;
  a.pages[1] = kv.v_pages;
  a.num_slots = static_cast<int64_t>(kv.num_pages) * cfg.G;
  a.hk = kv.num_kv_heads;
  a.G = cfg.G;
  a.batch = kv.batch;
  a.max_tokens = static_cast<int32_t>(max_tokens);
  a.indptr = token_indptr;
  a.slots = slot_mapping;
  a.slots64 = launch.index64;
  a.seq_status = launch.seq_status;
  a.errors = s->errors;
  return LaunchSlotAppend(ctx, cfg, kv, launch, a, max_tokens);
}

namespace {

// The arguments of an append into the tail slots (or, with `staging`, into the workspace).
SlotAppendArgs TailAppendArgs(Context* ctx, const Config& cfg, const PagedKV& kv,
                              const LaunchArgs& launch, const int32_t* token_indptr,
                              size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                              const void* v) {
  SlotAppendArgs a{};
  a.src[0] = k;
  a.src[1] = v;
  a.row_stride[0] = launch.k_row_stride;
  a.row_stride[1] = launch.v_row_stride;
  a.dtype = dtype;
  a.vec =
      Aligned16(k) && Aligned16(v) && launch.k_row_stride % 8 == 0 && launch.v_row_stride % 8 == 0;
  a.rotate[0] = cfg.k_rotate;
  a.rotate[1] = cfg.v_rotate;
  a.scale = RotationScale(cfg.D);
  a.hk = kv.num_kv_heads;
  a.G = cfg.G;
  a.batch = kv.batch;
  a.max_tokens = static_cast<int32_t>(max_tokens);
  a.indptr = token_indptr;
  a.seq_status = launch.seq_status;
  a.errors = State(ctx)->errors;
  a.tail_states = kv.tail_states;
  a.tail_slot_elems = kv.tail_slot_elems;
  a.tail_cap = kv.tail_cap;
  a.num_tail_slots = kv.num_tail_slots;
  a.tail_slots = kv.tail_slots;
  a.seq_lens = kv.seq_lens;
  a.record_tiles = kv.record_tiles;
  return a;
}

}  // namespace

Status PagedAppendTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const LaunchArgs& launch, const int32_t* token_indptr, size_t max_tokens,
                          kvarn_dtype_t dtype, const void* k, const void* v) {
  const SlotAppendArgs a =
      TailAppendArgs(ctx, cfg, kv, launch, token_indptr, max_tokens, dtype, k, v);
  return LaunchSlotAppend(ctx, cfg, kv, launch, a, max_tokens);
}

Status StageTailAppendRows(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const LaunchArgs& launch, const int32_t* token_indptr, size_t max_tokens,
                           kvarn_dtype_t dtype, const void* k, const void* v, uint16_t* staging) {
  SlotAppendArgs a = TailAppendArgs(ctx, cfg, kv, launch, token_indptr, max_tokens, dtype, k, v);
  a.staging = staging;
  return LaunchSlotAppend(ctx, cfg, kv, launch, a, max_tokens);
}

Status PagedAppend(Context* ctx, const Config& cfg, const PagedKV& kv, const int32_t* indptr,
                   kvarn_dtype_t dtype, const void* k, const void* v) {
  if (indptr[0] != 0) return InvalidArgument("token_indptr[0] must be 0");
  for (int b = 0; b < kv.batch; ++b) {
    if (indptr[b + 1] < indptr[b]) return InvalidArgument("token_indptr must not decrease");
  }
  const int32_t total = indptr[kv.batch];
  if (total == 0) return Status::Ok();
  if (!Aligned16(kv.k_pages) || !Aligned16(kv.v_pages)) {
    return InvalidArgument("k_pages and v_pages must be 16-byte aligned on a CUDA context");
  }
  CudaState* s = State(ctx);
  AppendArgs a{};
  a.src[0] = k;
  a.src[1] = v;
  a.row_stride[0] = a.row_stride[1] = static_cast<int64_t>(kv.num_kv_heads) * cfg.D;
  a.dtype = dtype;
  a.vec = Aligned16(k) && Aligned16(v);
  a.rotate[0] = cfg.k_rotate;
  a.rotate[1] = cfg.v_rotate;
  a.scale = RotationScale(cfg.D);
  a.pages[0] = kv.k_pages;
  a.pages[1] = kv.v_pages;
  a.num_pages = kv.num_pages;
  a.hk = kv.num_kv_heads;
  a.G = cfg.G;
  a.sink_tiles = cfg.sink_tiles;
  a.block_table = kv.block_table;
  a.max_blocks = kv.max_blocks_per_seq;
  a.seq_lens = kv.seq_lens;
  a.record_tiles = kv.record_tiles;
  a.errors = s->errors;
  std::vector<AppendChunk> chunks;
  for (int first = 0; first < kv.batch; first += kSeqsPerLaunch) {
    AppendChunk ch{};
    ch.first_seq = first;
    ch.n_seq = std::min(kSeqsPerLaunch, kv.batch - first);
    for (int i = 0; i <= ch.n_seq; ++i) ch.indptr[i] = indptr[first + i];
    chunks.push_back(ch);
  }
  KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  const int sms = s->sm_count > 0 ? s->sm_count : 1;
  auto grid_for = [&](const AppendChunk& ch, int rows_per_warp) {
    const size_t rows =
        static_cast<size_t>(ch.indptr[ch.n_seq] - ch.indptr[0]) * kv.num_kv_heads * 2;
    const size_t warps = (rows + rows_per_warp - 1) / rows_per_warp;
    size_t blocks = (warps + 7) / 8;
    const size_t seq_blocks = (static_cast<size_t>(ch.n_seq) + 255) / 256;
    if (blocks < seq_blocks) blocks = seq_blocks;
    if (blocks < 1) blocks = 1;
    const size_t cap = static_cast<size_t>(sms) * 8;
    return static_cast<unsigned>(blocks < cap ? blocks : cap);
  };
  auto launch = [&](auto d) -> Status {
    constexpr int kD = decltype(d)::value;
    for (const AppendChunk& ch : chunks) {
      AppendValidateKernel<kD>
          <<<grid_for(ch, LaunchRowsPerWarp<kD>(s)), 256, 0, s->stream>>>(a, ch);
      KVARN_RETURN_IF_ERROR(CheckLaunch("AppendValidateKernel"));
    }
    for (const AppendChunk& ch : chunks) {
      if (ch.indptr[ch.n_seq] == ch.indptr[0]) continue;
      AppendWriteKernel<kD><<<grid_for(ch, LaunchRowsPerWarp<kD>(s)), 256, 0, s->stream>>>(a, ch);
      KVARN_RETURN_IF_ERROR(CheckLaunch("AppendWriteKernel"));
    }
    return Status::Ok();
  };
  return DispatchHeadDim(cfg.D, launch);
}

}  // namespace gpu
}  // namespace kvarn
