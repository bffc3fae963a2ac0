// Portability and error plumbing shared by the GPU kernels. Kernels are written once, against
// the names gpu_runtime.h maps (the CUDA runtime, or HIP through the same names), and never let a
// warp size appear as a literal (kWarpSize, kFullMask).
#pragma once

#include <cstdint>
#include <string>

#include "backends/gpu/gpu_runtime.h"
#include "core/backend.h"
#include "core/status.h"

namespace kvarn {
namespace gpu {

// Sticky device-side error words of a context (see DeviceError below). Kernels that find bad
// data in device memory (a block-table entry out of range, a non-finite input) cannot return a
// status; they record the first error here and skip the bad work, and the host reports it at
// the next synchronize or copy on that context.
struct DeviceErrorWords {
  int32_t code;  // kvarn_status_t of the first error, 0 if none
  int32_t what;  // DeviceErrorKind
  int32_t a;     // details (sequence, tile, ...)
  int32_t b;
  int32_t launch_flag;  // per-launch "something was wrong" flag for validate-then-write pairs
};

enum DeviceErrorKind : int32_t {
  kErrNone = 0,
  kErrBlockTable = 1,  // a = sequence, b = tile
  kErrSeqLen = 2,      // a = sequence, b = value
  kErrNonFinite = 3,   // a = token, b = head
  kErrOverflow = 4,    // a = token or tile, b = head
  kErrQueryLen = 5,    // a = sequence, b = query tokens
  kErrSlot = 6,        // a = token, b = slot
  kErrIndptr = 7,      // a = sequence, b = IndptrKind (the range of a is not its own)
  kErrFlushCount = 8,  // a = *n_tiles, b = max_tiles
  kErrFlushEntry = 9,  // a = entry, b = 0: page or block out of its pool, 1: tile_seqs out of range
  kErrTailSlot = 10,   // a = sequence, b = slot: outside the tail slots
  kErrTailRow = 11,    // a = sequence, b = row: outside its tail slot's rows
  kErrCommitted = 12,  // a = sequence, b = committed: outside [record_tiles * G, seq_lens]
};

__device__ inline void ReportDeviceError(DeviceErrorWords* e, kvarn_status_t code,
                                         DeviceErrorKind what, int32_t a, int32_t b) {
  atomicExch(&e->launch_flag, 1);
  if (atomicCAS(&e->code, 0, static_cast<int32_t>(code)) == 0) {
    e->what = what;
    e->a = a;
    e->b = b;
  }
}

// A data error of sequence `seq` in a capturable (*_run) call: into its status entry when the
// call has a status array (the first fault wins; the sequence is then skipped), else into the
// context's sticky words (the whole call fails).
__device__ inline void ReportSequenceError(int32_t* seq_status, DeviceErrorWords* e, int32_t seq,
                                           kvarn_status_t code, DeviceErrorKind what, int32_t a,
                                           int32_t b) {
  // seq < 0: work of no sequence (a flush entry of a finished request): a whole-call error.
  if (seq_status != nullptr && seq >= 0) {
    atomicCAS(&seq_status[seq], 0, static_cast<int32_t>(code));
    return;
  }
  ReportDeviceError(e, code, what, a, b);
}

// What a GPU context keeps (Context::backend_state).
struct CudaState {
  int device = 0;
  cudaStream_t stream = nullptr;
  int sm_count = 0;
  int max_smem_optin = 0;              // bytes of dynamic shared memory a block may opt into
  int cc_major = 0, cc_minor = 0;      // CUDA compute capability (HIP: the gfx major/minor)
  int warp_size = kMinWarpSize;        // the device's warp/wavefront size (32, or 64 on CDNA)
  DeviceErrorWords* errors = nullptr;  // device memory
  // Staging memory for validate-then-write operations, grown on demand.
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
};

inline CudaState* State(Context* ctx) { return static_cast<CudaState*>(ctx->backend_state); }

// The warp size host code sizes launches with: the constant on CUDA; under HIP the device's
// (one binary holds wave64 and wave32 targets).
inline int LaunchWarpSize(const CudaState* s) {
#if KVARN_GPU_HIP
  return s->warp_size;
#else
  (void)s;
  return kWarpSize;
#endif
}

inline Status CudaError(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  kvarn_status_t code = e == cudaErrorMemoryAllocation ? KVARN_ERR_OUT_OF_MEMORY : KVARN_ERR_DEVICE;
  return {code,
          std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

// Makes the context's device current for the scope and restores the caller's device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (saved_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != saved_) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = -1;
};

// Checks a launch: the configuration error, if any, is reported now; faults inside the kernel
// surface at the next synchronization.
inline Status CheckLaunch(const char* kernel) { return CudaError(cudaGetLastError(), kernel); }

// Ensures ctx's scratch holds at least `bytes` (allocation only when it must grow).
Status EnsureScratch(Context* ctx, size_t bytes, void** out);

// Runs the scope's calls on `stream` (NULL: the context's own), restoring the context's stream
// after: the per-call stream of the capturable API. A context is used by one thread at a time.
class StreamScope {
 public:
  StreamScope(CudaState* s, void* stream) : s_(s), saved_(s->stream) {
    if (stream != nullptr) s_->stream = static_cast<cudaStream_t>(stream);
  }
  ~StreamScope() { s_->stream = saved_; }
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  CudaState* s_;
  cudaStream_t saved_;
};

// Clears the per-launch flag on the context's stream (for validate-then-write pairs).
Status ResetLaunchFlag(Context* ctx);

// For synchronous validate-then-write operations: waits for the context's stream, then, if the
// launch flag is set (this launch found bad data), copies the error words to *words, clears
// them and sets *failed; otherwise leaves them (a pending asynchronous error stays sticky).
Status SyncAndTakeLaunchError(Context* ctx, bool* failed, DeviceErrorWords* words);

// Which array CheckIndptr checks (DeviceErrorWords::b of kErrIndptr).
enum class IndptrKind : int32_t { kToken = 0, kQuery = 1 };

// Enqueues the indptr rule of the run calls (indptr_check.cu) on the context's stream: every
// sequence with a bad boundary of indptr[0..batch] (device memory) faults, in seq_status when
// given, else in the context's sticky words (and the launch flag).
Status CheckIndptr(CudaState* s, const int32_t* indptr, int batch, int64_t limit,
                   int32_t* seq_status, IndptrKind which);

inline unsigned CeilDivU(size_t a, size_t b) { return static_cast<unsigned>((a + b - 1) / b); }

// Exclusive prefix sum of `mine` over the CTA's threads (every thread calls it; scratch: blockDim.x
// ints of shared memory): the sum over the threads before this one; *total, over all of them.
__device__ inline int32_t CtaExclusiveScan(int32_t mine, int32_t* scratch, int32_t* total) {
  const unsigned t = threadIdx.x;
  scratch[t] = mine;
  __syncthreads();
  for (unsigned d = 1; d < blockDim.x; d *= 2) {  // inclusive scan (Hillis-Steele)
    const int32_t add = t >= d ? scratch[t - d] : 0;
    __syncthreads();
    scratch[t] += add;
    __syncthreads();
  }
  const int32_t before = scratch[t] - mine;
  *total = scratch[blockDim.x - 1];
  __syncthreads();  // scratch may be reused at once
  return before;
}

}  // namespace gpu
}  // namespace kvarn

#define KVARN_CUDA_RETURN_IF_ERROR(call) \
  KVARN_RETURN_IF_ERROR(::kvarn::gpu::CudaError((call), #call))
