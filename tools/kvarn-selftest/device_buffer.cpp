// Memory in the address space a libkvarn context works on.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include "device_buffer.h"

#include <vector>

namespace kvarn_selftest {
namespace {

// "call failed: status (detail)", or true for KVARN_OK. Reads kvarn_last_error() before
// kvarn_status_string() (itself a kvarn_* call).
bool StatusOk(kvarn_status_t status, const char* call, std::string* error) {
  if (status == KVARN_OK) return true;
  const std::string detail = kvarn_last_error();
  *error = std::string(call) + " failed: " + kvarn_status_string(status);
  if (!detail.empty()) *error += " (" + detail + ")";
  return false;
}

}  // namespace

bool Synchronize(kvarn_context_t* context, std::string* error) {
  return StatusOk(kvarn_context_synchronize(context), "kvarn_context_synchronize", error);
}

DeviceBuffer::~DeviceBuffer() { Release(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : context_(other.context_), data_(other.data_), bytes_(other.bytes_) {
  other.data_ = nullptr;
  other.bytes_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    context_ = other.context_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::Release() {
  kvarn_memory_free(context_, data_);  // NULL is a no-op
  data_ = nullptr;
  bytes_ = 0;
}

bool DeviceBuffer::Allocate(kvarn_context_t* context, size_t bytes, std::string* error) {
  Release();
  context_ = context;
  if (bytes == 0) return true;
  void* ptr = nullptr;
  if (!StatusOk(kvarn_memory_alloc(context, bytes, &ptr), "kvarn_memory_alloc", error)) {
    return false;
  }
  data_ = ptr;
  bytes_ = bytes;
  return true;
}

bool DeviceBuffer::Upload(const void* host, size_t bytes, std::string* error, size_t offset) {
  if (offset + bytes > bytes_) {
    *error = "upload beyond the end of a buffer";
    return false;
  }
  if (bytes == 0) return true;
  return StatusOk(kvarn_memory_copy(context_, static_cast<char*>(data_) + offset, host, bytes,
                                    KVARN_COPY_HOST_TO_DEVICE),
                  "kvarn_memory_copy", error);
}

bool DeviceBuffer::Download(void* host, size_t bytes, std::string* error, size_t offset) const {
  if (offset + bytes > bytes_) {
    *error = "download beyond the end of a buffer";
    return false;
  }
  if (bytes == 0) return true;
  return StatusOk(kvarn_memory_copy(context_, host, static_cast<const char*>(data_) + offset, bytes,
                                    KVARN_COPY_DEVICE_TO_HOST),
                  "kvarn_memory_copy", error);
}

bool DeviceBuffer::Fill(unsigned char value, std::string* error) {
  if (bytes_ == 0) return true;
  // kvarn.h has no memset: upload a host buffer holding the value.
  const std::vector<unsigned char> host(bytes_, value);
  return Upload(host.data(), host.size(), error);
}

}  // namespace kvarn_selftest
