// Entry points of the CUDA backend's operations, called through the backend table in
// cuda_backend.cu with the context's device already current. Arguments are checked by
// core/ops.cpp; pointers are device pointers except where the C API says host.
#pragma once

#include "core/backend.h"

namespace kvarn {
namespace gpu {

// codec_kernels.cu
Status Rotate(Context* ctx, int D, size_t rows, kvarn_dtype_t in_dtype, const void* in,
              kvarn_dtype_t out_dtype, void* out);
Status Quantize(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype, const void* k,
                const void* v, uint32_t flags, void* records, size_t record_stride);
Status Dequantize(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                  size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k, void* v);
Status PagedAppend(Context* ctx, const Config& cfg, const PagedKV& kv, const int32_t* token_indptr,
                   kvarn_dtype_t dtype, const void* k, const void* v);
Status PagedFlush(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                  const int32_t* src_pages, const int32_t* dst_blocks);

Status PagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                      const int32_t* token_indptr, const int32_t* slot_mapping, size_t max_tokens,
                      kvarn_dtype_t dtype, const void* k, const void* v);
Status PagedFlushRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                     size_t max_tiles, const int32_t* n_tiles, const int32_t* src_pages,
                     const int32_t* dst_blocks, const int32_t* tile_seqs);
// The per-request tail state (kvarn_experimental.h; kv.tail_states set).
Status PagedAppendTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const LaunchArgs& launch, const int32_t* token_indptr, size_t max_tokens,
                          kvarn_dtype_t dtype, const void* k, const void* v);
Status PagedFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const LaunchArgs& launch, const int32_t* committed,
                         int32_t* record_tiles_out);
Status PagedAppendFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                               const LaunchArgs& launch, const int32_t* token_indptr,
                               size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v,
                               const int32_t* committed, int32_t* record_tiles_out);
// codec_paged_append.cu: the appended rows of kvarn_paged_append_flush_tail_run, validated and
// converted to the cache frame, into staging (fp16 [2][max_tokens][Hk][D]); a faulty sequence's
// status is set (or, without a status array, the call's error words).
Status StageTailAppendRows(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const LaunchArgs& launch, const int32_t* token_indptr, size_t max_tokens,
                           kvarn_dtype_t dtype, const void* k, const void* v, uint16_t* staging);

// attention_kernels.cu
Status AttentionWorkspace(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const AttentionArgs& args, size_t total_q, size_t* bytes);
Status PagedAttention(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                      const void* q, void* out, float* lse, void* workspace,
                      size_t workspace_bytes);
Status AttentionPlanFor(Context* ctx, const Config& cfg, const AttentionShape& shape,
                        const AttentionArgs& args, AttentionPlan* plan);
Status PagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const AttentionShape& shape, const AttentionArgs& args,
                         const AttentionPlan& plan, const LaunchArgs& launch,
                         const int32_t* q_indptr, const void* q, void* out, float* lse);

}  // namespace gpu
}  // namespace kvarn
