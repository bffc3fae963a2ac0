// The capturable layer 2 (kvarn.h "plan / run") on the CPU: the same semantics as the GPU
// backends, run synchronously over host memory. Each call validates everything first, then
// writes only what belongs to sequences without a fault, so a faulty sequence stays as it was.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/dtype_io.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/record_codec.h"
#include "backends/cpu/tail_rows.h"
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

std::vector<std::string> IndptrFaults(const int32_t* indptr, int batch, int64_t limit,
                                      const char* name) {
  const int n = batch + 1;
  std::vector<char> bad(n, 0);
  int64_t before = INT64_MIN;  // the largest boundary left of j
  for (int j = 0; j < n; ++j) {
    const int64_t x = indptr[j];
    bad[j] = x < 0 || x > limit || (j == 0 && x != 0) || x < before;
    before = std::max(before, x);
  }
  int64_t after = INT64_MAX;  // the smallest boundary right of j
  for (int j = n - 1; j >= 0; --j) {
    const int64_t x = indptr[j];
    bad[j] = bad[j] || x > after;
    after = std::min(after, x);
  }
  std::vector<std::string> why(batch);
  for (int b = 0; b < batch; ++b) {
    if (!bad[b] && !bad[b + 1]) continue;
    why[b] = "sequence " + std::to_string(b) + ": " + name + " [" + std::to_string(indptr[b]) +
             ", " + std::to_string(indptr[b + 1]) + ") is not a range of its own in [0, " +
             std::to_string(limit) + "] (" + name + " must start at 0 and not decrease)";
  }
  return why;
}

Status AttentionPlanFor(Context*, const Config&, const AttentionShape& shape,
                        const AttentionArgs& args, AttentionPlan* plan) {
  *plan = AttentionPlan{};  // splits follow the lengths of each call; no workspace
  plan->kernel = "cpu";
  plan->rows_total = static_cast<size_t>(shape.max_total_q) * args.num_q_heads;
  return Status::Ok();
}

namespace {

// The input rows of a run-call append in the cache frame: fp16, dense [token][Hk][D].
struct StagedRows {
  std::vector<uint16_t> k, v;
  std::vector<char> take;  // sequence b passed its checks and every row converted
};

// Validates and converts the rows of every sequence: seq_check(b) -> Status, a data error of
// sequence b; wanted(b, t): the token is stored (false: padding, not converted). A sequence with
// a fault (its check, a non-finite or fp16-overflowing row, its token_indptr range) is recorded
// in `faults` and left out of rows->take.
template <typename SeqCheck, typename Wanted>
void StageRows(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
               const int32_t* indptr, size_t max_tokens, kvarn_dtype_t dtype, const void* k,
               const void* v, const SeqCheck& seq_check, const Wanted& wanted, Faults& faults,
               StagedRows* rows) {
  const int D = cfg.D, Hk = kv.num_kv_heads;
  rows->k.assign(max_tokens * Hk * D, 0);
  rows->v.assign(max_tokens * Hk * D, 0);
  rows->take.assign(kv.batch, 0);
  std::vector<char>& take = rows->take;
  const std::vector<std::string> ranges =
      IndptrFaults(indptr, kv.batch, static_cast<int64_t>(max_tokens), "token_indptr");
  for (int b = 0; b < kv.batch; ++b) {
    if (faults.Skipped(b)) continue;
    if (!ranges[b].empty()) {
      faults.Set(b, InvalidArgument(ranges[b]));
      continue;
    }
    Status st = seq_check(b);
    if (!st.ok()) {
      faults.Set(b, std::move(st));
      continue;
    }
    take[b] = 1;
  }
  const Kernels& K = KernelsFor(ctx->isa);
  std::vector<Status> row_status(max_tokens);
  ctx->pool->ParallelFor(static_cast<size_t>(kv.batch), [&](size_t b) {
    if (!take[b]) return;
    std::vector<float> row(D), scratch(D);
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      if (!wanted(static_cast<int>(b), t)) continue;
      for (int h = 0; h < Hk; ++h) {
        const size_t off = (static_cast<size_t>(t) * Hk + h) * D;  // staged rows are dense
        for (int which = 0; which < 2; ++which) {
          const int64_t stride = which ? launch.v_row_stride : launch.k_row_stride;
          LoadRow(dtype, which ? v : k, static_cast<size_t>(t * stride + int64_t{h} * D), D,
                  row.data());
          if (K.to_cache_frame(row.data(), D, which ? cfg.v_rotate : cfg.k_rotate, scratch.data(),
                               (which ? rows->v.data() : rows->k.data()) + off)) {
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
}

// The run-call append of both memory models. check(b, t) -> Status: the token's destination is
// valid (a data error of sequence b otherwise); dest(b, t, which) -> uint16_t*: the fp16 row of
// head 0 of token t of sequence b in K (which 0) or V (1), heads `head_stride` halves apart, or
// NULL to skip the token (padding). Every row is converted and staged first, so a faulty sequence
// writes nothing.
template <typename Check, typename Dest>
Status AppendRows(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                  const int32_t* indptr, size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                  const void* v, size_t head_stride, const Check& check, const Dest& dest) {
  const int D = cfg.D, Hk = kv.num_kv_heads;
  Faults faults(launch.seq_status, kv.batch);
  StagedRows rows;
  const auto seq_check = [&](int b) -> Status {
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) KVARN_RETURN_IF_ERROR(check(b, t));
    return Status::Ok();
  };
  const auto wanted = [&](int b, int64_t t) { return dest(b, t, 0) != nullptr; };
  StageRows(ctx, cfg, kv, launch, indptr, max_tokens, dtype, k, v, seq_check, wanted, faults,
            &rows);
  if (launch.seq_status == nullptr && faults.AnyFailed()) return faults.Finish();
  for (int b = 0; b < kv.batch; ++b) {
    if (!rows.take[b]) continue;
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      uint16_t* kd = dest(b, t, 0);
      if (kd == nullptr) continue;
      uint16_t* vd = dest(b, t, 1);
      for (int h = 0; h < Hk; ++h) {
        const size_t src = (static_cast<size_t>(t) * Hk + h) * D;
        std::memcpy(kd + h * head_stride, rows.k.data() + src, 2 * D);
        std::memcpy(vd + h * head_stride, rows.v.data() + src, 2 * D);
      }
    }
  }
  return faults.Finish();
}

// The blocks tiles [rt, end) of sequence b are flushed into: inside the table and the pool.
Status CheckFlushBlocks(const PagedKV& kv, int b, int64_t rt, int64_t end) {
  const std::string who = "sequence " + std::to_string(b) + ": ";
  if (end > kv.max_blocks_per_seq) {
    return InvalidArgument(who + std::to_string(end) + " tiles, more than max_blocks_per_seq");
  }
  for (int64_t tile = rt; tile < end; ++tile) {
    const int32_t id = kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + tile];
    if (id < 0 || id >= kv.num_record_blocks) {
      return InvalidArgument(who + "block_table entry " + std::to_string(tile) + " = " +
                             std::to_string(id) + " is outside the record pool");
    }
  }
  return Status::Ok();
}

}  // namespace

Status PagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                      const int32_t* indptr, const int32_t* slots, size_t max_tokens,
                      kvarn_dtype_t dtype, const void* k, const void* v) {
  const int D = cfg.D, G = cfg.G;
  const int64_t num_slots = static_cast<int64_t>(kv.num_pages) * G;
  const size_t page_elems = static_cast<size_t>(kv.num_kv_heads) * G * D;
  const auto slot_of = [&](int64_t t) { return IndexAt(slots, launch.index64, t); };
  const auto check = [&](int b, int64_t t) -> Status {
    const int64_t slot = slot_of(t);
    if (slot >= -1 && slot < num_slots) return Status::Ok();
    return InvalidArgument("sequence " + std::to_string(b) + ", token " + std::to_string(t) +
                           ": slot " + std::to_string(slot) + " is outside the page pool");
  };
  const auto dest = [&](int, int64_t t, int which) -> uint16_t* {
    const int64_t slot = slot_of(t);
    if (slot == -1) return nullptr;
    return (which ? kv.v_pages : kv.k_pages) + static_cast<size_t>(slot / G) * page_elems +
           static_cast<size_t>(slot % G) * D;
  };
  return AppendRows(ctx, cfg, kv, launch, indptr, max_tokens, dtype, k, v,
                    static_cast<size_t>(G) * D, check, dest);
}

Status PagedAppendTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const LaunchArgs& launch, const int32_t* indptr, size_t max_tokens,
                          kvarn_dtype_t dtype, const void* k, const void* v) {
  const int D = cfg.D, G = cfg.G;
  // Token t of sequence b is at position seq_lens[b] - (indptr[b + 1] - t) (lengths after the
  // append), row position - record_tiles[b] * G of its slot.
  const auto row_of = [&](int b, int64_t t) {
    return int64_t{kv.seq_lens[b]} - (indptr[b + 1] - t) - int64_t{kv.record_tiles[b]} * G;
  };
  const auto check = [&](int b, int64_t t) -> Status {
    const int64_t slot = kv.tail_slots[b], row = row_of(b, t);
    if (slot < 0 || slot >= kv.num_tail_slots) {
      return InvalidArgument("sequence " + std::to_string(b) + ": tail slot " +
                             std::to_string(slot) + " is outside the " +
                             std::to_string(kv.num_tail_slots) + " slots");
    }
    if (kv.record_tiles[b] < 0 || row < 0 || row >= kv.tail_cap) {
      return InvalidArgument("sequence " + std::to_string(b) + ", token " + std::to_string(t) +
                             ": tail row " + std::to_string(row) + " (seq_lens " +
                             std::to_string(kv.seq_lens[b]) + ", record_tiles " +
                             std::to_string(kv.record_tiles[b]) + ") is outside the slot's " +
                             std::to_string(kv.tail_cap) + " rows");
    }
    return Status::Ok();
  };
  Faults faults(launch.seq_status, kv.batch);
  StagedRows rows;
  const auto seq_check = [&](int b) -> Status {
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) KVARN_RETURN_IF_ERROR(check(b, t));
    return Status::Ok();
  };
  StageRows(
      ctx, cfg, kv, launch, indptr, max_tokens, dtype, k, v, seq_check,
      [](int, int64_t) { return true; }, faults, &rows);
  if (launch.seq_status == nullptr && faults.AnyFailed()) return faults.Finish();
  const TailRows tail(kv, D);
  const int Hk = kv.num_kv_heads;
  for (int b = 0; b < kv.batch; ++b) {
    if (!rows.take[b]) continue;
    for (int64_t t = indptr[b]; t < indptr[b + 1]; ++t) {
      for (int h = 0; h < Hk; ++h) {
        const size_t src = (static_cast<size_t>(t) * Hk + h) * D;
        tail.Write(kv.tail_slots[b], 0, h, row_of(b, t), rows.k.data() + src);
        tail.Write(kv.tail_slots[b], 1, h, row_of(b, t), rows.v.data() + src);
      }
    }
  }
  return faults.Finish();
}

Status PagedFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const LaunchArgs& launch, const int32_t* committed,
                         int32_t* record_tiles_out) {
  const int D = cfg.D, G = cfg.G, Hk = kv.num_kv_heads;
  const size_t rb = cfg.record_bytes();
  const int64_t per_seq = kv.tail_cap / G;  // the most tiles one sequence flushes (workspace)
  Faults faults(launch.seq_status, kv.batch);
  std::vector<int64_t> n_flush(kv.batch, 0);
  for (int b = 0; b < kv.batch; ++b) {
    if (faults.Skipped(b)) continue;
    const int64_t n = kv.seq_lens[b], rt = kv.record_tiles[b], c = committed[b];
    const std::string who = "sequence " + std::to_string(b) + ": ";
    Status st;
    if (n < 0 || rt < 0 || c < rt * G || c > n) {
      st = InvalidArgument(who + "committed " + std::to_string(c) +
                           " is outside [record_tiles * G = " + std::to_string(rt * G) +
                           ", seq_lens = " + std::to_string(n) + "]");
    } else if (n - rt * G > kv.tail_cap) {
      st = InvalidArgument(who + std::to_string(n - rt * G) + " tokens past the records, more " +
                           "than the tail slot's " + std::to_string(kv.tail_cap) + " rows");
    } else if (c / G > rt && (kv.tail_slots[b] < 0 || kv.tail_slots[b] >= kv.num_tail_slots)) {
      st = InvalidArgument(who + "tail slot " + std::to_string(kv.tail_slots[b]) +
                           " is outside the slots");
    } else {
      st = CheckFlushBlocks(kv, b, rt, c / G);
    }
    if (!st.ok()) {
      faults.Set(b, std::move(st));
      continue;
    }
    n_flush[b] = c / G - rt;
  }
  // Quantize into the workspace: sequence b's j-th tile, head h, at ((b * per_seq + j) * Hk + h).
  uint8_t* staged = static_cast<uint8_t*>(launch.workspace);
  const size_t items = static_cast<size_t>(kv.batch) * per_seq * Hk;
  std::vector<Status> item_status(items);
  const Kernels& K = KernelsFor(ctx->isa);
  ctx->pool->ParallelFor(items, [&](size_t item) {
    const int b = static_cast<int>(item / (per_seq * Hk));
    const int64_t j = static_cast<int64_t>(item / Hk) % per_seq;
    const int h = static_cast<int>(item % Hk);
    if (faults.Failed(b) || faults.Skipped(b) || j >= n_flush[b]) return;
    std::vector<uint16_t> kt(static_cast<size_t>(G) * D), vt(kt.size());
    const TailRows tail(kv, D);
    tail.Read(kv.tail_slots[b], 0, h, j * G, G, kt.data());
    tail.Read(kv.tail_slots[b], 1, h, j * G, G, vt.data());
    TileScratch scratch;
    Status r = QuantizeRecord(cfg, kt.data(), vt.data(), staged + item * rb, scratch, &K);
    if (!r.ok()) {
      item_status[item] = {r.code(), "sequence " + std::to_string(b) + ", tile " +
                                         std::to_string(kv.record_tiles[b] + j) + ", head " +
                                         std::to_string(h) + ": " + r.message()};
    }
  });
  for (size_t item = 0; item < items; ++item) {
    if (!item_status[item].ok())
      faults.Set(static_cast<int>(item / (per_seq * Hk)), item_status[item]);
  }
  if (launch.seq_status == nullptr && faults.AnyFailed()) return faults.Finish();
  for (int b = 0; b < kv.batch; ++b) {
    const int32_t rt = kv.record_tiles[b];
    if (faults.Skipped(b) || faults.Failed(b) || n_flush[b] == 0) {
      record_tiles_out[b] = rt;
      continue;
    }
    for (int64_t j = 0; j < n_flush[b]; ++j) {
      const size_t block = static_cast<size_t>(
          kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + rt + j]);
      for (int h = 0; h < Hk; ++h) {
        const size_t item = (static_cast<size_t>(b) * per_seq + j) * Hk + h;
        std::memcpy(kv.records + (block * Hk + h) * kv.record_stride, staged + item * rb, rb);
      }
    }
    // Move the rows past the flushed tiles to the slot's start.
    const int64_t shift = n_flush[b] * G;
    TailRows(kv, D).MoveDown(kv.tail_slots[b], shift, kv.seq_lens[b] - int64_t{rt} * G - shift);
    record_tiles_out[b] = static_cast<int32_t>(rt + n_flush[b]);
  }
  return faults.Finish();
}

Status PagedAppendFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                               const LaunchArgs& launch, const int32_t* indptr, size_t max_tokens,
                               kvarn_dtype_t dtype, const void* k, const void* v,
                               const int32_t* committed, int32_t* record_tiles_out) {
  const int D = cfg.D, G = cfg.G, Hk = kv.num_kv_heads;
  const size_t rb = cfg.record_bytes();
  const int64_t cap = kv.tail_cap;
  std::vector<int32_t> no_tokens;
  if (max_tokens == 0) {  // a flush: every sequence appends nothing
    no_tokens.assign(static_cast<size_t>(kv.batch) + 1, 0);
    indptr = no_tokens.data();
  }
  // Sequence b: n rows after the append, n_old before it, rt record tiles, c committed; rows at
  // positions [rt * G, n_old) are in its slot, [n_old, n) are input tokens indptr[b]...
  const auto appended = [&](int b) { return int64_t{indptr[b + 1]} - indptr[b]; };
  const auto seq_check = [&](int b) -> Status {
    const int64_t n = kv.seq_lens[b], rt = kv.record_tiles[b], c = committed[b];
    const int64_t n_old = n - appended(b);
    const std::string who = "sequence " + std::to_string(b) + ": ";
    if (rt < 0 || n_old < rt * G) {
      return InvalidArgument(who + "seq_lens " + std::to_string(n) + " less the " +
                             std::to_string(appended(b)) + " appended tokens is below " +
                             "record_tiles * G = " + std::to_string(rt * G));
    }
    if (n_old - rt * G > cap) {
      return InvalidArgument(who + std::to_string(n_old - rt * G) + " tokens in the slot " +
                             "before the append, more than its " + std::to_string(cap) + " rows");
    }
    if (c < rt * G || c > n) {
      return InvalidArgument(who + "committed " + std::to_string(c) +
                             " is outside [record_tiles * G = " + std::to_string(rt * G) +
                             ", seq_lens = " + std::to_string(n) + "]");
    }
    if (n - c / G * G > cap) {
      return InvalidArgument(who + std::to_string(n - c / G * G) + " tokens past the committed " +
                             "tiles, more than the tail slot's " + std::to_string(cap) + " rows");
    }
    if (n > rt * G && (kv.tail_slots[b] < 0 || kv.tail_slots[b] >= kv.num_tail_slots)) {
      return InvalidArgument(who + "tail slot " + std::to_string(kv.tail_slots[b]) +
                             " is outside the " + std::to_string(kv.num_tail_slots) + " slots");
    }
    return CheckFlushBlocks(kv, b, rt, c / G);
  };
  Faults faults(launch.seq_status, kv.batch);
  StagedRows rows;
  StageRows(
      ctx, cfg, kv, launch, indptr, max_tokens, dtype, k, v, seq_check,
      [](int, int64_t) { return true; }, faults, &rows);
  // Staged records: sequence b's j-th flushed tile, head h, at ((first[b] + j) * Hk + h).
  std::vector<int64_t> first(static_cast<size_t>(kv.batch) + 1, 0);
  for (int b = 0; b < kv.batch; ++b) {
    const int64_t n_flush = rows.take[b] ? committed[b] / G - kv.record_tiles[b] : 0;
    first[b + 1] = first[b] + n_flush;
  }
  uint8_t* staged = static_cast<uint8_t*>(launch.workspace);
  const size_t items = static_cast<size_t>(first[kv.batch]) * Hk;
  std::vector<Status> item_status(items);
  const TailRows tail(kv, D);
  // Position p of sequence b, head h, K (which 0) or V, as the slot holds it (an input row as
  // it would read back had the append stored it): into out.
  const auto row_at = [&](int b, int64_t p, int h, int which, uint16_t* out) {
    const int64_t n_old = kv.seq_lens[b] - appended(b), rt = kv.record_tiles[b];
    if (p < n_old) {
      tail.Read(kv.tail_slots[b], which, h, p - rt * G, 1, out);
      return;
    }
    const size_t t = static_cast<size_t>(indptr[b] + (p - n_old));
    tail.RoundTrip((which ? rows.v.data() : rows.k.data()) + (t * Hk + h) * D, out);
  };
  const Kernels& K = KernelsFor(ctx->isa);
  ctx->pool->ParallelFor(items, [&](size_t item) {
    const size_t tile_index = item / Hk;
    const int h = static_cast<int>(item % Hk);
    const int b = static_cast<int>(
        std::upper_bound(first.begin(), first.end(), static_cast<int64_t>(tile_index)) -
        first.begin() - 1);
    const int64_t tile = kv.record_tiles[b] + (static_cast<int64_t>(tile_index) - first[b]);
    std::vector<uint16_t> kt(static_cast<size_t>(G) * D), vt(static_cast<size_t>(G) * D);
    for (int r = 0; r < G; ++r) {
      row_at(b, tile * G + r, h, 0, kt.data() + static_cast<size_t>(r) * D);
      row_at(b, tile * G + r, h, 1, vt.data() + static_cast<size_t>(r) * D);
    }
    TileScratch scratch;
    Status r = QuantizeRecord(cfg, kt.data(), vt.data(), staged + item * rb, scratch, &K);
    if (!r.ok()) {
      item_status[item] = {r.code(), "sequence " + std::to_string(b) + ", tile " +
                                         std::to_string(tile) + ", head " + std::to_string(h) +
                                         ": " + r.message()};
    }
  });
  for (size_t item = 0; item < items; ++item) {
    if (item_status[item].ok()) continue;
    const int b = static_cast<int>(
        std::upper_bound(first.begin(), first.end(), static_cast<int64_t>(item / Hk)) -
        first.begin() - 1);
    faults.Set(b, item_status[item]);
  }
  if (launch.seq_status == nullptr && faults.AnyFailed()) return faults.Finish();
  for (int b = 0; b < kv.batch; ++b) {
    const int32_t rt = kv.record_tiles[b];
    if (!rows.take[b] || faults.Failed(b)) {
      record_tiles_out[b] = rt;
      continue;
    }
    const int64_t n = kv.seq_lens[b], n_old = n - appended(b), rt_new = committed[b] / G;
    for (int64_t j = 0; j < rt_new - rt; ++j) {
      const size_t block = static_cast<size_t>(
          kv.block_table[static_cast<size_t>(b) * kv.max_blocks_per_seq + rt + j]);
      for (int h = 0; h < Hk; ++h) {
        const size_t item = static_cast<size_t>(first[b] + j) * Hk + h;
        std::memcpy(kv.records + (block * Hk + h) * kv.record_stride, staged + item * rb, rb);
      }
    }
    // The slot keeps positions [rt_new * G, n): the old rows move down, the new rows follow.
    if (n > rt_new * G) {
      if (n_old > rt_new * G)
        tail.MoveDown(kv.tail_slots[b], (rt_new - rt) * G, n_old - rt_new * G);
      for (int64_t p = std::max(n_old, rt_new * G); p < n; ++p) {
        const size_t t = static_cast<size_t>(indptr[b] + (p - n_old));
        for (int h = 0; h < Hk; ++h) {
          tail.Write(kv.tail_slots[b], 0, h, p - rt_new * G, rows.k.data() + (t * Hk + h) * D);
          tail.Write(kv.tail_slots[b], 1, h, p - rt_new * G, rows.v.data() + (t * Hk + h) * D);
        }
      }
    }
    record_tiles_out[b] = static_cast<int32_t>(rt_new);
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
