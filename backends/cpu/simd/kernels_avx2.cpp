// The CPU kernels at the AVX2 level (AVX2 + FMA + F16C): 8 fp32 lanes; the eight fp64 lanes of
// the fixed-order sums are two 4-lane registers (lanes 0-3, 4-7). Compiled with -mavx2 -mfma
// -mf16c (simd.cmake) and run only where cpu_isa.cpp detected those features.
#include <immintrin.h>

#include "backends/cpu/kernels.h"

namespace kvarn {
namespace cpu {
namespace avx2 {
namespace {

struct V {
  static constexpr kvarn_cpu_isa_t kIsa = KVARN_CPU_ISA_AVX2;
  static constexpr int kRegs = 16;  // vector registers
  static constexpr int N = 8;
  using F = __m256;
  struct D {
    __m256d lo, hi;
  };
  using I = __m256i;

  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm256_div_ps(a, b); }
  static F Min(F a, F b) { return _mm256_min_ps(a, b); }
  static F Max(F a, F b) { return _mm256_max_ps(a, b); }
  static F MulAdd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F NegMulAdd(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F Round(F a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static __m128 Half4(F a) {
    return _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  }
  static float ReduceAdd(F a) {
    __m128 x = Half4(a);
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float ReduceMin(F a) {
    __m128 x = _mm_min_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_min_ps(x, _mm_movehl_ps(x, x));
    x = _mm_min_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static float ReduceMax(F a) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  static bool AllFinite(F a) {
    return _mm256_movemask_ps(
               _mm256_cmp_ps(_mm256_sub_ps(a, a), _mm256_setzero_ps(), _CMP_EQ_OQ)) == 0xff;
  }
  // p 2^n for integer-valued n in [-127, 127] (the softmax's range).
  static F Ldexp(F p, F n) {
    const I e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  }
  static F ZeroWhereLess(F r, F x, F lo) {
    return _mm256_and_ps(r, _mm256_cmp_ps(x, lo, _CMP_GE_OQ));
  }
  static void StoreCodes(uint8_t* p, F q) {
    const I i = _mm256_cvttps_epi32(q);
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  static F LoadHalf(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void StoreHalf(uint16_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  template <int kMask>
  static F Stage(F x, I idx) {
    const F p = _mm256_permutevar8x32_ps(x, idx);
    return _mm256_blend_ps(_mm256_add_ps(x, p), _mm256_sub_ps(p, x), kMask);
  }
  static F ButterfliesInVector(F x) {
    x = Stage<0xaa>(x, _mm256_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6));
    x = Stage<0xcc>(x, _mm256_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5));
    return Stage<0xf0>(x, _mm256_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3));
  }
  // lo = a0 b0 a1 b1 a2 b2 a3 b3, hi = a4 b4 ... a7 b7.
  static void Zip(F a, F b, F* lo, F* hi) {
    const F l = _mm256_unpacklo_ps(a, b), h = _mm256_unpackhi_ps(a, b);
    *lo = _mm256_permute2f128_ps(l, h, 0x20);
    *hi = _mm256_permute2f128_ps(l, h, 0x31);
  }
  static I LoadBytesAsI32(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  template <int kBits>
  static F CodesToFloat(I u, int shift) {
    const I m = _mm256_set1_epi32((1 << kBits) - 1);
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(u, shift), m));
  }

  static D DZero() { return {_mm256_setzero_pd(), _mm256_setzero_pd()}; }
  static D DSet1(double x) { return {_mm256_set1_pd(x), _mm256_set1_pd(x)}; }
  static D DLoad(const double* p) { return {_mm256_loadu_pd(p), _mm256_loadu_pd(p + 4)}; }
  static void DStore(double* p, D v) {
    _mm256_storeu_pd(p, v.lo);
    _mm256_storeu_pd(p + 4, v.hi);
  }
  static D DAdd(D a, D b) { return {_mm256_add_pd(a.lo, b.lo), _mm256_add_pd(a.hi, b.hi)}; }
  // a + b on the FMA pipes (b * 1 + a rounds once, to the same value as a + b).
  static D DAddOnFma(D a, D b) {
    const __m256d one = _mm256_set1_pd(1.0);
    return {_mm256_fmadd_pd(b.lo, one, a.lo), _mm256_fmadd_pd(b.hi, one, a.hi)};
  }
  static D DSub(D a, D b) { return {_mm256_sub_pd(a.lo, b.lo), _mm256_sub_pd(a.hi, b.hi)}; }
  static D DMul(D a, D b) { return {_mm256_mul_pd(a.lo, b.lo), _mm256_mul_pd(a.hi, b.hi)}; }
  static D DDiv(D a, D b) { return {_mm256_div_pd(a.lo, b.lo), _mm256_div_pd(a.hi, b.hi)}; }
  static D DFromFloats(const float* p) {
    return {_mm256_cvtps_pd(_mm_loadu_ps(p)), _mm256_cvtps_pd(_mm_loadu_ps(p + 4))};
  }
};

}  // namespace
}  // namespace avx2
}  // namespace cpu
}  // namespace kvarn

#define KVARN_SIMD_NS avx2
#include "backends/cpu/simd/kernels_impl.h"

namespace kvarn {
namespace cpu {
const Kernels* Avx2Kernels() { return &avx2::kTable; }
}  // namespace cpu
}  // namespace kvarn
