// Layer 2 writes: kvarn_paged_append puts rotated fp16 tokens into pages, kvarn_paged_flush turns
// complete pages into records identical to kvarn_quantize of the same tile; failures leave pages
// and records exactly as they were (docs/FORMAT.md sections 3, 6 and 8; kvarn.h layer 2).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace {

using kvt::IsError;
using kvt::PagedCache;
using kvt::PagedCacheSpec;

class PagedAppend : public ::testing::TestWithParam<std::tuple<uint32_t, kvarn_dtype_t>> {};

TEST_P(PagedAppend, PagesHoldRotatedFp16Tokens) {
  // Every appended token sits in its page at [head][position % G] as kvarn_rotate would write it
  // (fp32 product, fp16 nearest even), or as plain fp16 when rotation is ablated; page slots past
  // the sequence end are not written.
  const uint32_t flags = std::get<0>(GetParam());
  const kvarn_dtype_t dt = std::get<1>(GetParam());
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  kvarn_config_t cfg =
      kvt::MakeConfig(128, 64, 4, 2, 8, 1, flags, flags ^ KVARN_ABLATE_NO_ROTATION);
  PagedCacheSpec spec;
  spec.num_kv_heads = 3;
  spec.lens = {1, 63, 64, 65, 200};
  spec.flush = false;
  spec.max_chunk = 70;
  spec.dtype = dt;
  PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  const int D = pc.D, G = pc.G, Hk = pc.Hk;
  for (int b = 0; b < pc.batch; ++b) {
    const int N = pc.seq_lens[b];
    ASSERT_EQ(N, spec.lens[b]);
    for (int which = 0; which < 2; ++which) {
      const std::vector<float>& in = which ? pc.v_in[b] : pc.k_in[b];
      const uint32_t f = which ? cfg.value_flags : cfg.key_flags;
      std::vector<uint16_t> want(in.size());
      if (f & KVARN_ABLATE_NO_ROTATION) {
        for (size_t i = 0; i < in.size(); ++i) want[i] = kvt::FloatToHalf(in[i]);
      } else {
        KVT_ASSERT_OK(kvarn_rotate(ctx.get(), D, in.size() / D, KVARN_DTYPE_F32, in.data(),
                                   KVARN_DTYPE_F16, want.data()));
      }
      const std::vector<uint16_t>& pages = which ? pc.v_pages : pc.k_pages;
      for (int pos = 0; pos < N; ++pos) {
        const int page = pc.Block(b, pos / G);
        for (int h = 0; h < Hk; ++h) {
          const uint16_t* slot = pages.data() + static_cast<size_t>(page) * pc.PageElems() +
                                 (static_cast<size_t>(h) * G + pos % G) * D;
          ASSERT_EQ(std::memcmp(slot, want.data() + (static_cast<size_t>(pos) * Hk + h) * D, 2 * D),
                    0)
              << (which ? "V" : "K") << " sequence " << b << " position " << pos << " head " << h;
        }
      }
      // The rest of the last page is untouched.
      if (N % G != 0) {
        const int page = pc.Block(b, N / G);
        for (int h = 0; h < Hk; ++h) {
          for (int pos = N % G; pos < G; ++pos) {
            const uint16_t* slot = pages.data() + static_cast<size_t>(page) * pc.PageElems() +
                                   (static_cast<size_t>(h) * G + pos) * D;
            for (int d = 0; d < D; ++d) ASSERT_EQ(slot[d], kvt::kPoisonHalf);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FlagsAndDtypes, PagedAppend,
                         ::testing::Combine(::testing::Values(0u, KVARN_ABLATE_NO_ROTATION),
                                            ::testing::Values(KVARN_DTYPE_F32, KVARN_DTYPE_F16,
                                                              KVARN_DTYPE_BF16)),
                         [](const auto& p) {
                           const kvarn_dtype_t t = std::get<1>(p.param);
                           return std::string(std::get<0>(p.param) ? "k_unrotated_v_rotated"
                                                                   : "k_rotated_v_unrotated") +
                                  "_" +
                                  (t == KVARN_DTYPE_F32   ? "f32"
                                   : t == KVARN_DTYPE_F16 ? "f16"
                                                          : "bf16");
                         });

TEST(PagedAppendChunks, TokenByTokenEqualsOneCall) {
  // Appending 150 tokens of two sequences in one call, or one token per call, gives the same
  // pages.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(64, 64, 4, 2);
  const int Hk = 2, D = 64, n = 150;
  std::vector<float> k[2], v[2];
  for (int b = 0; b < 2; ++b) {
    k[b] = kvt::MakeTokens(rng, n * Hk, D, kvt::KVShape{});
    v[b] = kvt::MakeTokens(rng, n * Hk, D, kvt::KVShape{});
  }
  auto setup = [&](PagedCache& c) {
    // Sequence 0 on pages 4, 1, 6; sequence 1 on pages 0, 5, 2.
    const int32_t table[] = {4, 1, 6, 0, 5, 2};
    std::copy(table, table + 6, c.block_table.begin());
  };
  PagedCache once = kvt::SmallPagedCache(cfg, Hk, 2, 3, 7, 1);
  PagedCache step = kvt::SmallPagedCache(cfg, Hk, 2, 3, 7, 1);
  setup(once);
  setup(step);
  {
    std::vector<float> kk(k[0]), vv(v[0]);
    kk.insert(kk.end(), k[1].begin(), k[1].end());
    vv.insert(vv.end(), v[1].begin(), v[1].end());
    const int32_t indptr[] = {0, n, 2 * n};
    kvarn_paged_kv_t kv = once.View();
    KVT_ASSERT_OK(
        kvarn_paged_append(ctx.get(), &cfg, &kv, indptr, KVARN_DTYPE_F32, kk.data(), vv.data()));
  }
  for (int i = 0; i < n; ++i) {
    for (int b = 0; b < 2; ++b) {
      // Only sequence b appends in this call; the other appends nothing.
      const int32_t indptr[] = {0, b == 0 ? 1 : 0, 1};
      kvarn_paged_kv_t kv = step.View();
      const size_t off = static_cast<size_t>(i) * Hk * D;
      KVT_ASSERT_OK(kvarn_paged_append(ctx.get(), &cfg, &kv, indptr, KVARN_DTYPE_F32,
                                       k[b].data() + off, v[b].data() + off));
      ++step.seq_lens[b];
    }
  }
  EXPECT_EQ(step.k_pages, once.k_pages);
  EXPECT_EQ(step.v_pages, once.v_pages);
  // seq_lens is the engine's: the library does not change it.
  EXPECT_EQ(once.seq_lens[0], 0);
}

class PagedFlush : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(PagedFlush, RecordsEqualQuantizeOfTheSameTile) {
  // Each flushed record equals kvarn_quantize of its tile's appended (unrotated) tokens; only the
  // named record blocks are written, and the stride padding is left alone.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  kvarn_config_t cfg = kvt::PresetConfig(std::get<0>(GetParam()), std::get<1>(GetParam()));
  PagedCacheSpec spec;
  spec.num_kv_heads = 2;
  spec.lens = {3 * cfg.tile_tokens + 5, 2 * cfg.tile_tokens, cfg.tile_tokens - 1};
  spec.max_chunk = cfg.tile_tokens + 7;
  PagedCache pc;
  ASSERT_TRUE(kvt::BuildPagedCache(ctx.get(), cfg, spec, rng, &pc));
  const int D = pc.D, G = pc.G, Hk = pc.Hk;
  const size_t rb = pc.record_bytes;
  std::vector<bool> used(pc.num_blocks, false);
  for (int b = 0; b < pc.batch; ++b) {
    for (int r = 0; r < pc.record_tiles[b]; ++r) {
      const int tile = cfg.sink_tiles + r;
      const int block = pc.Block(b, tile);
      used[block] = true;
      for (int h = 0; h < Hk; ++h) {
        std::vector<float> k(static_cast<size_t>(G) * D), v(k.size());
        for (int t = 0; t < G; ++t) {
          const size_t src = (static_cast<size_t>(tile * G + t) * Hk + h) * D;
          std::copy(pc.k_in[b].begin() + src, pc.k_in[b].begin() + src + D, k.begin() + t * D);
          std::copy(pc.v_in[b].begin() + src, pc.v_in[b].begin() + src + D, v.begin() + t * D);
        }
        std::vector<uint8_t> want(rb);
        KVT_ASSERT_OK(kvarn_quantize(ctx.get(), &cfg, 1, KVARN_DTYPE_F32, k.data(), v.data(), 0,
                                     want.data(), rb));
        const uint8_t* got = pc.records.data() + (static_cast<size_t>(block) * Hk + h) * pc.stride;
        EXPECT_EQ(std::memcmp(got, want.data(), rb), 0)
            << "sequence " << b << " tile " << tile << " head " << h;
        for (size_t p = rb; p < pc.stride; ++p) ASSERT_EQ(got[p], kvt::kPoisonByte) << "padding";
      }
    }
  }
  for (int block = 0; block < pc.num_blocks; ++block) {
    if (used[block]) continue;
    for (size_t i = 0; i < Hk * pc.stride; ++i) {
      ASSERT_EQ(pc.records[block * Hk * pc.stride + i], kvt::kPoisonByte)
          << "unused block " << block;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, PagedFlush,
                         ::testing::Combine(::testing::Values("k4v2_g128", "k4v2_g64", "k2v2_g128",
                                                              "k8v8_g128"),
                                            ::testing::Values(64, 256)),
                         [](const auto& p) {
                           return std::get<0>(p.param) + "_D" +
                                  std::to_string(std::get<1>(p.param));
                         });

// ---- failures change nothing ------------------------------------------------------------------

TEST(PagedAppendFailure, NonFiniteOrOverflowingTokensWriteNothing) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(128, 64, 4, 2);
  const int Hk = 2, D = 128;
  PagedCache c = kvt::SmallPagedCache(cfg, Hk, 2, 4, 8, 2);
  const int32_t table[] = {3, 1, 0, 0, 2, 7, 0, 0};
  std::copy(table, table + 8, c.block_table.begin());
  c.seq_lens = {10, 60};
  const int32_t indptr[] = {0, 30, 50};  // sequence 1 crosses into its second page
  const auto base_k = kvt::MakeTokens(rng, 50 * Hk, D, kvt::KVShape{});
  const auto base_v = kvt::MakeTokens(rng, 50 * Hk, D, kvt::KVShape{});
  const struct {
    int which;
    float value;
    bool whole_row;
    kvarn_status_t status;
  } bad[] = {{0, NAN, false, KVARN_ERR_NON_FINITE},
             {1, INFINITY, false, KVARN_ERR_NON_FINITE},
             {0, -INFINITY, false, KVARN_ERR_NON_FINITE},
             {1, 60000.f, true, KVARN_ERR_OVERFLOW},
             {0, 1e6f, false, KVARN_ERR_OVERFLOW}};
  for (const auto& x : bad) {
    for (kvarn_dtype_t dt : {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
      if (x.value == 1e6f && dt == KVARN_DTYPE_F16) continue;  // not representable as f16 input
      std::vector<float> k = base_k, v = base_v;
      std::vector<float>& t = x.which ? v : k;
      const size_t row = (49 * Hk + 1) * D;  // the last token of the batch, head 1
      if (x.whole_row) {
        std::fill(t.begin() + row, t.begin() + row + D, x.value);
      } else {
        t[row + 17] = x.value;
      }
      const auto kb = kvt::Encode(kvt::RoundTo(k, dt), dt),
                 vb = kvt::Encode(kvt::RoundTo(v, dt), dt);
      const auto kp = c.k_pages, vp = c.v_pages;
      kvarn_paged_kv_t kv = c.View();
      EXPECT_TRUE(IsError(
          kvarn_paged_append(ctx.get(), &cfg, &kv, indptr, dt, kb.data(), vb.data()), x.status))
          << x.value << " in " << (x.which ? "v" : "k");
      EXPECT_EQ(c.k_pages, kp) << "pages changed by a failing append";
      EXPECT_EQ(c.v_pages, vp) << "pages changed by a failing append";
    }
  }
  // The same batch without the bad value succeeds.
  kvarn_paged_kv_t kv = c.View();
  KVT_EXPECT_OK(kvarn_paged_append(ctx.get(), &cfg, &kv, indptr, KVARN_DTYPE_F32, base_k.data(),
                                   base_v.data()));
}

TEST(PagedFlushFailure, NonFinitePageWritesNoRecord) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(64, 64, 4, 2);
  const int Hk = 2, D = 64, G = 64;
  PagedCache c = kvt::SmallPagedCache(cfg, Hk, 1, 4, 4, 3);
  for (int p = 0; p < 4; ++p) {
    for (int h = 0; h < Hk; ++h) {
      const auto k = kvt::MakeTokens(rng, G, D, kvt::KVShape{});
      const auto v = kvt::MakeTokens(rng, G, D, kvt::KVShape{});
      for (size_t e = 0; e < k.size(); ++e) {
        c.KPage(p, h)[e] = kvt::FloatToHalf(k[e]);
        c.VPage(p, h)[e] = kvt::FloatToHalf(v[e]);
      }
    }
  }
  c.VPage(3, 1)[G * D - 1] = 0x7c00;  // +inf in the last element of page 3, head 1
  c.KPage(2, 0)[5] = 0xfe00;          // NaN in page 2, head 0
  const auto before = c.records;
  const int32_t src_ok[] = {0, 1}, dst[] = {2, 0};
  for (int bad : {2, 3}) {
    const int32_t src[] = {src_ok[0], bad};
    kvarn_paged_kv_t kv = c.View();
    EXPECT_TRUE(
        IsError(kvarn_paged_flush(ctx.get(), &cfg, &kv, 2, src, dst), KVARN_ERR_NON_FINITE, "nan"))
        << "page " << bad;
    EXPECT_EQ(c.records, before) << "records written by a failing flush";
  }
  kvarn_paged_kv_t kv = c.View();
  KVT_EXPECT_OK(kvarn_paged_flush(ctx.get(), &cfg, &kv, 2, src_ok, dst));
  EXPECT_NE(c.records, before);
}

TEST(PagedFlushFailure, AbsorbedOverflowWritesNoRecord) {
  // The tile of test_codec_api's AbsorbedZeroBeyondFp16 (token 0 = -60000 in every channel)
  // written straight into a page: every value fits fp16, the absorbed zero does not.
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(128, 128, 4, 2);
  const int Hk = 1, D = 128, G = 128;
  PagedCache c = kvt::SmallPagedCache(cfg, Hk, 1, 2, 2, 2);
  for (int t = 0; t < G; ++t) {
    for (int d = 0; d < D; ++d) {
      c.KPage(1, 0)[t * D + d] =
          kvt::FloatToHalf(t == 0 ? -60000.f : static_cast<float>(5 * rng.Normal()));
      c.VPage(1, 0)[t * D + d] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
      c.KPage(0, 0)[t * D + d] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
      c.VPage(0, 0)[t * D + d] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
    }
  }
  const auto before = c.records;
  const int32_t src[] = {0, 1}, dst[] = {1, 0};
  kvarn_paged_kv_t kv = c.View();
  EXPECT_TRUE(
      IsError(kvarn_paged_flush(ctx.get(), &cfg, &kv, 2, src, dst), KVARN_ERR_OVERFLOW, "fp16"));
  EXPECT_EQ(c.records, before);
}

TEST(PagedFlushEdges, ZeroTilesIsANoOp) {
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(64, 64, 4, 2);
  PagedCache c = kvt::SmallPagedCache(cfg, 1, 1, 1, 1, 1);
  kvarn_paged_kv_t kv = c.View();
  KVT_EXPECT_OK(kvarn_paged_flush(ctx.get(), &cfg, &kv, 0, nullptr, nullptr));
}

TEST(PagedAppendEdges, NothingToAppendIsANoOp) {
  auto ctx = kvt::MakeCpuContext();
  const kvarn_config_t cfg = kvt::MakeConfig(64, 64, 4, 2);
  PagedCache c = kvt::SmallPagedCache(cfg, 1, 2, 1, 1, 1);
  const auto before = c.k_pages;
  const int32_t indptr[] = {0, 0, 0};
  kvarn_paged_kv_t kv = c.View();
  KVT_EXPECT_OK(
      kvarn_paged_append(ctx.get(), &cfg, &kv, indptr, KVARN_DTYPE_F32, nullptr, nullptr));
  EXPECT_EQ(c.k_pages, before);
}

}  // namespace
