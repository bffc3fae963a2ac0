// Shared helpers of the codec and paged-attention suites: contexts, configs, status checks,
// synthetic K/V with the structure of real caches, and a paged cache built through the public
// layer-2 calls (kvarn_paged_append + kvarn_paged_flush) the way an engine would.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/fp.h"
#include "support/reference.h"
#include "support/rng.h"

namespace kvt {

// ---- contexts and configs ----------------------------------------------------------------------

struct ContextDeleter {
  void operator()(kvarn_context_t* c) const { kvarn_context_destroy(c); }
};
using ContextPtr = std::unique_ptr<kvarn_context_t, ContextDeleter>;

inline ContextPtr MakeCpuContext(int num_threads = 0) {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  o.num_threads = num_threads;
  kvarn_context_t* c = nullptr;
  const kvarn_status_t st = kvarn_context_create(&o, &c);
  EXPECT_EQ(st, KVARN_OK) << kvarn_last_error();
  return ContextPtr(c);
}

inline kvarn_config_t MakeConfig(int D, int G, int kb, int vb, int iterations = 8,
                                 int sink_tiles = 1, uint32_t kflags = 0, uint32_t vflags = 0) {
  kvarn_config_t c;
  kvarn_config_defaults(&c);
  c.head_dim = D;
  c.tile_tokens = G;
  c.key_bits = kb;
  c.value_bits = vb;
  c.iterations = iterations;
  c.sink_tiles = sink_tiles;
  c.key_flags = kflags;
  c.value_flags = vflags;
  return c;
}

inline kvarn_config_t PresetConfig(const std::string& preset, int D) {
  kvarn_config_t c;
  kvarn_config_defaults(&c);
  const kvarn_status_t st = kvarn_config_from_preset(preset.c_str(), D, &c);
  EXPECT_EQ(st, KVARN_OK) << preset << ": " << kvarn_last_error();
  return c;
}

inline size_t RecordBytes(const kvarn_config_t& c) {
  size_t n = 0;
  EXPECT_EQ(kvarn_record_bytes(&c, &n), KVARN_OK) << kvarn_last_error();
  return n;
}

inline std::string Lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

// Checks a failing call: its status, a non-empty kvarn_last_error() that mentions `needle`
// (case-insensitive; "" = any text).
inline ::testing::AssertionResult IsError(kvarn_status_t st, kvarn_status_t expected,
                                          const std::string& needle = "") {
  const char* msg = kvarn_last_error();
  if (st != expected) {
    return ::testing::AssertionFailure()
           << "status " << st << " (" << kvarn_status_string(st) << "), expected " << expected
           << " (" << kvarn_status_string(expected) << "); last error: \"" << (msg ? msg : "(null)")
           << "\"";
  }
  if (msg == nullptr || msg[0] == '\0') {
    return ::testing::AssertionFailure() << "kvarn_last_error() is empty after a failing call";
  }
  if (!needle.empty() && Lower(msg).find(Lower(needle)) == std::string::npos) {
    return ::testing::AssertionFailure()
           << "kvarn_last_error() \"" << msg << "\" does not mention \"" << needle << "\"";
  }
  return ::testing::AssertionSuccess();
}

#define KVT_EXPECT_OK(call)                                              \
  do {                                                                   \
    const kvarn_status_t kvt_st_ = (call);                               \
    EXPECT_EQ(kvt_st_, KVARN_OK) << #call << ": " << kvarn_last_error(); \
  } while (0)
#define KVT_ASSERT_OK(call)                                              \
  do {                                                                   \
    const kvarn_status_t kvt_st_ = (call);                               \
    ASSERT_EQ(kvt_st_, KVARN_OK) << #call << ": " << kvarn_last_error(); \
  } while (0)

// ---- synthetic K/V -----------------------------------------------------------------------------

// The structure of real caches (bench/RESULTS.md, Targets): a few outlier channels
// `outlier` times larger, a per-channel offset, per-token magnitude spread (log-normal) with rare
// tokens `spike` times larger.
struct KVShape {
  double outlier = 20.0;     // outlier channel factor
  int outlier_channels = 4;  // how many
  double token_sigma = 0.5;  // log-normal sigma of token magnitudes
  double spike = 20.0;       // rare large tokens
  double spike_prob = 0.01;
  double offset = 0.5;  // per-channel mean, in units of the channel scale
  double base = 1.0;    // overall scale
};

// Per-(sequence, head) channel structure: scales and offsets of D channels.
struct ChannelProfile {
  std::vector<double> scale, offset;
};

inline ChannelProfile MakeProfile(Rng& rng, int D, const KVShape& s) {
  ChannelProfile p;
  p.scale.assign(D, 1.0);
  p.offset.assign(D, 0.0);
  for (int d = 0; d < D; ++d) {
    p.scale[d] = s.base * std::exp(0.3 * rng.Normal());
    p.offset[d] = s.offset * rng.Normal();
  }
  for (int i = 0; i < s.outlier_channels; ++i) p.scale[rng.Int(0, D - 1)] *= s.outlier;
  return p;
}

inline void FillToken(Rng& rng, const ChannelProfile& p, const KVShape& s, float* out, int D) {
  double mag = std::exp(s.token_sigma * rng.Normal());
  if (rng.Bernoulli(s.spike_prob)) mag *= s.spike;
  for (int d = 0; d < D; ++d) {
    out[d] = static_cast<float>(mag * p.scale[d] * (p.offset[d] + rng.Normal()));
  }
}

// n tokens x D channels from one profile.
inline std::vector<float> MakeTokens(Rng& rng, int n, int D, const KVShape& s) {
  const ChannelProfile p = MakeProfile(rng, D, s);
  std::vector<float> x(static_cast<size_t>(n) * D);
  for (int t = 0; t < n; ++t) FillToken(rng, p, s, x.data() + static_cast<size_t>(t) * D, D);
  return x;
}

// ---- a paged cache built through the public layer-2 calls ---------------------------------------

struct PagedCacheSpec {
  int num_kv_heads = 2;
  std::vector<int> lens;  // tokens per sequence
  int max_chunk = 300;    // tokens appended per sequence per round: random in [0, max_chunk]
  bool flush = true;      // quantize complete non-sink tiles
  int flush_lag = 0;      // complete non-sink tiles left as fp16 pages at the end
  kvarn_dtype_t dtype = KVARN_DTYPE_F32;  // dtype of the appended K/V
  // Outliers and spikes moderate enough that softmax spreads over many keys (scores of a few
  // units, up to ~20 on spikes), like real attention.
  KVShape k_shape{5.0, 3, 0.3, 4.0, 0.01, 0.5, 1.0};
  KVShape v_shape{5.0, 3, 0.3, 4.0, 0.01, 0.2, 1.0};
  size_t stride_padding = 8;  // record_stride = record bytes + padding
};

inline constexpr uint16_t kPoisonHalf = 0x7e00;  // NaN: any read of a stale page shows up
inline constexpr uint8_t kPoisonByte = 0xCD;

struct PagedCache {
  kvarn_config_t cfg{};
  int D = 0, G = 0, Hk = 0, batch = 0;
  size_t record_bytes = 0, stride = 0;
  std::vector<uint8_t> records;
  int num_blocks = 0;
  std::vector<uint16_t> k_pages, v_pages;
  int num_pages = 0;
  std::vector<int32_t> block_table;
  int max_blocks = 0;
  std::vector<int32_t> seq_lens, record_tiles;
  std::vector<std::vector<float>> k_in, v_in;  // appended values (as given), [N][Hk][D] per seq

  kvarn_paged_kv_t View() {
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = Hk;
    kv.batch = batch;
    kv.records = records.data();
    kv.record_stride = stride;
    kv.num_record_blocks = num_blocks;
    kv.k_pages = k_pages.data();
    kv.v_pages = v_pages.data();
    kv.num_pages = num_pages;
    kv.block_table = block_table.data();
    kv.max_blocks_per_seq = max_blocks;
    kv.seq_lens = seq_lens.data();
    kv.record_tiles = record_tiles.data();
    return kv;
  }

  size_t PageElems() const { return static_cast<size_t>(Hk) * G * D; }
  bool IsRecordTile(int b, int tile) const {
    return tile >= cfg.sink_tiles && tile < cfg.sink_tiles + record_tiles[b];
  }
  int32_t Block(int b, int tile) const {
    return block_table[static_cast<size_t>(b) * max_blocks + tile];
  }
  uint16_t* KPage(int page, int h) { return k_pages.data() + (page * size_t(Hk) + h) * G * D; }
  uint16_t* VPage(int page, int h) { return v_pages.data() + (page * size_t(Hk) + h) * G * D; }

  // The cache-frame K' and V' of sequence b, KV head h ([N][D] fp32): fp16 pages as stored and
  // records dequantized with KVARN_CODEC_CACHE_FRAME.
  ::testing::AssertionResult CacheFrame(kvarn_context_t* ctx, int b, int h, std::vector<float>* K,
                                        std::vector<float>* V) const {
    const int64_t N = seq_lens[b];
    K->assign(static_cast<size_t>(N) * D, 0.f);
    V->assign(K->size(), 0.f);
    std::vector<float> kt(static_cast<size_t>(G) * D), vt(kt.size());
    for (int tile = 0; tile * static_cast<int64_t>(G) < N; ++tile) {
      const int n = static_cast<int>(std::min<int64_t>(G, N - int64_t{tile} * G));
      const int32_t id = Block(b, tile);
      if (IsRecordTile(b, tile)) {
        const uint8_t* rec = records.data() + (static_cast<size_t>(id) * Hk + h) * stride;
        const kvarn_status_t st =
            kvarn_dequantize(ctx, &cfg, 1, rec, stride, KVARN_CODEC_CACHE_FRAME, KVARN_DTYPE_F32,
                             kt.data(), vt.data());
        if (st != KVARN_OK) return ::testing::AssertionFailure() << kvarn_last_error();
      } else {
        const size_t off = static_cast<size_t>(id) * PageElems() + static_cast<size_t>(h) * G * D;
        for (size_t e = 0; e < static_cast<size_t>(n) * D; ++e) {
          kt[e] = HalfToFloat(k_pages[off + e]);
          vt[e] = HalfToFloat(v_pages[off + e]);
        }
      }
      std::copy(kt.begin(), kt.begin() + static_cast<size_t>(n) * D,
                K->begin() + static_cast<size_t>(tile) * G * D);
      std::copy(vt.begin(), vt.begin() + static_cast<size_t>(n) * D,
                V->begin() + static_cast<size_t>(tile) * G * D);
    }
    return ::testing::AssertionSuccess();
  }
};

// Appends every sequence's tokens in random chunks (several sequences per call, ragged, some
// appending nothing in a round), assigns pages from a shuffled free list, flushes each tile once
// it is complete (and not a sink tile) into a shuffled record block, then poisons the freed page
// (NaN) and recycles it. Unwritten page slots hold NaN and unwritten record bytes 0xCD, so
// attention reading anything it should not shows up.
// An empty hand-made paged cache: `batch` sequences of zero tokens, all-zero block tables, pages
// poisoned with NaN and records with kPoisonByte, record_stride = record bytes + 6.
inline PagedCache SmallPagedCache(const kvarn_config_t& cfg, int hk, int batch, int blocks_per_seq,
                                  int pages, int record_blocks) {
  PagedCache c;
  c.cfg = cfg;
  c.D = cfg.head_dim;
  c.G = cfg.tile_tokens;
  c.Hk = hk;
  c.batch = batch;
  c.record_bytes = RecordBytes(cfg);
  c.stride = c.record_bytes + 6;
  c.num_pages = pages;
  c.num_blocks = record_blocks;
  c.max_blocks = blocks_per_seq;
  c.k_pages.assign(static_cast<size_t>(pages) * c.PageElems(), kPoisonHalf);
  c.v_pages = c.k_pages;
  c.records.assign(static_cast<size_t>(record_blocks) * hk * c.stride, kPoisonByte);
  c.block_table.assign(static_cast<size_t>(batch) * blocks_per_seq, 0);
  c.seq_lens.assign(batch, 0);
  c.record_tiles.assign(batch, 0);
  return c;
}

inline ::testing::AssertionResult BuildPagedCache(kvarn_context_t* ctx, const kvarn_config_t& cfg,
                                                  const PagedCacheSpec& spec, Rng& rng,
                                                  PagedCache* out) {
  PagedCache& pc = *out;
  pc.cfg = cfg;
  pc.D = cfg.head_dim;
  pc.G = cfg.tile_tokens;
  pc.Hk = spec.num_kv_heads;
  pc.batch = static_cast<int>(spec.lens.size());
  const int D = pc.D, G = pc.G, Hk = pc.Hk, sink = cfg.sink_tiles;
  pc.record_bytes = RecordBytes(cfg);
  pc.stride = pc.record_bytes + spec.stride_padding;

  int max_tiles = 1, total_records = 0, total_pages = 0;
  for (int n : spec.lens) {
    const int tiles = (n + G - 1) / G;
    max_tiles = std::max(max_tiles, tiles);
    if (spec.flush) total_records += std::max(0, n / G - sink - spec.flush_lag);
    const int live =
        spec.flush ? std::min(tiles, sink + spec.flush_lag + spec.max_chunk / G + 2) : tiles;
    total_pages += live;
  }
  pc.max_blocks = max_tiles + 2;
  pc.num_blocks = total_records + 2;
  pc.num_pages = total_pages + 2;
  pc.records.assign(static_cast<size_t>(pc.num_blocks) * Hk * pc.stride, kPoisonByte);
  pc.k_pages.assign(static_cast<size_t>(pc.num_pages) * pc.PageElems(), kPoisonHalf);
  pc.v_pages = pc.k_pages;
  pc.block_table.assign(static_cast<size_t>(pc.batch) * pc.max_blocks, -1);
  pc.seq_lens.assign(pc.batch, 0);
  pc.record_tiles.assign(pc.batch, 0);
  pc.k_in.assign(pc.batch, {});
  pc.v_in.assign(pc.batch, {});

  std::vector<int32_t> free_pages(pc.num_pages), free_blocks(pc.num_blocks);
  for (int i = 0; i < pc.num_pages; ++i) free_pages[i] = i;
  for (int i = 0; i < pc.num_blocks; ++i) free_blocks[i] = i;
  rng.Shuffle(free_pages.data(), free_pages.size());
  rng.Shuffle(free_blocks.data(), free_blocks.size());

  std::vector<std::vector<ChannelProfile>> kp(pc.batch), vp(pc.batch);
  for (int b = 0; b < pc.batch; ++b) {
    for (int h = 0; h < Hk; ++h) {
      kp[b].push_back(MakeProfile(rng, D, spec.k_shape));
      vp[b].push_back(MakeProfile(rng, D, spec.v_shape));
    }
  }

  for (;;) {
    bool any = false;
    std::vector<int32_t> indptr(1, 0);
    std::vector<float> k, v;
    std::vector<int> chunk(pc.batch, 0);
    for (int b = 0; b < pc.batch; ++b) {
      const int remaining = spec.lens[b] - pc.seq_lens[b];
      if (remaining > 0) {
        any = true;
        chunk[b] = static_cast<int>(rng.Int(0, std::min(spec.max_chunk, remaining)));
        if (pc.batch == 1 && chunk[b] == 0) chunk[b] = 1;
      }
      for (int64_t pos = pc.seq_lens[b]; pos < pc.seq_lens[b] + chunk[b]; ++pos) {
        int32_t& slot = pc.block_table[static_cast<size_t>(b) * pc.max_blocks + pos / G];
        if (slot < 0) {
          if (free_pages.empty()) return ::testing::AssertionFailure() << "page pool exhausted";
          slot = free_pages.back();
          free_pages.pop_back();
        }
      }
      std::vector<float> tok(D);
      for (int i = 0; i < chunk[b]; ++i) {
        for (int h = 0; h < Hk; ++h) {
          FillToken(rng, kp[b][h], spec.k_shape, tok.data(), D);
          k.insert(k.end(), tok.begin(), tok.end());
          FillToken(rng, vp[b][h], spec.v_shape, tok.data(), D);
          v.insert(v.end(), tok.begin(), tok.end());
        }
      }
      indptr.push_back(indptr.back() + chunk[b]);
    }
    if (!any) break;
    k = RoundTo(k, spec.dtype);
    v = RoundTo(v, spec.dtype);
    const std::vector<uint8_t> kb = Encode(k, spec.dtype), vb = Encode(v, spec.dtype);
    kvarn_paged_kv_t kv = pc.View();
    const kvarn_status_t st =
        kvarn_paged_append(ctx, &pc.cfg, &kv, indptr.data(), spec.dtype, kb.data(), vb.data());
    if (st != KVARN_OK) {
      return ::testing::AssertionFailure() << "kvarn_paged_append: " << kvarn_last_error();
    }
    for (int b = 0; b < pc.batch; ++b) {
      const size_t from = static_cast<size_t>(indptr[b]) * Hk * D;
      const size_t to = static_cast<size_t>(indptr[b + 1]) * Hk * D;
      pc.k_in[b].insert(pc.k_in[b].end(), k.begin() + from, k.begin() + to);
      pc.v_in[b].insert(pc.v_in[b].end(), v.begin() + from, v.begin() + to);
      pc.seq_lens[b] += chunk[b];
    }
    // Flush the tiles that became complete.
    if (!spec.flush) continue;
    std::vector<int32_t> src, dst;
    std::vector<std::pair<int, int>> where;
    for (int b = 0; b < pc.batch; ++b) {
      // Keep the last flush_lag complete tiles of the final length as pages.
      const int complete = std::min(pc.seq_lens[b] / G, spec.lens[b] / G - spec.flush_lag);
      for (int tile = sink + pc.record_tiles[b]; tile < complete; ++tile) {
        if (free_blocks.empty()) return ::testing::AssertionFailure() << "record pool exhausted";
        src.push_back(pc.Block(b, tile));
        dst.push_back(free_blocks.back());
        free_blocks.pop_back();
        where.emplace_back(b, tile);
      }
    }
    if (src.empty()) continue;
    const kvarn_status_t fst =
        kvarn_paged_flush(ctx, &pc.cfg, &kv, src.size(), src.data(), dst.data());
    if (fst != KVARN_OK) {
      return ::testing::AssertionFailure() << "kvarn_paged_flush: " << kvarn_last_error();
    }
    for (size_t i = 0; i < src.size(); ++i) {
      const int b = where[i].first, tile = where[i].second;
      pc.block_table[static_cast<size_t>(b) * pc.max_blocks + tile] = dst[i];
      ++pc.record_tiles[b];
      std::fill(pc.k_pages.begin() + static_cast<size_t>(src[i]) * pc.PageElems(),
                pc.k_pages.begin() + static_cast<size_t>(src[i] + 1) * pc.PageElems(), kPoisonHalf);
      std::fill(pc.v_pages.begin() + static_cast<size_t>(src[i]) * pc.PageElems(),
                pc.v_pages.begin() + static_cast<size_t>(src[i] + 1) * pc.PageElems(), kPoisonHalf);
      free_pages.push_back(src[i]);
    }
    rng.Shuffle(free_pages.data(), free_pages.size());
  }
  return ::testing::AssertionSuccess();
}

}  // namespace kvt
