// libFuzzer target: kvarn_cache_import_sequence over arbitrary blobs.
//
// Input: one flag byte, then the blob. With flag bit 0 set, the harness rewrites the blob's
// total_bytes and CRC-32C to match (what a careless writer or an attacker produces: a checksum
// is not authentication), so mutations reach the checks behind the checksum. Checked: the call
// never reads outside the blob (the input is an exactly sized heap buffer under ASan), a failing
// import leaves the cache as it was, and a successful one exports back to the same bytes (import
// accepts exactly what export writes) and is removed again.
#include <vector>

#include "fuzz_common.h"

namespace {

kvarn_context_t* g_ctx = nullptr;
kvarn_cache_t* g_cache = nullptr;

void Setup() {
  g_ctx = kvfuzz::CpuContext(1);
  const kvarn_cache_options_t o = kvfuzz::ImportCacheOptions(2);
  KVFUZZ_CHECK(kvarn_cache_create(g_ctx, &o, &g_cache) == KVARN_OK);
}

kvarn_cache_stats_t Stats() {
  kvarn_cache_stats_t s;
  std::memset(&s, 0, sizeof s);
  s.size = sizeof s;
  KVFUZZ_CHECK(kvarn_cache_get_stats(g_cache, &s) == KVARN_OK);
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_cache == nullptr) Setup();
  if (size < 1) return 0;
  const uint8_t flags = data[0];
  // The blob in its own exactly sized allocation, so any over-read is a heap overflow.
  std::vector<uint8_t> blob(data + 1, data + size);
  if ((flags & 1) && blob.size() >= 64 + 4) {
    const uint64_t total = blob.size();
    std::memcpy(blob.data() + 16, &total, 8);
    const uint32_t crc = kvfuzz::Crc32c(blob.data(), blob.size() - 4);
    std::memcpy(blob.data() + blob.size() - 4, &crc, 4);
  }
  std::vector<uint8_t> exact(blob);  // copy: the library gets an allocation of exactly the size
  const kvarn_cache_stats_t before = Stats();
  const kvarn_status_t st = kvarn_cache_import_sequence(g_cache, 7, exact.data(), exact.size());
  if (st != KVARN_OK) {
    KVFUZZ_CHECK(st == KVARN_ERR_CORRUPT_DATA || st == KVARN_ERR_CAPACITY ||
                 st == KVARN_ERR_INVALID_ARGUMENT);
    const kvarn_cache_stats_t after = Stats();
    KVFUZZ_CHECK(std::memcmp(&before, &after, sizeof before) == 0);
    return 0;
  }
  size_t n = 0;
  KVFUZZ_CHECK(kvarn_cache_export_sequence(g_cache, 7, nullptr, 0, &n) == KVARN_OK);
  KVFUZZ_CHECK(n == blob.size());
  std::vector<uint8_t> again(n);
  KVFUZZ_CHECK(kvarn_cache_export_sequence(g_cache, 7, again.data(), n, &n) == KVARN_OK);
  KVFUZZ_CHECK(again == blob);
  KVFUZZ_CHECK(kvarn_cache_remove_sequence(g_cache, 7) == KVARN_OK);
  const kvarn_cache_stats_t after = Stats();
  KVFUZZ_CHECK(std::memcmp(&before, &after, sizeof before) == 0);
  return 0;
}
