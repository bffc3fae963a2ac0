// Baseline quantizers (see baselines.h).
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include "core/baselines.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/half.h"

namespace kvarn {
namespace {

float RoundHalf(float x) { return half_to_float(float_to_half(x)); }

constexpr float kE4m3Max = 448.0f;

}  // namespace

float RoundToE4m3(float x) {
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return std::copysign(kE4m3Max, x);
  // e4m3 keeps 3 mantissa bits; below 2^-6 (the smallest normal) the spacing stays 2^-9.
  int exp = 0;
  std::frexp(a, &exp);  // a = m * 2^exp, m in [0.5, 1)
  const int unit_exp = std::max(exp - 1, -6) - 3;
  const float unit = std::ldexp(1.0f, unit_exp);
  // a / unit is exact (a power-of-two scaling); rint rounds half to even.
  const float q = std::rint(a / unit) * unit;
  return std::copysign(std::min(q, kE4m3Max), x);
}

void PerTokenRtnRow(const float* in, int32_t cols, int32_t bits, float* out) {
  float lo = in[0], hi = in[0];
  for (int32_t i = 1; i < cols; ++i) {
    lo = std::min(lo, in[i]);
    hi = std::max(hi, in[i]);
  }
  const float qmax = static_cast<float>((1 << bits) - 1);
  const float zero = RoundHalf(lo);
  const float scale = RoundHalf((hi - zero) / qmax);
  if (!(scale > 0.0f)) {  // a constant row (or a range below fp16's resolution)
    std::fill(out, out + cols, zero);
    return;
  }
  for (int32_t i = 0; i < cols; ++i) {
    const float code = std::min(std::max(std::rint((in[i] - zero) / scale), 0.0f), qmax);
    out[i] = code * scale + zero;
  }
}

void Fp8E4m3Row(const float* in, int32_t cols, float* out) {
  float absmax = 0.0f;
  for (int32_t i = 0; i < cols; ++i) absmax = std::max(absmax, std::fabs(in[i]));
  const float scale = RoundHalf(absmax / kE4m3Max);
  if (!(scale > 0.0f)) {
    std::fill(out, out + cols, 0.0f);
    return;
  }
  for (int32_t i = 0; i < cols; ++i) out[i] = RoundToE4m3(in[i] / scale) * scale;
}

Status BaselineRoundtrip(kvarn_baseline_t method, int32_t bits, size_t rows, int32_t cols,
                         const float* in, float* out) {
  if (method != KVARN_BASELINE_PER_TOKEN_RTN && method != KVARN_BASELINE_FP8_E4M3) {
    return InvalidArgument("baseline: unknown method " + std::to_string(method));
  }
  if (method == KVARN_BASELINE_PER_TOKEN_RTN && (bits < 2 || bits > 8)) {
    return InvalidArgument("baseline: per-token RTN bits must be in 2..8, got " +
                           std::to_string(bits));
  }
  if (cols <= 0) return InvalidArgument("baseline: cols must be positive");
  if (rows == 0) return Status::Ok();
  if (in == nullptr || out == nullptr) return InvalidArgument("baseline: in or out is NULL");
  if (rows > std::numeric_limits<size_t>::max() / static_cast<size_t>(cols)) {
    return InvalidArgument("baseline: rows x cols overflows");
  }
  const size_t n = rows * static_cast<size_t>(cols);
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(in[i])) {
      return Status(KVARN_ERR_NON_FINITE,
                    "baseline: non-finite input at element " + std::to_string(i));
    }
    // fp16 scales and zeros must be able to hold the row's range.
    if (std::fabs(in[i]) > 65504.0f) {
      return Status(KVARN_ERR_OVERFLOW,
                    "baseline: |input| beyond fp16 at element " + std::to_string(i));
    }
  }
  for (size_t r = 0; r < rows; ++r) {
    const float* src = in + r * cols;
    float* dst = out + r * cols;
    if (method == KVARN_BASELINE_PER_TOKEN_RTN) {
      PerTokenRtnRow(src, cols, bits, dst);
    } else {
      Fp8E4m3Row(src, cols, dst);
    }
  }
  return Status::Ok();
}

}  // namespace kvarn
