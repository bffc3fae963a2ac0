// CPU ISA reporting and the ISA cap.
#include <gtest/gtest.h>
#include <kvarn/kvarn.h>

#include <cstdlib>
#include <string>

namespace {

kvarn_cpu_isa_t ContextIsa() {
  kvarn_context_options_t o;
  kvarn_context_options_defaults(&o);
  o.backend = KVARN_BACKEND_CPU;
  kvarn_context_t* ctx = nullptr;
  EXPECT_EQ(kvarn_context_create(&o, &ctx), KVARN_OK);
  kvarn_cpu_isa_t isa = KVARN_CPU_ISA_NONE;
  EXPECT_EQ(kvarn_context_get_cpu_isa(ctx, &isa), KVARN_OK);
  kvarn_context_destroy(ctx);
  return isa;
}

TEST(CpuIsa, BestIsaIsSupportedByTheFeatureList) {
  const kvarn_cpu_isa_t best = kvarn_cpu_isa_best();
  char features[512];
  ASSERT_EQ(kvarn_cpu_features(features, sizeof features), KVARN_OK);
  const std::string f = features;
  switch (best) {
    case KVARN_CPU_ISA_SCALAR:
      break;
    case KVARN_CPU_ISA_AVX2:
      EXPECT_NE(f.find("avx2"), std::string::npos);
      break;
    case KVARN_CPU_ISA_AVX512:
      EXPECT_NE(f.find("avx512f"), std::string::npos);
      break;
    case KVARN_CPU_ISA_NEON:
      EXPECT_NE(f.find("neon"), std::string::npos);
      break;
    default:
      FAIL() << "best ISA " << best << " is not a CPU ISA";
  }
  // Without a cap a new CPU context runs the best ISA.
  if (std::getenv("KVARN_CPU_ISA") == nullptr) EXPECT_EQ(ContextIsa(), best);
}

TEST(CpuIsa, CapToScalarIsReportedByNewContexts) {
  ASSERT_EQ(kvarn_set_max_cpu_isa(KVARN_CPU_ISA_SCALAR), KVARN_OK);
  EXPECT_EQ(ContextIsa(), KVARN_CPU_ISA_SCALAR);
  // Raising the cap never selects more than the machine and the build have.
  ASSERT_EQ(kvarn_set_max_cpu_isa(KVARN_CPU_ISA_AVX512), KVARN_OK);
  EXPECT_EQ(ContextIsa(), kvarn_cpu_isa_best());
}

TEST(CpuIsa, FeatureBufferTooSmallIsReportedAndTerminated) {
  char tiny[4] = {'x', 'x', 'x', 'x'};
  char features[512];
  ASSERT_EQ(kvarn_cpu_features(features, sizeof features), KVARN_OK);
  if (std::string(features).size() >= sizeof tiny) {
    EXPECT_EQ(kvarn_cpu_features(tiny, sizeof tiny), KVARN_ERR_BUFFER_TOO_SMALL);
    EXPECT_EQ(tiny[3], '\0');
    EXPECT_NE(std::string(kvarn_last_error()).find("bytes"), std::string::npos);
  }
}

}  // namespace
