// Layers 1 and 2 inside the core: argument checks on the public structs, then dispatch to the
// context's backend. The C shims and the managed cache both call these.
#pragma once

#include <cstring>
#include <string>

#include "core/backend.h"
#include "core/checked.h"

namespace kvarn {

// The integer a C caller stored in an enum argument or field. C allows any int there, but in
// C++ loading a value outside the enum's range as the enum type is undefined behaviour, so the
// public entry points read enums through this and check the integer before any use.
template <typename E>
int32_t EnumInt(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t), "public enums are 32 bits");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// INVALID_ARGUMENT unless ctx is a context with a backend.
Status CheckContext(const Context* ctx);

// INVALID_ARGUMENT unless the product of `factors` (element counts and sizes of a caller
// buffer) fits in one object.
template <typename... T>
Status CheckBufferSize(const char* what, T... factors) {
  size_t bytes = 0;
  if (!CheckedMul(&bytes, factors...) || bytes > kMaxObjectBytes) {
    return InvalidArgument(std::string(what) + " would be larger than the address space");
  }
  return Status::Ok();
}

// BUFFER_TOO_SMALL unless the caller's workspace (`what`, e.g. "launch->workspace") holds
// `need` bytes; a NULL workspace is told apart from a short one. `how` names the size query.
Status CheckWorkspaceArg(const void* workspace, size_t bytes, size_t need, const char* what,
                         const char* how);

// INVALID_ARGUMENT naming `what` unless dtype is a kvarn_dtype_t value.
Status CheckDtypeArg(const kvarn_dtype_t& dtype, const char* what);

bool IsValidDtype(kvarn_dtype_t dtype);
size_t DtypeSize(kvarn_dtype_t dtype);

Status OpRotate(Context* ctx, int32_t head_dim, size_t n_rows, kvarn_dtype_t in_dtype,
                const void* in, kvarn_dtype_t out_dtype, void* out);
Status OpQuantize(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype,
                  const void* k, const void* v, uint32_t flags, void* records,
                  size_t record_stride);
Status OpDequantize(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                    size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k,
                    void* v);

// Checks the struct's own fields (not the contents of its tables, which may live on a device).
// kSkip: for the calls that never read block_table, seq_lens and record_tiles (the slot-mapped
// append, the device-list flush): they may be NULL, and the view holds NULL for them.
enum class PagedTables { kRead, kSkip };
Status ParsePagedKV(const kvarn_paged_kv_t* in, const Config& cfg, PagedKV* out,
                    PagedTables tables = PagedTables::kRead);
Status ParseAttentionParams(const kvarn_attention_params_t* in, const Config& cfg, int num_kv_heads,
                            AttentionArgs* out);

Status OpPagedAppend(Context* ctx, const Config& cfg, const PagedKV& kv,
                     const int32_t* token_indptr, kvarn_dtype_t dtype, const void* k,
                     const void* v);
Status OpPagedFlush(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                    const int32_t* src_pages, const int32_t* dst_blocks);
Status OpAttentionWorkspace(Context* ctx, const Config& cfg, const PagedKV& kv,
                            const AttentionArgs& args, size_t total_q, size_t* bytes);
Status OpPagedAttention(Context* ctx, const Config& cfg, const PagedKV& kv,
                        const AttentionArgs& args, const void* q, void* out, float* lse,
                        void* workspace, size_t workspace_bytes);

}  // namespace kvarn
