#include "backends/cpu/rtn_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvarn {
namespace cpu {

void RoundToNearestRows(const float* B, int R, int C, int bits, uint8_t* codes, float* lo,
                        float* step) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  for (int i = 0; i < R; ++i) {
    const float* row = B + static_cast<size_t>(i) * C;
    float mn = row[0], mx = row[0];
    for (int j = 1; j < C; ++j) {
      mn = std::min(mn, row[j]);
      mx = std::max(mx, row[j]);
    }
    const float s = std::max((mx - mn) / qmax, 1e-10f);
    lo[i] = mn;
    step[i] = s;
    for (int j = 0; j < C; ++j) {
      // std::nearbyint rounds half to even in the default rounding mode (never roundf).
      const float q = std::nearbyint((row[j] - mn) / s);
      codes[static_cast<size_t>(i) * C + j] =
          static_cast<uint8_t>(std::min(std::max(q, 0.f), qmax));
    }
  }
}

void ScalarBalanceRtn(const float* M, int R, int C, const float* s_c, const float* s_r, int bits,
                      float* B, uint8_t* codes, float* lo, float* step) {
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) {
      const size_t e = static_cast<size_t>(i) * C + j;
      B[e] = (M[e] / s_c[j]) / s_r[i];
    }
  }
  RoundToNearestRows(B, R, C, bits, codes, lo, step);
}

void PackRows(const uint8_t* codes, int R, int C, int bits, uint8_t* out) {
  const int per_byte = 8 / bits;
  const int row_bytes = C * bits / 8;
  std::memset(out, 0, static_cast<size_t>(R) * row_bytes);
  const unsigned mask = (1u << bits) - 1u;
  for (int i = 0; i < R; ++i) {
    for (int c = 0; c < C; ++c) {
      const unsigned code = codes[static_cast<size_t>(i) * C + c] & mask;
      out[static_cast<size_t>(i) * row_bytes + c / per_byte] |=
          static_cast<uint8_t>(code << ((c % per_byte) * bits));
    }
  }
}

void UnpackRows(const uint8_t* packed, int R, int C, int bits, uint8_t* codes) {
  const int per_byte = 8 / bits;
  const int row_bytes = C * bits / 8;
  const unsigned mask = (1u << bits) - 1u;
  for (int i = 0; i < R; ++i) {
    for (int c = 0; c < C; ++c) {
      const unsigned byte = packed[static_cast<size_t>(i) * row_bytes + c / per_byte];
      codes[static_cast<size_t>(i) * C + c] =
          static_cast<uint8_t>((byte >> ((c % per_byte) * bits)) & mask);
    }
  }
}

}  // namespace cpu
}  // namespace kvarn
