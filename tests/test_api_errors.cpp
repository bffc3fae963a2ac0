// Bad input at the C API for every layer-1/2 function and the version, status, backend, context
// and config functions: the documented status, a kvarn_last_error() that names the problem, and
// outputs left exactly as they were (kvarn.h: "A failing call changes nothing it was given to
// write"; bench/RESULTS.md, Targets: reliability).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/fp.h"
#include "support/kvarn_test.h"

namespace {

using kvt::IsError;
using kvt::MakeConfig;

// An out-of-range value of a public enum. The enums' enumerators span 0..0x7fffffff, so only
// values in that range are valid C++ enum values (negative ones would be undefined behaviour in
// the test itself, and UBSan's enum check would flag them); C callers can pass anything.
template <typename T>
T Bad(int v) {
  return static_cast<T>(v);
}

// ---- status strings and the last error -------------------------------------------------------

TEST(StatusString, NeverNullForAnyValue) {
  for (int s = 0; s <= 14; ++s) {
    const char* str = kvarn_status_string(static_cast<kvarn_status_t>(s));
    ASSERT_NE(str, nullptr) << s;
    EXPECT_GT(std::strlen(str), 0u) << s;
    EXPECT_STRNE(str, "unknown status") << s;
  }
  for (int s : {15, 16, 100, 12345, 0x7ffffffe, 0x7fffffff}) {
    const char* str = kvarn_status_string(static_cast<kvarn_status_t>(s));
    ASSERT_NE(str, nullptr) << s;
    EXPECT_STREQ(str, "unknown status") << s;
  }
}

TEST(StatusString, KnownValuesAreDistinct) {
  for (int a = 0; a <= 14; ++a) {
    for (int b = 0; b < a; ++b) {
      EXPECT_STRNE(kvarn_status_string(static_cast<kvarn_status_t>(a)),
                   kvarn_status_string(static_cast<kvarn_status_t>(b)));
    }
  }
}

TEST(LastError, ClearedOnSuccess) {
  ASSERT_NE(kvarn_last_error(), nullptr);
  kvarn_config_t c = MakeConfig(100, 128, 4, 2);
  EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_UNSUPPORTED, "100"));
  c = MakeConfig(128, 128, 4, 2);
  EXPECT_EQ(kvarn_config_validate(&c), KVARN_OK);
  ASSERT_NE(kvarn_last_error(), nullptr);
  EXPECT_STREQ(kvarn_last_error(), "");
  // Also after a successful call of another kind.
  EXPECT_TRUE(IsError(kvarn_config_validate(nullptr), KVARN_ERR_INVALID_ARGUMENT));
  size_t n = 0;
  EXPECT_EQ(kvarn_record_bytes(&c, &n), KVARN_OK);
  EXPECT_STREQ(kvarn_last_error(), "");
}

TEST(LastError, IsPerThread) {
  EXPECT_TRUE(IsError(kvarn_config_validate(nullptr), KVARN_ERR_INVALID_ARGUMENT));
  std::string other = "not run";
  std::thread t([&] { other = kvarn_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_STRNE(kvarn_last_error(), "");
}

// ---- versions, dtypes, backends, CPU features -------------------------------------------------

TEST(Backends, InfoRejectsBadArguments) {
  EXPECT_TRUE(IsError(kvarn_backend_get_info(0, nullptr), KVARN_ERR_INVALID_ARGUMENT, "info"));
  kvarn_backend_info_t info;
  std::memset(&info, 0x3c, sizeof info);
  // Sizes other than sizeof are growable-struct cases (test_struct_abi.cpp); below
  // sizeof(size_t) and above 4096 are refused.
  for (size_t bad : {size_t{0}, sizeof(size_t) - 1, size_t{4097}}) {
    info.size = bad;
    kvarn_backend_info_t before = info;
    EXPECT_TRUE(IsError(kvarn_backend_get_info(0, &info), KVARN_ERR_INVALID_ARGUMENT, "size"));
    EXPECT_EQ(std::memcmp(&info, &before, sizeof info), 0);
  }
  kvarn_backend_info_t before;
  info.size = sizeof info;
  before = info;
  for (int idx : {-1, kvarn_backend_count(), 1000}) {
    EXPECT_TRUE(IsError(kvarn_backend_get_info(idx, &info), KVARN_ERR_NOT_FOUND, "index")) << idx;
    EXPECT_EQ(std::memcmp(&info, &before, sizeof info), 0);
  }
}

TEST(Backends, CpuIsAvailableAndListed) {
  ASSERT_GE(kvarn_backend_count(), 3);
  bool cpu = false;
  for (int i = 0; i < kvarn_backend_count(); ++i) {
    kvarn_backend_info_t info;
    info.size = sizeof info;
    ASSERT_EQ(kvarn_backend_get_info(i, &info), KVARN_OK) << kvarn_last_error();
    ASSERT_NE(info.name, nullptr);
    ASSERT_NE(info.reason, nullptr);
    EXPECT_STREQ(info.name, kvarn_backend_name(info.backend));
    if (info.available) {
      EXPECT_STREQ(info.reason, "");
      EXPECT_GE(info.device_count, 1);
    } else {
      EXPECT_STRNE(info.reason, "") << info.name << " unavailable without a reason";
    }
    if (info.backend == KVARN_BACKEND_CPU) {
      cpu = true;
      EXPECT_EQ(info.available, 1);
      EXPECT_EQ(info.device_count, 1);
    }
  }
  EXPECT_TRUE(cpu);
}

TEST(Backends, NamesNeverNull) {
  EXPECT_STREQ(kvarn_backend_name(KVARN_BACKEND_AUTO), "auto");
  EXPECT_STREQ(kvarn_backend_name(KVARN_BACKEND_CPU), "cpu");
  EXPECT_STREQ(kvarn_backend_name(KVARN_BACKEND_CUDA), "cuda");
  EXPECT_STREQ(kvarn_backend_name(KVARN_BACKEND_ROCM), "rocm");
  for (int b : {4, 99, 0x7fffffff}) EXPECT_NE(kvarn_backend_name(Bad<kvarn_backend_t>(b)), nullptr);
  EXPECT_STREQ(kvarn_cpu_isa_name(KVARN_CPU_ISA_SCALAR), "scalar");
  EXPECT_STREQ(kvarn_cpu_isa_name(KVARN_CPU_ISA_NONE), "none");
  for (int i : {4, 17, 254, 0x7fffffff})
    EXPECT_NE(kvarn_cpu_isa_name(Bad<kvarn_cpu_isa_t>(i)), nullptr);
}

TEST(CpuFeatures, BufferChecks) {
  EXPECT_TRUE(IsError(kvarn_cpu_features(nullptr, 64), KVARN_ERR_INVALID_ARGUMENT, "buf"));
  char buf[4] = {'x', 'x', 'x', 'x'};
  EXPECT_TRUE(IsError(kvarn_cpu_features(buf, 0), KVARN_ERR_INVALID_ARGUMENT, "buf"));
  EXPECT_EQ(buf[0], 'x');
  char big[1024];
  ASSERT_EQ(kvarn_cpu_features(big, sizeof big), KVARN_OK) << kvarn_last_error();
  if (std::strlen(big) > 0) {
    char one[1] = {'x'};
    EXPECT_TRUE(IsError(kvarn_cpu_features(one, 1), KVARN_ERR_BUFFER_TOO_SMALL, "bytes"));
    EXPECT_EQ(one[0], '\0');  // truncated, still terminated
  }
}

TEST(CpuFeatures, MaxIsaRejectsUnknownValues) {
  for (int i : {4, 254, static_cast<int>(KVARN_CPU_ISA_NONE), 1000, 0x7fffffff}) {
    EXPECT_TRUE(
        IsError(kvarn_set_max_cpu_isa(Bad<kvarn_cpu_isa_t>(i)), KVARN_ERR_INVALID_ARGUMENT, "isa"))
        << i;
  }
}

// ---- contexts ----------------------------------------------------------------------------------

TEST(Context, CreateRejectsBadOptions) {
  kvarn_context_t* const sentinel = reinterpret_cast<kvarn_context_t*>(0x1234);
  kvarn_context_t* ctx = sentinel;
  EXPECT_TRUE(
      IsError(kvarn_context_create(nullptr, nullptr), KVARN_ERR_INVALID_ARGUMENT, "out_context"));
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  for (size_t bad : {size_t{0}, sizeof(size_t) - 1, size_t{1} << 40}) {
    o.size = bad;
    EXPECT_TRUE(IsError(kvarn_context_create(&o, &ctx), KVARN_ERR_INVALID_ARGUMENT, "size"));
    EXPECT_EQ(ctx, sentinel);
  }
  kvarn_context_options_defaults(&o);
  o.num_threads = -1;
  EXPECT_TRUE(IsError(kvarn_context_create(&o, &ctx), KVARN_ERR_INVALID_ARGUMENT, "num_threads"));
  EXPECT_EQ(ctx, sentinel);
  kvarn_context_options_defaults(&o);
  for (int b : {4, 5, 1000, 0x7fffffff}) {
    o.backend = Bad<kvarn_backend_t>(b);
    EXPECT_TRUE(IsError(kvarn_context_create(&o, &ctx), KVARN_ERR_INVALID_ARGUMENT, "backend"))
        << b;
    EXPECT_EQ(ctx, sentinel);
  }
}

TEST(Context, MissingGpuBackendsAreUnavailableNeverAFallback) {
  for (kvarn_backend_t b : {KVARN_BACKEND_CUDA, KVARN_BACKEND_ROCM}) {
    bool available = false;
    for (int i = 0; i < kvarn_backend_count(); ++i) {
      kvarn_backend_info_t info;
      info.size = sizeof info;
      ASSERT_EQ(kvarn_backend_get_info(i, &info), KVARN_OK);
      if (info.backend == b) available = info.available != 0;
    }
    if (available) continue;  // a machine with that GPU: nothing to check here
    kvarn_context_options_t o;
    kvarn_context_options_defaults(&o);
    o.backend = b;
    kvarn_context_t* ctx = nullptr;
    EXPECT_TRUE(IsError(kvarn_context_create(&o, &ctx), KVARN_ERR_BACKEND_UNAVAILABLE,
                        kvarn_backend_name(b)));
    EXPECT_EQ(ctx, nullptr);
  }
}

TEST(Context, CpuDeviceMustBeZero) {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  kvarn_context_t* ctx = nullptr;
  for (int dev : {1, 2, -1}) {
    o.device = dev;
    EXPECT_TRUE(IsError(kvarn_context_create(&o, &ctx), KVARN_ERR_INVALID_ARGUMENT, "device"))
        << dev;
    EXPECT_EQ(ctx, nullptr);
  }
}

TEST(Defaults, InitializersAcceptNullAndSetSizes) {
  kvarn_paged_kv_defaults(nullptr);  // no crash
  kvarn_attention_params_defaults(nullptr);
  kvarn_context_options_defaults(nullptr);
  kvarn_config_defaults(nullptr);
  kvarn_paged_kv_t kv;
  std::memset(&kv, 0x5a, sizeof kv);
  kvarn_paged_kv_defaults(&kv);
  EXPECT_EQ(kv.size, sizeof kv);
  EXPECT_EQ(kv.batch, 0);
  EXPECT_EQ(kv.records, nullptr);
  EXPECT_EQ(kv.block_table, nullptr);
  kvarn_attention_params_t p;
  std::memset(&p, 0x5a, sizeof p);
  kvarn_attention_params_defaults(&p);
  EXPECT_EQ(p.size, sizeof p);
  EXPECT_EQ(p.scale, 0.f);
  EXPECT_EQ(p.q_indptr, nullptr);
  EXPECT_EQ(p.q_dtype, KVARN_DTYPE_F32);
  EXPECT_EQ(p.out_dtype, KVARN_DTYPE_F32);
  EXPECT_EQ(p.num_splits, 0);
  kvarn_context_options_t o;
  std::memset(&o, 0x5a, sizeof o);
  kvarn_context_options_defaults(&o);
  EXPECT_EQ(o.size, sizeof o);
  EXPECT_EQ(o.backend, KVARN_BACKEND_AUTO);
  EXPECT_EQ(o.device, 0);
  EXPECT_EQ(o.stream, nullptr);
  EXPECT_EQ(o.num_threads, 0);
}

TEST(Context, DefaultsAndGetters) {
  kvarn_context_options_defaults(nullptr);  // no crash
  kvarn_context_destroy(nullptr);           // no-op
  kvarn_context_t* ctx = nullptr;
  ASSERT_EQ(kvarn_context_create(nullptr, &ctx), KVARN_OK) << kvarn_last_error();
  ASSERT_NE(ctx, nullptr);
  kvarn_backend_t b = Bad<kvarn_backend_t>(77);
  EXPECT_EQ(kvarn_context_get_backend(ctx, &b), KVARN_OK);
  EXPECT_NE(b, KVARN_BACKEND_AUTO);
  int32_t dev = -5, threads = -5;
  EXPECT_EQ(kvarn_context_get_device(ctx, &dev), KVARN_OK);
  EXPECT_EQ(kvarn_context_get_num_threads(ctx, &threads), KVARN_OK);
  EXPECT_GE(threads, 1);
  if (b == KVARN_BACKEND_CPU) {
    EXPECT_EQ(dev, 0);
    kvarn_cpu_isa_t isa = KVARN_CPU_ISA_NONE;
    EXPECT_EQ(kvarn_context_get_cpu_isa(ctx, &isa), KVARN_OK);
    EXPECT_NE(isa, KVARN_CPU_ISA_NONE);
  }
  kvarn_context_destroy(ctx);
}

TEST(Context, GettersRejectNulls) {
  auto ctx = kvt::MakeCpuContext();
  kvarn_backend_t b = Bad<kvarn_backend_t>(77);
  kvarn_cpu_isa_t isa = Bad<kvarn_cpu_isa_t>(77);
  int32_t i = 77;
  EXPECT_TRUE(
      IsError(kvarn_context_get_backend(nullptr, &b), KVARN_ERR_INVALID_ARGUMENT, "context"));
  EXPECT_TRUE(
      IsError(kvarn_context_get_cpu_isa(nullptr, &isa), KVARN_ERR_INVALID_ARGUMENT, "context"));
  EXPECT_TRUE(
      IsError(kvarn_context_get_device(nullptr, &i), KVARN_ERR_INVALID_ARGUMENT, "context"));
  EXPECT_TRUE(
      IsError(kvarn_context_get_num_threads(nullptr, &i), KVARN_ERR_INVALID_ARGUMENT, "context"));
  EXPECT_EQ(b, 77);
  EXPECT_EQ(isa, 77);
  EXPECT_EQ(i, 77);
  EXPECT_TRUE(
      IsError(kvarn_context_get_backend(ctx.get(), nullptr), KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(
      IsError(kvarn_context_get_cpu_isa(ctx.get(), nullptr), KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(
      IsError(kvarn_context_get_device(ctx.get(), nullptr), KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(IsError(kvarn_context_get_num_threads(ctx.get(), nullptr), KVARN_ERR_INVALID_ARGUMENT,
                      "null"));
}

// ---- configurations ----------------------------------------------------------------------------

TEST(ConfigErrors, NullArguments) {
  kvarn_config_defaults(nullptr);  // no crash
  kvarn_config_t c;
  EXPECT_TRUE(
      IsError(kvarn_config_from_preset(nullptr, 128, &c), KVARN_ERR_INVALID_ARGUMENT, "null"));
  c = MakeConfig(128, 128, 4, 2);
  EXPECT_TRUE(IsError(kvarn_record_bytes(&c, nullptr), KVARN_ERR_INVALID_ARGUMENT, "out_bytes"));
  size_t n = 99, off = 99;
  EXPECT_TRUE(IsError(kvarn_record_bytes(nullptr, &n), KVARN_ERR_INVALID_ARGUMENT, "config"));
  EXPECT_EQ(n, 99u);
  EXPECT_TRUE(IsError(kvarn_record_field(&c, KVARN_FIELD_K_CODES, nullptr, &n),
                      KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(IsError(kvarn_record_field(&c, KVARN_FIELD_K_CODES, &off, nullptr),
                      KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(IsError(kvarn_record_field(nullptr, KVARN_FIELD_K_CODES, &off, &n),
                      KVARN_ERR_INVALID_ARGUMENT, "config"));
  EXPECT_EQ(n, 99u);
  EXPECT_EQ(off, 99u);
}

// Runs `call` in a child process (a gtest death test) and expects it to return `want` there, so
// a crash shows up as this test's failure ("died by signal 11") instead of ending the run.
#define KVT_EXPECT_STATUS_IN_CHILD(call, want)                                    \
  EXPECT_EXIT(                                                                    \
      {                                                                           \
        const kvarn_status_t st_ = (call);                                        \
        std::exit(st_ == (want) && kvarn_last_error()[0] != '\0' ? 0 : 10 + st_); \
      },                                                                          \
      ::testing::ExitedWithCode(0), "")

TEST(ConfigErrors, FromPresetRejectsNullConfig) {
  // kvarn.h: NULL pointers give KVARN_ERR_INVALID_ARGUMENT.
  KVT_EXPECT_STATUS_IN_CHILD(kvarn_config_from_preset("k4v2_g128", 128, nullptr),
                             KVARN_ERR_INVALID_ARGUMENT);
}

TEST(ConfigErrors, RecordQueriesRejectBadConfigsAndFields) {
  size_t n = 99, off = 99;
  kvarn_config_t c = MakeConfig(128, 128, 3, 2);
  EXPECT_TRUE(IsError(kvarn_record_bytes(&c, &n), KVARN_ERR_UNSUPPORTED, "bits"));
  c = MakeConfig(100, 128, 4, 2);
  EXPECT_TRUE(IsError(kvarn_record_field(&c, KVARN_FIELD_V_ZERO, &off, &n), KVARN_ERR_UNSUPPORTED,
                      "head_dim"));
  c = MakeConfig(128, 128, 4, 2);
  c.size = 4;
  EXPECT_TRUE(IsError(kvarn_record_bytes(&c, &n), KVARN_ERR_INVALID_ARGUMENT, "size"));
  c = MakeConfig(128, 128, 4, 2);
  for (int f : {8, 9, 1000, 0x7fffffff}) {
    EXPECT_TRUE(IsError(kvarn_record_field(&c, Bad<kvarn_record_field_t>(f), &off, &n),
                        KVARN_ERR_INVALID_ARGUMENT, "field"))
        << f;
  }
  EXPECT_EQ(n, 99u);
  EXPECT_EQ(off, 99u);
}

// Messages for a value outside a set name the whole set (72 and 100 lie between supported sizes,
// neighbours of 80 and 96).
TEST(ConfigErrors, MessagesListTheAllowedValues) {
  kvarn_config_t c;
  size_t n = 0;
  for (int D : {72, 100, 88, 160, 48}) {
    EXPECT_EQ(kvarn_config_from_preset("k4v2_g128", D, &c), KVARN_ERR_UNSUPPORTED);
    EXPECT_EQ(kvarn_last_error(), "head_dim " + std::to_string(D) +
                                      " unsupported: must be one of 64, 80, 96, 128, 256, 512");
    c = MakeConfig(D, 128, 4, 2);
    EXPECT_EQ(kvarn_record_bytes(&c, &n), KVARN_ERR_UNSUPPORTED);
    EXPECT_EQ(kvarn_last_error(), "head_dim " + std::to_string(D) +
                                      " unsupported: must be one of 64, 80, 96, 128, 256, 512");
  }
  c = MakeConfig(128, 96, 4, 2);
  EXPECT_EQ(kvarn_record_bytes(&c, &n), KVARN_ERR_UNSUPPORTED);
  EXPECT_STREQ(kvarn_last_error(), "tile_tokens 96 unsupported: must be one of 64, 128");
  c = MakeConfig(128, 128, 4, 3);
  EXPECT_EQ(kvarn_record_bytes(&c, &n), KVARN_ERR_UNSUPPORTED);
  EXPECT_STREQ(kvarn_last_error(),
               "key_bits/value_bits 4/3 unsupported: each must be one of 2, 4, 8");
}

// ---- layer 1 -----------------------------------------------------------------------------------

class CodecErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = kvt::MakeCpuContext();
    cfg_ = MakeConfig(64, 64, 4, 2);
    rb_ = kvt::RecordBytes(cfg_);
    k_.assign(64 * 64, 0.5f);
    v_.assign(64 * 64, -0.5f);
    for (size_t i = 0; i < k_.size(); ++i) k_[i] += 0.001f * (i % 97);
    rec_.assign(2 * rb_, 0xA7);
    out_.assign(2 * 64 * 64, 7.f);
  }
  // Expects a failing quantize into rec_ with nothing written.
  void ExpectQuantizeFails(const kvarn_config_t* cfg, size_t n, kvarn_dtype_t dt, const void* k,
                           const void* v, uint32_t flags, void* rec, size_t stride,
                           kvarn_status_t want, const char* needle, kvarn_context_t* ctx) {
    const auto before = rec_;
    EXPECT_TRUE(IsError(kvarn_quantize(ctx, cfg, n, dt, k, v, flags, rec, stride), want, needle));
    EXPECT_EQ(rec_, before);
  }
  void ExpectDequantizeFails(const kvarn_config_t* cfg, size_t n, const void* rec, size_t stride,
                             uint32_t flags, kvarn_dtype_t dt, void* k, void* v,
                             kvarn_status_t want, const char* needle, kvarn_context_t* ctx) {
    const auto before = out_;
    EXPECT_TRUE(IsError(kvarn_dequantize(ctx, cfg, n, rec, stride, flags, dt, k, v), want, needle));
    EXPECT_EQ(out_, before);
  }

  kvt::ContextPtr ctx_;
  kvarn_config_t cfg_;
  size_t rb_ = 0;
  std::vector<float> k_, v_, out_;
  std::vector<uint8_t> rec_;
};

TEST_F(CodecErrors, RotateRejectsBadArguments) {
  std::vector<float> in(128, 1.f), out(128, 3.f);
  const auto before = out;
  EXPECT_TRUE(
      IsError(kvarn_rotate(nullptr, 64, 2, KVARN_DTYPE_F32, in.data(), KVARN_DTYPE_F32, out.data()),
              KVARN_ERR_INVALID_ARGUMENT, "context"));
  for (int D : {0, 32, 72, 100, 1024, -64}) {
    EXPECT_TRUE(IsError(
        kvarn_rotate(ctx_.get(), D, 2, KVARN_DTYPE_F32, in.data(), KVARN_DTYPE_F32, out.data()),
        KVARN_ERR_UNSUPPORTED, "head_dim"))
        << D;
  }
  for (int dt : {3, 100, 0x7fffffff}) {
    EXPECT_TRUE(IsError(kvarn_rotate(ctx_.get(), 64, 2, Bad<kvarn_dtype_t>(dt), in.data(),
                                     KVARN_DTYPE_F32, out.data()),
                        KVARN_ERR_INVALID_ARGUMENT, "dtype"));
    EXPECT_TRUE(IsError(kvarn_rotate(ctx_.get(), 64, 2, KVARN_DTYPE_F32, in.data(),
                                     Bad<kvarn_dtype_t>(dt), out.data()),
                        KVARN_ERR_INVALID_ARGUMENT, "dtype"));
  }
  EXPECT_TRUE(IsError(
      kvarn_rotate(ctx_.get(), 64, 2, KVARN_DTYPE_F32, nullptr, KVARN_DTYPE_F32, out.data()),
      KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(
      IsError(kvarn_rotate(ctx_.get(), 64, 2, KVARN_DTYPE_F32, in.data(), KVARN_DTYPE_F32, nullptr),
              KVARN_ERR_INVALID_ARGUMENT, "null"));
  // In place needs equal dtypes.
  std::vector<float> buf(128, 2.f);
  const auto buf_before = buf;
  EXPECT_TRUE(IsError(
      kvarn_rotate(ctx_.get(), 64, 2, KVARN_DTYPE_F32, buf.data(), KVARN_DTYPE_F16, buf.data()),
      KVARN_ERR_INVALID_ARGUMENT, "place"));
  EXPECT_EQ(buf, buf_before);
  EXPECT_EQ(out, before);
}

TEST_F(CodecErrors, QuantizeRejectsBadArguments) {
  kvarn_context_t* c = ctx_.get();
  void* r = rec_.data();
  ExpectQuantizeFails(&cfg_, 2, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_INVALID_ARGUMENT, "context", nullptr);
  ExpectQuantizeFails(nullptr, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_INVALID_ARGUMENT, "config", c);
  kvarn_config_t bad = cfg_;
  bad.size = 0;
  ExpectQuantizeFails(&bad, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_INVALID_ARGUMENT, "size", c);
  bad = MakeConfig(72, 64, 4, 2);
  ExpectQuantizeFails(&bad, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_UNSUPPORTED, "head_dim", c);
  bad = MakeConfig(64, 32, 4, 2);
  ExpectQuantizeFails(&bad, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_UNSUPPORTED, "tile_tokens", c);
  bad = MakeConfig(64, 64, 4, 1);
  ExpectQuantizeFails(&bad, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_UNSUPPORTED, "bits", c);
  bad = MakeConfig(64, 64, 4, 2, 8, 1, 0, 16);
  ExpectQuantizeFails(&bad, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_,
                      KVARN_ERR_INVALID_ARGUMENT, "flags", c);
  for (int dt : {3, 1 << 20, 0x7fffffff}) {
    ExpectQuantizeFails(&cfg_, 1, Bad<kvarn_dtype_t>(dt), k_.data(), v_.data(), 0, r, rb_,
                        KVARN_ERR_INVALID_ARGUMENT, "dtype", c);
  }
  for (uint32_t flags : {2u, 4u, 0x80000000u, 3u}) {
    ExpectQuantizeFails(&cfg_, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), flags, r, rb_,
                        KVARN_ERR_INVALID_ARGUMENT, "flags", c);
  }
  ExpectQuantizeFails(&cfg_, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_ - 1,
                      KVARN_ERR_INVALID_ARGUMENT, "record_stride", c);
  ExpectQuantizeFails(&cfg_, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, 0,
                      KVARN_ERR_INVALID_ARGUMENT, "record_stride", c);
  ExpectQuantizeFails(&cfg_, 1, KVARN_DTYPE_F32, nullptr, v_.data(), 0, r, rb_,
                      KVARN_ERR_INVALID_ARGUMENT, "null", c);
  ExpectQuantizeFails(&cfg_, 1, KVARN_DTYPE_F32, k_.data(), nullptr, 0, r, rb_,
                      KVARN_ERR_INVALID_ARGUMENT, "null", c);
  EXPECT_TRUE(
      IsError(kvarn_quantize(c, &cfg_, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, nullptr, rb_),
              KVARN_ERR_INVALID_ARGUMENT, "null"));
  // The same call with good arguments works (the failures above were about the arguments).
  KVT_EXPECT_OK(kvarn_quantize(c, &cfg_, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, r, rb_));
}

TEST_F(CodecErrors, DequantizeRejectsBadArguments) {
  kvarn_context_t* c = ctx_.get();
  KVT_ASSERT_OK(
      kvarn_quantize(c, &cfg_, 1, KVARN_DTYPE_F32, k_.data(), v_.data(), 0, rec_.data(), rb_));
  float* k = out_.data();
  float* v = out_.data() + 64 * 64;
  ExpectDequantizeFails(&cfg_, 1, rec_.data(), rb_, 0, KVARN_DTYPE_F32, k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "context", nullptr);
  ExpectDequantizeFails(nullptr, 1, rec_.data(), rb_, 0, KVARN_DTYPE_F32, k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "config", c);
  kvarn_config_t bad = cfg_;
  bad.size = 0;
  ExpectDequantizeFails(&bad, 1, rec_.data(), rb_, 0, KVARN_DTYPE_F32, k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "size", c);
  bad = MakeConfig(64, 64, 6, 2);
  ExpectDequantizeFails(&bad, 1, rec_.data(), rb_, 0, KVARN_DTYPE_F32, k, v, KVARN_ERR_UNSUPPORTED,
                        "bits", c);
  ExpectDequantizeFails(&cfg_, 1, rec_.data(), rb_, 0, Bad<kvarn_dtype_t>(9), k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "dtype", c);
  ExpectDequantizeFails(&cfg_, 1, rec_.data(), rb_, 8u, KVARN_DTYPE_F32, k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "flags", c);
  ExpectDequantizeFails(&cfg_, 1, rec_.data(), rb_ - 2, 0, KVARN_DTYPE_F32, k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "record_stride", c);
  ExpectDequantizeFails(&cfg_, 1, nullptr, rb_, 0, KVARN_DTYPE_F32, k, v,
                        KVARN_ERR_INVALID_ARGUMENT, "null", c);
  ExpectDequantizeFails(&cfg_, 1, rec_.data(), rb_, 0, KVARN_DTYPE_F32, nullptr, nullptr,
                        KVARN_ERR_INVALID_ARGUMENT, "null", c);
}

// ---- layer 2 -----------------------------------------------------------------------------------

// A small valid paged cache: 2 sequences, Hk 2, D 64, G 64, sink 1; sequence 0 has 150 tokens
// (sink page, 1 record tile, tail page), sequence 1 has 70 tokens (sink page, tail page).
class PagedErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    ctx_ = kvt::MakeCpuContext();
    cfg_ = MakeConfig(64, 64, 4, 2);
    KVT_SEEDED_RNG(rng, 0);
    kvt::PagedCacheSpec spec;
    spec.num_kv_heads = 2;
    spec.lens = {150, 70};
    ASSERT_TRUE(kvt::BuildPagedCache(ctx_.get(), cfg_, spec, rng, &pc_));
    ASSERT_EQ(pc_.record_tiles[0], 1);
    kvarn_attention_params_defaults(&params_);
    params_.num_q_heads = 8;
    q_.assign(2 * 8 * 64, 0.25f);
    out_.assign(2 * 8 * 64, 9.f);
    lse_.assign(2 * 8, 9.f);
    tok_k_.assign(3 * 2 * 64, 0.1f);
    tok_v_.assign(3 * 2 * 64, 0.2f);
  }

  kvarn_paged_kv_t View() { return pc_.View(); }

  // Calls attention with kv/params and expects a failure with out and lse unchanged.
  void ExpectAttentionFails(const kvarn_paged_kv_t* kv, const kvarn_attention_params_t* p,
                            kvarn_status_t want, const char* needle,
                            kvarn_context_t* ctx_override = nullptr, bool use_ctx = true,
                            const kvarn_config_t* cfg = nullptr, bool null_cfg = false) {
    const auto out_before = out_;
    const auto lse_before = lse_;
    kvarn_context_t* c = use_ctx ? (ctx_override ? ctx_override : ctx_.get()) : nullptr;
    const kvarn_config_t* conf = null_cfg ? nullptr : (cfg ? cfg : &cfg_);
    // A generous workspace, so that a backend needing one reports the problem under test.
    std::vector<uint8_t> workspace(1 << 20);
    EXPECT_TRUE(IsError(kvarn_paged_attention(c, conf, kv, p, q_.data(), out_.data(), lse_.data(),
                                              workspace.data(), workspace.size()),
                        want, needle));
    EXPECT_EQ(out_, out_before);
    EXPECT_EQ(lse_, lse_before);
  }

  // Appends 3 tokens to sequence 1 with kv, expecting a failure that leaves the pages alone.
  void ExpectAppendFails(const kvarn_paged_kv_t* kv, const int32_t* indptr, kvarn_dtype_t dt,
                         const void* k, const void* v, kvarn_status_t want, const char* needle,
                         bool use_ctx = true, const kvarn_config_t* cfg = nullptr,
                         bool null_cfg = false) {
    const auto kp = pc_.k_pages, vp = pc_.v_pages;
    const kvarn_config_t* conf = null_cfg ? nullptr : (cfg ? cfg : &cfg_);
    EXPECT_TRUE(
        IsError(kvarn_paged_append(use_ctx ? ctx_.get() : nullptr, conf, kv, indptr, dt, k, v),
                want, needle));
    EXPECT_EQ(pc_.k_pages, kp);
    EXPECT_EQ(pc_.v_pages, vp);
  }

  void ExpectFlushFails(const kvarn_paged_kv_t* kv, size_t n, const int32_t* src,
                        const int32_t* dst, kvarn_status_t want, const char* needle,
                        bool use_ctx = true, const kvarn_config_t* cfg = nullptr,
                        bool null_cfg = false) {
    const auto rec = pc_.records;
    const kvarn_config_t* conf = null_cfg ? nullptr : (cfg ? cfg : &cfg_);
    EXPECT_TRUE(IsError(kvarn_paged_flush(use_ctx ? ctx_.get() : nullptr, conf, kv, n, src, dst),
                        want, needle));
    EXPECT_EQ(pc_.records, rec);
  }

  kvt::ContextPtr ctx_;
  kvarn_config_t cfg_;
  kvt::PagedCache pc_;
  kvarn_attention_params_t params_;
  std::vector<float> q_, out_, lse_, tok_k_, tok_v_;
};

TEST_F(PagedErrors, ValidCallsSucceed) {
  // The baseline for every failure below.
  kvarn_paged_kv_t kv = View();
  size_t ws = 123;
  EXPECT_EQ(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, &params_, 2, &ws),
            KVARN_OK);
  std::vector<uint8_t> workspace(ws);
  EXPECT_EQ(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &params_, q_.data(), out_.data(),
                                  lse_.data(), ws ? workspace.data() : nullptr, ws),
            KVARN_OK)
      << kvarn_last_error();
  if (ws > 0) {
    // A workspace one byte short is refused.
    std::vector<uint8_t> w(ws);
    const auto before = out_;
    EXPECT_TRUE(IsError(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &params_, q_.data(),
                                              out_.data(), lse_.data(), w.data(), ws - 1),
                        KVARN_ERR_BUFFER_TOO_SMALL, "workspace"));
    EXPECT_EQ(out_, before);
  }
}

TEST_F(PagedErrors, WorkspaceTooSmallIsRefused) {
  // The CPU backend may need no workspace; when it needs some, less is BUFFER_TOO_SMALL and a
  // NULL workspace with a non-zero size need is refused too.
  kvarn_paged_kv_t kv = View();
  size_t ws = 0;
  KVT_ASSERT_OK(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, &params_, 2, &ws));
  if (ws == 0) {
    KVT_EXPECT_OK(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &params_, q_.data(), out_.data(),
                                        lse_.data(), nullptr, 0));
    return;
  }
  const auto before = out_;
  EXPECT_TRUE(IsError(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &params_, q_.data(),
                                            out_.data(), lse_.data(), nullptr, ws),
                      KVARN_ERR_BUFFER_TOO_SMALL, "workspace"));
  EXPECT_EQ(out_, before);
}

TEST_F(PagedErrors, AttentionRejectsNullsAndBadStructs) {
  kvarn_paged_kv_t kv = View();
  ExpectAttentionFails(&kv, &params_, KVARN_ERR_INVALID_ARGUMENT, "context", nullptr, false);
  ExpectAttentionFails(&kv, &params_, KVARN_ERR_INVALID_ARGUMENT, "config", nullptr, true, nullptr,
                       true);
  ExpectAttentionFails(nullptr, &params_, KVARN_ERR_INVALID_ARGUMENT, "kv");
  ExpectAttentionFails(&kv, nullptr, KVARN_ERR_INVALID_ARGUMENT, "params");
  kvarn_paged_kv_t bad = kv;
  bad.size = 0;
  ExpectAttentionFails(&bad, &params_, KVARN_ERR_INVALID_ARGUMENT, "size");
  kvarn_attention_params_t p = params_;
  p.size = 4;
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "size");
  // NULL q or out.
  const auto out_before = out_;
  EXPECT_TRUE(IsError(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &params_, nullptr, out_.data(),
                                            lse_.data(), nullptr, 0),
                      KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_TRUE(IsError(kvarn_paged_attention(ctx_.get(), &cfg_, &kv, &params_, q_.data(), nullptr,
                                            lse_.data(), nullptr, 0),
                      KVARN_ERR_INVALID_ARGUMENT, "null"));
  EXPECT_EQ(out_, out_before);
  // Unsupported configs.
  kvarn_config_t c = MakeConfig(64, 64, 5, 2);
  ExpectAttentionFails(&kv, &params_, KVARN_ERR_UNSUPPORTED, "bits", nullptr, true, &c);
  c = MakeConfig(48, 64, 4, 2);
  ExpectAttentionFails(&kv, &params_, KVARN_ERR_UNSUPPORTED, "head_dim", nullptr, true, &c);
  c = MakeConfig(64, 256, 4, 2);
  ExpectAttentionFails(&kv, &params_, KVARN_ERR_UNSUPPORTED, "tile_tokens", nullptr, true, &c);
}

TEST_F(PagedErrors, AttentionRejectsBadParams) {
  kvarn_paged_kv_t kv = View();
  for (int hq : {0, -8, 3, 5, 7, 9}) {  // Hk = 2: odd counts are not multiples
    kvarn_attention_params_t p = params_;
    p.num_q_heads = hq;
    ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "num_q_heads");
  }
  for (float s : {-1.f, NAN, INFINITY, -INFINITY}) {
    kvarn_attention_params_t p = params_;
    p.scale = s;
    ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "scale");
  }
  kvarn_attention_params_t p = params_;
  p.q_dtype = Bad<kvarn_dtype_t>(3);
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "dtype");
  p = params_;
  p.out_dtype = Bad<kvarn_dtype_t>(0x7fffffff);
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "dtype");
  p = params_;
  p.num_splits = -1;
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "num_splits");
}

TEST_F(PagedErrors, AttentionRejectsBadKvStructs) {
  kvarn_paged_kv_t kv = View();
  kvarn_paged_kv_t b = kv;
  b.num_kv_heads = 0;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "num_kv_heads");
  b = kv;
  b.batch = -1;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "batch");
  b = kv;
  b.record_stride = pc_.record_bytes - 2;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "record_stride");
  b = kv;
  b.record_stride = pc_.record_bytes + 1;  // must be even
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "record_stride");
  b = kv;
  b.records = nullptr;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "records");
  b = kv;
  b.k_pages = nullptr;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "pages");
  b = kv;
  b.v_pages = nullptr;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "pages");
  b = kv;
  b.block_table = nullptr;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "block_table");
  b = kv;
  b.seq_lens = nullptr;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "seq_lens");
  b = kv;
  b.record_tiles = nullptr;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "record_tiles");
  b = kv;
  b.num_pages = -1;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "negative");
  b = kv;
  b.max_blocks_per_seq = -3;
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "negative");
}

TEST_F(PagedErrors, AttentionRejectsOutOfRangeTables) {
  kvarn_paged_kv_t kv = View();
  const int mb = pc_.max_blocks;
  // A page id beyond the page pool (sequence 1, tile 1 is a tail page).
  for (int32_t bad : {pc_.num_pages, -1, 1 << 30}) {
    std::vector<int32_t> table = pc_.block_table;
    table[mb + 1] = bad;
    kvarn_paged_kv_t b = kv;
    b.block_table = table.data();
    ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "page pool");
  }
  // A record block id beyond the record pool (sequence 0, tile 1 is a record tile).
  for (int32_t bad : {pc_.num_blocks, -2}) {
    std::vector<int32_t> table = pc_.block_table;
    table[1] = bad;
    kvarn_paged_kv_t b = kv;
    b.block_table = table.data();
    ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "record pool");
  }
  // The same table with a smaller pool count.
  kvarn_paged_kv_t b = kv;
  b.num_record_blocks = pc_.Block(0, 1);
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "record pool");
  // seq_len beyond max_blocks_per_seq.
  std::vector<int32_t> lens = pc_.seq_lens;
  lens[1] = mb * 64 + 1;
  b = kv;
  b.seq_lens = lens.data();
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "max_blocks_per_seq");
  b = kv;
  b.max_blocks_per_seq = 2;  // sequence 0 needs 3 tiles
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "max_blocks_per_seq");
  // Negative seq_len and record tiles beyond the complete tiles.
  lens = pc_.seq_lens;
  lens[0] = -5;
  b = kv;
  b.seq_lens = lens.data();
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "negative");
  std::vector<int32_t> rt = pc_.record_tiles;
  rt[1] = 1;  // 70 tokens: one complete tile, and it is the sink
  b = kv;
  b.record_tiles = rt.data();
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "record_tiles");
  rt = pc_.record_tiles;
  rt[0] = -1;
  b = kv;
  b.record_tiles = rt.data();
  ExpectAttentionFails(&b, &params_, KVARN_ERR_INVALID_ARGUMENT, "negative");
}

TEST_F(PagedErrors, AttentionRejectsMoreQueriesThanCachedTokens) {
  kvarn_paged_kv_t kv = View();
  const int32_t indptr[] = {0, 1, 72};  // 71 queries for sequence 1 of 70 tokens
  kvarn_attention_params_t p = params_;
  p.q_indptr = indptr;
  q_.assign(72 * 8 * 64, 0.25f);
  out_.assign(72 * 8 * 64, 9.f);
  lse_.assign(72 * 8, 9.f);
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "query tokens");
  // A decode slot with no cached tokens is padding (kvarn.h): zero output rows, lse -inf, and
  // the other sequence is attended as usual.
  std::vector<int32_t> lens = {150, 0};
  std::vector<int32_t> rt = {1, 0};
  kvarn_paged_kv_t b = kv;
  b.seq_lens = lens.data();
  b.record_tiles = rt.data();
  {
    std::vector<uint8_t> workspace(1 << 20);
    std::fill(out_.begin(), out_.end(), 9.f);
    std::fill(lse_.begin(), lse_.end(), 9.f);
    ASSERT_EQ(kvarn_paged_attention(ctx_.get(), &cfg_, &b, &params_, q_.data(), out_.data(),
                                    lse_.data(), workspace.data(), workspace.size()),
              KVARN_OK)
        << kvarn_last_error();
    const int hq = params_.num_q_heads, d = cfg_.head_dim;
    for (int r = hq; r < 2 * hq; ++r) {
      EXPECT_TRUE(std::isinf(lse_[r]) && lse_[r] < 0) << "row " << r;
      for (int e = 0; e < d; ++e) ASSERT_EQ(out_[static_cast<size_t>(r) * d + e], 0.f);
    }
    for (int r = 0; r < hq; ++r) EXPECT_TRUE(std::isfinite(lse_[r])) << "row " << r;
  }
  // q_indptr must start at 0 and not decrease.
  const int32_t bad_start[] = {1, 2, 3};
  p.q_indptr = bad_start;
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "q_indptr");
  const int32_t decreasing[] = {0, 3, 2};
  p.q_indptr = decreasing;
  ExpectAttentionFails(&kv, &p, KVARN_ERR_INVALID_ARGUMENT, "q_indptr");
}

TEST_F(PagedErrors, WorkspaceSizeRejectsBadArguments) {
  kvarn_paged_kv_t kv = View();
  size_t ws = 4242;
  EXPECT_TRUE(IsError(kvarn_paged_attention_workspace_size(nullptr, &cfg_, &kv, &params_, 2, &ws),
                      KVARN_ERR_INVALID_ARGUMENT, "context"));
  EXPECT_TRUE(
      IsError(kvarn_paged_attention_workspace_size(ctx_.get(), nullptr, &kv, &params_, 2, &ws),
              KVARN_ERR_INVALID_ARGUMENT, "config"));
  EXPECT_TRUE(
      IsError(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, nullptr, &params_, 2, &ws),
              KVARN_ERR_INVALID_ARGUMENT, "kv"));
  EXPECT_TRUE(IsError(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, nullptr, 2, &ws),
                      KVARN_ERR_INVALID_ARGUMENT, "params"));
  EXPECT_TRUE(
      IsError(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, &params_, 2, nullptr),
              KVARN_ERR_INVALID_ARGUMENT, "out_bytes"));
  kvarn_attention_params_t p = params_;
  p.num_q_heads = 3;
  EXPECT_TRUE(IsError(kvarn_paged_attention_workspace_size(ctx_.get(), &cfg_, &kv, &p, 2, &ws),
                      KVARN_ERR_INVALID_ARGUMENT, "num_q_heads"));
  kvarn_config_t c = MakeConfig(64, 64, 4, 2, 40);
  EXPECT_TRUE(IsError(kvarn_paged_attention_workspace_size(ctx_.get(), &c, &kv, &params_, 2, &ws),
                      KVARN_ERR_INVALID_ARGUMENT, "iterations"));
  EXPECT_EQ(ws, 4242u);
}

TEST_F(PagedErrors, AppendRejectsBadArguments) {
  kvarn_paged_kv_t kv = View();
  const int32_t indptr[] = {0, 0, 3};  // 3 tokens for sequence 1 (positions 70..72)
  const float* k = tok_k_.data();
  const float* v = tok_v_.data();
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "context",
                    false);
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "config", true,
                    nullptr, true);
  ExpectAppendFails(nullptr, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "kv");
  ExpectAppendFails(&kv, nullptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT,
                    "token_indptr");
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, nullptr, v, KVARN_ERR_INVALID_ARGUMENT, "null");
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, k, nullptr, KVARN_ERR_INVALID_ARGUMENT, "null");
  ExpectAppendFails(&kv, indptr, Bad<kvarn_dtype_t>(5), k, v, KVARN_ERR_INVALID_ARGUMENT, "dtype");
  kvarn_config_t c = MakeConfig(64, 64, 4, 2);
  c.size = 1;
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "size", true,
                    &c);
  c = MakeConfig(64, 64, 4, 2, 8, 1, 8, 0);
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "flags", true,
                    &c);
  c = MakeConfig(256 + 64, 64, 4, 2);
  ExpectAppendFails(&kv, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_UNSUPPORTED, "head_dim", true,
                    &c);
  kvarn_paged_kv_t b = kv;
  b.size = 3;
  ExpectAppendFails(&b, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "size");
  b = kv;
  b.num_kv_heads = -2;
  ExpectAppendFails(&b, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "num_kv_heads");
  b = kv;
  b.k_pages = nullptr;
  ExpectAppendFails(&b, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "pages");
  // indptr must start at 0 and not decrease.
  const int32_t bad_start[] = {1, 1, 4};
  ExpectAppendFails(&kv, bad_start, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT,
                    "token_indptr");
  const int32_t decreasing[] = {0, 3, 1};
  ExpectAppendFails(&kv, decreasing, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT,
                    "token_indptr");
}

TEST_F(PagedErrors, AppendRejectsOutOfRangeTargets) {
  kvarn_paged_kv_t kv = View();
  const float* k = tok_k_.data();
  const float* v = tok_v_.data();
  const int mb = pc_.max_blocks;
  // The page of the new positions is outside the page pool.
  {
    std::vector<int32_t> table = pc_.block_table;
    table[mb + 1] = pc_.num_pages;  // sequence 1, tile 1 (positions 64..127)
    kvarn_paged_kv_t b = kv;
    b.block_table = table.data();
    const int32_t indptr[] = {0, 0, 3};
    ExpectAppendFails(&b, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "page");
  }
  // Positions beyond max_blocks_per_seq: sequence 1 at the end of its table.
  {
    std::vector<int32_t> lens = pc_.seq_lens;
    lens[1] = mb * 64 - 1;  // the next 3 tokens cross the end of the table
    std::vector<int32_t> table = pc_.block_table;
    for (int i = 0; i < mb; ++i) table[mb + i] = i % pc_.num_pages;
    kvarn_paged_kv_t b = kv;
    b.seq_lens = lens.data();
    b.block_table = table.data();
    const int32_t indptr[] = {0, 0, 3};
    ExpectAppendFails(&b, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT,
                      "max_blocks_per_seq");
  }
  // Appending into a record tile: new positions start at seq_len, and record tiles must be
  // complete tiles below it, so the only way to aim an append at a record tile is to claim more
  // record tiles than complete tiles. Sequence 0 with 100 tokens (one complete tile) and two
  // record tiles (sink 0): position 100 would land in record tile 1.
  {
    const kvarn_config_t c = MakeConfig(64, 64, 4, 2, 8, 0);
    std::vector<int32_t> lens = pc_.seq_lens, rt = pc_.record_tiles;
    lens[0] = 100;
    rt[0] = 2;
    std::vector<int32_t> table = pc_.block_table;
    table[0] = 0;
    table[1] = 1;
    kvarn_paged_kv_t b = kv;
    b.seq_lens = lens.data();
    b.record_tiles = rt.data();
    b.block_table = table.data();
    const int32_t indptr[] = {0, 3, 3};
    ExpectAppendFails(&b, indptr, KVARN_DTYPE_F32, k, v, KVARN_ERR_INVALID_ARGUMENT, "record_tiles",
                      true, &c);
  }
}

TEST_F(PagedErrors, FlushRejectsBadArguments) {
  kvarn_paged_kv_t kv = View();
  // A complete page to flush: sequence 1's sink page (tile 0, 64 tokens).
  const int32_t src[] = {pc_.Block(1, 0)};
  const int32_t dst[] = {0};
  ExpectFlushFails(&kv, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "context", false);
  ExpectFlushFails(&kv, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "config", true, nullptr, true);
  ExpectFlushFails(nullptr, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "kv");
  ExpectFlushFails(&kv, 1, nullptr, dst, KVARN_ERR_INVALID_ARGUMENT, "src_pages");
  ExpectFlushFails(&kv, 1, src, nullptr, KVARN_ERR_INVALID_ARGUMENT, "dst_blocks");
  for (int32_t bad : {-1, pc_.num_pages, 1 << 30}) {
    const int32_t s[] = {src[0], bad};
    const int32_t d[] = {0, 1};
    ExpectFlushFails(&kv, 2, s, d, KVARN_ERR_INVALID_ARGUMENT, "page pool");
  }
  for (int32_t bad : {-1, pc_.num_blocks}) {
    const int32_t s[] = {src[0], src[0]};
    const int32_t d[] = {0, bad};
    ExpectFlushFails(&kv, 2, s, d, KVARN_ERR_INVALID_ARGUMENT, "record pool");
  }
  kvarn_paged_kv_t b = kv;
  b.num_record_blocks = 0;
  b.records = nullptr;
  ExpectFlushFails(&b, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "pool");
  b = kv;
  b.num_pages = 0;
  ExpectFlushFails(&b, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "pool");
  b = kv;
  b.record_stride = 7;
  ExpectFlushFails(&b, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "record_stride");
  kvarn_config_t c = MakeConfig(64, 128, 4, 2);  // G 128 records would not fit this stride
  ExpectFlushFails(&kv, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "record_stride", true, &c);
  c = MakeConfig(64, 64, 4, 2, 8, 99);
  ExpectFlushFails(&kv, 1, src, dst, KVARN_ERR_INVALID_ARGUMENT, "sink", true, &c);
  // The valid flush succeeds.
  KVT_EXPECT_OK(kvarn_paged_flush(ctx_.get(), &cfg_, &kv, 1, src, dst));
}

}  // namespace
