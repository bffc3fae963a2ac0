// The selftest's checks for one (backend, preset, head_dim) row.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include "checks.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "device_buffer.h"
#include "reference.h"
#include "synthetic.h"

namespace kvarn_selftest {
namespace {

// GQA ratio 4, as in most current models (Llama 3 8B: 32/8).
constexpr int kNumKvHeads = 2;
constexpr int kNumQHeads = 8;
// Padding-byte sentinel: kvarn_quantize must leave the bytes between records untouched.
constexpr unsigned char kPaddingSentinel = 0xA5;
// Filling the page pools with 0x7E makes every unwritten fp16 slot a NaN (0x7E7E), so attention
// that reads a slot beyond a sequence's length, or a stale page, shows up as a non-finite result.
constexpr unsigned char kPageSentinel = 0x7E;

std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char buf[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  return buf;
}

// Collects the failures of one row; every kvarn_* status goes through Ok().
class Recorder {
 public:
  explicit Recorder(RowResult* row) : row_(row) {}

  bool Ok(kvarn_status_t status, const char* call) {
    if (status == KVARN_OK) return true;
    // kvarn_last_error() is only valid until the next kvarn_* call (kvarn_status_string is one).
    const std::string detail = kvarn_last_error();
    std::string message = std::string(call) + " failed: " + kvarn_status_string(status);
    if (!detail.empty()) message += " (" + detail + ")";
    row_->failures.push_back(message);
    return false;
  }
  bool Memory(bool ok, const std::string& error) {
    if (!ok) row_->failures.push_back("memory: " + error);
    return ok;
  }
  void Fail(const std::string& why) { row_->failures.push_back(why); }

 private:
  RowResult* row_;
};

template <typename T>
bool UploadVector(const std::vector<T>& host, kvarn_context_t* context, DeviceBuffer* buffer,
                  std::string* error) {
  return buffer->Allocate(context, host.size() * sizeof(T), error) &&
         buffer->Upload(host.data(), host.size() * sizeof(T), error);
}

template <typename T>
bool DownloadVector(const DeviceBuffer& buffer, size_t count, std::vector<T>* host,
                    std::string* error) {
  host->resize(count);
  return buffer.Download(host->data(), count * sizeof(T), error);
}

size_t RoundUp(size_t x, size_t multiple) { return (x + multiple - 1) / multiple * multiple; }

uint64_t RowSeed(uint64_t seed, int head_dim, int tile_tokens, uint64_t salt) {
  SplitMix64 mixer(seed ^ (static_cast<uint64_t>(head_dim) << 32) ^
                   (static_cast<uint64_t>(tile_tokens) << 16) ^ (salt * 0x9E3779B97F4A7C15ull));
  return mixer.Next();
}

// Calls fn (which returns false on failure) until at least min_seconds passed and min_calls calls
// ran; returns seconds per call, NaN if a call failed. A warm-up call runs first, untimed, so
// one-time costs (thread pool start, lazy tables) do not count.
template <typename Fn>
double SecondsPerCall(Fn fn, double min_seconds, int min_calls) {
  using Clock = std::chrono::steady_clock;
  if (!fn()) return kNotMeasured;
  int calls = 0;
  const Clock::time_point start = Clock::now();
  double elapsed = 0.0;
  while (calls < min_calls || elapsed < min_seconds) {
    if (!fn()) return kNotMeasured;
    ++calls;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (calls >= 100000) break;
  }
  return elapsed / calls;
}

// ---- a: config and record format -----------------------------------------------------------

bool ParsePresetName(const std::string& name, int* key_bits, int* value_bits, int* tile_tokens) {
  int consumed = 0;
  if (std::sscanf(name.c_str(), "k%dv%d_g%d%n", key_bits, value_bits, tile_tokens, &consumed) !=
      3) {
    return false;
  }
  return static_cast<size_t>(consumed) == name.size();
}

bool CheckConfig(const kvarn_config_t& config, const std::string& preset, int head_dim,
                 Recorder* rec) {
  int key_bits = 0, value_bits = 0, tile_tokens = 0;
  if (!ParsePresetName(preset, &key_bits, &value_bits, &tile_tokens)) {
    rec->Fail("preset name '" + preset + "' is not of the form k<b>v<b>_g<G>");
    return false;
  }
  if (config.head_dim != head_dim || config.key_bits != key_bits ||
      config.value_bits != value_bits || config.tile_tokens != tile_tokens) {
    rec->Fail(Format("kvarn_config_from_preset(%s, %d) gave D%d G%d k%dv%d", preset.c_str(),
                     head_dim, config.head_dim, config.tile_tokens, config.key_bits,
                     config.value_bits));
    return false;
  }
  return rec->Ok(kvarn_config_validate(&config), "kvarn_config_validate");
}

void CheckFormat(const kvarn_config_t& config, RowResult* row, Recorder* rec) {
  const size_t d = static_cast<size_t>(config.head_dim);
  const size_t g = static_cast<size_t>(config.tile_tokens);
  const size_t bk = static_cast<size_t>(config.key_bits);
  const size_t bv = static_cast<size_t>(config.value_bits);
  // docs/FORMAT.md section 7, field by field in storage order.
  const size_t expected_field[KVARN_FIELD_COUNT] = {d * g * bk / 8, 2 * d, 2 * d, 2 * g,
                                                    g * d * bv / 8, 2 * d, 2 * g, 2 * g};
  const size_t expected_total = d * g * (bk + bv) / 8 + 6 * d + 6 * g;
  size_t bytes = 0;
  if (!rec->Ok(kvarn_record_bytes(&config, &bytes), "kvarn_record_bytes")) return;
  row->record_bytes = bytes;
  bool ok = true;
  if (bytes != expected_total) {
    rec->Fail(Format("kvarn_record_bytes = %zu, docs/FORMAT.md section 7 gives %zu", bytes,
                     expected_total));
    ok = false;
  }
  size_t next = 0;
  for (int f = 0; f < KVARN_FIELD_COUNT; ++f) {
    size_t offset = 0, length = 0;
    if (!rec->Ok(
            kvarn_record_field(&config, static_cast<kvarn_record_field_t>(f), &offset, &length),
            "kvarn_record_field")) {
      return;
    }
    if (offset != next || length != expected_field[f]) {
      rec->Fail(Format("record field %d: offset %zu, %zu bytes; expected offset %zu, %zu bytes", f,
                       offset, length, next, expected_field[f]));
      ok = false;
    }
    next += expected_field[f];
  }
  if (next != bytes) {
    rec->Fail(
        Format("record fields add up to %zu bytes, kvarn_record_bytes says %zu", next, bytes));
    ok = false;
  }
  row->format_ok = ok;
}

// ---- b: round trip against per-token RTN ---------------------------------------------------

// Host copies of the round trip's records, reused to fill the throughput cache.
struct CodecRecords {
  std::vector<unsigned char> bytes;  // n_tiles * stride
  size_t stride = 0;
  int n_tiles = 0;
};

void CheckRoundTrip(const BackendTarget& target, const kvarn_config_t& config,
                    const SweepOptions& options, RowResult* row, Recorder* rec,
                    CodecRecords* codec) {
  const int d = config.head_dim, g = config.tile_tokens;
  const int n_tiles = options.quick ? 4 : 8;
  const size_t tile_values = static_cast<size_t>(g) * d;
  const size_t values = n_tiles * tile_values;
  // One KV head: [tokens][1][D] is exactly the codec's [n_tiles][G][D].
  const KvSequence data = GenerateKv(n_tiles * g, 1, d, RowSeed(options.seed, d, g, 1));
  const size_t record_bytes = row->record_bytes;
  const size_t stride = RoundUp(record_bytes, 16) + 16;  // always some padding to check
  std::string error;
  DeviceBuffer k_in, v_in, records, records_again, k_out, v_out;
  if (!rec->Memory(UploadVector(data.k, target.context, &k_in, &error) &&
                       UploadVector(data.v, target.context, &v_in, &error) &&
                       records.Allocate(target.context, n_tiles * stride, &error) &&
                       records.Fill(kPaddingSentinel, &error) &&
                       records_again.Allocate(target.context, n_tiles * stride, &error) &&
                       records_again.Fill(kPaddingSentinel, &error) &&
                       k_out.Allocate(target.context, values * sizeof(float), &error) &&
                       v_out.Allocate(target.context, values * sizeof(float), &error),
                   error)) {
    return;
  }
  if (!rec->Ok(kvarn_quantize(target.context, &config, n_tiles, KVARN_DTYPE_F32, k_in.data(),
                              v_in.data(), KVARN_CODEC_DEFAULT, records.data(), stride),
               "kvarn_quantize")) {
    return;
  }
  if (!rec->Ok(kvarn_quantize(target.context, &config, n_tiles, KVARN_DTYPE_F32, k_in.data(),
                              v_in.data(), KVARN_CODEC_DEFAULT, records_again.data(), stride),
               "kvarn_quantize")) {
    return;
  }
  std::vector<unsigned char> host_records, host_again;
  if (!rec->Memory(DownloadVector(records, n_tiles * stride, &host_records, &error) &&
                       DownloadVector(records_again, n_tiles * stride, &host_again, &error),
                   error)) {
    return;
  }
  row->padding_untouched = true;
  for (int t = 0; t < n_tiles; ++t) {
    for (size_t i = record_bytes; i < stride; ++i) {
      if (host_records[t * stride + i] != kPaddingSentinel) row->padding_untouched = false;
    }
  }
  if (!row->padding_untouched) {
    rec->Fail(
        Format("kvarn_quantize wrote into the padding between records (record %zu B, "
               "stride %zu B)",
               record_bytes, stride));
  }
  row->deterministic = host_records == host_again;
  if (!row->deterministic) rec->Fail("kvarn_quantize gave different bytes for the same input");

  if (!rec->Ok(kvarn_dequantize(target.context, &config, n_tiles, records.data(), stride,
                                KVARN_CODEC_DEFAULT, KVARN_DTYPE_F32, k_out.data(), v_out.data()),
               "kvarn_dequantize")) {
    return;
  }
  std::vector<float> k_rec, v_rec;
  if (!rec->Memory(DownloadVector(k_out, values, &k_rec, &error) &&
                       DownloadVector(v_out, values, &v_rec, &error),
                   error)) {
    return;
  }
  ErrorSums k_kvarn, v_kvarn, k_rtn, v_rtn;
  AccumulateError(data.k.data(), k_rec.data(), values, &k_kvarn);
  AccumulateError(data.v.data(), v_rec.data(), values, &v_kvarn);
  PerTokenRtnError(data.k.data(), static_cast<size_t>(n_tiles) * g, d, config.key_bits, &k_rtn);
  PerTokenRtnError(data.v.data(), static_cast<size_t>(n_tiles) * g, d, config.value_bits, &v_rtn);
  row->k_rel_mse = k_kvarn.Relative();
  row->v_rel_mse = v_kvarn.Relative();
  row->k_rel_mse_rtn = k_rtn.Relative();
  row->v_rel_mse_rtn = v_rtn.Relative();

  // K: the point of KVarN is that rotation + normalization beat per-token scales on keys with
  // outlier channels, at every bit width; so it must be at least as good as per-token RTN.
  // V: per-token RTN is already the right axis for values, so KVarN only has to be sane there
  // (finite, and far better than storing nothing, which has relative MSE 1).
  bool ok = row->padding_untouched && row->deterministic;
  if (!(std::isfinite(row->k_rel_mse) && row->k_rel_mse <= row->k_rel_mse_rtn)) {
    rec->Fail(Format("K relative MSE %.3e is not <= per-token RTN's %.3e", row->k_rel_mse,
                     row->k_rel_mse_rtn));
    ok = false;
  }
  if (!(std::isfinite(row->v_rel_mse) && row->v_rel_mse < 1.0)) {
    rec->Fail(Format("V relative MSE %.3e is not finite and < 1", row->v_rel_mse));
    ok = false;
  }
  row->roundtrip_ok = ok;

  codec->bytes = std::move(host_records);
  codec->stride = stride;
  codec->n_tiles = n_tiles;

  // d (part 1): quantize throughput on the same batch.
  const double seconds = SecondsPerCall(
      [&]() {
        std::string sync_error;
        return rec->Ok(
                   kvarn_quantize(target.context, &config, n_tiles, KVARN_DTYPE_F32, k_in.data(),
                                  v_in.data(), KVARN_CODEC_DEFAULT, records_again.data(), stride),
                   "kvarn_quantize") &&
               rec->Memory(Synchronize(target.context, &sync_error), sync_error);
      },
      options.quick ? 0.02 : 0.05, 2);
  if (std::isfinite(seconds) && seconds > 0.0) row->quantize_records_per_s = n_tiles / seconds;
  row->notes.push_back(
      Format("round trip: %d tiles of %d tokens, record stride %zu B; quantize "
             "%.3f ms per batch",
             n_tiles, g, stride, seconds * 1e3));
}

// ---- c: paged attention against float64 -----------------------------------------------------

// Where each tile of each sequence lives in a paged cache.
struct PagedLayout {
  int batch = 0;
  int max_blocks = 0;
  int num_pages = 0;
  int num_blocks = 0;
  std::vector<int> seq_lens;
  std::vector<int> record_tiles;
  std::vector<int32_t> page_of;   // [batch][max_blocks]: page of each fp16 tile, -1 if none
  std::vector<int32_t> block_of;  // [batch][max_blocks]: record block of each record tile, or -1

  // The block table the engine passes: record blocks for record tiles once flushed, pages for
  // the others, -1 in unused slots (a correct library never reads them).
  std::vector<int32_t> BlockTable(bool flushed) const {
    std::vector<int32_t> table(page_of);
    if (flushed) {
      for (size_t i = 0; i < table.size(); ++i) {
        if (block_of[i] >= 0) table[i] = block_of[i];
      }
    }
    return table;
  }
};

// Pages and record blocks are handed out in a shuffled order, so a library that assumed tile i
// lives in page i would read the wrong data.
PagedLayout MakeLayout(const std::vector<int>& seq_lens, const std::vector<int>& record_tiles,
                       int tile_tokens, int sink_tiles, uint64_t seed) {
  PagedLayout layout;
  layout.batch = static_cast<int>(seq_lens.size());
  layout.seq_lens = seq_lens;
  layout.record_tiles = record_tiles;
  int total_tiles = 0;
  for (int b = 0; b < layout.batch; ++b) {
    const int tiles = (seq_lens[b] + tile_tokens - 1) / tile_tokens;
    layout.max_blocks = std::max(layout.max_blocks, tiles + 1);
    total_tiles += tiles;
    layout.num_blocks += record_tiles[b];
  }
  layout.num_pages = total_tiles + 1;  // one page nobody uses
  SplitMix64 rng(seed);
  auto shuffled = [&rng](int n) {
    std::vector<int32_t> ids(n);
    for (int i = 0; i < n; ++i) ids[i] = i;
    for (int i = n - 1; i > 0; --i) std::swap(ids[i], ids[rng.UniformInt(i + 1)]);
    return ids;
  };
  const std::vector<int32_t> pages = shuffled(layout.num_pages);
  const std::vector<int32_t> blocks = shuffled(layout.num_blocks);
  layout.page_of.assign(static_cast<size_t>(layout.batch) * layout.max_blocks, -1);
  layout.block_of.assign(layout.page_of.size(), -1);
  int next_page = 0, next_block = 0;
  for (int b = 0; b < layout.batch; ++b) {
    const int tiles = (seq_lens[b] + tile_tokens - 1) / tile_tokens;
    for (int i = 0; i < tiles; ++i) {
      layout.page_of[b * layout.max_blocks + i] = pages[next_page++];
      if (i >= sink_tiles && i < sink_tiles + record_tiles[b]) {
        layout.block_of[b * layout.max_blocks + i] = blocks[next_block++];
      }
    }
  }
  return layout;
}

// The engine-side memory of a paged cache and the kvarn_paged_kv_t describing it.
struct PagedMemory {
  DeviceBuffer records, k_pages, v_pages, block_table, seq_lens, record_tiles;
  kvarn_paged_kv_t kv;
};

bool AllocatePaged(const BackendTarget& target, const kvarn_config_t& config,
                   const PagedLayout& layout, size_t record_stride, PagedMemory* mem,
                   std::string* error) {
  const size_t page_halves =
      static_cast<size_t>(kNumKvHeads) * config.tile_tokens * config.head_dim;
  if (!mem->records.Allocate(target.context,
                             std::max(1, layout.num_blocks) * kNumKvHeads * record_stride, error) ||
      !mem->k_pages.Allocate(target.context, layout.num_pages * page_halves * 2, error) ||
      !mem->v_pages.Allocate(target.context, layout.num_pages * page_halves * 2, error) ||
      !mem->k_pages.Fill(kPageSentinel, error) || !mem->v_pages.Fill(kPageSentinel, error) ||
      !mem->records.Fill(0, error) ||
      !mem->block_table.Allocate(target.context, layout.page_of.size() * sizeof(int32_t), error) ||
      !mem->seq_lens.Allocate(target.context, layout.batch * sizeof(int32_t), error) ||
      !mem->record_tiles.Allocate(target.context, layout.batch * sizeof(int32_t), error)) {
    return false;
  }
  kvarn_paged_kv_defaults(&mem->kv);
  mem->kv.num_kv_heads = kNumKvHeads;
  mem->kv.batch = layout.batch;
  mem->kv.records = mem->records.data();
  mem->kv.record_stride = record_stride;
  mem->kv.num_record_blocks = layout.num_blocks;
  mem->kv.k_pages = mem->k_pages.data();
  mem->kv.v_pages = mem->v_pages.data();
  mem->kv.num_pages = layout.num_pages;
  mem->kv.block_table = mem->block_table.as<const int32_t>();
  mem->kv.max_blocks_per_seq = layout.max_blocks;
  mem->kv.seq_lens = mem->seq_lens.as<const int32_t>();
  mem->kv.record_tiles = mem->record_tiles.as<const int32_t>();
  return true;
}

// Uploads the engine's view (block table, lengths, record tiles) before a call.
bool UploadPagedState(const std::vector<int32_t>& table, const std::vector<int32_t>& seq_lens,
                      const std::vector<int32_t>& record_tiles, PagedMemory* mem,
                      std::string* error) {
  return mem->block_table.Upload(table.data(), table.size() * sizeof(int32_t), error) &&
         mem->seq_lens.Upload(seq_lens.data(), seq_lens.size() * sizeof(int32_t), error) &&
         mem->record_tiles.Upload(record_tiles.data(), record_tiles.size() * sizeof(int32_t),
                                  error);
}

// Statistics of the float64 attention, to show the data gives neither uniform nor one-hot
// softmax (a check that passes on degenerate attention would prove little).
struct AttentionStats {
  double sink_mass = 0.0;
  double max_weight = 0.0;
  int count = 0;
};

// One attention call's configuration.
struct AttentionRun {
  const char* name;
  std::vector<int> q_counts;  // per sequence; empty = decode
  int num_splits;
  float scale;  // 0 = 1/sqrt(D)
  // Model variants (docs/FORMAT.md section 9.1): window W, softcap, learned sink logits.
  int window = 0;
  float softcap = 0.0f;
  bool sinks = false;
  bool variant() const { return window > 0 || softcap > 0.0f || sinks; }
};

void CheckAttention(const BackendTarget& target, const kvarn_config_t& config,
                    const SweepOptions& options, RowResult* row, Recorder* rec) {
  const int d = config.head_dim, g = config.tile_tokens, sink = config.sink_tiles;
  const int group = kNumQHeads / kNumKvHeads;
  // A ragged batch: a sequence with a partial tail tile, one whose tail tile is complete but not
  // flushed yet, and a one-token sequence (no records at all).
  const int r0 = options.quick ? 2 : 4, r1 = 1, tail0 = 5;
  const std::vector<int> seq_lens = {g * (sink + r0) + tail0, g * (sink + r1) + g, 1};
  const std::vector<int> record_tiles = {r0, r1, 0};
  const PagedLayout layout =
      MakeLayout(seq_lens, record_tiles, g, sink, RowSeed(options.seed, d, g, 2));
  const int batch = layout.batch;
  std::vector<KvSequence> seqs;
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(GenerateKv(seq_lens[b], kNumKvHeads, d, RowSeed(options.seed, d, g, 10 + b)));
  }
  const size_t record_stride = RoundUp(row->record_bytes, 64);
  std::string error;
  PagedMemory mem;
  if (!rec->Memory(AllocatePaged(target, config, layout, record_stride, &mem, &error), error)) {
    return;
  }
  const size_t token_values = static_cast<size_t>(kNumKvHeads) * d;

  // Append in three rounds of different sizes (1 token, a tile and a bit, the rest), so tokens
  // land at every offset inside a tile and calls cross tile boundaries.
  std::vector<int32_t> lens_now(batch, 0);
  const std::vector<int32_t> no_records(batch, 0);
  const std::vector<int32_t> table_pages = layout.BlockTable(false);
  for (int chunk : {1, g + 3, 1 << 30}) {
    std::vector<int32_t> indptr(batch + 1, 0);
    std::vector<float> k, v;
    for (int b = 0; b < batch; ++b) {
      const int n = std::min(chunk, seq_lens[b] - lens_now[b]);
      indptr[b + 1] = indptr[b] + n;
      const float* ks = seqs[b].KeyAt(lens_now[b], 0);
      const float* vs = seqs[b].ValueAt(lens_now[b], 0);
      k.insert(k.end(), ks, ks + n * token_values);
      v.insert(v.end(), vs, vs + n * token_values);
    }
    if (indptr[batch] == 0) continue;
    DeviceBuffer k_in, v_in;
    if (!rec->Memory(UploadPagedState(table_pages, lens_now, no_records, &mem, &error) &&
                         UploadVector(k, target.context, &k_in, &error) &&
                         UploadVector(v, target.context, &v_in, &error),
                     error)) {
      return;
    }
    if (!rec->Ok(kvarn_paged_append(target.context, &config, &mem.kv, indptr.data(),
                                    KVARN_DTYPE_F32, k_in.data(), v_in.data()),
                 "kvarn_paged_append")) {
      return;
    }
    for (int b = 0; b < batch; ++b) lens_now[b] += indptr[b + 1] - indptr[b];
  }

  // Flush the complete non-sink tiles that the layout keeps as records.
  std::vector<int32_t> src_pages, dst_blocks;
  for (int b = 0; b < batch; ++b) {
    for (int i = sink; i < sink + record_tiles[b]; ++i) {
      src_pages.push_back(layout.page_of[b * layout.max_blocks + i]);
      dst_blocks.push_back(layout.block_of[b * layout.max_blocks + i]);
    }
  }
  if (!src_pages.empty() &&
      !rec->Ok(kvarn_paged_flush(target.context, &config, &mem.kv, src_pages.size(),
                                 src_pages.data(), dst_blocks.data()),
               "kvarn_paged_flush")) {
    return;
  }
  const std::vector<int32_t> final_lens(seq_lens.begin(), seq_lens.end());
  const std::vector<int32_t> final_records(record_tiles.begin(), record_tiles.end());
  if (!rec->Memory(
          UploadPagedState(layout.BlockTable(true), final_lens, final_records, &mem, &error),
          error)) {
    return;
  }

  // What the cache holds, rebuilt independently: records dequantized in the cache frame, and for
  // fp16 tiles the appended vectors rotated and rounded to fp16 by kvarn_rotate (the same
  // operation the cache documents). The float64 reference then runs in the rotated frame and
  // un-rotates its output with its own float64 Hadamard, so no fp32 rounding enters it.
  const size_t tile_values = static_cast<size_t>(g) * d;
  const size_t pool_tiles = static_cast<size_t>(layout.num_blocks) * kNumKvHeads;
  std::vector<float> pool_k, pool_v;
  std::vector<unsigned char> pool_bytes;
  if (pool_tiles > 0) {
    DeviceBuffer k_out, v_out;
    if (!rec->Memory(k_out.Allocate(target.context, pool_tiles * tile_values * 4, &error) &&
                         v_out.Allocate(target.context, pool_tiles * tile_values * 4, &error),
                     error)) {
      return;
    }
    if (!rec->Ok(
            kvarn_dequantize(target.context, &config, pool_tiles, mem.records.data(), record_stride,
                             KVARN_CODEC_CACHE_FRAME, KVARN_DTYPE_F32, k_out.data(), v_out.data()),
            "kvarn_dequantize")) {
      return;
    }
    if (!rec->Memory(
            DownloadVector(k_out, pool_tiles * tile_values, &pool_k, &error) &&
                DownloadVector(v_out, pool_tiles * tile_values, &pool_v, &error) &&
                DownloadVector(mem.records, pool_tiles * record_stride, &pool_bytes, &error),
            error)) {
      return;
    }
  }
  // keys[b][h] / values[b][h]: [N_b][D] in the rotated frame.
  std::vector<std::vector<std::vector<double>>> keys(batch), vals(batch);
  for (int b = 0; b < batch; ++b) {
    const size_t n = static_cast<size_t>(seq_lens[b]);
    DeviceBuffer k_in, v_in, k_rot, v_rot;
    std::vector<uint16_t> k_half, v_half;
    if (!rec->Memory(UploadVector(seqs[b].k, target.context, &k_in, &error) &&
                         UploadVector(seqs[b].v, target.context, &v_in, &error) &&
                         k_rot.Allocate(target.context, n * token_values * 2, &error) &&
                         v_rot.Allocate(target.context, n * token_values * 2, &error),
                     error)) {
      return;
    }
    if (!rec->Ok(kvarn_rotate(target.context, d, n * kNumKvHeads, KVARN_DTYPE_F32, k_in.data(),
                              KVARN_DTYPE_F16, k_rot.data()),
                 "kvarn_rotate") ||
        !rec->Ok(kvarn_rotate(target.context, d, n * kNumKvHeads, KVARN_DTYPE_F32, v_in.data(),
                              KVARN_DTYPE_F16, v_rot.data()),
                 "kvarn_rotate")) {
      return;
    }
    if (!rec->Memory(DownloadVector(k_rot, n * token_values, &k_half, &error) &&
                         DownloadVector(v_rot, n * token_values, &v_half, &error),
                     error)) {
      return;
    }
    keys[b].assign(kNumKvHeads, std::vector<double>(n * d));
    vals[b].assign(kNumKvHeads, std::vector<double>(n * d));
    for (int h = 0; h < kNumKvHeads; ++h) {
      for (size_t t = 0; t < n; ++t) {
        const int tile = static_cast<int>(t / g);
        const int block = layout.block_of[b * layout.max_blocks + tile];
        for (int c = 0; c < d; ++c) {
          double kx, vx;
          if (block >= 0) {
            const size_t at =
                (static_cast<size_t>(block) * kNumKvHeads + h) * tile_values + (t % g) * d + c;
            kx = pool_k[at];
            vx = pool_v[at];
          } else {
            const size_t at = (t * kNumKvHeads + h) * d + c;
            kx = HalfToDouble(k_half[at]);
            vx = HalfToDouble(v_half[at]);
          }
          keys[b][h][t * d + c] = kx;
          vals[b][h][t * d + c] = vx;
        }
      }
    }
  }

  // kvarn_paged_flush must give the bytes kvarn_quantize gives for the same tiles
  // (docs/FORMAT.md section 3: the record does not depend on how the tile was filled).
  if (pool_tiles > 0) {
    std::vector<float> tiles_k(pool_tiles * tile_values), tiles_v(pool_tiles * tile_values);
    for (int b = 0; b < batch; ++b) {
      for (int i = sink; i < sink + record_tiles[b]; ++i) {
        const int block = layout.block_of[b * layout.max_blocks + i];
        for (int h = 0; h < kNumKvHeads; ++h) {
          float* kt = tiles_k.data() + (static_cast<size_t>(block) * kNumKvHeads + h) * tile_values;
          float* vt = tiles_v.data() + (static_cast<size_t>(block) * kNumKvHeads + h) * tile_values;
          for (int t = 0; t < g; ++t) {
            std::memcpy(kt + t * d, seqs[b].KeyAt(i * g + t, h), d * sizeof(float));
            std::memcpy(vt + t * d, seqs[b].ValueAt(i * g + t, h), d * sizeof(float));
          }
        }
      }
    }
    DeviceBuffer k_in, v_in, direct;
    std::vector<unsigned char> direct_bytes;
    if (!rec->Memory(UploadVector(tiles_k, target.context, &k_in, &error) &&
                         UploadVector(tiles_v, target.context, &v_in, &error) &&
                         direct.Allocate(target.context, pool_tiles * record_stride, &error),
                     error)) {
      return;
    }
    if (!rec->Ok(kvarn_quantize(target.context, &config, pool_tiles, KVARN_DTYPE_F32, k_in.data(),
                                v_in.data(), KVARN_CODEC_DEFAULT, direct.data(), record_stride),
                 "kvarn_quantize")) {
      return;
    }
    if (!rec->Memory(DownloadVector(direct, pool_tiles * record_stride, &direct_bytes, &error),
                     error)) {
      return;
    }
    size_t differing_records = 0;
    for (size_t r = 0; r < pool_tiles; ++r) {
      if (std::memcmp(direct_bytes.data() + r * record_stride,
                      pool_bytes.data() + r * record_stride, row->record_bytes) != 0) {
        ++differing_records;
      }
    }
    row->flush_matches_quantize = differing_records == 0;
    if (differing_records != 0) {
      rec->Fail(Format("kvarn_paged_flush and kvarn_quantize differ on %zu of %zu records",
                       differing_records, pool_tiles));
    }
  } else {
    row->flush_matches_quantize = true;
  }

  const std::vector<AttentionRun> runs = {
      {"decode", {}, 0, 0.0f},
      {"decode, 3 splits", {}, 3, 0.0f},
      // Query counts: seq 0 reaches back past its 5-token tail into its last record tile.
      {"extend", {tail0 + 4, 3, 1}, 0, 0.7f / std::sqrt(static_cast<float>(d))},
      // gpt-oss / Gemma 2 style: sinks, a window reaching back into the records, a softcap.
      {"extend, sinks + window 70 + softcap 30", {tail0 + 4, 3, 1}, 2, 0.0f, 70, 30.0f, true},
  };
  std::vector<float> sink_logits(kNumQHeads);
  for (int h = 0; h < kNumQHeads; ++h) sink_logits[h] = 0.5f + 0.25f * static_cast<float>(h);
  double worst_l2 = 0.0, worst_lse = 0.0;
  bool kernel_noted = false;
  AttentionStats stats;
  bool ok = true;
  for (const AttentionRun& run : runs) {
    std::vector<int32_t> q_indptr(batch + 1, 0);
    std::vector<float> q;
    std::vector<int> q_seq, q_pos;  // sequence and position of each query token
    for (int b = 0; b < batch; ++b) {
      const int n = run.q_counts.empty() ? 1 : run.q_counts[b];
      q_indptr[b + 1] = q_indptr[b] + n;
      std::vector<int> positions;
      for (int i = 0; i < n; ++i) positions.push_back(seq_lens[b] - n + i);
      const std::vector<float> qb =
          GenerateQueries(seqs[b], positions, kNumQHeads, RowSeed(options.seed, d, g, 10 + b));
      q.insert(q.end(), qb.begin(), qb.end());
      for (int p : positions) {
        q_seq.push_back(b);
        q_pos.push_back(p);
      }
    }
    const size_t total_q = q_seq.size();
    kvarn_attention_params_t params;
    kvarn_attention_params_defaults(&params);
    params.num_q_heads = kNumQHeads;
    params.scale = run.scale;
    params.q_indptr = run.q_counts.empty() ? nullptr : q_indptr.data();
    params.q_dtype = KVARN_DTYPE_F32;
    params.out_dtype = KVARN_DTYPE_F32;
    params.num_splits = run.num_splits;
    DeviceBuffer sinks;
    if (run.variant()) {
      if (run.sinks) {
        if (!rec->Memory(UploadVector(sink_logits, target.context, &sinks, &error), error)) return;
        params.sinks = sinks.as<float>();
      }
      params.sliding_window = run.window;
      params.logit_softcap = run.softcap;
    }
    size_t workspace_bytes = 0;
    const kvarn_status_t ws_status = kvarn_paged_attention_workspace_size(
        target.context, &config, &mem.kv, &params, total_q, &workspace_bytes);
    if (run.variant() && ws_status == KVARN_ERR_UNSUPPORTED) {
      row->notes.push_back(
          Format("attention (%s): not run, this backend refuses the variants "
                 "(KVARN_ERR_UNSUPPORTED)",
                 run.name));
      continue;
    }
    if (!rec->Ok(ws_status, "kvarn_paged_attention_workspace_size")) return;
    const size_t out_values = total_q * kNumQHeads * d;
    DeviceBuffer q_in, out, lse, workspace;
    if (!rec->Memory(UploadVector(q, target.context, &q_in, &error) &&
                         out.Allocate(target.context, out_values * 4, &error) &&
                         lse.Allocate(target.context, total_q * kNumQHeads * 4, &error) &&
                         workspace.Allocate(target.context, workspace_bytes, &error),
                     error)) {
      return;
    }
    if (params.q_indptr == nullptr && !kernel_noted) {
      // The kernel a plan of this decode shape runs (kvarn_attention_plan_kernel).
      kvarn_attention_shape_t shape;
      kvarn_attention_shape_defaults(&shape);
      shape.batch = mem.kv.batch;
      shape.num_kv_heads = mem.kv.num_kv_heads;
      shape.max_blocks_per_seq = mem.kv.max_blocks_per_seq;
      kvarn_attention_plan_t* plan = nullptr;
      const char* kernel = nullptr;
      if (!rec->Ok(kvarn_attention_plan_create(target.context, &config, &shape, &params, &plan),
                   "kvarn_attention_plan_create") ||
          !rec->Ok(kvarn_attention_plan_kernel(plan, &kernel), "kvarn_attention_plan_kernel")) {
        kvarn_attention_plan_destroy(plan);
        return;
      }
      row->notes.push_back(Format("attention kernel (decode plan): %s", kernel));
      kvarn_attention_plan_destroy(plan);
      kernel_noted = true;
    }
    if (!rec->Ok(
            kvarn_paged_attention(target.context, &config, &mem.kv, &params, q_in.data(),
                                  out.data(), lse.as<float>(), workspace.data(), workspace_bytes),
            "kvarn_paged_attention")) {
      return;
    }
    std::vector<float> out_host, lse_host;
    if (!rec->Memory(DownloadVector(out, out_values, &out_host, &error) &&
                         DownloadVector(lse, total_q * kNumQHeads, &lse_host, &error),
                     error)) {
      return;
    }
    const double scale = run.scale != 0.0f ? static_cast<double>(run.scale)
                                           : 1.0 / std::sqrt(static_cast<double>(d));
    double err_sq = 0.0, ref_sq = 0.0, lse_err = 0.0;
    std::vector<double> qr(d), o(d);
    for (size_t i = 0; i < total_q; ++i) {
      const int b = q_seq[i], n_keys = q_pos[i] + 1;
      for (int qh = 0; qh < kNumQHeads; ++qh) {
        const int h = qh / group;
        const float* qi = q.data() + (i * kNumQHeads + qh) * d;
        for (int c = 0; c < d; ++c) qr[c] = qi[c];
        HadamardInPlace(qr.data(), d);                                         // q' = q H
        const int lo = run.window > 0 ? std::max(0, n_keys - run.window) : 0;  // window start
        const double lse_ref = AttentionFloat64(
            qr.data(), keys[b][h].data() + static_cast<size_t>(lo) * d,
            vals[b][h].data() + static_cast<size_t>(lo) * d, n_keys - lo, d, scale, o.data(),
            run.softcap, run.sinks ? sink_logits[qh] : -std::numeric_limits<double>::infinity());
        HadamardInPlace(o.data(), d);  // o = o' H
        const float* oi = out_host.data() + (i * kNumQHeads + qh) * d;
        for (int c = 0; c < d; ++c) {
          const double e = oi[c] - o[c];
          err_sq += e * e;
          ref_sq += o[c] * o[c];
        }
        const double lse_diff =
            std::fabs(lse_host[i * kNumQHeads + qh] - lse_ref) / std::max(1.0, std::fabs(lse_ref));
        lse_err = std::isnan(lse_diff) ? lse_diff : std::max(lse_err, lse_diff);
        // Softmax shape statistics (sink weight and the largest weight) of the plain runs.
        if (run.variant()) continue;
        double s_sink = 0.0, s_max = -1e300;
        for (int t = 0; t < n_keys; ++t) {
          double s = 0.0;
          for (int c = 0; c < d; ++c) s += qr[c] * keys[b][h][static_cast<size_t>(t) * d + c];
          s *= scale;
          if (t == 0) s_sink = s;
          s_max = std::max(s_max, s);
        }
        stats.sink_mass += std::exp(s_sink - lse_ref);
        stats.max_weight += std::exp(s_max - lse_ref);
        ++stats.count;
      }
    }
    const double rel_l2 = ref_sq > 0.0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq);
    if (!(rel_l2 <= target.attention_tolerance)) {
      rec->Fail(Format("attention (%s): relative L2 error %.3e vs float64 > %.0e", run.name, rel_l2,
                       target.attention_tolerance));
      ok = false;
    }
    if (!(lse_err <= 1e-3)) {
      rec->Fail(
          Format("attention (%s): lse error %.3e vs float64 > 1e-3 (relative to max(1,|lse|))",
                 run.name, lse_err));
      ok = false;
    }
    if (run.variant()) {
      row->notes.push_back(Format("attention (%s): relative L2 %.1e, lse error %.1e vs float64",
                                  run.name, rel_l2, lse_err));
    }
    worst_l2 = std::isnan(rel_l2) ? rel_l2 : std::max(worst_l2, rel_l2);
    worst_lse = std::isnan(lse_err) ? lse_err : std::max(worst_lse, lse_err);
  }
  row->attention_rel_l2 = worst_l2;
  row->lse_max_err = worst_lse;
  row->attention_ok = ok && row->flush_matches_quantize;
  if (stats.count > 0) {
    row->notes.push_back(
        Format("attention: mean sink weight %.3f, mean largest weight %.3f, "
               "worst lse error %.1e",
               stats.sink_mass / stats.count, stats.max_weight / stats.count, worst_lse));
  }
}

// ---- d: decode attention throughput -----------------------------------------------------------

// One long sequence, mostly records: the sink tile, n record tiles (copies of the round trip's
// records) and one tail token. Measures decode over it.
void MeasureDecode(const BackendTarget& target, const kvarn_config_t& config,
                   const SweepOptions& options, const CodecRecords& codec, RowResult* row,
                   Recorder* rec) {
  if (codec.n_tiles == 0) return;
  const int d = config.head_dim, g = config.tile_tokens, sink = config.sink_tiles;
  const int context_tokens = options.quick ? 4096 : 8192;
  const int n_records = std::max(1, context_tokens / g - sink);
  const int seq_len = (sink + n_records) * g + 1;
  const int tiles = sink + n_records + 1;
  const size_t stride = codec.stride;
  const size_t tile_values = static_cast<size_t>(g) * d;
  std::string error;

  std::vector<unsigned char> pool(static_cast<size_t>(n_records) * kNumKvHeads * stride);
  for (size_t r = 0; r < static_cast<size_t>(n_records) * kNumKvHeads; ++r) {
    std::memcpy(pool.data() + r * stride, codec.bytes.data() + (r % codec.n_tiles) * stride,
                stride);
  }
  // Pages: sink pages then the tail page, [Hk][G][D] fp16 rotated. Filled with rotated
  // synthetic vectors (only the first tail slot is inside the sequence).
  const int num_pages = sink + 1;
  const KvSequence kv = GenerateKv(g, 1, d, RowSeed(options.seed, d, g, 3));
  DeviceBuffer k_in, v_in, k_rot, v_rot;
  std::vector<uint16_t> k_half, v_half;
  if (!rec->Memory(UploadVector(kv.k, target.context, &k_in, &error) &&
                       UploadVector(kv.v, target.context, &v_in, &error) &&
                       k_rot.Allocate(target.context, tile_values * 2, &error) &&
                       v_rot.Allocate(target.context, tile_values * 2, &error),
                   error)) {
    return;
  }
  if (!rec->Ok(kvarn_rotate(target.context, d, g, KVARN_DTYPE_F32, k_in.data(), KVARN_DTYPE_F16,
                            k_rot.data()),
               "kvarn_rotate") ||
      !rec->Ok(kvarn_rotate(target.context, d, g, KVARN_DTYPE_F32, v_in.data(), KVARN_DTYPE_F16,
                            v_rot.data()),
               "kvarn_rotate")) {
    return;
  }
  if (!rec->Memory(DownloadVector(k_rot, tile_values, &k_half, &error) &&
                       DownloadVector(v_rot, tile_values, &v_half, &error),
                   error)) {
    return;
  }
  std::vector<uint16_t> k_pages, v_pages;
  for (int p = 0; p < num_pages; ++p) {
    for (int h = 0; h < kNumKvHeads; ++h) {
      k_pages.insert(k_pages.end(), k_half.begin(), k_half.end());
      v_pages.insert(v_pages.end(), v_half.begin(), v_half.end());
    }
  }
  std::vector<int32_t> table(tiles);
  for (int i = 0; i < sink; ++i) table[i] = i;
  for (int i = 0; i < n_records; ++i) table[sink + i] = i;
  table[tiles - 1] = sink;  // the tail page
  const std::vector<int32_t> lens = {seq_len}, records = {n_records};
  PagedMemory mem;
  if (!rec->Memory(UploadVector(pool, target.context, &mem.records, &error) &&
                       UploadVector(k_pages, target.context, &mem.k_pages, &error) &&
                       UploadVector(v_pages, target.context, &mem.v_pages, &error) &&
                       UploadVector(table, target.context, &mem.block_table, &error) &&
                       UploadVector(lens, target.context, &mem.seq_lens, &error) &&
                       UploadVector(records, target.context, &mem.record_tiles, &error),
                   error)) {
    return;
  }
  kvarn_paged_kv_defaults(&mem.kv);
  mem.kv.num_kv_heads = kNumKvHeads;
  mem.kv.batch = 1;
  mem.kv.records = mem.records.data();
  mem.kv.record_stride = stride;
  mem.kv.num_record_blocks = n_records;
  mem.kv.k_pages = mem.k_pages.data();
  mem.kv.v_pages = mem.v_pages.data();
  mem.kv.num_pages = num_pages;
  mem.kv.block_table = mem.block_table.as<const int32_t>();
  mem.kv.max_blocks_per_seq = tiles;
  mem.kv.seq_lens = mem.seq_lens.as<const int32_t>();
  mem.kv.record_tiles = mem.record_tiles.as<const int32_t>();

  kvarn_attention_params_t params;
  kvarn_attention_params_defaults(&params);
  params.num_q_heads = kNumQHeads;
  params.q_dtype = KVARN_DTYPE_F32;
  params.out_dtype = KVARN_DTYPE_F32;
  size_t workspace_bytes = 0;
  if (!rec->Ok(kvarn_paged_attention_workspace_size(target.context, &config, &mem.kv, &params, 1,
                                                    &workspace_bytes),
               "kvarn_paged_attention_workspace_size")) {
    return;
  }
  const KvSequence qkv = GenerateKv(1, kNumKvHeads, d, RowSeed(options.seed, d, g, 4));
  const std::vector<float> q = GenerateQueries(qkv, {0}, kNumQHeads, options.seed);
  DeviceBuffer q_in, out, workspace;
  if (!rec->Memory(UploadVector(q, target.context, &q_in, &error) &&
                       out.Allocate(target.context, q.size() * 4, &error) &&
                       workspace.Allocate(target.context, workspace_bytes, &error),
                   error)) {
    return;
  }
  const double seconds = SecondsPerCall(
      [&]() {
        std::string sync_error;
        return rec->Ok(
                   kvarn_paged_attention(target.context, &config, &mem.kv, &params, q_in.data(),
                                         out.data(), nullptr, workspace.data(), workspace_bytes),
                   "kvarn_paged_attention") &&
               rec->Memory(Synchronize(target.context, &sync_error), sync_error);
      },
      options.quick ? 0.02 : 0.05, 3);
  if (!std::isfinite(seconds) || seconds <= 0.0) return;
  const double fp16_tokens = static_cast<double>(seq_len) - static_cast<double>(n_records) * g;
  const double bytes = static_cast<double>(n_records) * kNumKvHeads * row->record_bytes +
                       fp16_tokens * kNumKvHeads * d * 2 * 2;
  row->attention_tokens_per_s = seq_len / seconds;
  row->attention_gb_per_s = bytes / seconds * 1e-9;
  row->notes.push_back(
      Format("decode: %d cached tokens (%d record tiles), Hq %d, Hk %d: %.3f ms, "
             "%.3g tokens/s, %.2f GB/s",
             seq_len, n_records, kNumQHeads, kNumKvHeads, seconds * 1e3,
             row->attention_tokens_per_s, row->attention_gb_per_s));
}

}  // namespace

RowResult RunRow(const BackendTarget& target, const std::string& preset, int head_dim,
                 const SweepOptions& options) {
  RowResult row;
  row.backend = target.name;
  row.preset = preset;
  row.head_dim = head_dim;
  Recorder rec(&row);
  kvarn_config_t config;
  kvarn_config_defaults(&config);
  if (!rec.Ok(kvarn_config_from_preset(preset.c_str(), head_dim, &config),
              "kvarn_config_from_preset")) {
    return row;
  }
  row.tile_tokens = config.tile_tokens;
  row.key_bits = config.key_bits;
  row.value_bits = config.value_bits;
  if (!CheckConfig(config, preset, head_dim, &rec)) return row;
  CheckFormat(config, &row, &rec);
  if (row.record_bytes == 0) return row;
  CodecRecords codec;
  CheckRoundTrip(target, config, options, &row, &rec, &codec);
  CheckAttention(target, config, options, &row, &rec);
  MeasureDecode(target, config, options, codec, &row, &rec);
  row.passed = row.format_ok && row.roundtrip_ok && row.attention_ok && row.failures.empty();
  return row;
}

}  // namespace kvarn_selftest
