// Configurations, presets and the record layout (docs/FORMAT.md sections 2 and 7).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "kvarn/kvarn.h"

namespace kvarn {

constexpr int kMaxIterations = 32;
constexpr int kMaxSinkTiles = 64;

// Byte offsets of the eight record fields, in storage order, plus the total size.
struct RecordLayout {
  size_t offset[KVARN_FIELD_COUNT];
  size_t bytes[KVARN_FIELD_COUNT];
  size_t total;
};

// A validated configuration with the derived quantities every kernel needs.
struct Config {
  int D = 128;
  int G = 128;
  int key_bits = 4;
  int value_bits = 2;
  int iterations = 8;
  int sink_tiles = 1;
  bool k_rotate = true;
  bool k_normalize = true;
  bool v_rotate = true;
  bool v_normalize = true;
  RecordLayout layout{};

  size_t record_bytes() const { return layout.total; }
};

// KVARN_ERR_UNSUPPORTED unless head_dim is one of the supported sizes (64, 80, 96, 128, 256, 512);
// the message names the allowed set.
Status CheckHeadDim(int32_t head_dim);

// Checks the public struct (size field, every value supported) and derives a Config.
Status ParseConfig(const kvarn_config_t* config, Config* out);

void DefaultConfig(kvarn_config_t* config);
Status ConfigFromPreset(const char* name, int32_t head_dim, kvarn_config_t* config);
int PresetCount();
const char* PresetName(int index);

RecordLayout ComputeLayout(int D, int G, int key_bits, int value_bits);

}  // namespace kvarn
