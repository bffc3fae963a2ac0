// Layer 1 (rotate, quantize, dequantize) and the host-list layer-2 append/flush on the CPU (the
// latter check the tables, then run the slot-mapped / device-list forms in paged_run.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/dtype_io.h"
#include "backends/cpu/hadamard.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/record_codec.h"
#include "core/thread_pool.h"

namespace kvarn {
namespace cpu {
namespace {

// Runs fn(i) over [0, n) on the context's pool and returns the status of the lowest failing
// index, so the reported error never depends on scheduling.
template <typename Fn>
Status ParallelStatus(Context* ctx, size_t n, Fn fn) {
  std::vector<Status> st(n);
  ctx->pool->ParallelFor(n, [&](size_t i) { st[i] = fn(i); });
  for (auto& s : st) {
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

bool IsFinite(float x) { return std::isfinite(x); }

}  // namespace

bool ToCacheFrame(const float* in, int D, bool rotate, float* scratch, uint16_t* out) {
  for (int d = 0; d < D; ++d) {
    if (!IsFinite(in[d])) return false;
    scratch[d] = in[d];
  }
  if (rotate) HadamardInPlace(scratch, D);
  for (int d = 0; d < D; ++d) {
    out[d] = float_to_half(scratch[d]);
    if ((out[d] & 0x7c00u) == 0x7c00u) return false;
  }
  return true;
}

Status Rotate(Context* ctx, int D, size_t rows, kvarn_dtype_t in_dtype, const void* in,
              kvarn_dtype_t out_dtype, void* out) {
  // Rows are independent; `out` may alias `in` row by row, because each row is loaded
  // completely before it is stored.
  const Kernels& K = KernelsFor(ctx->isa);
  const size_t chunk = 256;
  const size_t n_chunks = (rows + chunk - 1) / chunk;
  ctx->pool->ParallelFor(n_chunks, [&](size_t c) {
    std::vector<float> x(D);
    for (size_t r = c * chunk; r < std::min(rows, (c + 1) * chunk); ++r) {
      if (in_dtype == KVARN_DTYPE_F16) {
        K.halves_to_floats(static_cast<const uint8_t*>(in) + 2 * r * D, D, x.data());
      } else {
        LoadRow(in_dtype, in, r * D, D, x.data());
      }
      K.hadamard(x.data(), D);
      if (out_dtype == KVARN_DTYPE_F16) {
        K.floats_to_halves(x.data(), D, static_cast<uint16_t*>(out) + r * D);
      } else {
        StoreRow(out_dtype, out, r * D, D, x.data());
      }
    }
  });

  return Status::Ok();
}

Status Quantize(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype, const void* k,
                const void* v, uint32_t flags, void* records, size_t record_stride) {
  const int D = cfg.D, G = cfg.G;
  const size_t rb = cfg.record_bytes();
  const bool cache_frame = flags & KVARN_CODEC_CACHE_FRAME;
  const Kernels& K = KernelsFor(ctx->isa);
  std::vector<uint8_t> staged(n_tiles * rb);
  Status st = ParallelStatus(ctx, n_tiles, [&](size_t tile) -> Status {
    TileScratch s;
    std::vector<uint16_t> kh(static_cast<size_t>(G) * D), vh(kh.size());
    std::vector<float> row(D), scratch(D);
    for (int t = 0; t < G; ++t) {
      const size_t off = (tile * G + t) * D;
      for (int which = 0; which < 2; ++which) {
        const void* src = which ? v : k;
        const bool rot = !cache_frame && (which ? cfg.v_rotate : cfg.k_rotate);
        LoadRow(dtype, src, off, D, row.data());
        uint16_t* dst = (which ? vh.data() : kh.data()) + static_cast<size_t>(t) * D;
        if (!K.to_cache_frame(row.data(), D, rot, scratch.data(), dst)) {
          for (int d = 0; d < D; ++d) {
            if (!std::isfinite(row[d])) {
              return {KVARN_ERR_NON_FINITE, std::string(which ? "v" : "k") + " of tile " +
                                                std::to_string(tile) + ", token " +
                                                std::to_string(t) + " holds a NaN or Inf"};
            }
          }
          return {KVARN_ERR_OVERFLOW, std::string(which ? "v" : "k") + " of tile " +
                                          std::to_string(tile) + ", token " + std::to_string(t) +
                                          " exceeds the fp16 range after rotation"};
        }
      }
    }
    Status r = QuantizeRecord(cfg, kh.data(), vh.data(), staged.data() + tile * rb, s, &K);
    if (!r.ok()) return {r.code(), "tile " + std::to_string(tile) + ": " + r.message()};
    return r;
  });
  if (!st.ok()) return st;  // nothing written
  for (size_t tile = 0; tile < n_tiles; ++tile) {
    std::memcpy(static_cast<uint8_t*>(records) + tile * record_stride, staged.data() + tile * rb,
                rb);
  }
  return Status::Ok();
}

Status Dequantize(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                  size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k, void* v) {
  const int D = cfg.D, G = cfg.G;
  const bool cache_frame = flags & KVARN_CODEC_CACHE_FRAME;
  const Kernels& K = KernelsFor(ctx->isa);
  ctx->pool->ParallelFor(n_tiles, [&](size_t tile) {
    std::vector<float> kf(static_cast<size_t>(G) * D), vf(kf.size());
    const uint8_t* rec = static_cast<const uint8_t*>(records) + tile * record_stride;
    DequantizeRecord(cfg, rec, k ? kf.data() : nullptr, v ? vf.data() : nullptr, &K);
    for (int which = 0; which < 2; ++which) {
      void* dst = which ? v : k;
      if (dst == nullptr) continue;
      float* src = which ? vf.data() : kf.data();
      const bool unrot = !cache_frame && (which ? cfg.v_rotate : cfg.k_rotate);
      for (int t = 0; t < G; ++t) {
        float* row = src + static_cast<size_t>(t) * D;
        if (unrot) K.hadamard(row, D);  // H is its own inverse
        StoreRow(out_dtype, dst, (tile * G + t) * D, D, row);
      }
    }
  });
  return Status::Ok();
}

Status CheckPagedTables(const Config& cfg, const PagedKV& kv) {
  for (int b = 0; b < kv.batch; ++b) KVARN_RETURN_IF_ERROR(CheckSequenceTables(cfg, kv, b));
  return Status::Ok();
}

Status CheckSequenceTables(const Config& cfg, const PagedKV& kv, int b) {
  const int G = cfg.G;
  if (kv.tail_states != nullptr) {
    // One pool: tiles [0, rt) are record blocks, the tokens past them rows of the tail slot.
    const int64_t n = kv.seq_lens[b], rt = kv.record_tiles[b];
    const std::string who = "sequence " + std::to_string(b) + ": ";
    if (n < 0 || rt < 0 || rt * G > n) {
      return InvalidArgument(who + "seq_lens " + std::to_string(n) + " and record_tiles " +
                             std::to_string(rt) + " do not add up");
    }
    if (n - rt * G > kv.tail_cap) {
      return InvalidArgument(who + std::to_string(n - rt * G) + " tokens past the records, " +
                             "more than the tail slot's " + std::to_string(kv.tail_cap) + " rows");
    }
    if (n > rt * G && (kv.tail_slots[b] < 0 || kv.tail_slots[b] >= kv.num_tail_slots)) {
      return InvalidArgument(who + "tail slot " + std::to_string(kv.tail_slots[b]) +
                             " is outside the " + std::to_string(kv.num_tail_slots) + " slots");
    }
    if (rt > kv.max_blocks_per_seq) {
      return InvalidArgument(who + "record_tiles exceeds max_blocks_per_seq");
    }
    for (int64_t i = 0; i < rt; ++i) {
      const int32_t id = kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + i];
      if (id < 0 || id >= kv.num_record_blocks) {
        return InvalidArgument(who + "block_table entry " + std::to_string(i) + " = " +
                               std::to_string(id) + " is outside the record pool");
      }
    }
    return Status::Ok();
  }
  {
    const int64_t n = kv.seq_lens[b];
    const int64_t rt = kv.record_tiles[b];
    const std::string who = "sequence " + std::to_string(b) + ": ";
    if (n < 0 || rt < 0) return InvalidArgument(who + "negative seq_len or record_tiles");
    const int64_t tiles = (n + G - 1) / G;
    if (tiles > kv.max_blocks_per_seq) {
      return InvalidArgument(who + std::to_string(n) + " tokens need " + std::to_string(tiles) +
                             " blocks, more than max_blocks_per_seq");
    }
    if (rt > 0 && cfg.sink_tiles + rt > n / G) {
      return InvalidArgument(who + "record_tiles " + std::to_string(rt) +
                             " exceeds the complete non-sink tiles of " + std::to_string(n) +
                             " tokens");
    }
    for (int64_t i = 0; i < tiles; ++i) {
      const int32_t id = kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + i];
      const bool is_record = i >= cfg.sink_tiles && i < cfg.sink_tiles + rt;
      const int32_t limit = is_record ? kv.num_record_blocks : kv.num_pages;
      if (id < 0 || id >= limit) {
        return InvalidArgument(who + "block_table entry " + std::to_string(i) + " = " +
                               std::to_string(id) + " is outside the " +
                               (is_record ? "record pool" : "page pool"));
      }
    }
  }
  return Status::Ok();
}

Status PagedAppend(Context* ctx, const Config& cfg, const PagedKV& kv, const int32_t* indptr,
                   kvarn_dtype_t dtype, const void* k, const void* v) {
  const int G = cfg.G;
  KVARN_RETURN_IF_ERROR(CheckPagedTables(cfg, kv));
  if (indptr[0] != 0) return InvalidArgument("token_indptr[0] must be 0");
  for (int b = 0; b < kv.batch; ++b) {
    if (indptr[b + 1] < indptr[b]) return InvalidArgument("token_indptr must not decrease");
    const int64_t first = kv.seq_lens[b];
    const int64_t last = first + (indptr[b + 1] - indptr[b]);  // exclusive
    for (int64_t tile = first / G; first < last && tile <= (last - 1) / G; ++tile) {
      const int64_t pos = std::max(first, tile * G);
      if (tile >= kv.max_blocks_per_seq) {
        return InvalidArgument("sequence " + std::to_string(b) + ": position " +
                               std::to_string(pos) + " is beyond max_blocks_per_seq");
      }
      // New positions lie at or past seq_len, so CheckPagedTables already guarantees their
      // tiles are fp16 tiles (records cover only complete tiles below seq_len).
      const int32_t page = kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + tile];
      if (page < 0 || page >= kv.num_pages) {
        return InvalidArgument("sequence " + std::to_string(b) + ": page id " +
                               std::to_string(page) + " out of range");
      }
    }
  }
  // The write slot of every token; the slot-mapped append stages every converted row before it
  // writes, so a failure leaves the pages untouched.
  const size_t total = static_cast<size_t>(indptr[kv.batch]);
  std::vector<int32_t> slots(total);
  for (int b = 0; b < kv.batch; ++b) {
    for (int32_t i = indptr[b]; i < indptr[b + 1]; ++i) {
      const int64_t pos = kv.seq_lens[b] + (i - indptr[b]);
      const int32_t page = kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + pos / G];
      slots[i] = static_cast<int32_t>(page * int64_t{G} + pos % G);
    }
  }
  LaunchArgs dense;  // k and v of the host-list append are dense
  dense.k_row_stride = dense.v_row_stride = static_cast<int64_t>(kv.num_kv_heads) * cfg.D;
  return PagedAppendRun(ctx, cfg, kv, dense, indptr, slots.data(), total, dtype, k, v);
}

Status PagedFlush(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                  const int32_t* src_pages, const int32_t* dst_blocks) {
  // The list flush on host memory: the device-list flush with the whole list live, staging in a
  // buffer of its own, every fault failing the call.
  if (n_tiles > static_cast<size_t>(INT32_MAX) / kv.num_kv_heads) {
    return Unsupported("more than 2^31-1 records in one flush");
  }
  std::vector<uint8_t> staged(FlushWorkspaceBytes(cfg, kv.num_kv_heads, n_tiles));
  LaunchArgs launch;
  launch.workspace = staged.data();
  launch.workspace_bytes = staged.size();
  const int32_t count = static_cast<int32_t>(n_tiles);
  return PagedFlushRun(ctx, cfg, kv, launch, n_tiles, &count, src_pages, dst_blocks, nullptr);
}

}  // namespace cpu
}  // namespace kvarn
