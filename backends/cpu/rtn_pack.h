// Round-to-nearest per row (docs/FORMAT.md section 5) and bit packing (section 7).
#pragma once

#include <cstdint>

namespace kvarn {
namespace cpu {

// For each row i of B (R x C): lo = min, hi = max, step = max((hi-lo)/qmax, 1e-10),
// code = clamp(rint((B - lo)/step), 0, qmax) with ties to even. Writes codes [R*C], lo [R],
// step [R].
void RoundToNearestRows(const float* B, int R, int C, int bits, uint8_t* codes, float* lo,
                        float* step);

// B = (M / s_c) / s_r (column scale first, docs/FORMAT.md section 4), then RoundToNearestRows:
// the scalar reference of the Kernels entry balance_rtn.
void ScalarBalanceRtn(const float* M, int R, int C, const float* s_c, const float* s_r, int bits,
                      float* B, uint8_t* codes, float* lo, float* step);

// Packs R rows of C codes of `bits` bits, least significant bits first, C*bits/8 bytes per row.
void PackRows(const uint8_t* codes, int R, int C, int bits, uint8_t* out);
// The inverse of PackRows.
void UnpackRows(const uint8_t* packed, int R, int C, int bits, uint8_t* codes);

}  // namespace cpu
}  // namespace kvarn
