// Layer 1 (rotate, quantize, dequantize) and the layer-2 flush of the CUDA backend.
//
// Quantize and flush are validate-then-write (gpu_common.cuh): one CTA per tile matrix (K or V
// of one record, codec_tile.cuh) writes the record into the context's scratch and reports
// non-finite inputs or fp16 overflows in the error words; a guarded kernel copies the staged
// records to their destinations only if nothing was reported; the host then synchronizes and
// returns the status. Nothing is written on failure.
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>

#include "backends/gpu/codec_tile.cuh"
#include "backends/gpu/gpu_common.cuh"
#include "backends/gpu/gpu_ops.h"
#include "backends/gpu/hadamard_fwht.cuh"

namespace kvarn {
namespace gpu {
namespace {

// (float)(1 / sqrt(D)) exactly as the CPU computes it (backends/cpu/hadamard.cpp).
float RotationScale(int D) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(D))); }

// Calls f(integral_constant<D>, integral_constant<G>) for a supported shape.
template <typename F>
Status DispatchDG(int D, int G, F&& f) {
  using std::integral_constant;
  const bool g128 = G == 128;
  if (G != 64 && G != 128) return Unsupported("tile size " + std::to_string(G));
  switch (D) {
    case 64:
      return g128 ? f(integral_constant<int, 64>{}, integral_constant<int, 128>{})
                  : f(integral_constant<int, 64>{}, integral_constant<int, 64>{});
    case 128:
      return g128 ? f(integral_constant<int, 128>{}, integral_constant<int, 128>{})
                  : f(integral_constant<int, 128>{}, integral_constant<int, 64>{});
    case 256:
      return g128 ? f(integral_constant<int, 256>{}, integral_constant<int, 128>{})
                  : f(integral_constant<int, 256>{}, integral_constant<int, 64>{});
    case 512:
      return g128 ? f(integral_constant<int, 512>{}, integral_constant<int, 128>{})
                  : f(integral_constant<int, 512>{}, integral_constant<int, 64>{});
    default:
      return Unsupported("head_dim " + std::to_string(D));
  }
}

// Blocks for a grid-stride kernel: enough for the work, at most one full wave. The wave is what
// the kernel's registers let reside (not a fixed 8 per SM): a grid of 8 per SM where only 6 fit
// (RotateKernel<128>: 40 registers) runs a partial second wave that leaves the GPU a third idle.
template <typename Kernel>
unsigned GridFor(Context* ctx, Kernel kernel, int threads, size_t work_items, unsigned per_block) {
  int resident = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, kernel, threads, 0) != cudaSuccess ||
      resident < 1) {
    (void)cudaGetLastError();  // not sticky; one block per SM is still correct
    resident = 1;
  }
  const size_t want = (work_items + per_block - 1) / per_block;
  const size_t cap = static_cast<size_t>(State(ctx)->sm_count > 0 ? State(ctx)->sm_count : 1) *
                     static_cast<size_t>(resident);
  return static_cast<unsigned>(want < 1 ? 1 : (want < cap ? want : cap));
}

// ---- rotate -------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(256)
    RotateKernel(size_t rows, kvarn_dtype_t in_dtype, const void* in, bool vin,
                 kvarn_dtype_t out_dtype, void* out, bool vout, float scale) {
  using L = RowLayout<D>;
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const size_t n_warps = static_cast<size_t>(gridDim.x) * blockDim.x / kWarpSize;
  // Two row groups per iteration keep more loads in flight. The loop bound is uniform per
  // warp, so every lane reaches the shuffles; each row is loaded completely before it is
  // stored (the shuffles depend on every load), so `out` may alias `in`.
  constexpr int kU = 2;
  const size_t stride = n_warps * L::kRowsPerWarp;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < rows; r0 += kU * stride) {
    float x[kU][L::kPerLane];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const size_t r = r0 + u * stride + lt;
#pragma unroll
      for (int c = 0; c < L::kChunks; ++c) {
        if (r < rows) {
          Load8(in_dtype, in, r * D + L::Channel(ld, c), vin, &x[u][c * 8]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) x[u][c * 8 + e] = 0.f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) FwhtRow<D>(x[u], ld, scale);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const size_t r = r0 + u * stride + lt;
      if (r < rows) {
#pragma unroll
        for (int c = 0; c < L::kChunks; ++c) {
          Store8(out_dtype, out, r * D + L::Channel(ld, c), vout, &x[u][c * 8]);
        }
      }
    }
  }
}

// ---- quantize / flush: one CTA per tile matrix ------------------------------------------------

// The device-resident list of kvarn_paged_flush_run: entries [0, *count) of src_pages /
// dst_blocks, checked by the kernels (count, pools, sequences) instead of the host.
struct FlushList {
  const int32_t* count;  // NULL: no list (the host-list flush, quantize)
  int32_t max_tiles;
  bool index64;  // src_pages, dst_blocks and tile_seqs hold int64 (launch->index_type)
  const int32_t* dst_blocks;
  const int32_t* tile_seqs;  // with seq_status; -1: an entry of no sequence
  int32_t* seq_status;       // [batch] or NULL (then faults fail the call)
  int32_t batch;
  int32_t num_pages;
  int32_t num_blocks;
};

// The tail flush (kvarn_paged_flush_tail_run): sequence b's tiles [record_tiles[b], committed[b] /
// G) from the rows of its tail slot. Item i of the launch is (b, j, h) = tile record_tiles[b] + j,
// head h, i = (b * per_seq + j) * hk + h; the items past a sequence's tiles return at once.
struct TailFlush {
  const uint16_t* states;  // NULL: not a tail flush
  size_t slot_elems;
  int32_t cap;
  int32_t num_slots;
  const int32_t* slots;
  const int32_t* seq_lens;
  const int32_t* record_tiles;
  const int32_t* committed;
  const int32_t* block_table;
  int32_t max_blocks;
  int32_t num_blocks;
  int32_t per_seq;  // cap / G: the most tiles one sequence flushes
  int32_t* seq_status;
};

// kvarn_paged_append_flush_tail_run (with TailFlush's slot fields): staged tile i / hk is
// sequence b's tile record_tiles[b] + (i / hk - first[b]), i / hk in [first[b], first[b + 1]);
// its rows at positions before the append come from the slot, the others from the staged input
// rows (already in the cache frame).
struct AppendFlushTiles {
  const int32_t* first;   // [batch + 1] (the plan kernel's), or NULL: not an append-flush
  const uint16_t* rows;   // fp16 [2][max_tokens][Hk][D]
  const int32_t* indptr;  // token_indptr, or NULL: nothing appended
  int32_t max_tokens;
  int32_t batch;
};

// Tokens sequence b appends (an append-flush with indptr NULL appends none).
__device__ __forceinline__ int64_t Appended(const AppendFlushTiles& af, int b) {
  return af.indptr == nullptr ? 0 : int64_t{af.indptr[b + 1]} - af.indptr[b];
}

struct TileJob {
  // Sources: fp16 tiles [.][G][D] (K at src[0], V at src[1]); tile index of item i is
  // src_pages[i / hk] * hk + i % hk (flush: pages are [Hk][G][D]) or i (src_pages NULL).
  const uint16_t* src[2];
  const int32_t* src_pages;
  int hk;
  int item_base;  // index of this launch's first item among the staged records
  bool normalize[2];
  int bits[2];
  int iterations;
  uint8_t* staged;  // [items][rb]
  size_t rb;
  RecordOffsets ro;
  DeviceErrorWords* errors;
  FlushList list;       // kvarn_paged_flush_run: the device list (list.count NULL otherwise)
  TailFlush tail;       // kvarn_paged_flush_tail_run (tail.states NULL otherwise)
  AppendFlushTiles af;  // kvarn_paged_append_flush_tail_run (af.first NULL otherwise; tail set)
};

// How many tiles sequence b flushes (TailFlush), or -1 when it is skipped (a status entry already
// set) or its lengths, slot or table are wrong (then reported by `reporter`). Uniform over a CTA.
__device__ __forceinline__ int TailTilesToFlush(const TailFlush& f, DeviceErrorWords* errors, int G,
                                                int b, bool reporter) {
  if (f.seq_status != nullptr && *static_cast<const volatile int32_t*>(&f.seq_status[b]) != 0) {
    return -1;
  }
  const int64_t n = f.seq_lens[b], rt = f.record_tiles[b], c = f.committed[b];
  DeviceErrorKind what = kErrNone;
  int32_t detail = 0;
  if (n < 0 || rt < 0 || c < rt * G || c > n) {
    what = kErrCommitted;
    detail = static_cast<int32_t>(c);
  } else if (n - rt * G > f.cap) {
    what = kErrTailRow;
    detail = static_cast<int32_t>(n - rt * G);
  } else if (c / G > rt && (f.slots[b] < 0 || f.slots[b] >= f.num_slots)) {
    what = kErrTailSlot;
    detail = f.slots[b];
  } else if (c / G > f.max_blocks) {
    what = kErrSeqLen;
    detail = static_cast<int32_t>(c / G);
  } else {
    for (int64_t tile = rt; tile < c / G; ++tile) {
      const int32_t id = f.block_table[static_cast<size_t>(b) * f.max_blocks + tile];
      if (id < 0 || id >= f.num_blocks) {
        what = kErrBlockTable;
        detail = static_cast<int32_t>(tile);
        break;
      }
    }
  }
  if (what != kErrNone) {
    if (reporter) {
      ReportSequenceError(f.seq_status, errors, b, KVARN_ERR_INVALID_ARGUMENT, what, b, detail);
    }
    return -1;
  }
  return static_cast<int>(c / G - rt);
}

// Entry i of an index list of int32, or of int64 when `wide`.
__device__ __forceinline__ int64_t ListEntry(const int32_t* list, bool wide, size_t i) {
  return wide ? reinterpret_cast<const int64_t*>(list)[i] : list[i];
}

// Whether a flush-list entry is to be flushed; reports what is wrong with it. *seq: the entry's
// sequence (0 without a status array). Call with every thread of the CTA (uniform result).
__device__ __forceinline__ bool FlushEntryLive(const FlushList& f, DeviceErrorWords* errors,
                                               int entry, bool reporter, int32_t* seq) {
  const int32_t n = *f.count;
  *seq = 0;
  if (n < 0 || n > f.max_tiles) {
    if (reporter && entry == 0) {
      ReportDeviceError(errors, KVARN_ERR_INVALID_ARGUMENT, kErrFlushCount, n, f.max_tiles);
    }
    return false;
  }
  if (entry >= n) return false;
  if (f.seq_status != nullptr) {
    const int64_t s = ListEntry(f.tile_seqs, f.index64, entry);
    if (s < -1 || s >= f.batch) {
      if (reporter) ReportDeviceError(errors, KVARN_ERR_INVALID_ARGUMENT, kErrFlushEntry, entry, 1);
      return false;
    }
    *seq = static_cast<int32_t>(s);
    // -1: no sequence, flushed whatever seq_status holds; its faults fail the call.
    if (s >= 0 && f.seq_status[s] != 0) return false;
  }
  return true;
}

// One CTA per (item, K or V). The tile is copied to shared memory (kSmemTile) or read in place.
// Error detail words of the synchronous operations (formatted by the host): a = item, b = which
// for a tile error, which | (token + 1) << 1 for an input row of layer 1.
template <int D, int G, bool kSmemTile>
__global__ void KVARN_LAUNCH_BOUNDS2((TileShape<D, G>::kThreads), (TileShape<D, G>::kMinBlocks))
    QuantizeTilesKernel(const TileJob job) {
  using Shape = TileShape<D, G>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  TileSmem<D, G> smem(reinterpret_cast<float*>(smem_raw));
  const int item = blockIdx.x, which = blockIdx.y;
  int32_t seq = 0;
  int32_t* const seq_status =
      job.tail.states != nullptr ? job.tail.seq_status : job.list.seq_status;
  if (job.list.count != nullptr) {
    const FlushList& f = job.list;
    const int entry = item / job.hk;
    if (!FlushEntryLive(f, job.errors, entry, threadIdx.x == 0 && item % job.hk == 0 && which == 0,
                        &seq)) {
      return;
    }
    const int64_t page = ListEntry(job.src_pages, f.index64, entry),
                  block = ListEntry(f.dst_blocks, f.index64, entry);
    if (page < 0 || page >= f.num_pages || block < 0 || block >= f.num_blocks) {
      if (threadIdx.x == 0) {
        ReportSequenceError(seq_status, job.errors, seq, KVARN_ERR_INVALID_ARGUMENT, kErrFlushEntry,
                            entry, 0);
      }
      return;
    }
  }
  // The tile's rows: n_src from src (rows D apart), then G - n_src from in_rows (rows in_stride
  // apart; an append-flush tile that holds the first appended token).
  const uint16_t* src;
  const uint16_t* in_rows = nullptr;
  int n_src = G;
  size_t in_stride = 0;
  if (job.af.first != nullptr) {
    const AppendFlushTiles& af = job.af;
    const TailFlush& f = job.tail;
    const int tile_index = item / job.hk, h = item % job.hk;
    if (tile_index >= af.first[af.batch]) return;
    int lo = 0, hi = af.batch - 1;  // the last b with first[b] <= tile_index
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (af.first[mid] <= tile_index) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int b = lo;
    seq = b;
    const int64_t rt = f.record_tiles[b], tile = rt + (tile_index - af.first[b]);
    const int64_t n_old = f.seq_lens[b] - Appended(af, b);
    n_src = static_cast<int>(max(int64_t{0}, min(n_old - tile * G, int64_t{G})));
    src = f.states + static_cast<size_t>(f.slots[b]) * f.slot_elems +
          ((static_cast<size_t>(which) * job.hk + h) * f.cap + static_cast<size_t>(tile - rt) * G) *
              D;
    if (n_src < G) {
      const int64_t t = af.indptr[b] + (tile * G + n_src - n_old);  // the first input row's token
      in_stride = static_cast<size_t>(job.hk) * D;
      in_rows = af.rows +
                (static_cast<size_t>(which) * af.max_tokens + static_cast<size_t>(t)) * in_stride +
                static_cast<size_t>(h) * D;
    }
  } else if (job.tail.states != nullptr) {
    const TailFlush& f = job.tail;
    const int per_b = f.per_seq * job.hk;
    const int b = item / per_b, j = (item % per_b) / job.hk, h = item % job.hk;
    seq = b;
    if (j >= TailTilesToFlush(f, job.errors, G, b,
                              threadIdx.x == 0 && item % per_b == 0 && which == 0)) {
      return;
    }
    src = f.states + static_cast<size_t>(f.slots[b]) * f.slot_elems +
          ((static_cast<size_t>(which) * job.hk + h) * f.cap + static_cast<size_t>(j) * G) * D;
  } else {
    const size_t index =
        job.src_pages
            ? static_cast<size_t>(ListEntry(job.src_pages, job.list.index64, item / job.hk)) *
                      job.hk +
                  item % job.hk
            : static_cast<size_t>(item);
    src = (which ? job.src[1] : job.src[0]) + index * G * D;
  }
  uint16_t* tile_smem = reinterpret_cast<uint16_t*>(smem_raw + Shape::kAuxBytes);
  bool bad = false;
  for (int i = threadIdx.x; i < G * D / 8; i += Shape::kThreads) {
    const int r = i / (D / 8);
    const uint4 u = r < n_src ? reinterpret_cast<const uint4*>(src)[i]
                              : reinterpret_cast<const uint4*>(in_rows + (r - n_src) * in_stride +
                                                               (i % (D / 8)) * 8)[0];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      // Either half has all exponent bits set: inf or NaN.
      bad |= (w[q] & 0x7c00u) == 0x7c00u || (w[q] & 0x7c000000u) == 0x7c000000u;
    }
    if (kSmemTile) reinterpret_cast<uint4*>(tile_smem)[i] = u;
  }
  if (__syncthreads_or(bad)) {
    if (bad) {
      ReportSequenceError(seq_status, job.errors, seq, KVARN_ERR_NON_FINITE, kErrNonFinite,
                          job.item_base + item, which);
    }
    return;
  }
  // (An append-flush launches only where the tile fits shared memory: in_rows are read above.)
  const TileCta<D, G> cta(kSmemTile ? tile_smem : src);
  uint8_t* rec = job.staged + static_cast<size_t>(job.item_base + item) * job.rb;
  const bool overflow = which == 0 ? cta.template Quantize<false>(job.bits[0], job.normalize[0],
                                                                  job.iterations, rec, job.ro, smem)
                                   : cta.template Quantize<true>(job.bits[1], job.normalize[1],
                                                                 job.iterations, rec, job.ro, smem);
  if (overflow) {
    ReportSequenceError(seq_status, job.errors, seq, KVARN_ERR_OVERFLOW, kErrOverflow,
                        job.item_base + item, which);
  }
}

// Layer 1: converts rows of k/v (dtype) to the cache frame exactly like ToCacheFrame on the CPU
// (finite check, rotation, fp16 rounding with overflow check) into fp16 tiles dst[which]
// [tiles][G][D]. Rows r of tiles [tile_base, tile_base + rows / G).
template <int D>
__global__ void __launch_bounds__(256)
    ConvertRowsKernel(const void* k, const void* v, kvarn_dtype_t dtype, bool vec, bool rot_k,
                      bool rot_v, float scale, size_t tile_base, int G, size_t rows,
                      uint16_t* dst_k, uint16_t* dst_v, DeviceErrorWords* errors) {
  using L = RowLayout<D>;
  const int which = blockIdx.y;
  const void* src = which ? v : k;
  uint16_t* dst = which ? dst_v : dst_k;
  const bool rot = which ? rot_v : rot_k;
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const size_t n_warps = static_cast<size_t>(gridDim.x) * blockDim.x / kWarpSize;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < rows; r0 += n_warps * L::kRowsPerWarp) {
    const size_t r = r0 + lt;
    const bool valid = r < rows;
    float x[L::kPerLane];
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) {
      if (valid) {
        Load8(dtype, src, (tile_base * G + r) * D + L::Channel(ld, c), vec, &x[c * 8]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) x[c * 8 + e] = 0.f;
      }
    }
    bool nf = false, of = false;
#pragma unroll
    for (int j = 0; j < L::kPerLane; ++j) nf |= !isfinite(x[j]);
    if (rot) FwhtRow<D>(x, ld, scale);
    uint16_t h[L::kPerLane];
#pragma unroll
    for (int j = 0; j < L::kPerLane; ++j) {
      h[j] = FloatToHalfBits(x[j]);
      of |= !HalfBitsFinite(h[j]);
    }
    // A row with a NaN/Inf anywhere is non-finite; otherwise an unrepresentable value after
    // rotation is an overflow.
    nf = RowAny<D>(nf);
    of = RowAny<D>(of);
    if (!valid) continue;
    if (ld == 0 && (nf || of)) {
      const size_t tile = tile_base + r / G;
      const int t = static_cast<int>(r % G);
      ReportDeviceError(errors, nf ? KVARN_ERR_NON_FINITE : KVARN_ERR_OVERFLOW,
                        nf ? kErrNonFinite : kErrOverflow, static_cast<int32_t>(tile),
                        which | ((t + 1) << 1));
    }
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) Store8Halves(dst + r * D + L::Channel(ld, c), &h[c * 8]);
  }
}

// Copies staged record `item` (rb bytes) to its destination unless the launch failed.
// Destination: dst + index * stride, index = item (dst_blocks NULL) or dst_blocks[item / hk] *
// hk + item % hk. kVec: bytes per access (16 when rb, dst and stride allow it, else 1).
// With a flush list, only live entries of sequences without a fault are copied.
template <int kVec>
__global__ void __launch_bounds__(256)
    ScatterRecordsKernel(const uint8_t* staged, size_t rb, uint8_t* dst, size_t stride,
                         const int32_t* dst_blocks, int hk, const DeviceErrorWords* errors,
                         const FlushList list) {
  if (*static_cast<const volatile int32_t*>(&errors->launch_flag) != 0) return;
  const size_t item = blockIdx.x;
  if (list.count != nullptr) {
    const int entry = static_cast<int>(item / hk);
    if (entry >= *list.count) return;  // the count was checked: a bad one set launch_flag
    if (list.seq_status != nullptr) {
      const int64_t seq = ListEntry(list.tile_seqs, list.index64, entry);  // checked: >= -1
      if (seq >= 0 && *static_cast<const volatile int32_t*>(&list.seq_status[seq]) != 0) return;
    }
  }
  const size_t index =
      dst_blocks
          ? static_cast<size_t>(ListEntry(dst_blocks, list.index64, item / hk)) * hk + item % hk
          : item;
  const uint8_t* s = staged + item * rb;
  uint8_t* d = dst + index * stride;
  if (kVec == 16) {
    for (size_t i = threadIdx.x; i < rb / 16; i += blockDim.x) {
      reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    }
  } else {
    for (size_t i = threadIdx.x; i < rb; i += blockDim.x) d[i] = s[i];
  }
}

RecordOffsets Offsets(const Config& cfg) {
  RecordOffsets ro;
  for (int f = 0; f < KVARN_FIELD_COUNT; ++f)
    ro.off[f] = static_cast<uint32_t>(cfg.layout.offset[f]);
  return ro;
}

// A tile job staging records at the start of the workspace.
TileJob StagingTileJob(const Config& cfg, int hk, const LaunchArgs& launch,
                       DeviceErrorWords* errors) {
  TileJob job{};
  job.hk = hk;
  job.normalize[0] = cfg.k_normalize;
  job.normalize[1] = cfg.v_normalize;
  job.bits[0] = cfg.key_bits;
  job.bits[1] = cfg.value_bits;
  job.iterations = cfg.iterations;
  job.staged = static_cast<uint8_t*>(launch.workspace);
  job.rb = cfg.record_bytes();
  job.ro = Offsets(cfg);
  job.errors = errors;
  return job;
}

// Launches the tile kernels for `items` records (job.item_base.. of the staged buffer).
Status LaunchTiles(Context* ctx, const Config& cfg, const TileJob& job, size_t items) {
  CudaState* s = State(ctx);
  return DispatchDG(cfg.D, cfg.G, [&](auto d, auto g) -> Status {
    constexpr int kD = decltype(d)::value, kG = decltype(g)::value;
    using Shape = TileShape<kD, kG>;
    const dim3 grid(static_cast<unsigned>(items), 2);
    const size_t with_tile = Shape::kAuxBytes + Shape::kTileBytes;
    if (with_tile <= static_cast<size_t>(s->max_smem_optin)) {
      auto kernel = QuantizeTilesKernel<kD, kG, true>;
      KVARN_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(with_tile)));
      kernel<<<grid, Shape::kThreads, with_tile, s->stream>>>(job);
    } else {
      auto kernel = QuantizeTilesKernel<kD, kG, false>;
      KVARN_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(Shape::kAuxBytes)));
      kernel<<<grid, Shape::kThreads, Shape::kAuxBytes, s->stream>>>(job);
    }
    return CheckLaunch("QuantizeTilesKernel");
  });
}

// The guarded copy of `items` staged records to their destinations.
Status LaunchScatter(Context* ctx, const uint8_t* staged, size_t rb, size_t items, uint8_t* dst,
                     size_t stride, const int32_t* dst_blocks, int hk,
                     const FlushList& list = FlushList{}) {
  CudaState* s = State(ctx);
  const bool vec = Aligned16(dst) && stride % 16 == 0 && rb % 16 == 0;
  if (vec) {
    ScatterRecordsKernel<16><<<static_cast<unsigned>(items), 256, 0, s->stream>>>(
        staged, rb, dst, stride, dst_blocks, hk, s->errors, list);
  } else {
    ScatterRecordsKernel<1><<<static_cast<unsigned>(items), 256, 0, s->stream>>>(
        staged, rb, dst, stride, dst_blocks, hk, s->errors, list);
  }
  return CheckLaunch("ScatterRecordsKernel");
}

size_t AlignUp(size_t x, size_t a) { return (x + a - 1) / a * a; }

// ---- dequantize ---------------------------------------------------------------------------

struct DequantJob {
  const uint8_t* records;
  size_t stride;
  RecordOffsets ro;
  int G;
  int bits[2];
  bool unrotate[2];
  float scale;
  kvarn_dtype_t out_dtype;
  void* out[2];
  bool vec[2];
  size_t rows;  // n_tiles * G
};

__device__ __forceinline__ float ReadHalf(const uint8_t* p) {
  return HalfBitsToFloat(static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8)));
}

// One token row of K or V (blockIdx.y) per row group: K'[t,d] = (code*a_d + z_d)*c_t,
// V'[t,d] = (code*a'_t + z'_t)*c'_d with unfused fp32 operations (the CPU's rounding), then the
// inverse rotation.
template <int D>
__global__ void __launch_bounds__(256) DequantizeKernel(const DequantJob job) {
  using L = RowLayout<D>;
  const int which = blockIdx.y;
  void* const out = which ? job.out[1] : job.out[0];
  if (out == nullptr) return;
  const bool unrotate = which ? job.unrotate[1] : job.unrotate[0];
  const bool vec = which ? job.vec[1] : job.vec[0];
  const int lane = threadIdx.x % kWarpSize;
  const int ld = lane % L::kLanes, lt = lane / L::kLanes;
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
  const size_t n_warps = static_cast<size_t>(gridDim.x) * blockDim.x / kWarpSize;
  const int G = job.G, bits = which ? job.bits[1] : job.bits[0];
  const unsigned mask = (1u << bits) - 1u;
  const int per_byte = 8 / bits;
  for (size_t r0 = warp * L::kRowsPerWarp; r0 < job.rows; r0 += n_warps * L::kRowsPerWarp) {
    const size_t r = r0 + lt;
    const bool valid = r < job.rows;
    float x[L::kPerLane];
    if (valid) {
      const size_t tile = r / G;
      const int t = static_cast<int>(r % G);
      const uint8_t* rec = job.records + tile * job.stride;
      if (which == 0) {
        const uint8_t* codes = rec + job.ro.off[KVARN_FIELD_K_CODES];
        const float c = ReadHalf(rec + job.ro.off[KVARN_FIELD_K_TOKEN_SCALE] + 2 * t);
        const int row_bytes = G * bits / 8;
#pragma unroll
        for (int j = 0; j < L::kPerLane; ++j) {
          const int d = L::Channel(ld, j / 8) + j % 8;
          const unsigned code = (codes[static_cast<size_t>(d) * row_bytes + t / per_byte] >>
                                 ((t % per_byte) * bits)) &
                                mask;
          const float a = ReadHalf(rec + job.ro.off[KVARN_FIELD_K_SCALE] + 2 * d);
          const float z = ReadHalf(rec + job.ro.off[KVARN_FIELD_K_ZERO] + 2 * d);
          x[j] = __fmul_rn(__fadd_rn(__fmul_rn(static_cast<float>(code), a), z), c);
        }
      } else {
        const uint8_t* codes =
            rec + job.ro.off[KVARN_FIELD_V_CODES] + static_cast<size_t>(t) * (D * bits / 8);
        const float a = ReadHalf(rec + job.ro.off[KVARN_FIELD_V_SCALE] + 2 * t);
        const float z = ReadHalf(rec + job.ro.off[KVARN_FIELD_V_ZERO] + 2 * t);
#pragma unroll
        for (int j = 0; j < L::kPerLane; ++j) {
          const int d = L::Channel(ld, j / 8) + j % 8;
          const unsigned code = (codes[d / per_byte] >> ((d % per_byte) * bits)) & mask;
          const float c = ReadHalf(rec + job.ro.off[KVARN_FIELD_V_CHANNEL_SCALE] + 2 * d);
          x[j] = __fmul_rn(__fadd_rn(__fmul_rn(static_cast<float>(code), a), z), c);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < L::kPerLane; ++j) x[j] = 0.f;
    }
    if (unrotate) FwhtRow<D>(x, ld, job.scale);  // H is its own inverse
    if (valid) {
#pragma unroll
      for (int c = 0; c < L::kChunks; ++c) {
        Store8(job.out_dtype, out, r * D + L::Channel(ld, c), vec, &x[c * 8]);
      }
    }
  }
}

}  // namespace

Status Rotate(Context* ctx, int D, size_t rows, kvarn_dtype_t in_dtype, const void* in,
              kvarn_dtype_t out_dtype, void* out) {
  if (rows == 0) return Status::Ok();
  CudaState* s = State(ctx);
  const float scale = RotationScale(D);
  return DispatchHeadDim(D, [&](auto d) -> Status {
    constexpr int kD = decltype(d)::value;
    const size_t groups = (rows + LaunchRowsPerWarp<kD>(s) - 1) / LaunchRowsPerWarp<kD>(s);
    const unsigned grid = GridFor(ctx, RotateKernel<kD>, 256, groups, 256 / LaunchWarpSize(s));
    RotateKernel<kD><<<grid, 256, 0, s->stream>>>(rows, in_dtype, in, Aligned16(in), out_dtype, out,
                                                  Aligned16(out), scale);
    return CheckLaunch("RotateKernel");
  });
}

Status Quantize(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype, const void* k,
                const void* v, uint32_t flags, void* records, size_t record_stride) {
  if (n_tiles == 0) return Status::Ok();
  if (n_tiles > 0x7fffffffu) return Unsupported("more than 2^31-1 tiles in one call");
  const bool cache_frame = (flags & KVARN_CODEC_CACHE_FRAME) != 0;
  const int D = cfg.D, G = cfg.G;
  const size_t rb = cfg.record_bytes();
  const size_t tile_bytes = static_cast<size_t>(G) * D * 2;
  // The cache-frame fp16 tiles are staged in chunks (bounded scratch); the records of all tiles
  // are staged until every tile succeeded.
  const size_t chunk = std::min(n_tiles, std::max<size_t>(1, (size_t{64} << 20) / tile_bytes));
  const size_t staged_bytes = AlignUp(n_tiles * rb, 256);
  void* scratch = nullptr;
  KVARN_RETURN_IF_ERROR(EnsureScratch(ctx, staged_bytes + 2 * chunk * tile_bytes, &scratch));
  uint8_t* staged = static_cast<uint8_t*>(scratch);
  uint16_t* frame_k = reinterpret_cast<uint16_t*>(staged + staged_bytes);
  uint16_t* frame_v = frame_k + chunk * G * D;
  CudaState* s = State(ctx);
  KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  TileJob job{};
  job.src[0] = frame_k;
  job.src[1] = frame_v;
  job.src_pages = nullptr;
  job.hk = 1;
  job.normalize[0] = cfg.k_normalize;
  job.normalize[1] = cfg.v_normalize;
  job.bits[0] = cfg.key_bits;
  job.bits[1] = cfg.value_bits;
  job.iterations = cfg.iterations;
  job.staged = staged;
  job.rb = rb;
  job.ro = Offsets(cfg);
  job.errors = s->errors;
  const bool vec = Aligned16(k) && Aligned16(v);
  const float scale = RotationScale(D);
  for (size_t first = 0; first < n_tiles; first += chunk) {
    const size_t n = std::min(chunk, n_tiles - first);
    KVARN_RETURN_IF_ERROR(DispatchHeadDim(D, [&](auto d) -> Status {
      constexpr int kD = decltype(d)::value;
      const size_t rows = n * G;
      const size_t groups = (rows + LaunchRowsPerWarp<kD>(s) - 1) / LaunchRowsPerWarp<kD>(s);
      const dim3 grid(GridFor(ctx, ConvertRowsKernel<kD>, 256, groups, 256 / LaunchWarpSize(s)), 2);
      ConvertRowsKernel<kD><<<grid, 256, 0, s->stream>>>(
          k, v, dtype, vec, !cache_frame && cfg.k_rotate, !cache_frame && cfg.v_rotate, scale,
          first, G, rows, frame_k, frame_v, s->errors);
      return CheckLaunch("ConvertRowsKernel");
    }));
    job.item_base = static_cast<int>(first);
    KVARN_RETURN_IF_ERROR(LaunchTiles(ctx, cfg, job, n));
  }
  KVARN_RETURN_IF_ERROR(LaunchScatter(ctx, staged, rb, n_tiles, static_cast<uint8_t*>(records),
                                      record_stride, nullptr, 1));
  bool failed = false;
  DeviceErrorWords w{};
  KVARN_RETURN_IF_ERROR(SyncAndTakeLaunchError(ctx, &failed, &w));
  if (!failed) return Status::Ok();
  const char* which = (w.b & 1) ? "v" : "k";
  const int token = (w.b >> 1) - 1;
  const std::string tile = std::to_string(w.a);
  if (w.what == kErrNonFinite) {
    return {KVARN_ERR_NON_FINITE, std::string(which) + " of tile " + tile + ", token " +
                                      std::to_string(token) + " holds a NaN or Inf"};
  }
  if (w.what == kErrOverflow && token >= 0) {
    return {KVARN_ERR_OVERFLOW, std::string(which) + " of tile " + tile + ", token " +
                                    std::to_string(token) +
                                    " exceeds the fp16 range after rotation"};
  }
  if (w.what == kErrOverflow) {
    return {KVARN_ERR_OVERFLOW, "tile " + tile + ": " + which +
                                    " absorbed scale or zero exceeds the fp16 range (|x| > "
                                    "65504); nothing was written"};
  }
  return {static_cast<kvarn_status_t>(w.code ? w.code : KVARN_ERR_INTERNAL),
          "an earlier asynchronous operation on this context failed (device error kind " +
              std::to_string(w.what) + "); nothing was written"};
}

Status Dequantize(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                  size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k, void* v) {
  if (n_tiles == 0) return Status::Ok();
  const bool cache_frame = (flags & KVARN_CODEC_CACHE_FRAME) != 0;
  DequantJob job{};
  job.records = static_cast<const uint8_t*>(records);
  job.stride = record_stride;
  job.ro = Offsets(cfg);
  job.G = cfg.G;
  job.bits[0] = cfg.key_bits;
  job.bits[1] = cfg.value_bits;
  job.unrotate[0] = !cache_frame && cfg.k_rotate;
  job.unrotate[1] = !cache_frame && cfg.v_rotate;
  job.scale = RotationScale(cfg.D);
  job.out_dtype = out_dtype;
  job.out[0] = k;
  job.out[1] = v;
  job.vec[0] = Aligned16(k);
  job.vec[1] = Aligned16(v);
  job.rows = n_tiles * cfg.G;
  CudaState* s = State(ctx);
  return DispatchHeadDim(cfg.D, [&](auto d) -> Status {
    constexpr int kD = decltype(d)::value;
    const size_t groups = (job.rows + LaunchRowsPerWarp<kD>(s) - 1) / LaunchRowsPerWarp<kD>(s);
    const dim3 grid(GridFor(ctx, DequantizeKernel<kD>, 256, groups, 256 / LaunchWarpSize(s)), 2);
    DequantizeKernel<kD><<<grid, 256, 0, s->stream>>>(job);
    return CheckLaunch("DequantizeKernel");
  });
}

Status PagedFlush(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                  const int32_t* src_pages, const int32_t* dst_blocks) {
  const int Hk = kv.num_kv_heads;
  const size_t items = n_tiles * static_cast<size_t>(Hk);
  if (items > 0x7fffffffu) return Unsupported("more than 2^31-1 records in one flush");
  const size_t rb = cfg.record_bytes();
  const size_t staged_bytes = AlignUp(items * rb, 256);
  void* scratch = nullptr;
  KVARN_RETURN_IF_ERROR(
      EnsureScratch(ctx, staged_bytes + 2 * AlignUp(n_tiles * sizeof(int32_t), 256), &scratch));
  uint8_t* base = static_cast<uint8_t*>(scratch);
  int32_t* d_src = reinterpret_cast<int32_t*>(base + staged_bytes);
  int32_t* d_dst =
      reinterpret_cast<int32_t*>(base + staged_bytes + AlignUp(n_tiles * sizeof(int32_t), 256));
  CudaState* s = State(ctx);
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_src, src_pages, n_tiles * sizeof(int32_t),
                                             cudaMemcpyHostToDevice, s->stream));
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(d_dst, dst_blocks, n_tiles * sizeof(int32_t),
                                             cudaMemcpyHostToDevice, s->stream));
  if (!Aligned16(kv.k_pages) || !Aligned16(kv.v_pages)) {
    return InvalidArgument("k_pages and v_pages must be 16-byte aligned on a CUDA context");
  }
  KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  TileJob job{};
  job.src[0] = kv.k_pages;
  job.src[1] = kv.v_pages;
  job.src_pages = d_src;
  job.hk = Hk;
  job.item_base = 0;
  job.normalize[0] = cfg.k_normalize;
  job.normalize[1] = cfg.v_normalize;
  job.bits[0] = cfg.key_bits;
  job.bits[1] = cfg.value_bits;
  job.iterations = cfg.iterations;
  job.staged = base;
  job.rb = rb;
  job.ro = Offsets(cfg);
  job.errors = s->errors;
  KVARN_RETURN_IF_ERROR(LaunchTiles(ctx, cfg, job, items));
  KVARN_RETURN_IF_ERROR(
      LaunchScatter(ctx, base, rb, items, kv.records, kv.record_stride, d_dst, Hk));
  bool failed = false;
  DeviceErrorWords w{};
  KVARN_RETURN_IF_ERROR(SyncAndTakeLaunchError(ctx, &failed, &w));
  if (!failed) return Status::Ok();
  if (w.what == kErrNonFinite || w.what == kErrOverflow) {
    const size_t tile = static_cast<size_t>(w.a) / Hk;
    const std::string who = "page " + std::to_string(tile < n_tiles ? src_pages[tile] : -1) +
                            ", head " + std::to_string(w.a % Hk) + ": " + ((w.b & 1) ? "v " : "k ");
    if (w.what == kErrNonFinite) {
      return {KVARN_ERR_NON_FINITE, who + "tile holds a NaN or Inf value; nothing was written"};
    }
    return {KVARN_ERR_OVERFLOW,
            who +
                "absorbed scale or zero exceeds the fp16 range (|x| > 65504); nothing was "
                "written"};
  }
  return {static_cast<kvarn_status_t>(w.code ? w.code : KVARN_ERR_INTERNAL),
          "an earlier asynchronous operation on this context failed (device error kind " +
              std::to_string(w.what) + "); nothing was written"};
}

}  // namespace gpu
}  // namespace kvarn

namespace kvarn {
namespace gpu {

// The capturable flush: the same validate-then-write pair as PagedFlush, over a device list
// sized by max_tiles, staging in the caller's workspace; no copy, allocation or synchronization.
Status PagedFlushRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                     size_t max_tiles, const int32_t* n_tiles, const int32_t* src_pages,
                     const int32_t* dst_blocks, const int32_t* tile_seqs) {
  if (!Aligned16(kv.k_pages) || !Aligned16(kv.v_pages)) {
    return InvalidArgument("k_pages and v_pages must be 16-byte aligned on a CUDA context");
  }
  if (reinterpret_cast<uintptr_t>(launch.workspace) % 256 != 0) {
    return InvalidArgument("launch->workspace must be 256-byte aligned on a CUDA context");
  }
  const int Hk = kv.num_kv_heads;
  const size_t items = max_tiles * static_cast<size_t>(Hk);
  CudaState* s = State(ctx);
  KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  TileJob job = StagingTileJob(cfg, Hk, launch, s->errors);
  job.src[0] = kv.k_pages;
  job.src[1] = kv.v_pages;
  job.src_pages = src_pages;
  job.list.count = n_tiles;
  job.list.max_tiles = static_cast<int32_t>(max_tiles);
  job.list.index64 = launch.index64;
  job.list.dst_blocks = dst_blocks;
  job.list.tile_seqs = tile_seqs;
  job.list.seq_status = launch.seq_status;
  job.list.batch = kv.batch;
  job.list.num_pages = kv.num_pages;
  job.list.num_blocks = kv.num_record_blocks;
  KVARN_RETURN_IF_ERROR(LaunchTiles(ctx, cfg, job, items));
  return LaunchScatter(ctx, job.staged, job.rb, items, kv.records, kv.record_stride, dst_blocks, Hk,
                       job.list);
}

namespace {

// A commit kernel's copy of sequence b's n staged records (staged tiles first.., heads hk) to the
// blocks block_table[b][rt..]. kVec: 16-byte copies.
template <int kVec>
__device__ __forceinline__ void CopyStagedRecords(const TailFlush& f, int b, int rt, int n,
                                                  size_t first, const uint8_t* staged, size_t rb,
                                                  uint8_t* records, size_t record_stride, int hk) {
  for (int j = 0; j < n; ++j) {
    const size_t block =
        static_cast<size_t>(f.block_table[static_cast<size_t>(b) * f.max_blocks + rt + j]);
    for (int h = 0; h < hk; ++h) {
      const uint8_t* s = staged + ((first + j) * hk + h) * rb;
      uint8_t* d = records + (block * hk + h) * record_stride;
      if (kVec == 16) {
        for (size_t i = threadIdx.x; i < rb / 16; i += blockDim.x) {
          reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
        }
      } else {
        for (size_t i = threadIdx.x; i < rb; i += blockDim.x) d[i] = s[i];
      }
    }
  }
}

// Rows [shift, shift + rows) of every head of K and V of a slot (fp16 [2][hk][cap][D]) move to
// [0, rows), in chunks of `shift` rows: chunk k writes the rows chunk k - 1 read (done, after
// the barrier) and reads none that chunk k writes. Every thread of the CTA calls it.
__device__ __forceinline__ void MoveSlotRowsDown(uint16_t* slot, int cap, int hk, int D, int shift,
                                                 int64_t rows) {
  const int row_vecs = D / 8;
  for (int64_t r0 = 0; shift > 0 && r0 < rows; r0 += shift) {
    const int n = static_cast<int>(min(int64_t{shift}, rows - r0));
    const int per_head = n * row_vecs;
    for (int idx = threadIdx.x; idx < 2 * hk * per_head; idx += blockDim.x) {
      const int head = idx / per_head, e = idx % per_head;  // head: which * hk + h
      uint4* base = reinterpret_cast<uint4*>(slot + static_cast<size_t>(head) * cap * D);
      const size_t dst = static_cast<size_t>(r0) * row_vecs + e;
      base[dst] = base[dst + static_cast<size_t>(shift) * row_vecs];
    }
    __syncthreads();
  }
}

// The tail flush's second half, one CTA per sequence: unless the call failed (no status array)
// or the sequence faulted, copies its staged records to their blocks, moves the slot's rows past
// the flushed tiles to its start, and writes record_tiles_out[b]. kVec: 16-byte record copies.
template <int kVec>
__global__ void __launch_bounds__(256)
    TailCommitKernel(const TailFlush f, const uint8_t* staged, size_t rb, uint8_t* records,
                     size_t record_stride, int hk, int G, int D, const DeviceErrorWords* errors,
                     int32_t* record_tiles_out) {
  if (*static_cast<const volatile int32_t*>(&errors->launch_flag) != 0) return;
  const int b = blockIdx.x;
  const int32_t rt = f.record_tiles[b];
  const bool live =
      f.seq_status == nullptr || *static_cast<const volatile int32_t*>(&f.seq_status[b]) == 0;
  // Valid when live: the quantize kernel checked the sequence (a fault set its status).
  const int nflush = live ? f.committed[b] / G - rt : 0;
  if (nflush > 0) {
    CopyStagedRecords<kVec>(f, b, rt, nflush, static_cast<size_t>(b) * f.per_seq, staged, rb,
                            records, record_stride, hk);
    const int shift = nflush * G;
    uint16_t* slot =
        const_cast<uint16_t*>(f.states) + static_cast<size_t>(f.slots[b]) * f.slot_elems;
    MoveSlotRowsDown(slot, f.cap, hk, D, shift, int64_t{f.seq_lens[b]} - int64_t{rt} * G - shift);
  }
  __syncthreads();  // every thread has read record_tiles[b] (record_tiles_out may be it)
  if (threadIdx.x == 0) record_tiles_out[b] = rt + max(nflush, 0);
}

// The append-flush's plan, one CTA of kPlanThreads: checks every sequence the staging left live
// (lengths, committed, slot, block table; a fault is reported and flushes nothing) and writes
// first[b], the exclusive prefix sum of the tiles each flushes, and first[batch], the total.
constexpr int kPlanThreads = 1024;

__device__ int AppendFlushTileCount(const TailFlush& f, const AppendFlushTiles& af,
                                    DeviceErrorWords* errors, int G, int b) {
  if (f.seq_status != nullptr && *static_cast<const volatile int32_t*>(&f.seq_status[b]) != 0) {
    return 0;
  }
  const int64_t n = f.seq_lens[b], rt = f.record_tiles[b], c = f.committed[b];
  const int64_t n_old = n - Appended(af, b);
  DeviceErrorKind what = kErrNone;
  int64_t detail = 0;
  if (rt < 0 || n_old < rt * G || n_old - rt * G > f.cap) {
    what = kErrTailRow;  // the slot's rows before the append
    detail = n_old - rt * G;
  } else if (c < rt * G || c > n) {
    what = kErrCommitted;
    detail = c;
  } else if (n - c / G * G > f.cap) {
    what = kErrTailRow;  // the rows left past the new records
    detail = n - c / G * G;
  } else if (n > rt * G && (f.slots[b] < 0 || f.slots[b] >= f.num_slots)) {
    what = kErrTailSlot;
    detail = f.slots[b];
  } else if (c / G > f.max_blocks) {
    what = kErrSeqLen;
    detail = c / G;
  } else {
    for (int64_t tile = rt; tile < c / G; ++tile) {
      const int32_t id = f.block_table[static_cast<size_t>(b) * f.max_blocks + tile];
      if (id < 0 || id >= f.num_blocks) {
        what = kErrBlockTable;
        detail = tile;
        break;
      }
    }
  }
  if (what != kErrNone) {
    const int32_t d = static_cast<int32_t>(detail < INT32_MIN   ? INT32_MIN
                                           : detail > INT32_MAX ? INT32_MAX
                                                                : detail);
    ReportSequenceError(f.seq_status, errors, b, KVARN_ERR_INVALID_ARGUMENT, what, b, d);
    return 0;
  }
  return static_cast<int>(c / G - rt);
}

__global__ void __launch_bounds__(kPlanThreads)
    AppendFlushPlanKernel(const TailFlush f, const AppendFlushTiles af, int G,
                          DeviceErrorWords* errors, int32_t* first) {
  __shared__ int32_t scan[kPlanThreads];
  // Without a status array a fault so far (a bad token_indptr range among them) fails the call:
  // nothing is quantized (the tile kernel would read rows by that range).
  const bool failed =
      f.seq_status == nullptr && *static_cast<const volatile int32_t*>(&errors->launch_flag) != 0;
  int32_t carry = 0;
  for (int b0 = 0; b0 < af.batch; b0 += kPlanThreads) {
    const int b = b0 + static_cast<int>(threadIdx.x);
    const int32_t mine = b < af.batch && !failed ? AppendFlushTileCount(f, af, errors, G, b) : 0;
    int32_t total = 0;
    const int32_t before = CtaExclusiveScan(mine, scan, &total);
    if (b < af.batch) first[b] = carry + before;
    carry += total;
  }
  if (threadIdx.x == 0) first[af.batch] = carry;
}

// The append-flush's commit, one CTA per sequence: unless the call failed (no status array) or
// the sequence faulted, copies its staged records to their blocks, moves the slot's rows past
// the new records to its start, writes the appended rows past them into the slot, and writes
// record_tiles_out[b]. kVec: 16-byte record copies.
template <int kVec>
__global__ void __launch_bounds__(256)
    AppendFlushCommitKernel(const TailFlush f, const AppendFlushTiles af, const uint8_t* staged,
                            size_t rb, uint8_t* records, size_t record_stride, int hk, int G, int D,
                            const DeviceErrorWords* errors, int32_t* record_tiles_out) {
  if (*static_cast<const volatile int32_t*>(&errors->launch_flag) != 0) return;
  const int b = blockIdx.x;
  const int32_t rt = f.record_tiles[b];
  const bool live =
      f.seq_status == nullptr || *static_cast<const volatile int32_t*>(&f.seq_status[b]) == 0;
  const int nflush = live ? af.first[b + 1] - af.first[b] : 0;
  const int64_t n = f.seq_lens[b], n_old = n - Appended(af, b), new_rt = rt + nflush;
  if (live) {
    CopyStagedRecords<kVec>(f, b, rt, nflush, static_cast<size_t>(af.first[b]), staged, rb, records,
                            record_stride, hk);
    uint16_t* slot = n > new_rt * G ? const_cast<uint16_t*>(f.states) +
                                          static_cast<size_t>(f.slots[b]) * f.slot_elems
                                    : nullptr;
    // The slot's rows that stay move down by the flushed tiles.
    const int shift = nflush * G;
    MoveSlotRowsDown(slot, f.cap, hk, D, shift, n_old - rt * G - shift);
    // The appended rows past the new records (the others are in records now).
    const int64_t p0 = max(n_old, new_rt * G);
    const int count = static_cast<int>(n - p0);
    const int row_vecs = D / 8;
    const int per_head = count * row_vecs;
    for (int idx = threadIdx.x; idx < 2 * hk * per_head; idx += blockDim.x) {
      const int head = idx / per_head, e = idx % per_head, which = head / hk, h = head % hk;
      const int r = e / row_vecs, c = e % row_vecs;
      const size_t token = static_cast<size_t>(af.indptr[b] + (p0 + r - n_old));
      const uint4* in = reinterpret_cast<const uint4*>(
          af.rows + ((static_cast<size_t>(which) * af.max_tokens + token) * hk + h) * D);
      reinterpret_cast<uint4*>(
          slot)[(static_cast<size_t>(head) * f.cap + static_cast<size_t>(p0 + r - new_rt * G)) *
                    row_vecs +
                c] = in[c];
    }
  }
  __syncthreads();  // every thread has read record_tiles[b] (record_tiles_out may be it)
  if (threadIdx.x == 0) record_tiles_out[b] = static_cast<int32_t>(new_rt);
}

// The slot fields of a tail flush or append-flush.
TailFlush TailFlushOf(const PagedKV& kv, const LaunchArgs& launch, const int32_t* committed,
                      int per_seq) {
  TailFlush f{};
  f.states = kv.tail_states;
  f.slot_elems = kv.tail_slot_elems;
  f.cap = kv.tail_cap;
  f.num_slots = kv.num_tail_slots;
  f.slots = kv.tail_slots;
  f.seq_lens = kv.seq_lens;
  f.record_tiles = kv.record_tiles;
  f.committed = committed;
  f.block_table = kv.block_table;
  f.max_blocks = kv.max_blocks_per_seq;
  f.num_blocks = kv.num_record_blocks;
  f.per_seq = per_seq;
  f.seq_status = launch.seq_status;
  return f;
}

// Whether a D x G tile fits the device's shared memory (QuantizeTilesKernel's kSmemTile).
bool TileFitsSharedMemory(Context* ctx, const Config& cfg) {
  bool fits = false;
  (void)DispatchDG(cfg.D, cfg.G, [&](auto d, auto g) -> Status {
    using Shape = TileShape<decltype(d)::value, decltype(g)::value>;
    fits = Shape::kAuxBytes + Shape::kTileBytes <= static_cast<size_t>(State(ctx)->max_smem_optin);
    return Status::Ok();
  });
  return fits;
}

}  // namespace

// The capturable tail flush: the quantize kernel over every (sequence, tile, head) a slot can
// hold (items past a sequence's committed tiles return at once), staging in the workspace, then
// the commit kernel per sequence. No copy, allocation or synchronization.
Status PagedFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const LaunchArgs& launch, const int32_t* committed,
                         int32_t* record_tiles_out) {
  if (reinterpret_cast<uintptr_t>(launch.workspace) % 256 != 0) {
    return InvalidArgument("launch->workspace must be 256-byte aligned on a CUDA context");
  }
  const int Hk = kv.num_kv_heads;
  const int per_seq = kv.tail_cap / cfg.G;
  const size_t items = static_cast<size_t>(kv.batch) * per_seq * Hk;
  CudaState* s = State(ctx);
  KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  TileJob job = StagingTileJob(cfg, Hk, launch, s->errors);
  job.tail = TailFlushOf(kv, launch, committed, per_seq);
  const TailFlush& f = job.tail;
  KVARN_RETURN_IF_ERROR(LaunchTiles(ctx, cfg, job, items));
  const bool vec = Aligned16(kv.records) && kv.record_stride % 16 == 0 && job.rb % 16 == 0;
  const unsigned grid = static_cast<unsigned>(kv.batch);
  if (vec) {
    TailCommitKernel<16><<<grid, 256, 0, s->stream>>>(f, job.staged, job.rb, kv.records,
                                                      kv.record_stride, Hk, cfg.G, cfg.D, s->errors,
                                                      record_tiles_out);
  } else {
    TailCommitKernel<1><<<grid, 256, 0, s->stream>>>(f, job.staged, job.rb, kv.records,
                                                     kv.record_stride, Hk, cfg.G, cfg.D, s->errors,
                                                     record_tiles_out);
  }
  return CheckLaunch("TailCommitKernel");
}

// The capturable append-flush: the appended rows staged in the cache frame (validated), the plan
// kernel (checks, each sequence's first staged tile), the quantize kernel over the bound on the
// tiles (items past the plan's total return at once), then the commit kernel per sequence.
Status PagedAppendFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                               const LaunchArgs& launch, const int32_t* token_indptr,
                               size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v,
                               const int32_t* committed, int32_t* record_tiles_out) {
  if (reinterpret_cast<uintptr_t>(launch.workspace) % 256 != 0) {
    return InvalidArgument("launch->workspace must be 256-byte aligned on a CUDA context");
  }
  if (!TileFitsSharedMemory(ctx, cfg)) {
    return Unsupported(
        "kvarn_paged_append_flush_tail_run needs a D x G tile in shared memory, "
        "more than this device offers; use kvarn_paged_append_tail_run and "
        "kvarn_paged_flush_tail_run with slots sized for a step");
  }
  const int Hk = kv.num_kv_heads;
  const AppendFlushWorkspace w =
      AppendFlushWorkspaceLayout(cfg, Hk, kv.batch, kv.tail_cap, max_tokens);
  uint8_t* ws = static_cast<uint8_t*>(launch.workspace);
  CudaState* s = State(ctx);
  KVARN_RETURN_IF_ERROR(ResetLaunchFlag(ctx));
  AppendFlushTiles af{};
  af.first = reinterpret_cast<int32_t*>(ws + w.first);
  af.rows = reinterpret_cast<uint16_t*>(ws + w.rows);
  af.indptr = max_tokens > 0 ? token_indptr : nullptr;
  af.max_tokens = static_cast<int32_t>(max_tokens);
  af.batch = kv.batch;
  if (max_tokens > 0) {
    KVARN_RETURN_IF_ERROR(StageTailAppendRows(ctx, cfg, kv, launch, token_indptr, max_tokens, dtype,
                                              k, v, reinterpret_cast<uint16_t*>(ws + w.rows)));
  }
  TileJob job = StagingTileJob(cfg, Hk, launch, s->errors);
  job.tail = TailFlushOf(kv, launch, committed, kv.tail_cap / cfg.G);
  job.af = af;
  AppendFlushPlanKernel<<<1, kPlanThreads, 0, s->stream>>>(
      job.tail, af, cfg.G, s->errors, reinterpret_cast<int32_t*>(ws + w.first));
  KVARN_RETURN_IF_ERROR(CheckLaunch("AppendFlushPlanKernel"));
  KVARN_RETURN_IF_ERROR(LaunchTiles(ctx, cfg, job, w.max_tiles * Hk));
  const bool vec = Aligned16(kv.records) && kv.record_stride % 16 == 0 && job.rb % 16 == 0;
  const unsigned grid = static_cast<unsigned>(kv.batch);
  if (vec) {
    AppendFlushCommitKernel<16><<<grid, 256, 0, s->stream>>>(
        job.tail, af, job.staged, job.rb, kv.records, kv.record_stride, Hk, cfg.G, cfg.D, s->errors,
        record_tiles_out);
  } else {
    AppendFlushCommitKernel<1><<<grid, 256, 0, s->stream>>>(job.tail, af, job.staged, job.rb,
                                                            kv.records, kv.record_stride, Hk, cfg.G,
                                                            cfg.D, s->errors, record_tiles_out);
  }
  return CheckLaunch("AppendFlushCommitKernel");
}

}  // namespace gpu
}  // namespace kvarn
