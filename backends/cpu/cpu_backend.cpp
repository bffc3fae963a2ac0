// The CPU backend's table (core/backend.h).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/cpu_kernels.h"
#include "core/thread_pool.h"

namespace kvarn {
namespace cpu {
namespace {

void Probe(int* device_count, const char** reason) {
  *device_count = 1;
  *reason = "";
}

Status ContextInit(Context* ctx) {
  int threads = ctx->num_threads;
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  if (threads <= 0) threads = 1;
  ctx->num_threads = threads;
  ctx->isa = SelectIsa();
  try {
    ctx->pool = std::make_unique<ThreadPool>(threads);
  } catch (const std::exception& e) {
    return {KVARN_ERR_OUT_OF_MEMORY, std::string("cannot start worker threads: ") + e.what()};
  }
  return Status::Ok();
}

void ContextRelease(Context* ctx) { ctx->pool.reset(); }

Status Alloc(Context*, size_t bytes, void** out) {
  // 64-byte alignment for SIMD loads; aligned_alloc needs a multiple of the alignment.
  if (bytes > (SIZE_MAX >> 1)) {
    return {KVARN_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes"};
  }
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) {
    return {KVARN_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes"};
  }
  *out = p;
  return Status::Ok();
}

void Free(Context*, void* p) { std::free(p); }

Status Copy(Context*, void* dst, const void* src, size_t bytes, CopyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return Status::Ok();
}

Status Synchronize(Context*) { return Status::Ok(); }

}  // namespace

extern const BackendOps kCpuBackend;
const BackendOps kCpuBackend = {
    kBackendInterfaceVersion,
    KVARN_BACKEND_CPU,
    "cpu",
    Probe,
    ContextInit,
    ContextRelease,
    Alloc,
    Free,
    Copy,
    Synchronize,
    Rotate,
    Quantize,
    Dequantize,
    PagedAppend,
    PagedFlush,
    AttentionWorkspace,
    PagedAttention,
    AttentionPlanFor,
    PagedAppendRun,
    PagedFlushRun,
    PagedAttentionRun,
    PagedAppendTailRun,
    PagedFlushTailRun,
    PagedAppendFlushTailRun,
    nullptr,  // error_word: every CPU error is returned by its own call
};

}  // namespace cpu
}  // namespace kvarn
