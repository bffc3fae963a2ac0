// The internal backend interface: a table of function pointers with a version field (ggml-style).
// Backends register in core/registry.cpp; the C shims validate arguments, then dispatch here.
// Every entry receives arguments already checked for NULLs, sizes and supported shapes by
// core/ops.cpp; backends check what only they can read (e.g. block-table contents in their
// memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/config.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "kvarn/kvarn.h"

namespace kvarn {

constexpr int kBackendInterfaceVersion = 3;

// A validated view of kvarn_paged_kv_t.
struct PagedKV {
  int num_kv_heads = 0;
  int batch = 0;
  uint8_t* records = nullptr;
  size_t record_stride = 0;
  int num_record_blocks = 0;
  uint16_t* k_pages = nullptr;
  uint16_t* v_pages = nullptr;
  int num_pages = 0;
  const int32_t* block_table = nullptr;
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  const int32_t* record_tiles = nullptr;
  // The per-request tail state (kvarn_experimental.h), or tail_states NULL: tiles past
  // record_tiles[b] are rows of slot tail_slots[b] ([2][Hk][tail_cap][D] halves, K then V,
  // tail_slot_elems halves apart) instead of pages, and there is no sink (sink_tiles 0).
  // tail_bits 8: a slot holds int8 codes [2][Hk][tail_cap][D] then fp16 scales [2][Hk][tail_cap]
  // (kvarn_experimental.h); only the CPU backend reads that form.
  uint16_t* tail_states = nullptr;
  size_t tail_slot_elems = 0;
  int tail_cap = 0;
  int tail_bits = 16;
  int num_tail_slots = 0;
  const int32_t* tail_slots = nullptr;
};

// Whether every record and page of kv starts 16-byte aligned (the pools and the record stride):
// what the GPU tensor-core kernels need, which copy them 16 bytes at a time.
inline bool PoolsAligned16(const PagedKV& kv) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return kv.record_stride % 16 == 0 && aligned(kv.records) && aligned(kv.k_pages) &&
         aligned(kv.v_pages);
}

struct AttentionArgs {
  int num_q_heads = 0;
  float scale = 0.f;                  // resolved: never 0
  const int32_t* q_indptr = nullptr;  // NULL = decode
  kvarn_dtype_t q_dtype = KVARN_DTYPE_F32;
  kvarn_dtype_t out_dtype = KVARN_DTYPE_F32;
  int num_splits = 0;
  // Model variants (kvarn_attention_params_t): sink logits [Hq] in context memory or NULL,
  // window W (0 = full), softcap c (0 = off), prefix mode (queries follow the cache).
  const float* sinks = nullptr;
  int sliding_window = 0;
  float logit_softcap = 0.f;
  bool prefix = false;
  bool has_variant() const {
    return sinks != nullptr || sliding_window > 0 || logit_softcap > 0.f || prefix;
  }
  // Elements between the tokens of q and out, resolved (>= Hq * D; Hq * D when dense): set by
  // ParseAttentionParams to dense and by the run call from its launch.
  int64_t q_row_stride = 0;
  int64_t out_row_stride = 0;
};

// Where a capturable (*_run) call executes: a validated kvarn_launch_t.
struct LaunchArgs {
  void* stream = nullptr;         // NULL = the context's stream
  int32_t* seq_status = nullptr;  // [batch] per-sequence status, or NULL (whole-call errors)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Elements between the tokens of k and v (append): 0 as parsed (dense), resolved to >= Hk * D
  // by OpPagedAppendRun before the backend sees them. q and out strides travel in AttentionArgs.
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0, out_row_stride = 0;
  // slot_mapping (append) and src_pages, dst_blocks, tile_seqs (flush) hold int64, not int32
  // (the pointers keep their int32_t* type; read them with IndexAt).
  bool index64 = false;
};

// Entry i of a slot or flush list of the launch's index type (host memory).
inline int64_t IndexAt(const int32_t* list, bool index64, size_t i) {
  return index64 ? reinterpret_cast<const int64_t*>(list)[i] : list[i];
}

// The shape an attention plan is made for (a validated kvarn_attention_shape_t).
struct AttentionShape {
  int batch = 0;
  int num_kv_heads = 0;
  int max_blocks_per_seq = 0;
  int max_q_per_seq = 0;    // 0 = decode
  int64_t max_total_q = 0;  // rows of q/out/lse (batch for decode)
  bool decode() const { return max_q_per_seq == 0; }
};

// What the backend decided for a shape: kernel, splits and workspace. Made once per plan, read
// by every run; the fields a backend does not use stay at their defaults.
struct AttentionPlan {
  int splits = 1;
  int tiles_per_split = 1;
  int chunks_per_seq = 1;         // row chunks of the kernel the plan is for
  bool extend = false;            // GPU: the tensor-core extend kernel
  int decode_chunks_per_seq = 1;  // GPU: row chunks of the decode kernels (misaligned pools)
  size_t rows_total = 0;          // output rows (query tokens x query heads)
  size_t ml_bytes = 0, acc_bytes = 0, indptr_bytes = 0;
  // GPU extend runs: entries of the work list built on the device from q_indptr (a bound on the
  // (sequence, row chunk) items that hold rows; 0: the grid covers batch x chunks_per_seq).
  int64_t work_items = 0;
  size_t list_bytes = 0;
  // GPU extend runs with KVARN_CUDA_DECODE_ROWS=split: a second list (after the first) of the
  // one-token sequences, run by the decode kernel (0: none).
  int64_t decode_items = 0;
  size_t decode_list_bytes = 0;
  size_t workspace = 0;
  // The kernel the plan runs (kvarn_attention_plan_kernel), and whether it reads the pools with
  // 16-byte copies (then a run over a misaligned pool is refused, never slowed down silently).
  const char* kernel = "cpu";
  bool needs_aligned_pool = false;
};

// Workspace of a capturable flush: the staged records of every listed tile (validate, then
// write). The same on every backend, so it is computable before a context exists.
size_t FlushWorkspaceBytes(const Config& cfg, int num_kv_heads, size_t max_tiles);

enum class CopyKind { kHostToDevice, kDeviceToHost, kDeviceToDevice };

struct Context;

struct BackendOps {
  int interface_version;
  kvarn_backend_t kind;
  const char* name;

  // Devices present (0 when unavailable) and, if unavailable, a static reason.
  void (*probe)(int* device_count, const char** reason);
  Status (*context_init)(Context* ctx);
  void (*context_release)(Context* ctx);

  // Memory in the context's address space (device memory for GPU backends).
  Status (*alloc)(Context* ctx, size_t bytes, void** out);
  void (*free)(Context* ctx, void* ptr);
  Status (*copy)(Context* ctx, void* dst, const void* src, size_t bytes, CopyKind kind);
  Status (*synchronize)(Context* ctx);

  // Layer 1: codec.
  Status (*rotate)(Context* ctx, int D, size_t rows, kvarn_dtype_t in_dtype, const void* in,
                   kvarn_dtype_t out_dtype, void* out);
  Status (*quantize)(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype,
                     const void* k, const void* v, uint32_t flags, void* records,
                     size_t record_stride);
  Status (*dequantize)(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                       size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k,
                       void* v);

  // Layer 2: paged cache.
  Status (*paged_append)(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const int32_t* token_indptr, kvarn_dtype_t dtype, const void* k,
                         const void* v);
  Status (*paged_flush)(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                        const int32_t* src_pages, const int32_t* dst_blocks);
  Status (*attention_workspace)(Context* ctx, const Config& cfg, const PagedKV& kv,
                                const AttentionArgs& args, size_t total_q, size_t* bytes);
  Status (*paged_attention)(Context* ctx, const Config& cfg, const PagedKV& kv,
                            const AttentionArgs& args, const void* q, void* out, float* lse,
                            void* workspace, size_t workspace_bytes);

  // Layer 2, capturable form (kvarn.h "plan / run"): metadata in the context's memory, no host
  // synchronization, allocation or host reads on GPU backends.
  Status (*attention_plan)(Context* ctx, const Config& cfg, const AttentionShape& shape,
                           const AttentionArgs& args, AttentionPlan* plan);
  Status (*paged_append_run)(Context* ctx, const Config& cfg, const PagedKV& kv,
                             const LaunchArgs& launch, const int32_t* token_indptr,
                             const int32_t* slot_mapping, size_t max_tokens, kvarn_dtype_t dtype,
                             const void* k, const void* v);
  Status (*paged_flush_run)(Context* ctx, const Config& cfg, const PagedKV& kv,
                            const LaunchArgs& launch, size_t max_tiles, const int32_t* n_tiles,
                            const int32_t* src_pages, const int32_t* dst_blocks,
                            const int32_t* tile_seqs);
  Status (*paged_attention_run)(Context* ctx, const Config& cfg, const PagedKV& kv,
                                const AttentionShape& shape, const AttentionArgs& args,
                                const AttentionPlan& plan, const LaunchArgs& launch,
                                const int32_t* q_indptr, const void* q, void* out, float* lse);

  // The per-request tail state (kvarn_experimental.h; kv.tail_states set). NULL where the
  // backend lacks it: the core then refuses every tail-state call, attention included.
  Status (*paged_append_tail_run)(Context* ctx, const Config& cfg, const PagedKV& kv,
                                  const LaunchArgs& launch, const int32_t* token_indptr,
                                  size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                  const void* v);
  Status (*paged_flush_tail_run)(Context* ctx, const Config& cfg, const PagedKV& kv,
                                 const LaunchArgs& launch, const int32_t* committed,
                                 int32_t* record_tiles_out);
  // Append then flush in one call, the appended rows not bounded by the slot; NULL where the
  // backend lacks it (the core refuses only this call then).
  Status (*paged_append_flush_tail_run)(Context* ctx, const Config& cfg, const PagedKV& kv,
                                        const LaunchArgs& launch, const int32_t* token_indptr,
                                        size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                        const void* v, const int32_t* committed,
                                        int32_t* record_tiles_out);

  // The context's error word (kvarn_context_error_word) in its memory, or NULL where every call
  // returns its own errors (the core then hands out Context::host_error_word, always 0).
  const int32_t* (*error_word)(Context* ctx);
};

// The workspace of kvarn_paged_append_flush_tail_run, one layout for every backend (the core
// sizes and checks it; a backend uses the parts it needs): the staged records, then the appended
// rows in the cache frame (fp16 [2][max_tokens][Hk][D]), then [batch + 1] int32 (each sequence's
// first staged tile). Offsets in bytes, each part 256-byte aligned. Sequence b flushes at most
// (cap + m_b) / G <= cap / G + 1 + m_b / G tiles (cap rows in its slot before the call, m_b
// appended), so all together batch * (cap / G + 1) + max_tokens / G. The caller checked that
// the sizes fit size_t.
inline size_t AppendFlushMaxTiles(const Config& cfg, int batch, int cap, size_t max_tokens) {
  return static_cast<size_t>(batch) * (static_cast<size_t>(cap) / cfg.G + 1) +
         max_tokens / static_cast<size_t>(cfg.G);
}
struct AppendFlushWorkspace {
  size_t max_tiles = 0;
  size_t rows = 0, first = 0, total = 0;  // the records start at 0
};
inline AppendFlushWorkspace AppendFlushWorkspaceLayout(const Config& cfg, int num_kv_heads,
                                                       int batch, int cap, size_t max_tokens) {
  const auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  AppendFlushWorkspace w;
  w.max_tiles = AppendFlushMaxTiles(cfg, batch, cap, max_tokens);
  w.rows = align(w.max_tiles * static_cast<size_t>(num_kv_heads) * cfg.record_bytes());
  w.first = w.rows + align(2 * max_tokens * static_cast<size_t>(num_kv_heads) * cfg.D * 2);
  w.total = w.first + align((static_cast<size_t>(batch) + 1) * 4);
  return w;
}

struct Context {
  const BackendOps* ops = nullptr;
  kvarn_backend_t backend = KVARN_BACKEND_CPU;
  int device = 0;
  void* stream = nullptr;
  int num_threads = 1;
  kvarn_cpu_isa_t isa = KVARN_CPU_ISA_NONE;
  std::unique_ptr<ThreadPool> pool;  // CPU backends
  void* backend_state = nullptr;     // owned by the backend (context_release frees it)
  int32_t host_error_word = 0;       // kvarn_context_error_word where the backend has none
};

// The registry (core/registry.cpp).
int BackendCount();
// Static description of backend `index` (0..BackendCount()-1).
const BackendOps* BackendAt(int index);
kvarn_backend_t BackendKindAt(int index);
// Why backend `index` is not compiled in ("" when it is).
const char* BackendMissingReasonAt(int index);
Status CreateContext(const kvarn_context_options_t& options, std::unique_ptr<Context>* out);
void DestroyContext(Context* ctx);

}  // namespace kvarn
