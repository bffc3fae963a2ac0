// Shared pieces of the libFuzzer targets: a reader that turns the fuzzer's bytes into choices,
// and a hard check that aborts (so libFuzzer saves the input) with a message.
#pragma once

#include <kvarn/kvarn.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvfuzz {

[[noreturn]] inline void Fail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: check failed: %s (last error: %s)\n", file, line, what,
               kvarn_last_error());
  std::abort();
}

#define KVFUZZ_CHECK(cond)                                  \
  do {                                                      \
    if (!(cond)) ::kvfuzz::Fail(__FILE__, __LINE__, #cond); \
  } while (0)

// Consumes the input from the front; past the end every read gives 0.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  bool empty() const { return n_ == 0; }
  size_t left() const { return n_; }
  uint8_t U8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return static_cast<uint32_t>(U16()) | (static_cast<uint32_t>(U16()) << 16); }
  // A value in [0, n).
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : U32() % n; }
  // The next `bytes` bytes (fewer at the end of the input).
  const uint8_t* Take(size_t bytes, size_t* got) {
    *got = bytes < n_ ? bytes : n_;
    const uint8_t* r = p_;
    p_ += *got;
    n_ -= *got;
    return r;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

inline uint32_t Crc32c(const uint8_t* p, size_t n) {
  uint32_t crc = ~0u;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc & 1u) ? (crc >> 1) ^ 0x82f63b78u : (crc >> 1);
  }
  return ~crc;
}

inline kvarn_context_t* CpuContext(int threads) {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  o.num_threads = threads;
  kvarn_context_t* c = nullptr;
  KVFUZZ_CHECK(kvarn_context_create(&o, &c) == KVARN_OK);
  return c;
}

// The cache whose blobs fuzz_import imports and make_seeds writes as its corpus: both sides must
// agree on the configuration, so it is made in one place.
inline kvarn_cache_options_t ImportCacheOptions(int max_sequences) {
  kvarn_cache_options_t o;
  kvarn_cache_options_defaults(&o);
  KVFUZZ_CHECK(kvarn_config_from_preset("k4v2_g64", 64, &o.config) == KVARN_OK);
  o.num_layers = 2;
  o.num_kv_heads = 1;
  o.max_tokens = 64 * 4;
  o.max_sequences = max_sequences;
  return o;
}

}  // namespace kvfuzz
