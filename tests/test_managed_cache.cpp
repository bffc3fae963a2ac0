// Managed-cache semantics (layer 3), checked through the public API against a plain model:
// a tile is quantized exactly once, when complete and committed; sink and tail stay fp16;
// speculation, truncate, fork, remove and export/import behave like the same operations on an
// unquantized cache that applies the same quantization; failures change nothing.
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int kHk = 2;
constexpr int kHq = 8;  // GQA 4

struct Ctx {
  kvarn_context_t* ctx = nullptr;
  Ctx() {
    kvarn_context_options_t o;
    kvarn_context_options_defaults(&o);
    o.backend = KVARN_BACKEND_CPU;
    o.num_threads = 2;
    EXPECT_EQ(kvarn_context_create(&o, &ctx), KVARN_OK) << kvarn_last_error();
  }
  ~Ctx() { kvarn_context_destroy(ctx); }
};

// Tokens of one sequence in one layer: unrotated fp32 [n][Hk][D].
struct Tokens {
  std::vector<float> k, v;
  size_t n = 0;
};

class CacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    kvarn_cache_options_defaults(&opts_);
    ASSERT_EQ(kvarn_config_from_preset("k4v2_g64", D_, &opts_.config), KVARN_OK);
    opts_.num_layers = 2;
    opts_.num_kv_heads = kHk;
    opts_.max_tokens = 8192;
    opts_.max_sequences = 16;
    Make(&cache_);
  }
  void TearDown() override { kvarn_cache_destroy(cache_); }

  void Make(kvarn_cache_t** c) {
    ASSERT_EQ(kvarn_cache_create(ctx_.ctx, &opts_, c), KVARN_OK) << kvarn_last_error();
  }

  Tokens Random(size_t n) {
    std::normal_distribution<float> nd(0.f, 1.f);
    Tokens t;
    t.n = n;
    t.k.resize(n * kHk * D_);
    t.v.resize(t.k.size());
    for (size_t i = 0; i < t.k.size(); ++i) {
      const int ch = static_cast<int>(i % D_);
      t.k[i] = nd(rng_) * (ch % 17 == 3 ? 12.f : 1.f);  // outlier channels
      t.v[i] = nd(rng_);
    }
    return t;
  }

  Tokens Slice(const Tokens& t, size_t begin, size_t end) const {
    Tokens s;
    s.n = end - begin;
    const size_t row = kHk * D_;
    s.k.assign(t.k.begin() + begin * row, t.k.begin() + end * row);
    s.v.assign(t.v.begin() + begin * row, t.v.begin() + end * row);
    return s;
  }

  kvarn_status_t Append(kvarn_cache_t* c, int64_t id, int layer, const Tokens& t,
                        uint32_t flags = KVARN_APPEND_DEFAULT) {
    return kvarn_cache_append(c, id, layer, t.n, KVARN_DTYPE_F32, t.k.data(), t.v.data(), flags);
  }

  // Appends `t` to every layer (same tokens) in chunks of `chunk`.
  void AppendAll(kvarn_cache_t* c, int64_t id, const Tokens& t, size_t chunk,
                 uint32_t flags = KVARN_APPEND_DEFAULT) {
    for (size_t b = 0; b < t.n; b += chunk) {
      const Tokens s = Slice(t, b, std::min(t.n, b + chunk));
      for (int l = 0; l < opts_.num_layers; ++l) {
        ASSERT_EQ(Append(c, id, l, s, flags), KVARN_OK) << kvarn_last_error();
      }
    }
  }

  // Decode attention for one sequence: [Hq][D] output.
  std::vector<float> Decode(kvarn_cache_t* c, int64_t id, int layer, const std::vector<float>& q) {
    kvarn_attention_params_t p;
    kvarn_attention_params_defaults(&p);
    p.num_q_heads = kHq;
    std::vector<float> out(kHq * D_, -7.f);
    EXPECT_EQ(kvarn_cache_attention(c, layer, 1, &id, &p, q.data(), out.data(), nullptr), KVARN_OK)
        << kvarn_last_error();
    return out;
  }

  std::vector<float> Query() {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> q(kHq * D_);
    for (float& x : q) x = nd(rng_);
    return q;
  }

  kvarn_cache_stats_t Stats(kvarn_cache_t* c) {
    kvarn_cache_stats_t s;
    s.size = sizeof s;
    EXPECT_EQ(kvarn_cache_get_stats(c, &s), KVARN_OK);
    return s;
  }

  // Expected number of records: every complete, committed, non-sink tile, per head and layer.
  int64_t ExpectedRecords(int64_t committed) const {
    const int G = opts_.config.tile_tokens;
    return std::max<int64_t>(0, committed / G - opts_.config.sink_tiles) * kHk * opts_.num_layers;
  }

  // Float64 attention over the plain model: records' tiles quantized with the codec from the
  // same tokens, the rest rounded to fp16 in the cache frame.
  std::vector<double> Reference(const Tokens& t, size_t committed, const std::vector<float>& q) {
    const int G = opts_.config.tile_tokens, sink = opts_.config.sink_tiles;
    const size_t n = t.n;
    std::vector<float> K(n * kHk * D_), V(K.size());  // unrotated reconstruction
    const size_t n_rec_tiles = std::max<int64_t>(0, static_cast<int64_t>(committed / G) - sink);
    for (size_t i = 0; i < n; ++i) {
      const size_t tile = i / G;
      const bool rec = tile >= static_cast<size_t>(sink) && tile < sink + n_rec_tiles;
      if (rec) continue;
      for (int h = 0; h < kHk; ++h) {
        // fp16 in the cache frame, then back to the unrotated frame (H is an involution).
        std::vector<uint16_t> half(D_);
        const size_t off = (i * kHk + h) * D_;
        EXPECT_EQ(
            kvarn_rotate(ctx_.ctx, D_, 1, KVARN_DTYPE_F32, &t.k[off], KVARN_DTYPE_F16, half.data()),
            KVARN_OK);
        EXPECT_EQ(
            kvarn_rotate(ctx_.ctx, D_, 1, KVARN_DTYPE_F16, half.data(), KVARN_DTYPE_F32, &K[off]),
            KVARN_OK);
        EXPECT_EQ(
            kvarn_rotate(ctx_.ctx, D_, 1, KVARN_DTYPE_F32, &t.v[off], KVARN_DTYPE_F16, half.data()),
            KVARN_OK);
        EXPECT_EQ(
            kvarn_rotate(ctx_.ctx, D_, 1, KVARN_DTYPE_F16, half.data(), KVARN_DTYPE_F32, &V[off]),
            KVARN_OK);
      }
    }
    size_t rb;
    EXPECT_EQ(kvarn_record_bytes(&opts_.config, &rb), KVARN_OK);
    for (size_t r = 0; r < n_rec_tiles; ++r) {
      const size_t tile = sink + r;
      for (int h = 0; h < kHk; ++h) {
        std::vector<float> kt(G * D_), vt(G * D_);
        for (int j = 0; j < G; ++j) {
          const size_t off = ((tile * G + j) * kHk + h) * D_;
          std::copy(&t.k[off], &t.k[off] + D_, &kt[j * D_]);
          std::copy(&t.v[off], &t.v[off] + D_, &vt[j * D_]);
        }
        std::vector<uint8_t> rec(rb);
        EXPECT_EQ(kvarn_quantize(ctx_.ctx, &opts_.config, 1, KVARN_DTYPE_F32, kt.data(), vt.data(),
                                 0, rec.data(), rb),
                  KVARN_OK);
        EXPECT_EQ(kvarn_dequantize(ctx_.ctx, &opts_.config, 1, rec.data(), rb, 0, KVARN_DTYPE_F32,
                                   kt.data(), vt.data()),
                  KVARN_OK);
        for (int j = 0; j < G; ++j) {
          const size_t off = ((tile * G + j) * kHk + h) * D_;
          std::copy(&kt[j * D_], &kt[j * D_] + D_, &K[off]);
          std::copy(&vt[j * D_], &vt[j * D_] + D_, &V[off]);
        }
      }
    }
    std::vector<double> out(kHq * D_, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(D_));
    for (int hq = 0; hq < kHq; ++hq) {
      const int h = hq / (kHq / kHk);
      std::vector<double> s(n);
      double mx = -1e300;
      for (size_t i = 0; i < n; ++i) {
        double acc = 0;
        for (int d = 0; d < D_; ++d) acc += double(q[hq * D_ + d]) * K[(i * kHk + h) * D_ + d];
        s[i] = acc * scale;
        mx = std::max(mx, s[i]);
      }
      double l = 0;
      for (size_t i = 0; i < n; ++i) l += (s[i] = std::exp(s[i] - mx));
      for (size_t i = 0; i < n; ++i) {
        for (int d = 0; d < D_; ++d) out[hq * D_ + d] += s[i] / l * V[(i * kHk + h) * D_ + d];
      }
    }
    return out;
  }

  static double RelL2(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (a[i] - b[i]) * (a[i] - b[i]);
      den += b[i] * b[i];
    }
    return std::sqrt(num / den);
  }

  const int D_ = 64;
  unsigned seed_ = 0;
  std::mt19937 rng_;
  Ctx ctx_;
  kvarn_cache_options_t opts_;
  kvarn_cache_t* cache_ = nullptr;
};

TEST_F(CacheTest, TileQuantizedExactlyOnceWhenCompleteAndCommitted) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 7), KVARN_OK);
  const Tokens t = Random(300);
  for (size_t i = 0; i < t.n; ++i) {
    AppendAll(cache_, 7, Slice(t, i, i + 1), 1);
    const kvarn_cache_stats_t s = Stats(cache_);
    ASSERT_EQ(s.records, ExpectedRecords(i + 1)) << "after token " << i;
    ASSERT_EQ(s.committed_tokens, static_cast<int64_t>((i + 1) * opts_.num_layers));
  }
  // Token-by-token appends give the same attention as one append of everything.
  kvarn_cache_t* other = nullptr;
  Make(&other);
  ASSERT_EQ(kvarn_cache_add_sequence(other, 7), KVARN_OK);
  AppendAll(other, 7, t, t.n);
  const auto q = Query();
  EXPECT_EQ(Decode(cache_, 7, 1, q), Decode(other, 7, 1, q));
  kvarn_cache_destroy(other);
}

TEST_F(CacheTest, AttentionMatchesPlainModelAcrossLengths) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (size_t n : {1u, 63u, 64u, 65u, 128u, 129u, 300u, 1000u}) {
    const int64_t id = static_cast<int64_t>(n);
    ASSERT_EQ(kvarn_cache_add_sequence(cache_, id), KVARN_OK);
    const Tokens t = Random(n);
    AppendAll(cache_, id, t, 97);
    const auto q = Query();
    const double err = RelL2(Decode(cache_, id, 0, q), Reference(t, n, q));
    EXPECT_LE(err, 1e-3) << "n=" << n;
    ASSERT_EQ(kvarn_cache_remove_sequence(cache_, id), KVARN_OK);
  }
  EXPECT_EQ(Stats(cache_).pages, 0);
  EXPECT_EQ(Stats(cache_).records, 0);
}

TEST_F(CacheTest, SpeculativeTokensNeverReachRecordsBeforeCommit) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  const Tokens t = Random(260);
  AppendAll(cache_, 1, Slice(t, 0, 120), 120);
  const int64_t before = Stats(cache_).records;
  AppendAll(cache_, 1, Slice(t, 120, 260), 140, KVARN_APPEND_SPECULATIVE);
  EXPECT_EQ(Stats(cache_).records, before) << "speculative tiles were quantized";
  int64_t len = 0, committed = 0;
  ASSERT_EQ(kvarn_cache_sequence_length(cache_, 1, 0, &len, &committed), KVARN_OK);
  EXPECT_EQ(len, 260);
  EXPECT_EQ(committed, 120);
  // A committed append is refused while speculative tokens are pending.
  EXPECT_EQ(Append(cache_, 1, 0, Slice(t, 0, 1)), KVARN_ERR_INVALID_STATE);
  EXPECT_NE(std::strlen(kvarn_last_error()), 0u);
  // Accept 80 of the 140 draft tokens: commit then drop the rest.
  ASSERT_EQ(kvarn_cache_commit(cache_, 1, 200), KVARN_OK);
  EXPECT_EQ(Stats(cache_).records, ExpectedRecords(200));
  ASSERT_EQ(kvarn_cache_truncate(cache_, 1, 200), KVARN_OK);
  // Same attention as a cache that only ever saw the 200 accepted tokens, committed at once.
  kvarn_cache_t* plain = nullptr;
  Make(&plain);
  ASSERT_EQ(kvarn_cache_add_sequence(plain, 1), KVARN_OK);
  AppendAll(plain, 1, Slice(t, 0, 200), 200);
  const auto q = Query();
  EXPECT_EQ(Decode(cache_, 1, 0, q), Decode(plain, 1, 0, q));
  EXPECT_LE(RelL2(Decode(cache_, 1, 0, q), Reference(Slice(t, 0, 200), 200, q)), 1e-3);
  kvarn_cache_destroy(plain);
}

TEST_F(CacheTest, RejectedDraftLeavesNoTrace) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  const Tokens t = Random(200);
  AppendAll(cache_, 1, Slice(t, 0, 100), 100);
  const auto q = Query();
  const auto ref = Decode(cache_, 1, 0, q);
  const kvarn_cache_stats_t s0 = Stats(cache_);
  AppendAll(cache_, 1, Slice(t, 100, 200), 100, KVARN_APPEND_SPECULATIVE);
  ASSERT_EQ(kvarn_cache_truncate(cache_, 1, 100), KVARN_OK);
  EXPECT_EQ(Decode(cache_, 1, 0, q), ref);
  const kvarn_cache_stats_t s1 = Stats(cache_);
  EXPECT_EQ(s1.records, s0.records);
  EXPECT_EQ(s1.pages, s0.pages);
  EXPECT_EQ(s1.tokens, s0.tokens);
}

TEST_F(CacheTest, TruncateCutsOnlyAtTileBoundariesOfRecords) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 3), KVARN_OK);
  const Tokens t = Random(400);
  AppendAll(cache_, 3, t, 400);
  const auto q = Query();
  const auto before = Decode(cache_, 3, 0, q);
  // Tile 2 (tokens 128..191) is a record: cutting inside it is refused, nothing changes.
  EXPECT_EQ(kvarn_cache_truncate(cache_, 3, 150), KVARN_ERR_INVALID_STATE);
  EXPECT_NE(std::string(kvarn_last_error()).find("quantized"), std::string::npos);
  EXPECT_EQ(Decode(cache_, 3, 0, q), before);
  // Cutting inside the fp16 tail or at a record boundary works, like a plain cache.
  ASSERT_EQ(kvarn_cache_truncate(cache_, 3, 390), KVARN_OK);
  EXPECT_LE(RelL2(Decode(cache_, 3, 0, q), Reference(Slice(t, 0, 390), 390, q)), 1e-3);
  ASSERT_EQ(kvarn_cache_truncate(cache_, 3, 128), KVARN_OK);
  EXPECT_EQ(Stats(cache_).records, ExpectedRecords(128));
  EXPECT_LE(RelL2(Decode(cache_, 3, 0, q), Reference(Slice(t, 0, 128), 128, q)), 1e-3);
  // Growing again re-quantizes the new tiles from the new tokens.
  const Tokens more = Random(100);
  AppendAll(cache_, 3, more, 100);
  Tokens all = Slice(t, 0, 128);
  all.k.insert(all.k.end(), more.k.begin(), more.k.end());
  all.v.insert(all.v.end(), more.v.begin(), more.v.end());
  all.n = 228;
  EXPECT_LE(RelL2(Decode(cache_, 3, 0, q), Reference(all, 228, q)), 1e-3);
}

TEST_F(CacheTest, ForkSharesRecordsAndMatchesAFreshPrefix) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  const Tokens t = Random(500);
  AppendAll(cache_, 1, t, 250);
  const int64_t records_before = Stats(cache_).records;
  ASSERT_EQ(kvarn_cache_fork(cache_, 1, 2, 320), KVARN_OK);
  EXPECT_EQ(Stats(cache_).records, records_before) << "fork copied records";
  EXPECT_EQ(kvarn_cache_fork(cache_, 1, 9, 330), KVARN_ERR_INVALID_STATE);  // inside a record
  EXPECT_EQ(kvarn_cache_fork(cache_, 1, 2, -1), KVARN_ERR_ALREADY_EXISTS);
  EXPECT_EQ(kvarn_cache_fork(cache_, 42, 10, -1), KVARN_ERR_NOT_FOUND);
  kvarn_cache_t* plain = nullptr;
  Make(&plain);
  ASSERT_EQ(kvarn_cache_add_sequence(plain, 2), KVARN_OK);
  AppendAll(plain, 2, Slice(t, 0, 320), 320);
  const auto q = Query();
  EXPECT_EQ(Decode(cache_, 2, 1, q), Decode(plain, 2, 1, q));
  // The branches diverge independently; the parent is untouched.
  const auto parent = Decode(cache_, 1, 1, q);
  AppendAll(cache_, 2, Random(90), 90);
  EXPECT_EQ(Decode(cache_, 1, 1, q), parent);
  // Removing the parent keeps the shared records alive for the child.
  const auto child = Decode(cache_, 2, 1, q);
  ASSERT_EQ(kvarn_cache_remove_sequence(cache_, 1), KVARN_OK);
  EXPECT_EQ(Decode(cache_, 2, 1, q), child);
  ASSERT_EQ(kvarn_cache_remove_sequence(cache_, 2), KVARN_OK);
  EXPECT_EQ(Stats(cache_).records, 0);
  EXPECT_EQ(Stats(cache_).pages, 0);
  kvarn_cache_destroy(plain);
}

TEST_F(CacheTest, FailedAppendLeavesCacheExactlyAsBefore) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  AppendAll(cache_, 1, Random(100), 100);
  const auto q = Query();
  const auto before = Decode(cache_, 1, 0, q);
  const kvarn_cache_stats_t s0 = Stats(cache_);
  Tokens bad = Random(300);
  bad.k[250 * kHk * D_ + 5] = NAN;  // in a tile after two that complete during this append
  EXPECT_EQ(Append(cache_, 1, 0, bad), KVARN_ERR_NON_FINITE);
  bad.k[250 * kHk * D_ + 5] = 1e6f;  // beyond fp16
  EXPECT_EQ(Append(cache_, 1, 0, bad), KVARN_ERR_OVERFLOW);
  const kvarn_cache_stats_t s1 = Stats(cache_);
  EXPECT_EQ(s1.tokens, s0.tokens);
  EXPECT_EQ(s1.records, s0.records);
  EXPECT_EQ(s1.pages, s0.pages);
  EXPECT_EQ(Decode(cache_, 1, 0, q), before);
  int64_t len = 0;
  ASSERT_EQ(kvarn_cache_sequence_length(cache_, 1, 0, &len, nullptr), KVARN_OK);
  EXPECT_EQ(len, 100);
}

TEST_F(CacheTest, CapacityLimitsAreStatusesAndChangeNothing) {
  kvarn_cache_destroy(cache_);
  opts_.max_tokens = 256;  // 4 record tiles of 64
  opts_.max_sequences = 2;
  Make(&cache_);
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 2), KVARN_OK);
  EXPECT_EQ(kvarn_cache_add_sequence(cache_, 3), KVARN_ERR_CAPACITY);
  AppendAll(cache_, 1, Random(200), 200);
  const kvarn_cache_stats_t s0 = Stats(cache_);
  EXPECT_EQ(Append(cache_, 1, 0, Random(300)), KVARN_ERR_CAPACITY);
  const kvarn_cache_stats_t s1 = Stats(cache_);
  EXPECT_EQ(s1.tokens, s0.tokens);
  EXPECT_EQ(s1.records, s0.records);
  EXPECT_EQ(s1.pages, s0.pages);
}

TEST_F(CacheTest, ForkAndImportOutOfPagesInOneLayerChangeNothing) {
  kvarn_cache_destroy(cache_);
  opts_.max_sequences = 3;  // 3 * (1 sink + 2) = 9 pages per layer
  Make(&cache_);
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  AppendAll(cache_, 1, Random(150), 150);  // sink page + 1 record tile + tail page, each layer
  size_t n = 0;
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 1, nullptr, 0, &n), KVARN_OK);
  std::vector<uint8_t> blob(n);
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 1, blob.data(), n, &n), KVARN_OK);
  // Sequence 2 holds 6 speculative pages in layer 1 only: layer 1 has one free page left, so a
  // copy of sequence 1 fits layer 0 and fails half-way through layer 1.
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 2), KVARN_OK);
  ASSERT_EQ(Append(cache_, 2, 1, Random(6 * 64), KVARN_APPEND_SPECULATIVE), KVARN_OK);
  const auto q = Query();
  const auto before = Decode(cache_, 1, 1, q);
  const kvarn_cache_stats_t s0 = Stats(cache_);
  EXPECT_EQ(kvarn_cache_fork(cache_, 1, 3, -1), KVARN_ERR_CAPACITY);
  EXPECT_EQ(kvarn_cache_import_sequence(cache_, 3, blob.data(), n), KVARN_ERR_CAPACITY);
  const kvarn_cache_stats_t s1 = Stats(cache_);
  EXPECT_EQ(s1.sequences, s0.sequences);
  EXPECT_EQ(s1.pages, s0.pages);
  EXPECT_EQ(s1.records, s0.records);
  EXPECT_EQ(Decode(cache_, 1, 1, q), before);
  // No reference on a shared record was left behind: once the owners are gone, all is free.
  ASSERT_EQ(kvarn_cache_remove_sequence(cache_, 2), KVARN_OK);
  ASSERT_EQ(kvarn_cache_fork(cache_, 1, 3, -1), KVARN_OK);
  ASSERT_EQ(kvarn_cache_remove_sequence(cache_, 1), KVARN_OK);
  ASSERT_EQ(kvarn_cache_remove_sequence(cache_, 3), KVARN_OK);
  EXPECT_EQ(Stats(cache_).records, 0);
  EXPECT_EQ(Stats(cache_).pages, 0);
}

TEST_F(CacheTest, ExportImportRoundTripIsExact) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  const Tokens t = Random(333);
  AppendAll(cache_, 1, Slice(t, 0, 300), 150);
  AppendAll(cache_, 1, Slice(t, 300, 333), 33, KVARN_APPEND_SPECULATIVE);
  size_t need = 0;
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 1, nullptr, 0, &need), KVARN_OK);
  std::vector<uint8_t> blob(need);
  size_t small = 0;
  EXPECT_EQ(kvarn_cache_export_sequence(cache_, 1, blob.data(), need - 1, &small),
            KVARN_ERR_BUFFER_TOO_SMALL);
  EXPECT_EQ(small, need);
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 1, blob.data(), blob.size(), &need), KVARN_OK);
  kvarn_cache_t* other = nullptr;
  Make(&other);
  ASSERT_EQ(kvarn_cache_import_sequence(other, 5, blob.data(), blob.size()), KVARN_OK)
      << kvarn_last_error();
  const auto q = Query();
  for (int l = 0; l < opts_.num_layers; ++l)
    EXPECT_EQ(Decode(other, 5, l, q), Decode(cache_, 1, l, q));
  int64_t len = 0, committed = 0;
  ASSERT_EQ(kvarn_cache_sequence_length(other, 5, 0, &len, &committed), KVARN_OK);
  EXPECT_EQ(len, 333);
  EXPECT_EQ(committed, 300);
  EXPECT_EQ(kvarn_cache_import_sequence(other, 5, blob.data(), blob.size()),
            KVARN_ERR_ALREADY_EXISTS);
  kvarn_cache_destroy(other);
}

TEST_F(CacheTest, AnyTruncatedOrBitFlippedBlobIsRejected) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  AppendAll(cache_, 1, Random(150), 150);
  size_t n = 0;
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 1, nullptr, 0, &n), KVARN_OK);
  std::vector<uint8_t> blob(n);
  ASSERT_EQ(kvarn_cache_export_sequence(cache_, 1, blob.data(), n, &n), KVARN_OK);
  kvarn_cache_t* other = nullptr;
  Make(&other);
  const kvarn_cache_stats_t s0 = Stats(other);
  for (size_t len = 0; len < n; len += (len < 256 ? 1 : 997)) {
    ASSERT_EQ(kvarn_cache_import_sequence(other, 1, blob.data(), len), KVARN_ERR_CORRUPT_DATA)
        << "truncated to " << len;
  }
  std::uniform_int_distribution<size_t> pos(0, n * 8 - 1);
  for (int trial = 0; trial < 3000; ++trial) {
    // Every bit of the header, then random bits of the payload.
    const size_t bit = trial < 8 * 160 ? static_cast<size_t>(trial) : pos(rng_);
    std::vector<uint8_t> flipped = blob;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    ASSERT_EQ(kvarn_cache_import_sequence(other, 1, flipped.data(), n), KVARN_ERR_CORRUPT_DATA)
        << "bit " << bit;
  }
  const kvarn_cache_stats_t s1 = Stats(other);
  EXPECT_EQ(s1.sequences, s0.sequences);
  EXPECT_EQ(s1.pages, s0.pages);
  EXPECT_EQ(s1.records, s0.records);
  // A blob from a cache with another config is refused too.
  kvarn_cache_t* k4v4 = nullptr;
  kvarn_cache_options_t o = opts_;
  ASSERT_EQ(kvarn_config_from_preset("k4v4_g64", D_, &o.config), KVARN_OK);
  ASSERT_EQ(kvarn_cache_create(ctx_.ctx, &o, &k4v4), KVARN_OK);
  EXPECT_EQ(kvarn_cache_import_sequence(k4v4, 1, blob.data(), n), KVARN_ERR_CORRUPT_DATA);
  kvarn_cache_destroy(k4v4);
  kvarn_cache_destroy(other);
}

TEST_F(CacheTest, StatisticsReportCompression) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  AppendAll(cache_, 1, Random(64 * 40), 512);
  const kvarn_cache_stats_t s = Stats(cache_);
  EXPECT_EQ(s.tokens, 64 * 40 * opts_.num_layers);
  EXPECT_EQ(s.records, ExpectedRecords(64 * 40));
  EXPECT_GT(s.compression_ratio, 3.0);
  EXPECT_LT(s.compression_ratio, 256.0 / 27.0 + 1e-9);  // k4v2 D64 G64: 27 B/token/head
  EXPECT_GT(s.bytes_capacity, s.bytes_used);
}

TEST_F(CacheTest, ExtendAttentionSeesCausalPrefix) {
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  const Tokens t = Random(260);
  AppendAll(cache_, 1, t, 260);
  // Three query tokens at the end: query i sees keys < 260 - 3 + i + 1.
  std::vector<float> q(3 * kHq * D_);
  std::normal_distribution<float> nd;
  for (float& x : q) x = nd(rng_);
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = kHq;
  const int32_t indptr[2] = {0, 3};
  p.q_indptr = indptr;
  std::vector<float> out(q.size());
  int64_t id = 1;
  ASSERT_EQ(kvarn_cache_attention(cache_, 0, 1, &id, &p, q.data(), out.data(), nullptr), KVARN_OK)
      << kvarn_last_error();
  for (int i = 0; i < 3; ++i) {
    const size_t visible = 260 - 3 + i + 1;
    std::vector<float> qi(q.begin() + i * kHq * D_, q.begin() + (i + 1) * kHq * D_);
    std::vector<float> oi(out.begin() + i * kHq * D_, out.begin() + (i + 1) * kHq * D_);
    EXPECT_LE(RelL2(oi, Reference(Slice(t, 0, visible), 260, qi)), 1e-3) << "query " << i;
  }
}

TEST_F(CacheTest, BadArgumentsGiveStatusesAndChangeNothing) {
  const Tokens t = Random(10);
  int64_t id = 1;
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  p.num_q_heads = kHq;
  std::vector<float> q(kHq * D_, 1.f), out(kHq * D_, 3.f);
  kvarn_cache_stats_t st;
  st.size = sizeof st;
  size_t n = 0;
  // NULL handles.
  EXPECT_EQ(kvarn_cache_add_sequence(nullptr, 1), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_remove_sequence(nullptr, 1), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_fork(nullptr, 1, 2, -1), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_truncate(nullptr, 1, 0), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_append(nullptr, 1, 0, 1, KVARN_DTYPE_F32, t.k.data(), t.v.data(), 0),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_commit(nullptr, 1, 0), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_sequence_length(nullptr, 1, 0, &id, &id), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_attention(nullptr, 0, 1, &id, &p, q.data(), out.data(), nullptr),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_get_stats(nullptr, &st), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_export_sequence(nullptr, 1, nullptr, 0, &n), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_import_sequence(nullptr, 1, &n, 8), KVARN_ERR_INVALID_ARGUMENT);
  kvarn_cache_destroy(nullptr);  // no-op
  // Creation.
  kvarn_cache_t* c = nullptr;
  EXPECT_EQ(kvarn_cache_create(nullptr, &opts_, &c), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_create(ctx_.ctx, nullptr, &c), KVARN_ERR_INVALID_ARGUMENT);
  kvarn_cache_options_t o = opts_;
  o.size = 3;
  EXPECT_EQ(kvarn_cache_create(ctx_.ctx, &o, &c), KVARN_ERR_INVALID_ARGUMENT);
  o = opts_;
  o.num_layers = 0;
  EXPECT_EQ(kvarn_cache_create(ctx_.ctx, &o, &c), KVARN_ERR_INVALID_ARGUMENT);
  o = opts_;
  o.config.head_dim = 100;
  EXPECT_EQ(kvarn_cache_create(ctx_.ctx, &o, &c), KVARN_ERR_UNSUPPORTED);
  EXPECT_EQ(c, nullptr);
  // Unknown ids, layers, dtypes, flags, wrong struct sizes.
  EXPECT_EQ(Append(cache_, 99, 0, t), KVARN_ERR_NOT_FOUND);
  ASSERT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_OK);
  EXPECT_EQ(kvarn_cache_add_sequence(cache_, 1), KVARN_ERR_ALREADY_EXISTS);
  EXPECT_EQ(Append(cache_, 1, 2, t), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(Append(cache_, 1, -1, t), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_append(cache_, 1, 0, 10, static_cast<kvarn_dtype_t>(9), t.k.data(),
                               t.v.data(), 0),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_append(cache_, 1, 0, 10, KVARN_DTYPE_F32, t.k.data(), t.v.data(), 8u),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_append(cache_, 1, 0, 10, KVARN_DTYPE_F32, nullptr, t.v.data(), 0),
            KVARN_ERR_INVALID_ARGUMENT);
  // Attention on an empty sequence, a bad head count, unknown ids.
  EXPECT_EQ(kvarn_cache_attention(cache_, 0, 1, &id, &p, q.data(), out.data(), nullptr),
            KVARN_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(Append(cache_, 1, 0, t), KVARN_OK);
  p.num_q_heads = 7;
  EXPECT_EQ(kvarn_cache_attention(cache_, 0, 1, &id, &p, q.data(), out.data(), nullptr),
            KVARN_ERR_INVALID_ARGUMENT);
  p.num_q_heads = kHq;
  int64_t missing = 77;
  EXPECT_EQ(kvarn_cache_attention(cache_, 0, 1, &missing, &p, q.data(), out.data(), nullptr),
            KVARN_ERR_NOT_FOUND);
  EXPECT_EQ(kvarn_cache_attention(cache_, 0, 1, &id, &p, q.data(), nullptr, nullptr),
            KVARN_ERR_INVALID_ARGUMENT);
  for (float x : out) ASSERT_EQ(x, 3.f) << "output written by a failing call";
  // Commit beyond the length / below committed; truncate negative.
  EXPECT_EQ(kvarn_cache_commit(cache_, 1, 11), KVARN_ERR_INVALID_ARGUMENT);  // layer 1 is empty
  EXPECT_EQ(kvarn_cache_truncate(cache_, 1, -5), KVARN_ERR_INVALID_ARGUMENT);
  st.size = 1;
  EXPECT_EQ(kvarn_cache_get_stats(cache_, &st), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_export_sequence(cache_, 1, nullptr, 0, nullptr),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_cache_import_sequence(cache_, 2, nullptr, 10), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strlen(kvarn_last_error()), 0u);
  int64_t len = -1;
  ASSERT_EQ(kvarn_cache_sequence_length(cache_, 1, 0, &len, nullptr), KVARN_OK);
  EXPECT_EQ(len, 10);
  EXPECT_STREQ(kvarn_last_error(), "");
}

}  // namespace
