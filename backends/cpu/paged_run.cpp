// The capturable layer 2 (kvarn.h "plan / run") on the CPU: the same semantics as the GPU
// backends, run synchronously over host memory. Each call validates everything first, then
// writes only what belongs to sequences without a fault, so a faulty sequence stays as it was.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/dtype_io.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/record_codec.h"
#include "core/thread_pool.h"

namespace kvarn {
namespace cpu {
namespace {

// Records the first fault of sequence b: in seq_status when given, else in *first (the call's
// status, the lowest sequence's fault so the report does not depend on scheduling).
struct Faults {
  int32_t* seq_status;
  std::vector<Status> per_seq;

  Faults(int32_t* status, int batch) : seq_status(status), per_seq(batch) {}
  bool Skipped(int b) const { return seq_status != nullptr && seq_status[b] != 0; }
  void Set(int b, Status st) {
    if (per_seq[b].ok()) per_seq[b] = std::move(st);
  }
  bool Failed(int b) const { return !per_seq[b].ok(); }
  // The call's status without a status array; with one, the faults go there.
  Status Finish() {
    for (size_t b = 0; b < per_seq.size(); ++b) {
      if (per_seq[b].ok()) continue;
      if (seq_status == nullptr) return per_seq[b];
      seq_status[b] = per_seq[b].code();
    }
    return Status::Ok();
  }
  bool AnyFailed() const {
    for (const Status& s : per_seq) {
      if (!s.ok()) return true;
    }
    return false;
  }
};

// tile_seqs value of a flush entry that belongs to no sequence of the batch (a finished request).
constexpr int kNoSequence = -1;

}  // namespace

Status AttentionPlanFor(Context*, const Config&, const AttentionShape& shape,
                        const AttentionArgs& args, AttentionPlan* plan) {
  *plan = AttentionPlan{};  // splits follow the lengths of each call; no workspace
  plan->rows_total = static_cast<size_t>(shape.max_total_q) * args.num_q_heads;
  return Status::Ok();
}

Status PagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                      const int32_t* indptr, const int32_t* slots, size_t max_tokens,
                      kvarn_dtype_t dtype, const void* k, const void* v) {
  const int D = cfg.D, G = cfg.G, Hk = kv.num_kv_heads;
  const int64_t num_slots = static_cast<int64_t>(kv.num_pages) * G;
  const auto slot_of = [&](int64_t t) { return IndexAt(slots, launch.index64, t); };
  Faults faults(launch.seq_status, kv.batch);
  // Convert every token of the sequences that take part (rows staged: nothing is written yet).
  std::vector<uint16_t> kh(max_tokens * Hk * D), vh(max_tokens * Hk * D);
  std::vector<char> take(kv.batch, 0);
  for (int b = 0; b < kv.batch; ++b) {
    if (faults.Skipped(b)) continue;
    const int64_t begin = indptr[b], end = indptr[b + 1];
    if (begin < 0 || end < begin || end > static_cast<int64_t>(max_tokens)) {
      faults.Set(
          b, InvalidArgument("sequence " + std::to_string(b) + ": token_indptr [" +
                             std::to_string(begin) + ", " + std::to_string(end) +
                             ") is not a range inside max_tokens " + std::to_string(max_tokens)));
      continue;
    }
    for (int64_t t = begin; t < end; ++t) {
      const int64_t slot = slot_of(t);
      if (slot < -1 || slot >= num_slots) {
        faults.Set(
            b, InvalidArgument("sequence " + std::to_string(b) + ", token " + std::to_string(t) +
                               ": slot " + std::to_string(slot) + " is outside the page pool"));
        break;
      }
    }
    take[b] = !faults.Failed(b);
  }
  const Kernels& K = KernelsFor(ctx->isa);
  std::vector<Status> row_status(max_tokens);
  ctx->pool->ParallelFor(static_cast<size_t>(kv.batch), [&](size_t b) {
    if (!take[b]) return;
    std::vector<float> row(D), scratch(D);
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      if (slot_of(t) == -1) continue;
      for (int h = 0; h < Hk; ++h) {
        const size_t off = (static_cast<size_t>(t) * Hk + h) * D;  // staged rows are dense
        for (int which = 0; which < 2; ++which) {
          const int64_t stride = which ? launch.v_row_stride : launch.k_row_stride;
          LoadRow(dtype, which ? v : k, static_cast<size_t>(t * stride + int64_t{h} * D), D,
                  row.data());
          if (K.to_cache_frame(row.data(), D, which ? cfg.v_rotate : cfg.k_rotate, scratch.data(),
                               (which ? vh.data() : kh.data()) + off)) {
            continue;
          }
          bool finite = true;
          for (int d = 0; d < D; ++d) finite = finite && std::isfinite(row[d]);
          row_status[t] = {finite ? KVARN_ERR_OVERFLOW : KVARN_ERR_NON_FINITE,
                           "sequence " + std::to_string(b) + ": " + (which ? "v" : "k") +
                               " of token " + std::to_string(t) + ", head " + std::to_string(h) +
                               (finite ? " exceeds the fp16 range" : " holds a NaN or Inf")};
          return;
        }
      }
    }
  });
  for (int b = 0; b < kv.batch; ++b) {
    if (!take[b]) continue;
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      if (!row_status[t].ok()) {
        faults.Set(b, row_status[t]);
        take[b] = 0;
        break;
      }
    }
  }
  if (launch.seq_status == nullptr && faults.AnyFailed()) return faults.Finish();
  const size_t page_elems = static_cast<size_t>(Hk) * G * D;
  for (int b = 0; b < kv.batch; ++b) {
    if (!take[b]) continue;
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      const int64_t slot = slot_of(t);
      if (slot == -1) continue;
      const size_t page = static_cast<size_t>(slot / G), pos = static_cast<size_t>(slot % G);
      for (int h = 0; h < Hk; ++h) {
        const size_t dst = page * page_elems + (static_cast<size_t>(h) * G + pos) * D;
        const size_t src = (static_cast<size_t>(t) * Hk + h) * D;
        std::memcpy(kv.k_pages + dst, kh.data() + src, 2 * D);
        std::memcpy(kv.v_pages + dst, vh.data() + src, 2 * D);
      }
    }
  }
  return faults.Finish();
}

Status PagedFlushRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                     size_t max_tiles, const int32_t* n_tiles, const int32_t* src_pages,
                     const int32_t* dst_blocks, const int32_t* tile_seqs) {
  const int D = cfg.D, G = cfg.G, Hk = kv.num_kv_heads;
  const int32_t n = *n_tiles;
  if (n < 0 || static_cast<size_t>(n) > max_tiles) {
    return InvalidArgument("*n_tiles is " + std::to_string(n) + ", outside [0, max_tiles = " +
                           std::to_string(max_tiles) + "]; nothing was flushed");
  }
  const bool wide = launch.index64;
  if (launch.seq_status != nullptr) {
    for (int32_t i = 0; i < n; ++i) {
      const int64_t b = IndexAt(tile_seqs, wide, i);
      if (b < kNoSequence || b >= kv.batch) {
        return InvalidArgument("tile_seqs[" + std::to_string(i) + "] = " + std::to_string(b) +
                               " is neither a sequence of the batch (" + std::to_string(kv.batch) +
                               ") nor -1 (no sequence); nothing was flushed");
      }
    }
  }
  // The entry's sequence: its tile_seqs entry with a status array (-1: a finished request's
  // entry, owned by no sequence), else 0 (every fault fails the call).
  const auto seq_of = [&](int32_t i) {
    return launch.seq_status ? static_cast<int>(IndexAt(tile_seqs, wide, i)) : 0;
  };
  Faults faults(launch.seq_status, launch.seq_status ? kv.batch : 1);
  const auto live = [&](int b) { return b == kNoSequence || !faults.Skipped(b); };
  const size_t rb = cfg.record_bytes();
  const size_t page_elems = static_cast<size_t>(Hk) * G * D;
  uint8_t* staged = static_cast<uint8_t*>(launch.workspace);
  std::vector<Status> item_status(static_cast<size_t>(n) * Hk);
  const Kernels& K = KernelsFor(ctx->isa);
  ctx->pool->ParallelFor(static_cast<size_t>(n) * Hk, [&](size_t item) {
    const int32_t i = static_cast<int32_t>(item / Hk);
    const size_t h = item % Hk;
    if (!live(seq_of(i))) return;
    const int64_t page = IndexAt(src_pages, wide, i), block = IndexAt(dst_blocks, wide, i);
    if (page < 0 || page >= kv.num_pages || block < 0 || block >= kv.num_record_blocks) {
      item_status[item] =
          InvalidArgument("flush entry " + std::to_string(i) + ": page " + std::to_string(page) +
                          " or record block " + std::to_string(block) + " is outside its pool");
      return;
    }
    TileScratch s;
    const size_t off = static_cast<size_t>(page) * page_elems + h * G * D;
    Status r = QuantizeRecord(cfg, kv.k_pages + off, kv.v_pages + off, staged + item * rb, s, &K);
    if (!r.ok()) {
      item_status[item] = {r.code(), "flush entry " + std::to_string(i) + " (page " +
                                         std::to_string(page) + ", head " + std::to_string(h) +
                                         "): " + r.message()};
    }
  });
  for (size_t item = 0; item < item_status.size(); ++item) {
    if (item_status[item].ok()) continue;
    const int b = seq_of(static_cast<int32_t>(item / Hk));
    // A fault of an entry without a sequence cannot go to a status entry: it fails the call.
    if (b == kNoSequence) return item_status[item];
    faults.Set(b, item_status[item]);
  }
  if (launch.seq_status == nullptr && faults.AnyFailed()) return faults.Finish();
  for (size_t item = 0; item < static_cast<size_t>(n) * Hk; ++item) {
    const int32_t i = static_cast<int32_t>(item / Hk);
    const int b = seq_of(i);
    if (b != kNoSequence && (faults.Skipped(b) || faults.Failed(b))) continue;
    const size_t h = item % Hk;
    const size_t block = static_cast<size_t>(IndexAt(dst_blocks, wide, i));
    std::memcpy(kv.records + (block * Hk + h) * kv.record_stride, staged + item * rb, rb);
  }
  return faults.Finish();
}

Status PagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const AttentionShape& shape, const AttentionArgs& args,
                         const AttentionPlan&, const LaunchArgs& launch, const int32_t* q_indptr,
                         const void* q, void* out, float* lse) {
  AttentionArgs a = args;
  a.q_indptr = q_indptr;
  return AttendBatch(ctx, cfg, kv, a, shape.max_q_per_seq, shape.decode() ? -1 : shape.max_total_q,
                     launch.seq_status, q, out, lse);
}

}  // namespace cpu
}  // namespace kvarn
