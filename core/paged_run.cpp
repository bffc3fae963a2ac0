#include "core/paged_run.h"

#include <string>

#include "core/abi_struct.h"
#include "core/ops.h"

namespace kvarn {
namespace {

// Kernels index tokens, tiles and rows with int32.
constexpr size_t kMaxLaunchItems = 0x7fffffff;

Status CheckWorkspace(const LaunchArgs& launch, size_t need, const char* how) {
  return CheckWorkspaceArg(launch.workspace, launch.workspace_bytes, need, "launch->workspace",
                           how);
}

}  // namespace

size_t FlushWorkspaceBytes(const Config& cfg, int num_kv_heads, size_t max_tiles) {
  const size_t records = max_tiles * static_cast<size_t>(num_kv_heads);
  return (records * cfg.record_bytes() + 255) / 256 * 256;
}

Status CheckFlushRecords(int num_kv_heads, size_t max_tiles) {
  if (max_tiles > kMaxLaunchItems / static_cast<size_t>(num_kv_heads)) {
    return Unsupported("more than 2^31-1 records in one flush");
  }
  return Status::Ok();
}

Status ParseLaunch(const kvarn_launch_t* in, LaunchArgs* out) {
  *out = LaunchArgs{};
  if (in == nullptr) return Status::Ok();
  kvarn_launch_t l;
  kvarn_launch_defaults(&l);
  KVARN_RETURN_IF_ERROR(ReadStruct(in, "launch", &l));
  out->stream = l.stream;
  out->seq_status = l.seq_status;
  out->workspace = l.workspace;
  out->workspace_bytes = l.workspace_bytes;
  return Status::Ok();
}

Status ParseAttentionShape(const kvarn_attention_shape_t* in, AttentionShape* out) {
  kvarn_attention_shape_t s;
  kvarn_attention_shape_defaults(&s);
  KVARN_RETURN_IF_ERROR(ReadStruct(in, "shape", &s));
  if (s.batch < 0) return InvalidArgument("shape->batch must be >= 0");
  if (s.num_kv_heads <= 0) return InvalidArgument("shape->num_kv_heads must be >= 1");
  if (s.max_blocks_per_seq < 0) return InvalidArgument("shape->max_blocks_per_seq must be >= 0");
  if (s.max_q_per_seq < 0) return InvalidArgument("shape->max_q_per_seq must be >= 0");
  AttentionShape r;
  r.batch = s.batch;
  r.num_kv_heads = s.num_kv_heads;
  r.max_blocks_per_seq = s.max_blocks_per_seq;
  r.max_q_per_seq = s.max_q_per_seq;
  if (r.decode()) {
    r.max_total_q = s.batch;
  } else {
    if (s.max_total_q < 0) return InvalidArgument("shape->max_total_q must be >= 0");
    if (static_cast<uint64_t>(s.max_total_q) > kMaxLaunchItems) {
      return InvalidArgument("shape->max_total_q must be < 2^31");
    }
    r.max_total_q = s.max_total_q;
  }
  *out = r;
  return Status::Ok();
}

Status OpAttentionPlan(Context* ctx, const Config& cfg, const AttentionShape& shape,
                       const AttentionArgs& args, AttentionPlan* plan) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (args.q_indptr != nullptr) {
    return InvalidArgument("params->q_indptr must be NULL for a plan (queries come at run time)");
  }
  if (args.num_q_heads % shape.num_kv_heads != 0) {
    return InvalidArgument("num_q_heads must be a multiple of shape->num_kv_heads");
  }
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("q or out", shape.max_total_q, args.num_q_heads, cfg.D, sizeof(float)));
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("block_table", shape.batch, shape.max_blocks_per_seq, sizeof(int32_t)));
  return ctx->ops->attention_plan(ctx, cfg, shape, args, plan);
}

Status OpPagedAppendRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                        const LaunchArgs& launch, const int32_t* token_indptr,
                        const int32_t* slot_mapping, size_t max_tokens, kvarn_dtype_t dtype,
                        const void* k, const void* v) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));  // dtype: checked by the C entry point
  if (kv.batch == 0 || max_tokens == 0) return Status::Ok();
  if (token_indptr == nullptr || slot_mapping == nullptr) {
    return InvalidArgument("token_indptr or slot_mapping is NULL");
  }
  if (k == nullptr || v == nullptr) return InvalidArgument("k or v is NULL");
  if (kv.num_pages == 0) return InvalidArgument("append needs a page pool (num_pages is 0)");
  if (max_tokens > kMaxLaunchItems) return InvalidArgument("max_tokens must be < 2^31");
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("k or v", max_tokens, kv.num_kv_heads, cfg.D, sizeof(float)));
  if (static_cast<size_t>(kv.num_pages) * cfg.G > kMaxLaunchItems) {
    return Unsupported("a page pool of more than 2^31-1 token slots");
  }
  return ctx->ops->paged_append_run(ctx, cfg, kv, launch, token_indptr, slot_mapping, max_tokens,
                                    dtype, k, v);
}

Status OpPagedFlushRun(Context* ctx, const Config& cfg, const PagedKV& kv, const LaunchArgs& launch,
                       size_t max_tiles, const int32_t* n_tiles, const int32_t* src_pages,
                       const int32_t* dst_blocks, const int32_t* tile_seqs) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (max_tiles == 0) return Status::Ok();
  if (n_tiles == nullptr || src_pages == nullptr || dst_blocks == nullptr) {
    return InvalidArgument("n_tiles, src_pages or dst_blocks is NULL");
  }
  if (launch.seq_status != nullptr && tile_seqs == nullptr) {
    return InvalidArgument("tile_seqs is NULL but launch->seq_status is set");
  }
  if (kv.num_pages == 0 || kv.num_record_blocks == 0) {
    return InvalidArgument("flush needs both a page pool and a record pool");
  }
  KVARN_RETURN_IF_ERROR(CheckFlushRecords(kv.num_kv_heads, max_tiles));
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("the flushed records", max_tiles, kv.num_kv_heads, cfg.record_bytes()));
  KVARN_RETURN_IF_ERROR(CheckWorkspace(launch, FlushWorkspaceBytes(cfg, kv.num_kv_heads, max_tiles),
                                       "kvarn_paged_flush_workspace_size"));
  return ctx->ops->paged_flush_run(ctx, cfg, kv, launch, max_tiles, n_tiles, src_pages, dst_blocks,
                                   tile_seqs);
}

Status OpPagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const AttentionShape& shape, const AttentionArgs& args,
                           const AttentionPlan& plan, const LaunchArgs& launch,
                           const int32_t* q_indptr, const void* q, void* out, float* lse) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (kv.batch != shape.batch || kv.num_kv_heads != shape.num_kv_heads ||
      kv.max_blocks_per_seq != shape.max_blocks_per_seq) {
    return InvalidArgument("kv (batch " + std::to_string(kv.batch) + ", num_kv_heads " +
                           std::to_string(kv.num_kv_heads) + ", max_blocks_per_seq " +
                           std::to_string(kv.max_blocks_per_seq) +
                           ") does not match the plan's shape (" + std::to_string(shape.batch) +
                           ", " + std::to_string(shape.num_kv_heads) + ", " +
                           std::to_string(shape.max_blocks_per_seq) + ")");
  }
  if (shape.decode() && q_indptr != nullptr) {
    return InvalidArgument("q_indptr must be NULL under a decode plan (max_q_per_seq 0)");
  }
  if (!shape.decode() && q_indptr == nullptr) {
    return InvalidArgument("q_indptr is NULL under an extend plan");
  }
  KVARN_RETURN_IF_ERROR(
      CheckWorkspace(launch, plan.workspace, "kvarn_attention_plan_workspace_size"));
  if (kv.batch == 0 || shape.max_total_q == 0) return Status::Ok();
  if (q == nullptr || out == nullptr) return InvalidArgument("q or out is NULL");
  return ctx->ops->paged_attention_run(ctx, cfg, kv, shape, args, plan, launch, q_indptr, q, out,
                                       lse);
}

}  // namespace kvarn
