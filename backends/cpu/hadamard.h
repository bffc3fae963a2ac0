// The orthonormal Sylvester Hadamard rotation (docs/FORMAT.md section 3).
#pragma once

namespace kvarn {
namespace cpu {

// x <- x H / sqrt(n) in place, fp32, by the fast Walsh-Hadamard transform (Sylvester order, so
// the result equals the product with scipy.linalg.hadamard(n) / sqrt(n)). n is a power of two.
void HadamardInPlace(float* x, int n);

}  // namespace cpu
}  // namespace kvarn
