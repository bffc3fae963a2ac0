#include "backends/cpu/normalize.h"

#include <algorithm>
#include <cmath>

#include "backends/cpu/kernels.h"

namespace kvarn {
namespace cpu {
namespace {

// Constants of docs/FORMAT.md section 4.
constexpr float kStdMin = 1e-3f, kStdMax = 1e3f;
constexpr float kLogMin = -0.3f, kLogMax = 10.0f;
constexpr float kImbalanceFloor = 1e-8f;

float Clamp(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

}  // namespace

namespace {

// Eight double lanes, element i in lane i % 8, combined as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)):
// the order an 8-wide (AVX-512) or 2x4-wide (AVX2) register reduction gives, so SIMD kernels
// can reproduce these sums bit for bit.
double LaneCombine(const double* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Adds x[i] (or (x[i] - mean)^2) into lane i % 8; blocks of 8 keep the lanes in registers.
template <bool kSquares>
double LaneSum(const float* x, int n, double mean) {
  double l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) {
      const double d = kSquares ? x[i + k] - mean : static_cast<double>(x[i + k]);
      l[k] += kSquares ? d * d : d;
    }
  }
  for (; i < n; ++i) {
    const double d = kSquares ? x[i] - mean : static_cast<double>(x[i]);
    l[i & 7] += kSquares ? d * d : d;
  }
  return LaneCombine(l);
}

float ContiguousStd(const float* x, int n) {
  const double mean = LaneSum<false>(x, n, 0.0) / n;
  return static_cast<float>(std::sqrt(LaneSum<true>(x, n, mean) / (n - 1)));
}

}  // namespace

float SampleStd(const float* x, int n, int stride) {
  if (n < 2) return 0.f;
  if (stride == 1) return ContiguousStd(x, n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += x[i * stride];
  const double mean = sum / n;
  double ss = 0.0;
  for (int i = 0; i < n; ++i) {
    const double d = x[i * stride] - mean;
    ss += d * d;
  }
  return static_cast<float>(std::sqrt(ss / (n - 1)));
}

void ColumnStds(const float* X, int R, int C, float* out) {
  // Row-major sweep with one accumulator per column: the same summation order per column as
  // SampleStd(X + j, R, C), so the results are bit-identical, but cache-friendly.
  std::vector<double> sum(C, 0.0), ss(C, 0.0);
  for (int i = 0; i < R; ++i) {
    const float* row = X + static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) sum[j] += row[j];
  }
  for (int j = 0; j < C; ++j) sum[j] /= R;  // the mean
  for (int i = 0; i < R; ++i) {
    const float* row = X + static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) {
      const double d = row[j] - sum[j];
      ss[j] += d * d;
    }
  }
  for (int j = 0; j < C; ++j) out[j] = R < 2 ? 0.f : static_cast<float>(std::sqrt(ss[j] / (R - 1)));
}

void RowStds(const float* X, int R, int C, float* out) {
  for (int i = 0; i < R; ++i) out[i] = SampleStd(X + static_cast<size_t>(i) * C, C, 1);
}

namespace {

float ImbalanceOf(const std::vector<float>& col_std, const std::vector<float>& row_std) {
  const auto c = std::minmax_element(col_std.begin(), col_std.end());
  const auto r = std::minmax_element(row_std.begin(), row_std.end());
  return *c.second / std::max(*c.first, kImbalanceFloor) +
         *r.second / std::max(*r.first, kImbalanceFloor);
}

}  // namespace

float Imbalance(const float* X, int R, int C) {
  std::vector<float> cs(C), rs(R);
  ColumnStds(X, R, C, cs.data());
  RowStds(X, R, C, rs.data());
  return ImbalanceOf(cs, rs);
}

void ScalarStats(const float* X, int R, int C, float* col_std, float* row_std) {
  ColumnStds(X, R, C, col_std);
  RowStds(X, R, C, row_std);
}

void ScalarColumnPass(const float* M, int R, int C, const float* ec, const float* er, float* Y,
                      float* row_std) {
  std::vector<float> x(C);
  for (int i = 0; i < R; ++i) {
    const size_t o = static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) {
      Y[o + j] = M[o + j] / ec[j];
      x[j] = Y[o + j] / er[i];  // = (M / ec) / er, column scale first (section 4)
    }
    row_std[i] = SampleStd(x.data(), C, 1);
  }
}

void ScalarRowPass(const float* Y, int R, int C, const float* er, float* X, float* col_std,
                   float* row_std) {
  for (int i = 0; i < R; ++i) {
    const size_t o = static_cast<size_t>(i) * C;
    for (int j = 0; j < C; ++j) X[o + j] = Y[o + j] / er[i];
  }
  ColumnStds(X, R, C, col_std);
  RowStds(X, R, C, row_std);
}

NormalizeResult NormalizeTile(const float* M, int R, int C, int iterations, float* s_r, float* s_c,
                              std::vector<float>& X, const Kernels* k) {
  const Kernels& K = k ? *k : ScalarKernels();
  NormalizeResult res;
  std::vector<float> lc(C, 0.f), lr(R, 0.f), ec(C, 1.f), er(R, 1.f);
  std::vector<float> best_lc(C, 0.f), best_lr(R, 0.f);
  std::vector<float> col_std(C), row_std(R);
  const size_t n = static_cast<size_t>(R) * C;
  X.resize(2 * n);
  float* Y = X.data() + n;  // M / ec, shared by the two iterates of an iteration
  // col_std always holds the column deviations of the current X: the imbalance of an iterate
  // and the next iteration's column update read the same numbers.
  K.stats(M, R, C, col_std.data(), row_std.data());
  res.initial_imbalance = ImbalanceOf(col_std, row_std);
  float best = res.initial_imbalance;
  for (int it = 1; it <= iterations; ++it) {
    for (int j = 0; j < C; ++j) {
      lc[j] = Clamp(lc[j] + std::log(Clamp(col_std[j], kStdMin, kStdMax)), kLogMin, kLogMax);
      ec[j] = std::exp(lc[j]);
    }
    // X = (M / ec) / er with the previous row scales: only its row deviations are needed.
    K.column_pass(M, R, C, ec.data(), er.data(), Y, row_std.data());
    for (int i = 0; i < R; ++i) {
      lr[i] = Clamp(lr[i] + std::log(Clamp(row_std[i], kStdMin, kStdMax)), kLogMin, kLogMax);
      er[i] = std::exp(lr[i]);
    }
    K.row_pass(Y, R, C, er.data(), X.data(), col_std.data(), row_std.data());
    const float imb = ImbalanceOf(col_std, row_std);
    if (imb <= best) {  // ties go to the later iterate
      best = imb;
      best_lc = lc;
      best_lr = lr;
      res.best_iteration = it;
    }
  }
  res.best_imbalance = best;
  for (int j = 0; j < C; ++j) s_c[j] = std::exp(best_lc[j]);
  for (int i = 0; i < R; ++i) s_r[i] = std::exp(best_lr[i]);
  return res;
}

}  // namespace cpu
}  // namespace kvarn
