// The capturable form of layer 2 inside the core (kvarn.h "plan / run"): checks of the
// arguments the host can see, then dispatch to the context's backend. Metadata lives in the
// context's memory and is checked by the backends' kernels (data errors, per sequence).
#pragma once

#include "core/backend.h"
#include "kvarn/kvarn_experimental.h"

namespace kvarn {

// UNSUPPORTED when a flush of max_tiles tiles would launch more than 2^31-1 records (kernels
// index records with int32). num_kv_heads >= 1.
Status CheckFlushRecords(int num_kv_heads, size_t max_tiles);

// A NULL launch means the defaults (the context's stream, no status array, no workspace).
Status ParseLaunch(const kvarn_launch_t* in, LaunchArgs* out);
Status ParseAttentionShape(const kvarn_attention_shape_t* in, AttentionShape* out);

// INVALID_ARGUMENT when the plan's kernel reads the pools with 16-byte copies and kv's pools or
// record stride are not 16-byte aligned.
Status CheckPlanPool(const AttentionPlan& plan, const PagedKV& kv);

Status OpAttentionPlan(Context* ctx, const Config& cfg, const AttentionShape& shape,
                       const AttentionArgs& args, AttentionPlan* plan);
Status OpPagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                        const LaunchArgs& launch, const int32_t* token_indptr,
                        const int32_t* slot_mapping, size_t max_tokens, kvarn_dtype_t dtype,
                        const void* k, const void* v);
Status OpPagedFlushRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                       size_t max_tiles, const int32_t* n_tiles, const int32_t* src_pages,
                       const int32_t* dst_blocks, const int32_t* tile_seqs);
// The per-request tail state (kvarn_experimental.h). Rows of one slot for a config and step.
int64_t TailCap(const Config& cfg, int max_step_tokens);
Status TailStateBytes(const Config& cfg, int num_kv_heads, int max_step_tokens, int row_bits,
                      size_t* out);
Status FlushTailWorkspaceBytes(const Config& cfg, int num_kv_heads, int batch, int max_step_tokens,
                               size_t* out);
// Fills kv's tail fields from *in (kv's num_kv_heads and batch set).
Status ParseTailState(const kvarn_tail_state_t* in, const Config& cfg, PagedKV* kv);
Status OpPagedAppendTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                            const LaunchArgs& launch, const int32_t* token_indptr,
                            size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v);
Status OpPagedFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const LaunchArgs& launch, const int32_t* committed,
                           int32_t* record_tiles_out);
Status AppendFlushTailWorkspaceBytes(const Config& cfg, int num_kv_heads, int batch,
                                     int max_step_tokens, size_t max_tokens, size_t* out);
Status OpPagedAppendFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                                 const LaunchArgs& launch, const int32_t* token_indptr,
                                 size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                 const void* v, const int32_t* committed,
                                 int32_t* record_tiles_out);
// kv.tail_states set: refused unless the backend has the tail state.
Status OpPagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const AttentionShape& shape, const AttentionArgs& args,
                           const AttentionPlan& plan, const LaunchArgs& launch,
                           const int32_t* q_indptr, const void* q, void* out, float* lse);

}  // namespace kvarn
