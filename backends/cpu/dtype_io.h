// Loading and storing rows of f32 / f16 / bf16 as fp32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/half.h"
#include "kvarn/kvarn.h"

namespace kvarn {
namespace cpu {

inline float LoadElement(kvarn_dtype_t dtype, const void* base, size_t i) {
  switch (dtype) {
    case KVARN_DTYPE_F16:
      return half_to_float(static_cast<const uint16_t*>(base)[i]);
    case KVARN_DTYPE_BF16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

inline void StoreElement(kvarn_dtype_t dtype, void* base, size_t i, float x) {
  switch (dtype) {
    case KVARN_DTYPE_F16:
      static_cast<uint16_t*>(base)[i] = float_to_half(x);
      break;
    case KVARN_DTYPE_BF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16(x);
      break;
    default:
      static_cast<float*>(base)[i] = x;
      break;
  }
}

// The dtype switch is outside the loops so each loop vectorizes.
inline void LoadRow(kvarn_dtype_t dtype, const void* base, size_t offset, int n, float* out) {
  switch (dtype) {
    case KVARN_DTYPE_F16:
      for (int i = 0; i < n; ++i)
        out[i] = half_to_float(static_cast<const uint16_t*>(base)[offset + i]);
      break;
    case KVARN_DTYPE_BF16:
      for (int i = 0; i < n; ++i)
        out[i] = bf16_to_float(static_cast<const uint16_t*>(base)[offset + i]);
      break;
    default:
      for (int i = 0; i < n; ++i) out[i] = static_cast<const float*>(base)[offset + i];
      break;
  }
}

inline void StoreRow(kvarn_dtype_t dtype, void* base, size_t offset, int n, const float* in) {
  for (int i = 0; i < n; ++i) StoreElement(dtype, base, offset + i, in[i]);
}

}  // namespace cpu
}  // namespace kvarn
