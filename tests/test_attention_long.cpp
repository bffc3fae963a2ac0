// A 128k-token context (docs/FORMAT.md section 10: contexts up to 128k), decode and extend, against
// float64 attention over the same dequantized cache. Labelled `slow`: not in the default run
// (ctest -LE slow); run it with ctest -L slow.
#include <gtest/gtest.h>

#include <vector>

#include "kvarn/kvarn.h"
#include "support/attention_check.h"
#include "support/kvarn_test.h"

namespace {

TEST(AttentionLong, Context128kMatchesFloat64Reference) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(128, 128, 4, 2);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.lens = {131072, 131072 - 77, 1000};
  spec.max_chunk = 16384;
  kvt::PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  EXPECT_EQ(pc.record_tiles[0], 1023);
  const int Hq = 8;
  for (const std::vector<int>& q_lens : {std::vector<int>{}, std::vector<int>{16, 3, 5}}) {
    SCOPED_TRACE(q_lens.empty() ? "decode" : "extend");
    const kvt::Queries q = kvt::MakeQueries(rng, q_lens, pc.batch, Hq, pc.D, KVARN_DTYPE_F32);
    kvt::AttnOutput automatic, one;
    ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 0, 0.f, &automatic));
    const kvt::AttnErrors e = kvt::CompareWithReference(ctx.get(), pc, q, Hq, 0.f, automatic);
    EXPECT_LE(e.worst_row, 1e-3);
    EXPECT_LE(e.total, 1e-3);
    EXPECT_LE(e.worst_lse, 1e-4);
    RecordProperty(q_lens.empty() ? "decode_worst_row" : "extend_worst_row",
                   std::to_string(e.worst_row));
    // A single split over 1024 tiles agrees with the automatic split-K.
    ASSERT_TRUE(kvt::RunAttention(ctx.get(), pc, q, Hq, KVARN_DTYPE_F32, 1, 0.f, &one));
    EXPECT_LE(kvt::OutputDistance(one, automatic, q.total * Hq * pc.D), 1e-5);
  }
}

}  // namespace
