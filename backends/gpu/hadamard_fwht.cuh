// The Hadamard rotation of one row of D channels spread over the lanes of a warp (docs/FORMAT.md
// section 3), and the 8-element row loads/stores of f32/f16/bf16 every codec kernel uses.
//
// Row layout: a row of D channels is held by kLanes consecutive lanes of a warp, each with
// kChunks chunks of 8 consecutive channels: lane l (0..kLanes-1), chunk c, element e holds
// channel (c * kLanes + l) * 8 + e. So a chunk is one 16-byte fp16 load, and the transform
// runs its butterflies in the CPU's order (strides 1, 2, 4 inside a chunk, 8 .. 4*kLanes across
// lanes by shuffles, then 8*kLanes .. across chunks), giving the CPU's bits exactly.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "backends/gpu/gpu_common.cuh"

namespace kvarn {
namespace gpu {

template <int D>
struct RowLayout {
  static constexpr int kLanes = (D / 8 < kWarpSize) ? D / 8 : kWarpSize;
  static constexpr int kChunks = D / (8 * kLanes);
  static constexpr int kPerLane = 8 * kChunks;
  static constexpr int kRowsPerWarp = kWarpSize / kLanes;
  static_assert(kLanes * kChunks * 8 == D, "D must be a power of two >= 8");
  __device__ static int Channel(int lane_d, int c) { return (c * kLanes + lane_d) * 8; }
};

// RowLayout<D>::kRowsPerWarp of the device, for host code sizing launches (under HIP the host
// pass has no single warp size: LaunchWarpSize).
template <int D>
inline int LaunchRowsPerWarp(const CudaState* s) {
  const int w = LaunchWarpSize(s);
  return w / (D / 8 < w ? D / 8 : w);
}

// x <- x H / sqrt(D) for the row held by the kLanes lanes of this lane's group (x[c*8 + e] is
// chunk c, element e). Every lane of the warp must call it (shuffles), and `scale` is
// (float)(1 / sqrt((double)D)) as on the CPU.
template <int D>
__device__ __forceinline__ void FwhtRow(float (&x)[RowLayout<D>::kPerLane], int lane_d,
                                        float scale) {
  using L = RowLayout<D>;
#pragma unroll
  for (int h = 1; h < 8; h *= 2) {
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if ((e & h) == 0) {
          const float a = x[c * 8 + e], b = x[c * 8 + e + h];
          x[c * 8 + e] = a + b;
          x[c * 8 + e + h] = a - b;
        }
      }
    }
  }
#pragma unroll
  for (int m = 1; m < L::kLanes; m *= 2) {
    const bool upper = (lane_d & m) != 0;
#pragma unroll
    for (int i = 0; i < L::kPerLane; ++i) {
      const float p = __shfl_xor_sync(kFullMask, x[i], m);
      x[i] = upper ? p - x[i] : x[i] + p;  // upper holds x[j+h]: new = x[j] - x[j+h]
    }
  }
#pragma unroll
  for (int hc = 1; hc < L::kChunks; hc *= 2) {
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) {
      if ((c & hc) == 0) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float a = x[c * 8 + e], b = x[(c + hc) * 8 + e];
          x[c * 8 + e] = a + b;
          x[(c + hc) * 8 + e] = a - b;
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < L::kPerLane; ++i) x[i] *= scale;
}

// OR of a flag over the kLanes lanes of a row group (every lane of the warp must call it).
template <int D>
__device__ __forceinline__ bool RowAny(bool v) {
  unsigned x = v ? 1u : 0u;
#pragma unroll
  for (int m = 1; m < RowLayout<D>::kLanes; m *= 2) x |= __shfl_xor_sync(kFullMask, x, m);
  return x != 0;
}

__device__ __forceinline__ float HalfBitsToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ uint16_t FloatToHalfBits(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
__device__ __forceinline__ bool HalfBitsFinite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }

__device__ __forceinline__ void Unpack8Halves(uint4 u, float* o) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    o[2 * i] = HalfBitsToFloat(static_cast<uint16_t>(w[i] & 0xffffu));
    o[2 * i + 1] = HalfBitsToFloat(static_cast<uint16_t>(w[i] >> 16));
  }
}

// Loads 8 consecutive elements [off, off+8) of a dtype array as fp32. `vec`: the array base is
// 16-byte aligned (off is always a multiple of 8), so 16-byte loads are legal. Plain (coherent)
// loads: rotate may run in place.
__device__ __forceinline__ void Load8(kvarn_dtype_t dtype, const void* base, size_t off, bool vec,
                                      float* o) {
  if (dtype == KVARN_DTYPE_F32) {
    const float* p = static_cast<const float*>(base) + off;
    if (vec) {
      const float4 a = *reinterpret_cast<const float4*>(p);
      const float4 b = reinterpret_cast<const float4*>(p)[1];
      o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w;
      o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) o[i] = p[i];
    }
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + off;
  uint16_t h[8];
  if (vec) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      h[2 * i] = static_cast<uint16_t>(w[i] & 0xffffu);
      h[2 * i + 1] = static_cast<uint16_t>(w[i] >> 16);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = p[i];
  }
  if (dtype == KVARN_DTYPE_F16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = HalfBitsToFloat(h[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = __uint_as_float(static_cast<uint32_t>(h[i]) << 16);
  }
}

// Stores 8 fp32 values as dtype (round to nearest even) at [off, off+8).
__device__ __forceinline__ void Store8(kvarn_dtype_t dtype, void* base, size_t off, bool vec,
                                       const float* x) {
  if (dtype == KVARN_DTYPE_F32) {
    float* p = static_cast<float*>(base) + off;
    if (vec) {
      reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) p[i] = x[i];
    }
    return;
  }
  uint16_t h[8];
  if (dtype == KVARN_DTYPE_F16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = FloatToHalfBits(x[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) h[i] = FloatToBf16Bits(x[i]);
  }
  uint16_t* p = static_cast<uint16_t*>(base) + off;
  if (vec) {
    uint4 u;
    u.x = h[0] | (static_cast<uint32_t>(h[1]) << 16);
    u.y = h[2] | (static_cast<uint32_t>(h[3]) << 16);
    u.z = h[4] | (static_cast<uint32_t>(h[5]) << 16);
    u.w = h[6] | (static_cast<uint32_t>(h[7]) << 16);
    *reinterpret_cast<uint4*>(p) = u;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = h[i];
  }
}

// Stores 8 halves (bits) with one 16-byte store (`p` 16-byte aligned).
__device__ __forceinline__ void Store8Halves(uint16_t* p, const uint16_t* h) {
  uint4 u;
  u.x = h[0] | (static_cast<uint32_t>(h[1]) << 16);
  u.y = h[2] | (static_cast<uint32_t>(h[3]) << 16);
  u.z = h[4] | (static_cast<uint32_t>(h[5]) << 16);
  u.w = h[6] | (static_cast<uint32_t>(h[7]) << 16);
  *reinterpret_cast<uint4*>(p) = u;
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Calls f(std::integral_constant<int, D>) for a head dim the row kernels are built for.
template <typename F>
Status DispatchHeadDim(int D, F&& f) {
  switch (D) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    case 256:
      return f(std::integral_constant<int, 256>{});
    case 512:
      return f(std::integral_constant<int, 512>{});
    default:
      return Unsupported("head_dim " + std::to_string(D));
  }
}

}  // namespace gpu
}  // namespace kvarn
