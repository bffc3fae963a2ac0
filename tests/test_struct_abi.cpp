// The growable-struct rule (kvarn.h top comment, docs/API.md "Growable structs",
// core/abi_struct.h): for every public struct, a smaller size gives the defaults for the missing
// tail, sizeof is the plain case, a larger size with a zero tail is accepted with the same
// result, a larger size with a non-zero tail is refused with KVARN_ERR_UNSUPPORTED and changes
// nothing, and a size of 0 is refused. Smaller structs are placed right before a PROT_NONE page,
// so a library that read or wrote past `size` would crash the test instead of passing it.
//
// White-box (the static twin): it also tests ReadStruct / WriteStruct on synthetic structs.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/abi_struct.h"
#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/kvarn_test.h"
#include "support/rng.h"

namespace {

using kvt::IsError;

constexpr unsigned char kPoison = 0xA5;

// `bytes` bytes of a struct that ends right before an inaccessible page. The first
// min(bytes, sizeof(T)) bytes are copied from `value`; up to the next multiple of 8 (for
// alignment) the bytes are kPoison. size is set to `bytes`.
template <typename T>
class Guarded {
 public:
  Guarded(const T& value, size_t bytes) : bytes_(bytes) {
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t span = (bytes + 7) / 8 * 8;
    map_ = static_cast<unsigned char*>(
        mmap(nullptr, 2 * page_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    EXPECT_NE(map_, MAP_FAILED);
    EXPECT_EQ(mprotect(map_ + page_, page_, PROT_NONE), 0);
    p_ = map_ + page_ - span;
    std::memset(p_, kPoison, span);
    std::memcpy(p_, &value, bytes < sizeof(T) ? bytes : sizeof(T));
    std::memcpy(p_, &bytes, sizeof bytes);
  }
  ~Guarded() { munmap(map_, 2 * page_); }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;

  T* get() { return reinterpret_cast<T*>(p_); }
  unsigned char* bytes() { return p_; }

 private:
  size_t bytes_;
  size_t page_ = 0;
  unsigned char* map_ = nullptr;
  unsigned char* p_ = nullptr;
};

// A struct followed by `extra` bytes (a caller built with a newer, larger header): the first
// sizeof(T) bytes are `value`, the tail is `tail_byte` everywhere, size is sizeof(T) + extra.
template <typename T>
class Larger {
 public:
  Larger(const T& value, size_t extra, unsigned char tail_byte)
      : buf_((sizeof(T) + extra + 7) / 8 + 1) {
    unsigned char* p = bytes();
    std::memcpy(p, &value, sizeof(T));
    std::memset(p + sizeof(T), tail_byte, extra);
    const size_t size = sizeof(T) + extra;
    std::memcpy(p, &size, sizeof size);
  }
  // Sets one byte of the tail (0 = the first byte past sizeof(T)).
  void SetTail(size_t i, unsigned char b) { bytes()[sizeof(T) + i] = b; }
  T* get() { return reinterpret_cast<T*>(buf_.data()); }
  unsigned char* bytes() { return reinterpret_cast<unsigned char*>(buf_.data()); }

 private:
  std::vector<uint64_t> buf_;
};

#define FIELD_END(T, f) (offsetof(T, f) + sizeof(T::f))

int32_t Threads(kvarn_context_t* c) {
  int32_t n = -1;
  EXPECT_EQ(kvarn_context_get_num_threads(c, &n), KVARN_OK) << kvarn_last_error();
  return n;
}

int32_t Device(kvarn_context_t* c) {
  int32_t n = -1;
  EXPECT_EQ(kvarn_context_get_device(c, &n), KVARN_OK) << kvarn_last_error();
  return n;
}

// ---- the descriptions in core/abi_struct.h -----------------------------------------------------

// Fields in order, not overlapping, inside sizeof, and only alignment padding between them and
// after the last one: a field missing from a description shows up as a gap.
template <typename T>
void CheckDescription(size_t max_gap) {
  ASSERT_TRUE(kvarn::AbiDescribed<T>());
  size_t end = sizeof(size_t);
  for (const kvarn::AbiField& f : kvarn::AbiStruct<T>::kFields) {
    EXPECT_GE(f.offset, end);
    EXPECT_LT(f.offset - end, 8u);
    EXPECT_LE(f.offset - end, max_gap);
    end = f.offset + f.bytes;
  }
  EXPECT_LE(end, sizeof(T));
  EXPECT_EQ((end + alignof(T) - 1) / alignof(T) * alignof(T), sizeof(T));
  EXPECT_EQ(kvarn::AbiFieldsEnd<T>(), end);
}

TEST(StructAbi, EveryPublicStructIsDescribed) {
  // max_gap: the padding the layout really has before a field (4 after a lone int32 that
  // precedes a pointer), 0 where every field follows the previous one directly.
  CheckDescription<kvarn_context_options_t>(4);
  CheckDescription<kvarn_config_t>(0);
  CheckDescription<kvarn_paged_kv_t>(4);
  CheckDescription<kvarn_attention_params_t>(4);
  CheckDescription<kvarn_cache_options_t>(0);
  CheckDescription<kvarn_launch_t>(0);
  CheckDescription<kvarn_attention_shape_t>(0);
  CheckDescription<kvarn_backend_info_t>(4);
  CheckDescription<kvarn_cache_stats_t>(0);
  CheckDescription<kvarn_tail_state_t>(0);  // kvarn_experimental.h
  EXPECT_EQ(kvarn::AbiStruct<kvarn_cache_options_t>::kMinSize,
            offsetof(kvarn_cache_options_t, config) + sizeof(kvarn_config_t));
}

// ---- ReadStruct / WriteStruct on a synthetic struct --------------------------------------------

struct Demo {
  size_t size;
  int32_t a;  // 8..12
  int16_t b;  // 12..14
  int16_t c;  // 14..16
  int64_t d;  // 16..24
  uint8_t e;  // 24..25, then 7 bytes of padding
};

struct Undescribed {
  size_t size;
  int32_t a;
  int32_t b;
};

}  // namespace

namespace kvarn {
template <>
struct AbiStruct<Demo> {
  static constexpr size_t kMinSize = 12;
  static constexpr AbiField kFields[] = {KVARN_ABI_FIELD(Demo, a), KVARN_ABI_FIELD(Demo, b),
                                         KVARN_ABI_FIELD(Demo, c), KVARN_ABI_FIELD(Demo, d),
                                         KVARN_ABI_FIELD(Demo, e)};
};
}  // namespace kvarn

namespace {

Demo DemoDefaults() { return Demo{sizeof(Demo), 1, 2, 3, 4, 5}; }
Demo DemoCaller() { return Demo{sizeof(Demo), 10, 20, 30, 40, 50}; }

TEST(ReadStruct, SmallerSizeKeepsDefaultsOfTheTail) {
  for (size_t size : {size_t{12}, size_t{14}, size_t{16}, size_t{24}, size_t{25}, sizeof(Demo)}) {
    Guarded<Demo> in(DemoCaller(), size);
    Demo out = DemoDefaults();
    ASSERT_TRUE(kvarn::ReadStruct(in.get(), "demo", &out).ok()) << size;
    EXPECT_EQ(out.size, sizeof(Demo));
    EXPECT_EQ(out.a, 10);
    EXPECT_EQ(out.b, size >= 14 ? 20 : 2) << size;
    EXPECT_EQ(out.c, size >= 16 ? 30 : 3) << size;
    EXPECT_EQ(out.d, size >= 24 ? 40 : 4) << size;
    EXPECT_EQ(out.e, size >= 25 ? 50 : 5) << size;
  }
}

TEST(ReadStruct, SizeInsideAFieldRoundsDownToTheFieldStart) {
  // 13 cuts b, 20 cuts d: the cut field keeps its default (no mix of caller and default bytes).
  Guarded<Demo> in13(DemoCaller(), 13);
  Demo out = DemoDefaults();
  ASSERT_TRUE(kvarn::ReadStruct(in13.get(), "demo", &out).ok());
  EXPECT_EQ(out.a, 10);
  EXPECT_EQ(out.b, 2);
  Guarded<Demo> in20(DemoCaller(), 20);
  out = DemoDefaults();
  ASSERT_TRUE(kvarn::ReadStruct(in20.get(), "demo", &out).ok());
  EXPECT_EQ(out.c, 30);
  EXPECT_EQ(out.d, 4);
}

TEST(ReadStruct, RefusesSizesOutsideTheRange) {
  for (size_t size : {size_t{0}, size_t{7}, size_t{8}, size_t{11}, size_t{4097}, ~size_t{0}}) {
    Demo in = DemoCaller();
    in.size = size;
    Demo out = DemoDefaults();
    const kvarn::Status st = kvarn::ReadStruct(&in, "demo", &out);
    EXPECT_EQ(st.code(), KVARN_ERR_INVALID_ARGUMENT) << size;
    EXPECT_NE(st.message().find("demo->size"), std::string::npos) << st.message();
    EXPECT_EQ(out.a, 1);
  }
  Demo out = DemoDefaults();
  EXPECT_EQ(kvarn::ReadStruct<Demo>(nullptr, "demo", &out).code(), KVARN_ERR_INVALID_ARGUMENT);
}

TEST(ReadStruct, LargerSizeNeedsAZeroTail) {
  Larger<Demo> zero(DemoCaller(), 4096 - sizeof(Demo), 0);
  Demo out = DemoDefaults();
  ASSERT_TRUE(kvarn::ReadStruct(zero.get(), "demo", &out).ok());
  EXPECT_EQ(out.size, sizeof(Demo));
  EXPECT_EQ(out.e, 50);
  // This library's own trailing padding (bytes 25..32) is not read.
  Larger<Demo> padded(DemoCaller(), 8, 0);
  std::memset(padded.bytes() + 25, 0xEE, 7);
  ASSERT_TRUE(kvarn::ReadStruct(padded.get(), "demo", &out).ok());
  for (size_t i : {size_t{0}, size_t{5}, size_t{4095 - sizeof(Demo)}}) {
    Larger<Demo> big(DemoCaller(), 4096 - sizeof(Demo), 0);
    big.SetTail(i, 1);
    out = DemoDefaults();
    const kvarn::Status st = kvarn::ReadStruct(big.get(), "demo", &out);
    EXPECT_EQ(st.code(), KVARN_ERR_UNSUPPORTED) << i;
    EXPECT_NE(st.message().find("byte " + std::to_string(sizeof(Demo) + i)), std::string::npos)
        << st.message();
    EXPECT_EQ(out.a, 1);
    EXPECT_EQ(out.e, 5);
  }
}

TEST(ReadStruct, UndescribedStructsAreReadByteByByte) {
  static_assert(!kvarn::AbiDescribed<Undescribed>(), "no description");
  Guarded<Undescribed> in(Undescribed{sizeof(Undescribed), 0x11111111, 0x22222222}, 14);
  Undescribed out{sizeof(Undescribed), 0, 0};
  ASSERT_TRUE(kvarn::ReadStruct(in.get(), "u", &out).ok());
  EXPECT_EQ(out.a, 0x11111111);
  EXPECT_EQ(out.b, 0x00002222);  // bytes 12, 13 from the caller (little-endian), 14, 15 kept
}

TEST(WriteStruct, WritesTheFieldsThatFitAndZeroesTheRest) {
  const Demo value = DemoCaller();
  for (size_t size : {size_t{12}, size_t{13}, size_t{20}, size_t{25}, size_t{29}}) {
    Guarded<Demo> out(DemoDefaults(), size);
    ASSERT_TRUE(kvarn::WriteStruct(value, "demo", out.get()).ok()) << size;
    Demo seen;
    std::memset(&seen, 0, sizeof seen);
    std::memcpy(&seen, out.bytes(), size);
    EXPECT_EQ(seen.size, size);
    EXPECT_EQ(seen.a, 10);
    EXPECT_EQ(seen.b, size >= 14 ? 20 : 0) << size;
    EXPECT_EQ(seen.d, size >= 24 ? 40 : 0) << size;
    EXPECT_EQ(seen.e, size >= 25 ? 50 : 0) << size;
    for (size_t i = 25; i < size; ++i) EXPECT_EQ(out.bytes()[i], 0) << "padding byte " << i;
  }
  Larger<Demo> big(DemoDefaults(), 64, kPoison);
  ASSERT_TRUE(kvarn::WriteStruct(value, "demo", big.get()).ok());
  EXPECT_EQ(big.get()->size, sizeof(Demo) + 64);
  EXPECT_EQ(big.get()->e, 50);
  for (size_t i = sizeof(Demo); i < sizeof(Demo) + 64; ++i) EXPECT_EQ(big.bytes()[i], 0) << i;
  for (size_t size : {size_t{0}, size_t{11}, size_t{4097}}) {
    Demo out = DemoDefaults();
    out.size = size;
    EXPECT_EQ(kvarn::WriteStruct(value, "demo", &out).code(), KVARN_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(out.a, 1);
  }
}

// ---- kvarn_context_options_t -------------------------------------------------------------------

kvarn_context_options_t CpuOptions(int32_t threads) {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  o.num_threads = threads;
  return o;
}

int32_t DefaultThreads() {
  kvt::ContextPtr c = kvt::MakeCpuContext(0);
  return Threads(c.get());
}

TEST(StructAbiContextOptions, SizeCutAfterBackendGivesDefaultDeviceAndThreads) {
  const int32_t default_threads = DefaultThreads();
  ASSERT_NE(default_threads, 3);
  kvarn_context_options_t o = CpuOptions(3);
  o.device = 9;  // in the caller's memory past size: must not be read
  Guarded<kvarn_context_options_t> cut(o, FIELD_END(kvarn_context_options_t, backend));
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(cut.get(), &ctx), KVARN_OK) << kvarn_last_error();
  kvt::ContextPtr hold(ctx);
  kvarn_backend_t b = KVARN_BACKEND_AUTO;
  ASSERT_EQ(kvarn_context_get_backend(ctx, &b), KVARN_OK);
  EXPECT_EQ(b, KVARN_BACKEND_CPU);
  EXPECT_EQ(Device(ctx), 0);
  EXPECT_EQ(Threads(ctx), default_threads);

  // The backend inside the size is read: an unknown value is refused.
  o.backend = static_cast<kvarn_backend_t>(77);
  Guarded<kvarn_context_options_t> bad(o, FIELD_END(kvarn_context_options_t, backend));
  kvarn_context_t* none = nullptr;
  EXPECT_TRUE(
      IsError(kvarn_context_create(bad.get(), &none), KVARN_ERR_INVALID_ARGUMENT, "backend"));
  EXPECT_EQ(none, nullptr);
}

TEST(StructAbiContextOptions, SizeCutBeforeNumThreadsUsesTheDefault) {
  const int32_t default_threads = DefaultThreads();
  Guarded<kvarn_context_options_t> cut(CpuOptions(3),
                                       offsetof(kvarn_context_options_t, num_threads));
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(cut.get(), &ctx), KVARN_OK) << kvarn_last_error();
  kvt::ContextPtr hold(ctx);
  EXPECT_EQ(Threads(ctx), default_threads);
}

TEST(StructAbiContextOptions, ExactAndLargerWithZeroTailAreTheSame) {
  kvarn_context_options_t o = CpuOptions(3);
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(&o, &ctx), KVARN_OK) << kvarn_last_error();
  kvt::ContextPtr a(ctx);
  EXPECT_EQ(Threads(ctx), 3);
  Larger<kvarn_context_options_t> big(o, 24, 0);
  ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(big.get(), &ctx), KVARN_OK) << kvarn_last_error();
  kvt::ContextPtr b(ctx);
  EXPECT_EQ(Threads(ctx), 3);
}

TEST(StructAbiContextOptions, LargerWithNonZeroTailAndSizeZeroAreRefused) {
  Larger<kvarn_context_options_t> big(CpuOptions(3), 24, 0);
  big.SetTail(23, 1);
  kvarn_context_t* const sentinel = reinterpret_cast<kvarn_context_t*>(0x5678);
  kvarn_context_t* ctx = sentinel;
  EXPECT_TRUE(IsError(kvarn_context_create(big.get(), &ctx), KVARN_ERR_UNSUPPORTED, "size"));
  EXPECT_EQ(ctx, sentinel);
  kvarn_context_options_t zero = CpuOptions(3);
  zero.size = 0;
  EXPECT_TRUE(IsError(kvarn_context_create(&zero, &ctx), KVARN_ERR_INVALID_ARGUMENT, "size"));
  EXPECT_EQ(ctx, sentinel);
}

// ---- kvarn_config_t ----------------------------------------------------------------------------

size_t RecordBytesOf(const kvarn_config_t* c) {
  size_t n = 0;
  EXPECT_EQ(kvarn_record_bytes(c, &n), KVARN_OK) << kvarn_last_error();
  return n;
}

TEST(StructAbiConfig, SizeCutBeforeValueBitsUsesTheDefaultBits) {
  const kvarn_config_t k8v8 = kvt::PresetConfig("k8v8_g128", 128);
  const kvarn_config_t k8v2 = kvt::PresetConfig("k8v2_g128", 128);
  ASSERT_NE(RecordBytesOf(&k8v8), RecordBytesOf(&k8v2));
  Guarded<kvarn_config_t> cut(k8v8, offsetof(kvarn_config_t, value_bits));
  EXPECT_EQ(RecordBytesOf(cut.get()), RecordBytesOf(&k8v2));  // value_bits: default 2
  Guarded<kvarn_config_t> whole(k8v8, sizeof(kvarn_config_t));
  EXPECT_EQ(RecordBytesOf(whole.get()), RecordBytesOf(&k8v8));
}

TEST(StructAbiConfig, SizeCutBeforeFlagsIgnoresTheFlagsInMemory) {
  kvarn_config_t c = kvt::MakeConfig(128, 128, 4, 2);
  c.key_flags = 0x80;  // unknown bits: refused when read
  EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "flags"));
  Guarded<kvarn_config_t> cut(c, offsetof(kvarn_config_t, key_flags));
  EXPECT_EQ(kvarn_config_validate(cut.get()), KVARN_OK) << kvarn_last_error();
}

TEST(StructAbiConfig, SizeOfOnlyTheSizeFieldIsTheDefaultConfig) {
  kvarn_config_t d;
  kvarn_config_defaults(&d);
  Guarded<kvarn_config_t> only(kvt::MakeConfig(64, 64, 8, 8), sizeof(size_t));
  EXPECT_EQ(RecordBytesOf(only.get()), RecordBytesOf(&d));
}

TEST(StructAbiConfig, QuantizeWithACutConfigMatchesTheDefaultTail) {
  // A config cut before iterations quantizes like the same config with iterations 8 and one
  // sink tile (the defaults), not like the iterations = 0 in memory.
  kvt::ContextPtr ctx = kvt::MakeCpuContext(1);
  kvarn_config_t mem = kvt::MakeConfig(64, 64, 4, 2, /*iterations=*/0, /*sink_tiles=*/0);
  const kvarn_config_t want = kvt::MakeConfig(64, 64, 4, 2, 8, 1);
  const kvarn_config_t other = kvt::MakeConfig(64, 64, 4, 2, 0, 0);
  Guarded<kvarn_config_t> cut(mem, offsetof(kvarn_config_t, iterations));
  KVT_SEEDED_RNG(rng, 7);
  std::vector<float> k(64 * 64), v(64 * 64);
  for (float& x : k) x = static_cast<float>(rng.Normal());
  for (float& x : v) x = static_cast<float>(rng.Normal());
  const size_t rb = RecordBytesOf(&want);
  std::vector<uint8_t> r_cut(rb), r_want(rb), r_other(rb);
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), cut.get(), 1, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                               r_cut.data(), rb));
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &want, 1, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                               r_want.data(), rb));
  KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &other, 1, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                               r_other.data(), rb));
  EXPECT_EQ(r_cut, r_want);
  EXPECT_NE(r_cut, r_other);
}

TEST(StructAbiConfig, LargerSizes) {
  const kvarn_config_t k8v8 = kvt::PresetConfig("k8v8_g128", 128);
  Larger<kvarn_config_t> zero(k8v8, 16, 0);
  EXPECT_EQ(RecordBytesOf(zero.get()), RecordBytesOf(&k8v8));
  EXPECT_EQ(kvarn_config_validate(zero.get()), KVARN_OK);
  Larger<kvarn_config_t> nonzero(k8v8, 16, 0);
  nonzero.SetTail(3, 0x40);
  size_t n = 12345;
  EXPECT_TRUE(IsError(kvarn_record_bytes(nonzero.get(), &n), KVARN_ERR_UNSUPPORTED, "size"));
  EXPECT_EQ(n, 12345u);
  EXPECT_TRUE(IsError(kvarn_config_validate(nonzero.get()), KVARN_ERR_UNSUPPORTED, "size"));
  kvarn_config_t zero_size = k8v8;
  zero_size.size = 0;
  EXPECT_TRUE(IsError(kvarn_record_bytes(&zero_size, &n), KVARN_ERR_INVALID_ARGUMENT, "size"));
  EXPECT_EQ(n, 12345u);
}

// ---- kvarn_cache_options_t (and the config embedded in it) -------------------------------------

struct CacheDeleter {
  void operator()(kvarn_cache_t* c) const { kvarn_cache_destroy(c); }
};
using CachePtr = std::unique_ptr<kvarn_cache_t, CacheDeleter>;

kvarn_cache_options_t SmallCacheOptions() {
  kvarn_cache_options_t o;
  kvarn_cache_options_defaults(&o);
  o.config = kvt::MakeConfig(64, 64, 4, 2);
  o.num_layers = 1;
  o.num_kv_heads = 1;
  o.max_tokens = 256;
  o.max_sequences = 1;
  return o;
}

kvarn_cache_stats_t Stats(const kvarn_cache_t* c) {
  kvarn_cache_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.size = sizeof s;
  EXPECT_EQ(kvarn_cache_get_stats(c, &s), KVARN_OK) << kvarn_last_error();
  return s;
}

TEST(StructAbiCacheOptions, SizeCutBeforeMaxSequencesUsesTheDefault256) {
  kvt::ContextPtr ctx = kvt::MakeCpuContext(1);
  const kvarn_cache_options_t o = SmallCacheOptions();  // max_sequences = 1 in memory
  kvarn_cache_t* raw = nullptr;
  ASSERT_EQ(kvarn_cache_create(ctx.get(), &o, &raw), KVARN_OK) << kvarn_last_error();
  CachePtr exact(raw);
  KVT_ASSERT_OK(kvarn_cache_add_sequence(exact.get(), 1));
  EXPECT_TRUE(IsError(kvarn_cache_add_sequence(exact.get(), 2), KVARN_ERR_CAPACITY));

  Guarded<kvarn_cache_options_t> cut(o, offsetof(kvarn_cache_options_t, max_sequences));
  raw = nullptr;
  ASSERT_EQ(kvarn_cache_create(ctx.get(), cut.get(), &raw), KVARN_OK) << kvarn_last_error();
  CachePtr c(raw);
  for (int64_t id = 0; id < 256; ++id) KVT_ASSERT_OK(kvarn_cache_add_sequence(c.get(), id));
  EXPECT_TRUE(IsError(kvarn_cache_add_sequence(c.get(), 256), KVARN_ERR_CAPACITY));
  // The fields inside the size were read: same record pool as the exact-size cache (layers,
  // heads, max_tokens), larger page pool (256 sequences).
  const kvarn_cache_stats_t se = Stats(exact.get()), sc = Stats(c.get());
  EXPECT_GT(sc.bytes_capacity, se.bytes_capacity);
}

TEST(StructAbiCacheOptions, SizeCutBeforeMaxTokensUsesTheDefaultPool) {
  kvt::ContextPtr ctx = kvt::MakeCpuContext(1);
  kvarn_cache_options_t o = SmallCacheOptions();
  kvarn_cache_options_t dflt = SmallCacheOptions();
  dflt.max_tokens = 65536;
  dflt.max_sequences = 256;
  Guarded<kvarn_cache_options_t> cut(o, offsetof(kvarn_cache_options_t, max_tokens));
  kvarn_cache_t* raw = nullptr;
  ASSERT_EQ(kvarn_cache_create(ctx.get(), cut.get(), &raw), KVARN_OK) << kvarn_last_error();
  CachePtr c(raw);
  raw = nullptr;
  ASSERT_EQ(kvarn_cache_create(ctx.get(), &dflt, &raw), KVARN_OK) << kvarn_last_error();
  CachePtr d(raw);
  EXPECT_EQ(Stats(c.get()).bytes_capacity, Stats(d.get()).bytes_capacity);
}

TEST(StructAbiCacheOptions, LargerSizesAndSizeZero) {
  kvt::ContextPtr ctx = kvt::MakeCpuContext(1);
  const kvarn_cache_options_t o = SmallCacheOptions();
  Larger<kvarn_cache_options_t> zero(o, 32, 0);
  kvarn_cache_t* raw = nullptr;
  ASSERT_EQ(kvarn_cache_create(ctx.get(), zero.get(), &raw), KVARN_OK) << kvarn_last_error();
  CachePtr c(raw);
  KVT_ASSERT_OK(kvarn_cache_add_sequence(c.get(), 1));
  EXPECT_TRUE(IsError(kvarn_cache_add_sequence(c.get(), 2), KVARN_ERR_CAPACITY));  // same options

  kvarn_cache_t* const sentinel = reinterpret_cast<kvarn_cache_t*>(0x9abc);
  Larger<kvarn_cache_options_t> nonzero(o, 32, 0);
  nonzero.SetTail(0, 1);
  raw = sentinel;
  EXPECT_TRUE(
      IsError(kvarn_cache_create(ctx.get(), nonzero.get(), &raw), KVARN_ERR_UNSUPPORTED, "size"));
  EXPECT_EQ(raw, sentinel);
  kvarn_cache_options_t z = o;
  z.size = 0;
  EXPECT_TRUE(IsError(kvarn_cache_create(ctx.get(), &z, &raw), KVARN_ERR_INVALID_ARGUMENT, "size"));
  EXPECT_EQ(raw, sentinel);
}

TEST(StructAbiCacheOptions, TheEmbeddedConfigMustBeWholeAndExact) {
  kvt::ContextPtr ctx = kvt::MakeCpuContext(1);
  kvarn_cache_t* const sentinel = reinterpret_cast<kvarn_cache_t*>(0x9abc);
  kvarn_cache_t* raw = sentinel;
  // The outer size must cover the whole embedded config.
  const size_t min = offsetof(kvarn_cache_options_t, config) + sizeof(kvarn_config_t);
  for (size_t size : {sizeof(size_t), min - 4}) {
    Guarded<kvarn_cache_options_t> cut(SmallCacheOptions(), size);
    EXPECT_TRUE(
        IsError(kvarn_cache_create(ctx.get(), cut.get(), &raw), KVARN_ERR_INVALID_ARGUMENT, "size"))
        << size;
    EXPECT_EQ(raw, sentinel);
  }
  Guarded<kvarn_cache_options_t> just(SmallCacheOptions(), min);  // the rest are defaults
  ASSERT_EQ(kvarn_cache_create(ctx.get(), just.get(), &raw), KVARN_OK) << kvarn_last_error();
  CachePtr c(raw);
  raw = sentinel;
  // The embedded config's own size places the fields after it: only sizeof is accepted, even
  // where a standalone config of that size would be.
  kvarn_cache_options_t o = SmallCacheOptions();
  o.config.size = offsetof(kvarn_config_t, key_flags);
  EXPECT_EQ(kvarn_config_validate(&o.config), KVARN_OK);
  EXPECT_TRUE(IsError(kvarn_cache_create(ctx.get(), &o, &raw), KVARN_ERR_INVALID_ARGUMENT,
                      "options->config"));
  o.config.size = sizeof(kvarn_config_t) + 8;
  EXPECT_TRUE(
      IsError(kvarn_cache_create(ctx.get(), &o, &raw), KVARN_ERR_UNSUPPORTED, "options->config"));
  o.config.size = 0;
  EXPECT_TRUE(IsError(kvarn_cache_create(ctx.get(), &o, &raw), KVARN_ERR_INVALID_ARGUMENT,
                      "options->config"));
  EXPECT_EQ(raw, sentinel);
}

// ---- kvarn_paged_kv_t and kvarn_attention_params_t ---------------------------------------------

class StructAbiPaged : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = kvt::MakeCpuContext(1);
    cfg_ = kvt::MakeConfig(64, 64, 4, 2);
    KVT_SEEDED_RNG(rng, 3);
    kvt::PagedCacheSpec spec;
    spec.num_kv_heads = 2;
    spec.lens = {150, 70};
    ASSERT_TRUE(kvt::BuildPagedCache(ctx_.get(), cfg_, spec, rng, &pc_));
    kvarn_attention_params_defaults(&params_);
    params_.num_q_heads = 4;
    q_.resize(2 * 4 * 64);
    for (float& x : q_) x = static_cast<float>(rng.Normal());
  }

  // Decode attention; returns the status, output in *out (lse appended).
  kvarn_status_t Attend(const kvarn_paged_kv_t* kv, const kvarn_attention_params_t* p,
                        std::vector<float>* out) {
    out->assign(2 * 4 * 64 + 2 * 4, 7.f);
    return kvarn_paged_attention(ctx_.get(), &cfg_, kv, p, q_.data(), out->data(),
                                 out->data() + 2 * 4 * 64, nullptr, 0);
  }

  kvt::ContextPtr ctx_;
  kvarn_config_t cfg_{};
  kvt::PagedCache pc_;
  kvarn_attention_params_t params_{};
  std::vector<float> q_;
};

TEST_F(StructAbiPaged, KvLargerWithZeroTailGivesTheSameOutput) {
  const kvarn_paged_kv_t kv = pc_.View();
  std::vector<float> want, got;
  KVT_ASSERT_OK(Attend(&kv, &params_, &want));
  Larger<kvarn_paged_kv_t> big(kv, 40, 0);
  KVT_ASSERT_OK(Attend(big.get(), &params_, &got));
  EXPECT_EQ(got, want);
}

TEST_F(StructAbiPaged, KvLargerWithNonZeroTailOrSizeZeroIsRefused) {
  const kvarn_paged_kv_t kv = pc_.View();
  Larger<kvarn_paged_kv_t> big(kv, 40, 0);
  big.SetTail(39, 0x80);
  std::vector<float> out;
  EXPECT_TRUE(IsError(Attend(big.get(), &params_, &out), KVARN_ERR_UNSUPPORTED, "kv->size"));
  EXPECT_EQ(out, std::vector<float>(out.size(), 7.f));
  kvarn_paged_kv_t zero = kv;
  zero.size = 0;
  EXPECT_TRUE(IsError(Attend(&zero, &params_, &out), KVARN_ERR_INVALID_ARGUMENT, "kv->size"));
  EXPECT_EQ(out, std::vector<float>(out.size(), 7.f));
}

TEST_F(StructAbiPaged, KvCutBeforeRecordTilesUsesTheDefaultNull) {
  // record_tiles is valid in memory, but past the size: the default (NULL) is used and refused.
  const kvarn_paged_kv_t kv = pc_.View();
  ASSERT_NE(kv.record_tiles, nullptr);
  Guarded<kvarn_paged_kv_t> cut(kv, offsetof(kvarn_paged_kv_t, record_tiles));
  std::vector<float> out;
  EXPECT_TRUE(IsError(Attend(cut.get(), &params_, &out), KVARN_ERR_INVALID_ARGUMENT,
                      "record_tiles is NULL"));
  // An empty batch needs no tables: the same cut struct with batch 0 is accepted.
  kvarn_paged_kv_t empty = kv;
  empty.batch = 0;
  Guarded<kvarn_paged_kv_t> cut_empty(empty, offsetof(kvarn_paged_kv_t, block_table));
  const int32_t indptr[1] = {0};
  EXPECT_EQ(kvarn_paged_append(ctx_.get(), &cfg_, cut_empty.get(), indptr, KVARN_DTYPE_F32, nullptr,
                               nullptr),
            KVARN_OK)
      << kvarn_last_error();
}

TEST_F(StructAbiPaged, KvCutBeforeNumPagesIgnoresThePagesInMemory) {
  // num_pages = 3 with NULL page pointers is refused when read; cut before num_pages, the
  // default 0 pages is used (a batch of 0 needs none).
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = 2;
  kv.num_pages = 3;
  const int32_t indptr[1] = {0};
  EXPECT_TRUE(
      IsError(kvarn_paged_append(ctx_.get(), &cfg_, &kv, indptr, KVARN_DTYPE_F32, nullptr, nullptr),
              KVARN_ERR_INVALID_ARGUMENT, "pages"));
  Guarded<kvarn_paged_kv_t> cut(kv, offsetof(kvarn_paged_kv_t, num_pages));
  EXPECT_EQ(
      kvarn_paged_append(ctx_.get(), &cfg_, cut.get(), indptr, KVARN_DTYPE_F32, nullptr, nullptr),
      KVARN_OK)
      << kvarn_last_error();
}

TEST_F(StructAbiPaged, ParamsCutBeforeNumSplitsUsesAutomaticSplits) {
  const kvarn_paged_kv_t kv = pc_.View();
  std::vector<float> want, got;
  KVT_ASSERT_OK(Attend(&kv, &params_, &want));  // num_splits = 0 (automatic)
  kvarn_attention_params_t p = params_;
  p.num_splits = -1;  // refused when read
  EXPECT_TRUE(IsError(Attend(&kv, &p, &got), KVARN_ERR_INVALID_ARGUMENT, "num_splits"));
  Guarded<kvarn_attention_params_t> cut(p, offsetof(kvarn_attention_params_t, num_splits));
  KVT_ASSERT_OK(Attend(&kv, cut.get(), &got));
  EXPECT_EQ(got, want);
}

TEST_F(StructAbiPaged, ParamsCutBeforeDtypesUsesF32) {
  const kvarn_paged_kv_t kv = pc_.View();
  std::vector<float> want, got;
  KVT_ASSERT_OK(Attend(&kv, &params_, &want));
  kvarn_attention_params_t p = params_;
  p.q_dtype = static_cast<kvarn_dtype_t>(99);  // refused when read
  p.out_dtype = static_cast<kvarn_dtype_t>(99);
  p.num_splits = -1;
  Guarded<kvarn_attention_params_t> cut(p, offsetof(kvarn_attention_params_t, q_dtype));
  KVT_ASSERT_OK(Attend(&kv, cut.get(), &got));
  EXPECT_EQ(got, want);
  // Cut before num_q_heads: the default 0 query heads is refused.
  Guarded<kvarn_attention_params_t> tiny(p, sizeof(size_t));
  EXPECT_TRUE(IsError(Attend(&kv, tiny.get(), &got), KVARN_ERR_INVALID_ARGUMENT, "num_q_heads"));
}

TEST_F(StructAbiPaged, ParamsLargerSizesAndSizeZero) {
  const kvarn_paged_kv_t kv = pc_.View();
  std::vector<float> want, got;
  KVT_ASSERT_OK(Attend(&kv, &params_, &want));
  Larger<kvarn_attention_params_t> zero(params_, 8, 0);
  KVT_ASSERT_OK(Attend(&kv, zero.get(), &got));
  EXPECT_EQ(got, want);
  Larger<kvarn_attention_params_t> nonzero(params_, 8, 0);
  nonzero.SetTail(7, 2);
  EXPECT_TRUE(IsError(Attend(&kv, nonzero.get(), &got), KVARN_ERR_UNSUPPORTED, "params->size"));
  EXPECT_EQ(got, std::vector<float>(got.size(), 7.f));
  kvarn_attention_params_t z = params_;
  z.size = 0;
  EXPECT_TRUE(IsError(Attend(&kv, &z, &got), KVARN_ERR_INVALID_ARGUMENT, "params->size"));
  EXPECT_EQ(got, std::vector<float>(got.size(), 7.f));
}

// ---- kvarn_launch_t and kvarn_attention_shape_t (the capturable layer 2) ----------------------

// Appends one token (K all 1.0) at the slot after sequence 1's last token, as the only token of
// a two-sequence batch, owned by sequence 0 (token_indptr {0, 1, 1}). With a launch whose
// seq_status[0] is already non-zero the call skips sequence 0 and writes nothing (kvarn.h).
class StructAbiRun : public StructAbiPaged {
 protected:
  kvarn_status_t AppendOne(const kvarn_launch_t* launch) {
    kvarn_paged_kv_t kv = pc_.View();
    const int G = pc_.G;
    const int tile = pc_.seq_lens[1] / G;
    const int32_t page = pc_.block_table[static_cast<size_t>(pc_.max_blocks) + tile];
    const int32_t slot = page * G + pc_.seq_lens[1] % G;
    const int32_t indptr[3] = {0, 1, 1};
    std::vector<float> k(2 * 64, 1.f), v(2 * 64, -1.f);
    return kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, launch, indptr, &slot, 1, KVARN_DTYPE_F32,
                                  k.data(), v.data());
  }
  kvarn_launch_t StatusLaunch() {
    kvarn_launch_t l;
    kvarn_launch_defaults(&l);
    l.seq_status = status_;
    return l;
  }
  int32_t status_[2] = {KVARN_ERR_INVALID_ARGUMENT, 0};
};

TEST_F(StructAbiRun, LaunchCutBeforeSeqStatusUsesNoStatusArray) {
  const std::vector<uint16_t> before = pc_.k_pages;
  const kvarn_launch_t with_status = StatusLaunch();
  KVT_ASSERT_OK(AppendOne(&with_status));
  EXPECT_EQ(pc_.k_pages, before);  // sequence 0 had faulted: skipped
  Guarded<kvarn_launch_t> cut(with_status, offsetof(kvarn_launch_t, seq_status));
  KVT_ASSERT_OK(AppendOne(cut.get()));
  EXPECT_NE(pc_.k_pages, before);  // seq_status past the size: NULL, the token is written
}

TEST_F(StructAbiRun, LaunchOfTheFirstLayoutGetsDenseRowsAndInt32Slots) {
  // A caller built before the row strides and index_type existed (size up to workspace_bytes,
  // the struct placed against an inaccessible page): its k and v are dense and its slots int32,
  // so the token lands as with a full, zeroed struct; a full struct with the same defaults
  // writes the same pages.
  status_[0] = 0;
  const std::vector<uint16_t> before = pc_.k_pages;
  Guarded<kvarn_launch_t> old(StatusLaunch(), offsetof(kvarn_launch_t, q_row_stride));
  KVT_ASSERT_OK(AppendOne(old.get()));
  const std::vector<uint16_t> with_old = pc_.k_pages;
  EXPECT_NE(with_old, before);
  pc_.k_pages = before;
  kvarn_launch_t full = StatusLaunch();
  full.k_row_stride = full.v_row_stride = static_cast<int64_t>(pc_.Hk) * pc_.D;  // dense
  KVT_ASSERT_OK(AppendOne(&full));
  EXPECT_EQ(pc_.k_pages, with_old);
}

TEST_F(StructAbiRun, LaunchLargerSizesAndSizeZero) {
  const std::vector<uint16_t> before = pc_.k_pages;
  Larger<kvarn_launch_t> zero(StatusLaunch(), 16, 0);
  KVT_ASSERT_OK(AppendOne(zero.get()));
  EXPECT_EQ(pc_.k_pages, before);  // seq_status read, as with the exact size
  Larger<kvarn_launch_t> nonzero(StatusLaunch(), 16, 0);
  nonzero.SetTail(8, 3);
  status_[0] = 0;
  EXPECT_TRUE(IsError(AppendOne(nonzero.get()), KVARN_ERR_UNSUPPORTED, "launch->size"));
  EXPECT_EQ(pc_.k_pages, before);
  kvarn_launch_t z = StatusLaunch();
  z.size = 0;
  EXPECT_TRUE(IsError(AppendOne(&z), KVARN_ERR_INVALID_ARGUMENT, "launch->size"));
  EXPECT_EQ(pc_.k_pages, before);
  kvarn_launch_t plain = StatusLaunch();  // status_[0] is 0 now: the token is written
  KVT_ASSERT_OK(AppendOne(&plain));
  EXPECT_NE(pc_.k_pages, before);
}

kvarn_attention_shape_t ShapeOf(const kvt::PagedCache& pc, int32_t max_q_per_seq) {
  kvarn_attention_shape_t s;
  kvarn_attention_shape_defaults(&s);
  s.batch = pc.batch;
  s.num_kv_heads = pc.Hk;
  s.max_blocks_per_seq = pc.max_blocks;
  s.max_q_per_seq = max_q_per_seq;
  s.max_total_q = 2 * max_q_per_seq;
  return s;
}

struct PlanDeleter {
  void operator()(kvarn_attention_plan_t* p) const { kvarn_attention_plan_destroy(p); }
};
using PlanPtr = std::unique_ptr<kvarn_attention_plan_t, PlanDeleter>;

TEST_F(StructAbiRun, ShapeCutBeforeMaxQPerSeqMakesADecodePlan) {
  const kvarn_paged_kv_t kv = pc_.View();
  std::vector<float> want, got;
  KVT_ASSERT_OK(Attend(&kv, &params_, &want));  // decode through kvarn_paged_attention
  const kvarn_attention_shape_t extend = ShapeOf(pc_, 4);
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  auto run = [&](const kvarn_attention_shape_t* shape, std::vector<float>* out) {
    kvarn_attention_plan_t* raw = nullptr;
    const kvarn_status_t st = kvarn_attention_plan_create(ctx_.get(), &cfg_, shape, &params_, &raw);
    if (st != KVARN_OK) return st;
    PlanPtr plan(raw);
    size_t ws = 0;
    EXPECT_EQ(kvarn_attention_plan_workspace_size(plan.get(), &ws), KVARN_OK);
    std::vector<uint8_t> workspace(ws);
    launch.workspace = ws ? workspace.data() : nullptr;
    launch.workspace_bytes = ws;
    out->assign(2 * 4 * 64 + 2 * 4, 7.f);
    return kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch, nullptr, q_.data(),
                                     out->data(), out->data() + 2 * 4 * 64);
  };
  // Read whole, the shape is an extend plan: it needs q_indptr.
  EXPECT_TRUE(IsError(run(&extend, &got), KVARN_ERR_INVALID_ARGUMENT, "q_indptr"));
  // Cut before max_q_per_seq: max_q_per_seq 0 (decode), and the result is plain decode's.
  Guarded<kvarn_attention_shape_t> cut(extend, offsetof(kvarn_attention_shape_t, max_q_per_seq));
  KVT_ASSERT_OK(run(cut.get(), &got));
  EXPECT_EQ(got, want);
  // Larger with a zero tail: the same plan as the exact size.
  const kvarn_attention_shape_t decode = ShapeOf(pc_, 0);
  Larger<kvarn_attention_shape_t> zero(decode, 8, 0);
  KVT_ASSERT_OK(run(zero.get(), &got));
  EXPECT_EQ(got, want);
}

TEST_F(StructAbiRun, ShapeLargerWithNonZeroTailAndSizeZeroAreRefused) {
  const kvarn_attention_shape_t decode = ShapeOf(pc_, 0);
  kvarn_attention_plan_t* const sentinel = reinterpret_cast<kvarn_attention_plan_t*>(0x4321);
  kvarn_attention_plan_t* raw = sentinel;
  Larger<kvarn_attention_shape_t> nonzero(decode, 8, 0);
  nonzero.SetTail(0, 1);
  EXPECT_TRUE(IsError(kvarn_attention_plan_create(ctx_.get(), &cfg_, nonzero.get(), &params_, &raw),
                      KVARN_ERR_UNSUPPORTED, "shape->size"));
  EXPECT_EQ(raw, sentinel);
  kvarn_attention_shape_t z = decode;
  z.size = 0;
  EXPECT_TRUE(IsError(kvarn_attention_plan_create(ctx_.get(), &cfg_, &z, &params_, &raw),
                      KVARN_ERR_INVALID_ARGUMENT, "shape->size"));
  EXPECT_EQ(raw, sentinel);
}

// ---- output structs: kvarn_backend_info_t, kvarn_cache_stats_t ---------------------------------

int CpuBackendIndex() {
  for (int i = 0; i < kvarn_backend_count(); ++i) {
    kvarn_backend_info_t info;
    info.size = sizeof info;
    if (kvarn_backend_get_info(i, &info) == KVARN_OK && info.backend == KVARN_BACKEND_CPU) return i;
  }
  return -1;
}

TEST(StructAbiBackendInfo, SmallerSizeWritesOnlyTheFieldsThatFit) {
  const int cpu = CpuBackendIndex();
  ASSERT_GE(cpu, 0);
  kvarn_backend_info_t full;
  full.size = sizeof full;
  KVT_ASSERT_OK(kvarn_backend_get_info(cpu, &full));
  kvarn_backend_info_t poison;
  std::memset(&poison, kPoison, sizeof poison);
  // Cut before `available`: backend and name written, nothing past the size (a write there
  // would hit the guard page).
  const size_t cut = offsetof(kvarn_backend_info_t, available);
  Guarded<kvarn_backend_info_t> g(poison, cut);
  KVT_ASSERT_OK(kvarn_backend_get_info(cpu, g.get()));
  kvarn_backend_info_t seen;
  std::memcpy(&seen, g.bytes(), cut);
  EXPECT_EQ(seen.size, cut);
  EXPECT_EQ(seen.backend, KVARN_BACKEND_CPU);
  EXPECT_STREQ(seen.name, "cpu");
  for (size_t i = FIELD_END(kvarn_backend_info_t, backend);
       i < offsetof(kvarn_backend_info_t, name); ++i) {
    EXPECT_EQ(g.bytes()[i], 0) << "padding byte " << i;
  }
  // A size that cuts device_count: available written, device_count's bytes zeroed.
  const size_t mid = offsetof(kvarn_backend_info_t, device_count) + 2;
  Guarded<kvarn_backend_info_t> h(poison, mid);
  KVT_ASSERT_OK(kvarn_backend_get_info(cpu, h.get()));
  EXPECT_EQ(h.get()->available, 1);
  EXPECT_EQ(h.bytes()[mid - 2], 0);
  EXPECT_EQ(h.bytes()[mid - 1], 0);
}

TEST(StructAbiBackendInfo, LargerSizeZeroesTheTailAndSizeZeroIsRefused) {
  const int cpu = CpuBackendIndex();
  ASSERT_GE(cpu, 0);
  kvarn_backend_info_t full;
  full.size = sizeof full;
  KVT_ASSERT_OK(kvarn_backend_get_info(cpu, &full));
  kvarn_backend_info_t poison;
  std::memset(&poison, kPoison, sizeof poison);
  Larger<kvarn_backend_info_t> big(poison, 24, kPoison);
  KVT_ASSERT_OK(kvarn_backend_get_info(cpu, big.get()));
  EXPECT_EQ(big.get()->size, sizeof full + 24);  // left as the caller set it
  EXPECT_EQ(big.get()->backend, full.backend);
  EXPECT_EQ(big.get()->name, full.name);
  EXPECT_EQ(big.get()->available, full.available);
  EXPECT_EQ(big.get()->device_count, full.device_count);
  EXPECT_EQ(big.get()->reason, full.reason);
  for (size_t i = sizeof full; i < sizeof full + 24; ++i) EXPECT_EQ(big.bytes()[i], 0) << i;
  kvarn_backend_info_t zero = poison;
  zero.size = 0;
  EXPECT_TRUE(IsError(kvarn_backend_get_info(cpu, &zero), KVARN_ERR_INVALID_ARGUMENT, "size"));
  kvarn_backend_info_t before = poison;
  before.size = 0;
  EXPECT_EQ(std::memcmp(&zero, &before, sizeof zero), 0);
}

class StructAbiStats : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = kvt::MakeCpuContext(1);
    kvarn_cache_options_t o = SmallCacheOptions();
    o.max_sequences = 2;
    kvarn_cache_t* raw = nullptr;
    ASSERT_EQ(kvarn_cache_create(ctx_.get(), &o, &raw), KVARN_OK) << kvarn_last_error();
    cache_.reset(raw);
    KVT_ASSERT_OK(kvarn_cache_add_sequence(cache_.get(), 5));
    std::vector<float> k(100 * 64, 0.5f), v(100 * 64, -0.25f);
    KVT_ASSERT_OK(kvarn_cache_append(cache_.get(), 5, 0, 100, KVARN_DTYPE_F32, k.data(), v.data(),
                                     KVARN_APPEND_DEFAULT));
    full_ = Stats(cache_.get());
    ASSERT_EQ(full_.tokens, 100);
  }
  kvt::ContextPtr ctx_;
  CachePtr cache_;
  kvarn_cache_stats_t full_{};
};

TEST_F(StructAbiStats, SmallerSizeWritesOnlyTheFieldsThatFit) {
  kvarn_cache_stats_t poison;
  std::memset(&poison, kPoison, sizeof poison);
  const size_t cut = offsetof(kvarn_cache_stats_t, records);
  Guarded<kvarn_cache_stats_t> g(poison, cut);
  KVT_ASSERT_OK(kvarn_cache_get_stats(cache_.get(), g.get()));
  kvarn_cache_stats_t seen;
  std::memcpy(&seen, g.bytes(), cut);
  EXPECT_EQ(seen.size, cut);
  EXPECT_EQ(seen.sequences, 1);
  EXPECT_EQ(seen.tokens, 100);
  EXPECT_EQ(seen.committed_tokens, 100);
}

TEST_F(StructAbiStats, ExactLargerAndZeroSizes) {
  kvarn_cache_stats_t poison;
  std::memset(&poison, kPoison, sizeof poison);
  Larger<kvarn_cache_stats_t> big(poison, 16, kPoison);
  KVT_ASSERT_OK(kvarn_cache_get_stats(cache_.get(), big.get()));
  kvarn_cache_stats_t seen;
  std::memcpy(&seen, big.bytes(), sizeof seen);
  seen.size = sizeof seen;
  EXPECT_EQ(std::memcmp(&seen, &full_, sizeof seen), 0);
  EXPECT_EQ(big.get()->size, sizeof(kvarn_cache_stats_t) + 16);
  for (size_t i = sizeof seen; i < sizeof seen + 16; ++i) EXPECT_EQ(big.bytes()[i], 0) << i;
  kvarn_cache_stats_t zero = poison;
  zero.size = 0;
  EXPECT_TRUE(IsError(kvarn_cache_get_stats(cache_.get(), &zero), KVARN_ERR_INVALID_ARGUMENT,
                      "stats->size"));
  EXPECT_EQ(zero.tokens, poison.tokens);
}

// ---- the experimental header -------------------------------------------------------------------

TEST(ExperimentalHeader, DeclaresTheAblationFlagsAndBaselines) {
  EXPECT_EQ(KVARN_ABLATE_NONE, 0u);
  EXPECT_EQ(KVARN_ABLATE_NO_ROTATION, 1u);
  EXPECT_EQ(KVARN_ABLATE_NO_NORMALIZATION, 2u);
  const float in[4] = {0.f, 1.f, 2.f, 3.f};
  float out[4] = {};
  KVT_EXPECT_OK(kvarn_baseline_roundtrip(KVARN_BASELINE_PER_TOKEN_RTN, 8, 1, 4, in, out));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[i], in[i], 1e-2f);
}

}  // namespace
