#include "backends/cpu/normalize.h"

#include <algorithm>
#include <cmath>

namespace kvarn {
namespace cpu {
namespace {

// Constants of ALGORITHM.md section 4.
constexpr float kStdMin = 1e-3f, kStdMax = 1e3f;
constexpr float kLogMin = -0.3f, kLogMax = 10.0f;
constexpr float kImbalanceFloor = 1e-8f;

float Clamp(float x, float lo, float hi) { return std::min(std::max(x, lo), hi); }

// X[i,j] = (M[i,j] / ec[j]) / er[i]: column scale first, then row scale, in fp32.
void Apply(const float* M, int R, int C, const float* ec, const float* er, float* X) {
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) X[i * C + j] = (M[i * C + j] / ec[j]) / er[i];
  }
}

}  // namespace

float SampleStd(const float* x, int n, int stride) {
  if (n < 2) return 0.f;
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

float Imbalance(const float* X, int R, int C) {
  float cmax = 0.f, cmin = INFINITY, rmax = 0.f, rmin = INFINITY;
  for (int j = 0; j < C; ++j) {
    const float s = SampleStd(X + j, R, C);
    cmax = std::max(cmax, s);
    cmin = std::min(cmin, s);
  }
  for (int i = 0; i < R; ++i) {
    const float s = SampleStd(X + static_cast<size_t>(i) * C, C, 1);
    rmax = std::max(rmax, s);
    rmin = std::min(rmin, s);
  }
  return cmax / std::max(cmin, kImbalanceFloor) + rmax / std::max(rmin, kImbalanceFloor);
}

NormalizeResult NormalizeTile(const float* M, int R, int C, int iterations, float* s_r, float* s_c,
                              std::vector<float>& X) {
  NormalizeResult res;
  std::vector<float> lc(C, 0.f), lr(R, 0.f), ec(C, 1.f), er(R, 1.f);
  std::vector<float> best_lc(C, 0.f), best_lr(R, 0.f);
  X.assign(M, M + static_cast<size_t>(R) * C);
  res.initial_imbalance = Imbalance(X.data(), R, C);
  float best = res.initial_imbalance;
  for (int it = 1; it <= iterations; ++it) {
    for (int j = 0; j < C; ++j) {
      lc[j] = Clamp(lc[j] + std::log(Clamp(SampleStd(X.data() + j, R, C), kStdMin, kStdMax)),
                    kLogMin, kLogMax);
      ec[j] = std::exp(lc[j]);
    }
    Apply(M, R, C, ec.data(), er.data(), X.data());
    for (int i = 0; i < R; ++i) {
      const float s = SampleStd(X.data() + static_cast<size_t>(i) * C, C, 1);
      lr[i] = Clamp(lr[i] + std::log(Clamp(s, kStdMin, kStdMax)), kLogMin, kLogMax);
      er[i] = std::exp(lr[i]);
    }
    Apply(M, R, C, ec.data(), er.data(), X.data());
    const float imb = Imbalance(X.data(), R, C);
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
