// Layer 2, capturable form (kvarn.h "plan / run"): the C entry points and the plan object.
#include <cstring>
#include <new>

#include "capi/src/shim.h"
#include "core/abi_struct.h"
#include "core/config.h"
#include "core/ops.h"
#include "core/paged_run.h"

using kvarn::AttentionArgs;
using kvarn::AttentionPlan;
using kvarn::AttentionShape;
using kvarn::Config;
using kvarn::LaunchArgs;
using kvarn::PagedKV;
using kvarn::Status;
using kvarn::capi::Guard;
using kvarn::capi::NeedContext;

// A plan remembers everything the run calls need from the host: the config, the shape, the
// attention parameters and the backend's decisions, so a run reads only device pointers.
struct kvarn_attention_plan {
  const kvarn_context_t* context;
  Config cfg;
  AttentionShape shape;
  AttentionArgs args;
  AttentionPlan plan;
};

namespace {

Status ParseRunCommon(const kvarn_context_t* context, const kvarn_config_t* config,
                      const kvarn_paged_kv_t* kv, const kvarn_launch_t* launch, Config* c,
                      PagedKV* p, LaunchArgs* l) {
  KVARN_RETURN_IF_ERROR(NeedContext(context));
  KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, c));
  // Append and flush read no table (kvarn.h): the kv may leave them NULL.
  KVARN_RETURN_IF_ERROR(kvarn::ParsePagedKV(kv, *c, p, kvarn::PagedTables::kSkip));
  return kvarn::ParseLaunch(launch, l);
}

// The tail-state calls: a kv with its tables, and the tail state over it.
Status ParseTailRunCommon(const kvarn_context_t* context, const kvarn_config_t* config,
                          const kvarn_paged_kv_t* kv, const kvarn_tail_state_t* tail,
                          const kvarn_launch_t* launch, Config* c, PagedKV* p, LaunchArgs* l) {
  KVARN_RETURN_IF_ERROR(NeedContext(context));
  KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, c));
  KVARN_RETURN_IF_ERROR(kvarn::ParsePagedKV(kv, *c, p));
  KVARN_RETURN_IF_ERROR(kvarn::ParseTailState(tail, *c, p));
  return kvarn::ParseLaunch(launch, l);
}

// The attention run calls: a plan of this context and a kv under its config; with_tail also
// parses the tail state.
Status ParsePlanRun(const kvarn_context_t* context, const kvarn_attention_plan_t* plan,
                    const kvarn_paged_kv_t* kv, bool with_tail, const kvarn_tail_state_t* tail,
                    const kvarn_launch_t* launch, PagedKV* p, LaunchArgs* l) {
  KVARN_RETURN_IF_ERROR(NeedContext(context));
  if (plan == nullptr) return kvarn::InvalidArgument("plan is NULL");
  if (plan->context != context) {
    return kvarn::InvalidArgument("the plan was made on another context");
  }
  KVARN_RETURN_IF_ERROR(kvarn::ParsePagedKV(kv, plan->cfg, p));
  if (with_tail) KVARN_RETURN_IF_ERROR(kvarn::ParseTailState(tail, plan->cfg, p));
  return kvarn::ParseLaunch(launch, l);
}

}  // namespace

extern "C" {

void kvarn_launch_defaults(kvarn_launch_t* launch) {
  if (launch == nullptr) return;
  std::memset(launch, 0, sizeof *launch);
  launch->size = sizeof *launch;
}

void kvarn_attention_shape_defaults(kvarn_attention_shape_t* shape) {
  if (shape == nullptr) return;
  std::memset(shape, 0, sizeof *shape);
  shape->size = sizeof *shape;
  shape->num_kv_heads = 1;
}

kvarn_status_t kvarn_paged_append_run(kvarn_context_t* context, const kvarn_config_t* config,
                                      const kvarn_paged_kv_t* kv, const kvarn_launch_t* launch,
                                      const int32_t* token_indptr, const int32_t* slot_mapping,
                                      size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                      const void* v) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParseRunCommon(context, config, kv, launch, &c, &p, &l));
    // Read as an integer before any copy: an out-of-range value in the enum is UB (kvarn.h).
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(dtype, "dtype"));
    return kvarn::OpPagedAppendRun(context->impl.get(), c, p, l, token_indptr, slot_mapping,
                                   max_tokens, dtype, k, v);
  });
}

kvarn_status_t kvarn_paged_flush_workspace_size(const kvarn_config_t* config, int32_t num_kv_heads,
                                                size_t max_tiles, size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    if (out_bytes == nullptr) return kvarn::InvalidArgument("out_bytes is NULL");
    if (num_kv_heads <= 0) return kvarn::InvalidArgument("num_kv_heads must be >= 1");
    KVARN_RETURN_IF_ERROR(kvarn::CheckFlushRecords(num_kv_heads, max_tiles));
    *out_bytes = kvarn::FlushWorkspaceBytes(c, num_kv_heads, max_tiles);
    return Status::Ok();
  });
}

kvarn_status_t kvarn_paged_flush_run(kvarn_context_t* context, const kvarn_config_t* config,
                                     const kvarn_paged_kv_t* kv, const kvarn_launch_t* launch,
                                     size_t max_tiles, const int32_t* n_tiles,
                                     const int32_t* src_pages, const int32_t* dst_blocks,
                                     const int32_t* tile_seqs) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParseRunCommon(context, config, kv, launch, &c, &p, &l));
    return kvarn::OpPagedFlushRun(context->impl.get(), c, p, l, max_tiles, n_tiles, src_pages,
                                  dst_blocks, tile_seqs);
  });
}

kvarn_status_t kvarn_attention_plan_create(kvarn_context_t* context, const kvarn_config_t* config,
                                           const kvarn_attention_shape_t* shape,
                                           const kvarn_attention_params_t* params,
                                           kvarn_attention_plan_t** out_plan) {
  return Guard([&]() -> Status {
    if (out_plan == nullptr) return kvarn::InvalidArgument("out_plan is NULL");
    KVARN_RETURN_IF_ERROR(NeedContext(context));
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    AttentionShape s;
    KVARN_RETURN_IF_ERROR(kvarn::ParseAttentionShape(shape, &s));
    AttentionArgs a;
    KVARN_RETURN_IF_ERROR(kvarn::ParseAttentionParams(params, c, s.num_kv_heads, &a));
    AttentionPlan plan;
    KVARN_RETURN_IF_ERROR(kvarn::OpAttentionPlan(context->impl.get(), c, s, a, &plan));
    auto* p = new kvarn_attention_plan{context, c, s, a, plan};
    *out_plan = p;
    return Status::Ok();
  });
}

void kvarn_attention_plan_destroy(kvarn_attention_plan_t* plan) { delete plan; }

kvarn_status_t kvarn_attention_plan_kernel(const kvarn_attention_plan_t* plan,
                                           const char** out_name) {
  return Guard([&]() -> Status {
    if (plan == nullptr || out_name == nullptr) {
      return kvarn::InvalidArgument("plan or out_name is NULL");
    }
    *out_name = plan->plan.kernel;
    return Status::Ok();
  });
}

kvarn_status_t kvarn_attention_plan_workspace_size(const kvarn_attention_plan_t* plan,
                                                   size_t* out_bytes) {
  return Guard([&]() -> Status {
    if (plan == nullptr || out_bytes == nullptr) {
      return kvarn::InvalidArgument("plan or out_bytes is NULL");
    }
    *out_bytes = plan->plan.workspace;
    return Status::Ok();
  });
}

kvarn_status_t kvarn_paged_attention_run(kvarn_context_t* context,
                                         const kvarn_attention_plan_t* plan,
                                         const kvarn_paged_kv_t* kv, const kvarn_launch_t* launch,
                                         const int32_t* q_indptr, const void* q, void* out,
                                         float* lse) {
  return Guard([&]() -> Status {
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParsePlanRun(context, plan, kv, false, nullptr, launch, &p, &l));
    return kvarn::OpPagedAttentionRun(context->impl.get(), plan->cfg, p, plan->shape, plan->args,
                                      plan->plan, l, q_indptr, q, out, lse);
  });
}

// ---- the per-request tail state (kvarn_experimental.h) ------------------------------------------

void kvarn_tail_state_defaults(kvarn_tail_state_t* tail) {
  if (tail == nullptr) return;
  std::memset(tail, 0, sizeof *tail);
  tail->size = sizeof *tail;
  tail->max_step_tokens = 1;
}

kvarn_status_t kvarn_tail_state_bytes(const kvarn_config_t* config, int32_t num_kv_heads,
                                      int32_t max_step_tokens, int32_t row_bits,
                                      size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    if (out_bytes == nullptr) return kvarn::InvalidArgument("out_bytes is NULL");
    return kvarn::TailStateBytes(c, num_kv_heads, max_step_tokens, row_bits, out_bytes);
  });
}

kvarn_status_t kvarn_paged_flush_tail_workspace_size(const kvarn_config_t* config,
                                                     int32_t num_kv_heads, int32_t batch,
                                                     int32_t max_step_tokens, size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    if (out_bytes == nullptr) return kvarn::InvalidArgument("out_bytes is NULL");
    return kvarn::FlushTailWorkspaceBytes(c, num_kv_heads, batch, max_step_tokens, out_bytes);
  });
}

kvarn_status_t kvarn_paged_append_tail_run(kvarn_context_t* context, const kvarn_config_t* config,
                                           const kvarn_paged_kv_t* kv,
                                           const kvarn_tail_state_t* tail,
                                           const kvarn_launch_t* launch,
                                           const int32_t* token_indptr, size_t max_tokens,
                                           kvarn_dtype_t dtype, const void* k, const void* v) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParseTailRunCommon(context, config, kv, tail, launch, &c, &p, &l));
    return kvarn::OpPagedAppendTailRun(context->impl.get(), c, p, l, token_indptr, max_tokens,
                                       dtype, k, v);
  });
}

kvarn_status_t kvarn_paged_flush_tail_run(kvarn_context_t* context, const kvarn_config_t* config,
                                          const kvarn_paged_kv_t* kv,
                                          const kvarn_tail_state_t* tail,
                                          const kvarn_launch_t* launch, const int32_t* committed,
                                          int32_t* record_tiles_out) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParseTailRunCommon(context, config, kv, tail, launch, &c, &p, &l));
    return kvarn::OpPagedFlushTailRun(context->impl.get(), c, p, l, committed, record_tiles_out);
  });
}

kvarn_status_t kvarn_paged_append_flush_tail_workspace_size(const kvarn_config_t* config,
                                                            int32_t num_kv_heads, int32_t batch,
                                                            int32_t max_step_tokens,
                                                            size_t max_tokens, size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, &c));
    if (out_bytes == nullptr) return kvarn::InvalidArgument("out_bytes is NULL");
    return kvarn::AppendFlushTailWorkspaceBytes(c, num_kv_heads, batch, max_step_tokens, max_tokens,
                                                out_bytes);
  });
}

kvarn_status_t kvarn_paged_append_flush_tail_run(
    kvarn_context_t* context, const kvarn_config_t* config, const kvarn_paged_kv_t* kv,
    const kvarn_tail_state_t* tail, const kvarn_launch_t* launch, const int32_t* token_indptr,
    size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v, const int32_t* committed,
    int32_t* record_tiles_out) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParseTailRunCommon(context, config, kv, tail, launch, &c, &p, &l));
    return kvarn::OpPagedAppendFlushTailRun(context->impl.get(), c, p, l, token_indptr, max_tokens,
                                            dtype, k, v, committed, record_tiles_out);
  });
}

kvarn_status_t kvarn_paged_attention_tail_run(kvarn_context_t* context,
                                              const kvarn_attention_plan_t* plan,
                                              const kvarn_paged_kv_t* kv,
                                              const kvarn_tail_state_t* tail,
                                              const kvarn_launch_t* launch, const int32_t* q_indptr,
                                              const void* q, void* out, float* lse) {
  return Guard([&]() -> Status {
    PagedKV p;
    LaunchArgs l;
    KVARN_RETURN_IF_ERROR(ParsePlanRun(context, plan, kv, true, tail, launch, &p, &l));
    return kvarn::OpPagedAttentionRun(context->impl.get(), plan->cfg, p, plan->shape, plan->args,
                                      plan->plan, l, q_indptr, q, out, lse);
  });
}

}  // extern "C"
