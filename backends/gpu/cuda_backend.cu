// The GPU backend's table (core/backend.h): devices, contexts, memory, streams, and the
// sticky device-error words that report what kernels find in device memory. Built with nvcc it
// is the CUDA backend (kCudaBackend, "cuda"); built as HIP (gpu_runtime.h) the ROCm backend
// (kRocmBackend, "rocm"), with the same probe/context/memory/error model.
#include <cstdlib>
#include <initializer_list>
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
                  ? "no " KVARN_GPU_NAME " device found"
                  : (e == cudaErrorInsufficientDriver
                         ? "the " KVARN_GPU_NAME " driver is missing or too old"
                         : "the " KVARN_GPU_NAME " runtime failed to start");
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
    case kErrSlot:
      m += "token " + std::to_string(w.a) + ": slot " + std::to_string(w.b) +
           " is outside the page pool; nothing was written";
      break;
    case kErrIndptr:
      m += "sequence " + std::to_string(w.a) + ": its " +
           (w.b == static_cast<int32_t>(IndptrKind::kQuery) ? "q_indptr" : "token_indptr") +
           " range is not its own (the array must start at 0, not decrease and stay inside the "
           "launch's rows); nothing was written";
      break;
    case kErrFlushCount:
      m += "*n_tiles is " + std::to_string(w.a) +
           ", outside [0, max_tiles = " + std::to_string(w.b) + "]; nothing was flushed";
      break;
    case kErrFlushEntry:
      m += "flush entry " + std::to_string(w.a) +
           (w.b ? ": tile_seqs names no sequence of the batch"
                : ": its page or record block is outside its pool") +
           "; nothing was flushed";
      break;
    case kErrTailSlot:
      m += "sequence " + std::to_string(w.a) + ": tail slot " + std::to_string(w.b) +
           " is outside the tail state's slots; nothing was written";
      break;
    case kErrTailRow:
      m += "sequence " + std::to_string(w.a) + ": tail row " + std::to_string(w.b) +
           " is outside its slot (seq_lens, record_tiles and the slot's rows disagree); nothing "
           "was written";
      break;
    case kErrCommitted:
      m += "sequence " + std::to_string(w.a) + ": committed " + std::to_string(w.b) +
           " is outside [record_tiles * G, seq_lens]; nothing was flushed";
      break;
    default:
      m += "unknown device error " + std::to_string(w.what);
  }
  return {static_cast<kvarn_status_t>(w.code), m};
}

Status ContextInit(Context* ctx) {
  auto s = new (std::nothrow) CudaState();
  if (s == nullptr) {
    return {KVARN_ERR_OUT_OF_MEMORY, "cannot allocate the " KVARN_GPU_NAME " context state"};
  }
  s->device = ctx->device;
  s->stream = static_cast<cudaStream_t>(ctx->stream);
  ctx->backend_state = s;
  DeviceGuard guard(s->device);
  cudaDeviceProp p;
  KVARN_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&p, s->device));
  s->sm_count = p.multiProcessorCount;
#if KVARN_GPU_HIP
  s->max_smem_optin = static_cast<int>(p.sharedMemPerBlock);  // LDS per workgroup (no opt-in)
#else
  s->max_smem_optin = static_cast<int>(p.sharedMemPerBlockOptin);
#endif
  s->cc_major = p.major;
  s->cc_minor = p.minor;
  s->warp_size = p.warpSize;
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

// The code field of the sticky error words: what kvarn_context_error_word hands out.
const int32_t* ErrorWord(Context* ctx) { return &State(ctx)->errors->code; }

Status Synchronize(Context* ctx) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s->stream));
  return TakeDeviceError(s);
}

struct NamedPointer {
  const void* p;
  const char* name;
};

// Memory a kernel of this context may touch: device memory of the context's device, managed
// memory, or pinned host memory. Plain host memory or another device's memory would fault or
// silently cross devices, so it is refused here with the argument's name (a few hundred ns per
// pointer: one driver lookup). NULL pointers are optional arguments and checked by core/ops.
Status CheckPointers(const CudaState* s, std::initializer_list<NamedPointer> pointers) {
  for (const NamedPointer& np : pointers) {
    if (np.p == nullptr) continue;
    const auto host_memory = [&] {
      return std::string(np.name) +
             " is host memory, but the context is on " KVARN_GPU_NAME " device " +
             std::to_string(s->device) + " (use kvarn_memory_alloc / kvarn_memory_copy)";
    };
    cudaPointerAttributes a{};
    const cudaError_t e = cudaPointerGetAttributes(&a, np.p);
#if KVARN_GPU_HIP
    // HIP (ROCm 5.x) reports pageable host memory as an error, and device, managed or pinned
    // host memory through memoryType/isManaged.
    if (e != hipSuccess) {
      hipGetLastError();
      return InvalidArgument(host_memory());
    }
    if (a.isManaged || a.memoryType == hipMemoryTypeHost) continue;
    if (a.memoryType != hipMemoryTypeDevice) return InvalidArgument(host_memory());
    if (a.device != s->device) {
      return InvalidArgument(std::string(np.name) + " is memory of ROCm device " +
                             std::to_string(a.device) + ", but the context is on device " +
                             std::to_string(s->device));
    }
#else
    if (e != cudaSuccess) {
      cudaGetLastError();
      return InvalidArgument(std::string(np.name) + ": not a pointer CUDA knows (" +
                             cudaGetErrorString(e) + ")");
    }
    switch (a.type) {
      case cudaMemoryTypeDevice:
        if (a.device != s->device) {
          return InvalidArgument(std::string(np.name) + " is memory of CUDA device " +
                                 std::to_string(a.device) + ", but the context is on device " +
                                 std::to_string(s->device));
        }
        break;
      case cudaMemoryTypeManaged:
      case cudaMemoryTypeHost:
        break;
      default:
        return InvalidArgument(host_memory());
    }
#endif
  }
  return Status::Ok();
}

Status CheckPagedKV(const CudaState* s, const PagedKV& kv) {
  return CheckPointers(s, {{kv.records, "records"},
                           {kv.k_pages, "k_pages"},
                           {kv.v_pages, "v_pages"},
                           {kv.block_table, "block_table"},
                           {kv.seq_lens, "seq_lens"},
                           {kv.record_tiles, "record_tiles"},
                           {kv.tail_states, "tail->states"},
                           {kv.tail_slots, "tail->slots"}});
}

// The tail slots are read with 16-byte copies: every slot must start 16-byte aligned.
Status CheckTailAligned(const PagedKV& kv) {
  if (kv.tail_states == nullptr) return Status::Ok();
  if (kv.tail_bits != 16) {
    return Unsupported(
        "int8 tail rows (tail->row_bits 8) are supported on the CPU backend only "
        "so far; use fp16 rows (row_bits 16) on a " KVARN_GPU_NAME " context");
  }
  if (reinterpret_cast<uintptr_t>(kv.tail_states) % 16 != 0 || (kv.tail_slot_elems * 2) % 16 != 0) {
    return InvalidArgument(
        "tail->states must be 16-byte aligned and tail->slot_bytes a multiple "
        "of 16 on a " KVARN_GPU_NAME " context");
  }
  return Status::Ok();
}

Status Copy(Context* ctx, void* dst, const void* src, size_t bytes, CopyKind kind) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  const cudaMemcpyKind k = kind == CopyKind::kHostToDevice   ? cudaMemcpyHostToDevice
                           : kind == CopyKind::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                             : cudaMemcpyDeviceToDevice;
  if (bytes == 0) return Synchronize(ctx);
  if (kind != CopyKind::kDeviceToHost) KVARN_RETURN_IF_ERROR(CheckPointers(s, {{dst, "dst"}}));
  if (kind != CopyKind::kHostToDevice) KVARN_RETURN_IF_ERROR(CheckPointers(s, {{src, "src"}}));
  KVARN_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, k, s->stream));
  return Synchronize(ctx);
}

// Head dims 80 and 96 (docs/FORMAT.md section 3: the Paley x Sylvester rotation) have CPU kernels
// only. Every entry point refuses them before any dispatch, so none reaches a kernel built for the
// power-of-two transform.
Status CheckHeadDimBuilt(const Context* ctx, int D) {
  if (D == 64 || D == 128 || D == 256 || D == 512) return Status::Ok();
  return Unsupported("head_dim " + std::to_string(D) + " is not supported on the " +
                     ctx->ops->name +
                     " backend yet: its GPU kernels are not built (GPU head dims: 64, 128, 256, "
                     "512); use a CPU context for head_dim 80 and 96");
}

// The entry points of the table: the context's device current (the caller's restored after),
// and every memory argument checked to be reachable from it.
Status RotateOnDevice(Context* ctx, int D, size_t rows, kvarn_dtype_t in_dtype, const void* in,
                      kvarn_dtype_t out_dtype, void* out) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, D));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{in, "in"}, {out, "out"}}));
  return Rotate(ctx, D, rows, in_dtype, in, out_dtype, out);
}

Status QuantizeOnDevice(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype,
                        const void* k, const void* v, uint32_t flags, void* records,
                        size_t record_stride) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{k, "k"}, {v, "v"}, {records, "records"}}));
  return Quantize(ctx, cfg, n_tiles, dtype, k, v, flags, records, record_stride);
}

Status DequantizeOnDevice(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                          size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k,
                          void* v) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{records, "records"}, {k, "k_out"}, {v, "v_out"}}));
  return Dequantize(ctx, cfg, n_tiles, records, record_stride, flags, out_dtype, k, v);
}

Status PagedAppendOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                           const int32_t* token_indptr, kvarn_dtype_t dtype, const void* k,
                           const void* v) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPagedKV(s, kv));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{k, "k"}, {v, "v"}}));
  return PagedAppend(ctx, cfg, kv, token_indptr, dtype, k, v);
}

Status PagedFlushOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                          const int32_t* src_pages, const int32_t* dst_blocks) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  // A flush reads pages and writes records; the tables are not used.
  KVARN_RETURN_IF_ERROR(CheckPointers(
      s, {{kv.records, "records"}, {kv.k_pages, "k_pages"}, {kv.v_pages, "v_pages"}}));
  return PagedFlush(ctx, cfg, kv, n_tiles, src_pages, dst_blocks);
}

Status AttentionWorkspaceOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                                  const AttentionArgs& args, size_t total_q, size_t* bytes) {
  DeviceGuard guard(State(ctx)->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  return AttentionWorkspace(ctx, cfg, kv, args, total_q, bytes);
}

Status PagedAttentionOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                              const AttentionArgs& args, const void* q, void* out, float* lse,
                              void* workspace, size_t workspace_bytes) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPagedKV(s, kv));
  KVARN_RETURN_IF_ERROR(
      CheckPointers(s, {{q, "q"}, {out, "out"}, {lse, "lse"}, {workspace, "workspace"}}));
  return PagedAttention(ctx, cfg, kv, args, q, out, lse, workspace, workspace_bytes);
}

// The capturable calls: the launch's stream for the call's scope, and nothing that could
// synchronize or allocate (pointer checks are driver lookups, allowed during capture).
Status AttentionPlanOnDevice(Context* ctx, const Config& cfg, const AttentionShape& shape,
                             const AttentionArgs& args, AttentionPlan* plan) {
  DeviceGuard guard(State(ctx)->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  return AttentionPlanFor(ctx, cfg, shape, args, plan);
}

Status PagedAppendRunOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                              const LaunchArgs& launch, const int32_t* token_indptr,
                              const int32_t* slot_mapping, size_t max_tokens, kvarn_dtype_t dtype,
                              const void* k, const void* v) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{kv.k_pages, "k_pages"},
                                          {kv.v_pages, "v_pages"},
                                          {token_indptr, "token_indptr"},
                                          {slot_mapping, "slot_mapping"},
                                          {k, "k"},
                                          {v, "v"},
                                          {launch.seq_status, "seq_status"}}));
  StreamScope scope(s, launch.stream);
  return PagedAppendRun(ctx, cfg, kv, launch, token_indptr, slot_mapping, max_tokens, dtype, k, v);
}

Status PagedFlushRunOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                             const LaunchArgs& launch, size_t max_tiles, const int32_t* n_tiles,
                             const int32_t* src_pages, const int32_t* dst_blocks,
                             const int32_t* tile_seqs) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{kv.records, "records"},
                                          {kv.k_pages, "k_pages"},
                                          {kv.v_pages, "v_pages"},
                                          {n_tiles, "n_tiles"},
                                          {src_pages, "src_pages"},
                                          {dst_blocks, "dst_blocks"},
                                          {tile_seqs, "tile_seqs"},
                                          {launch.seq_status, "seq_status"},
                                          {launch.workspace, "workspace"}}));
  StreamScope scope(s, launch.stream);
  return PagedFlushRun(ctx, cfg, kv, launch, max_tiles, n_tiles, src_pages, dst_blocks, tile_seqs);
}

Status PagedAttentionRunOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                                 const AttentionShape& shape, const AttentionArgs& args,
                                 const AttentionPlan& plan, const LaunchArgs& launch,
                                 const int32_t* q_indptr, const void* q, void* out, float* lse) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPagedKV(s, kv));
  KVARN_RETURN_IF_ERROR(CheckTailAligned(kv));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{q_indptr, "q_indptr"},
                                          {q, "q"},
                                          {out, "out"},
                                          {lse, "lse"},
                                          {launch.seq_status, "seq_status"},
                                          {launch.workspace, "workspace"}}));
  StreamScope scope(s, launch.stream);
  return PagedAttentionRun(ctx, cfg, kv, shape, args, plan, launch, q_indptr, q, out, lse);
}

Status PagedAppendTailRunOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                                  const LaunchArgs& launch, const int32_t* token_indptr,
                                  size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                  const void* v) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckTailAligned(kv));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{kv.seq_lens, "seq_lens"},
                                          {kv.record_tiles, "record_tiles"},
                                          {kv.tail_states, "tail->states"},
                                          {kv.tail_slots, "tail->slots"},
                                          {token_indptr, "token_indptr"},
                                          {k, "k"},
                                          {v, "v"},
                                          {launch.seq_status, "seq_status"}}));
  StreamScope scope(s, launch.stream);
  return PagedAppendTailRun(ctx, cfg, kv, launch, token_indptr, max_tokens, dtype, k, v);
}

Status PagedFlushTailRunOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                                 const LaunchArgs& launch, const int32_t* committed,
                                 int32_t* record_tiles_out) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPagedKV(s, kv));
  KVARN_RETURN_IF_ERROR(CheckTailAligned(kv));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{committed, "committed"},
                                          {record_tiles_out, "record_tiles_out"},
                                          {launch.seq_status, "seq_status"},
                                          {launch.workspace, "workspace"}}));
  StreamScope scope(s, launch.stream);
  return PagedFlushTailRun(ctx, cfg, kv, launch, committed, record_tiles_out);
}

Status PagedAppendFlushTailRunOnDevice(Context* ctx, const Config& cfg, const PagedKV& kv,
                                       const LaunchArgs& launch, const int32_t* token_indptr,
                                       size_t max_tokens, kvarn_dtype_t dtype, const void* k,
                                       const void* v, const int32_t* committed,
                                       int32_t* record_tiles_out) {
  CudaState* s = State(ctx);
  DeviceGuard guard(s->device);
  KVARN_RETURN_IF_ERROR(CheckHeadDimBuilt(ctx, cfg.D));
  KVARN_RETURN_IF_ERROR(CheckPagedKV(s, kv));
  KVARN_RETURN_IF_ERROR(CheckTailAligned(kv));
  KVARN_RETURN_IF_ERROR(CheckPointers(s, {{token_indptr, "token_indptr"},
                                          {k, "k"},
                                          {v, "v"},
                                          {committed, "committed"},
                                          {record_tiles_out, "record_tiles_out"},
                                          {launch.seq_status, "seq_status"},
                                          {launch.workspace, "workspace"}}));
  StreamScope scope(s, launch.stream);
  return PagedAppendFlushTailRun(ctx, cfg, kv, launch, token_indptr, max_tokens, dtype, k, v,
                                 committed, record_tiles_out);
}

}  // namespace

#if KVARN_GPU_HIP
#define KVARN_GPU_BACKEND_TABLE kRocmBackend
#define KVARN_GPU_BACKEND_KIND KVARN_BACKEND_ROCM
#define KVARN_GPU_BACKEND_NAME "rocm"
#else
#define KVARN_GPU_BACKEND_TABLE kCudaBackend
#define KVARN_GPU_BACKEND_KIND KVARN_BACKEND_CUDA
#define KVARN_GPU_BACKEND_NAME "cuda"
#endif

// Host-only: clang's HIP device pass would otherwise emit this const table (of host function
// pointers) as device data.
#if !defined(__HIP_DEVICE_COMPILE__)
extern const BackendOps KVARN_GPU_BACKEND_TABLE;
const BackendOps KVARN_GPU_BACKEND_TABLE = {
    kBackendInterfaceVersion,
    KVARN_GPU_BACKEND_KIND,
    KVARN_GPU_BACKEND_NAME,
    Probe,
    ContextInit,
    ContextRelease,
    Alloc,
    Free,
    Copy,
    Synchronize,
    RotateOnDevice,
    QuantizeOnDevice,
    DequantizeOnDevice,
    PagedAppendOnDevice,
    PagedFlushOnDevice,
    AttentionWorkspaceOnDevice,
    PagedAttentionOnDevice,
    AttentionPlanOnDevice,
    PagedAppendRunOnDevice,
    PagedFlushRunOnDevice,
    PagedAttentionRunOnDevice,
    PagedAppendTailRunOnDevice,
    PagedFlushTailRunOnDevice,
    PagedAppendFlushTailRunOnDevice,
    ErrorWord,
};
#endif

}  // namespace gpu
}  // namespace kvarn
