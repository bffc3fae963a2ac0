// The GPU runtime the kernels are written against: the CUDA runtime, or HIP through the same
// names. Included (only) by gpu_common.cuh. The kernels and the backend use the CUDA spelling;
// under HIP (clang -x hip, __HIP__ defined) this header maps each name they use to its HIP
// counterpart, so backends/gpu/ stays the single home of the kernels (no hipified copies).
//
// What differs and how it is handled:
// - Warp (wavefront) size: kWarpSize is a compile-time constant of device code: 32 on CUDA, and
//   under HIP the target's wavefront (64 on CDNA gfx9xx, 32 on RDNA gfx10xx+; one device pass per
//   --offload-arch). The host pass has no single target, so there kWarpSize is kMinWarpSize (32):
//   host code uses it only for upper bounds (warps per block, per-warp shared memory), and reads
//   the device's warpSize (CudaState::warp_size, LaunchWarpSize) where launch sizes depend on it.
// - Lane masks: HIP's shuffles take no mask (the whole wavefront takes part, which is what every
//   kFullMask shuffle here asks for), so the *_sync shuffles map to __shfl/__shfl_xor.
// - Inline PTX (mma.sync, ldmatrix, cp.async, bulk copies, mbarrier, griddepcontrol) stays behind
//   KVARN_GPU_CUDA / __CUDA_ARCH__ guards with a portable path beside it; the tensor-core
//   attention kernel (attention_mma.cuh) is CUDA-only (KVARN_GPU_HAS_MMA).
#pragma once

#if defined(__HIP__)
#define KVARN_GPU_HIP 1
#define KVARN_GPU_CUDA 0
#define KVARN_GPU_HAS_MMA 0
#else
#define KVARN_GPU_HIP 0
#define KVARN_GPU_CUDA 1
#define KVARN_GPU_HAS_MMA 1
#endif

#if KVARN_GPU_CUDA

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define KVARN_GPU_NAME "CUDA"
// __launch_bounds__(threads, min CTAs per SM). HIP's second argument means something else
// (minimum waves per execution unit), so there it is dropped.
#define KVARN_LAUNCH_BOUNDS2(threads, min_blocks) __launch_bounds__(threads, min_blocks)

#else  // HIP

#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>

#define KVARN_GPU_NAME "ROCm"
#define KVARN_LAUNCH_BOUNDS2(threads, min_blocks) __launch_bounds__(threads)

// Types and constants.
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaErrorNoDevice hipErrorNoDevice
#define cudaErrorInsufficientDriver hipErrorInsufficientDriver
#define cudaStream_t hipStream_t
#define cudaDeviceProp hipDeviceProp_t
#define cudaMemcpyKind hipMemcpyKind
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaPointerAttributes hipPointerAttribute_t
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize

// Runtime calls.
#define cudaGetErrorName hipGetErrorName
#define cudaGetErrorString hipGetErrorString
#define cudaGetLastError hipGetLastError
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocAsync hipMallocAsync
#define cudaFreeAsync hipFreeAsync
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaPointerGetAttributes hipPointerGetAttributes
#define cudaFuncSetAttribute ::kvarn::gpu::HipFuncSetAttribute
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor

// Device intrinsics. The whole wavefront takes part in every shuffle (the masks are full).
#define __shfl_xor_sync(mask, var, lane_mask) __shfl_xor((var), (lane_mask))
#define __shfl_sync(mask, var, src_lane) __shfl((var), (src_lane))
#define __syncwarp() ::kvarn::gpu::HipSyncWave()

namespace kvarn {
namespace gpu {

// hipFuncSetAttribute takes the kernel as const void*.
template <typename Kernel>
inline hipError_t HipFuncSetAttribute(Kernel* kernel, hipFuncAttribute attr, int value) {
  return hipFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// A wavefront runs its lanes in lockstep; what __syncwarp orders here (shared-memory reads of
// some lanes before a write by another) needs a wavefront-scope fence that the compiler does
// not move memory operations across.
__device__ __forceinline__ void HipSyncWave() {
  __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "wavefront");
  __builtin_amdgcn_wave_barrier();
}

}  // namespace gpu
}  // namespace kvarn

#endif  // HIP

#include <cstdint>

namespace kvarn {
namespace gpu {

constexpr int kMinWarpSize = 32;  // the smallest warp/wavefront of any target
#if KVARN_GPU_CUDA
constexpr int kWarpSize = 32;
constexpr int kMaxWarpSize = 32;
using LaneMask = unsigned;
#else
constexpr int kMaxWarpSize = 64;                    // CDNA
#if defined(__HIP_DEVICE_COMPILE__)
constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;  // per --offload-arch: 64 gfx9xx, 32 gfx10xx+
static_assert(kWarpSize == 32 || kWarpSize == 64, "unexpected wavefront size");
#if defined(__GFX9__)
static_assert(kWarpSize == 64, "CDNA/GCN (gfx9xx) runs wave64");
#endif
#else
constexpr int kWarpSize = kMinWarpSize;  // host pass: upper bounds only (see above)
#endif
using LaneMask = unsigned long long;
#endif
// A mask naming every lane of a warp (on HIP the shuffles ignore it: see above).
constexpr LaneMask kFullMask = static_cast<LaneMask>(~static_cast<LaneMask>(0));

// fp32 -> bf16 bits, round to nearest even (NaN stays NaN).
__device__ __forceinline__ uint16_t FloatToBf16Bits(float x) {
#if KVARN_GPU_CUDA
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
#else
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}

}  // namespace gpu
}  // namespace kvarn
