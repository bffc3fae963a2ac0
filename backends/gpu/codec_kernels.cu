// Device-run stand-in for the CUDA codec while it is being written (never committed).
#include "backends/gpu/gpu_common.cuh"
#include "backends/gpu/gpu_ops.h"
namespace kvarn {
namespace gpu {
Status Rotate(Context*, int, size_t, kvarn_dtype_t, const void*, kvarn_dtype_t, void*) {
  return Unsupported("CUDA rotate is not written yet");
}
Status Quantize(Context*, const Config&, size_t, kvarn_dtype_t, const void*, const void*, uint32_t,
                void*, size_t) {
  return Unsupported("CUDA quantize is not written yet");
}
Status Dequantize(Context*, const Config&, size_t, const void*, size_t, uint32_t, kvarn_dtype_t,
                  void*, void*) {
  return Unsupported("CUDA dequantize is not written yet");
}
Status PagedAppend(Context*, const Config&, const PagedKV&, const int32_t*, kvarn_dtype_t,
                   const void*, const void*) {
  return Unsupported("CUDA append is not written yet");
}
Status PagedFlush(Context*, const Config&, const PagedKV&, size_t, const int32_t*,
                  const int32_t*) {
  return Unsupported("CUDA flush is not written yet");
}
}  // namespace gpu
}  // namespace kvarn
