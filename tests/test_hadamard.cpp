// The Hadamard rotation (docs/FORMAT.md section 3): the fast transform of the CPU backend equals
// the documented orthonormal matrix (Sylvester; Paley x Sylvester for D 80 and 96), and
// kvarn_rotate applies it for every dtype pair and in place.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <vector>

#include "backends/cpu/hadamard.h"
#include "kvarn/kvarn.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"
#include "support/rng.h"

namespace {

// The matrix the fast transform applies: row i is e_i H (x H with x a unit vector).
std::vector<float> TransformMatrix(int n) {
  std::vector<float> m(static_cast<size_t>(n) * n, 0.f);
  for (int i = 0; i < n; ++i) {
    float* row = m.data() + static_cast<size_t>(i) * n;
    row[i] = 1.f;
    kvarn::cpu::HadamardInPlace(row, n);
  }
  return m;
}

class HadamardMatrix : public ::testing::TestWithParam<int> {};

TEST_P(HadamardMatrix, EqualsDocumentedMatrixEntryByEntry) {
  const int n = GetParam();
  const std::vector<float> h = TransformMatrix(n);
  const std::vector<int> syl = kvt::RotationMatrix(n);
  const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (size_t e = 0; e < h.size(); ++e) {
    ASSERT_EQ(h[e], syl[e] * s) << "entry (" << e / n << ", " << e % n << ")";
  }
}

TEST_P(HadamardMatrix, IsSymmetric) {
  const int n = GetParam();
  const std::vector<float> h = TransformMatrix(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < i; ++j) {
      ASSERT_EQ(h[static_cast<size_t>(i) * n + j], h[static_cast<size_t>(j) * n + i]);
    }
  }
}

TEST_P(HadamardMatrix, IsOrthonormal) {
  const int n = GetParam();
  const std::vector<float> h = TransformMatrix(n);
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j <= i; ++j) {
      double dot = 0;
      for (int k = 0; k < n; ++k) {
        dot += static_cast<double>(h[static_cast<size_t>(i) * n + k]) *
               h[static_cast<size_t>(j) * n + k];
      }
      worst = std::max(worst, std::fabs(dot - (i == j ? 1.0 : 0.0)));
    }
  }
  EXPECT_LT(worst, 1e-6);
}

TEST_P(HadamardMatrix, IsAnInvolution) {
  const int n = GetParam();
  KVT_SEEDED_RNG(rng, n);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> x(n);
    for (float& v : x) v = static_cast<float>(rng.Normal() * std::exp(3 * rng.Normal()));
    std::vector<float> y = x;
    kvarn::cpu::HadamardInPlace(y.data(), n);
    kvarn::cpu::HadamardInPlace(y.data(), n);
    EXPECT_LT(kvt::RelL2(y, x), 1e-6);
  }
}

TEST_P(HadamardMatrix, PreservesNorms) {
  const int n = GetParam();
  KVT_SEEDED_RNG(rng, n);
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(rng.Normal());
  std::vector<float> y = x;
  kvarn::cpu::HadamardInPlace(y.data(), n);
  double nx = 0, ny = 0;
  for (int i = 0; i < n; ++i) {
    nx += static_cast<double>(x[i]) * x[i];
    ny += static_cast<double>(y[i]) * y[i];
  }
  EXPECT_NEAR(std::sqrt(ny), std::sqrt(nx), 1e-6 * std::sqrt(nx));
}

INSTANTIATE_TEST_SUITE_P(HeadDims, HadamardMatrix, ::testing::Values(64, 80, 96, 128, 256, 512),
                         [](const auto& p) { return "D" + std::to_string(p.param); });
INSTANTIATE_TEST_SUITE_P(SmallOrders, HadamardMatrix, ::testing::Values(1, 2, 4, 8, 16, 32),
                         [](const auto& p) { return "N" + std::to_string(p.param); });

// The Paley factors as docs/FORMAT.md section 3 prints them (row i, '+' = +1, '-' = -1), copied
// from the page: the test's construction and the library's must both reproduce them.
const char* const kPaley12[] = {
    "-+++++++++++", "+++-+++---+-", "++-+++---+-+", "+-+++---+-++", "++++---+-++-", "+++---+-++-+",
    "++---+-++-++", "+---+-++-+++", "+--+-++-+++-", "+-+-++-+++--", "++-++-+++---", "+-++-+++---+",
};
const char* const kPaley20[] = {
    "-+++++++++++++++++++", "+++--++++-+-+----++-", "++--++++-+-+----++-+", "+--++++-+-+----++-++",
    "+-++++-+-+----++-++-", "+++++-+-+----++-++--", "++++-+-+----++-++--+", "+++-+-+----++-++--++",
    "++-+-+----++-++--+++", "+-+-+----++-++--++++", "++-+----++-++--++++-", "+-+----++-++--++++-+",
    "++----++-++--++++-+-", "+----++-++--++++-+-+", "+---++-++--++++-+-+-", "+--++-++--++++-+-+--",
    "+-++-++--++++-+-+---", "+++-++--++++-+-+----", "++-++--++++-+-+----+", "+-++--++++-+-+----++",
};

TEST(HadamardPaley, FactorsMatchTheTablesOfTheFormatPage) {
  for (int D : {80, 96}) {
    const int m = D == 80 ? 20 : 12;
    const char* const* table = D == 80 ? kPaley20 : kPaley12;
    const std::vector<int> P = kvt::PaleyMatrix(m);
    const kvarn::cpu::RotationFactors f = kvarn::cpu::RotationFactorsFor(D);
    ASSERT_EQ(f.m, m);
    ASSERT_EQ(f.p, D / m);
    for (int i = 0; i < m; ++i) {
      ASSERT_EQ(std::strlen(table[i]), static_cast<size_t>(m));
      for (int j = 0; j < m; ++j) {
        const int want = table[i][j] == '+' ? 1 : -1;
        EXPECT_EQ(P[static_cast<size_t>(i) * m + j], want)
            << "test P_" << m << " (" << i << ", " << j << ")";
        EXPECT_EQ(f.paley[static_cast<size_t>(i) * m + j], want)
            << "library P_" << m << " (" << i << ", " << j << ")";
      }
    }
  }
}

TEST(HadamardPaley, FactorsAreSymmetricHadamardMatrices) {
  // P P^T = m I and P = P^T: what makes H_D orthonormal and its own inverse.
  for (int m : {12, 20}) {
    const std::vector<int> P = kvt::PaleyMatrix(m);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < m; ++j) {
        int dot = 0;
        for (int k = 0; k < m; ++k)
          dot += P[static_cast<size_t>(i) * m + k] * P[static_cast<size_t>(j) * m + k];
        EXPECT_EQ(dot, i == j ? m : 0) << "P_" << m << " rows " << i << ", " << j;
        EXPECT_EQ(P[static_cast<size_t>(i) * m + j], P[static_cast<size_t>(j) * m + i]);
      }
    }
  }
}

TEST(HadamardPaley, EveryOutputMixesEveryChannel) {
  // The point of a full Hadamard (not block-diagonal): an outlier in any one channel spreads
  // evenly over all D outputs.
  for (int D : {80, 96}) {
    for (int i = 0; i < D; ++i) {
      std::vector<float> e(D, 0.f);
      e[i] = 1.f;
      kvarn::cpu::HadamardInPlace(e.data(), D);
      const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
      for (int j = 0; j < D; ++j) ASSERT_EQ(std::fabs(e[j]), s) << "D" << D << " channel " << i;
    }
  }
}

// ---- kvarn_rotate ---------------------------------------------------------------------------

struct RotateParam {
  int D;
  kvarn_dtype_t in, out;
};

void PrintTo(const RotateParam& p, std::ostream* os) {
  *os << "D" << p.D << " dtype " << p.in << " -> " << p.out;
}

const char* DtypeName(kvarn_dtype_t t) {
  return t == KVARN_DTYPE_F32 ? "f32" : t == KVARN_DTYPE_F16 ? "f16" : "bf16";
}

std::vector<RotateParam> RotateParams() {
  std::vector<RotateParam> v;
  for (int D : {64, 80, 96, 128, 256, 512}) {
    for (kvarn_dtype_t i : {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
      for (kvarn_dtype_t o : {KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16}) {
        v.push_back({D, i, o});
      }
    }
  }
  return v;
}

class Rotate : public ::testing::TestWithParam<RotateParam> {};

// Checks out (of dtype p.out) against the exact product of the rows of in (of dtype p.in).
void CheckRotation(const RotateParam& p, const std::vector<float>& x_in, const void* out,
                   size_t rows) {
  const int D = p.D;
  const std::vector<double> got = kvt::Decode(out, rows * D, p.out);
  size_t off_by_one = 0;
  for (size_t r = 0; r < rows; ++r) {
    std::vector<double> exact(x_in.begin() + r * D, x_in.begin() + (r + 1) * D);
    kvt::HadamardDouble(exact.data(), D);
    double norm = 0;
    for (double e : exact) norm += e * e;
    norm = std::sqrt(norm);
    for (int d = 0; d < D; ++d) {
      const double g = got[r * D + d], e = exact[d];
      // fp32 butterflies: error <= log2(D) * eps * ||x||; for D = m * p (80, 96) the m - 1
      // sequential adds of the Paley factor add about (m - 1) * eps * ||x|| (m = 20, 12); then one
      // rounding to the out dtype.
      const double fp32_err = (D == 80 ? 24 : D == 96 ? 16 : 12) * 0x1p-24 * norm;
      const double ulp = p.out == KVARN_DTYPE_F16    ? kvt::HalfUlp(e)
                         : p.out == KVARN_DTYPE_BF16 ? kvt::Bf16Ulp(e)
                                                     : 0.0;
      ASSERT_LE(std::fabs(g - e), fp32_err + ulp)
          << "row " << r << " channel " << d << " got " << g << " exact " << e;
      if (p.out != KVARN_DTYPE_F32) {
        const double rounded = p.out == KVARN_DTYPE_F16 ? kvt::HalfToDouble(kvt::DoubleToHalf(e))
                                                        : kvt::Bf16ToDouble(kvt::DoubleToBf16(e));
        if (g != rounded) ++off_by_one;
      }
    }
  }
  // Rounding the fp32 result instead of the exact one changes only near-ties.
  EXPECT_LE(off_by_one, rows * D / 50) << "too many values not rounded to the nearest";
}

TEST_P(Rotate, MatchesExactProductForDtypes) {
  const RotateParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const size_t rows = 300;  // more than one chunk of rows
  std::vector<float> x = kvt::MakeTokens(rng, static_cast<int>(rows), p.D, kvt::KVShape{});
  x = kvt::RoundTo(x, p.in);
  const std::vector<uint8_t> in = kvt::Encode(x, p.in);
  std::vector<uint8_t> out(rows * p.D * kvt::DtypeBytes(p.out), 0xEE);
  KVT_ASSERT_OK(kvarn_rotate(ctx.get(), p.D, rows, p.in, in.data(), p.out, out.data()));
  CheckRotation(p, x, out.data(), rows);
}

// In place: equal in and out dtypes.
class RotateInPlace : public ::testing::TestWithParam<RotateParam> {};

TEST_P(RotateInPlace, EqualsOutOfPlace) {
  const RotateParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  const size_t rows = 513;
  std::vector<float> x = kvt::RoundTo(kvt::MakeTokens(rng, rows, p.D, kvt::KVShape{}), p.in);
  std::vector<uint8_t> buf = kvt::Encode(x, p.in);
  std::vector<uint8_t> out(buf.size());
  KVT_ASSERT_OK(kvarn_rotate(ctx.get(), p.D, rows, p.in, buf.data(), p.out, out.data()));
  KVT_ASSERT_OK(kvarn_rotate(ctx.get(), p.D, rows, p.in, buf.data(), p.out, buf.data()));
  EXPECT_EQ(buf, out);
}

// f32 inputs, any output dtype.
class RotateF32 : public ::testing::TestWithParam<RotateParam> {};

TEST(RotateEdges, RotatingTwiceRestoresInput) {
  KVT_SEEDED_RNG(rng, 0);
  auto ctx = kvt::MakeCpuContext();
  for (int D : {64, 80, 96, 128, 256, 512}) {
    const size_t rows = 64;
    const std::vector<float> x = kvt::MakeTokens(rng, rows, D, kvt::KVShape{});
    std::vector<float> y = x;
    KVT_ASSERT_OK(
        kvarn_rotate(ctx.get(), D, rows, KVARN_DTYPE_F32, y.data(), KVARN_DTYPE_F32, y.data()));
    KVT_ASSERT_OK(
        kvarn_rotate(ctx.get(), D, rows, KVARN_DTYPE_F32, y.data(), KVARN_DTYPE_F32, y.data()));
    for (size_t r = 0; r < rows; ++r) {
      std::vector<float> a(x.begin() + r * D, x.begin() + (r + 1) * D);
      std::vector<float> b(y.begin() + r * D, y.begin() + (r + 1) * D);
      EXPECT_LT(kvt::RelL2(b, a), 1e-6) << "D" << D << " row " << r;
    }
  }
}

TEST_P(RotateF32, IndependentOfBatchingAndThreads) {
  // A row's result does not depend on the rows around it or on the thread count.
  const RotateParam p = GetParam();
  KVT_SEEDED_RNG(rng, 0);
  const size_t rows = 700;
  const std::vector<float> x = kvt::MakeTokens(rng, rows, p.D, kvt::KVShape{});
  const size_t ob = kvt::DtypeBytes(p.out) * p.D;
  std::vector<uint8_t> all(rows * ob);
  auto ctx1 = kvt::MakeCpuContext(1);
  KVT_ASSERT_OK(kvarn_rotate(ctx1.get(), p.D, rows, p.in, x.data(), p.out, all.data()));
  for (int threads : {2, 5}) {
    auto ctx = kvt::MakeCpuContext(threads);
    std::vector<uint8_t> again(all.size());
    KVT_ASSERT_OK(kvarn_rotate(ctx.get(), p.D, rows, p.in, x.data(), p.out, again.data()));
    EXPECT_EQ(again, all) << threads << " threads";
  }
  std::vector<uint8_t> one(ob);
  for (size_t r : {size_t{0}, size_t{255}, size_t{256}, rows - 1}) {
    KVT_ASSERT_OK(kvarn_rotate(ctx1.get(), p.D, 1, p.in, x.data() + r * p.D, p.out, one.data()));
    EXPECT_EQ(std::memcmp(one.data(), all.data() + r * ob, ob), 0) << "row " << r;
  }
}

std::string RotateName(const ::testing::TestParamInfo<RotateParam>& p) {
  return "D" + std::to_string(p.param.D) + "_" + DtypeName(p.param.in) + "_to_" +
         DtypeName(p.param.out);
}

std::vector<RotateParam> RotateParamsWhere(bool (*keep)(const RotateParam&)) {
  std::vector<RotateParam> v;
  for (const RotateParam& p : RotateParams()) {
    if (keep(p)) v.push_back(p);
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, Rotate, ::testing::ValuesIn(RotateParams()), RotateName);
INSTANTIATE_TEST_SUITE_P(SameDtype, RotateInPlace,
                         ::testing::ValuesIn(RotateParamsWhere([](const RotateParam& p) {
                           return p.in == p.out;
                         })),
                         RotateName);
INSTANTIATE_TEST_SUITE_P(F32In, RotateF32,
                         ::testing::ValuesIn(RotateParamsWhere([](const RotateParam& p) {
                           return p.in == KVARN_DTYPE_F32;
                         })),
                         RotateName);

TEST(RotateEdges, ZeroRowsIsANoOp) {
  auto ctx = kvt::MakeCpuContext();
  KVT_EXPECT_OK(
      kvarn_rotate(ctx.get(), 128, 0, KVARN_DTYPE_F32, nullptr, KVARN_DTYPE_F32, nullptr));
}

TEST(RotateEdges, UnitVectorsGiveScaledMatrixRows) {
  // The public call applies the same matrix (rows of H for unit vectors, exact in f32).
  auto ctx = kvt::MakeCpuContext();
  for (int D : {64, 80, 96, 128, 256, 512}) {
    std::vector<float> eye(static_cast<size_t>(D) * D, 0.f);
    for (int i = 0; i < D; ++i) eye[static_cast<size_t>(i) * D + i] = 1.f;
    KVT_ASSERT_OK(
        kvarn_rotate(ctx.get(), D, D, KVARN_DTYPE_F32, eye.data(), KVARN_DTYPE_F32, eye.data()));
    const std::vector<int> syl = kvt::RotationMatrix(D);
    const float s = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
    for (size_t e = 0; e < eye.size(); ++e) ASSERT_EQ(eye[e], syl[e] * s) << "D" << D << " " << e;
  }
}

}  // namespace
