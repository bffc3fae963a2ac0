// The managed cache (layer 3).
#include <cstring>

#include "capi/src/shim.h"
#include "core/abi_struct.h"
#include "core/managed_cache.h"
#include "core/ops.h"

struct kvarn_cache {
  std::unique_ptr<kvarn::ManagedCache> impl;
};

using kvarn::Status;
using kvarn::capi::Guard;
using kvarn::capi::NeedContext;

namespace {

Status NeedCache(const kvarn_cache_t* c) {
  if (c == nullptr || !c->impl) return kvarn::InvalidArgument("cache is NULL");
  return Status::Ok();
}

}  // namespace

extern "C" {

void kvarn_cache_options_defaults(kvarn_cache_options_t* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  kvarn_config_defaults(&o->config);
  o->num_layers = 1;
  o->num_kv_heads = 8;
  o->max_tokens = 65536;
  o->max_sequences = 256;
}

kvarn_status_t kvarn_cache_create(kvarn_context_t* context, const kvarn_cache_options_t* options,
                                  kvarn_cache_t** out_cache) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(context));
    if (options == nullptr || out_cache == nullptr) {
      return kvarn::InvalidArgument("options or out_cache is NULL");
    }
    // Growable struct (core/abi_struct.h): fields past options->size keep the defaults; the
    // whole embedded config must be there, with its own size exactly sizeof(kvarn_config_t).
    kvarn_cache_options_t o;
    kvarn_cache_options_defaults(&o);
    KVARN_RETURN_IF_ERROR(kvarn::ReadStruct(options, "options", &o));
    KVARN_RETURN_IF_ERROR(kvarn::CheckEmbeddedConfig(o.config, "options->config"));
    auto handle = std::make_unique<kvarn_cache>();
    KVARN_RETURN_IF_ERROR(kvarn::ManagedCache::Create(context->impl.get(), o, &handle->impl));
    *out_cache = handle.release();
    return Status::Ok();
  });
}

void kvarn_cache_destroy(kvarn_cache_t* cache) { delete cache; }

kvarn_status_t kvarn_cache_add_sequence(kvarn_cache_t* cache, int64_t seq_id) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->AddSequence(seq_id);
  });
}

kvarn_status_t kvarn_cache_remove_sequence(kvarn_cache_t* cache, int64_t seq_id) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->RemoveSequence(seq_id);
  });
}

kvarn_status_t kvarn_cache_fork(kvarn_cache_t* cache, int64_t src_id, int64_t dst_id,
                                int64_t n_tokens) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Fork(src_id, dst_id, n_tokens);
  });
}

kvarn_status_t kvarn_cache_truncate(kvarn_cache_t* cache, int64_t seq_id, int64_t n_tokens) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Truncate(seq_id, n_tokens);
  });
}

kvarn_status_t kvarn_cache_append(kvarn_cache_t* cache, int64_t seq_id, int32_t layer,
                                  size_t n_tokens, kvarn_dtype_t dtype, const void* k,
                                  const void* v, uint32_t flags) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    KVARN_RETURN_IF_ERROR(kvarn::CheckDtypeArg(dtype, "dtype"));
    return cache->impl->Append(seq_id, layer, n_tokens, dtype, k, v, flags);
  });
}

kvarn_status_t kvarn_cache_commit(kvarn_cache_t* cache, int64_t seq_id, int64_t n_tokens) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Commit(seq_id, n_tokens);
  });
}

kvarn_status_t kvarn_cache_sequence_length(const kvarn_cache_t* cache, int64_t seq_id,
                                           int32_t layer, int64_t* out_tokens,
                                           int64_t* out_committed) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    if (out_tokens == nullptr && out_committed == nullptr) {
      return kvarn::InvalidArgument("out_tokens and out_committed are both NULL");
    }
    return cache->impl->Length(seq_id, layer, out_tokens, out_committed);
  });
}

kvarn_status_t kvarn_cache_attention(kvarn_cache_t* cache, int32_t layer, size_t n_seqs,
                                     const int64_t* seq_ids, const kvarn_attention_params_t* params,
                                     const void* q, void* out, float* lse) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Attention(layer, n_seqs, seq_ids, params, q, out, lse);
  });
}

kvarn_status_t kvarn_cache_get_stats(const kvarn_cache_t* cache, kvarn_cache_stats_t* stats) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Stats(stats);
  });
}

kvarn_status_t kvarn_cache_export_sequence(const kvarn_cache_t* cache, int64_t seq_id, void* buffer,
                                           size_t buffer_bytes, size_t* out_bytes) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Export(seq_id, buffer, buffer_bytes, out_bytes);
  });
}

kvarn_status_t kvarn_cache_import_sequence(kvarn_cache_t* cache, int64_t seq_id, const void* blob,
                                           size_t blob_bytes) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedCache(cache));
    return cache->impl->Import(seq_id, blob, blob_bytes);
  });
}

}  // extern "C"
