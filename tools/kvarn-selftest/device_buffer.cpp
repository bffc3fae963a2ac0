// Memory in the address space a libkvarn context works on.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include "device_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(KVARN_SELFTEST_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif
#if defined(KVARN_SELFTEST_WITH_HIP)
#include <hip/hip_runtime_api.h>
#endif

namespace kvarn_selftest {
namespace {

#if defined(KVARN_SELFTEST_WITH_CUDA)
bool CudaOk(cudaError_t e, const char* what, std::string* error) {
  if (e == cudaSuccess) return true;
  *error = std::string(what) + ": " + cudaGetErrorString(e);
  return false;
}
#endif

#if defined(KVARN_SELFTEST_WITH_HIP)
bool HipOk(hipError_t e, const char* what, std::string* error) {
  if (e == hipSuccess) return true;
  *error = std::string(what) + ": " + hipGetErrorString(e);
  return false;
}
#endif

bool NotBuiltIn(MemoryKind kind, std::string* error) {
  *error = std::string("kvarn-selftest was built without the ") + MemoryKindName(kind) + " runtime";
  return false;
}

}  // namespace

bool MemoryKindBuiltIn(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return true;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      return true;
#else
      return false;
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      return true;
#else
      return false;
#endif
  }
  return false;
}

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kHost:
      return "host";
    case MemoryKind::kCuda:
      return "cuda";
    case MemoryKind::kHip:
      return "hip";
  }
  return "?";
}

bool SelectDevice(MemoryKind kind, int ordinal, std::string* error) {
  (void)ordinal;  // unused when the tool has no GPU runtime
  switch (kind) {
    case MemoryKind::kHost:
      return true;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      return CudaOk(cudaSetDevice(ordinal), "cudaSetDevice", error);
#else
      return NotBuiltIn(kind, error);
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      return HipOk(hipSetDevice(ordinal), "hipSetDevice", error);
#else
      return NotBuiltIn(kind, error);
#endif
  }
  return false;
}

bool Synchronize(MemoryKind kind, std::string* error) {
  switch (kind) {
    case MemoryKind::kHost:
      return true;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      return CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize", error);
#else
      return NotBuiltIn(kind, error);
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      return HipOk(hipDeviceSynchronize(), "hipDeviceSynchronize", error);
#else
      return NotBuiltIn(kind, error);
#endif
  }
  return false;
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : kind_(other.kind_), data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    kind_ = other.kind_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::Release() {
  if (data_ != nullptr) {
    switch (kind_) {
      case MemoryKind::kHost:
        std::free(data_);
        break;
      case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
        cudaFree(data_);
#endif
        break;
      case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
        (void)hipFree(data_);
#endif
        break;
    }
  }
  data_ = nullptr;
  bytes_ = 0;
}

bool DeviceBuffer::Allocate(MemoryKind kind, size_t bytes, std::string* error) {
  Release();
  kind_ = kind;
  if (bytes == 0) return true;
  switch (kind) {
    case MemoryKind::kHost:
      // 64-byte alignment so SIMD kernels see the alignment an engine's allocator would give.
      data_ = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
      if (data_ == nullptr) {
        *error = "out of host memory";
        return false;
      }
      break;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      if (!CudaOk(cudaMalloc(&data_, bytes), "cudaMalloc", error)) {
        data_ = nullptr;
        return false;
      }
      break;
#else
      return NotBuiltIn(kind, error);
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      if (!HipOk(hipMalloc(&data_, bytes), "hipMalloc", error)) {
        data_ = nullptr;
        return false;
      }
      break;
#else
      return NotBuiltIn(kind, error);
#endif
  }
  bytes_ = bytes;
  return true;
}

bool DeviceBuffer::Upload(const void* host, size_t bytes, std::string* error, size_t offset) {
  if (offset + bytes > bytes_) {
    *error = "upload beyond the end of a buffer";
    return false;
  }
  if (bytes == 0) return true;
  char* dst = static_cast<char*>(data_) + offset;
  switch (kind_) {
    case MemoryKind::kHost:
      std::memcpy(dst, host, bytes);
      return true;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      return CudaOk(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy", error);
#else
      return NotBuiltIn(kind_, error);
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      return HipOk(hipMemcpy(dst, host, bytes, hipMemcpyHostToDevice), "hipMemcpy", error);
#else
      return NotBuiltIn(kind_, error);
#endif
  }
  return false;
}

bool DeviceBuffer::Download(void* host, size_t bytes, std::string* error, size_t offset) const {
  if (offset + bytes > bytes_) {
    *error = "download beyond the end of a buffer";
    return false;
  }
  if (bytes == 0) return true;
  const char* src = static_cast<const char*>(data_) + offset;
  switch (kind_) {
    case MemoryKind::kHost:
      std::memcpy(host, src, bytes);
      return true;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      // A plain cudaMemcpy also waits for kernels on the legacy default stream only; synchronize
      // the device first so work queued on a context's own stream is finished.
      if (!CudaOk(cudaDeviceSynchronize(), "cudaDeviceSynchronize", error)) return false;
      return CudaOk(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy", error);
#else
      return NotBuiltIn(kind_, error);
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      if (!HipOk(hipDeviceSynchronize(), "hipDeviceSynchronize", error)) return false;
      return HipOk(hipMemcpy(host, src, bytes, hipMemcpyDeviceToHost), "hipMemcpy", error);
#else
      return NotBuiltIn(kind_, error);
#endif
  }
  return false;
}

bool DeviceBuffer::Fill(unsigned char value, std::string* error) {
  if (bytes_ == 0) return true;
  switch (kind_) {
    case MemoryKind::kHost:
      std::memset(data_, value, bytes_);
      return true;
    case MemoryKind::kCuda:
#if defined(KVARN_SELFTEST_WITH_CUDA)
      return CudaOk(cudaMemset(data_, value, bytes_), "cudaMemset", error);
#else
      return NotBuiltIn(kind_, error);
#endif
    case MemoryKind::kHip:
#if defined(KVARN_SELFTEST_WITH_HIP)
      return HipOk(hipMemset(data_, value, bytes_), "hipMemset", error);
#else
      return NotBuiltIn(kind_, error);
#endif
  }
  return false;
}

}  // namespace kvarn_selftest
