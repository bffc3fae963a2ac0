// The orthonormal Hadamard rotation (docs/FORMAT.md section 3).
#pragma once

namespace kvarn {
namespace cpu {

// The factors of H_D = (P_m (x) S_p) / sqrt(D): S_p the Sylvester matrix of order p (a power of
// two) and P_m the symmetric Paley matrix of order m (docs/FORMAT.md section 3), or m = 1 and
// p = D when D is a power of two. Channel d is entry (d / p, d % p) of an m x p matrix.
struct RotationFactors {
  int m = 1;
  int p = 1;
  // m x m signs (+1 / -1, row-major) of P_m; nullptr when m = 1.
  const float* paley = nullptr;
  // m x D floats: lane_signs[a * D + d] = P_m[a][d / p], the sign group a contributes to channel
  // d (what a vector kernel multiplies by); nullptr when m = 1.
  const float* lane_signs = nullptr;
};

// x <- x S_n, unscaled, n a power of two: butterflies over strides 1, 2, 4, ... (a + b, a - b).
void SylvesterButterflies(float* x, int n);

// The factors for a supported head dim (64, 80, 96, 128, 256, 512).
RotationFactors RotationFactorsFor(int D);

// x <- x H_D in place, fp32. Power-of-two D: the fast Walsh-Hadamard transform (Sylvester order,
// so the result equals the product with scipy.linalg.hadamard(D) / sqrt(D)). D = m * p: the
// transform of order p on each of the m groups of p channels, then group c of the output is
// sum_{a = 0..m-1} P_m[a][c] * group a, starting from the a = 0 term and adding a = 1, 2, ... in
// order (the terms are exact sign flips, so this order fixes every rounding), then the scale
// 1/sqrt(D) as one rounded multiply. SIMD kernels reproduce this bit for bit.
void HadamardInPlace(float* x, int n);

}  // namespace cpu
}  // namespace kvarn
