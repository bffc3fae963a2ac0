// Entry points of the CPU backend's operations (the scalar reference), called through the
// backend table in cpu_backend.cpp.
#pragma once

#include <string>
#include <vector>

#include "core/backend.h"

namespace kvarn {
namespace cpu {

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
Status AttentionWorkspace(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const AttentionArgs& args, size_t total_q, size_t* bytes);
Status PagedAttention(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                      const void* q, void* out, float* lse, void* workspace,
                      size_t workspace_bytes);

// Checks the block table of a paged cache against the pools (host memory): every tile of every
// sequence names an in-range page or record block, and the token counts fit the table.
Status CheckPagedTables(const Config& cfg, const PagedKV& kv);
// The same for sequence b alone.
Status CheckSequenceTables(const Config& cfg, const PagedKV& kv, int b);

// Attention over a batch (paged_attention.cpp). seq_status NULL: any bad sequence fails the call
// before anything is written. Otherwise a sequence whose entry is non-zero is skipped, and a bad
// one gets its entry set and is skipped. max_q_per_seq > 0 bounds the query tokens per sequence,
// max_total_q >= 0 the query rows.
// A sequence with no cached tokens gets zero output rows and lse -inf.
Status AttendBatch(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                   int max_q_per_seq, int64_t max_total_q, int32_t* seq_status, const void* q,
                   void* out, float* lse);

// Capturable layer 2 (paged_run.cpp).
// Sequence b of a batch owns rows [indptr[b], indptr[b+1]) of the call's inputs. A boundary
// indptr[j] is bad when indptr[0] != 0, when it lies outside [0, limit], or when it is below an
// earlier boundary or above a later one; a sequence faults when one of its two boundaries is bad.
// The sequences left own disjoint rows whatever the others' boundaries hold, so their results
// cannot mix (kvarn.h "plan / run"; the GPU backends apply the same rule, gpu/indptr_check.cu).
// Returns the message of sequence b's fault, or "" when its range is good; `name` names the array.
std::vector<std::string> IndptrFaults(const int32_t* indptr, int batch, int64_t limit,
                                      const char* name);
Status AttentionPlanFor(Context* ctx, const Config& cfg, const AttentionShape& shape,
                        const AttentionArgs& args, AttentionPlan* plan);
Status PagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                      const int32_t* token_indptr, const int32_t* slot_mapping, size_t max_tokens,
                      kvarn_dtype_t dtype, const void* k, const void* v);
Status PagedFlushRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                     size_t max_tiles, const int32_t* n_tiles, const int32_t* src_pages,
                     const int32_t* dst_blocks, const int32_t* tile_seqs);
Status PagedAppendTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                          const LaunchArgs& launch, const int32_t* token_indptr, size_t max_tokens,
                          kvarn_dtype_t dtype, const void* k, const void* v);
Status PagedAppendFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                               const LaunchArgs& launch, const int32_t* token_indptr,
                               size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v,
                               const int32_t* committed, int32_t* record_tiles_out);
Status PagedFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const LaunchArgs& launch, const int32_t* committed,
                         int32_t* record_tiles_out);
Status PagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                         const AttentionShape& shape, const AttentionArgs& args,
                         const AttentionPlan& plan, const LaunchArgs& launch,
                         const int32_t* q_indptr, const void* q, void* out, float* lse);

// Rotates (when `rotate`) and rounds one row of D floats to fp16, as the cache stores it. Returns
// false if a value is not finite or does not fit fp16.
// (The scalar reference of the Kernels entry to_cache_frame.)
bool ToCacheFrame(const float* in, int D, bool rotate, float* scratch, uint16_t* out);

struct RecordView;
struct AttnQuery;
struct ScoreParams;
// The scalar reference of the Kernels entries attend_record and attend_page (kernels.h).
void ScalarAttendRecord(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                        const ScoreParams& sp, AttnQuery* qs, int nq, float* scores, float* vsum);
void ScalarAttendPage(const uint16_t* k, const uint16_t* v, int D, int G, const ScoreParams& sp,
                      AttnQuery* qs, int nq, float* scores);

}  // namespace cpu
}  // namespace kvarn
