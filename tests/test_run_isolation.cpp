// Issue 28: per-sequence isolation of the capturable layer 2 (kvarn.h "plan / run") on every
// backend here (the GPU instances skip without a device).
//   - Regression tests: overlapping token_indptr / q_indptr ranges fault every sequence with a bad
//     boundary and leave the others equal to a clean run (defect 2); q_indptr[0] != 0 is the same
//     data error with and without a status array (defect 4); the BUFFER_TOO_SMALL message of a
//     NULL workspace (defect 5); size-0 launches read nothing and succeed (defect 6, kvarn.h).
//   - The fault-isolation suite: random malformed steps (append -> flush -> attention) checked
//     against the oracles of support/run_isolation.h, the fuzzer's (tests/fuzz/fuzz_paged_run).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/run_isolation.h"

namespace {

using kvt::DeviceBuffer;
using kvt::IsError;

constexpr int kD = 64, kHk = 1, kHq = 2;

struct PlanDeleter {
  void operator()(kvarn_attention_plan_t* p) const { kvarn_attention_plan_destroy(p); }
};
using PlanPtr = std::unique_ptr<kvarn_attention_plan_t, PlanDeleter>;

class RunIsolation : public ::testing::TestWithParam<kvarn_backend_t> {
 protected:
  void SetUp() override {
    ctx_ = GetParam() == KVARN_BACKEND_CPU ? kvt::MakeCpuContext(2) : kvt::MakeCudaContext();
    if (!ctx_) GTEST_SKIP() << "no GPU backend/device here: " << kvarn_last_error();
    cfg_ = kvt::PresetConfig("k4v2_g64", kD);
  }

  // Appends token t of a 5-row batch to slot t of page 0 (G = 64) under `indptr`; returns the
  // call's status (after a synchronize) and leaves the pages and statuses in *k_pages, *status.
  kvarn_status_t AppendFive(const std::vector<int32_t>& indptr, bool with_status,
                            std::vector<uint16_t>* k_pages, std::vector<int32_t>* status,
                            float row1 = 0.5f) {
    const int B = static_cast<int>(indptr.size()) - 1, T = 5;
    DeviceBuffer kp(ctx_.get(), std::vector<uint16_t>(64 * kHk * kD, kvt::kPoisonHalf));
    DeviceBuffer vp(ctx_.get(), std::vector<uint16_t>(64 * kHk * kD, kvt::kPoisonHalf));
    std::vector<float> k(T * kHk * kD);
    for (size_t i = 0; i < k.size(); ++i) k[i] = 0.01f * static_cast<float>(i % 97);
    for (int d = 0; d < kD; ++d) k[1 * kD + d] = row1;  // token 1, shared when ranges overlap
    DeviceBuffer dk(ctx_.get(), k), dip(ctx_.get(), indptr),
        dsl(ctx_.get(), std::vector<int32_t>{0, 1, 2, 3, 4}),
        dst(ctx_.get(), std::vector<int32_t>(B, 0));
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = kHk;
    kv.batch = B;
    kv.k_pages = kp.get();
    kv.v_pages = vp.get();
    kv.num_pages = 1;
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.seq_status = with_status ? static_cast<int32_t*>(dst.get()) : nullptr;
    kvarn_status_t st = kvarn_paged_append_run(
        ctx_.get(), &cfg_, &kv, &launch, static_cast<const int32_t*>(dip.get()),
        static_cast<const int32_t*>(dsl.get()), T, KVARN_DTYPE_F32, dk.get(), dk.get());
    if (st == KVARN_OK) st = kvarn_context_synchronize(ctx_.get());  // GPU data errors
    message_ = st == KVARN_OK ? "" : kvarn_last_error();  // before the downloads reset it
    *k_pages = kp.Download<uint16_t>();
    *status = dst.Download<int32_t>();
    return st;
  }

  // Extend attention (num_splits 1) of a 5-sequence cache under q_indptr; rows of out.
  kvarn_status_t AttendFive(const std::vector<int32_t>& q_indptr, bool with_status,
                            std::vector<float>* out, std::vector<int32_t>* status) {
    KVT_SEEDED_RNG(rng, 0);
    kvt::PagedCacheSpec spec;
    spec.stride_padding = 16;  // aligned: a GPU plan takes a tensor-core kernel
    spec.num_kv_heads = kHk;
    spec.lens = {70, 5, 130, 9, 200};
    kvt::PagedCache pc;
    auto cpu = kvt::MakeCpuContext();
    EXPECT_TRUE(kvt::BuildPagedCache(cpu.get(), cfg_, spec, rng, &pc));
    const int B = static_cast<int>(q_indptr.size()) - 1;
    pc.seq_lens.resize(B, 0);
    pc.record_tiles.resize(B, 0);
    pc.block_table.resize(static_cast<size_t>(B) * pc.max_blocks, 0);
    DeviceBuffer records(ctx_.get(), pc.records), k_pages(ctx_.get(), pc.k_pages),
        v_pages(ctx_.get(), pc.v_pages), table(ctx_.get(), pc.block_table),
        lens(ctx_.get(), pc.seq_lens), rtiles(ctx_.get(), pc.record_tiles),
        dip(ctx_.get(), q_indptr), dst(ctx_.get(), std::vector<int32_t>(B, 0));
    kvarn_paged_kv_t kv = pc.View();
    kv.batch = B;
    kv.records = records.get();
    kv.k_pages = k_pages.get();
    kv.v_pages = v_pages.get();
    kv.block_table = static_cast<const int32_t*>(table.get());
    kv.seq_lens = static_cast<const int32_t*>(lens.get());
    kv.record_tiles = static_cast<const int32_t*>(rtiles.get());
    const int64_t rows = 8;
    std::vector<float> q(rows * kHq * kD);
    for (size_t i = 0; i < q.size(); ++i) q[i] = 0.05f * static_cast<float>(i % 31) - 0.7f;
    DeviceBuffer dq(ctx_.get(), q), dout(ctx_.get(), std::vector<float>(q.size(), 7.f));
    kvarn_attention_params_t ap;
    kvarn_attention_params_defaults(&ap);
    ap.num_q_heads = kHq;
    ap.num_splits = 1;
    kvarn_attention_shape_t shape;
    kvarn_attention_shape_defaults(&shape);
    shape.batch = B;
    shape.num_kv_heads = kHk;
    shape.max_blocks_per_seq = pc.max_blocks;
    shape.max_q_per_seq = 4;
    shape.max_total_q = rows;
    kvarn_attention_plan_t* raw = nullptr;
    EXPECT_EQ(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw), KVARN_OK)
        << kvarn_last_error();
    PlanPtr plan(raw);
    size_t ws_bytes = 0;
    kvarn_attention_plan_workspace_size(plan.get(), &ws_bytes);
    DeviceBuffer ws(ctx_.get(), ws_bytes + 1);
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.seq_status = with_status ? static_cast<int32_t*>(dst.get()) : nullptr;
    launch.workspace = ws.get();
    launch.workspace_bytes = ws.bytes();
    kvarn_status_t st = kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, &launch,
                                                  static_cast<const int32_t*>(dip.get()), dq.get(),
                                                  dout.get(), nullptr);
    if (st == KVARN_OK) st = kvarn_context_synchronize(ctx_.get());  // GPU data errors
    message_ = st == KVARN_OK ? "" : kvarn_last_error();  // before the downloads reset it
    *out = dout.Download<float>();
    *status = dst.Download<int32_t>();
    return st;
  }

  // The status of the last AppendFive / AttendFive is `code` and its message names `needle`.
  ::testing::AssertionResult Failed(kvarn_status_t st, kvarn_status_t code, const char* needle) {
    if (st == code && message_.find(needle) != std::string::npos) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "status " << st << " (" << message_ << "), expected " << code << " naming " << needle;
  }

  static bool SameRow(const std::vector<float>& a, const std::vector<float>& b, int row) {
    const size_t n = static_cast<size_t>(kHq) * kD;
    return std::memcmp(a.data() + row * n, b.data() + row * n, n * sizeof(float)) == 0;
  }

  kvt::ContextPtr ctx_;
  kvarn_config_t cfg_{};
  std::string message_;
};

// A K row of token t in page 0 (G = 64, one head).
std::vector<uint16_t> TokenRow(const std::vector<uint16_t>& pages, int t) {
  return std::vector<uint16_t>(pages.begin() + t * kD, pages.begin() + (t + 1) * kD);
}

TEST_P(RunIsolation, AppendOverlappingRangesFaultEverySequenceOfTheBadBoundary) {
  // token_indptr {0, 3, 1, 2}: sequences 0 and 2 both claim token 1 (a NaN row: two pool workers
  // used to stage it and race on its status). All three sequences touch a bad boundary.
  std::vector<uint16_t> pages;
  std::vector<int32_t> status;
  KVT_EXPECT_OK(AppendFive({0, 3, 1, 2}, true, &pages, &status, NAN));
  EXPECT_EQ(status, std::vector<int32_t>(3, KVARN_ERR_INVALID_ARGUMENT));
  EXPECT_EQ(pages, std::vector<uint16_t>(pages.size(), kvt::kPoisonHalf)) << "a page changed";
  EXPECT_TRUE(Failed(AppendFive({0, 3, 1, 2}, false, &pages, &status, NAN),
                     KVARN_ERR_INVALID_ARGUMENT, "token_indptr"));
  EXPECT_EQ(pages, std::vector<uint16_t>(pages.size(), kvt::kPoisonHalf)) << "a page changed";
}

TEST_P(RunIsolation, AppendSequencesAwayFromTheBadBoundaryEqualACleanRun) {
  // {0, 1, 3, 2, 4, 5}: boundaries 2 and 3 are out of order, so sequences 1, 2 and 3 fault;
  // sequences 0 and 4 write exactly what the clean batch {0, 1, 2, 3, 4, 5} writes for them.
  std::vector<uint16_t> clean, pages;
  std::vector<int32_t> status;
  KVT_ASSERT_OK(AppendFive({0, 1, 2, 3, 4, 5}, true, &clean, &status));
  KVT_EXPECT_OK(AppendFive({0, 1, 3, 2, 4, 5}, true, &pages, &status));
  const int32_t bad = KVARN_ERR_INVALID_ARGUMENT;
  EXPECT_EQ(status, (std::vector<int32_t>{0, bad, bad, bad, 0}));
  for (int t : {0, 4}) EXPECT_EQ(TokenRow(pages, t), TokenRow(clean, t)) << "token " << t;
  for (int t : {1, 2, 3}) {
    EXPECT_EQ(TokenRow(pages, t), std::vector<uint16_t>(kD, kvt::kPoisonHalf)) << "token " << t;
  }
}

TEST_P(RunIsolation, AttentionOverlappingRangesFaultEverySequenceOfTheBadBoundary) {
  // q_indptr {0, 3, 1, 2}: sequence 0 was reported clean while its row 1 held sequence 2's
  // result. Now all three fault; without a status array the call fails.
  std::vector<float> out;
  std::vector<int32_t> status;
  KVT_EXPECT_OK(AttendFive({0, 3, 1, 2}, true, &out, &status));
  EXPECT_EQ(status, std::vector<int32_t>(3, KVARN_ERR_INVALID_ARGUMENT));
  EXPECT_TRUE(Failed(AttendFive({0, 3, 1, 2}, false, &out, &status), KVARN_ERR_INVALID_ARGUMENT,
                     "q_indptr"));
}

TEST_P(RunIsolation, AttentionSequencesAwayFromTheBadBoundaryEqualACleanRun) {
  std::vector<float> clean, out;
  std::vector<int32_t> status;
  KVT_ASSERT_OK(AttendFive({0, 1, 2, 3, 4, 5}, true, &clean, &status));
  KVT_EXPECT_OK(AttendFive({0, 1, 3, 2, 4, 5}, true, &out, &status));
  const int32_t bad = KVARN_ERR_INVALID_ARGUMENT;
  EXPECT_EQ(status, (std::vector<int32_t>{0, bad, bad, bad, 0}));
  EXPECT_TRUE(SameRow(out, clean, 0));
  EXPECT_TRUE(SameRow(out, clean, 4));
}

TEST_P(RunIsolation, QIndptrNotStartingAtZeroIsTheSameErrorInEveryMode) {
  // {2, 3, 4}: sequence 0's first boundary is bad (rows 0-1 would belong to nobody); sequence 1
  // (row 3) equals its row of the clean {0, 3, 4}. With a status array only sequence 0 faults;
  // without one the call fails, on every backend (the GPU accepted it, the CPU only without).
  std::vector<float> clean, out;
  std::vector<int32_t> status;
  KVT_ASSERT_OK(AttendFive({0, 3, 4}, true, &clean, &status));
  KVT_EXPECT_OK(AttendFive({2, 3, 4}, true, &out, &status));
  EXPECT_EQ(status, (std::vector<int32_t>{KVARN_ERR_INVALID_ARGUMENT, 0}));
  EXPECT_TRUE(SameRow(out, clean, 3));
  EXPECT_TRUE(
      Failed(AttendFive({2, 3, 4}, false, &out, &status), KVARN_ERR_INVALID_ARGUMENT, "q_indptr"));
  // The same rule for token_indptr.
  std::vector<uint16_t> pages;
  KVT_EXPECT_OK(AppendFive({1, 3, 5}, true, &pages, &status));
  EXPECT_EQ(status, (std::vector<int32_t>{KVARN_ERR_INVALID_ARGUMENT, 0}));
  EXPECT_TRUE(Failed(AppendFive({1, 3, 5}, false, &pages, &status), KVARN_ERR_INVALID_ARGUMENT,
                     "token_indptr"));
}

TEST_P(RunIsolation, NullWorkspaceIsNamedInTheMessage) {
  size_t need = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_workspace_size(&cfg_, kHk, 4, &need));
  DeviceBuffer pages(ctx_.get(), 64 * kHk * kD * 2), rec(ctx_.get(), 4 * kvt::RecordBytes(cfg_)),
      list(ctx_.get(), std::vector<int32_t>{0, 0, 0, 0});
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = kHk;
  kv.batch = 1;
  kv.k_pages = kv.v_pages = pages.get();
  kv.num_pages = 1;
  kv.records = rec.get();
  kv.record_stride = kvt::RecordBytes(cfg_);
  kv.num_record_blocks = 4;
  kvarn_launch_t launch;
  kvarn_launch_defaults(&launch);
  launch.workspace_bytes = need;  // bytes claimed, no pointer
  const auto* l = static_cast<const int32_t*>(list.get());
  EXPECT_TRUE(IsError(kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, &launch, 4, l, l, l, nullptr),
                      KVARN_ERR_BUFFER_TOO_SMALL, "launch->workspace is NULL"));
}

TEST_P(RunIsolation, SizeZeroLaunchesReadNothingAndSucceed) {
  // kvarn.h: max_tokens 0, max_tiles 0 and an extend plan's max_total_q 0 enqueue nothing and
  // read none of the lists, so they may all be NULL.
  kvarn_paged_kv_t kv;
  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = kHk;
  kv.batch = 3;
  DeviceBuffer pages(ctx_.get(), 64 * kHk * kD * 2);
  kv.k_pages = kv.v_pages = pages.get();
  kv.num_pages = 1;
  KVT_EXPECT_OK(kvarn_paged_append_run(ctx_.get(), &cfg_, &kv, nullptr, nullptr, nullptr, 0,
                                       KVARN_DTYPE_F32, nullptr, nullptr));
  KVT_EXPECT_OK(kvarn_paged_flush_run(ctx_.get(), &cfg_, &kv, nullptr, 0, nullptr, nullptr, nullptr,
                                      nullptr));
  kvarn_attention_shape_t shape;
  kvarn_attention_shape_defaults(&shape);
  shape.batch = 3;
  shape.num_kv_heads = kHk;
  shape.max_blocks_per_seq = 1;
  shape.max_q_per_seq = 4;
  shape.max_total_q = 0;
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = kHq;
  kvarn_attention_plan_t* raw = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_create(ctx_.get(), &cfg_, &shape, &ap, &raw));
  PlanPtr plan(raw);
  size_t ws = 1;
  KVT_ASSERT_OK(kvarn_attention_plan_workspace_size(plan.get(), &ws));
  EXPECT_EQ(ws, 0u);
  DeviceBuffer table(ctx_.get(), std::vector<int32_t>{0, 0, 0});
  kv.block_table = kv.seq_lens = kv.record_tiles = static_cast<const int32_t*>(table.get());
  kv.max_blocks_per_seq = 1;
  const auto* ip = static_cast<const int32_t*>(table.get());
  KVT_EXPECT_OK(kvarn_paged_attention_run(ctx_.get(), plan.get(), &kv, nullptr, ip, nullptr,
                                          nullptr, nullptr));
  KVT_EXPECT_OK(kvarn_context_synchronize(ctx_.get()));
}

// The fault-isolation suite: `kSteps` random malformed steps, each checked against every oracle
// of support/run_isolation.h with and without a status array. KVARN_ISOLATION_STEPS overrides
// the count (the device run uses more).
TEST_P(RunIsolation, RandomMalformedStepsKeepEverySequenceIsolated) {
  int steps = GetParam() == KVARN_BACKEND_CPU ? 60 : 300;
  if (const char* e = std::getenv("KVARN_ISOLATION_STEPS")) steps = std::atoi(e);
  KVT_SEEDED_RNG(rng, 0);
  for (int i = 0; i < steps; ++i) {
    const uint64_t seed = rng.Next();
    kvt::iso::Prng ch(seed);
    kvt::iso::Scenario sc;
    std::string err = kvt::iso::MakeScenario(ctx_.get(), &ch, &sc);
    if (err.empty()) err = kvt::iso::Check(ctx_.get(), &ch, sc);
    ASSERT_EQ(err, "") << "step " << i << ", scenario seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, RunIsolation,
                         ::testing::Values(KVARN_BACKEND_CPU, kvt::kGpuBackend),
                         [](const ::testing::TestParamInfo<kvarn_backend_t>& i) {
                           return std::string(kvarn_backend_name(i.param));
                         });

}  // namespace
