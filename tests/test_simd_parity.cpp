// CPU SIMD levels against the scalar reference (docs/FORMAT.md section 10: identical record bytes
// at every ISA level the host has; attention within the CPU tolerance). Each test runs one SIMD
// level through the public ISA cap (kvarn_set_max_cpu_isa + a new context) and skips levels this
// host or build lacks. Inputs are fresh seeded random tensors with the structure of real caches
// (never zeros).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/attention_check.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace {

using kvt::ContextPtr;

const kvarn_cpu_isa_t kSimdIsas[] = {KVARN_CPU_ISA_AVX2, KVARN_CPU_ISA_AVX512, KVARN_CPU_ISA_NEON};
const char* const kPresets[] = {"k4v2_g128", "k4v2_g64",  "k4v4_g128",
                                "k4v4_g64",  "k2v2_g128", "k8v8_g128"};

// A context running `isa`, or NULL when this host or build cannot run it. The cap is global
// (new contexts read it), so it is restored to "everything" before returning.
ContextPtr IsaContext(kvarn_cpu_isa_t isa, int threads = 0) {
  EXPECT_EQ(kvarn_set_max_cpu_isa(isa), KVARN_OK);
  ContextPtr ctx = kvt::MakeCpuContext(threads);
  EXPECT_EQ(kvarn_set_max_cpu_isa(kvarn_cpu_isa_best()), KVARN_OK);
  kvarn_cpu_isa_t got = KVARN_CPU_ISA_NONE;
  EXPECT_EQ(kvarn_context_get_cpu_isa(ctx.get(), &got), KVARN_OK);
  if (got != isa) return nullptr;
  return ctx;
}

#define KVT_ISA_CONTEXT(var, isa, threads)                                           \
  ContextPtr var = IsaContext(isa, threads);                                         \
  if (!var) {                                                                        \
    GTEST_SKIP() << "this host or build cannot run ISA " << kvarn_cpu_isa_name(isa); \
  }                                                                                  \
  SCOPED_TRACE(::testing::Message() << "ISA " << kvarn_cpu_isa_name(isa))

// Names the record field of the first differing byte.
::testing::AssertionResult SameRecords(const kvarn_config_t& cfg, const std::vector<uint8_t>& want,
                                       const std::vector<uint8_t>& got, size_t stride) {
  if (want.size() != got.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == got[i]) continue;
    const size_t off = i % stride;
    std::string field = "padding";
    for (int f = KVARN_FIELD_K_CODES; f <= KVARN_FIELD_V_ZERO; ++f) {
      size_t o = 0, n = 0;
      kvarn_record_field(&cfg, static_cast<kvarn_record_field_t>(f), &o, &n);
      if (off >= o && off < o + n)
        field = "field " + std::to_string(f) + " byte " + std::to_string(off - o);
    }
    size_t diffs = 0;
    for (size_t j = i; j < want.size(); ++j) diffs += want[j] != got[j];
    return ::testing::AssertionFailure()
           << diffs << " bytes differ; first: record " << i / stride << ", " << field << ": "
           << int(want[i]) << " (scalar) vs " << int(got[i]);
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> StructuredTiles(kvt::Rng& rng, size_t n_tiles, int G, int D, bool keys) {
  kvt::KVShape s;
  if (!keys) s.offset = 0.2;
  std::vector<float> x;
  for (size_t i = 0; i < n_tiles; ++i) {
    const auto t = kvt::MakeTokens(rng, G, D, s);
    x.insert(x.end(), t.begin(), t.end());
  }
  return x;
}

struct QuantizeOut {
  kvarn_status_t status;
  std::vector<uint8_t> records;
};

QuantizeOut Quantize(kvarn_context_t* ctx, const kvarn_config_t& cfg, size_t n_tiles,
                     kvarn_dtype_t dtype, const std::vector<uint8_t>& k,
                     const std::vector<uint8_t>& v, uint32_t flags, size_t stride) {
  QuantizeOut r;
  r.records.assign(n_tiles * stride, 0xA5);  // padding must stay 0xA5
  r.status = kvarn_quantize(ctx, &cfg, n_tiles, dtype, k.data(), v.data(), flags, r.records.data(),
                            stride);
  return r;
}

// ---- quantize: every preset x head dim x SIMD level ---------------------------------------

class QuantizeParity
    : public ::testing::TestWithParam<std::tuple<kvarn_cpu_isa_t, const char*, int>> {};

TEST_P(QuantizeParity, RecordsAreByteIdenticalToTheScalarReference) {
  const auto [isa, preset, D] = GetParam();
  KVT_ISA_CONTEXT(simd, isa, 2);
  ContextPtr scalar = IsaContext(KVARN_CPU_ISA_SCALAR, 2);
  ASSERT_TRUE(scalar);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = kvt::PresetConfig(preset, D);
  const size_t rb = kvt::RecordBytes(cfg), stride = rb + 10;
  const size_t n_tiles = 3;
  const int G = cfg.tile_tokens;
  // fp32 input (rotation inside), fp16 and bf16 input, and cache-frame fp16 input.
  const kvarn_dtype_t dtypes[] = {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16,
                                  KVARN_DTYPE_F16};
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE("variant " + std::to_string(variant));
    const kvarn_dtype_t dt = dtypes[variant];
    const uint32_t flags = variant == 3 ? KVARN_CODEC_CACHE_FRAME : 0;
    const auto kf = kvt::RoundTo(StructuredTiles(rng, n_tiles, G, D, true), dt);
    const auto vf = kvt::RoundTo(StructuredTiles(rng, n_tiles, G, D, false), dt);
    const auto kb = kvt::Encode(kf, dt), vb = kvt::Encode(vf, dt);
    const QuantizeOut want = Quantize(scalar.get(), cfg, n_tiles, dt, kb, vb, flags, stride);
    const QuantizeOut got = Quantize(simd.get(), cfg, n_tiles, dt, kb, vb, flags, stride);
    ASSERT_EQ(want.status, KVARN_OK) << kvarn_last_error();
    ASSERT_EQ(got.status, KVARN_OK) << kvarn_last_error();
    EXPECT_TRUE(SameRecords(cfg, want.records, got.records, stride));
  }
}

std::string QuantizeName(
    const ::testing::TestParamInfo<std::tuple<kvarn_cpu_isa_t, const char*, int>>& info) {
  return std::string(kvarn_cpu_isa_name(std::get<0>(info.param))) + "_" + std::get<1>(info.param) +
         "_D" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(AllPresets, QuantizeParity,
                         ::testing::Combine(::testing::ValuesIn(kSimdIsas),
                                            ::testing::ValuesIn(kPresets),
                                            ::testing::Values(64, 80, 96, 128, 256, 512)),
                         QuantizeName);

// ---- quantize: configurations and tiles that exercise the edges ---------------------------

class SimdLevel : public ::testing::TestWithParam<kvarn_cpu_isa_t> {};

std::string IsaName(const ::testing::TestParamInfo<kvarn_cpu_isa_t>& info) {
  return kvarn_cpu_isa_name(info.param);
}

TEST_P(SimdLevel, QuantizeMatchesScalarForIterationCountsBitWidthsAndAblations) {
  KVT_ISA_CONTEXT(simd, GetParam(), 1);
  ContextPtr scalar = IsaContext(KVARN_CPU_ISA_SCALAR, 1);
  KVT_SEEDED_RNG(rng, 0);
  struct Cfg {
    int D, G, kb, vb, it;
    uint32_t kflags, vflags;
  };
  const Cfg cfgs[] = {
      {128, 128, 4, 2, 0, 0, 0},
      {128, 128, 4, 2, 1, 0, 0},
      {128, 64, 2, 8, 3, 0, 0},
      {64, 128, 8, 4, 16, 0, 0},
      {256, 64, 2, 4, 32, 0, 0},
      {128, 128, 4, 2, 8, KVARN_ABLATE_NO_ROTATION, 0},
      {128, 128, 4, 2, 8, 0, KVARN_ABLATE_NO_NORMALIZATION},
      // D = 80, 96: V rows of 20 / 24 bytes at 2 bits, a 16-column remainder of column blocks
      {80, 128, 2, 4, 3, 0, 0},
      {80, 64, 8, 2, 32, 0, 0},
      {96, 64, 4, 8, 1, 0, 0},
      {96, 128, 2, 2, 16, KVARN_ABLATE_NO_ROTATION, KVARN_ABLATE_NO_NORMALIZATION},
  };
  for (const Cfg& c : cfgs) {
    SCOPED_TRACE(::testing::Message() << "D" << c.D << " G" << c.G << " k" << c.kb << "v" << c.vb
                                      << " T" << c.it << " flags " << c.kflags << "/" << c.vflags);
    const kvarn_config_t cfg = kvt::MakeConfig(c.D, c.G, c.kb, c.vb, c.it, 1, c.kflags, c.vflags);
    const size_t rb = kvt::RecordBytes(cfg);
    const auto kf = StructuredTiles(rng, 2, c.G, c.D, true);
    const auto vf = StructuredTiles(rng, 2, c.G, c.D, false);
    const auto kb = kvt::Encode(kf, KVARN_DTYPE_F32), vb = kvt::Encode(vf, KVARN_DTYPE_F32);
    const QuantizeOut want = Quantize(scalar.get(), cfg, 2, KVARN_DTYPE_F32, kb, vb, 0, rb);
    const QuantizeOut got = Quantize(simd.get(), cfg, 2, KVARN_DTYPE_F32, kb, vb, 0, rb);
    ASSERT_EQ(want.status, KVARN_OK);
    ASSERT_EQ(got.status, KVARN_OK);
    EXPECT_TRUE(SameRecords(cfg, want.records, got.records, rb));
  }
}

// Cache-frame fp16 tiles built bit by bit: signed zeros (the sign of a zero minimum reaches the
// stored zero z), constant rows and columns (the 1e-10 step floor), subnormal halves, rows with
// ties at the RTN half-way points, and values at the top of the fp16 range.
TEST_P(SimdLevel, QuantizeMatchesScalarOnSignedZerosConstantRowsAndExtremeHalves) {
  KVT_ISA_CONTEXT(simd, GetParam(), 1);
  ContextPtr scalar = IsaContext(KVARN_CPU_ISA_SCALAR, 1);
  KVT_SEEDED_RNG(rng, 0);
  for (const char* preset : {"k4v2_g128", "k2v2_g128", "k8v8_g128"}) {
    const kvarn_config_t cfg = kvt::PresetConfig(preset, 128);
    const int D = 128, G = 128;
    const size_t rb = kvt::RecordBytes(cfg);
    for (int kind = 0; kind < 6; ++kind) {
      SCOPED_TRACE(::testing::Message() << preset << " kind " << kind);
      std::vector<uint16_t> k(static_cast<size_t>(G) * D), v(k.size());
      for (size_t e = 0; e < k.size(); ++e) {
        k[e] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
        v[e] = kvt::FloatToHalf(static_cast<float>(rng.Normal()));
      }
      for (int t = 0; t < G; ++t) {
        for (int d = 0; d < D; ++d) {
          uint16_t& kk = k[static_cast<size_t>(t) * D + d];
          uint16_t& vv = v[static_cast<size_t>(t) * D + d];
          switch (kind) {
            case 0:  // non-negative channels and tokens with +0 / -0 minima
              if (d % 3 == 0)
                kk = rng.Bernoulli(0.3) ? (rng.Bernoulli(0.5) ? 0x8000 : 0) : kk & 0x7fff;
              if (t % 5 == 0)
                vv = rng.Bernoulli(0.3) ? (rng.Bernoulli(0.5) ? 0x8000 : 0) : vv & 0x7fff;
              break;
            case 1:  // constant channels / tokens, and a constant zero channel
              if (d % 4 == 1) kk = 0x3c00;
              if (d == 7) kk = 0x8000;
              if (t % 4 == 2) vv = 0xb800;
              break;
            case 2:  // subnormal halves
              if ((t + d) % 2) kk = static_cast<uint16_t>(rng.Int(1, 0x3ff) | (d % 2 ? 0x8000 : 0));
              if ((t * d) % 3 == 0) vv = static_cast<uint16_t>(rng.Int(1, 0x3ff));
              break;
            case 3:  // small integers: many exact RTN half-way points
              kk = kvt::FloatToHalf(static_cast<float>(rng.Int(-8, 8)));
              vv = kvt::FloatToHalf(static_cast<float>(rng.Int(0, 6)) * 0.5f);
              break;
            case 4:  // large values near the top of fp16
              kk = kvt::FloatToHalf(static_cast<float>(rng.Normal() * 9000.0));
              vv = kvt::FloatToHalf(static_cast<float>(rng.Normal() * 9000.0));
              break;
            default:  // one rare huge token and channel
              if (t == 17) kk = kvt::FloatToHalf(static_cast<float>(rng.Normal() * 3000.0));
              if (d == 5) vv = kvt::FloatToHalf(static_cast<float>(rng.Normal() * 3000.0));
              break;
          }
        }
      }
      std::vector<uint8_t> kb(k.size() * 2), vb(v.size() * 2);
      std::memcpy(kb.data(), k.data(), kb.size());
      std::memcpy(vb.data(), v.data(), vb.size());
      const QuantizeOut want =
          Quantize(scalar.get(), cfg, 1, KVARN_DTYPE_F16, kb, vb, KVARN_CODEC_CACHE_FRAME, rb);
      const QuantizeOut got =
          Quantize(simd.get(), cfg, 1, KVARN_DTYPE_F16, kb, vb, KVARN_CODEC_CACHE_FRAME, rb);
      ASSERT_EQ(got.status, want.status) << kvarn_last_error();
      if (want.status == KVARN_OK) EXPECT_TRUE(SameRecords(cfg, want.records, got.records, rb));
    }
  }
}

TEST_P(SimdLevel, QuantizeFailsLikeScalarOnNonFiniteAndOverflowingInput) {
  KVT_ISA_CONTEXT(simd, GetParam(), 2);
  ContextPtr scalar = IsaContext(KVARN_CPU_ISA_SCALAR, 2);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_config_t cfg = kvt::PresetConfig("k4v2_g128", 128);
  const size_t rb = kvt::RecordBytes(cfg);
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    auto kf = StructuredTiles(rng, 3, 128, 128, true);
    auto vf = StructuredTiles(rng, 3, 128, 128, false);
    const size_t at = 128 * 128 + static_cast<size_t>(rng.Int(0, 128 * 128 - 1));
    if (kind == 0) kf[at] = NAN;
    if (kind == 1) vf[at] = INFINITY;
    if (kind == 2) kf[at] = 1e6f;  // exceeds fp16 after rotation
    const auto kb = kvt::Encode(kf, KVARN_DTYPE_F32), vb = kvt::Encode(vf, KVARN_DTYPE_F32);
    const QuantizeOut want = Quantize(scalar.get(), cfg, 3, KVARN_DTYPE_F32, kb, vb, 0, rb);
    const QuantizeOut got = Quantize(simd.get(), cfg, 3, KVARN_DTYPE_F32, kb, vb, 0, rb);
    EXPECT_NE(want.status, KVARN_OK);
    EXPECT_EQ(got.status, want.status);
    EXPECT_EQ(got.records, want.records);  // nothing written
  }
}

TEST_P(SimdLevel, RotateAndDequantizeAreBitIdenticalToScalar) {
  KVT_ISA_CONTEXT(simd, GetParam(), 2);
  ContextPtr scalar = IsaContext(KVARN_CPU_ISA_SCALAR, 2);
  KVT_SEEDED_RNG(rng, 0);
  const kvarn_dtype_t dts[] = {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16};
  for (int D : {64, 80, 96, 128, 256, 512}) {
    const size_t rows = 37;
    const auto x = StructuredTiles(rng, 1, static_cast<int>(rows), D, true);
    for (kvarn_dtype_t in : dts) {
      for (kvarn_dtype_t out : dts) {
        const auto xb = kvt::Encode(kvt::RoundTo(x, in), in);
        std::vector<uint8_t> a(rows * D * 4, 0), b(a.size(), 0);
        KVT_ASSERT_OK(kvarn_rotate(scalar.get(), D, rows, in, xb.data(), out, a.data()));
        KVT_ASSERT_OK(kvarn_rotate(simd.get(), D, rows, in, xb.data(), out, b.data()));
        EXPECT_EQ(a, b) << "D" << D << " in " << in << " out " << out;
      }
    }
  }
  for (int D : {128, 80, 96}) {
    for (const char* preset : kPresets) {
      const kvarn_config_t cfg = kvt::PresetConfig(preset, D);
      const size_t rb = kvt::RecordBytes(cfg);
      const int G = cfg.tile_tokens;
      const auto kb = kvt::Encode(StructuredTiles(rng, 2, G, D, true), KVARN_DTYPE_F32);
      const auto vb = kvt::Encode(StructuredTiles(rng, 2, G, D, false), KVARN_DTYPE_F32);
      const QuantizeOut rec = Quantize(scalar.get(), cfg, 2, KVARN_DTYPE_F32, kb, vb, 0, rb);
      ASSERT_EQ(rec.status, KVARN_OK);
      for (uint32_t flags : {0u, static_cast<uint32_t>(KVARN_CODEC_CACHE_FRAME)}) {
        for (kvarn_dtype_t out : dts) {
          const size_t n = 2 * static_cast<size_t>(G) * D * 4;
          std::vector<uint8_t> ka(n), va(n), kb2(n), vb2(n);
          KVT_ASSERT_OK(kvarn_dequantize(scalar.get(), &cfg, 2, rec.records.data(), rb, flags, out,
                                         ka.data(), va.data()));
          KVT_ASSERT_OK(kvarn_dequantize(simd.get(), &cfg, 2, rec.records.data(), rb, flags, out,
                                         kb2.data(), vb2.data()));
          EXPECT_EQ(ka, kb2) << preset << " D" << D << " flags " << flags << " out " << out;
          EXPECT_EQ(va, vb2) << preset << " D" << D << " flags " << flags << " out " << out;
        }
      }
    }
  }
}

// ---- the paged cache: append + flush bytes, attention values --------------------------------

struct PagedRun {
  kvt::PagedCache pc;
  kvt::Queries q;
  int Hq = 0;
};

::testing::AssertionResult BuildPaged(kvarn_context_t* ctx, const std::string& preset, int D,
                                      int Hk, int gqa, const std::vector<int>& lens,
                                      const std::vector<int>& q_lens, uint64_t seed,
                                      PagedRun* out) {
  kvt::Rng rng(seed);
  const kvarn_config_t cfg = kvt::PresetConfig(preset, D);
  kvt::PagedCacheSpec spec;
  spec.num_kv_heads = Hk;
  spec.lens = lens;
  auto st = kvt::BuildPagedCache(ctx, cfg, spec, rng, &out->pc);
  if (!st) return st;
  out->Hq = Hk * gqa;
  out->q =
      kvt::MakeQueries(rng, q_lens, static_cast<int>(lens.size()), out->Hq, D, KVARN_DTYPE_F32);
  return ::testing::AssertionSuccess();
}

struct AttnParityCase {
  std::string name;
  kvarn_cpu_isa_t isa;
  std::string preset;
  int D, Hk, gqa;
  std::vector<int> lens, q_lens;
};

std::ostream& operator<<(std::ostream& os, const AttnParityCase& c) { return os << c.name; }

class PagedParity : public ::testing::TestWithParam<AttnParityCase> {};

TEST_P(PagedParity, SameCacheBytesAndAttentionWithinToleranceForAnyThreadCount) {
  const AttnParityCase& c = GetParam();
  KVT_ISA_CONTEXT(simd, c.isa, 2);
  ContextPtr scalar = IsaContext(KVARN_CPU_ISA_SCALAR, 2);
  const uint64_t seed = kvt::TestSeed(0);
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  PagedRun want, got;
  ASSERT_TRUE(BuildPaged(scalar.get(), c.preset, c.D, c.Hk, c.gqa, c.lens, c.q_lens, seed, &want));
  ASSERT_TRUE(BuildPaged(simd.get(), c.preset, c.D, c.Hk, c.gqa, c.lens, c.q_lens, seed, &got));
  // Append (rotation to fp16) and flush (quantize) wrote the same bytes.
  EXPECT_EQ(want.pc.k_pages, got.pc.k_pages);
  EXPECT_EQ(want.pc.v_pages, got.pc.v_pages);
  EXPECT_TRUE(SameRecords(want.pc.cfg, want.pc.records, got.pc.records, want.pc.stride));
  int records = 0;
  for (int r : got.pc.record_tiles) records += r;
  EXPECT_GT(records, 0) << "the case must read records";

  kvt::AttnOutput ref, out1, out2, out3;
  ASSERT_TRUE(
      kvt::RunAttention(scalar.get(), want.pc, want.q, want.Hq, KVARN_DTYPE_F32, 0, 0.f, &ref));
  ASSERT_TRUE(kvt::RunAttention(simd.get(), got.pc, got.q, got.Hq, KVARN_DTYPE_F32, 0, 0.f, &out2));
  const size_t n = got.q.total * got.Hq * c.D;
  EXPECT_LE(kvt::OutputDistance(ref, out2, n), 1e-4) << "SIMD vs scalar reference";
  const kvt::AttnErrors e = kvt::CompareWithReference(simd.get(), got.pc, got.q, got.Hq, 0.f, out2);
  EXPECT_LE(e.worst_row, 1e-3);  // docs/FORMAT.md section 10, CPU
  EXPECT_LE(e.worst_lse, 1e-4);
  // Thread counts 1 and 3 give the same bits as 2.
  ContextPtr one = IsaContext(c.isa, 1), three = IsaContext(c.isa, 3);
  ASSERT_TRUE(one && three);
  ASSERT_TRUE(kvt::RunAttention(one.get(), got.pc, got.q, got.Hq, KVARN_DTYPE_F32, 0, 0.f, &out1));
  ASSERT_TRUE(
      kvt::RunAttention(three.get(), got.pc, got.q, got.Hq, KVARN_DTYPE_F32, 0, 0.f, &out3));
  EXPECT_EQ(out1.out, out2.out);
  EXPECT_EQ(out3.out, out2.out);
  EXPECT_EQ(out1.lse, out2.lse);
}

std::vector<AttnParityCase> PagedCases() {
  std::vector<AttnParityCase> v;
  for (kvarn_cpu_isa_t isa : kSimdIsas) {
    const std::string in = kvarn_cpu_isa_name(isa);
    for (const char* preset : kPresets) {
      for (int D : {64, 80, 96, 128, 256, 512}) {
        const std::string base = in + "_" + preset + "_D" + std::to_string(D);
        v.push_back({base + "_decode", isa, preset, D, 2, 4, {129, 300, 1, 517}, {}});
        v.push_back({base + "_extend", isa, preset, D, 2, 4, {129, 300, 1, 517}, {1, 33, 1, 130}});
      }
    }
    for (int gqa : {1, 4, 7, 8}) {
      const std::string base = in + "_gqa" + std::to_string(gqa);
      v.push_back({base + "_decode", isa, "k4v2_g128", 128, 3, gqa, {1, 127, 640, 1001}, {}});
      v.push_back(
          {base + "_extend", isa, "k4v2_g64", 128, 3, gqa, {1, 127, 640, 1001}, {1, 5, 64, 77}});
    }
    // Phi-3-mini's attention: D 96, 32 KV heads, MHA (GQA 1).
    v.push_back({in + "_phi3_D96_mha32_decode", isa, "k4v2_g128", 96, 32, 1, {300, 1, 517}, {}});
    v.push_back(
        {in + "_phi3_D96_mha32_extend", isa, "k4v2_g64", 96, 32, 1, {300, 1, 517}, {7, 1, 130}});
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, PagedParity, ::testing::ValuesIn(PagedCases()),
                         [](const ::testing::TestParamInfo<AttnParityCase>& info) {
                           return info.param.name;
                         });

INSTANTIATE_TEST_SUITE_P(Isa, SimdLevel, ::testing::ValuesIn(kSimdIsas), IsaName);

}  // namespace
