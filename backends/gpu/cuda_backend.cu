// The CUDA backend's table (core/backend.h): devices, contexts, memory, streams, and the
// sticky device-error words that report what kernels find in device memory.
#include <string>

#include "backends/gpu/gpu_common.cuh"
#include "backends/gpu/gpu_ops.h"

namespace kvarn {
namespace gpu {

Status EnsureScratch(Context* ctx, size_t bytes, void** out) {
  CudaState* s = State(ctx);
  if (bytes > s->scratch_bytes) {
    // The old buffer may still be read by queued work on this stream: free it in stream order.
    if (s->scratch) KVARN_CUDA_RETURN_IF_ERROR(cudaFreeAsync(s->scratch, s->stream));
    s->scratch = nullptr;
    s->scratch_bytes = 0;
    KVARN_CUDA_RETURN_IF_ERROR(cudaMallocAsync(&s->scratch, bytes, s->stream));
    s->scratch_bytes = bytes;
  }
  *out = s->scratch;
  return Status::Ok();
}

Status ResetLaunchFlag(Context* ctx) {
  CudaState* s = State(ctx);
  return CudaError(cudaMemsetAsync(&s->errors->launch_flag, 0, sizeof(int32_t), s->stream),
                   "cudaMemsetAsync");
}

Status SyncAndTakeLaunchError(Context* ctx, bool* failed, DeviceErrorWords* words) {
  CudaState* s = State(ctx);
  *failed = false;
  KVARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
  DeviceErrorWords w{};
  KVARN_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(&w, s->errors, sizeof w, cudaMemcpyDeviceToHost, s->stream));
  KVARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
  if (w.launch_flag == 0) return Status::Ok();
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(s->errors, 0, sizeof w, s->stream));
  *failed = true;
  *words = w;
  return Status::Ok();
}

namespace {

void Probe(int* device_count, const char** reason) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    *device_count = 0;
    *reason = e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)
                  ? "no CUDA device found"
                  : (e == cudaErrorInsufficientDriver ? "the CUDA driver is missing or too old"
                                                      : "the CUDA runtime failed to start");
    cudaGetLastError();  // clear the sticky runtime error of a failed probe
    return;
  }
  *device_count = n;
  *reason = "";
}

// Reads and clears the sticky device error; call after the stream is synchronized.
Status TakeDeviceError(CudaState* s) {
  DeviceErrorWords w{};
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemcpy(&w, s->errors, sizeof w, cudaMemcpyDeviceToHost));
  if (w.code == 0) return Status::Ok();
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemset(s->errors, 0, sizeof w));
  std::string m = "a kernel found bad data (reported at the first synchronization after it): ";
  switch (w.what) {
    case kErrBlockTable:
      m += "sequence " + std::to_string(w.a) + ", tile " + std::to_string(w.b) +
           ": block_table names a page or record block outside its pool";
      break;
    case kErrSeqLen:
      m += "sequence " + std::to_string(w.a) + ": seq_lens/record_tiles value " +
           std::to_string(w.b) + " is negative or exceeds max_blocks_per_seq";
      break;
    case kErrNonFinite:
      m += "token " + std::to_string(w.a) + ", head " + std::to_string(w.b) +
           " holds a NaN or Inf; nothing was written";
      break;
    case kErrOverflow:
      m += "item " + std::to_string(w.a) + ", head " + std::to_string(w.b) +
           " exceeds the fp16 range; nothing was written";
      break;
    case kErrQueryLen:
      m += "sequence " + std::to_string(w.a) + " has fewer tokens than its " + std::to_string(w.b) +
           " query tokens";
      break;
    default:
      m += "unknown device error " + std::to_string(w.what);
  }
  return {static_cast<kvarn_status_t>(w.code), m};
}

Status ContextInit(Context* ctx) {
  auto s = new (std::nothrow) CudaState();
  if (s == nullptr) return {KVARN_ERR_OUT_OF_MEMORY, "cannot allocate the CUDA context state"};
  s->device = ctx->device;
  s->stream = static_cast<cudaStream_t>(ctx->stream);
  ctx->backend_state = s;
  DeviceGuard guard(s->device);
  cudaDeviceProp p;
  KVARN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, s->device));
  s->sm_count = p.multiProcessorCount;
  s->max_smem_optin = static_cast<int>(p.sharedMemPerBlockOptin);
  s->cc_major = p.major;
  s->cc_minor = p.minor;
  KVARN_CUDA_RETURN_IF_ERROR(cudaMalloc(&s->errors, sizeof(DeviceErrorWords)));
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemset(s->errors, 0, sizeof(DeviceErrorWords)));
  ctx->num_threads = 1;
  return Status::Ok();
}

void ContextRelease(Context* ctx) {
  CudaState* s = State(ctx);
  if (s == nullptr) return;
  {
    DeviceGuard guard(s->device);
    if (s->stream || s->scratch) cudaStreamSynchronize(s->stream);
    if (s->scratch) cudaFree(s->scratch);
    if (s->errors) cudaFree(s->errors);
    cudaGetLastError();
  }
  delete s;
  ctx->backend_state = nullptr;
}

Status Alloc(Context* ctx, size_t bytes, void** out) {
  DeviceGuard guard(State(ctx)->device);
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return {e == cudaErrorMemoryAllocation ? KVARN_ERR_OUT_OF_MEMORY : KVARN_ERR_DEVICE,
            "cudaMalloc of " + std::to_string(bytes) + " bytes on device " +
                std::to_string(State(ctx)->device) + ": " + cudaGetErrorString(e)};
  }
  *out = p;
  return Status::Ok();
}

void Free(Context* ctx, void* p) {
  DeviceGuard guard(State(ctx)->device);
  cudaFree(p);
}

Status Synchronize(Context* ctx) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
  return TakeDeviceError(s);
}

Status Copy(Context* ctx, void* dst, const void* src, size_t bytes, CopyKind kind) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  if (bytes) KVARN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, s->stream));
  return Synchronize(ctx);
}

// Every operation runs with the context's device current (and the caller's restored after).
template <auto Fn, typename... Args>
Status OnDevice(Context* ctx, Args... args) {
  DeviceGuard guard(State(ctx)->device);
  return Fn(ctx, args...);
}

}  // namespace

extern const BackendOps kCudaBackend;
const BackendOps kCudaBackend = {
    kBackendInterfaceVersion,
    KVARN_BACKEND_CUDA,
    "cuda",
    Probe,
    ContextInit,
    ContextRelease,
    Alloc,
    Free,
    Copy,
    Synchronize,
    OnDevice<Rotate, int, size_t, kvarn_dtype_t, const void*, kvarn_dtype_t, void*>,
    OnDevice<Quantize, const Config&, size_t, kvarn_dtype_t, const void*, const void*, uint32_t,
             void*, size_t>,
    OnDevice<Dequantize, const Config&, size_t, const void*, size_t, uint32_t, kvarn_dtype_t, void*,
             void*>,
    OnDevice<PagedAppend, const Config&, const PagedKV&, const int32_t*, kvarn_dtype_t, const void*,
             const void*>,
    OnDevice<PagedFlush, const Config&, const PagedKV&, size_t, const int32_t*, const int32_t*>,
    OnDevice<AttentionWorkspace, const Config&, const PagedKV&, const AttentionArgs&, size_t,
             size_t*>,
    OnDevice<PagedAttention, const Config&, const PagedKV&, const AttentionArgs&, const void*,
             void*, float*, void*, size_t>,
};

}  // namespace gpu
}  // namespace kvarn
