#include "backends/cpu/hadamard.h"

#include <cmath>
#include <vector>

namespace kvarn {
namespace cpu {
namespace {

// The symmetric Paley matrix of order m = q + 1, q prime and q % 4 == 3 (docs/FORMAT.md section
// 3): P[0][0] = -1, +1 on the rest of row and column 0, and P[i][j] = chi(i + j - 2 mod q) for
// i, j >= 1 with chi(0) = +1, chi(x) = +1 for a nonzero square mod q, -1 otherwise. It is the
// Paley I matrix with columns 1..q permuted by y -> -y and column 0 negated, which keeps it a
// Hadamard matrix and makes it symmetric, so H_D stays its own inverse.
std::vector<float> Paley(int m) {
  const int q = m - 1;
  std::vector<bool> square(q, false);
  square[0] = true;  // chi(0) = +1
  for (int x = 1; x < q; ++x) square[(x * x) % q] = true;
  std::vector<float> p(static_cast<size_t>(m) * m);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) {
      float s;
      if (i == 0 || j == 0) {
        s = (i == 0 && j == 0) ? -1.f : 1.f;
      } else {
        s = square[(i + j - 2) % q] ? 1.f : -1.f;
      }
      p[static_cast<size_t>(i) * m + j] = s;
    }
  }
  return p;
}

struct Factored {
  int D, m, p;
  std::vector<float> paley, lane_signs;
  Factored(int d, int mm) : D(d), m(mm), p(d / mm), paley(Paley(mm)) {
    lane_signs.resize(static_cast<size_t>(m) * D);
    for (int a = 0; a < m; ++a) {
      for (int c = 0; c < D; ++c) {
        lane_signs[static_cast<size_t>(a) * D + c] = paley[static_cast<size_t>(a) * m + c / p];
      }
    }
  }
};

// The head dims that are not powers of two: 80 = 20 x 4 (q = 19), 96 = 12 x 8 (q = 11). Built
// once (thread-safe static initialization), read-only after.
const Factored* FactoredFor(int D) {
  static const Factored k80(80, 20), k96(96, 12);
  if (D == 80) return &k80;
  if (D == 96) return &k96;
  return nullptr;
}

}  // namespace

void SylvesterButterflies(float* x, int n) {
  // After the pass with stride h, blocks of 2h hold the transform by H_2h, which is
  // [[H_h, H_h], [H_h, -H_h]].
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
}

RotationFactors RotationFactorsFor(int D) {
  RotationFactors f;
  const Factored* t = FactoredFor(D);
  if (t == nullptr) {
    f.p = D;
    return f;
  }
  f.m = t->m;
  f.p = t->p;
  f.paley = t->paley.data();
  f.lane_signs = t->lane_signs.data();
  return f;
}

void HadamardInPlace(float* x, int n) {
  const RotationFactors f = RotationFactorsFor(n);
  for (int a = 0; a < f.m; ++a) SylvesterButterflies(x + a * f.p, f.p);
  if (f.m > 1) {
    float z[128];  // the groups after their transforms (n <= 128 here)
    for (int i = 0; i < n; ++i) z[i] = x[i];
    for (int c = 0; c < f.m; ++c) {
      for (int e = 0; e < f.p; ++e) {
        float acc = f.paley[c] * z[e];  // the a = 0 term
        for (int a = 1; a < f.m; ++a) acc = acc + f.paley[a * f.m + c] * z[a * f.p + e];
        x[c * f.p + e] = acc;
      }
    }
  }
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace cpu
}  // namespace kvarn
