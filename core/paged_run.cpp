#include "core/paged_run.h"

#include <cstdint>
#include <string>
#include <utility>

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

// The row stride of a token tensor of `rows` rows of `heads` x D elements: `given` (0 = dense)
// checked to hold a row, and the rows' extent checked to fit in memory (4-byte elements at most).
Status ResolveRowStride(int64_t given, size_t rows, int heads, int D, const char* name,
                        int64_t* out) {
  const int64_t dense = static_cast<int64_t>(heads) * D;
  if (given != 0 && given < dense) {
    return InvalidArgument(std::string("launch->") + name + " is " + std::to_string(given) +
                           ", less than a row (" + std::to_string(heads) + " heads x " +
                           std::to_string(D) + " = " + std::to_string(dense) +
                           " elements): rows would overlap");
  }
  const int64_t stride = given == 0 ? dense : given;
  // The last row ends at (rows - 1) * stride + dense elements.
  size_t bytes = 0;
  if (rows > 0 &&
      (!CheckedMul(&bytes, rows - 1, stride, 4) ||
       !CheckedAdd(&bytes, static_cast<size_t>(dense) * 4) || bytes > kMaxObjectBytes)) {
    return InvalidArgument(std::string("launch->") + name +
                           ": the strided rows would be larger than the address space");
  }
  *out = stride;
  return Status::Ok();
}

// int64 lists are read as int64_t: they must be 8-byte aligned.
Status CheckIndexList(const LaunchArgs& launch, const void* list, const char* name) {
  if (launch.index64 && reinterpret_cast<uintptr_t>(list) % alignof(int64_t) != 0) {
    return InvalidArgument(std::string(name) +
                           " must be 8-byte aligned with launch->index_type KVARN_INDEX_INT64");
  }
  return Status::Ok();
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
  const std::pair<int64_t, const char*> strides[] = {{l.q_row_stride, "q_row_stride"},
                                                     {l.k_row_stride, "k_row_stride"},
                                                     {l.v_row_stride, "v_row_stride"},
                                                     {l.out_row_stride, "out_row_stride"}};
  for (const auto& [stride, name] : strides) {
    if (stride < 0) {
      return InvalidArgument(std::string("launch->") + name + " is " + std::to_string(stride) +
                             "; row strides are element counts >= 0 (0 = dense)");
    }
  }
  out->q_row_stride = l.q_row_stride;
  out->k_row_stride = l.k_row_stride;
  out->v_row_stride = l.v_row_stride;
  out->out_row_stride = l.out_row_stride;
  const int32_t index_type = EnumInt(l.index_type);
  if (index_type != KVARN_INDEX_INT32 && index_type != KVARN_INDEX_INT64) {
    return InvalidArgument("launch->index_type: unknown value " + std::to_string(index_type));
  }
  out->index64 = index_type == KVARN_INDEX_INT64;
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

Status CheckPlanPool(const AttentionPlan& plan, const PagedKV& kv) {
  if (plan.needs_aligned_pool && !PoolsAligned16(kv)) {
    return InvalidArgument(std::string("the plan's kernel (") + plan.kernel +
                           ") reads the pools with 16-byte copies: records, k_pages and v_pages "
                           "must be 16-byte aligned and record_stride a multiple of 16 (got " +
                           std::to_string(kv.record_stride) + ")");
  }
  return Status::Ok();
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
  LaunchArgs l = launch;
  KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.k_row_stride, max_tokens, kv.num_kv_heads, cfg.D,
                                         "k_row_stride", &l.k_row_stride));
  KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.v_row_stride, max_tokens, kv.num_kv_heads, cfg.D,
                                         "v_row_stride", &l.v_row_stride));
  KVARN_RETURN_IF_ERROR(CheckIndexList(l, slot_mapping, "slot_mapping"));
  if (static_cast<size_t>(kv.num_pages) * cfg.G > kMaxLaunchItems) {
    return Unsupported("a page pool of more than 2^31-1 token slots");
  }
  return ctx->ops->paged_append_run(ctx, cfg, kv, l, token_indptr, slot_mapping, max_tokens, dtype,
                                    k, v);
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
  KVARN_RETURN_IF_ERROR(CheckIndexList(launch, src_pages, "src_pages"));
  KVARN_RETURN_IF_ERROR(CheckIndexList(launch, dst_blocks, "dst_blocks"));
  KVARN_RETURN_IF_ERROR(CheckIndexList(launch, tile_seqs, "tile_seqs"));
  KVARN_RETURN_IF_ERROR(CheckFlushRecords(kv.num_kv_heads, max_tiles));
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("the flushed records", max_tiles, kv.num_kv_heads, cfg.record_bytes()));
  KVARN_RETURN_IF_ERROR(CheckWorkspace(launch, FlushWorkspaceBytes(cfg, kv.num_kv_heads, max_tiles),
                                       "kvarn_paged_flush_workspace_size"));
  return ctx->ops->paged_flush_run(ctx, cfg, kv, launch, max_tiles, n_tiles, src_pages, dst_blocks,
                                   tile_seqs);
}

// ---- the per-request tail state (kvarn_experimental.h) ------------------------------------------

namespace {

constexpr int kMaxStepTokens = 1 << 16;

Status CheckTailArgs(const Config& cfg, int num_kv_heads, int max_step_tokens) {
  if (cfg.sink_tiles != 0) {
    return Unsupported(
        "the tail state holds no sink: the config's sink_tiles must be 0 (the "
        "sink is a record block like the other tiles)");
  }
  if (num_kv_heads <= 0) return InvalidArgument("num_kv_heads must be >= 1");
  if (max_step_tokens < 1 || max_step_tokens > kMaxStepTokens) {
    return InvalidArgument("max_step_tokens must be in [1, 65536], not " +
                           std::to_string(max_step_tokens));
  }
  return Status::Ok();
}

// The backend's tail-state entry points, or UNSUPPORTED.
Status CheckTailBackend(const Context* ctx) {
  if (ctx->ops->paged_flush_tail_run == nullptr || ctx->ops->paged_append_tail_run == nullptr) {
    return Unsupported(std::string("the tail state is not supported on the ") + ctx->ops->name +
                       " backend");
  }
  return Status::Ok();
}

}  // namespace

int64_t TailCap(const Config& cfg, int max_step_tokens) {
  return (int64_t{cfg.G} - 1 + max_step_tokens + 7) / 8 * 8;
}

Status TailStateBytes(const Config& cfg, int num_kv_heads, int max_step_tokens, int row_bits,
                      size_t* out) {
  KVARN_RETURN_IF_ERROR(CheckTailArgs(cfg, num_kv_heads, max_step_tokens));
  if (row_bits != 0 && row_bits != 16 && row_bits != 8) {
    return InvalidArgument("row_bits must be 16 (or 0: fp16 rows) or 8 (int8 rows), not " +
                           std::to_string(row_bits));
  }
  const size_t cap = static_cast<size_t>(TailCap(cfg, max_step_tokens));
  // fp16: 2 bytes a value; int8: 1 byte a value plus an fp16 scale a row.
  const size_t row_bytes = row_bits == 8 ? static_cast<size_t>(cfg.D) + 2 : 2 * cfg.D;
  KVARN_RETURN_IF_ERROR(CheckBufferSize("a tail slot", 2, num_kv_heads, cap, row_bytes));
  *out = 2 * static_cast<size_t>(num_kv_heads) * cap * row_bytes;
  return Status::Ok();
}

Status FlushTailWorkspaceBytes(const Config& cfg, int num_kv_heads, int batch, int max_step_tokens,
                               size_t* out) {
  KVARN_RETURN_IF_ERROR(CheckTailArgs(cfg, num_kv_heads, max_step_tokens));
  if (batch < 0) return InvalidArgument("batch must be >= 0");
  // A slot holds at most cap rows, so one call flushes at most cap / G tiles of a sequence.
  const size_t tiles = static_cast<size_t>(batch) * (TailCap(cfg, max_step_tokens) / cfg.G);
  KVARN_RETURN_IF_ERROR(CheckFlushRecords(num_kv_heads, tiles));
  *out = FlushWorkspaceBytes(cfg, num_kv_heads, tiles);
  return Status::Ok();
}

Status AppendFlushTailWorkspaceBytes(const Config& cfg, int num_kv_heads, int batch,
                                     int max_step_tokens, size_t max_tokens, size_t* out) {
  KVARN_RETURN_IF_ERROR(CheckTailArgs(cfg, num_kv_heads, max_step_tokens));
  if (batch < 0) return InvalidArgument("batch must be >= 0");
  if (max_tokens > kMaxLaunchItems) return InvalidArgument("max_tokens must be < 2^31");
  const int cap = static_cast<int>(TailCap(cfg, max_step_tokens));
  const size_t tiles = AppendFlushMaxTiles(cfg, batch, cap, max_tokens);
  KVARN_RETURN_IF_ERROR(CheckFlushRecords(num_kv_heads, tiles));
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("the staged records", tiles, num_kv_heads, cfg.record_bytes()));
  KVARN_RETURN_IF_ERROR(CheckBufferSize("the staged rows", max_tokens, num_kv_heads, cfg.D, 4));
  *out = AppendFlushWorkspaceLayout(cfg, num_kv_heads, batch, cap, max_tokens).total;
  return Status::Ok();
}

Status ParseTailState(const kvarn_tail_state_t* in, const Config& cfg, PagedKV* kv) {
  kvarn_tail_state_t t;
  kvarn_tail_state_defaults(&t);
  KVARN_RETURN_IF_ERROR(ReadStruct(in, "tail", &t));
  size_t need = 0;
  KVARN_RETURN_IF_ERROR(
      TailStateBytes(cfg, kv->num_kv_heads, t.max_step_tokens, t.row_bits, &need));
  if (t.slot_bytes < need || t.slot_bytes % 2 != 0) {
    return InvalidArgument("tail->slot_bytes is " + std::to_string(t.slot_bytes) +
                           "; a slot needs " + std::to_string(need) +
                           " (kvarn_tail_state_bytes), in a multiple of 2");
  }
  if (t.num_slots < 0) return InvalidArgument("tail->num_slots must be >= 0");
  if (kv->batch > 0 && (t.states == nullptr || t.slots == nullptr || t.num_slots == 0)) {
    return InvalidArgument("tail->states or tail->slots is NULL, or tail->num_slots is 0");
  }
  KVARN_RETURN_IF_ERROR(CheckBufferSize("the tail slots", t.num_slots, t.slot_bytes));
  kv->tail_states = static_cast<uint16_t*>(t.states);
  kv->tail_slot_elems = t.slot_bytes / 2;
  kv->tail_cap = static_cast<int>(TailCap(cfg, t.max_step_tokens));
  kv->tail_bits = t.row_bits == 8 ? 8 : 16;
  kv->num_tail_slots = t.num_slots;
  kv->tail_slots = t.slots;
  return Status::Ok();
}

Status OpPagedAppendTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                            const LaunchArgs& launch, const int32_t* token_indptr,
                            size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  KVARN_RETURN_IF_ERROR(CheckTailBackend(ctx));
  KVARN_RETURN_IF_ERROR(CheckDtypeArg(dtype, "dtype"));
  if (kv.batch == 0 || max_tokens == 0) return Status::Ok();
  if (token_indptr == nullptr) return InvalidArgument("token_indptr is NULL");
  if (k == nullptr || v == nullptr) return InvalidArgument("k or v is NULL");
  if (max_tokens > kMaxLaunchItems) return InvalidArgument("max_tokens must be < 2^31");
  LaunchArgs l = launch;
  KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.k_row_stride, max_tokens, kv.num_kv_heads, cfg.D,
                                         "k_row_stride", &l.k_row_stride));
  KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.v_row_stride, max_tokens, kv.num_kv_heads, cfg.D,
                                         "v_row_stride", &l.v_row_stride));
  return ctx->ops->paged_append_tail_run(ctx, cfg, kv, l, token_indptr, max_tokens, dtype, k, v);
}

Status OpPagedFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const LaunchArgs& launch, const int32_t* committed,
                           int32_t* record_tiles_out) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  KVARN_RETURN_IF_ERROR(CheckTailBackend(ctx));
  if (kv.batch == 0) return Status::Ok();
  if (committed == nullptr || record_tiles_out == nullptr) {
    return InvalidArgument("committed or record_tiles_out is NULL");
  }
  if (kv.num_record_blocks == 0) return InvalidArgument("flush needs a record pool");
  const int max_step = static_cast<int>(kv.tail_cap - cfg.G + 1);  // cap >= G - 1 + max_step
  size_t need = 0;
  KVARN_RETURN_IF_ERROR(FlushTailWorkspaceBytes(cfg, kv.num_kv_heads, kv.batch, max_step, &need));
  KVARN_RETURN_IF_ERROR(CheckWorkspace(launch, need, "kvarn_paged_flush_tail_workspace_size"));
  return ctx->ops->paged_flush_tail_run(ctx, cfg, kv, launch, committed, record_tiles_out);
}

Status OpPagedAppendFlushTailRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                                 const LaunchArgs& launch, const int32_t* token_indptr,
                                 size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                 const void* v, const int32_t* committed,
                                 int32_t* record_tiles_out) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  KVARN_RETURN_IF_ERROR(CheckTailBackend(ctx));
  if (ctx->ops->paged_append_flush_tail_run == nullptr) {
    return Unsupported(std::string("kvarn_paged_append_flush_tail_run is not supported on the ") +
                       ctx->ops->name +
                       " backend (kvarn_paged_append_tail_run and kvarn_paged_flush_tail_run are)");
  }
  KVARN_RETURN_IF_ERROR(CheckDtypeArg(dtype, "dtype"));
  if (kv.batch == 0) return Status::Ok();
  if (max_tokens > 0 && token_indptr == nullptr) return InvalidArgument("token_indptr is NULL");
  if (max_tokens > 0 && (k == nullptr || v == nullptr)) return InvalidArgument("k or v is NULL");
  if (committed == nullptr || record_tiles_out == nullptr) {
    return InvalidArgument("committed or record_tiles_out is NULL");
  }
  if (kv.num_record_blocks == 0) return InvalidArgument("flush needs a record pool");
  if (max_tokens > kMaxLaunchItems) return InvalidArgument("max_tokens must be < 2^31");
  LaunchArgs l = launch;
  if (max_tokens > 0) {
    KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.k_row_stride, max_tokens, kv.num_kv_heads, cfg.D,
                                           "k_row_stride", &l.k_row_stride));
    KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.v_row_stride, max_tokens, kv.num_kv_heads, cfg.D,
                                           "v_row_stride", &l.v_row_stride));
  }
  const int max_step = static_cast<int>(kv.tail_cap - cfg.G + 1);  // cap >= G - 1 + max_step
  size_t need = 0;
  KVARN_RETURN_IF_ERROR(
      AppendFlushTailWorkspaceBytes(cfg, kv.num_kv_heads, kv.batch, max_step, max_tokens, &need));
  KVARN_RETURN_IF_ERROR(
      CheckWorkspace(launch, need, "kvarn_paged_append_flush_tail_workspace_size"));
  return ctx->ops->paged_append_flush_tail_run(ctx, cfg, kv, l, token_indptr, max_tokens, dtype, k,
                                               v, committed, record_tiles_out);
}

Status OpPagedAttentionRun(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const AttentionShape& shape, const AttentionArgs& args,
                           const AttentionPlan& plan, const LaunchArgs& launch,
                           const int32_t* q_indptr, const void* q, void* out, float* lse) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (kv.tail_states != nullptr) KVARN_RETURN_IF_ERROR(CheckTailBackend(ctx));
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
  // The tensors first (a size-0 call reads none of them), then the workspace and the pools.
  const bool empty = kv.batch == 0 || shape.max_total_q == 0;
  AttentionArgs a = args;
  if (!empty) {
    if (q == nullptr || out == nullptr) return InvalidArgument("q or out is NULL");
    const size_t rows = static_cast<size_t>(shape.max_total_q);
    KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.q_row_stride, rows, args.num_q_heads, cfg.D,
                                           "q_row_stride", &a.q_row_stride));
    KVARN_RETURN_IF_ERROR(ResolveRowStride(launch.out_row_stride, rows, args.num_q_heads, cfg.D,
                                           "out_row_stride", &a.out_row_stride));
  }
  KVARN_RETURN_IF_ERROR(
      CheckWorkspace(launch, plan.workspace, "kvarn_attention_plan_workspace_size"));
  KVARN_RETURN_IF_ERROR(CheckPlanPool(plan, kv));
  if (empty) return Status::Ok();
  return ctx->ops->paged_attention_run(ctx, cfg, kv, shape, a, plan, launch, q_indptr, q, out, lse);
}

}  // namespace kvarn
