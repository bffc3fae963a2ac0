// Test-side references written from docs/FORMAT.md alone (not from the library's sources): the
// Hadamard rotation (Sylvester, and Paley x Sylvester for D 80 and 96) in double, a record decoder,
// and float64 attention.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/fp.h"

namespace kvt {

// The Sylvester matrix built by its recursion H_2n = [[H, H], [H, -H]], H_1 = [1], unscaled.
inline std::vector<int> SylvesterMatrix(int n) {
  std::vector<int> h(1, 1);
  for (int m = 1; m < n; m *= 2) {
    std::vector<int> next(static_cast<size_t>(4) * m * m);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < m; ++j) {
        const int v = h[static_cast<size_t>(i) * m + j];
        next[static_cast<size_t>(i) * 2 * m + j] = v;
        next[static_cast<size_t>(i) * 2 * m + j + m] = v;
        next[static_cast<size_t>(i + m) * 2 * m + j] = v;
        next[static_cast<size_t>(i + m) * 2 * m + j + m] = -v;
      }
    }
    h.swap(next);
  }
  return h;
}

// The quadratic character of x mod the prime q by Euler's criterion: x^((q-1)/2) mod q.
inline int QuadraticCharacter(int x, int q) {
  x = ((x % q) + q) % q;
  if (x == 0) return 0;
  long r = 1;
  for (int e = 0; e < (q - 1) / 2; ++e) r = r * x % q;
  return r == 1 ? 1 : -1;
}

// The symmetric Paley matrix P_m of docs/FORMAT.md section 3 (m = q + 1, q = 11 or 19), written
// from its definition: P[0][0] = -1, the rest of row and column 0 is +1, and for i, j >= 1
// P[i][j] = chi(i + j - 2) with chi(0) taken as +1.
inline std::vector<int> PaleyMatrix(int m) {
  const int q = m - 1;
  std::vector<int> h(static_cast<size_t>(m) * m);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < m; ++j) {
      int v;
      if (i == 0 && j == 0) {
        v = -1;
      } else if (i == 0 || j == 0) {
        v = 1;
      } else {
        const int chi = QuadraticCharacter(i + j - 2, q);
        v = chi == 0 ? 1 : chi;
      }
      h[static_cast<size_t>(i) * m + j] = v;
    }
  }
  return h;
}

// The unscaled rotation matrix of order n (docs/FORMAT.md section 3), row-major: Sylvester for
// a power of two; P_20 (x) S_4 for 80 and P_12 (x) S_8 for 96, entry (a*p + b, c*p + e) =
// P[a][c] * S[b][e].
inline std::vector<int> RotationMatrix(int n) {
  if ((n & (n - 1)) == 0) return SylvesterMatrix(n);
  const int m = n == 80 ? 20 : 12, p = n / m;
  const std::vector<int> P = PaleyMatrix(m), S = SylvesterMatrix(p);
  std::vector<int> h(static_cast<size_t>(n) * n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      h[static_cast<size_t>(i) * n + j] =
          P[static_cast<size_t>(i / p) * m + j / p] * S[static_cast<size_t>(i % p) * p + j % p];
    }
  }
  return h;
}

// x <- x H in double, H the orthonormal rotation of order n (docs/FORMAT.md section 3): the
// Sylvester butterflies for a power of two, the dense product for 80 and 96.
inline void HadamardDouble(double* x, int n) {
  if ((n & (n - 1)) == 0) {
    for (int h = 1; h < n; h *= 2) {
      for (int i = 0; i < n; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const double a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
      }
    }
  } else {
    static const std::vector<int> h80 = RotationMatrix(80), h96 = RotationMatrix(96);
    const std::vector<int>& h = n == 80 ? h80 : h96;
    std::vector<double> y(n, 0.0);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) y[j] += x[i] * h[static_cast<size_t>(i) * n + j];
    }
    std::copy(y.begin(), y.end(), x);
  }
  const double s = 1.0 / std::sqrt(static_cast<double>(n));
  for (int i = 0; i < n; ++i) x[i] *= s;
}

// A record, decoded from the layout of docs/FORMAT.md section 7.
struct DecodedRecord {
  int D = 0, G = 0;
  std::vector<uint8_t> k_codes;         // [D][G]
  std::vector<uint16_t> k_a, k_z, k_c;  // [D], [D], [G]
  std::vector<uint8_t> v_codes;         // [G][D]
  std::vector<uint16_t> v_c, v_a, v_z;  // [D], [G], [G]

  // Cache-frame reconstructions, token-major [G][D], in double.
  double K(int t, int d) const {
    return (k_codes[static_cast<size_t>(d) * G + t] * HalfToDouble(k_a[d]) + HalfToDouble(k_z[d])) *
           HalfToDouble(k_c[t]);
  }
  double V(int t, int d) const {
    return (v_codes[static_cast<size_t>(t) * D + d] * HalfToDouble(v_a[t]) + HalfToDouble(v_z[t])) *
           HalfToDouble(v_c[d]);
  }
};

inline size_t SpecRecordBytes(int D, int G, int kb, int vb) {
  return static_cast<size_t>(D) * G * (kb + vb) / 8 + 6 * D + 6 * G;
}

// Unpacks R rows of C codes of `bits` bits (least significant bits first).
inline std::vector<uint8_t> UnpackCodes(const uint8_t* p, int R, int C, int bits) {
  std::vector<uint8_t> codes(static_cast<size_t>(R) * C);
  const int per_byte = 8 / bits;
  const int row_bytes = C * bits / 8;
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) {
      const uint8_t byte = p[static_cast<size_t>(r) * row_bytes + c / per_byte];
      codes[static_cast<size_t>(r) * C + c] = (byte >> ((c % per_byte) * bits)) & ((1 << bits) - 1);
    }
  }
  return codes;
}

inline std::vector<uint16_t> ReadHalves(const uint8_t* p, int n) {
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
  return v;
}

inline DecodedRecord DecodeRecord(const uint8_t* rec, int D, int G, int kb, int vb) {
  DecodedRecord r;
  r.D = D;
  r.G = G;
  size_t off = 0;
  r.k_codes = UnpackCodes(rec + off, D, G, kb);
  off += static_cast<size_t>(D) * G * kb / 8;
  r.k_a = ReadHalves(rec + off, D);
  off += 2 * D;
  r.k_z = ReadHalves(rec + off, D);
  off += 2 * D;
  r.k_c = ReadHalves(rec + off, G);
  off += 2 * G;
  r.v_codes = UnpackCodes(rec + off, G, D, vb);
  off += static_cast<size_t>(G) * D * vb / 8;
  r.v_c = ReadHalves(rec + off, D);
  off += 2 * D;
  r.v_a = ReadHalves(rec + off, G);
  off += 2 * G;
  r.v_z = ReadHalves(rec + off, G);
  return r;
}

// ||a - b|| / ||b|| (0 when both are 0).
template <typename A, typename B>
double RelL2(const A& a, const B& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    num += d * d;
    den += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  if (den == 0) return num == 0 ? 0 : INFINITY;
  return std::sqrt(num / den);
}

// Attention of one query over n keys in double (docs/FORMAT.md section 9):
// o' = softmax(scale * q' K'^T) V', o = o' H when V is rotated.
// q_rot: the query in the cache frame of K (already multiplied by H when K is rotated).
// K, V: token-major [n][D] in the cache frame. Returns o (D values) and lse.
struct RefAttentionOut {
  std::vector<double> o;
  double lse = 0;
};

// The model variants of the same attention (kvarn_attention_params_t): the query sees keys
// [lo, hi), each scaled score s becomes softcap * tanh(s / softcap) when softcap > 0, and a sink
// logit (-inf = none) joins the denominator with no value. A query that sees no key gets zeros
// and lse = the sink.
inline RefAttentionOut RefAttentionKeys(const double* q_rot, const float* K, const float* V,
                                        int64_t lo, int64_t hi, int D, double scale, double softcap,
                                        double sink, bool v_rotated) {
  RefAttentionOut r;
  r.o.assign(D, 0.0);
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(hi - lo, 0)));
  double m = sink;
  for (int64_t t = lo; t < hi; ++t) {
    double dot = 0;
    const float* k = K + static_cast<size_t>(t) * D;
    for (int d = 0; d < D; ++d) dot += q_rot[d] * static_cast<double>(k[d]);
    double x = scale * dot;
    if (softcap > 0) x = softcap * std::tanh(x / softcap);
    s[t - lo] = x;
    m = std::max(m, x);
  }
  double l = sink == -INFINITY ? 0.0 : std::exp(sink - m);
  for (int64_t t = lo; t < hi; ++t) {
    const double p = std::exp(s[t - lo] - m);
    l += p;
    const float* v = V + static_cast<size_t>(t) * D;
    for (int d = 0; d < D; ++d) r.o[d] += p * static_cast<double>(v[d]);
  }
  if (l == 0) {  // no key and no sink
    r.lse = -INFINITY;
    return r;
  }
  for (int d = 0; d < D; ++d) r.o[d] /= l;
  if (v_rotated) HadamardDouble(r.o.data(), D);
  r.lse = m + std::log(l);
  return r;
}

inline RefAttentionOut RefAttention(const double* q_rot, const float* K, const float* V, int64_t n,
                                    int D, double scale, bool v_rotated) {
  return RefAttentionKeys(q_rot, K, V, 0, n, D, scale, 0.0, -INFINITY, v_rotated);
}

}  // namespace kvt
