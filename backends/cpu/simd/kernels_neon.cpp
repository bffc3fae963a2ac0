// The CPU kernels at the NEON level (AArch64 Advanced SIMD, part of the baseline): 4 fp32 lanes;
// the eight fp64 lanes of the fixed-order sums are four 2-lane registers. Built only for aarch64
// (simd.cmake); tested under qemu-aarch64 by scripts/neon-qemu-test.sh.
#include <arm_neon.h>

#include <cstring>

#include "backends/cpu/kernels.h"

namespace kvarn {
namespace cpu {
namespace neon {
namespace {

struct V {
  static constexpr kvarn_cpu_isa_t kIsa = KVARN_CPU_ISA_NEON;
  static constexpr int kRegs = 32;  // vector registers
  static constexpr int N = 4;
  using F = float32x4_t;
  struct D {
    float64x2_t v[4];
  };
  using I = uint32x4_t;

  static F Load(const float* p) { return vld1q_f32(p); }
  static void Store(float* p, F v) { vst1q_f32(p, v); }
  static F Set1(float x) { return vdupq_n_f32(x); }
  static F Add(F a, F b) { return vaddq_f32(a, b); }
  static F Sub(F a, F b) { return vsubq_f32(a, b); }
  static F Mul(F a, F b) { return vmulq_f32(a, b); }
  static F Div(F a, F b) { return vdivq_f32(a, b); }
  static F Min(F a, F b) { return vminq_f32(a, b); }
  static F Max(F a, F b) { return vmaxq_f32(a, b); }
  static F MulAdd(F a, F b, F c) { return vfmaq_f32(c, a, b); }     // a b + c, fused
  static F NegMulAdd(F a, F b, F c) { return vfmsq_f32(c, a, b); }  // c - a b, fused
  static F Round(F a) { return vrndnq_f32(a); }                     // ties to even
  static float ReduceMin(F a) { return vminvq_f32(a); }
  static float ReduceMax(F a) { return vmaxvq_f32(a); }
  static float ReduceAdd(F a) { return vaddvq_f32(a); }
  static bool AllFinite(F a) {
    return vminvq_u32(vceqq_f32(vsubq_f32(a, a), vdupq_n_f32(0.f))) == 0xffffffffu;
  }
  static F Ldexp(F p, F n) {
    const int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
    return vreinterpretq_f32_s32(vaddq_s32(vreinterpretq_s32_f32(p), e));
  }
  static F ZeroWhereLess(F r, F x, F lo) {
    return vreinterpretq_f32_u32(vandq_u32(vcgeq_f32(x, lo), vreinterpretq_u32_f32(r)));
  }
  static void StoreCodes(uint8_t* p, F q) {
    const uint16x4_t w = vmovn_u32(vcvtq_u32_f32(q));
    const uint8x8_t b = vmovn_u16(vcombine_u16(w, w));
    const uint32_t four = vget_lane_u32(vreinterpret_u32_u8(b), 0);
    std::memcpy(p, &four, 4);
  }
  static F LoadHalf(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }
  static void StoreHalf(uint16_t* p, F v) { vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(v))); }
  static F ButterfliesInVector(F x) {
    static const uint32_t kOdd[4] = {0, ~0u, 0, ~0u}, kHigh[4] = {0, 0, ~0u, ~0u};
    F p = vrev64q_f32(x);  // lanes 1 0 3 2
    x = vbslq_f32(vld1q_u32(kOdd), vsubq_f32(p, x), vaddq_f32(x, p));
    p = vextq_f32(x, x, 2);  // lanes 2 3 0 1
    return vbslq_f32(vld1q_u32(kHigh), vsubq_f32(p, x), vaddq_f32(x, p));
  }
  // lo = a0 b0 a1 b1, hi = a2 b2 a3 b3.
  static void Zip(F a, F b, F* lo, F* hi) {
    *lo = vzip1q_f32(a, b);
    *hi = vzip2q_f32(a, b);
  }
  static I LoadBytesAsI32(const uint8_t* p) {
    uint32_t four;
    std::memcpy(&four, p, 4);
    const uint16x8_t w = vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(four)));
    return vmovl_u16(vget_low_u16(w));
  }
  template <int kBits>
  static F CodesToFloat(I u, int shift) {
    const I m = vdupq_n_u32((1u << kBits) - 1u);
    return vcvtq_f32_u32(vandq_u32(vshlq_u32(u, vdupq_n_s32(-shift)), m));
  }

  static D DZero() { return DSet1(0.0); }
  static D DSet1(double x) {
    const float64x2_t v = vdupq_n_f64(x);
    return {{v, v, v, v}};
  }
  static D DLoad(const double* p) {
    return {{vld1q_f64(p), vld1q_f64(p + 2), vld1q_f64(p + 4), vld1q_f64(p + 6)}};
  }
  static void DStore(double* p, D v) {
    for (int i = 0; i < 4; ++i) vst1q_f64(p + 2 * i, v.v[i]);
  }
  static D DAdd(D a, D b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vaddq_f64(a.v[i], b.v[i]);
    return a;
  }
  static D DAddOnFma(D a, D b) { return DAdd(a, b); }
  static D DSub(D a, D b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vsubq_f64(a.v[i], b.v[i]);
    return a;
  }
  static D DMul(D a, D b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vmulq_f64(a.v[i], b.v[i]);
    return a;
  }
  static D DDiv(D a, D b) {
    for (int i = 0; i < 4; ++i) a.v[i] = vdivq_f64(a.v[i], b.v[i]);
    return a;
  }
  static D DFromFloats(const float* p) {
    const float32x4_t f = vld1q_f32(p), g = vld1q_f32(p + 4);
    return {{vcvt_f64_f32(vget_low_f32(f)), vcvt_high_f64_f32(f), vcvt_f64_f32(vget_low_f32(g)),
             vcvt_high_f64_f32(g)}};
  }
};

}  // namespace
}  // namespace neon
}  // namespace cpu
}  // namespace kvarn

#define KVARN_SIMD_NS neon
#include "backends/cpu/simd/kernels_impl.h"

namespace kvarn {
namespace cpu {
const Kernels* NeonKernels() { return &neon::kTable; }
}  // namespace cpu
}  // namespace kvarn
