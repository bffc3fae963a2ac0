// Regression tests of issue 15 (fuzzing and fault injection): each test reproduces one defect
// found by the campaign and pins the fixed behaviour. Blobs and arrays that the library must not
// read past are placed right before an inaccessible page, so an over-read crashes in every build
// (not only under AddressSanitizer).
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "support/kvarn_test.h"

namespace {

// ---- helpers -------------------------------------------------------------------------------

// `bytes` bytes that end exactly at a PROT_NONE page.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    data_pages_ = (bytes + page - 1) / page * page;
    map_bytes_ = data_pages_ + page;
    void* m = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(m, MAP_FAILED);
    map_ = static_cast<uint8_t*>(m);
    EXPECT_EQ(mprotect(map_ + data_pages_, page, PROT_NONE), 0);
  }
  ~GuardedBuffer() { munmap(map_, map_bytes_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;
  uint8_t* data() { return map_ + data_pages_ - bytes_; }
  size_t size() const { return bytes_; }

 private:
  size_t bytes_, data_pages_ = 0, map_bytes_ = 0;
  uint8_t* map_ = nullptr;
};

uint32_t Crc32c(const uint8_t* p, size_t n) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0x82f63b78u : (crc >> 1);
  }
  return ~crc;
}

// Rewrites a blob's trailing CRC-32C so that it matches its contents (a CRC is not
// authentication: an attacker or a bug can always produce a matching one).
void Reseal(uint8_t* blob, size_t n) {
  const uint32_t crc = Crc32c(blob, n - 4);
  std::memcpy(blob + n - 4, &crc, 4);
}

// Blob header offsets (docs/FORMAT.md): magic 0, version 8, header_bytes 12, total_bytes 16,
// config 24..55, num_layers 56, num_kv_heads 60; then per layer {len i64, committed i64,
// record_tiles i32, page_tiles i32}.
constexpr size_t kHeader = 64;
constexpr size_t kLayerEntry = 24;

struct CacheDeleter {
  void operator()(kvarn_cache_t* c) const { kvarn_cache_destroy(c); }
};
using CachePtr = std::unique_ptr<kvarn_cache_t, CacheDeleter>;

// Two threads: the cache operations go through the thread pool.
kvt::ContextPtr CpuContext() { return kvt::MakeCpuContext(2); }

kvarn_cache_options_t SmallOptions(int layers, int hk) {
  kvarn_cache_options_t o;
  kvarn_cache_options_defaults(&o);
  EXPECT_EQ(kvarn_config_from_preset("k4v2_g64", 64, &o.config), KVARN_OK);
  o.num_layers = layers;
  o.num_kv_heads = hk;
  o.max_tokens = 64 * 16;
  o.max_sequences = 4;
  return o;
}

CachePtr MakeCache(kvarn_context_t* ctx, const kvarn_cache_options_t& o) {
  kvarn_cache_t* c = nullptr;
  EXPECT_EQ(kvarn_cache_create(ctx, &o, &c), KVARN_OK) << kvarn_last_error();
  return CachePtr(c);
}

std::vector<uint8_t> Export(kvarn_cache_t* c, int64_t id) {
  size_t n = 0;
  EXPECT_EQ(kvarn_cache_export_sequence(c, id, nullptr, 0, &n), KVARN_OK) << kvarn_last_error();
  std::vector<uint8_t> blob(n);
  EXPECT_EQ(kvarn_cache_export_sequence(c, id, blob.data(), n, &n), KVARN_OK);
  return blob;
}

// Appends n deterministic tokens ([n][hk][64] fp32) to every layer of `id`.
void AppendTokens(kvarn_cache_t* c, int64_t id, int layers, int hk, size_t n) {
  std::vector<float> k(n * hk * 64), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>((i * 7919) % 113) / 50.f - 1.f;
    v[i] = static_cast<float>((i * 104729) % 97) / 40.f - 1.f;
  }
  for (int l = 0; l < layers; ++l) {
    ASSERT_EQ(kvarn_cache_append(c, id, l, n, KVARN_DTYPE_F32, k.data(), v.data(), 0), KVARN_OK)
        << kvarn_last_error();
  }
}

// ---- defect 1: import of a blob shorter than its own header ---------------------------------

TEST(ImportShortBlob, HeaderLongerThanBlobIsCorruptNotAnOverRead) {
  kvt::ContextPtr ctx = CpuContext();
  const kvarn_cache_options_t o = SmallOptions(2, 2);
  CachePtr cache = MakeCache(ctx.get(), o);
  ASSERT_EQ(kvarn_cache_add_sequence(cache.get(), 1), KVARN_OK);
  const std::vector<uint8_t> real = Export(cache.get(), 1);
  ASSERT_GT(real.size(), kHeader + 2 * kLayerEntry);
  // 69 bytes: a valid header (header_bytes says 64 + 2 * 24) and 1 byte of its layer table,
  // with total_bytes and the CRC made consistent.
  GuardedBuffer blob(69);
  std::memcpy(blob.data(), real.data(), 65);
  const uint64_t total = 69;
  std::memcpy(blob.data() + 16, &total, 8);
  Reseal(blob.data(), blob.size());
  EXPECT_EQ(kvarn_cache_import_sequence(cache.get(), 2, blob.data(), blob.size()),
            KVARN_ERR_CORRUPT_DATA);
  kvarn_cache_stats_t st;
  st.size = sizeof st;
  ASSERT_EQ(kvarn_cache_get_stats(cache.get(), &st), KVARN_OK);
  EXPECT_EQ(st.sequences, 1);
}

// ---- defect 2: the import size check in 32-bit arithmetic -----------------------------------

TEST(ImportSizeCheck, RecordTileCountTimesHeadsDoesNotWrap) {
  kvt::ContextPtr ctx = CpuContext();
  kvarn_cache_options_t o = SmallOptions(1, 256);
  o.max_sequences = 1;
  CachePtr cache = MakeCache(ctx.get(), o);
  ASSERT_EQ(kvarn_cache_add_sequence(cache.get(), 1), KVARN_OK);
  std::vector<uint8_t> head = Export(cache.get(), 1);  // empty sequence: header + 1 layer entry
  ASSERT_EQ(head.size(), kHeader + kLayerEntry + 4);
  ASSERT_EQ(kvarn_cache_remove_sequence(cache.get(), 1), KVARN_OK);
  // Claims 2^24 record tiles: 2^24 * 256 heads wraps to 0 in 32 bits, so a wrapped check
  // expects only the sink page, which is all the blob holds.
  const size_t page_bytes = size_t{256} * 64 * 64 * 2;
  const size_t n = kHeader + kLayerEntry + 2 * page_bytes + 4;
  GuardedBuffer blob(n);
  std::memset(blob.data(), 0, n);
  std::memcpy(blob.data(), head.data(), kHeader);
  const uint64_t total = n;
  std::memcpy(blob.data() + 16, &total, 8);
  const int64_t len = (int64_t{1} << 24) * 64 + 64;
  const int32_t record_tiles = 1 << 24, page_tiles = 1;
  std::memcpy(blob.data() + kHeader, &len, 8);
  std::memcpy(blob.data() + kHeader + 8, &len, 8);
  std::memcpy(blob.data() + kHeader + 16, &record_tiles, 4);
  std::memcpy(blob.data() + kHeader + 20, &page_tiles, 4);
  Reseal(blob.data(), n);
  EXPECT_EQ(kvarn_cache_import_sequence(cache.get(), 2, blob.data(), n), KVARN_ERR_CORRUPT_DATA);
  kvarn_cache_stats_t st;
  st.size = sizeof st;
  ASSERT_EQ(kvarn_cache_get_stats(cache.get(), &st), KVARN_OK);
  EXPECT_EQ(st.sequences, 0);
  EXPECT_EQ(st.records, 0);
  EXPECT_EQ(st.pages, 0);
}

// ---- defect 7: size arithmetic that wraps ------------------------------------------------------

TEST(SizeArithmetic, CacheMaxTokensNearInt64MaxIsRefused) {
  kvt::ContextPtr ctx = CpuContext();
  for (int64_t max_tokens : {INT64_MAX, INT64_MAX - 1, INT64_MAX - 62}) {
    kvarn_cache_options_t o = SmallOptions(1, 2);
    o.max_tokens = max_tokens;
    kvarn_cache_t* c = nullptr;
    const kvarn_status_t s = kvarn_cache_create(ctx.get(), &o, &c);
    EXPECT_EQ(s, KVARN_ERR_CAPACITY) << max_tokens << ": " << kvarn_last_error();
    if (s == KVARN_OK) kvarn_cache_destroy(c);
  }
}

// A paged-KV view over one page whose block table maps every tile to page 0.
struct FakePaged {
  std::vector<int32_t> table, lens, rts;
  std::vector<uint16_t> pages;
  kvarn_paged_kv_t kv;
  FakePaged(int32_t hk, int32_t max_blocks, std::vector<int32_t> seq_lens) {
    table.assign(static_cast<size_t>(max_blocks) * 1, 0);
    lens = std::move(seq_lens);
    rts.assign(lens.size(), 0);
    pages.assign(64, 0);
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = hk;
    kv.batch = static_cast<int32_t>(lens.size());
    kv.k_pages = pages.data();
    kv.v_pages = pages.data();
    kv.num_pages = 1;
    kv.block_table = table.data();
    kv.max_blocks_per_seq = max_blocks;
    kv.seq_lens = lens.data();
    kv.record_tiles = rts.data();
  }
};

TEST(SizeArithmetic, PagedAppendStagingSizeDoesNotWrap) {
  kvt::ContextPtr ctx = CpuContext();
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", 512, &cfg), KVARN_OK);
  // 2^25 tokens * 2^30 heads * 512 channels = 2^64: wraps to 0 in size_t.
  const int32_t total = 1 << 25;
  FakePaged p(1 << 30, total / 128, {0});
  const int32_t indptr[2] = {0, total};
  std::vector<float> k(512), v(512);
  EXPECT_EQ(kvarn_paged_append(ctx.get(), &cfg, &p.kv, indptr, KVARN_DTYPE_F32, k.data(), v.data()),
            KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
}

TEST(SizeArithmetic, PagedAttentionQuerySizeDoesNotWrap) {
  kvt::ContextPtr ctx = CpuContext();
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", 512, &cfg), KVARN_OK);
  // 2^25 query tokens * 2^30 query heads * 512 = 2^64.
  const int32_t total_q = 1 << 25;
  FakePaged p(1 << 30, total_q / 128, {total_q});
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = 1 << 30;
  const int32_t q_indptr[2] = {0, total_q};
  ap.q_indptr = q_indptr;
  std::vector<float> q(512), out(512);
  EXPECT_EQ(
      kvarn_paged_attention(ctx.get(), &cfg, &p.kv, &ap, q.data(), out.data(), nullptr, nullptr, 0),
      KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
}

TEST(SizeArithmetic, SeqLenInt32MaxDoesNotOverflow) {
  // seq_lens[0] = INT32_MAX: the tile count (N + G - 1) / G must not overflow in int. The
  // second sequence fails the call (a negative length) before any attention runs.
  kvt::ContextPtr ctx = CpuContext();
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", 64, &cfg), KVARN_OK);
  const int32_t blocks = static_cast<int32_t>((int64_t{INT32_MAX} + 127) / 128);
  FakePaged p(1, blocks, {INT32_MAX, -1});  // row 1 is never read: its length is refused
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = 1;
  const int32_t q_indptr[3] = {0, 1, 2};
  ap.q_indptr = q_indptr;
  std::vector<float> q(2 * 64), out(2 * 64);
  EXPECT_EQ(
      kvarn_paged_attention(ctx.get(), &cfg, &p.kv, &ap, q.data(), out.data(), nullptr, nullptr, 0),
      KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
}

TEST(SizeArithmetic, PagedFlushHugeTileCountIsAnArgumentError) {
  // n_tiles whose id lists (n_tiles int32 each) cannot exist: refused before any is read.
  kvt::ContextPtr ctx = CpuContext();
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g64", 64, &cfg), KVARN_OK);
  FakePaged p(1, 1, {0});
  std::vector<uint8_t> records(1 << 16);
  p.kv.records = records.data();
  p.kv.record_stride = 4096;
  p.kv.num_record_blocks = 1;
  GuardedBuffer ids(2 * sizeof(int32_t));
  std::memset(ids.data(), 0, ids.size());
  const int32_t* src = reinterpret_cast<const int32_t*>(ids.data());
  EXPECT_EQ(kvarn_paged_flush(ctx.get(), &cfg, &p.kv, size_t{1} << 62, src, src + 1),
            KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
}

TEST(SizeArithmetic, QuantizeHugeTileCountIsAnArgumentError) {
  kvt::ContextPtr ctx = CpuContext();
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", 128, &cfg), KVARN_OK);
  size_t rb = 0;
  ASSERT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  std::vector<float> k(128 * 128), v(k.size());
  std::vector<uint8_t> rec(rb);
  const size_t n_tiles = size_t{1} << 55;
  EXPECT_EQ(kvarn_quantize(ctx.get(), &cfg, n_tiles, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                           rec.data(), rb),
            KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
  EXPECT_EQ(kvarn_dequantize(ctx.get(), &cfg, n_tiles, rec.data(), rb, 0, KVARN_DTYPE_F32, k.data(),
                             v.data()),
            KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
  EXPECT_EQ(
      kvarn_rotate(ctx.get(), 128, n_tiles, KVARN_DTYPE_F32, k.data(), KVARN_DTYPE_F32, v.data()),
      KVARN_ERR_INVALID_ARGUMENT)
      << kvarn_last_error();
}

// ---- defect 8: import applies append's value rules ------------------------------------------

class ImportValues : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = CpuContext();
    opts_ = SmallOptions(1, 2);
    cache_ = MakeCache(ctx_.get(), opts_);
    ASSERT_EQ(kvarn_cache_add_sequence(cache_.get(), 1), KVARN_OK);
    // 64 sink + 64 record + 10 tail tokens.
    AppendTokens(cache_.get(), 1, 1, 2, 138);
    blob_ = Export(cache_.get(), 1);
    ASSERT_EQ(kvarn_cache_import_sequence(cache_.get(), 2, blob_.data(), blob_.size()), KVARN_OK)
        << kvarn_last_error();
    ASSERT_EQ(kvarn_cache_remove_sequence(cache_.get(), 2), KVARN_OK);
    size_t rb = 0;
    ASSERT_EQ(kvarn_record_bytes(&opts_.config, &rb), KVARN_OK);
    records_ = kHeader + kLayerEntry;
    pages_ = records_ + 2 * rb;  // one record tile, two heads
  }
  // Offset of half (head h, token t, channel d) of fp16 tile `tile_index` (0 = sink, 1 = tail)
  // in the K (which = 0) or V (which = 1) page.
  size_t Half(int tile_index, int which, int h, int t, int d) const {
    const size_t page_bytes = size_t{2} * 64 * 64 * 2;
    return pages_ + (static_cast<size_t>(tile_index) * 2 + which) * page_bytes +
           ((static_cast<size_t>(h) * 64 + t) * 64 + d) * 2;
  }
  kvarn_status_t ImportPatched(size_t off, uint16_t value) {
    std::vector<uint8_t> b = blob_;
    std::memcpy(b.data() + off, &value, 2);
    Reseal(b.data(), b.size());
    return kvarn_cache_import_sequence(cache_.get(), 3, b.data(), b.size());
  }
  kvt::ContextPtr ctx_;
  kvarn_cache_options_t opts_;
  CachePtr cache_;
  std::vector<uint8_t> blob_;
  size_t records_ = 0, pages_ = 0;
};

TEST_F(ImportValues, NonFinitePageValuesAreCorrupt) {
  for (uint16_t bad : {uint16_t{0x7c00}, uint16_t{0xfc00}, uint16_t{0x7e00}}) {
    EXPECT_EQ(ImportPatched(Half(0, 0, 1, 5, 3), bad), KVARN_ERR_CORRUPT_DATA) << bad;
    EXPECT_EQ(ImportPatched(Half(1, 1, 0, 9, 63), bad), KVARN_ERR_CORRUPT_DATA) << bad;
  }
  EXPECT_EQ(ImportPatched(Half(1, 0, 0, 0, 0), 0x3c00), KVARN_OK);  // a finite value is data
}

TEST_F(ImportValues, BytesPastTheSequenceEndAreCorrupt) {
  // The tail tile holds 10 tokens: token 10.. of every head must be zero, as Export writes.
  EXPECT_EQ(ImportPatched(Half(1, 0, 0, 10, 0), 0x3c00), KVARN_ERR_CORRUPT_DATA);
  EXPECT_EQ(ImportPatched(Half(1, 1, 1, 63, 63), 0x0001), KVARN_ERR_CORRUPT_DATA);
}

TEST_F(ImportValues, NonFiniteRecordScalesAreCorrupt) {
  size_t off = 0, bytes = 0;
  ASSERT_EQ(kvarn_record_field(&opts_.config, KVARN_FIELD_K_SCALE, &off, &bytes), KVARN_OK);
  EXPECT_EQ(ImportPatched(records_ + off + 4, 0x7c00), KVARN_ERR_CORRUPT_DATA);
  ASSERT_EQ(kvarn_record_field(&opts_.config, KVARN_FIELD_V_ZERO, &off, &bytes), KVARN_OK);
  EXPECT_EQ(ImportPatched(records_ + off, 0xfe00), KVARN_ERR_CORRUPT_DATA);
}

// ---- defect 9: what the header now documents --------------------------------------------------

TEST(Documented, DequantizeOfNonFiniteScalesGivesNonFiniteOutputsAndOk) {
  kvt::ContextPtr ctx = CpuContext();
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g64", 64, &cfg), KVARN_OK);
  size_t rb = 0, off = 0, bytes = 0;
  ASSERT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  std::vector<float> k(64 * 64), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = static_cast<float>(i % 13) - 6.f;
    v[i] = static_cast<float>(i % 7) - 3.f;
  }
  std::vector<uint8_t> rec(rb);
  ASSERT_EQ(
      kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(), 0, rec.data(), rb),
      KVARN_OK);
  ASSERT_EQ(kvarn_record_field(&cfg, KVARN_FIELD_K_SCALE, &off, &bytes), KVARN_OK);
  const uint16_t inf = 0x7c00;
  std::memcpy(rec.data() + off, &inf, 2);
  std::vector<float> ko(k.size()), vo(v.size());
  ASSERT_EQ(kvarn_dequantize(ctx.get(), &cfg, 1, rec.data(), rb, 0, KVARN_DTYPE_F32, ko.data(),
                             vo.data()),
            KVARN_OK);
  size_t non_finite_k = 0, non_finite_v = 0;
  for (float x : ko) non_finite_k += !std::isfinite(x);
  for (float x : vo) non_finite_v += !std::isfinite(x);
  EXPECT_EQ(non_finite_k, ko.size());  // every row mixes channel 0 back in when un-rotated
  EXPECT_EQ(non_finite_v, 0u);
}

TEST(CacheCapacity, MaxTokensSizesTheRecordPoolOnly) {
  // max_tokens = 1 gives one record block per layer; sink and tail tiles live in the page pool
  // (max_sequences * (sink_tiles + 2) pages), so 64 sink + 64 record + 63 tail = 191 tokens fit
  // and the 192nd, which completes a second record tile, is refused with CAPACITY.
  kvt::ContextPtr ctx = CpuContext();
  kvarn_cache_options_t o = SmallOptions(1, 2);
  o.max_tokens = 1;
  o.max_sequences = 1;
  CachePtr cache = MakeCache(ctx.get(), o);
  ASSERT_EQ(kvarn_cache_add_sequence(cache.get(), 1), KVARN_OK);
  AppendTokens(cache.get(), 1, 1, 2, 191);
  std::vector<float> k(2 * 64, 0.5f), v(k.size(), 0.25f);
  EXPECT_EQ(kvarn_cache_append(cache.get(), 1, 0, 1, KVARN_DTYPE_F32, k.data(), v.data(), 0),
            KVARN_ERR_CAPACITY);
  int64_t tokens = 0;
  ASSERT_EQ(kvarn_cache_sequence_length(cache.get(), 1, 0, &tokens, nullptr), KVARN_OK);
  EXPECT_EQ(tokens, 191);
}

}  // namespace
