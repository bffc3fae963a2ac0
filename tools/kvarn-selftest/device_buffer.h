// Memory in the address space a libkvarn context works on (host for CPU contexts, device memory
// for GPU contexts).
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
//
// kvarn.h deliberately has no allocator: GPU contexts take device pointers the engine owns. The
// selftest therefore brings its own, through the vendor runtime when it was built with one
// (KVARN_SELFTEST_WITH_CUDA / KVARN_SELFTEST_WITH_HIP). This is the only code in the tool that
// is not the public C API.
#ifndef KVARN_TOOLS_SELFTEST_DEVICE_BUFFER_H_
#define KVARN_TOOLS_SELFTEST_DEVICE_BUFFER_H_

#include <cstddef>
#include <string>

namespace kvarn_selftest {

enum class MemoryKind { kHost, kCuda, kHip };

// True when this build of the tool can allocate and copy memory of that kind.
bool MemoryKindBuiltIn(MemoryKind kind);
// "host", "cuda", "hip".
const char* MemoryKindName(MemoryKind kind);
// Selects device `ordinal` for later allocations (no-op for host memory).
bool SelectDevice(MemoryKind kind, int ordinal, std::string* error);
// Waits for all queued device work (no-op for host memory): GPU calls may return before the work
// is done, so timings and read-backs synchronize first.
bool Synchronize(MemoryKind kind, std::string* error);

// A move-only buffer of `bytes` bytes in memory of one kind.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  // Allocates (and releases any previous allocation). bytes may be 0 (data() is then NULL).
  bool Allocate(MemoryKind kind, size_t bytes, std::string* error);
  // Copies `bytes` bytes from host memory to this buffer at byte `offset`.
  bool Upload(const void* host, size_t bytes, std::string* error, size_t offset = 0);
  // Copies `bytes` bytes of this buffer from byte `offset` into host memory (synchronizes).
  bool Download(void* host, size_t bytes, std::string* error, size_t offset = 0) const;
  // Sets every byte to `value`.
  bool Fill(unsigned char value, std::string* error);

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void Release();

  MemoryKind kind_ = MemoryKind::kHost;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvarn_selftest

#endif  // KVARN_TOOLS_SELFTEST_DEVICE_BUFFER_H_
