// Independent float64 / plain-C++ references the selftest compares libkvarn against.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#ifndef KVARN_TOOLS_SELFTEST_REFERENCE_H_
#define KVARN_TOOLS_SELFTEST_REFERENCE_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace kvarn_selftest {

// IEEE binary16 bits -> double (exact).
double HalfToDouble(uint16_t bits);

// In-place x <- x H with H the orthonormal rotation of docs/FORMAT.md section 3, in float64: the
// Sylvester Hadamard matrix for n a power of two, the Paley x Sylvester Kronecker product for n 80
// and 96. H is symmetric and its own inverse.
void HadamardInPlace(double* x, int n);

// Squared-error sums of one quantization experiment.
struct ErrorSums {
  double err_sq = 0.0;     // sum (reconstruction - input)^2
  double signal_sq = 0.0;  // sum input^2
  double Relative() const { return signal_sq > 0.0 ? err_sq / signal_sq : 0.0; }
};

// Plain per-token round-to-nearest at `bits` bits: every row of `rows` x `cols` (a token's
// channels) gets its own min/max, codes clamp(rint((x - lo) / step)) with round-half-even,
// reconstruction code * step + lo, in fp32 as an RTN kernel would compute it; no rotation, no
// normalization, scales kept in fp32 (which favours RTN slightly). Accumulates into *sums.
void PerTokenRtnError(const float* x, size_t rows, int cols, int bits, ErrorSums* sums);

// Accumulates the error of `reconstruction` against `input` (n values) into *sums.
void AccumulateError(const float* input, const float* reconstruction, size_t n, ErrorSums* sums);

// Float64 attention of one query head over one KV head's cached tokens, in whatever frame the
// caller gives (q and keys must share it). keys, values: [n_keys][dim] row-major float64.
// Writes out[dim] and returns the natural log of the softmax denominator of the scaled scores.
// The model variants (docs/FORMAT.md section 9.1): scores become softcap * tanh(s / softcap) when
// softcap > 0, and a finite sink logit joins the denominator with no value.
double AttentionFloat64(const double* q, const double* keys, const double* values, int n_keys,
                        int dim, double scale, double* out, double softcap = 0.0,
                        double sink = -std::numeric_limits<double>::infinity());

}  // namespace kvarn_selftest

#endif  // KVARN_TOOLS_SELFTEST_REFERENCE_H_
