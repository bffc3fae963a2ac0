// Variance normalization of one tile (docs/FORMAT.md section 4): Sinkhorn-like passes in log space
// that equalize the standard deviations of the rows and columns, keeping the best iterate.
#pragma once

#include <vector>

namespace kvarn {
namespace cpu {

// Unbiased (n-1) standard deviation of n values `stride` floats apart, accumulated in double in
// a fixed order every backend reproduces bit for bit: strided (column) sums run sequentially
// over i; contiguous (row) sums use eight lanes, element i in lane i % 8, combined as
// ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)).
float SampleStd(const float* x, int n, int stride);

// Unbiased standard deviations of every column [C] / row [R] of X (R x C), each bit-identical to
// SampleStd over that column / row.
void ColumnStds(const float* X, int R, int C, float* out);
void RowStds(const float* X, int R, int C, float* out);

// The scalar reference's normalization passes (the Kernels entries stats, column_pass,
// row_pass; see kernels.h).
void ScalarStats(const float* X, int R, int C, float* col_std, float* row_std);
void ScalarColumnPass(const float* M, int R, int C, const float* ec, const float* er, float* Y,
                      float* row_std);
void ScalarRowPass(const float* Y, int R, int C, const float* er, float* X, float* col_std,
                   float* row_std);

// imb(X) = max col std / max(min col std, 1e-8) + max row std / max(min row std, 1e-8).
float Imbalance(const float* X, int R, int C);

struct NormalizeResult {
  float initial_imbalance = 0.f;
  float best_imbalance = 0.f;
  int best_iteration = 0;  // 0 = the input itself (scales 1)
};

struct Kernels;

// M: R x C row-major fp32. Writes the row scales s_r [R] and column scales s_c [C] of the best
// iterate; X is scratch (2*R*C floats). With iterations == 0 the scales are 1. The passes over the
// tile run on `k` (the scalar reference when NULL); every ISA gives the same bits.
NormalizeResult NormalizeTile(const float* M, int R, int C, int iterations, float* s_r, float* s_c,
                              std::vector<float>& X, const Kernels* k = nullptr);

}  // namespace cpu
}  // namespace kvarn
