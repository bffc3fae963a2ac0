// kvarn_memory_* and kvarn_context_synchronize on the CPU backend.
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>

#include <cmath>
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

// kvarn_context_error_word on the CPU: a valid word that stays 0, since every CPU call returns
// its own errors; bad arguments are refused.
TEST(MemoryApi, ErrorWordIsZeroOnTheCpuAndSurvivesFailingCalls) {
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(nullptr, &ctx), KVARN_OK);
  const int32_t* word = nullptr;
  ASSERT_EQ(kvarn_context_error_word(ctx, &word), KVARN_OK) << kvarn_last_error();
  ASSERT_NE(word, nullptr);
  EXPECT_EQ(*word, 0);
  // A call that fails on bad data returns the error itself and leaves the word alone.
  kvarn_config_t cfg;
  ASSERT_EQ(kvarn_config_from_preset("k4v2_g128", 128, &cfg), KVARN_OK);
  std::vector<float> k(128 * 128, 1.f), v(k.size(), 1.f);
  k[5] = NAN;
  size_t rb = 0;
  ASSERT_EQ(kvarn_record_bytes(&cfg, &rb), KVARN_OK);
  std::vector<uint8_t> rec(rb);
  EXPECT_EQ(kvarn_quantize(ctx, &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(), KVARN_CODEC_DEFAULT,
                           rec.data(), rb),
            KVARN_ERR_NON_FINITE);
  EXPECT_EQ(*word, 0);
  const int32_t* again = nullptr;
  ASSERT_EQ(kvarn_context_error_word(ctx, &again), KVARN_OK);
  EXPECT_EQ(again, word);  // one word per context, for its lifetime
  EXPECT_EQ(kvarn_context_error_word(ctx, nullptr), KVARN_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kvarn_context_error_word(nullptr, &again), KVARN_ERR_INVALID_ARGUMENT);
  kvarn_context_destroy(ctx);
}
