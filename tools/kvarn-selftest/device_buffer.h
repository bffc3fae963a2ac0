// Memory in the address space a libkvarn context works on (host for CPU contexts, device memory
// for GPU contexts).
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
//
// Allocation, copies and synchronization all go through the public C API (kvarn_memory_alloc,
// kvarn_memory_copy, kvarn_memory_free, kvarn_context_synchronize), so the tool links no vendor
// runtime and runs on whatever backend the library was built with.
#ifndef KVARN_TOOLS_SELFTEST_DEVICE_BUFFER_H_
#define KVARN_TOOLS_SELFTEST_DEVICE_BUFFER_H_

#include <cstddef>
#include <string>

#include "kvarn/kvarn.h"

namespace kvarn_selftest {

// Waits for all work queued on the context's stream (a no-op on the CPU): GPU calls may return
// before the work is done, so timings synchronize after each call.
bool Synchronize(kvarn_context_t* context, std::string* error);

// A move-only buffer of `bytes` bytes in the memory of one context. The context must outlive the
// buffer (it frees through it).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  // Allocates in `context`'s memory and binds the buffer to it (releases any previous
  // allocation first). bytes may be 0 (data() is then NULL).
  bool Allocate(kvarn_context_t* context, size_t bytes, std::string* error);
  // Copies `bytes` bytes from host memory to this buffer at byte `offset`.
  bool Upload(const void* host, size_t bytes, std::string* error, size_t offset = 0);
  // Copies `bytes` bytes of this buffer from byte `offset` into host memory. The copy is ordered
  // after the work queued on the context's stream and complete on return.
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

  kvarn_context_t* context_ = nullptr;
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kvarn_selftest

#endif  // KVARN_TOOLS_SELFTEST_DEVICE_BUFFER_H_
