// The CPU kernels written once over a small vector-traits type V and compiled once per ISA level
// (kernels_avx2.cpp, kernels_avx512.cpp, kernels_neon.cpp include this file after defining V and
// KVARN_SIMD_NS). Everything here has internal linkage inside a per-ISA namespace, and uses no
// standard-library templates that could be emitted out of line, so no ISA-specific code can leak
// into another translation unit through the linker (ODR).
//
// Exactness: the quantization entries reproduce the scalar reference bit for bit (docs/FORMAT.md,
// "Numerics"): every per-element operation is one IEEE operation in either implementation; the
// double-precision row sums use the reference's eight lanes (element i in lane i % 8) and its
// combine order; column sums run over the rows in order; divisions by a per-row or per-column
// scale inside the iterations use the correctly rounded reciprocal r = RN(1/b) and one Markstein
// correction, q = RN(a r), e = a - q b (exact, FMA), RN(q + e r), which equals RN(a / b) for
// every finite a, b (Markstein 1990; checked exhaustively over all significands of a for
// thousands of divisors b in the range the normalization produces). Its result may differ from
// a division only in the sign of a zero, which the deviations do not see; the balanced tile B
// that the codes and zeros come from uses true divisions.
//
// Attention (section 9) runs on the packed codes with the scales folded, an fp32 online softmax
// and FMA; it matches the reference within docs/FORMAT.md section 10's tolerance, not bit for bit.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backends/cpu/hadamard.h"
#include "backends/cpu/kernels.h"

#ifndef KVARN_SIMD_NS
#error "define KVARN_SIMD_NS and the traits type V before including kernels_impl.h"
#endif

namespace kvarn {
namespace cpu {
namespace KVARN_SIMD_NS {
namespace {

using F = V::F;
using Dv = V::D;  // eight doubles
constexpr int N = V::N;
constexpr int kMaxDim = 512;  // the largest D or G

// ---- normalization --------------------------------------------------------------------------

// RN(a / b) from r = RN(1 / b) (see the header comment).
inline F DivR(F a, F b, F r) {
  const F q = V::Mul(a, r);
  const F e = V::NegMulAdd(q, b, a);  // a - q b, exact
  return V::MulAdd(e, r, q);
}

inline double Combine8(Dv acc) {
  alignas(64) double l[8];
  V::DStore(l, acc);
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// Unbiased deviations of 4 contiguous rows of n floats (n a multiple of 8), each in the
// reference's 8-lane order; the four rows are independent chains so the adds overlap.
inline void RowStd4(const float* x0, const float* x1, const float* x2, const float* x3, int n,
                    float* out) {
  Dv a0 = V::DZero(), a1 = V::DZero(), a2 = V::DZero(), a3 = V::DZero();
  for (int i = 0; i < n; i += 8) {
    a0 = V::DAdd(a0, V::DFromFloats(x0 + i));
    a1 = V::DAdd(a1, V::DFromFloats(x1 + i));
    a2 = V::DAdd(a2, V::DFromFloats(x2 + i));
    a3 = V::DAdd(a3, V::DFromFloats(x3 + i));
  }
  const Dv m0 = V::DSet1(Combine8(a0) / n), m1 = V::DSet1(Combine8(a1) / n);
  const Dv m2 = V::DSet1(Combine8(a2) / n), m3 = V::DSet1(Combine8(a3) / n);
  a0 = a1 = a2 = a3 = V::DZero();
  for (int i = 0; i < n; i += 8) {
    const Dv d0 = V::DSub(V::DFromFloats(x0 + i), m0);
    const Dv d1 = V::DSub(V::DFromFloats(x1 + i), m1);
    const Dv d2 = V::DSub(V::DFromFloats(x2 + i), m2);
    const Dv d3 = V::DSub(V::DFromFloats(x3 + i), m3);
    a0 = V::DAddOnFma(a0, V::DMul(d0, d0));
    a1 = V::DAddOnFma(a1, V::DMul(d1, d1));
    a2 = V::DAddOnFma(a2, V::DMul(d2, d2));
    a3 = V::DAddOnFma(a3, V::DMul(d3, d3));
  }
  out[0] = static_cast<float>(std::sqrt(Combine8(a0) / (n - 1)));
  out[1] = static_cast<float>(std::sqrt(Combine8(a1) / (n - 1)));
  out[2] = static_cast<float>(std::sqrt(Combine8(a2) / (n - 1)));
  out[3] = static_cast<float>(std::sqrt(Combine8(a3) / (n - 1)));
}

// Column deviations of X (R x C) for the kB * 8 columns from j0: per column, the sum over the rows
// in order, the mean, then the squared deviations over the rows in order, all in double. The
// block stays in registers while the rows stream by.
template <int kB>
void ColumnStdsBlock(const float* X, int R, int C, int j0, float* out) {
  Dv s[kB], m[kB];
  for (int b = 0; b < kB; ++b) s[b] = V::DZero();
  for (int i = 0; i < R; ++i) {
    const float* row = X + static_cast<size_t>(i) * C + j0;
    for (int b = 0; b < kB; ++b) s[b] = V::DAdd(s[b], V::DFromFloats(row + 8 * b));
  }
  const Dv rn = V::DSet1(static_cast<double>(R));
  for (int b = 0; b < kB; ++b) {
    m[b] = V::DDiv(s[b], rn);  // the mean
    s[b] = V::DZero();
  }
  for (int i = 0; i < R; ++i) {
    const float* row = X + static_cast<size_t>(i) * C + j0;
    for (int b = 0; b < kB; ++b) {
      const Dv d = V::DSub(V::DFromFloats(row + 8 * b), m[b]);
      s[b] = V::DAddOnFma(s[b], V::DMul(d, d));
    }
  }
  alignas(64) double ss[8 * kB];
  for (int b = 0; b < kB; ++b) V::DStore(ss + 8 * b, s[b]);
  for (int j = 0; j < 8 * kB; ++j) out[j0 + j] = static_cast<float>(std::sqrt(ss[j] / (R - 1)));
}

// Column deviations of X (R x C, C a multiple of 8) in blocks of 32 columns, then the 8, 16 or 24
// left over when C is not a multiple of 32 (the V tile of D = 80).
void ColumnStdsV(const float* X, int R, int C, float* out) {
  int j0 = 0;
  for (; j0 + 32 <= C; j0 += 32) ColumnStdsBlock<4>(X, R, C, j0, out);
  switch ((C - j0) / 8) {
    case 3:
      ColumnStdsBlock<3>(X, R, C, j0, out);
      break;
    case 2:
      ColumnStdsBlock<2>(X, R, C, j0, out);
      break;
    case 1:
      ColumnStdsBlock<1>(X, R, C, j0, out);
      break;
    default:
      break;
  }
}

void Stats(const float* X, int R, int C, float* col_std, float* row_std) {
  ColumnStdsV(X, R, C, col_std);
  for (int i = 0; i < R; i += 4) {
    const float* r0 = X + static_cast<size_t>(i) * C;
    RowStd4(r0, r0 + C, r0 + 2 * C, r0 + 3 * C, C, row_std + i);
  }
}

void ColumnPass(const float* M, int R, int C, const float* ec, const float* er, float* Y,
                float* row_std) {
  alignas(64) float rc[kMaxDim];
  alignas(64) float x1[4][kMaxDim];
  for (int j = 0; j < C; ++j) rc[j] = 1.f / ec[j];
  for (int i = 0; i < R; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const size_t o = static_cast<size_t>(i + k) * C;
      const F b = V::Set1(er[i + k]), r = V::Set1(1.f / er[i + k]);
      for (int j = 0; j < C; j += N) {
        const F y = DivR(V::Load(M + o + j), V::Load(ec + j), V::Load(rc + j));
        V::Store(Y + o + j, y);
        V::Store(x1[k] + j, DivR(y, b, r));
      }
    }
    RowStd4(x1[0], x1[1], x1[2], x1[3], C, row_std + i);
  }
}

void RowPass(const float* Y, int R, int C, const float* er, float* X, float* col_std,
             float* row_std) {
  for (int i = 0; i < R; i += 4) {
    for (int k = 0; k < 4; ++k) {
      const size_t o = static_cast<size_t>(i + k) * C;
      const F b = V::Set1(er[i + k]), r = V::Set1(1.f / er[i + k]);
      for (int j = 0; j < C; j += N) V::Store(X + o + j, DivR(V::Load(Y + o + j), b, r));
    }
    const float* r0 = X + static_cast<size_t>(i) * C;
    RowStd4(r0, r0 + C, r0 + 2 * C, r0 + 3 * C, C, row_std + i);
  }
  ColumnStdsV(X, R, C, col_std);
}

void BalanceRtn(const float* M, int R, int C, const float* s_c, const float* s_r, int bits,
                float* B, uint8_t* codes, float* lo, float* step) {
  const float qmax = static_cast<float>((1 << bits) - 1);
  const F vq = V::Set1(qmax), zero = V::Set1(0.f);
  for (int i = 0; i < R; ++i) {
    const size_t o = static_cast<size_t>(i) * C;
    const F sr = V::Set1(s_r[i]);
    F mn = V::Set1(INFINITY), mx = V::Set1(-INFINITY);
    for (int j = 0; j < C; j += N) {
      const F b = V::Div(V::Div(V::Load(M + o + j), V::Load(s_c + j)), sr);
      V::Store(B + o + j, b);
      mn = V::Min(mn, b);
      mx = V::Max(mx, b);
    }
    float lo_i = V::ReduceMin(mn);
    const float hi_i = V::ReduceMax(mx);
    if (lo_i == 0.f) {
      // The reference keeps the first of equal minima: with a zero minimum its sign is the sign
      // of the first zero in the row (it reaches z = s_r * lo).
      for (int j = 0; j < C; ++j) {
        if (B[o + j] == 0.f) {
          lo_i = B[o + j];
          break;
        }
      }
    }
    const float d = (hi_i - lo_i) / qmax;
    const float s = d < 1e-10f ? 1e-10f : d;  // std::max(d, 1e-10f)
    lo[i] = lo_i;
    step[i] = s;
    const F vlo = V::Set1(lo_i), vs = V::Set1(s);
    for (int j = 0; j < C; j += N) {
      const F q = V::Round(V::Div(V::Sub(V::Load(B + o + j), vlo), vs));
      V::StoreCodes(codes + o + j, V::Min(V::Max(q, zero), vq));
    }
  }
}

void PackRowsV(const uint8_t* codes, int R, int C, int bits, uint8_t* out) {
  const size_t n = static_cast<size_t>(R) * C;
  if (bits == 8) {
    std::memcpy(out, codes, n);
  } else if (bits == 4) {
    for (size_t j = 0; j < n / 2; ++j) {
      out[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
    }
  } else {
    for (size_t j = 0; j < n / 4; ++j) {
      out[j] = static_cast<uint8_t>(codes[4 * j] | (codes[4 * j + 1] << 2) |
                                    (codes[4 * j + 2] << 4) | (codes[4 * j + 3] << 6));
    }
  }
}

// One packed row of C codes -> C bytes (natural order).
inline void UnpackRow(const uint8_t* packed, int C, int bits, uint8_t* out) {
  if (bits == 8) {
    std::memcpy(out, packed, static_cast<size_t>(C));
  } else if (bits == 4) {
    for (int j = 0; j < C / 2; ++j) {
      out[2 * j] = packed[j] & 15;
      out[2 * j + 1] = packed[j] >> 4;
    }
  } else {
    for (int j = 0; j < C / 4; ++j) {
      for (int k = 0; k < 4; ++k) out[4 * j + k] = (packed[j] >> (2 * k)) & 3;
    }
  }
}

// (code * a + z) * c, each operation rounded on its own as in the reference.
void DequantizeRecordV(const RecordView& rec, int D, int G, int key_bits, int value_bits, float* k,
                       float* v) {
  alignas(64) uint8_t codes[kMaxDim + 64];
  alignas(64) float vals[kMaxDim];
  if (k != nullptr) {
    const int row_bytes = G * key_bits / 8;
    for (int d = 0; d < D; ++d) {
      UnpackRow(rec.k_codes + static_cast<size_t>(d) * row_bytes, G, key_bits, codes);
      const F a = V::Set1(rec.ka[d]), z = V::Set1(rec.kz[d]);
      for (int t = 0; t < G; t += N) {
        const F c = V::CodesToFloat<8>(V::LoadBytesAsI32(codes + t), 0);
        V::Store(vals + t, V::Mul(V::Add(V::Mul(c, a), z), V::Load(rec.kc + t)));
      }
      for (int t = 0; t < G; ++t) k[static_cast<size_t>(t) * D + d] = vals[t];
    }
  }
  if (v != nullptr) {
    const int row_bytes = D * value_bits / 8;
    for (int t = 0; t < G; ++t) {
      UnpackRow(rec.v_codes + static_cast<size_t>(t) * row_bytes, D, value_bits, codes);
      const F a = V::Set1(rec.va[t]), z = V::Set1(rec.vz[t]);
      float* out = v + static_cast<size_t>(t) * D;
      for (int d = 0; d < D; d += N) {
        const F c = V::CodesToFloat<8>(V::LoadBytesAsI32(codes + d), 0);
        V::Store(out + d, V::Mul(V::Add(V::Mul(c, a), z), V::Load(rec.vc + d)));
      }
    }
  }
}

// ---- rotation and conversions ---------------------------------------------------------------

// The reference's butterflies (backends/cpu/hadamard.h), bit for bit. Power-of-two n: strides
// 1, 2, 4, ... (strides below N inside each vector). n = m * p (80, 96): the reference's group
// transforms, then the Paley factor with the lanes over output channels: lane l of the chunk at
// d0 adds P[a][(d0 + l) / p] * (channel (d0 + l) % p of group a), for a = 0, 1, ... in order.
// Then the scale 1/sqrt(n) as one rounded multiply.
void Hadamard(float* x, int n) {
  const RotationFactors f = RotationFactorsFor(n);
  if (f.m == 1) {
    for (int i = 0; i < n; i += N) V::Store(x + i, V::ButterfliesInVector(V::Load(x + i)));
    for (int h = N; h < n; h *= 2) {
      for (int i = 0; i < n; i += 2 * h) {
        for (int j = i; j < i + h; j += N) {
          const F a = V::Load(x + j), b = V::Load(x + j + h);
          V::Store(x + j, V::Add(a, b));
          V::Store(x + j + h, V::Sub(a, b));
        }
      }
    }
  } else {
    for (int a = 0; a < f.m; ++a) SylvesterButterflies(x + a * f.p, f.p);
    // Group a repeated over kW lanes (kW a multiple of p = 4 or 8, and of N): the chunk at d0
    // reads its lanes from offset d0 % kW.
    constexpr int kW = N > 8 ? N : 8;
    constexpr int kMaxGroups = 20;
    alignas(64) float z[kMaxGroups * kW];
    for (int a = 0; a < f.m; ++a) {
      for (int l = 0; l < kW; ++l) z[a * kW + l] = x[a * f.p + l % f.p];
    }
    for (int d0 = 0; d0 < n; d0 += N) {
      const float* zc = z + d0 % kW;
      F acc = V::Mul(V::Load(f.lane_signs + d0), V::Load(zc));
      for (int a = 1; a < f.m; ++a) {
        acc = V::Add(acc, V::Mul(V::Load(f.lane_signs + a * n + d0), V::Load(zc + a * kW)));
      }
      V::Store(x + d0, acc);
    }
  }
  const F s = V::Set1(static_cast<float>(1.0 / std::sqrt(static_cast<double>(n))));
  for (int i = 0; i < n; i += N) V::Store(x + i, V::Mul(V::Load(x + i), s));
}

inline bool HalvesFinite(const uint16_t* h, size_t n) {
  unsigned bad = 0;
  for (size_t e = 0; e < n; ++e) bad |= (h[e] & 0x7c00u) == 0x7c00u;
  return bad == 0;
}

bool LoadTile(const uint16_t* tile, int G, int D, bool transpose, float* M) {
  if (!HalvesFinite(tile, static_cast<size_t>(G) * D)) return false;
  if (!transpose) {
    for (size_t e = 0; e < static_cast<size_t>(G) * D; e += N)
      V::Store(M + e, V::LoadHalf(tile + e));
    return true;
  }
  // M[d][t] = tile[t][d], 8 tokens at a time through a small fp32 buffer.
  alignas(64) float buf[8][kMaxDim];
  for (int t0 = 0; t0 < G; t0 += 8) {
    for (int k = 0; k < 8; ++k) {
      const uint16_t* src = tile + static_cast<size_t>(t0 + k) * D;
      for (int d = 0; d < D; d += N) V::Store(buf[k] + d, V::LoadHalf(src + d));
    }
    for (int d = 0; d < D; ++d) {
      float* dst = M + static_cast<size_t>(d) * G + t0;
      for (int k = 0; k < 8; ++k) dst[k] = buf[k][d];
    }
  }
  return true;
}

void HalvesToFloats(const uint8_t* in, int n, float* out) {
  for (int i = 0; i < n; i += N) {
    alignas(64) uint16_t h[N];
    std::memcpy(h, in + 2 * i, sizeof h);  // records may sit at any (even) byte offset
    V::Store(out + i, V::LoadHalf(h));
  }
}

void FloatsToHalves(const float* in, int n, uint16_t* out) {
  for (int i = 0; i < n; i += N) V::StoreHalf(out + i, V::Load(in + i));
}

bool ToCacheFrameV(const float* in, int D, bool rotate, float* scratch, uint16_t* out) {
  bool finite = true;
  for (int d = 0; d < D; d += N) {
    const F x = V::Load(in + d);
    finite = finite && V::AllFinite(x);
    V::Store(scratch + d, x);
  }
  if (!finite) return false;
  if (rotate) Hadamard(scratch, D);
  for (int d = 0; d < D; d += N) V::StoreHalf(out + d, V::Load(scratch + d));
  return HalvesFinite(out, static_cast<size_t>(D));
}

// ---- attention ------------------------------------------------------------------------------

// exp(x) for the softmax (x <= 0 here): Cody-Waite reduction and a degree-6 polynomial, relative
// error ~2 ulp; exactly 0 below -87.
inline F Exp(F x) {
  const F lo = V::Set1(-87.f);
  const F xc = V::Max(x, lo);
  const F n = V::Round(V::Mul(xc, V::Set1(1.44269504088896341f)));
  F r = V::NegMulAdd(n, V::Set1(0.693359375f), xc);
  r = V::NegMulAdd(n, V::Set1(-2.12194440e-4f), r);
  F p = V::Set1(1.9875691500e-4f);
  p = V::MulAdd(p, r, V::Set1(1.3981999507e-3f));
  p = V::MulAdd(p, r, V::Set1(8.3334519073e-3f));
  p = V::MulAdd(p, r, V::Set1(4.1665795894e-2f));
  p = V::MulAdd(p, r, V::Set1(1.6666665459e-1f));
  p = V::MulAdd(p, r, V::Set1(5.0000001201e-1f));
  p = V::MulAdd(p, V::Mul(r, r), V::Add(r, V::Set1(1.f)));
  return V::ZeroWhereLess(V::Ldexp(p, n), x, lo);
}

// c * tanh(x / c) as (e - 1) / (e + 1), e = exp(2 x / c), with x / c clamped to [-9, 9] (tanh is
// 1 - 3e-8 there): absolute error ~c * 1e-7, far below the scores' own rounding.
inline F Softcap(F x, float c) {
  const F t = V::Min(V::Max(V::Mul(x, V::Set1(1.f / c)), V::Set1(-9.f)), V::Set1(9.f));
  const F e = Exp(V::Add(t, t));
  return V::Mul(V::Set1(c), V::Div(V::Sub(e, V::Set1(1.f)), V::Add(e, V::Set1(1.f))));
}

// Online-softmax step over scores [G] (already scaled; the query sees [st.lo, st.n_valid), the
// other entries are ignored): softcapped when softcap > 0, then probabilities relative to the
// new max (0 where not seen); returns the old state's factor.
inline float SoftmaxStep(float* scores, int G, float softcap, const AttnQuery& st) {
  if (softcap > 0.f) {
    for (int t = 0; t < G; t += N) V::Store(scores + t, Softcap(V::Load(scores + t), softcap));
  }
  for (int t = 0; t < st.lo; ++t) scores[t] = -INFINITY;
  for (int t = st.n_valid; t < G; ++t) scores[t] = -INFINITY;
  F mv = V::Set1(-INFINITY);
  for (int t = 0; t < G; t += N) mv = V::Max(mv, V::Load(scores + t));
  const float m_new = std::fmax(*st.m, V::ReduceMax(mv));
  const float alpha = *st.m == -INFINITY ? 0.f : std::exp(*st.m - m_new);
  const F m = V::Set1(m_new);
  F sum = V::Set1(0.f);
  for (int t = 0; t < G; t += N) {
    const F p = Exp(V::Sub(V::Load(scores + t), m));
    V::Store(scores + t, p);
    sum = V::Add(sum, p);
  }
  *st.l = *st.l * alpha + V::ReduceAdd(sum);
  *st.m = m_new;
  return alpha;
}

// Codes of one packed row: the N bytes at p expand to kPer = 8 / bits vectors; lane l of vector
// k holds the code at column (l * kPer + k) of the block.
template <int kBits>
inline void ExpandCodes(const uint8_t* p, F* out) {
  constexpr int kPer = 8 / kBits;
  const V::I u = V::LoadBytesAsI32(p);
  for (int k = 0; k < kPer; ++k) out[k] = V::CodesToFloat<kBits>(u, k * kBits);
}

// out[l * kPer + k] = v[k] lane l: the natural column order of codes expanded by ExpandCodes.
template <int kPer>
inline void StoreInterleaved(const F* v, float* out) {
  if (kPer == 1) {
    V::Store(out, v[0]);
  } else if (kPer == 2) {
    F lo, hi;
    V::Zip(v[0], v[1], &lo, &hi);
    V::Store(out, lo);
    V::Store(out + N, hi);
  } else {
    F a_lo, a_hi, b_lo, b_hi, o0, o1;
    V::Zip(v[0], v[2], &a_lo, &a_hi);
    V::Zip(v[1], v[3 % kPer], &b_lo, &b_hi);
    V::Zip(a_lo, b_lo, &o0, &o1);
    V::Store(out, o0);
    V::Store(out + N, o1);
    V::Zip(a_hi, b_hi, &o0, &o1);
    V::Store(out + 2 * N, o0);
    V::Store(out + 3 * N, o1);
  }
}

// Scores of a record tile for up to kQ queries: S[g][t] = sum_d qa[g][d] code[d][t] over all G
// tokens, written to out[g * G + t] in natural token order.
template <int kBits, int kQ>
void KeyScores(const uint8_t* k_codes, int D, int G, const float* qa, int nq, float* out) {
  constexpr int kPer = 8 / kBits;
  const int row_bytes = G * kBits / 8;
  for (int b0 = 0; b0 < row_bytes; b0 += N) {  // N bytes = N * kPer tokens
    F acc[kQ][kPer];
    for (int g = 0; g < kQ; ++g) {
      for (int k = 0; k < kPer; ++k) acc[g][k] = V::Set1(0.f);
    }
    for (int d = 0; d < D; ++d) {
      F c[kPer];
      ExpandCodes<kBits>(k_codes + static_cast<size_t>(d) * row_bytes + b0, c);
      for (int g = 0; g < kQ; ++g) {
        const F w = V::Set1(qa[g * D + d]);
        for (int k = 0; k < kPer; ++k) acc[g][k] = V::MulAdd(w, c[k], acc[g][k]);
      }
    }
    const int t0 = b0 * kPer;
    for (int g = 0; g < nq; ++g)
      StoreInterleaved<kPer>(acc[g], out + static_cast<size_t>(g) * G + t0);
  }
}

// V sums of a record tile for up to kQ queries: out[g][d] = sum_{t < n} pa[g][t] code[t][d]. A row
// of D * kBits / 8 bytes that is not a multiple of N (D = 80, 96) ends in a partial block, read
// through a zero-padded copy and stored through a buffer, so nothing past the row is touched.
template <int kBits, int kQ>
void ValueSums(const uint8_t* v_codes, int D, int n, const float* pa, int G, int nq, float* out) {
  constexpr int kPer = 8 / kBits;
  const int row_bytes = D * kBits / 8;
  alignas(64) uint8_t pad[N] = {};
  for (int b0 = 0; b0 < row_bytes; b0 += N) {
    const int nbytes = row_bytes - b0 < N ? row_bytes - b0 : N;
    F acc[kQ][kPer];
    for (int g = 0; g < kQ; ++g) {
      for (int k = 0; k < kPer; ++k) acc[g][k] = V::Set1(0.f);
    }
    for (int t = 0; t < n; ++t) {
      F c[kPer];
      const uint8_t* src = v_codes + static_cast<size_t>(t) * row_bytes + b0;
      if (nbytes < N) {
        std::memcpy(pad, src, static_cast<size_t>(nbytes));
        src = pad;
      }
      ExpandCodes<kBits>(src, c);
      for (int g = 0; g < kQ; ++g) {
        const F w = V::Set1(pa[g * G + t]);
        for (int k = 0; k < kPer; ++k) acc[g][k] = V::MulAdd(w, c[k], acc[g][k]);
      }
    }
    const int d0 = b0 * kPer;
    for (int g = 0; g < nq; ++g) {
      float* dst = out + static_cast<size_t>(g) * D + d0;
      if (nbytes == N) {
        StoreInterleaved<kPer>(acc[g], dst);
      } else {
        alignas(64) float buf[kPer * N];
        StoreInterleaved<kPer>(acc[g], buf);
        std::memcpy(dst, buf, sizeof(float) * kPer * nbytes);
      }
    }
  }
}

template <int kQ>
void KeyScoresBits(int bits, const uint8_t* k_codes, int D, int G, const float* qa, int nq,
                   float* out) {
  if (bits == 4) {
    KeyScores<4, kQ>(k_codes, D, G, qa, nq, out);
  } else if (bits == 2) {
    KeyScores<2, kQ>(k_codes, D, G, qa, nq, out);
  } else {
    KeyScores<8, kQ>(k_codes, D, G, qa, nq, out);
  }
}

template <int kQ>
void ValueSumsBits(int bits, const uint8_t* v_codes, int D, int n, const float* pa, int G, int nq,
                   float* out) {
  if (bits == 4) {
    ValueSums<4, kQ>(v_codes, D, n, pa, G, nq, out);
  } else if (bits == 2) {
    ValueSums<2, kQ>(v_codes, D, n, pa, G, nq, out);
  } else {
    ValueSums<8, kQ>(v_codes, D, n, pa, G, nq, out);
  }
}

inline float Dot(const float* a, const float* b, int n) {
  F s = V::Set1(0.f);
  for (int i = 0; i < n; i += N) s = V::MulAdd(V::Load(a + i), V::Load(b + i), s);
  return V::ReduceAdd(s);
}

// Queries per pass over a tile's codes: a GQA group of 4 in one pass (two passes of 2 for 2-bit
// codes where 16 vector registers cannot hold 4 x 4 accumulators).
constexpr int kQB = 4;

void AttendRecord(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                  const ScoreParams& sp, AttnQuery* qs, int nq, float* scores, float* vsum) {
  alignas(64) float qa[kQB * kMaxDim];
  alignas(64) float pa[kQB * kMaxDim];
  for (int q0 = 0; q0 < nq; q0 += kQB) {
    // The live queries of this pass (a query that sees no key of the tile is skipped).
    AttnQuery* live[kQB];
    int nl = 0;
    for (int i = q0; i < nq && i < q0 + kQB; ++i) {
      if (qs[i].n_valid > qs[i].lo) live[nl++] = &qs[i];
    }
    if (nl == 0) continue;
    float qz[kQB];
    int n_max = 0;
    for (int g = 0; g < nl; ++g) {
      for (int d = 0; d < D; d += N) {
        V::Store(qa + g * D + d, V::Mul(V::Load(live[g]->q + d), V::Load(rec.ka + d)));
      }
      qz[g] = Dot(live[g]->q, rec.kz, D);
      n_max = live[g]->n_valid > n_max ? live[g]->n_valid : n_max;
    }
    for (int g = nl; g < kQB; ++g) {
      for (int d = 0; d < D; ++d) qa[g * D + d] = 0.f;
    }
    // q'.K'[:,t] = c_t * (sum_d (q_d a_d) code[d,t] + sum_d q_d z_d)
    if (key_bits == 2 && V::kRegs < 32) {
      KeyScoresBits<2>(key_bits, rec.k_codes, D, G, qa, nl < 2 ? nl : 2, scores);
      if (nl > 2) KeyScoresBits<2>(key_bits, rec.k_codes, D, G, qa + 2 * D, nl - 2, scores + 2 * G);
    } else {
      KeyScoresBits<kQB>(key_bits, rec.k_codes, D, G, qa, nl, scores);
    }
    float alpha[kQB], pz[kQB];
    for (int g = 0; g < nl; ++g) {
      float* s = scores + static_cast<size_t>(g) * G;
      const F vs = V::Set1(sp.scale), vqz = V::Set1(qz[g]);
      for (int t = 0; t < G; t += N) {
        V::Store(s + t, V::Mul(V::Mul(vs, V::Load(rec.kc + t)), V::Add(V::Load(s + t), vqz)));
      }
      alpha[g] = SoftmaxStep(s, G, sp.softcap, *live[g]);
      // sum_t p_t V'[t,:] = c' * (sum_t (p_t a'_t) code[t,:] + sum_t p_t z'_t); p_t = 0 outside
      // [lo, n_valid).
      F z = V::Set1(0.f);
      for (int t = 0; t < G; t += N) {
        const F p = V::Load(s + t);
        V::Store(pa + g * G + t, V::Mul(p, V::Load(rec.va + t)));
        z = V::MulAdd(p, V::Load(rec.vz + t), z);
      }
      pz[g] = V::ReduceAdd(z);
    }
    for (int g = nl; g < kQB; ++g) {
      for (int t = 0; t < G; ++t) pa[g * G + t] = 0.f;
    }
    if (value_bits == 2 && V::kRegs < 32) {
      ValueSumsBits<2>(value_bits, rec.v_codes, D, n_max, pa, G, nl < 2 ? nl : 2, vsum);
      if (nl > 2) {
        ValueSumsBits<2>(value_bits, rec.v_codes, D, n_max, pa + 2 * G, G, nl - 2, vsum + 2 * D);
      }
    } else {
      ValueSumsBits<kQB>(value_bits, rec.v_codes, D, n_max, pa, G, nl, vsum);
    }
    for (int g = 0; g < nl; ++g) {
      const F a = V::Set1(alpha[g]), z = V::Set1(pz[g]);
      float* acc = live[g]->acc;
      const float* vs = vsum + static_cast<size_t>(g) * D;
      for (int d = 0; d < D; d += N) {
        const F v = V::Mul(V::Load(rec.vc + d), V::Add(V::Load(vs + d), z));
        V::Store(acc + d, V::MulAdd(V::Load(acc + d), a, v));
      }
    }
  }
}

void AttendPage(const uint16_t* k, const uint16_t* v, int D, int G, const ScoreParams& sp,
                AttnQuery* qs, int nq, float* scores) {
  const float scale = sp.scale;
  for (int q0 = 0; q0 < nq; q0 += kQB) {
    AttnQuery* live[kQB];
    int nl = 0, n_max = 0;
    for (int i = q0; i < nq && i < q0 + kQB; ++i) {
      if (qs[i].n_valid > qs[i].lo) {
        live[nl++] = &qs[i];
        n_max = qs[i].n_valid > n_max ? qs[i].n_valid : n_max;
      }
    }
    if (nl == 0) continue;
    const float* q[kQB];
    for (int g = 0; g < kQB; ++g) q[g] = live[g < nl ? g : 0]->q;
    // Scores: one fp16 key row feeds all live queries.
    for (int t = 0; t < n_max; ++t) {
      const uint16_t* kr = k + static_cast<size_t>(t) * D;
      F s0 = V::Set1(0.f), s1 = s0, s2 = s0, s3 = s0;
      for (int d = 0; d < D; d += N) {
        const F kv = V::LoadHalf(kr + d);
        s0 = V::MulAdd(V::Load(q[0] + d), kv, s0);
        s1 = V::MulAdd(V::Load(q[1] + d), kv, s1);
        s2 = V::MulAdd(V::Load(q[2] + d), kv, s2);
        s3 = V::MulAdd(V::Load(q[3] + d), kv, s3);
      }
      scores[t] = scale * V::ReduceAdd(s0);
      scores[G + t] = scale * V::ReduceAdd(s1);
      scores[2 * G + t] = scale * V::ReduceAdd(s2);
      scores[3 * G + t] = scale * V::ReduceAdd(s3);
    }
    float alpha[kQB];
    for (int g = 0; g < nl; ++g) {
      float* s = scores + static_cast<size_t>(g) * G;
      for (int t = n_max; t < G; ++t) s[t] = 0.f;
      alpha[g] = SoftmaxStep(s, G, sp.softcap, *live[g]);
    }
    for (int g = nl; g < kQB; ++g) {
      for (int t = 0; t < G; ++t) scores[g * G + t] = 0.f;
    }
    // acc = acc * alpha + sum_t p_t v_t, 4 vectors of channels at a time (rows a query does not
    // see have p = 0; rows past n_max are never read: they may hold anything).
    for (int d0 = 0; d0 < D; d0 += 4 * N) {
      const int nv = (D - d0) / N < 4 ? (D - d0) / N : 4;
      F acc[kQB][4];
      for (int g = 0; g < kQB; ++g) {
        for (int c = 0; c < 4; ++c) acc[g][c] = V::Set1(0.f);
      }
      for (int t = 0; t < n_max; ++t) {
        const uint16_t* vr = v + static_cast<size_t>(t) * D + d0;
        for (int c = 0; c < nv; ++c) {
          const F x = V::LoadHalf(vr + c * N);
          for (int g = 0; g < kQB; ++g) {
            acc[g][c] = V::MulAdd(V::Set1(scores[g * G + t]), x, acc[g][c]);
          }
        }
      }
      for (int g = 0; g < nl; ++g) {
        const F a = V::Set1(alpha[g]);
        for (int c = 0; c < nv; ++c) {
          float* o = live[g]->acc + d0 + c * N;
          V::Store(o, V::MulAdd(V::Load(o), a, acc[g][c]));
        }
      }
    }
  }
}

}  // namespace

// Designated by position, in the order of struct Kernels.
const Kernels kTable = {
    V::kIsa,            // isa
    Stats,              // stats
    ColumnPass,         // column_pass
    RowPass,            // row_pass
    BalanceRtn,         // balance_rtn
    PackRowsV,          // pack_rows
    DequantizeRecordV,  // dequantize_record
    Hadamard,           // hadamard
    LoadTile,           // load_tile
    HalvesToFloats,     // halves_to_floats
    FloatsToHalves,     // floats_to_halves
    ToCacheFrameV,      // to_cache_frame
    AttendRecord,       // attend_record
    AttendPage,         // attend_page
};

}  // namespace KVARN_SIMD_NS
}  // namespace cpu
}  // namespace kvarn
