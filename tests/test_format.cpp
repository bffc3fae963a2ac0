// Record sizes and field offsets, presets and configuration checks (docs/FORMAT.md sections 2 and
// 7), through the public API only.
#include <gtest/gtest.h>

#include <cstring>
#include <ostream>
#include <string>
#include <tuple>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/kvarn_test.h"

namespace {

using kvt::IsError;
using kvt::MakeConfig;

// ---- record layout -------------------------------------------------------------------------

struct LayoutParam {
  int D, G, kb, vb;
};

// Readable parameter values in test listings (CTest shows them beside each test).
void PrintTo(const LayoutParam& p, std::ostream* os) {
  *os << "D" << p.D << " G" << p.G << " k" << p.kb << "v" << p.vb;
}

std::string LayoutName(const ::testing::TestParamInfo<LayoutParam>& p) {
  return "D" + std::to_string(p.param.D) + "_G" + std::to_string(p.param.G) + "_k" +
         std::to_string(p.param.kb) + "v" + std::to_string(p.param.vb);
}

std::vector<LayoutParam> AllShapes() {
  std::vector<LayoutParam> v;
  for (int D : {64, 80, 96, 128, 256, 512}) {
    for (int G : {64, 128}) {
      for (int kb : {2, 4, 8}) {
        for (int vb : {2, 4, 8}) v.push_back({D, G, kb, vb});
      }
    }
  }
  return v;
}

class RecordLayout : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(RecordLayout, BytesMatchFormula) {
  const LayoutParam p = GetParam();
  const kvarn_config_t c = MakeConfig(p.D, p.G, p.kb, p.vb);
  size_t bytes = 0;
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &bytes));
  EXPECT_EQ(bytes, static_cast<size_t>(p.D) * p.G * (p.kb + p.vb) / 8 + 6 * p.D + 6 * p.G);
  EXPECT_EQ(bytes, kvt::SpecRecordBytes(p.D, p.G, p.kb, p.vb));
}

TEST_P(RecordLayout, FieldsAreContiguousInSpecOrder) {
  const LayoutParam p = GetParam();
  const kvarn_config_t c = MakeConfig(p.D, p.G, p.kb, p.vb);
  const size_t D = p.D, G = p.G;
  // docs/FORMAT.md section 7, in storage order.
  const size_t want_bytes[KVARN_FIELD_COUNT] = {D * G * p.kb / 8, 2 * D, 2 * D, 2 * G,
                                                G * D * p.vb / 8, 2 * D, 2 * G, 2 * G};
  size_t expect_off = 0;
  for (int f = 0; f < KVARN_FIELD_COUNT; ++f) {
    size_t off = 12345, len = 12345;
    KVT_ASSERT_OK(kvarn_record_field(&c, static_cast<kvarn_record_field_t>(f), &off, &len));
    EXPECT_EQ(off, expect_off) << "field " << f;
    EXPECT_EQ(len, want_bytes[f]) << "field " << f;
    expect_off += want_bytes[f];
  }
  size_t total = 0;
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &total));
  EXPECT_EQ(total, expect_off);
}

TEST_P(RecordLayout, IndependentOfNonLayoutFields) {
  // Iterations, sink tiles and ablation flags do not change the layout.
  const LayoutParam p = GetParam();
  const kvarn_config_t a = MakeConfig(p.D, p.G, p.kb, p.vb);
  const kvarn_config_t b = MakeConfig(p.D, p.G, p.kb, p.vb, 0, 3, KVARN_ABLATE_NO_ROTATION,
                                      KVARN_ABLATE_NO_ROTATION | KVARN_ABLATE_NO_NORMALIZATION);
  size_t x = 0, y = 1;
  KVT_ASSERT_OK(kvarn_record_bytes(&a, &x));
  KVT_ASSERT_OK(kvarn_record_bytes(&b, &y));
  EXPECT_EQ(x, y);
}

INSTANTIATE_TEST_SUITE_P(AllShapes, RecordLayout, ::testing::ValuesIn(AllShapes()), LayoutName);

TEST(RecordLayoutExamples, D128G128K4V2Is13824BytesWithSpecOffsets) {
  const kvarn_config_t c = MakeConfig(128, 128, 4, 2);
  size_t bytes = 0;
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &bytes));
  EXPECT_EQ(bytes, 13824u);
  const size_t want[KVARN_FIELD_COUNT] = {0, 8192, 8448, 8704, 8960, 13056, 13312, 13568};
  for (int f = 0; f < KVARN_FIELD_COUNT; ++f) {
    size_t off = 0, len = 0;
    KVT_ASSERT_OK(kvarn_record_field(&c, static_cast<kvarn_record_field_t>(f), &off, &len));
    EXPECT_EQ(off, want[f]) << "field " << f;
  }
  // 108 bytes per token per KV head.
  EXPECT_EQ(bytes / 128, 108u);
}

TEST(RecordLayoutExamples, WorkedExamplesOfTheSpec) {
  size_t n = 0;
  kvarn_config_t c = MakeConfig(128, 64, 4, 2);
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &n));
  EXPECT_EQ(n, 7296u);
  c = MakeConfig(128, 128, 4, 4);
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &n));
  EXPECT_EQ(n, 17920u);
  // The golden files' sizes (tests/data/golden/index.json).
  c = MakeConfig(128, 128, 2, 2);
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &n));
  EXPECT_EQ(n, 9728u);
  c = MakeConfig(128, 128, 8, 8);
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &n));
  EXPECT_EQ(n, 34304u);
  c = MakeConfig(512, 128, 4, 2);
  KVT_ASSERT_OK(kvarn_record_bytes(&c, &n));
  EXPECT_EQ(n, 52992u);
}

// ---- presets --------------------------------------------------------------------------------

TEST(Presets, NamedPresetsAreListed) {
  const char* want[] = {"k4v2_g128", "k4v2_g64", "k4v4_g128", "k4v4_g64", "k2v2_g128", "k8v8_g128"};
  ASSERT_EQ(kvarn_preset_count(), 6);
  for (int i = 0; i < 6; ++i) {
    ASSERT_NE(kvarn_preset_name(i), nullptr);
    EXPECT_STREQ(kvarn_preset_name(i), want[i]);
  }
  EXPECT_EQ(kvarn_preset_name(-1), nullptr);
  EXPECT_EQ(kvarn_preset_name(6), nullptr);
  EXPECT_EQ(kvarn_preset_name(1 << 30), nullptr);
}

TEST(Presets, EveryPresetParsesToItsBitsAndTile) {
  for (int i = 0; i < kvarn_preset_count(); ++i) {
    const std::string name = kvarn_preset_name(i);
    int kb = 0, vb = 0, g = 0;
    ASSERT_EQ(std::sscanf(name.c_str(), "k%dv%d_g%d", &kb, &vb, &g), 3);
    for (int D : {64, 80, 96, 128, 256, 512}) {
      kvarn_config_t c;
      std::memset(&c, 0x5a, sizeof c);
      KVT_ASSERT_OK(kvarn_config_from_preset(name.c_str(), D, &c));
      EXPECT_EQ(c.size, sizeof(kvarn_config_t));
      EXPECT_EQ(c.head_dim, D);
      EXPECT_EQ(c.tile_tokens, g) << name;
      EXPECT_EQ(c.key_bits, kb) << name;
      EXPECT_EQ(c.value_bits, vb) << name;
      EXPECT_EQ(c.iterations, 8);
      EXPECT_EQ(c.sink_tiles, 1);
      EXPECT_EQ(c.key_flags, 0u);
      EXPECT_EQ(c.value_flags, 0u);
      KVT_EXPECT_OK(kvarn_config_validate(&c));
    }
  }
}

TEST(Presets, AnyBitsAndTileCombinationParses) {
  for (int kb : {2, 4, 8}) {
    for (int vb : {2, 4, 8}) {
      for (int g : {64, 128}) {
        const std::string name =
            "k" + std::to_string(kb) + "v" + std::to_string(vb) + "_g" + std::to_string(g);
        kvarn_config_t c;
        KVT_ASSERT_OK(kvarn_config_from_preset(name.c_str(), 128, &c));
        EXPECT_EQ(c.key_bits, kb);
        EXPECT_EQ(c.value_bits, vb);
        EXPECT_EQ(c.tile_tokens, g);
      }
    }
  }
}

TEST(Presets, MalformedNamesAreRejected) {
  const char* bad[] = {
      "",           "k4v2",        "k4v2_g",     "k4v2_g128 ", " k4v2_g128",
      "K4V2_G128",  "k04v2_g128",  "k+4v2_g128", "k4v2_g0128", "k3v2_g128",
      "k4v3_g128",  "k4v2_g256",   "k4v2_g32",   "k4v2_g128x", "k4v2-g128",
      "k16v2_g128", "k4v2_g128\n", "kv_g",       "k-4v2_g128", "k4v2_g+128",
      "k4v2_g 128", "k4 v2_g128",  "k4v2__g128", "v2k4_g128",  "k4v2_g128k4v2_g128",
      "k0v2_g128",  "k4v2_g64.",   "k4v2_g12"};
  for (const char* name : bad) {
    kvarn_config_t c;
    std::memset(&c, 0x5a, sizeof c);
    kvarn_config_t before = c;
    EXPECT_TRUE(IsError(kvarn_config_from_preset(name, 128, &c), KVARN_ERR_NOT_FOUND, "preset"))
        << "'" << name << "'";
    EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0) << "config written for '" << name << "'";
  }
  // A very long name does not overflow anything.
  const std::string longname = "k4v2_g128" + std::string(4096, '8');
  kvarn_config_t c;
  EXPECT_TRUE(IsError(kvarn_config_from_preset(longname.c_str(), 128, &c), KVARN_ERR_NOT_FOUND));
}

TEST(Presets, UnsupportedHeadDimIsRejected) {
  for (int D : {0, -128, 32, 72, 100, 192, 1024, 4096}) {
    kvarn_config_t c;
    std::memset(&c, 0x5a, sizeof c);
    kvarn_config_t before = c;
    EXPECT_TRUE(
        IsError(kvarn_config_from_preset("k4v2_g128", D, &c), KVARN_ERR_UNSUPPORTED, "head_dim"))
        << D;
    EXPECT_EQ(std::memcmp(&c, &before, sizeof c), 0);
  }
}

// ---- configurations -------------------------------------------------------------------------

TEST(Config, DefaultsAreK4V2G128D128) {
  kvarn_config_t c;
  std::memset(&c, 0x5a, sizeof c);
  kvarn_config_defaults(&c);
  EXPECT_EQ(c.size, sizeof(kvarn_config_t));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.tile_tokens, 128);
  EXPECT_EQ(c.key_bits, 4);
  EXPECT_EQ(c.value_bits, 2);
  EXPECT_EQ(c.iterations, 8);
  EXPECT_EQ(c.sink_tiles, 1);
  EXPECT_EQ(c.key_flags, KVARN_ABLATE_NONE);
  EXPECT_EQ(c.value_flags, KVARN_ABLATE_NONE);
  KVT_EXPECT_OK(kvarn_config_validate(&c));
  kvarn_config_t p = kvt::PresetConfig("k4v2_g128", 128);
  EXPECT_EQ(std::memcmp(&c, &p, sizeof c), 0) << "defaults differ from preset k4v2_g128";
}

TEST(Config, ValidateAcceptsEverySupportedValue) {
  for (const auto& s : AllShapes()) {
    for (int T : {0, 1, 8, 16, 32}) {
      for (int sink : {0, 1, 2, 64}) {
        for (uint32_t kf = 0; kf < 4; ++kf) {
          const kvarn_config_t c = MakeConfig(s.D, s.G, s.kb, s.vb, T, sink, kf, 3 - kf);
          ASSERT_EQ(kvarn_config_validate(&c), KVARN_OK) << kvarn_last_error();
        }
      }
    }
  }
}

TEST(Config, ValidateRejectsUnsupportedShapes) {
  kvarn_config_t c = MakeConfig(128, 128, 4, 2);
  for (int D : {0, 32, 72, 100, 1024, -1}) {
    c = MakeConfig(D, 128, 4, 2);
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_UNSUPPORTED, "head_dim")) << D;
  }
  for (int G : {0, 16, 32, 96, 256, -64}) {
    c = MakeConfig(128, G, 4, 2);
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_UNSUPPORTED, "tile_tokens")) << G;
  }
  for (int b : {0, 1, 3, 5, 6, 7, 16, -4}) {
    c = MakeConfig(128, 128, b, 2);
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_UNSUPPORTED, "bits")) << b;
    c = MakeConfig(128, 128, 4, b);
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_UNSUPPORTED, "bits")) << b;
  }
}

TEST(Config, ValidateRejectsOutOfRangeValues) {
  kvarn_config_t c = MakeConfig(128, 128, 4, 2, 33);
  EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "iterations"));
  c = MakeConfig(128, 128, 4, 2, -1);
  EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "iterations"));
  c = MakeConfig(128, 128, 4, 2, 8, 65);
  EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "sink"));
  c = MakeConfig(128, 128, 4, 2, 8, -1);
  EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "sink"));
  for (uint32_t bad : {4u, 8u, 0x80000000u, 0xffffffffu}) {
    c = MakeConfig(128, 128, 4, 2, 8, 1, bad, 0);
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "flags")) << bad;
    c = MakeConfig(128, 128, 4, 2, 8, 1, 0, bad);
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "flags")) << bad;
  }
}

// Other sizes are growable-struct cases (tests/test_struct_abi.cpp).
TEST(Config, ValidateRejectsSizeFieldOutOfRange) {
  kvarn_config_t c = MakeConfig(128, 128, 4, 2);
  for (size_t s : {size_t{0}, sizeof(size_t) - 1, size_t{4097}, size_t{1} << 40}) {
    c.size = s;
    EXPECT_TRUE(IsError(kvarn_config_validate(&c), KVARN_ERR_INVALID_ARGUMENT, "size")) << s;
  }
  EXPECT_TRUE(IsError(kvarn_config_validate(nullptr), KVARN_ERR_INVALID_ARGUMENT, "null"));
}

// ---- small public constants --------------------------------------------------------------------

TEST(Constants, DtypeSizes) {
  EXPECT_EQ(kvarn_dtype_size(KVARN_DTYPE_F32), 4u);
  EXPECT_EQ(kvarn_dtype_size(KVARN_DTYPE_F16), 2u);
  EXPECT_EQ(kvarn_dtype_size(KVARN_DTYPE_BF16), 2u);
  EXPECT_EQ(kvarn_dtype_size(static_cast<kvarn_dtype_t>(3)), 0u);
  EXPECT_EQ(kvarn_dtype_size(static_cast<kvarn_dtype_t>(0x7ffffffe)), 0u);
  EXPECT_EQ(kvarn_dtype_size(KVARN_DTYPE_SENTINEL_), 0u);
}

TEST(Constants, VersionMatchesHeader) {
  EXPECT_EQ(kvarn_version_number(), static_cast<uint32_t>(KVARN_VERSION_NUMBER));
  EXPECT_EQ(kvarn_abi_version(), static_cast<uint32_t>(KVARN_ABI_VERSION));
  ASSERT_NE(kvarn_version_string(), nullptr);
  const std::string want = std::to_string(KVARN_VERSION_MAJOR) + "." +
                           std::to_string(KVARN_VERSION_MINOR) + "." +
                           std::to_string(KVARN_VERSION_PATCH);
  EXPECT_EQ(std::string(kvarn_version_string()), want);
  EXPECT_EQ(KVARN_VERSION_NUMBER,
            KVARN_VERSION_MAJOR * 10000 + KVARN_VERSION_MINOR * 100 + KVARN_VERSION_PATCH);
}

TEST(Constants, EnumValuesArePinned) {
  // The ABI pins these values (kvarn.h); a change is an ABI break.
  EXPECT_EQ(KVARN_OK, 0);
  EXPECT_EQ(KVARN_ERR_INVALID_ARGUMENT, 1);
  EXPECT_EQ(KVARN_ERR_UNSUPPORTED, 2);
  EXPECT_EQ(KVARN_ERR_BACKEND_UNAVAILABLE, 4);
  EXPECT_EQ(KVARN_ERR_NON_FINITE, 5);
  EXPECT_EQ(KVARN_ERR_OVERFLOW, 6);
  EXPECT_EQ(KVARN_ERR_NOT_FOUND, 8);
  EXPECT_EQ(KVARN_ERR_BUFFER_TOO_SMALL, 11);
  EXPECT_EQ(KVARN_ERR_INTERNAL, 14);
  EXPECT_EQ(KVARN_DTYPE_F32, 0);
  EXPECT_EQ(KVARN_DTYPE_F16, 1);
  EXPECT_EQ(KVARN_DTYPE_BF16, 2);
  EXPECT_EQ(KVARN_FIELD_K_CODES, 0);
  EXPECT_EQ(KVARN_FIELD_V_ZERO, 7);
  EXPECT_EQ(KVARN_FIELD_COUNT, 8);
  EXPECT_EQ(sizeof(kvarn_status_t), 4u);
  EXPECT_EQ(sizeof(kvarn_dtype_t), 4u);
}

}  // namespace
