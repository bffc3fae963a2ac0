// Highway (Debian libhwy-dev 1.0.3) against libkvarn's hand-written intrinsics on the hottest
// quantize kernel: one column pass of the normalization (Y = M / ec with the exact reciprocal
// division, row deviations of Y / er in the fixed double order) on a 128 x 128 tile, AVX-512.
// Not part of the build (the library does not depend on Highway); the decision it supports is
// recorded in bench/RESULTS.md. Build and run:
//   g++ -O3 -std=c++17 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512cd -mfma -mf16c -mbmi \
//       -mbmi2 -mlzcnt -mpclmul -maes -mmovbe -ffp-contract=off -Wno-maybe-uninitialized -I. \
//       -Icapi/include bench/cpu/hwy_compare.cpp -o /tmp/hwy_compare -lhwy && /tmp/hwy_compare
// (Without the BMI/LZCNT/PCLMUL/AES/AVX512CD flags Highway 1.0.3's static target silently drops
// to SSSE3, whose MulAdd is not fused: the result is then neither fast nor bit-identical.)
#include <hwy/highway.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/simd/kernels_avx512.cpp"

namespace hn = hwy::HWY_NAMESPACE;

namespace {

double Combine8(const double* l) {
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// The same algorithm written with Highway ops (static target = AVX3 with these flags).
void HwyColumnPass(const float* M, int R, int C, const float* ec, const float* er, float* Y,
                   float* row_std) {
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<double> dd;
  const hn::Half<decltype(df)> dh;
  const size_t N = hn::Lanes(df);
  std::vector<float> rc(C), x1(C);
  for (int j = 0; j < C; ++j) rc[j] = 1.f / ec[j];
  for (int i = 0; i < R; ++i) {
    const auto b = hn::Set(df, er[i]), r = hn::Set(df, 1.f / er[i]);
    for (int j = 0; j < C; j += static_cast<int>(N)) {
      const auto a = hn::LoadU(df, M + i * C + j), bb = hn::LoadU(df, ec + j);
      const auto rr = hn::LoadU(df, rc.data() + j);
      auto q = hn::Mul(a, rr);
      q = hn::MulAdd(hn::NegMulAdd(q, bb, a), rr, q);
      hn::StoreU(q, df, Y + i * C + j);
      auto q2 = hn::Mul(q, r);
      q2 = hn::MulAdd(hn::NegMulAdd(q2, b, q), r, q2);
      hn::StoreU(q2, df, x1.data() + j);
    }
    auto acc = hn::Zero(dd);
    for (int j = 0; j < C; j += 8)
      acc = hn::Add(acc, hn::PromoteTo(dd, hn::LoadU(dh, x1.data() + j)));
    alignas(64) double l[8];
    hn::Store(acc, dd, l);
    const auto m = hn::Set(dd, Combine8(l) / C);
    acc = hn::Zero(dd);
    for (int j = 0; j < C; j += 8) {
      const auto d = hn::Sub(hn::PromoteTo(dd, hn::LoadU(dh, x1.data() + j)), m);
      acc = hn::Add(acc, hn::Mul(d, d));
    }
    hn::Store(acc, dd, l);
    row_std[i] = static_cast<float>(std::sqrt(Combine8(l) / (C - 1)));
  }
}

template <typename Fn>
double Time(Fn fn) {
  double best = 1e9;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < 2000; ++k) fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / 2000;
}

}  // namespace

int main() {
  const int R = 128, C = 128;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> M(R * C), ec(C), er(R), Y1(R * C), Y2(R * C), s1(R), s2(R);
  for (auto& x : M) x = nd(rng);
  for (auto& x : ec) x = std::exp(0.3f * nd(rng));
  for (auto& x : er) x = std::exp(0.3f * nd(rng));
  const auto& k = *kvarn::cpu::Avx512Kernels();
  const double t_intr =
      Time([&] { k.column_pass(M.data(), R, C, ec.data(), er.data(), Y1.data(), s1.data()); });
  const double t_hwy =
      Time([&] { HwyColumnPass(M.data(), R, C, ec.data(), er.data(), Y2.data(), s2.data()); });
  const bool same = std::memcmp(Y1.data(), Y2.data(), Y1.size() * 4) == 0 &&
                    std::memcmp(s1.data(), s2.data(), s1.size() * 4) == 0;
  std::printf("target %s lanes %d\n", hwy::TargetName(HWY_STATIC_TARGET),
              (int)hn::Lanes(hn::ScalableTag<float>()));
  std::printf("Y same %d, std same %d\n", std::memcmp(Y1.data(), Y2.data(), Y1.size() * 4) == 0,
              std::memcmp(s1.data(), s2.data(), s1.size() * 4) == 0);
  std::printf(
      "column pass 128x128, AVX-512: intrinsics %.2f us, Highway %.2f us (x%.2f), bit-identical: "
      "%s\n",
      t_intr * 1e6, t_hwy * 1e6, t_hwy / t_intr, same ? "yes" : "no");
  return same ? 0 : 1;
}
