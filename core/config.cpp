#include "core/config.h"

#include <cstdio>
#include <cstring>
#include <string>

#include "core/abi_struct.h"
#include "kvarn/kvarn_experimental.h"  // KVARN_ABLATE_* (key_flags / value_flags)

namespace kvarn {
namespace {

// The named presets of docs/FORMAT.md section 2 (any k<b>v<b>_g<G> also parses).
const char* const kPresets[] = {"k4v2_g128", "k4v2_g64",  "k4v4_g128",
                                "k4v4_g64",  "k2v2_g128", "k8v8_g128"};

bool IsBits(int b) { return b == 2 || b == 4 || b == 8; }
// 80 and 96 (Phi-3, StableLM) rotate by a Paley x Sylvester Kronecker product (docs/FORMAT.md
// section 3); the rest by the Sylvester matrix.
bool IsHeadDim(int d) { return d == 64 || d == 80 || d == 96 || d == 128 || d == 256 || d == 512; }
bool IsTile(int g) { return g == 64 || g == 128; }

}  // namespace

Status CheckHeadDim(int32_t head_dim) {
  if (IsHeadDim(head_dim)) return Status::Ok();
  return Unsupported("head_dim " + std::to_string(head_dim) +
                     " unsupported: must be one of 64, 80, 96, 128, 256, 512");
}

RecordLayout ComputeLayout(int D, int G, int key_bits, int value_bits) {
  RecordLayout l{};
  const size_t d = static_cast<size_t>(D), g = static_cast<size_t>(G);
  l.bytes[KVARN_FIELD_K_CODES] = d * g * key_bits / 8;
  l.bytes[KVARN_FIELD_K_SCALE] = 2 * d;
  l.bytes[KVARN_FIELD_K_ZERO] = 2 * d;
  l.bytes[KVARN_FIELD_K_TOKEN_SCALE] = 2 * g;
  l.bytes[KVARN_FIELD_V_CODES] = g * d * value_bits / 8;
  l.bytes[KVARN_FIELD_V_CHANNEL_SCALE] = 2 * d;
  l.bytes[KVARN_FIELD_V_SCALE] = 2 * g;
  l.bytes[KVARN_FIELD_V_ZERO] = 2 * g;
  size_t off = 0;
  for (int f = 0; f < KVARN_FIELD_COUNT; ++f) {
    l.offset[f] = off;
    off += l.bytes[f];
  }
  l.total = off;
  return l;
}

void DefaultConfig(kvarn_config_t* c) {
  std::memset(c, 0, sizeof *c);
  c->size = sizeof *c;
  c->head_dim = 128;
  c->tile_tokens = 128;
  c->key_bits = 4;
  c->value_bits = 2;
  c->iterations = 8;
  c->sink_tiles = 1;
  c->key_flags = KVARN_ABLATE_NONE;
  c->value_flags = KVARN_ABLATE_NONE;
}

Status ParseConfig(const kvarn_config_t* in, Config* out) {
  // Growable struct (core/abi_struct.h): fields past in->size keep the defaults.
  kvarn_config_t cfg;
  DefaultConfig(&cfg);
  KVARN_RETURN_IF_ERROR(ReadStruct(in, "config", &cfg));
  const kvarn_config_t* c = &cfg;
  KVARN_RETURN_IF_ERROR(CheckHeadDim(c->head_dim));
  if (!IsTile(c->tile_tokens)) {
    return Unsupported("tile_tokens " + std::to_string(c->tile_tokens) +
                       " unsupported: must be one of 64, 128");
  }
  if (!IsBits(c->key_bits) || !IsBits(c->value_bits)) {
    return Unsupported("key_bits/value_bits " + std::to_string(c->key_bits) + "/" +
                       std::to_string(c->value_bits) + " unsupported: each must be one of 2, 4, 8");
  }
  if (c->iterations < 0 || c->iterations > kMaxIterations) {
    return InvalidArgument("iterations " + std::to_string(c->iterations) +
                           " out of range: must be in 0..32");
  }
  if (c->sink_tiles < 0 || c->sink_tiles > kMaxSinkTiles) {
    return InvalidArgument("sink_tiles " + std::to_string(c->sink_tiles) +
                           " out of range: must be in 0..64");
  }
  const uint32_t known = KVARN_ABLATE_NO_ROTATION | KVARN_ABLATE_NO_NORMALIZATION;
  if ((c->key_flags & ~known) || (c->value_flags & ~known)) {
    return InvalidArgument("unknown bits in key_flags/value_flags");
  }
  Config r;
  r.D = c->head_dim;
  r.G = c->tile_tokens;
  r.key_bits = c->key_bits;
  r.value_bits = c->value_bits;
  r.iterations = c->iterations;
  r.sink_tiles = c->sink_tiles;
  r.k_rotate = !(c->key_flags & KVARN_ABLATE_NO_ROTATION);
  r.k_normalize = !(c->key_flags & KVARN_ABLATE_NO_NORMALIZATION);
  r.v_rotate = !(c->value_flags & KVARN_ABLATE_NO_ROTATION);
  r.v_normalize = !(c->value_flags & KVARN_ABLATE_NO_NORMALIZATION);
  r.layout = ComputeLayout(r.D, r.G, r.key_bits, r.value_bits);
  *out = r;
  return Status::Ok();
}

Status ConfigFromPreset(const char* name, int32_t head_dim, kvarn_config_t* config) {
  if (name == nullptr || config == nullptr) return InvalidArgument("preset or config is NULL");
  int kb = 0, vb = 0, g = 0;
  char tail = 0;
  // Exactly "k<bits>v<bits>_g<tile>", nothing after it.
  if (std::sscanf(name, "k%dv%d_g%d%c", &kb, &vb, &g, &tail) != 3 || !IsBits(kb) || !IsBits(vb) ||
      !IsTile(g)) {
    return {KVARN_ERR_NOT_FOUND, std::string("unknown preset '") + name +
                                     "' (expected k<2|4|8>v<2|4|8>_g<64|128>, e.g. k4v2_g128)"};
  }
  // Reject spellings sscanf accepts loosely ("k04v2_g128", "k+4...").
  char canonical[32];
  std::snprintf(canonical, sizeof canonical, "k%dv%d_g%d", kb, vb, g);
  if (std::strcmp(canonical, name) != 0) {
    return {KVARN_ERR_NOT_FOUND, std::string("unknown preset '") + name + "'"};
  }
  KVARN_RETURN_IF_ERROR(CheckHeadDim(head_dim));
  DefaultConfig(config);
  config->head_dim = head_dim;
  config->tile_tokens = g;
  config->key_bits = kb;
  config->value_bits = vb;
  return Status::Ok();
}

int PresetCount() { return static_cast<int>(sizeof kPresets / sizeof kPresets[0]); }

const char* PresetName(int index) {
  return (index >= 0 && index < PresetCount()) ? kPresets[index] : nullptr;
}

}  // namespace kvarn
