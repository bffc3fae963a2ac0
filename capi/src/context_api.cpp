// Backends, CPU features and contexts.
#include <cstring>
#include <string>

#include "backends/cpu/cpu_isa.h"
#include "capi/src/shim.h"
#include "core/abi_struct.h"
#include "core/ops.h"

using kvarn::Status;
using kvarn::capi::Guard;
using kvarn::capi::NeedContext;

extern "C" {

int32_t kvarn_backend_count(void) { return kvarn::BackendCount(); }

kvarn_status_t kvarn_backend_get_info(int32_t index, kvarn_backend_info_t* info) {
  return Guard([&]() -> Status {
    // An output struct (core/abi_struct.h): the fields within info->size are written.
    KVARN_RETURN_IF_ERROR(kvarn::CheckOutStruct(info, "info"));
    if (index < 0 || index >= kvarn::BackendCount()) {
      return {KVARN_ERR_NOT_FOUND, "backend index " + std::to_string(index) + " out of range"};
    }
    kvarn_backend_info_t r;
    std::memset(&r, 0, sizeof r);
    r.size = sizeof r;
    const kvarn::BackendOps* ops = kvarn::BackendAt(index);
    const kvarn_backend_t kind = kvarn::BackendKindAt(index);
    r.backend = kind;
    r.name = kvarn_backend_name(kind);
    if (ops == nullptr) {
      r.available = 0;
      r.device_count = 0;
      r.reason = kvarn::BackendMissingReasonAt(index);
    } else {
      int n = 0;
      const char* reason = "";
      ops->probe(&n, &reason);
      r.available = n > 0 ? 1 : 0;
      r.device_count = n;
      r.reason = n > 0 ? "" : reason;
    }
    return kvarn::WriteStruct(r, "info", info);
  });
}

const char* kvarn_backend_name(kvarn_backend_t backend) {
  switch (kvarn::EnumInt(backend)) {  // an integer: C callers may pass any value
    case KVARN_BACKEND_AUTO:
      return "auto";
    case KVARN_BACKEND_CPU:
      return "cpu";
    case KVARN_BACKEND_CUDA:
      return "cuda";
    case KVARN_BACKEND_ROCM:
      return "rocm";
    default:
      return "unknown";
  }
}

const char* kvarn_cpu_isa_name(kvarn_cpu_isa_t isa) {
  switch (kvarn::EnumInt(isa)) {
    case KVARN_CPU_ISA_SCALAR:
    case KVARN_CPU_ISA_AVX2:
    case KVARN_CPU_ISA_AVX512:
    case KVARN_CPU_ISA_NEON:
    case KVARN_CPU_ISA_NONE:
      return kvarn::cpu::IsaName(isa);
    default:
      return "unknown";
  }
}

kvarn_cpu_isa_t kvarn_cpu_isa_best(void) { return kvarn::cpu::BestIsa(); }

kvarn_status_t kvarn_cpu_features(char* buf, size_t buf_bytes) {
  return Guard([&]() -> Status {
    if (buf == nullptr || buf_bytes == 0) return kvarn::InvalidArgument("buf is NULL or empty");
    const std::string f = kvarn::cpu::CpuFeatureString();
    const size_t n = std::min(f.size(), buf_bytes - 1);
    std::memcpy(buf, f.data(), n);
    buf[n] = '\0';
    if (n < f.size()) {
      return {KVARN_ERR_BUFFER_TOO_SMALL,
              "feature list needs " + std::to_string(f.size() + 1) + " bytes"};
    }
    return Status::Ok();
  });
}

kvarn_status_t kvarn_set_max_cpu_isa(kvarn_cpu_isa_t isa) {
  return Guard([&]() -> Status {
    const int32_t v = kvarn::EnumInt(isa);
    if (v < KVARN_CPU_ISA_SCALAR || v > KVARN_CPU_ISA_NEON) {
      return kvarn::InvalidArgument("unknown CPU ISA value " + std::to_string(v));
    }
    return kvarn::cpu::SetMaxIsa(isa);
  });
}

void kvarn_context_options_defaults(kvarn_context_options_t* o) {
  if (o == nullptr) return;
  std::memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->backend = KVARN_BACKEND_AUTO;
  o->device = 0;
  o->stream = nullptr;
  o->num_threads = 0;
}

kvarn_status_t kvarn_context_create(const kvarn_context_options_t* options,
                                    kvarn_context_t** out_context) {
  return Guard([&]() -> Status {
    if (out_context == nullptr) return kvarn::InvalidArgument("out_context is NULL");
    kvarn_context_options_t o;
    kvarn_context_options_defaults(&o);
    // Growable struct (core/abi_struct.h): fields past options->size keep the defaults.
    if (options != nullptr) KVARN_RETURN_IF_ERROR(kvarn::ReadStruct(options, "options", &o));
    if (o.num_threads < 0) return kvarn::InvalidArgument("num_threads must be >= 0");
    const int32_t backend = kvarn::EnumInt(o.backend);
    if (backend < KVARN_BACKEND_AUTO || backend > KVARN_BACKEND_ROCM) {
      return kvarn::InvalidArgument("unknown backend value " + std::to_string(backend));
    }
    auto handle = std::make_unique<kvarn_context>();
    KVARN_RETURN_IF_ERROR(kvarn::CreateContext(o, &handle->impl));
    *out_context = handle.release();
    return Status::Ok();
  });
}

void kvarn_context_destroy(kvarn_context_t* context) {
  if (context == nullptr) return;
  kvarn::DestroyContext(context->impl.release());
  delete context;
}

kvarn_status_t kvarn_context_get_backend(const kvarn_context_t* c, kvarn_backend_t* out) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    if (out == nullptr) return kvarn::InvalidArgument("out_backend is NULL");
    *out = c->impl->backend;
    return Status::Ok();
  });
}

kvarn_status_t kvarn_context_get_cpu_isa(const kvarn_context_t* c, kvarn_cpu_isa_t* out) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    if (out == nullptr) return kvarn::InvalidArgument("out_isa is NULL");
    *out = c->impl->isa;
    return Status::Ok();
  });
}

kvarn_status_t kvarn_context_get_device(const kvarn_context_t* c, int32_t* out) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    if (out == nullptr) return kvarn::InvalidArgument("out_device is NULL");
    *out = c->impl->device;
    return Status::Ok();
  });
}

kvarn_status_t kvarn_context_get_num_threads(const kvarn_context_t* c, int32_t* out) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    if (out == nullptr) return kvarn::InvalidArgument("out_threads is NULL");
    *out = c->impl->num_threads;
    return Status::Ok();
  });
}

}  // extern "C"

extern "C" {

kvarn_status_t kvarn_memory_alloc(kvarn_context_t* c, size_t bytes, void** out_ptr) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    if (out_ptr == nullptr) return kvarn::InvalidArgument("out_ptr is NULL");
    void* p = nullptr;
    KVARN_RETURN_IF_ERROR(c->impl->ops->alloc(c->impl.get(), bytes, &p));
    *out_ptr = p;
    return Status::Ok();
  });
}

void kvarn_memory_free(kvarn_context_t* c, void* ptr) {
  if (c == nullptr || !c->impl || ptr == nullptr) return;
  c->impl->ops->free(c->impl.get(), ptr);
}

kvarn_status_t kvarn_memory_copy(kvarn_context_t* c, void* dst, const void* src, size_t bytes,
                                 kvarn_copy_kind_t kind) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    kvarn::CopyKind k;
    switch (kvarn::EnumInt(kind)) {
      case KVARN_COPY_HOST_TO_DEVICE:
        k = kvarn::CopyKind::kHostToDevice;
        break;
      case KVARN_COPY_DEVICE_TO_HOST:
        k = kvarn::CopyKind::kDeviceToHost;
        break;
      case KVARN_COPY_DEVICE_TO_DEVICE:
        k = kvarn::CopyKind::kDeviceToDevice;
        break;
      default:
        return kvarn::InvalidArgument("unknown copy kind " + std::to_string(kvarn::EnumInt(kind)));
    }
    if (bytes == 0) return Status::Ok();
    if (dst == nullptr || src == nullptr) return kvarn::InvalidArgument("dst or src is NULL");
    KVARN_RETURN_IF_ERROR(c->impl->ops->copy(c->impl.get(), dst, src, bytes, k));
    return c->impl->ops->synchronize(c->impl.get());
  });
}

kvarn_status_t kvarn_context_synchronize(kvarn_context_t* c) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    return c->impl->ops->synchronize(c->impl.get());
  });
}

kvarn_status_t kvarn_context_error_word(kvarn_context_t* c, const int32_t** out_word) {
  return Guard([&]() -> Status {
    KVARN_RETURN_IF_ERROR(NeedContext(c));
    if (out_word == nullptr) return kvarn::InvalidArgument("out_word is NULL");
    kvarn::Context* ctx = c->impl.get();
    *out_word = ctx->ops->error_word ? ctx->ops->error_word(ctx) : &ctx->host_error_word;
    return Status::Ok();
  });
}

}  // extern "C"
