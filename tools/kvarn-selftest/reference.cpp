// Independent float64 / plain-C++ references the selftest compares libkvarn against.
//
// Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
#include "reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvarn_selftest {

double HalfToDouble(uint16_t bits) {
  const int sign = (bits >> 15) & 1;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  double value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<double>(mantissa), -24);  // zero or subnormal
  } else if (exponent == 31) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity()
                          : std::numeric_limits<double>::quiet_NaN();
  } else {
    value = std::ldexp(static_cast<double>(mantissa + 1024), exponent - 25);
  }
  return sign ? -value : value;
}

void HadamardInPlace(double* x, int n) {
  // n = m * p with p a power of two: m = 1 (the Sylvester matrix of order n), or the Paley
  // factor of order m = 20 (n = 80) or 12 (n = 96). Channel i is entry (i / p, i % p).
  const int m = n == 80 ? 20 : n == 96 ? 12 : 1;
  const int p = n / m;
  // The iterative butterfly produces the Sylvester (natural) ordering, i.e. scipy's hadamard(p),
  // applied to each group of p channels.
  for (int g = 0; g < m; ++g) {
    double* y = x + g * p;
    for (int h = 1; h < p; h *= 2) {
      for (int i = 0; i < p; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const double a = y[j], b = y[j + h];
          y[j] = a + b;
          y[j + h] = a - b;
        }
      }
    }
  }
  if (m > 1) {
    // Across the groups: x <- (P_m (x) I_p) x with P_m the symmetric Paley matrix of
    // docs/FORMAT.md section 3: P[0][0] = -1, +1 elsewhere in row and column 0, and for i, j >= 1
    // +1 where (i + j - 2) mod q (q = m - 1) is 0 or a square mod q, else -1.
    const int q = m - 1;
    std::vector<char> is_square(q, 0);
    is_square[0] = 1;
    for (int r = 1; r < q; ++r) is_square[(r * r) % q] = 1;
    auto paley = [&](int i, int j) -> double {
      if (i == 0 || j == 0) return i == j ? -1.0 : 1.0;
      return is_square[(i + j - 2) % q] ? 1.0 : -1.0;
    };
    std::vector<double> y(x, x + n);
    for (int c = 0; c < m; ++c) {
      for (int e = 0; e < p; ++e) {
        double sum = 0.0;
        for (int a = 0; a < m; ++a) sum += paley(a, c) * y[a * p + e];
        x[c * p + e] = sum;
      }
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(n));
  for (int i = 0; i < n; ++i) x[i] *= scale;
}

void PerTokenRtnError(const float* x, size_t rows, int cols, int bits, ErrorSums* sums) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float lo = row[0], hi = row[0];
    for (int c = 1; c < cols; ++c) {
      lo = std::min(lo, row[c]);
      hi = std::max(hi, row[c]);
    }
    const float step = std::max((hi - lo) / qmax, 1e-10f);
    for (int c = 0; c < cols; ++c) {
      // std::nearbyint rounds half to even in the default rounding mode, like rintf.
      const float code = std::min(std::max(std::nearbyint((row[c] - lo) / step), 0.0f), qmax);
      const double recon = static_cast<double>(code * step + lo);
      const double err = recon - row[c];
      sums->err_sq += err * err;
      sums->signal_sq += static_cast<double>(row[c]) * row[c];
    }
  }
}

void AccumulateError(const float* input, const float* reconstruction, size_t n, ErrorSums* sums) {
  for (size_t i = 0; i < n; ++i) {
    const double err = static_cast<double>(reconstruction[i]) - input[i];
    sums->err_sq += err * err;
    sums->signal_sq += static_cast<double>(input[i]) * input[i];
  }
}

double AttentionFloat64(const double* q, const double* keys, const double* values, int n_keys,
                        int dim, double scale, double* out, double softcap, double sink) {
  std::vector<double> scores(n_keys);
  double max_score = sink;
  for (int t = 0; t < n_keys; ++t) {
    double s = 0.0;
    const double* k = keys + static_cast<size_t>(t) * dim;
    for (int d = 0; d < dim; ++d) s += q[d] * k[d];
    scores[t] = s * scale;
    if (softcap > 0.0) scores[t] = softcap * std::tanh(scores[t] / softcap);
    max_score = std::max(max_score, scores[t]);
  }
  double denom = std::isinf(sink) ? 0.0 : std::exp(sink - max_score);
  for (int d = 0; d < dim; ++d) out[d] = 0.0;
  for (int t = 0; t < n_keys; ++t) {
    const double p = std::exp(scores[t] - max_score);
    denom += p;
    const double* v = values + static_cast<size_t>(t) * dim;
    for (int d = 0; d < dim; ++d) out[d] += p * v[d];
  }
  for (int d = 0; d < dim; ++d) out[d] /= denom;
  return max_score + std::log(denom);
}

}  // namespace kvarn_selftest
