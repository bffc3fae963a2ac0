// The CPU kernels at the AVX-512 level (F, BW, VL, DQ): 16 fp32 lanes, 8 fp64 lanes. Compiled
// with -mavx512f -mavx512bw -mavx512vl -mavx512dq (simd.cmake) and run only where cpu_isa.cpp
// detected those features.
#include <immintrin.h>

#include "backends/cpu/kernels.h"

namespace kvarn {
namespace cpu {
namespace avx512 {
namespace {

struct V {
  static constexpr kvarn_cpu_isa_t kIsa = KVARN_CPU_ISA_AVX512;
  static constexpr int kRegs = 32;  // vector registers
  static constexpr int N = 16;
  using F = __m512;
  using D = __m512d;
  using I = __m512i;

  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Div(F a, F b) { return _mm512_div_ps(a, b); }
  static F Min(F a, F b) { return _mm512_min_ps(a, b); }
  static F Max(F a, F b) { return _mm512_max_ps(a, b); }
  static F MulAdd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }      // a b + c, fused
  static F NegMulAdd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }  // c - a b, fused
  static F Round(F a) {
    return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static float ReduceMin(F a) { return _mm512_reduce_min_ps(a); }
  static float ReduceMax(F a) { return _mm512_reduce_max_ps(a); }
  static float ReduceAdd(F a) { return _mm512_reduce_add_ps(a); }
  static bool AllFinite(F a) {
    return _mm512_cmp_ps_mask(_mm512_sub_ps(a, a), _mm512_setzero_ps(), _CMP_EQ_OQ) == 0xffff;
  }
  static F Ldexp(F p, F n) { return _mm512_scalef_ps(p, n); }
  static F ZeroWhereLess(F r, F x, F lo) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), r);
  }
  // Integer-valued codes in [0, 255] -> bytes.
  static void StoreCodes(uint8_t* p, F q) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(q)));
  }
  static F LoadHalf(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void StoreHalf(uint16_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Butterfly stages h = 1, 2, 4, 8 inside the vector: lane j gets x[j] + x[j^h] when bit h of
  // j is clear, x[j^h] - x[j] when set (the reference's a + b and a - b).
  static F Stage(F x, I idx, __mmask16 hi) {
    const F p = _mm512_permutexvar_ps(idx, x);
    return _mm512_mask_sub_ps(_mm512_add_ps(x, p), hi, p, x);
  }
  static F ButterfliesInVector(F x) {
    x = Stage(x, _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14), 0xaaaa);
    x = Stage(x, _mm512_setr_epi32(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13), 0xcccc);
    x = Stage(x, _mm512_setr_epi32(4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11), 0xf0f0);
    return Stage(x, _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7),
                 0xff00);
  }
  // lo = a0 b0 a1 b1 ... a7 b7, hi = a8 b8 ... a15 b15.
  static void Zip(F a, F b, F* lo, F* hi) {
    *lo = _mm512_permutex2var_ps(
        a, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), b);
    *hi = _mm512_permutex2var_ps(
        a, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), b);
  }
  // N packed bytes -> N int32 lanes.
  static I LoadBytesAsI32(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // The code in bits [shift, shift + kBits) of each lane as a float. For 2- and 4-bit codes one
  // permute does the masking and the conversion: vpermps reads only the low 4 bits of each index,
  // and the 16-entry table maps them to (index mod 2^kBits).
  template <int kBits>
  static F CodesToFloat(I u, int shift) {
    if (kBits == 8) return _mm512_cvtepi32_ps(_mm512_and_si512(u, _mm512_set1_epi32(255)));
    const F table = kBits == 4
                        ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                        : _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    return _mm512_permutexvar_ps(shift ? _mm512_srli_epi32(u, shift) : u, table);
  }

  static D DZero() { return _mm512_setzero_pd(); }
  static D DSet1(double x) { return _mm512_set1_pd(x); }
  static D DLoad(const double* p) { return _mm512_load_pd(p); }
  static void DStore(double* p, D v) { _mm512_store_pd(p, v); }
  static D DAdd(D a, D b) { return _mm512_add_pd(a, b); }
  // a + b on the FMA pipes (b * 1 + a rounds once, to the same value as a + b): the sums of
  // the deviations are bound by the adder pipes, this moves part of them to the FMA pipes.
  static D DAddOnFma(D a, D b) { return _mm512_fmadd_pd(b, _mm512_set1_pd(1.0), a); }
  static D DSub(D a, D b) { return _mm512_sub_pd(a, b); }
  static D DMul(D a, D b) { return _mm512_mul_pd(a, b); }
  static D DDiv(D a, D b) { return _mm512_div_pd(a, b); }
  // Eight floats -> eight doubles (lane k = p[k]).
  static D DFromFloats(const float* p) { return _mm512_cvtps_pd(_mm256_loadu_ps(p)); }
};

}  // namespace
}  // namespace avx512
}  // namespace cpu
}  // namespace kvarn

#define KVARN_SIMD_NS avx512
#include "backends/cpu/simd/kernels_impl.h"

namespace kvarn {
namespace cpu {
const Kernels* Avx512Kernels() { return &avx512::kTable; }
}  // namespace cpu
}  // namespace kvarn
