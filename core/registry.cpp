// The backend registry: the one place backends are listed (no other mutable global state).
#include <memory>
#include <string>

#include "core/backend.h"

namespace kvarn {
namespace cpu {
extern const BackendOps kCpuBackend;
}
#ifdef KVARN_WITH_CUDA
namespace gpu {
extern const BackendOps kCudaBackend;
}
#endif
#ifdef KVARN_WITH_HIP
namespace gpu {
extern const BackendOps kRocmBackend;  // backends/gpu built as HIP
}
#endif

namespace {

struct Entry {
  kvarn_backend_t kind;
  const char* name;
  const BackendOps* ops;       // NULL when not compiled in
  const char* missing_reason;  // why ops is NULL
};

const Entry kEntries[] = {
    {KVARN_BACKEND_CPU, "cpu", &cpu::kCpuBackend, ""},
#ifdef KVARN_WITH_CUDA
    {KVARN_BACKEND_CUDA, "cuda", &gpu::kCudaBackend, ""},
#else
    {KVARN_BACKEND_CUDA, "cuda", nullptr,
     "not built: configure with -DKVARN_ENABLE_CUDA=ON (preset 'cuda') to build it"},
#endif
#ifdef KVARN_WITH_HIP
    {KVARN_BACKEND_ROCM, "rocm", &gpu::kRocmBackend, ""},
#else
    {KVARN_BACKEND_ROCM, "rocm", nullptr,
     "not built: configure with -DKVARN_ENABLE_HIP=ON (preset 'hip') to build it"},
#endif
};

constexpr int kNumEntries = static_cast<int>(sizeof kEntries / sizeof kEntries[0]);

const Entry* Find(kvarn_backend_t kind) {
  for (const Entry& e : kEntries) {
    if (e.kind == kind) return &e;
  }
  return nullptr;
}

bool Available(const Entry& e) {
  if (e.ops == nullptr) return false;
  int n = 0;
  const char* reason = "";
  e.ops->probe(&n, &reason);
  return n > 0;
}

}  // namespace

int BackendCount() { return kNumEntries; }

const BackendOps* BackendAt(int index) {
  return (index >= 0 && index < kNumEntries) ? kEntries[index].ops : nullptr;
}

kvarn_backend_t BackendKindAt(int index) { return kEntries[index].kind; }

const char* BackendMissingReasonAt(int index) { return kEntries[index].missing_reason; }

Status CreateContext(const kvarn_context_options_t& o, std::unique_ptr<Context>* out) {
  const Entry* entry = nullptr;
  if (o.backend == KVARN_BACKEND_AUTO) {
    // A GPU when one is present, else the CPU.
    for (kvarn_backend_t k : {KVARN_BACKEND_CUDA, KVARN_BACKEND_ROCM, KVARN_BACKEND_CPU}) {
      const Entry* e = Find(k);
      if (e != nullptr && Available(*e)) {
        entry = e;
        break;
      }
    }
  } else {
    entry = Find(o.backend);
    if (entry == nullptr) {
      return InvalidArgument("unknown backend value " +
                             std::to_string(static_cast<int>(o.backend)));
    }
    if (entry->ops == nullptr) {
      return {KVARN_ERR_BACKEND_UNAVAILABLE,
              std::string("backend '") + entry->name + "' " + entry->missing_reason};
    }
    int n = 0;
    const char* reason = "";
    entry->ops->probe(&n, &reason);
    if (n <= 0) {
      return {KVARN_ERR_BACKEND_UNAVAILABLE,
              std::string("backend '") + entry->name + "' unavailable: " + reason};
    }
  }
  if (entry == nullptr) return {KVARN_ERR_BACKEND_UNAVAILABLE, "no backend available"};
  {
    int n = 0;
    const char* reason = "";
    entry->ops->probe(&n, &reason);
    if (o.device < 0 || o.device >= n) {
      return InvalidArgument("device " + std::to_string(o.device) + " out of range: backend '" +
                             entry->name + "' has " + std::to_string(n) + " device(s)");
    }
  }
  if (entry->ops->interface_version != kBackendInterfaceVersion) {
    return {KVARN_ERR_INTERNAL, "backend interface version mismatch"};
  }
  auto ctx = std::make_unique<Context>();
  ctx->ops = entry->ops;
  ctx->backend = entry->kind;
  ctx->device = entry->kind == KVARN_BACKEND_CPU ? 0 : o.device;
  ctx->stream = o.stream;
  ctx->num_threads = o.num_threads;
  KVARN_RETURN_IF_ERROR(ctx->ops->context_init(ctx.get()));
  *out = std::move(ctx);
  return Status::Ok();
}

void DestroyContext(Context* ctx) {
  if (ctx == nullptr) return;
  ctx->ops->context_release(ctx);
  delete ctx;
}

}  // namespace kvarn
