// kvarn_memory_* and kvarn_context_synchronize on the CPU backend.
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>

#include <cstdint>
#include <cstring>
#include <vector>

TEST(MemoryApi, AllocCopyRoundTripAndAlignment) {
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(nullptr, &ctx), KVARN_OK);
  void* p = nullptr;
  ASSERT_EQ(kvarn_memory_alloc(ctx, 1000, &p), KVARN_OK);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::vector<uint8_t> src(1000), dst(1000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
  ASSERT_EQ(kvarn_memory_copy(ctx, p, src.data(), 1000, KVARN_COPY_HOST_TO_DEVICE), KVARN_OK);
  ASSERT_EQ(kvarn_memory_copy(ctx, dst.data(), p, 1000, KVARN_COPY_DEVICE_TO_HOST), KVARN_OK);
  EXPECT_EQ(src, dst);
  EXPECT_EQ(kvarn_context_synchronize(ctx), KVARN_OK);
  kvarn_memory_free(ctx, p);
  kvarn_memory_free(ctx, nullptr);  // no-op
  kvarn_context_destroy(ctx);
}

TEST(MemoryApi, BadArgumentsGiveStatuses) {
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(nullptr, &ctx), KVARN_OK);
  void* p = nullptr;
  uint8_t a[4] = {1, 2, 3, 4}, b[4] = {9, 9, 9, 9};
  EXPECT_EQ(kvarn_memory_alloc(nullptr, 8, &p), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_memory_alloc(ctx, 8, nullptr), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_memory_copy(nullptr, b, a, 4, KVARN_COPY_HOST_TO_DEVICE),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_memory_copy(ctx, b, a, 4, static_cast<kvarn_copy_kind_t>(7)),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_memory_copy(ctx, nullptr, a, 4, KVARN_COPY_HOST_TO_DEVICE),
            KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::strlen(kvarn_last_error()), 0u);
  EXPECT_EQ(b[0], 9);
  EXPECT_EQ(kvarn_context_synchronize(nullptr), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_memory_alloc(ctx, SIZE_MAX - 10, &p), KVARN_ERR_OUT_OF_MEMORY);
  kvarn_context_destroy(ctx);
}
