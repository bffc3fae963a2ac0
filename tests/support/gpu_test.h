// GPU test helpers: a CUDA context or a clean skip, and device buffers moved through the public
// memory calls (kvarn_memory_alloc/copy/free), so the GPU suites need no CUDA headers.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/kvarn_test.h"

namespace kvt {

// The GPU backend the suites test: CUDA, or ROCm in a HIP build (tests/gpu_tests.cmake defines
// KVT_GPU_BACKEND_ROCM there).
#ifdef KVT_GPU_BACKEND_ROCM
constexpr kvarn_backend_t kGpuBackend = KVARN_BACKEND_ROCM;
#else
constexpr kvarn_backend_t kGpuBackend = KVARN_BACKEND_CUDA;
#endif

// A CUDA (or ROCm: kGpuBackend) context on device 0, or nullptr when this build or machine has no
// CUDA device (the caller then GTEST_SKIPs with kvarn_last_error()).
inline ContextPtr MakeCudaContext() {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = kGpuBackend;
  kvarn_context_t* c = nullptr;
  if (kvarn_context_create(&o, &c) != KVARN_OK) return ContextPtr(nullptr);
  return ContextPtr(c);
}

#define KVT_CUDA_CONTEXT_OR_SKIP(var)               \
  ::kvt::ContextPtr var = ::kvt::MakeCudaContext(); \
  if (!var) GTEST_SKIP() << "no GPU backend/device here: " << kvarn_last_error()

// Device memory of a context, freed with it; filled and read back through kvarn_memory_copy.
class DeviceBuffer {
 public:
  DeviceBuffer(kvarn_context_t* ctx, size_t bytes) : ctx_(ctx), bytes_(bytes) {
    EXPECT_EQ(kvarn_memory_alloc(ctx, bytes, &ptr_), KVARN_OK) << kvarn_last_error();
  }
  template <typename T>
  DeviceBuffer(kvarn_context_t* ctx, const std::vector<T>& host)
      : DeviceBuffer(ctx, host.size() * sizeof(T)) {
    Upload(host);
  }
  ~DeviceBuffer() {
    if (ptr_) kvarn_memory_free(ctx_, ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  template <typename T>
  void Upload(const std::vector<T>& host) {
    ASSERT_LE(host.size() * sizeof(T), bytes_);
    ASSERT_EQ(kvarn_memory_copy(ctx_, ptr_, host.data(), host.size() * sizeof(T),
                                KVARN_COPY_HOST_TO_DEVICE),
              KVARN_OK)
        << kvarn_last_error();
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> host(bytes_ / sizeof(T));
    EXPECT_EQ(kvarn_memory_copy(ctx_, host.data(), ptr_, host.size() * sizeof(T),
                                KVARN_COPY_DEVICE_TO_HOST),
              KVARN_OK)
        << kvarn_last_error();
    return host;
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  kvarn_context_t* ctx_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// A PagedCache (support/kvarn_test.h) mirrored in a context's memory, and its kvarn_paged_kv_t
// view pointing there.
struct DevicePagedCache {
  DeviceBuffer records, k_pages, v_pages, table, lens, rtiles;
  kvarn_paged_kv_t kv;
  DevicePagedCache(kvarn_context_t* ctx, PagedCache& pc)
      : records(ctx, pc.records),
        k_pages(ctx, pc.k_pages),
        v_pages(ctx, pc.v_pages),
        table(ctx, pc.block_table),
        lens(ctx, pc.seq_lens),
        rtiles(ctx, pc.record_tiles) {
    kv = pc.View();
    kv.records = records.get();
    kv.k_pages = k_pages.get();
    kv.v_pages = v_pages.get();
    kv.block_table = static_cast<const int32_t*>(table.get());
    kv.seq_lens = static_cast<const int32_t*>(lens.get());
    kv.record_tiles = static_cast<const int32_t*>(rtiles.get());
  }
};

}  // namespace kvt
