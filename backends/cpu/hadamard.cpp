#include "backends/cpu/hadamard.h"

#include <cmath>

namespace kvarn {
namespace cpu {

void HadamardInPlace(float* x, int n) {
  // Butterflies over doubling strides: after the pass with stride h, blocks of 2h hold the
  // transform by H_2h, which is [[H_h, H_h], [H_h, -H_h]].
  for (int h = 1; h < n; h *= 2) {
    for (int i = 0; i < n; i += 2 * h) {
      for (int j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
    }
  }
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace cpu
}  // namespace kvarn
