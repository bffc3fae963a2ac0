// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): real blobs and
// records made by the library, and short call programs. Run once from the fuzz build:
//   build/rel-fuzz/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
#include <cstdio>
#include <string>
#include <vector>

#include "fuzz_common.h"

namespace {

void Write(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  KVFUZZ_CHECK(f != nullptr);
  KVFUZZ_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size());
  std::fclose(f);
}

std::vector<float> Values(size_t n, int salt) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((i * 37 + salt) % 101) / 25.f - 2.f;
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  kvarn_context_t* ctx = kvfuzz::CpuContext(1);

  // fuzz_import: blobs of the cache fuzz_import.cpp uses, with flag bytes 0 and 1.
  const kvarn_cache_options_t o = kvfuzz::ImportCacheOptions(4);
  kvarn_cache_t* cache = nullptr;
  KVFUZZ_CHECK(kvarn_cache_create(ctx, &o, &cache) == KVARN_OK);
  const std::vector<std::pair<size_t, size_t>> lens = {{0, 0}, {10, 0}, {130, 0}, {3, 5}};
  for (size_t s = 0; s < lens.size(); ++s) {
    const int64_t id = static_cast<int64_t>(s);
    KVFUZZ_CHECK(kvarn_cache_add_sequence(cache, id) == KVARN_OK);
    const size_t per_layer[2] = {lens[s].first, lens[s].second};
    for (int l = 0; l < 2; ++l) {
      const size_t n = per_layer[l];
      if (n == 0) continue;
      const std::vector<float> k = Values(n * 64, 1 + l), v = Values(n * 64, 7 + l);
      KVFUZZ_CHECK(kvarn_cache_append(cache, id, l, n, KVARN_DTYPE_F32, k.data(), v.data(),
                                      s == 3 ? KVARN_APPEND_SPECULATIVE : 0) == KVARN_OK);
    }
    size_t n = 0;
    KVFUZZ_CHECK(kvarn_cache_export_sequence(cache, id, nullptr, 0, &n) == KVARN_OK);
    std::vector<uint8_t> blob(n + 1);
    KVFUZZ_CHECK(kvarn_cache_export_sequence(cache, id, blob.data() + 1, n, &n) == KVARN_OK);
    for (uint8_t flag : {0, 1}) {
      blob[0] = flag;
      Write(dir + "/import/seq" + std::to_string(s) + "_flag" + std::to_string(flag), blob);
    }
  }
  kvarn_cache_destroy(cache);

  // fuzz_codec: choice byte, option byte, query bytes, then real records.
  const char* presets[] = {"k4v2_g64", "k2v2_g64", "k8v8_g64"};
  for (int p = 0; p < 3; ++p) {
    kvarn_config_t cfg;
    KVFUZZ_CHECK(kvarn_config_from_preset(presets[p], 64, &cfg) == KVARN_OK);
    size_t rb = 0;
    KVFUZZ_CHECK(kvarn_record_bytes(&cfg, &rb) == KVARN_OK);
    std::vector<uint8_t> rec(rb);
    const std::vector<float> k = Values(64 * 64, p), v = Values(64 * 64, p + 3);
    KVFUZZ_CHECK(kvarn_quantize(ctx, &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(), 0, rec.data(),
                                rb) == KVARN_OK);
    std::vector<uint8_t> in = {
        static_cast<uint8_t>(p), static_cast<uint8_t>(p == 1 ? 0x21 : 0), 1, 0, 0, 0};
    for (int i = 0; i < 2 * 64; ++i) in.push_back(static_cast<uint8_t>(i * 5));
    in.insert(in.end(), rec.begin(), rec.end());
    Write(dir + "/codec/" + presets[p], in);
  }

  // fuzz_cache_ops: short programs (op byte, then its argument bytes; see fuzz_cache_ops.cpp).
  const std::vector<std::vector<uint8_t>> programs = {
      // add 0; append 0 L0 100 committed; append 0 L1 100; fork 0->1 -1; attention
      {0,   0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 100, 0, 0, 0, 1, 2, 0, 0, 0, 0, 1, 0, 0, 0,
       100, 0, 0, 0, 1, 6, 0, 0, 0, 0, 1, 0, 0, 0, 0,   0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0},
      // add 2; speculative appends; commit 70; truncate 64; export/import 2->3; remove 2
      {0, 2, 0, 0,  0, 3, 2,   0, 0, 0, 0, 0, 0, 0, 150, 0, 0,  0, 9, 3, 2, 0,
       0, 0, 1, 0,  0, 0, 150, 0, 0, 0, 9, 4, 2, 0, 0,   0, 70, 0, 0, 0, 5, 2,
       0, 0, 0, 64, 0, 0, 0,   7, 2, 0, 0, 0, 3, 0, 0,   0, 1,  2, 0, 0, 0},
  };
  for (size_t i = 0; i < programs.size(); ++i) {
    Write(dir + "/cache_ops/program" + std::to_string(i), programs[i]);
  }
  kvarn_context_destroy(ctx);
  std::printf("seeds written under %s\n", dir.c_str());
  return 0;
}
