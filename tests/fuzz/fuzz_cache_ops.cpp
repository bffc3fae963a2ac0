// libFuzzer target: random sequences of managed-cache calls.
//
// Each input is a program of calls (add, remove, append committed/speculative, commit, truncate,
// fork, export+import, attention) on a small cache with small pools, so capacity errors are
// common. After every failing call the cache must be exactly as before: the same statistics and
// a byte-identical export of every live sequence. After every successful call the cache must
// agree with a plain model of sequence lengths (tokens and committed count per layer).
#include <map>
#include <vector>

#include "fuzz_common.h"

namespace {

constexpr int kLayers = 2, kHk = 2, kD = 64, kG = 64, kHq = 4;
constexpr int kMaxSeqs = 4;

struct Layer {
  int64_t len = 0, committed = 0;
};
using Model = std::map<int64_t, std::vector<Layer>>;

kvarn_context_t* g_ctx = nullptr;
kvarn_cache_options_t g_opts;

struct Snapshot {
  std::vector<uint8_t> stats;
  std::map<int64_t, std::vector<uint8_t>> blobs;
  bool operator==(const Snapshot& o) const { return stats == o.stats && blobs == o.blobs; }
};

Snapshot Take(kvarn_cache_t* c, const Model& m) {
  Snapshot s;
  kvarn_cache_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  KVFUZZ_CHECK(kvarn_cache_get_stats(c, &st) == KVARN_OK);
  s.stats.assign(reinterpret_cast<uint8_t*>(&st), reinterpret_cast<uint8_t*>(&st) + sizeof st);
  for (const auto& kv : m) {
    size_t n = 0;
    KVFUZZ_CHECK(kvarn_cache_export_sequence(c, kv.first, nullptr, 0, &n) == KVARN_OK);
    std::vector<uint8_t> b(n);
    KVFUZZ_CHECK(kvarn_cache_export_sequence(c, kv.first, b.data(), n, &n) == KVARN_OK);
    s.blobs[kv.first] = std::move(b);
  }
  return s;
}

void CheckModel(kvarn_cache_t* c, const Model& m) {
  kvarn_cache_stats_t st;
  std::memset(&st, 0, sizeof st);
  st.size = sizeof st;
  KVFUZZ_CHECK(kvarn_cache_get_stats(c, &st) == KVARN_OK);
  KVFUZZ_CHECK(st.sequences == static_cast<int64_t>(m.size()));
  int64_t tokens = 0, committed = 0;
  for (const auto& kv : m) {
    for (int l = 0; l < kLayers; ++l) {
      int64_t t = -1, cm = -1;
      KVFUZZ_CHECK(kvarn_cache_sequence_length(c, kv.first, l, &t, &cm) == KVARN_OK);
      KVFUZZ_CHECK(t == kv.second[l].len);
      KVFUZZ_CHECK(cm == kv.second[l].committed);
      tokens += t;
      committed += cm;
    }
  }
  KVFUZZ_CHECK(st.tokens == tokens);
  KVFUZZ_CHECK(st.committed_tokens == committed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_ctx == nullptr) {
    g_ctx = kvfuzz::CpuContext(2);
    kvarn_cache_options_defaults(&g_opts);
    KVFUZZ_CHECK(kvarn_config_from_preset("k4v2_g64", kD, &g_opts.config) == KVARN_OK);
    g_opts.num_layers = kLayers;
    g_opts.num_kv_heads = kHk;
    g_opts.max_tokens = kG * 6;
    g_opts.max_sequences = kMaxSeqs;
  }
  kvfuzz::Reader in(data, size);
  kvarn_cache_t* cache = nullptr;
  KVFUZZ_CHECK(kvarn_cache_create(g_ctx, &g_opts, &cache) == KVARN_OK);
  Model model;
  std::vector<float> k, v, q(kHq * kD * 4), out(q.size());
  for (int step = 0; step < 64 && !in.empty(); ++step) {
    const uint8_t op = in.U8() % 9;
    const int64_t id = in.Below(6);
    const Snapshot before = Take(cache, model);
    Model next = model;
    kvarn_status_t st = KVARN_OK;
    switch (op) {
      case 0:
        st = kvarn_cache_add_sequence(cache, id);
        if (st == KVARN_OK) next[id].assign(kLayers, Layer{});
        break;
      case 1:
        st = kvarn_cache_remove_sequence(cache, id);
        if (st == KVARN_OK) next.erase(id);
        break;
      case 2:
      case 3: {  // append, committed (2) or speculative (3)
        const int layer = in.Below(kLayers);
        const size_t n = in.Below(3 * kG);
        const uint8_t value_mode = in.U8();
        k.assign(n * kHk * kD, 0.f);
        v.assign(k.size(), 0.f);
        for (size_t i = 0; i < k.size(); ++i) {
          k[i] = static_cast<float>((i * 31 + value_mode) % 97) / 24.f - 2.f;
          v[i] = static_cast<float>((i * 17 + value_mode) % 89) / 22.f - 2.f;
        }
        if (value_mode == 0xff && !k.empty()) k[k.size() / 2] = __builtin_nanf("");
        if (value_mode == 0xfe && !v.empty()) v[v.size() - 1] = 1e6f;
        const uint32_t flags = op == 3 ? KVARN_APPEND_SPECULATIVE : 0;
        st = kvarn_cache_append(cache, id, layer, n, KVARN_DTYPE_F32, k.data(), v.data(), flags);
        if (st == KVARN_OK && n > 0) {
          Layer& L = next[id][layer];
          L.len += static_cast<int64_t>(n);
          if (op == 2) L.committed = L.len;
        }
        break;
      }
      case 4: {
        const int64_t n = in.Below(6 * kG);
        st = kvarn_cache_commit(cache, id, n);
        if (st == KVARN_OK) {
          for (Layer& L : next[id]) L.committed = n;
        }
        break;
      }
      case 5: {
        const int64_t n = in.Below(6 * kG);
        st = kvarn_cache_truncate(cache, id, n);
        if (st == KVARN_OK) {
          for (Layer& L : next[id]) {
            if (n < L.len) {
              L.len = n;
              if (L.committed > n) L.committed = n;
            }
          }
        }
        break;
      }
      case 6: {
        const int64_t dst = in.Below(6);
        const int64_t n = static_cast<int64_t>(in.Below(6 * kG + 1)) - 1;
        st = kvarn_cache_fork(cache, id, dst, n);
        if (st == KVARN_OK) {
          std::vector<Layer> layers = next[id];
          for (Layer& L : layers) L.len = L.committed = n < 0 ? L.committed : n;
          next[dst] = layers;
        }
        break;
      }
      case 7: {  // export, then import under another id
        const int64_t dst = in.Below(6);
        size_t n = 0;
        st = kvarn_cache_export_sequence(cache, id, nullptr, 0, &n);
        if (st != KVARN_OK) break;
        std::vector<uint8_t> blob(n);
        st = kvarn_cache_export_sequence(cache, id, blob.data(), n, &n);
        KVFUZZ_CHECK(st == KVARN_OK);
        st = kvarn_cache_import_sequence(cache, dst, blob.data(), blob.size());
        if (st == KVARN_OK) next[dst] = next[id];
        break;
      }
      case 8: {
        const int layer = in.Below(kLayers);
        kvarn_attention_params_t ap;
        kvarn_attention_params_defaults(&ap);
        ap.num_q_heads = kHq;
        const int64_t ids[2] = {id, static_cast<int64_t>(in.Below(6))};
        const size_t n_seqs = 1 + in.Below(2);
        for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 7) - 3.f;
        st = kvarn_cache_attention(cache, layer, n_seqs, ids, &ap, q.data(), out.data(), nullptr);
        if (st == KVARN_OK) {
          for (size_t i = 0; i < n_seqs * kHq * kD; ++i) KVFUZZ_CHECK(out[i] == out[i]);
        }
        break;
      }
    }
    if (st != KVARN_OK) {
      KVFUZZ_CHECK(st != KVARN_ERR_INTERNAL && st != KVARN_ERR_OUT_OF_MEMORY);
      KVFUZZ_CHECK(Take(cache, model) == before);
    } else {
      model = std::move(next);
      CheckModel(cache, model);
    }
  }
  kvarn_cache_destroy(cache);
  return 0;
}
