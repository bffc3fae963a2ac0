// Test-side fp16 / bf16 conversions, written independently of core/half.h (exact double
// arithmetic with nearbyint, which rounds half to even), so they can serve as an oracle.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kvarn/kvarn.h"

namespace kvt {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16 -> double (exact).
inline double HalfToDouble(uint16_t h) {
  const int sign = (h >> 15) & 1;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<double>(mant + 1024), exp - 25);
  }
  return sign ? -v : v;
}
inline float HalfToFloat(uint16_t h) { return static_cast<float>(HalfToDouble(h)); }

inline bool HalfIsNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
inline bool HalfIsFinite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

// double -> binary16, round to nearest even. Exact for any double whose rounding is decided by
// its value (the test inputs are floats, which double holds exactly).
inline uint16_t DoubleToHalf(double x) {
  if (std::isnan(x)) return static_cast<uint16_t>((std::signbit(x) ? 0x8000 : 0) | 0x7e00);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // halfway between 65504 and 2^16 rounds up to inf
  if (a < 0x1p-14) {
    const double q = std::nearbyint(a * 0x1p24);  // units of the smallest subnormal
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));  // q == 1024 is 2^-14
  }
  int e;
  std::frexp(a, &e);                                 // a = m * 2^e, m in [0.5, 1)
  int E = e - 1;                                     // a in [2^E, 2^(E+1))
  double q = std::nearbyint(std::ldexp(a, 10 - E));  // in [1024, 2048]
  if (q == 2048.0) {
    q = 1024.0;
    ++E;
  }
  if (E + 15 >= 31) return sign | 0x7c00;
  return static_cast<uint16_t>(sign | ((E + 15) << 10) | (static_cast<int>(q) - 1024));
}
inline uint16_t FloatToHalf(float f) { return DoubleToHalf(static_cast<double>(f)); }

inline double Bf16ToDouble(uint16_t b) { return static_cast<double>(BitsFloat(uint32_t{b} << 16)); }
inline float Bf16ToFloat(uint16_t b) { return BitsFloat(uint32_t{b} << 16); }
inline bool Bf16IsNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// double -> bfloat16 (8 exponent bits, 7 mantissa bits), round to nearest even.
inline uint16_t DoubleToBf16(double x) {
  if (std::isnan(x)) return static_cast<uint16_t>((std::signbit(x) ? 0x8000 : 0) | 0x7fc0);
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a < 0x1p-126) {
    const double q = std::nearbyint(a * 0x1p133);  // units of 2^-133
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  if (std::isinf(a)) return sign | 0x7f80;
  int e;
  std::frexp(a, &e);
  int E = e - 1;
  double q = std::nearbyint(std::ldexp(a, 7 - E));  // in [128, 256]
  if (q == 256.0) {
    q = 128.0;
    ++E;
  }
  if (E + 127 >= 255) return sign | 0x7f80;
  return static_cast<uint16_t>(sign | ((E + 127) << 7) | (static_cast<int>(q) - 128));
}
inline uint16_t FloatToBf16(float f) { return DoubleToBf16(static_cast<double>(f)); }

// Spacing of fp16 values around |x| (the ulp of the binade x lies in).
inline double HalfUlp(double x) {
  const double a = std::fabs(x);
  if (a < 0x1p-14) return 0x1p-24;
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 1 - 10);
}
inline double Bf16Ulp(double x) {
  const double a = std::fabs(x);
  if (a < 0x1p-126) return 0x1p-133;
  int e;
  std::frexp(a, &e);
  return std::ldexp(1.0, e - 1 - 7);
}

// Typed buffers of one of the public dtypes.
inline size_t DtypeBytes(kvarn_dtype_t t) { return t == KVARN_DTYPE_F32 ? 4 : 2; }

// Stores values as `dtype` (rounded to nearest even) into raw bytes.
inline std::vector<uint8_t> Encode(const std::vector<float>& x, kvarn_dtype_t dtype) {
  std::vector<uint8_t> out(x.size() * DtypeBytes(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == KVARN_DTYPE_F32) {
      std::memcpy(out.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t h = dtype == KVARN_DTYPE_F16 ? FloatToHalf(x[i]) : FloatToBf16(x[i]);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Reads `n` values of `dtype` from raw bytes as double.
inline std::vector<double> Decode(const void* p, size_t n, kvarn_dtype_t dtype) {
  std::vector<double> out(n);
  const uint8_t* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == KVARN_DTYPE_F32) {
      float f;
      std::memcpy(&f, b + 4 * i, 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, b + 2 * i, 2);
      out[i] = dtype == KVARN_DTYPE_F16 ? HalfToDouble(h) : Bf16ToDouble(h);
    }
  }
  return out;
}

// Rounds each value to `dtype` and back (what the library sees when given that dtype).
inline std::vector<float> RoundTo(const std::vector<float>& x, kvarn_dtype_t dtype) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == KVARN_DTYPE_F16) {
      out[i] = HalfToFloat(FloatToHalf(x[i]));
    } else if (dtype == KVARN_DTYPE_BF16) {
      out[i] = Bf16ToFloat(FloatToBf16(x[i]));
    } else {
      out[i] = x[i];
    }
  }
  return out;
}

}  // namespace kvt
