// One tile <-> one record, in the cache frame (ALGORITHM.md sections 4-7). The scalar reference
// every other backend is compared with.
#pragma once

#include <cstdint>
#include <vector>

#include "core/config.h"
#include "core/status.h"

namespace kvarn {
namespace cpu {

// Per-thread scratch so repeated calls do not allocate.
struct TileScratch {
  std::vector<float> M, X, B, s_r, s_c, lo, step;
  std::vector<uint8_t> codes;
};

// Quantizes one matrix M (R x C) with optional normalization: codes [R*C] (unpacked), absorbed
// fp16 row scale a [R], row zero z [R] and column scale c [C]. Fails (writing only scratch) with
// KVARN_ERR_OVERFLOW when an absorbed value does not fit fp16.
Status QuantizeMatrix(const float* M, int R, int C, int bits, bool normalize, int iterations,
                      TileScratch& s, uint8_t* codes, uint16_t* a, uint16_t* z, uint16_t* c);

// k_tile, v_tile: G x D fp16 (token-major) in the cache frame. Writes cfg.record_bytes() bytes.
// Non-finite inputs give KVARN_ERR_NON_FINITE. On failure `record` may hold partial bytes: the
// callers write into scratch and copy out only when every tile succeeded.
Status QuantizeRecord(const Config& cfg, const uint16_t* k_tile, const uint16_t* v_tile,
                      uint8_t* record, TileScratch& s);

// Reconstructs the tile in the cache frame: k, v: G x D fp32 (token-major); either may be NULL.
void DequantizeRecord(const Config& cfg, const uint8_t* record, float* k, float* v);

}  // namespace cpu
}  // namespace kvarn
