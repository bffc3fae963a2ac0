// Paged attention over engine-owned memory (layer 2).
#include <cstring>

#include "capi/src/shim.h"
#include "core/config.h"
#include "core/ops.h"

using kvarn::AttentionArgs;
using kvarn::Config;
using kvarn::PagedKV;
using kvarn::Status;
using kvarn::capi::Guard;
using kvarn::capi::NeedContext;

namespace {

// The checks every layer-2 entry starts with.
Status ParseCommon(const kvarn_context_t* context, const kvarn_config_t* config,
                   const kvarn_paged_kv_t* kv, Config* c, PagedKV* p) {
  KVARN_RETURN_IF_ERROR(NeedContext(context));
  KVARN_RETURN_IF_ERROR(kvarn::ParseConfig(config, c));
  return kvarn::ParsePagedKV(kv, *c, p);
}

}  // namespace

extern "C" {

void kvarn_paged_kv_defaults(kvarn_paged_kv_t* kv) {
  if (kv == nullptr) return;
  std::memset(kv, 0, sizeof *kv);
  kv->size = sizeof *kv;
}

void kvarn_attention_params_defaults(kvarn_attention_params_t* p) {
  if (p == nullptr) return;
  std::memset(p, 0, sizeof *p);
  p->size = sizeof *p;
  p->scale = 0.f;
  p->q_indptr = nullptr;
  p->q_dtype = KVARN_DTYPE_F32;
  p->out_dtype = KVARN_DTYPE_F32;
  p->num_splits = 0;
  p->sinks = nullptr;
  p->sliding_window = 0;
  p->logit_softcap = 0.f;
  p->mode = KVARN_ATTENTION_CAUSAL;
}

kvarn_status_t kvarn_paged_append(kvarn_context_t* context, const kvarn_config_t* config,
                                  const kvarn_paged_kv_t* kv, const int32_t* token_indptr,
                                  kvarn_dtype_t dtype, const void* k, const void* v) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    KVARN_RETURN_IF_ERROR(ParseCommon(context, config, kv, &c, &p));
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(dtype, "dtype"));
    return kvarn::OpPagedAppend(context->impl.get(), c, p, token_indptr, dtype, k, v);
  });
}

kvarn_status_t kvarn_paged_flush(kvarn_context_t* context, const kvarn_config_t* config,
                                 const kvarn_paged_kv_t* kv, size_t n_tiles,
                                 const int32_t* src_pages, const int32_t* dst_blocks) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    KVARN_RETURN_IF_ERROR(ParseCommon(context, config, kv, &c, &p));
    return kvarn::OpPagedFlush(context->impl.get(), c, p, n_tiles, src_pages, dst_blocks);
  });
}

kvarn_status_t kvarn_paged_attention_workspace_size(kvarn_context_t* context,
                                                    const kvarn_config_t* config,
                                                    const kvarn_paged_kv_t* kv,
                                                    const kvarn_attention_params_t* params,
                                                    size_t total_q_tokens, size_t* out_bytes) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    KVARN_RETURN_IF_ERROR(ParseCommon(context, config, kv, &c, &p));
    AttentionArgs a;
    KVARN_RETURN_IF_ERROR(kvarn::ParseAttentionParams(params, c, p.num_kv_heads, &a));
    return kvarn::OpAttentionWorkspace(context->impl.get(), c, p, a, total_q_tokens, out_bytes);
  });
}

kvarn_status_t kvarn_paged_attention(kvarn_context_t* context, const kvarn_config_t* config,
                                     const kvarn_paged_kv_t* kv,
                                     const kvarn_attention_params_t* params, const void* q,
                                     void* out, float* lse, void* workspace,
                                     size_t workspace_bytes) {
  return Guard([&]() -> Status {
    Config c;
    PagedKV p;
    KVARN_RETURN_IF_ERROR(ParseCommon(context, config, kv, &c, &p));
    AttentionArgs a;
    KVARN_RETURN_IF_ERROR(kvarn::ParseAttentionParams(params, c, p.num_kv_heads, &a));
    return kvarn::OpPagedAttention(context->impl.get(), c, p, a, q, out, lse, workspace,
                                   workspace_bytes);
  });
}

}  // extern "C"
