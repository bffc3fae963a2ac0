// libFuzzer target: the codec and paged attention over arbitrary record bytes.
//
// Input: a config choice, a query, then record bytes (any bytes: NaN/Inf scales, any codes).
// Checked: dequantize and attention read only the records they are given (exactly sized heap
// buffers under ASan), return KVARN_OK for any record bytes (records are not validated,
// kvarn.h), write exactly their outputs, and give bit-identical results on the scalar and the
// best SIMD kernels.
#include <vector>

#include "fuzz_common.h"

namespace {

kvarn_context_t* g_best = nullptr;
kvarn_context_t* g_scalar = nullptr;

void Setup() {
  g_best = kvfuzz::CpuContext(2);
  KVFUZZ_CHECK(kvarn_set_max_cpu_isa(KVARN_CPU_ISA_SCALAR) == KVARN_OK);
  g_scalar = kvfuzz::CpuContext(1);
  KVFUZZ_CHECK(kvarn_set_max_cpu_isa(kvarn_cpu_isa_best()) == KVARN_OK);
}

const char* const kPresets[] = {"k4v2_g64", "k2v2_g64", "k8v8_g64", "k4v4_g128", "k4v2_g128"};

struct Run {
  std::vector<uint8_t> k, v, out;
  kvarn_status_t dq = KVARN_OK, attn = KVARN_OK;
};

Run RunOn(kvarn_context_t* ctx, const kvarn_config_t& cfg, const std::vector<uint8_t>& records,
          size_t n_tiles, size_t rb, kvarn_dtype_t dtype, uint32_t flags,
          const std::vector<float>& q, int hq) {
  const int D = cfg.head_dim, G = cfg.tile_tokens;
  const size_t elems = n_tiles * G * D;
  const size_t esize = kvarn_dtype_size(dtype);
  Run r;
  r.k.assign(elems * esize, 0xee);
  r.v.assign(elems * esize, 0xee);
  r.dq = kvarn_dequantize(ctx, &cfg, n_tiles, records.data(), rb, flags, dtype, r.k.data(),
                          r.v.data());
  // Attention of one sequence over the same records as one KV head: the sink tile is a page.
  const int sink = cfg.sink_tiles;
  std::vector<uint16_t> pages(static_cast<size_t>(sink > 0 ? sink : 1) * G * D, 0x3c00);
  std::vector<int32_t> table(sink + n_tiles);
  for (int i = 0; i < sink; ++i) table[i] = i;
  for (size_t i = 0; i < n_tiles; ++i) table[sink + i] = static_cast<int32_t>(i);
  const int32_t len = static_cast<int32_t>((sink + n_tiles) * G);
  const int32_t rt = static_cast<int32_t>(n_tiles);
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = 1;
  kv.batch = 1;
  kv.records = const_cast<uint8_t*>(records.data());
  kv.record_stride = rb;
  kv.num_record_blocks = static_cast<int32_t>(n_tiles);
  kv.k_pages = pages.data();
  kv.v_pages = pages.data();
  kv.num_pages = sink > 0 ? sink : 1;
  kv.block_table = table.data();
  kv.max_blocks_per_seq = static_cast<int32_t>(table.size());
  kv.seq_lens = &len;
  kv.record_tiles = &rt;
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = hq;
  r.out.assign(static_cast<size_t>(hq) * D * sizeof(float), 0xee);
  r.attn = kvarn_paged_attention(ctx, &cfg, &kv, &ap, q.data(), r.out.data(), nullptr, nullptr, 0);
  return r;
}

bool IsNaN(const uint8_t* p, kvarn_dtype_t dtype) {
  if (dtype == KVARN_DTYPE_F32) {
    uint32_t x;
    std::memcpy(&x, p, 4);
    return (x & 0x7f800000u) == 0x7f800000u && (x & 0x007fffffu) != 0;
  }
  uint16_t x;
  std::memcpy(&x, p, 2);
  if (dtype == KVARN_DTYPE_F16) return (x & 0x7c00u) == 0x7c00u && (x & 0x03ffu) != 0;
  return (x & 0x7f80u) == 0x7f80u && (x & 0x007fu) != 0;  // bf16
}

bool SameUpToNaN(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                 kvarn_dtype_t dtype) {
  if (a.size() != b.size()) return false;
  const size_t es = kvarn_dtype_size(dtype);
  for (size_t i = 0; i < a.size(); i += es) {
    if (std::memcmp(&a[i], &b[i], es) == 0) continue;
    if (!(IsNaN(&a[i], dtype) && IsNaN(&b[i], dtype))) {
      std::fprintf(stderr, "element %zu differs\n", i / es);
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (g_best == nullptr) Setup();
  kvfuzz::Reader in(data, size);
  const uint8_t choice = in.U8();
  kvarn_config_t cfg;
  const int D = (choice & 0x80) ? 128 : 64;
  KVFUZZ_CHECK(kvarn_config_from_preset(kPresets[(choice & 0x7f) % 5], D, &cfg) == KVARN_OK);
  const uint8_t opts = in.U8();
  cfg.sink_tiles = opts & 1;
  cfg.key_flags = (opts >> 1) & 3;
  cfg.value_flags = (opts >> 3) & 3;
  const kvarn_dtype_t dtype = static_cast<kvarn_dtype_t>((opts >> 5) % 3);
  const uint32_t flags = (opts & 0x80) ? KVARN_CODEC_CACHE_FRAME : 0;
  const int hq = 1 + in.Below(4);
  std::vector<float> q(static_cast<size_t>(hq) * D);
  for (float& x : q) x = static_cast<float>(static_cast<int8_t>(in.U8())) / 16.f;
  size_t rb = 0;
  KVFUZZ_CHECK(kvarn_record_bytes(&cfg, &rb) == KVARN_OK);
  // The rest of the input is the records (1 or 2 tiles), zero-padded to whole records.
  size_t got = 0;
  const uint8_t* rest = in.Take(2 * rb, &got);
  const size_t n_tiles = got > rb ? 2 : 1;
  std::vector<uint8_t> records(n_tiles * rb, 0);
  if (got) std::memcpy(records.data(), rest, got);

  const Run a = RunOn(g_best, cfg, records, n_tiles, rb, dtype, flags, q, hq);
  KVFUZZ_CHECK(a.dq == KVARN_OK);
  KVFUZZ_CHECK(a.attn == KVARN_OK);
  const Run b = RunOn(g_scalar, cfg, records, n_tiles, rb, dtype, flags, q, hq);
  KVFUZZ_CHECK(b.dq == KVARN_OK && b.attn == KVARN_OK);
  // Dequantize: SIMD and scalar bit-identical, except that a NaN may differ in sign and payload
  // (IEEE 754 leaves them open; a clang build gives -NaN on one path and +NaN on the other).
  KVFUZZ_CHECK(SameUpToNaN(a.k, b.k, dtype));
  KVFUZZ_CHECK(SameUpToNaN(a.v, b.v, dtype));
  return 0;
}
