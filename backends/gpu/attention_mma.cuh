// The tensor-core path of paged decode attention (sm_80+): one kernel family over
// (D, G, key bits, value bits) = {64, 128, 256, 512} x {64, 128} x {2, 4, 8} x {2, 4, 8}, every
// shape whose record ring fits in shared memory (Shape<>::kFits). Included by
// attention_mma_family.cuh (the family's host entry points, one head dim per attention_mma_d<D>.cu
// translation unit) and attention_extend.cuh (fragments, ring helpers); AttnParams, the work-item
// layout and the query loading come from attention_common.cuh.
//
// Decode reads every record once per KV head and does little arithmetic on it, so the kernel is
// built to keep HBM busy: whole records stream into a CTA-wide shared-memory ring (sm_90: one
// bulk asynchronous copy per record, completing on an mbarrier; sm_80: cp.async) of kStages
// records, so that kStages - kGroups records per CTA are in flight while the warps compute on the
// others. Shape<> picks the stage count, warps and CTAs per SM from the record size.
//
// A group of kChanWarps warps takes a whole record at a time (record k of the split goes to group
// k % kGroups). Each warp of the group owns a slice of kDw = D / kChanWarps channels (64 or 128):
// it computes the partial scores of its slice, the group sums them through shared memory (in a
// fixed order, so every warp of the group sees bit-identical scores and runs the same online
// softmax), and each warp accumulates the values of its own channels. D 64 and 128 have one warp
// per record, D 256 two, D 512 four. A record's query fragments (which depend on its channel
// scales) are built once per record, and its G tokens are one softmax step. Per record, with 8
// query rows n (zero-padded):
//   scores  S^T[t, n] = sum_d code[d, t] * (q'[n, d] a_d)      (mma m16n8k16: M tokens, K d)
//   values  O^T[d, n] += sum_t code[t, d] * (p[n, t] a'_t)     (mma m16n8k16: M d, K tokens)
// The integer codes are the A operand, unpacked to fp16 with byte permutes and the 0x6400
// exponent trick (1024 + code * 2^shift, the code left where it sits in its byte; the 1024 times
// the other operand's column sums, which an all-ones A gives, is subtracted once, and the
// power-of-two shift divided out, both exact). Which token or channel sits at which fragment
// position is chosen so that every byte a thread loads feeds its own fragments:
//   scores: thread group g owns the 2TM consecutive tokens from 2TMg (TM = G / 16 m-tiles);
//           m-tile j, row g -> its token 2j, row g+8 -> its token 2j+1 (CodeSlot: for 4-bit
//           codes the low and high nibble of byte j; 2-bit: bits 4(j%2) and 4(j%2)+2 of byte
//           j/2; 8-bit: bytes 2j, 2j+1); k slot 2c+e+8h -> channel 16i + c + 4(e + 2h) (the 4
//           channel rows a thread reads are 4 apart: at most a 2-way bank conflict)
//   values: thread group g owns kDw/8 consecutive channels of the warp's slice; m-tile mt, row g
//           -> its channel 2mt, row g+8 -> 2mt+1 (CodeSlot again); k slot -> token 16kc + slot
//           (identity, so P comes from shared memory by ldmatrix).
#pragma once

#include <utility>

#include "backends/gpu/attention_common.cuh"

#if !KVARN_GPU_HAS_MMA
#error "attention_mma.cuh is CUDA-only (inline PTX; 32-lane mma.sync/ldmatrix tiles)"
#endif

namespace kvarn {
namespace gpu {
namespace mma {

// Halves per row of a warp's P buffer for TM m-tiles of 16 tokens (+8: no bank conflicts).
template <int TM>
constexpr int PStride() {
  return 16 * TM + 8;
}

// Where code 2j+e of a thread's run of codes sits (j: m-tile, e: row half): its byte in the run
// and its bit shift. Keys (run of tokens) and values (run of channels) use the same rule.
template <int kBits>
constexpr int CodeByte(int j, int e) {
  return kBits == 8 ? 2 * j + e : kBits == 4 ? j : j / 2;
}
template <int kBits>
constexpr int CodeShift(int j, int e) {
  return kBits == 8 ? 0 : kBits == 4 ? 4 * e : 4 * (j % 2) + 2 * e;
}
template <int kBits>
constexpr uint32_t CodeMask(int j, int e) {
  return ((1u << kBits) - 1u) << CodeShift<kBits>(j, e);
}

// Shared-memory budget of one CTA when n CTAs share an SM (228 KB per SM, 1 KB reserved per CTA,
// at most 227 KB per CTA).
constexpr int kSmemPerSm = 228 * 1024;
constexpr int CtaSmemBudget(int ctas) {
  return kSmemPerSm / ctas - 1024 < 227 * 1024 ? kSmemPerSm / ctas - 1024 : 227 * 1024;
}

// One instantiation of the kernel family.
// kSlice_: channels per warp (128, or 64 for D 64); the narrow variant, 64 for D 128 and 256,
// spreads a record over twice the warps with half the registers each (KVARN_CUDA_SLICE=64).
template <int D_, int G_, int KB_, int VB_, int kSlice_ = (D_ >= 128 ? 128 : 64)>
struct Shape {
  static constexpr int D = D_, G = G_, KB = KB_, VB = VB_;
  static constexpr int TM = G / 16;           // m-tiles of 16 tokens
  static constexpr int kDw = kSlice_;         // channels of one warp's slice
  static constexpr int kChanWarps = D / kDw;  // warps sharing one record
  static constexpr bool kNarrow = kDw < 128 && D >= 128;
  static constexpr int kKChunks = kDw / 16;  // a warp's k-chunks of the scores, m-tiles of values
  static constexpr int kRecordBytes = D * G * (KB + VB) / 8 + 6 * D + 6 * G;
  static constexpr int kStageBytes = (kRecordBytes + 127) / 128 * 128;
  static_assert(kRecordBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
  // Bytes of a thread's run of codes: 2TM tokens of one channel row, kDw/8 channels of one token.
  static constexpr int kKeyRunBytes = 2 * TM * KB / 8;
  static constexpr int kValueRunBytes = kDw / 8 * VB / 8;
  // The per-warp buffer: P (fp16 probabilities) or, for kChanWarps > 1, the partial scores the
  // group exchanges (never both at once: the exchange is over before the softmax writes P).
  static constexpr int kPHalves = 8 * PStride<TM>();
  static constexpr int kXsFloats = kChanWarps > 1 ? TM * 4 * 32 : 0;
  static constexpr int kWarpBufBytes =
      (kPHalves * 2 > kXsFloats * 4 ? kPHalves * 2 : kXsFloats * 4 + 15) / 16 * 16;

  // Shared memory besides the ring for `groups` record groups.
  static constexpr int FixedBytes(int groups) {
    return 8 * D * 4 /* q */ + D * 32 /* qf */ + groups * kChanWarps * kWarpBufBytes +
           groups * 8 * 8 /* wm, wl */ + 8 * 24 /* m, l, limit, lo, qrow, alpha */ +
           16 * 16 /* barriers */ + 256 /* alignment */;
  }
  struct Choice {
    int groups, stages, ctas;
  };
  // Records consumed at once (groups), ring stages and CTAs per SM: among the layouts that fit
  // (a stage in flight beside the consumed ones, the end-of-CTA merge inside the ring), the one
  // with enough bytes in flight per SM to cover HBM latency (40 KB), then the most warps per SM
  // (at most 16), then the most bytes in flight.
  static constexpr Choice Choose() {
    Choice best{0, 0, 0};
    long best_key = -1;
    for (int ctas = 1; ctas <= 3; ++ctas) {
      for (int groups = 1; groups <= 4; groups *= 2) {
        const int budget = CtaSmemBudget(ctas) - FixedBytes(groups);
        if (budget <= 0) continue;
        int stages = budget / kStageBytes;
        if (stages > groups + 4) stages = groups + 4;
        if (stages < groups + 1) continue;
        if ((groups + 1) * 8 * D * 4 > stages * kStageBytes) continue;  // merge area
        const int warps_sm = ctas * groups * kChanWarps;
        if (warps_sm > 16 || groups * kChanWarps * 32 > 512) continue;
        const long inflight = static_cast<long>(ctas) * (stages - groups) * kRecordBytes;
        // The narrow variant is for occupancy: the most warps with 24 KB in flight.
        const long enough = kNarrow ? 24 * 1024 : 40 * 1024;
        const long covered = inflight < enough ? inflight : enough;
        const long key = (covered << 32) | (static_cast<long>(warps_sm) << 24) | (inflight >> 8);
        if (key > best_key) {
          best_key = key;
          best = Choice{groups, stages, ctas};
        }
      }
    }
    return best;
  }
  static constexpr Choice kChoice = Choose();
  static constexpr bool kFits = kChoice.groups > 0;
  static constexpr int kGroups = kFits ? kChoice.groups : 1;
  static constexpr int kWarps = kGroups * kChanWarps;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kStages = kFits ? kChoice.stages : 1;
  static constexpr int kMinCtasPerSm = kFits ? kChoice.ctas : 1;
};

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// mbarriers (sm_80+) order the ring: a stage's `full` barrier completes when its record has
// landed, its `empty` barrier when every warp that reads it is done.
__device__ __forceinline__ void BarrierInit(uint64_t* bar, int count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("mbarrier.init.shared.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count) : "memory");
#endif
}
// Makes initialized barriers visible to the copy engine (the async proxy); then a CTA barrier.
__device__ __forceinline__ void BarrierInitFence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void BarrierArrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(SmemAddr(bar))
      : "memory");
#endif
}
__device__ __forceinline__ void BarrierWait(uint64_t* bar, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t done = 0;
  do {
#if __CUDA_ARCH__ >= 900
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
#else
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(SmemAddr(bar)), "r"(parity)
        : "memory");
#endif
  } while (!done);
#endif
}
// sm_90: copies `bytes` (a multiple of 16, both addresses 16-byte aligned) with the bulk copy
// engine; the thread's arrival on `bar` (count 1) expects those bytes.
__device__ __forceinline__ void BulkCopy(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)),
               "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(SmemAddr(dst)),
      "l"(src), "r"(bytes), "r"(SmemAddr(bar))
      : "memory");
#endif
}
// sm_80: 16 bytes per thread with cp.async; CpAsyncArrive makes the completion of this thread's
// copies its arrival on `bar` (whose count includes one arrival per copying thread).
__device__ __forceinline__ void CpAsync16(void* dst, const void* src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(SmemAddr(dst)), "l"(src)
               : "memory");
#endif
}
__device__ __forceinline__ void CpAsyncArrive(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
#endif
}

__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ uint32_t PackHalf2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Two codes (the bits kMask selects in bytes 0 and 2 of z) as the exact fp16 pair
// (1024 + code * 2^shift), one LOP3: the codes are not shifted down, so a fragment row whose
// codes sit at bit `shift` comes out of the product scaled by 2^shift and the caller divides
// (exact: a power of two). The 1024 is never subtracted per element either; each product sums
// it into the accumulator once per k, and the caller removes 1024 * (sum of the other operand)
// in fp32.
// SASS has one immediate per LOP3, so the C form (z & mask) | 0x64006400 takes two; with the
// exponent bits in a register operand (hoisted out of the loops) it is one.
template <uint32_t kMask>
__device__ __forceinline__ uint32_t BiasedCodes(uint32_t z) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n"  // (a & b) | c
      : "=r"(r)
      : "r"(z), "n"(kMask * 0x00010001u), "r"(0x64006400u));
  return r;
#else
  return (z & (kMask * 0x00010001u)) | 0x64006400u;
#endif
}
constexpr float kCodeBias = 1024.f;
// d += column sums of the fp16 B operand (an all-ones A: every C row gets them, exactly as the
// tensor core accumulates them).
__device__ __forceinline__ void MmaColumnSums(float (&d)[4], const uint32_t (&b)[2]) {
  const uint32_t ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x3C003C00u};
  Mma16816(d, ones, b);
}

// Bytes k of x and of y into bytes 0 and 2 (bytes 1 and 3 are masked away by CodesToHalf2).
__device__ __forceinline__ uint32_t PairBytes(uint32_t x, uint32_t y, int k) {
  return __byte_perm(x, y, static_cast<uint32_t>(k | (k << 4) | ((4 + k) << 8) | ((4 + k) << 12)));
}

__device__ __forceinline__ float2 Half2AsFloat2(uint32_t u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

// x0, x1 as an fp16 pair plus the fp16 pair of what rounding left out: hi + lo carries the
// operand to about 2^-22 relative, where hi alone would carry 2^-11 (too coarse for scores of
// tens of units).
__device__ __forceinline__ void SplitHalf2(float x0, float x1, uint32_t* hi, uint32_t* lo) {
  *hi = PackHalf2(x0, x1);
  const float2 h = Half2AsFloat2(*hi);
  *lo = PackHalf2(x0 - h.x, x1 - h.y);
}

__device__ __forceinline__ void LdMatrixX2(uint32_t (&b)[2], const __half* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(a)
               : "memory");  // reads what plain stores wrote: not moved above them
#endif
}

// Loads 2*TM halves of per-token fp16 scales of thread group g (from shared memory) as floats.
template <int TM>
__device__ __forceinline__ void LoadTokenScales(const uint8_t* field, int g, float (&out)[2 * TM]) {
  const uint4* p = reinterpret_cast<const uint4*>(field + 2 * (2 * TM * g));
#pragma unroll
  for (int v = 0; v < TM / 4; ++v) {
    const uint4 u = p[v];
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = Half2AsFloat2(w[e]);
      out[8 * v + 2 * e] = f.x;
      out[8 * v + 2 * e + 1] = f.y;
    }
  }
}

// 2^x in one MUFU.EX2 (exp2f adds range reduction for results below 2^-126, which only make
// probabilities of 0 here); 2^-inf = +0.
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// f(std::integral_constant<int, I>) for I = 0 .. N-1: the loop index as a constant expression
// (the code masks are instruction immediates).
template <typename F, int... I>
__device__ __forceinline__ void StaticForImpl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
__device__ __forceinline__ void StaticFor(F&& f) {
  StaticForImpl(f, std::make_integer_sequence<int, N>{});
}

// A thread's run of kBytes code bytes (2, 4, 8 or 16; aligned to kBytes) into 32-bit words.
template <int kBytes>
__device__ __forceinline__ void LoadRun(const uint8_t* p, uint32_t (&w)[(kBytes + 3) / 4]) {
  if constexpr (kBytes == 16) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    w[0] = u.x;
    w[1] = u.y;
    w[2] = u.z;
    w[3] = u.w;
  } else if constexpr (kBytes == 8) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    w[0] = u.x;
    w[1] = u.y;
  } else if constexpr (kBytes == 4) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else {
    static_assert(kBytes == 2, "runs of 2, 4, 8 or 16 bytes");
    w[0] = *reinterpret_cast<const uint16_t*>(p);
  }
}

// Per-warp state of the online softmax over the tiles it visits (log2 domain).
template <int kKChunks>
struct WarpState {
  float m[2];              // running max of rows 2c, 2c+1 (warp-uniform per row)
  float l[2];              // partial sums of this thread's tokens
  float acc[kKChunks][4];  // O^T fragments of the warp's channels (see RecordTile)
};

// Applies the softcap (cap2 = c log2 e; 0 = off), masks (kMask: some key of the tile lies
// outside some row's [lo, limit), the CTA's per-row arrays in shared memory) and exponentiates the
// scores s (C fragments of TM m-tiles; for records still to be multiplied by the token scales ct);
// writes p * a'_t (or p) for rows n = 2c, 2c+1 to the warp's P buffer and returns in alpha the
// rescale factors and in pzz the value-zero sums sum p z'_t of the two rows (0 for pages).
template <int TM, bool kMask>
__device__ __forceinline__ void Softmax(float (&s)[TM][4], const float (&ct)[2 * TM],
                                        const float (&va)[2 * TM], const float (&vz)[2 * TM],
                                        bool is_record, int key0, const int* limit, const int* lo,
                                        float cap2, int g, int c, float (&m)[2], float (&l)[2],
                                        __half* pbuf, float (&alpha)[2], float (&pzz)[2]) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
  int lim0 = 0, lim1 = 0, lo0 = 0, lo1 = 0;
  if (kMask) {
    lim0 = limit[2 * c];
    lim1 = limit[2 * c + 1];
    lo0 = lo[2 * c];
    lo1 = lo[2 * c + 1];
  }
#pragma unroll
  for (int j = 0; j < TM; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {  // e: token 2*TM*g + 2j + e (C rows g and g+8)
      const int t = 2 * TM * g + 2 * j + e;
      const int key = key0 + t;
      float a = s[j][2 * e], b = s[j][2 * e + 1];
      if (is_record) {
        a *= ct[2 * j + e];
        b *= ct[2 * j + e];
      }
      if (cap2 > 0.f) {
        a = Softcap(a, cap2);
        b = Softcap(b, cap2);
      }
      if (kMask) {
        a = key < lim0 && key >= lo0 ? a : -INFINITY;
        b = key < lim1 && key >= lo1 ? b : -INFINITY;
      }
      s[j][2 * e] = a;
      s[j][2 * e + 1] = b;
      mx0 = fmaxf(mx0, a);
      mx1 = fmaxf(mx1, b);
    }
  }
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, o));
  }
  const float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
  // A row with no key yet keeps m = -inf; subtracting 0 then gives 2^-inf = 0 for its p and alpha.
  const float ms0 = mn0 == -INFINITY ? 0.f : mn0, ms1 = mn1 == -INFINITY ? 0.f : mn1;
  alpha[0] = FastExp2(m[0] - ms0);
  alpha[1] = FastExp2(m[1] - ms1);
  m[0] = mn0;
  m[1] = mn1;
  float sum0 = 0.f, sum1 = 0.f, z0 = 0.f, z1 = 0.f;
  uint32_t packed0[TM], packed1[TM];
#pragma unroll
  for (int j = 0; j < TM; ++j) {
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = FastExp2(s[j][e] - ((e & 1) ? ms1 : ms0));
    sum0 += p[0] + p[2];
    sum1 += p[1] + p[3];
    if (is_record) {
      const float a0 = va[2 * j], a1 = va[2 * j + 1];
      packed0[j] = PackHalf2(p[0] * a0, p[2] * a1);
      packed1[j] = PackHalf2(p[1] * a0, p[3] * a1);
      z0 += p[0] * vz[2 * j] + p[2] * vz[2 * j + 1];  // the value-zero term
      z1 += p[1] * vz[2 * j] + p[3] * vz[2 * j + 1];
    } else {
      packed0[j] = PackHalf2(p[0], p[2]);
      packed1[j] = PackHalf2(p[1], p[3]);
    }
  }
  l[0] = l[0] * alpha[0] + sum0;
  l[1] = l[1] * alpha[1] + sum1;
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    z0 += __shfl_xor_sync(0xffffffffu, z0, o);
    z1 += __shfl_xor_sync(0xffffffffu, z1, o);
  }
  pzz[0] = z0;
  pzz[1] = z1;
  // Rows 2c and 2c+1, tokens 2*TM*g .. 2*TM*g + 2*TM - 1 (16-byte stores).
  uint4* r0 = reinterpret_cast<uint4*>(pbuf + (2 * c) * PStride<TM>() + 2 * TM * g);
  uint4* r1 = reinterpret_cast<uint4*>(pbuf + (2 * c + 1) * PStride<TM>() + 2 * TM * g);
#pragma unroll
  for (int v = 0; v < TM / 4; ++v) {
    r0[v] = make_uint4(packed0[4 * v], packed0[4 * v + 1], packed0[4 * v + 2], packed0[4 * v + 3]);
    r1[v] = make_uint4(packed1[4 * v], packed1[4 * v + 1], packed1[4 * v + 2], packed1[4 * v + 3]);
  }
  __syncwarp();
}

// Where the query value that lane (g, c) multiplies in the score product for chunk i, channel
// 16i + c + 4r, sits in the fragment-ordered copy: [i][lane][r], so that a record reads a
// chunk's four with one conflict-free 16-byte load per lane. The one definition of the order,
// for the writer and the reader.
__device__ __forceinline__ int QueryFragmentSlot(int i, int lane, int r) {
  return (i * kWarpSize + lane) * 4 + r;
}

// qf[QueryFragmentSlot(i, lane, r)] <- q[row g][channel 16i + c + 4r] of lane (g, c).
template <int D>
__device__ __forceinline__ void ScatterQueryFragments(const float* q, float* qf) {
  for (int idx = threadIdx.x; idx < D / 16 * 4 * kWarpSize; idx += blockDim.x) {
    const int i = idx / (4 * kWarpSize), lane = (idx / 4) % kWarpSize, r = idx % 4;
    qf[QueryFragmentSlot(i, lane, r)] = q[(lane >> 2) * D + 16 * i + (lane & 3) + 4 * r];
  }
}

// Barrier of the kChanWarps warps of record group u (named barrier 1 + u; 0 is __syncthreads).
template <class S>
__device__ __forceinline__ void GroupSync(int u) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(1 + u), "n"(S::kChanWarps * 32) : "memory");
}

// The group's warps add their partial scores (their channel slices) in one fixed order, so every
// warp of the group holds bit-identical sums. xs: the group's kChanWarps buffers; wl: this warp's.
template <class S>
__device__ __forceinline__ void SumGroupScores(float (&s)[S::TM][4], float* xs, int u, int wl) {
  if constexpr (S::kChanWarps > 1) {
    constexpr int kStride = S::kWarpBufBytes / 4;
    const int lane = threadIdx.x % kWarpSize;
    float* mine = xs + wl * kStride;
#pragma unroll
    for (int j = 0; j < S::TM; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(4 * j + e) * 32 + lane] = s[j][e];
    }
    GroupSync<S>(u);
#pragma unroll
    for (int j = 0; j < S::TM; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float t = 0.f;
#pragma unroll
        for (int w = 0; w < S::kChanWarps; ++w) {
          t += w == wl ? s[j][e] : xs[w * kStride + (4 * j + e) * 32 + lane];
        }
        s[j][e] = t;
      }
    }
    GroupSync<S>(u);  // every read is done before a warp reuses its buffer (as P or scores)
  }
}

// The CTA's query rows as the tiles see them: per-row key ranges [lo, limit) in shared memory,
// the smallest limit and largest window start over the valid rows (a tile within both needs no
// mask), and the softcap in the log2 domain (0 = off).
struct RowKeys {
  const int* limit;
  const int* lo;
  int lim_min, lo_max;
  float cap2;
  __device__ __forceinline__ bool NeedsMask(int key0, int G) const {
    return key0 + G > lim_min || key0 < lo_max;
  }
};

// One warp's pass over a whole record tile (G tokens from key0) held in shared memory, for the
// channels [cb, cb + kDw) of its slice.
template <class S>
__device__ __forceinline__ void RecordTile(const AttnParams& P, const uint8_t* rec, const float* qf,
                                           int key0, const RowKeys& rk, int cb, float* xs, int u,
                                           int wl, __half* pbuf, WarpState<S::kKChunks>& W) {
  constexpr int TM = S::TM, KC = S::kKChunks, G = S::G, D = S::D, KB = S::KB, VB = S::VB;
  const int lane = threadIdx.x % kWarpSize, g = lane >> 2, c = lane & 3;
  // B fragments of the score product: (q' a) for row n = g, channels cb + 16i + c + 4r.
  uint32_t qa[KC][2], qal[KC][2];  // B operand, high and low fp16 parts
  float qz = 0.f;                  // sum q z over the slice
#pragma unroll
  for (int i = 0; i < KC; ++i) {
    const float4 q4 =
        *reinterpret_cast<const float4*>(qf + QueryFragmentSlot(cb / 16 + i, lane, 0));
    const float q[4] = {q4.x, q4.y, q4.z, q4.w};
    float a[4], z[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int d = cb + 16 * i + c + 4 * r;
      a[r] = HalfAt(rec + P.off_ka, d);
      z[r] = HalfAt(rec + P.off_kz, d);
    }
    SplitHalf2(q[0] * a[0], q[1] * a[1], &qa[i][0], &qal[i][0]);
    SplitHalf2(q[2] * a[2], q[3] * a[3], &qa[i][1], &qal[i][1]);
    qz += q[0] * z[0] + q[1] * z[1] + q[2] * z[2] + q[3] * z[3];  // the zero term
  }
  // The code bias needs the sum of the B operand the products see (hi + lo) over the channels,
  // per row: an all-ones A gives exactly those column sums, already where the scores need them
  // (C columns 2c, 2c+1).
  float bsum[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < KC; ++i) {
    MmaColumnSums(bsum, qa[i]);
    MmaColumnSums(bsum, qal[i]);
  }
  qz += __shfl_xor_sync(0xffffffffu, qz, 1);
  qz += __shfl_xor_sync(0xffffffffu, qz, 2);
  // sum_d (q a)_d code + sum_d q z = product / 2^shift + off[shift / 2][n], with
  // off = qz - 1024 bsum / 2^shift per row n = 2c + n (its qz lives in thread group 2c + n).
  float off[4][2];
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const float z = __shfl_sync(0xffffffffu, qz, (2 * c + n) * 4);
#pragma unroll
    for (int sh = 0; sh < 4; ++sh) off[sh][n] = fmaf(-kCodeBias * bsum[n], 1.f / (1 << 2 * sh), z);
  }

  // Scores (partial over the slice): codes 2j + e of the run a thread reads from channel row d.
  float s[TM][4];
#pragma unroll
  for (int j = 0; j < TM; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  constexpr int kRun = S::kKeyRunBytes, kWords = (kRun + 3) / 4;
  constexpr int kRowBytes = G * KB / 8;
  const uint8_t* kcodes = rec + P.off_kcodes + kRun * g;
#pragma unroll
  for (int i = 0; i < KC; ++i) {
    uint32_t w[4][kWords];
#pragma unroll
    for (int r = 0; r < 4; ++r) LoadRun<kRun>(kcodes + (cb + 16 * i + c + 4 * r) * kRowBytes, w[r]);
    StaticFor<TM>([&](auto jc) {
      constexpr int j = decltype(jc)::value;
      constexpr int b0 = CodeByte<KB>(j, 0), b1 = CodeByte<KB>(j, 1);
      const uint32_t z01a = PairBytes(w[0][b0 / 4], w[1][b0 / 4], b0 % 4);
      const uint32_t z23a = PairBytes(w[2][b0 / 4], w[3][b0 / 4], b0 % 4);
      const uint32_t z01b = b1 == b0 ? z01a : PairBytes(w[0][b1 / 4], w[1][b1 / 4], b1 % 4);
      const uint32_t z23b = b1 == b0 ? z23a : PairBytes(w[2][b1 / 4], w[3][b1 / 4], b1 % 4);
      const uint32_t a[4] = {
          BiasedCodes<CodeMask<KB>(j, 0)>(z01a), BiasedCodes<CodeMask<KB>(j, 1)>(z01b),
          BiasedCodes<CodeMask<KB>(j, 0)>(z23a), BiasedCodes<CodeMask<KB>(j, 1)>(z23b)};
      Mma16816(s[j], a, qa[i]);
      Mma16816(s[j], a, qal[i]);
    });
  }
  StaticFor<TM>([&](auto jc) {
    constexpr int j = decltype(jc)::value;
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int sh = e == 0 ? CodeShift<KB>(j, 0) : CodeShift<KB>(j, 1);
      const float inv = 1.f / static_cast<float>(1 << sh);
      s[j][2 * e] = fmaf(s[j][2 * e], inv, off[sh / 2][0]);
      s[j][2 * e + 1] = fmaf(s[j][2 * e + 1], inv, off[sh / 2][1]);
    }
  });
  SumGroupScores<S>(s, xs, u, wl);
  float ct[2 * TM], va[2 * TM], vz[2 * TM];
  LoadTokenScales<TM>(rec + P.off_kc, g, ct);
  LoadTokenScales<TM>(rec + P.off_va, g, va);
  LoadTokenScales<TM>(rec + P.off_vz, g, vz);
  float alpha[2], pzz[2];
  if (rk.NeedsMask(key0, G)) {
    Softmax<TM, true>(s, ct, va, vz, true, key0, rk.limit, rk.lo, rk.cap2, g, c, W.m, W.l, pbuf,
                      alpha, pzz);
  } else {
    Softmax<TM, false>(s, ct, va, vz, true, key0, rk.limit, rk.lo, rk.cap2, g, c, W.m, W.l, pbuf,
                       alpha, pzz);
  }

  // Values: O^T[d, n] for the kDw/8 channels of thread group g, codes 2mt + e of its run.
  float o[KC][4];
#pragma unroll
  for (int mt = 0; mt < KC; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  // The code bias of the value product, 1024 * (sum over tokens of the fp16 P operand), comes
  // from an all-ones A like the score bias: psum[e] for row 2c + e.
  float psum[4] = {0.f, 0.f, 0.f, 0.f};
  constexpr int kVRun = S::kValueRunBytes, kVWords = (kVRun + 3) / 4;
  constexpr int kVRowBytes = D * VB / 8;
  const uint8_t* vcodes = rec + P.off_vcodes + cb * VB / 8 + kVRun * g;
#pragma unroll
  for (int kc = 0; kc < TM; ++kc) {
    uint32_t b[2];
    LdMatrixX2(b, pbuf + (lane % 8) * PStride<TM>() + 16 * kc + 8 * ((lane / 8) % 2));
    MmaColumnSums(psum, b);
    // Tokens 16kc + 2c + {0, 1, 8, 9}: the k slots 2c, 2c+1, 2c+8, 2c+9.
    const uint8_t* base = vcodes + (16 * kc + 2 * c) * kVRowBytes;
    uint32_t x[kVWords], y[kVWords], zu[kVWords], zv[kVWords];
    LoadRun<kVRun>(base, x);
    LoadRun<kVRun>(base + kVRowBytes, y);
    LoadRun<kVRun>(base + 8 * kVRowBytes, zu);
    LoadRun<kVRun>(base + 9 * kVRowBytes, zv);
    StaticFor<KC>([&](auto mc) {
      constexpr int mt = decltype(mc)::value;
      constexpr int b0 = CodeByte<VB>(mt, 0), b1 = CodeByte<VB>(mt, 1);
      const uint32_t xya = PairBytes(x[b0 / 4], y[b0 / 4], b0 % 4);
      const uint32_t uva = PairBytes(zu[b0 / 4], zv[b0 / 4], b0 % 4);
      const uint32_t xyb = b1 == b0 ? xya : PairBytes(x[b1 / 4], y[b1 / 4], b1 % 4);
      const uint32_t uvb = b1 == b0 ? uva : PairBytes(zu[b1 / 4], zv[b1 / 4], b1 % 4);
      const uint32_t a[4] = {
          BiasedCodes<CodeMask<VB>(mt, 0)>(xya), BiasedCodes<CodeMask<VB>(mt, 1)>(xyb),
          BiasedCodes<CodeMask<VB>(mt, 0)>(uva), BiasedCodes<CodeMask<VB>(mt, 1)>(uvb)};
      Mma16816(o[mt], a, b);
    });
  }
  // acc = alpha * acc + c'_d * ((o - pb) / 2^shift + pzz); o[mt][0..1]: channel 2mt of the run
  // (rows 2c, 2c+1), o[mt][2..3]: channel 2mt + 1.
  const uint32_t* vcw =
      reinterpret_cast<const uint32_t*>(rec + P.off_vc + 2 * (cb + S::kDw / 8 * g));
  // (o - pb) / 2^shift + pzz = o / 2^shift + voff[shift / 2][n], pb = 1024 psum.
  float voff[4][2];
#pragma unroll
  for (int sh = 0; sh < 4; ++sh) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
      voff[sh][n] = fmaf(-kCodeBias * psum[n], 1.f / (1 << 2 * sh), pzz[n]);
  }
  StaticFor<KC>([&](auto mc) {
    constexpr int mt = decltype(mc)::value;
    const float2 cv = Half2AsFloat2(vcw[mt]);  // channels 2mt, 2mt + 1 of the run
    constexpr int sh0 = CodeShift<VB>(mt, 0), sh1 = CodeShift<VB>(mt, 1);
    constexpr float inv0 = 1.f / static_cast<float>(1 << sh0);
    constexpr float inv1 = 1.f / static_cast<float>(1 << sh1);
    W.acc[mt][0] = fmaf(cv.x, fmaf(o[mt][0], inv0, voff[sh0 / 2][0]), W.acc[mt][0] * alpha[0]);
    W.acc[mt][1] = fmaf(cv.x, fmaf(o[mt][1], inv0, voff[sh0 / 2][1]), W.acc[mt][1] * alpha[1]);
    W.acc[mt][2] = fmaf(cv.y, fmaf(o[mt][2], inv1, voff[sh1 / 2][0]), W.acc[mt][2] * alpha[0]);
    W.acc[mt][3] = fmaf(cv.y, fmaf(o[mt][3], inv1, voff[sh1 / 2][1]), W.acc[mt][3] * alpha[1]);
  });
  __syncwarp();
}

// One warp's pass over an fp16 page tile (sink or tail) of G tokens, read from global memory,
// for the channels [cb, cb + kDw) of its slice: the same fragments, from halves. `valid` counts
// the tile's tokens before the sequence end.
template <class S>
__device__ __forceinline__ void PageTile(const __half* kp, const __half* vp, int valid,
                                         const float* qs, int key0, const RowKeys& rk, int cb,
                                         float* xs, int u, int wl, __half* pbuf,
                                         WarpState<S::kKChunks>& W) {
  constexpr int TM = S::TM, KC = S::kKChunks, D = S::D;
  const int lane = threadIdx.x % kWarpSize, g = lane >> 2, c = lane & 3;
  uint32_t qh[KC][2], ql[KC][2];
  const float* qrow = qs + g * D + cb;
#pragma unroll
  for (int i = 0; i < KC; ++i) {
    const float4 q4 = *reinterpret_cast<const float4*>(qrow + 16 * i + 4 * c);
    SplitHalf2(q4.x, q4.y, &qh[i][0], &ql[i][0]);
    SplitHalf2(q4.z, q4.w, &qh[i][1], &ql[i][1]);
  }
  float s[TM][4];
#pragma unroll
  for (int j = 0; j < TM; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const int t0 = 2 * TM * g + 2 * j;
    // Rows past the sequence end may hold anything, or lie past a tail slot: their scores are
    // masked below (the last valid row is read in their place), and their values are never read
    // (zeroed), so NaN cannot leak in.
    const __half* r0 = kp + static_cast<size_t>(min(t0, valid - 1)) * D + cb;
    const __half* r1 = kp + static_cast<size_t>(min(t0 + 1, valid - 1)) * D + cb;
#pragma unroll
    for (int i = 0; i < KC; ++i) {
      const uint2 u0 = __ldg(reinterpret_cast<const uint2*>(r0 + 16 * i + 4 * c));
      const uint2 u1 = __ldg(reinterpret_cast<const uint2*>(r1 + 16 * i + 4 * c));
      const uint32_t a[4] = {u0.x, u1.x, u0.y, u1.y};
      Mma16816(s[j], a, qh[i]);
      Mma16816(s[j], a, ql[i]);
    }
  }
  SumGroupScores<S>(s, xs, u, wl);
  float none[2 * TM];
  float alpha[2], pzz[2];
  Softmax<TM, true>(s, none, none, none, false, key0, rk.limit, rk.lo, rk.cap2, g, c, W.m, W.l,
                    pbuf, alpha, pzz);
  float o[KC][4];
#pragma unroll
  for (int mt = 0; mt < KC; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  constexpr int kRunWords = S::kDw / 16;  // kDw/8 channels of fp16: 2 per word
#pragma unroll
  for (int kc = 0; kc < TM; ++kc) {
    uint32_t b[2];
    LdMatrixX2(b, pbuf + (lane % 8) * PStride<TM>() + 16 * kc + 8 * ((lane / 8) % 2));
    uint32_t rows[4][kRunWords];  // tokens 16kc + 2c + {0, 1, 8, 9}, the run's channels
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = 16 * kc + 2 * c + (r & 1) + 8 * (r >> 1);
      const uint4* p =
          reinterpret_cast<const uint4*>(vp + static_cast<size_t>(t) * D + cb + S::kDw / 8 * g);
#pragma unroll
      for (int v = 0; v < kRunWords / 4; ++v) {
        const uint4 x = t < valid ? __ldg(p + v) : make_uint4(0, 0, 0, 0);
        rows[r][4 * v] = x.x;
        rows[r][4 * v + 1] = x.y;
        rows[r][4 * v + 2] = x.z;
        rows[r][4 * v + 3] = x.w;
      }
    }
#pragma unroll
    for (int mt = 0; mt < KC; ++mt) {
      // Word mt of a row holds channels 2mt, 2mt + 1 of the run (rows g and g+8 of m-tile mt).
      const uint32_t a[4] = {__byte_perm(rows[0][mt], rows[1][mt], 0x5410),
                             __byte_perm(rows[0][mt], rows[1][mt], 0x7632),
                             __byte_perm(rows[2][mt], rows[3][mt], 0x5410),
                             __byte_perm(rows[2][mt], rows[3][mt], 0x7632)};
      Mma16816(o[mt], a, b);
    }
  }
#pragma unroll
  for (int mt = 0; mt < KC; ++mt) {
    W.acc[mt][0] = W.acc[mt][0] * alpha[0] + o[mt][0];
    W.acc[mt][1] = W.acc[mt][1] * alpha[1] + o[mt][1];
    W.acc[mt][2] = W.acc[mt][2] * alpha[0] + o[mt][2];
    W.acc[mt][3] = W.acc[mt][3] * alpha[1] + o[mt][3];
  }
  __syncwarp();
}

template <class S>
struct MmaSmem {
  // The record ring while tiles stream; the per-group outputs of the CTA merge after.
  union {
    unsigned char ring[S::kStages][S::kStageBytes];
    struct {
      float acc[S::kGroups][kRows * S::D];
      float out[kRows * S::D];
    } merge;
  } u;
  float q[kRows * S::D];                            // rotated queries * scale * log2(e)
  alignas(16) float qf[S::D / 16 * 4 * kWarpSize];  // the same, in QueryFragmentSlot order
  alignas(16) unsigned char wbuf[S::kWarps][S::kWarpBufBytes];  // per-warp P / partial scores
  float wm[S::kGroups][kRows], wl[S::kGroups][kRows];
  float m[kRows], l[kRows];
  int limit[kRows], lo[kRows], qrow[kRows];
  float alpha[kRows];          // the sink's rescale of a row's values (one split)
  uint64_t full[S::kStages];   // the stage's record has landed
  uint64_t empty[S::kStages];  // the stage's group is done with it
  int issued[S::kStages];      // the record whose copy into the stage was started last
};

__device__ __forceinline__ const uint8_t* RecordAt(const AttnParams& P, int id, int h) {
  return P.records + (static_cast<size_t>(id) * P.Hk + h) * P.record_stride;
}

// Starts the copy of record `id` into `stage`; its `full` barrier completes when it has landed.
// Called by all 32 lanes (index li of n) of the issuing warp, and every lane arrives on `full`:
// each lane's arrival releases its own reads of the record that stage held before to the warp
// that waits for the new one (mbarrier.arrive releases the arriving thread's accesses only).
// P.bulk_ring (sm_90): lane 0 starts one bulk copy (its arrival expects the bytes). Otherwise
// every lane copies 16 bytes at a time with cp.async, arriving when its copies complete. A bad
// table entry copies nothing but still arrives, and the consumers, who check the entry
// themselves, skip the tile.
template <class S>
__device__ __forceinline__ void IssueRecord(const AttnParams& P, unsigned char* dst, uint64_t* full,
                                            int id, int h, int li, int n) {
  const bool ok = id >= 0 && id < P.num_record_blocks;
  if (P.bulk_ring) {
    if (ok && li == 0) {
      BulkCopy(dst, RecordAt(P, id, h), S::kRecordBytes, full);
    } else {
      BarrierArrive(full);
    }
  } else {
    if (ok) {
      const uint8_t* src = RecordAt(P, id, h);
      for (int off = li * 16; off < S::kRecordBytes; off += n * 16) CpAsync16(dst + off, src + off);
      CpAsyncArrive(full);
    } else {
      BarrierArrive(full);
    }
  }
}

// S::kMinCtasPerSm CTAs of S::kThreads threads per SM.
template <class S>
__global__ void __launch_bounds__(S::kThreads, S::kMinCtasPerSm) MmaAttentionKernel(AttnParams P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int D = S::D, G = S::G, KC = S::kKChunks;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  MmaSmem<S>& M = *reinterpret_cast<MmaSmem<S>*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int u = warp / S::kChanWarps, wl = warp % S::kChanWarps;  // record group, slice
  const int cb = wl * S::kDw;                                     // the slice's first channel
  const int g = lane >> 2, c = lane & 3;
  WorkItem w;
  if (!ReadWorkItem(P, G, kRows, &w)) return;
  const int split = w.split, h = w.h, b = w.b, N = w.N, rt = w.rt, tiles = w.tiles;
  // Tiles wholly before the first row's window are never read.
  const int t_begin = FirstVisibleTile(P, w, G) + split * P.tiles_per_split;
  const int t_end = min(tiles, t_begin + P.tiles_per_split);
  // The record tiles of this split, [r_lo, r_hi); the others in [t_begin, t_end) are pages.
  const int r_lo = max(t_begin, P.sink_tiles), r_hi = min(t_end, P.sink_tiles + rt);
  const int nrec = max(0, r_hi - r_lo);
  const int32_t* table = P.block_table + static_cast<size_t>(b) * P.max_blocks;

  // Group v consumes the records k = v, v + kGroups, ... from stages k % kStages. When it is done
  // with record k its first warp refills that stage with record k + kStages, which another group
  // consumes: every wait is on a smaller record index, so the ring cannot deadlock. An mbarrier
  // wait tells only the parity of a phase, and with kStages not a multiple of kGroups the
  // consumer of record k + 2 kStages can come to its stage before record k + kStages has even
  // been issued (its parity is k's, long complete): so a consumer first waits until `issued`
  // names its record, after which the stage's pending phase is its record's.
  if (tid == 0) {
    for (int st = 0; st < S::kStages; ++st) {
      BarrierInit(&M.full[st], kWarpSize);
      BarrierInit(&M.empty[st], S::kChanWarps);
    }
    BarrierInitFence();
  }
  if (tid < kRows) SetRow(P, w, tid, M.qrow, M.limit, M.lo);
  __syncthreads();
  // Start the ring: its first copies overlap the query setup and the page tiles.
  for (int k = warp; k < min(nrec, S::kStages); k += S::kWarps) {
    IssueRecord<S>(P, M.u.ring[k], &M.full[k], table[r_lo + k], h, lane, kWarpSize);
    if (lane == 0) M.issued[k] = k;
  }
  // Scores in the log2 domain.
  LoadQueries(P, M.qrow, D, P.scale * 1.4426950408889634f, M.q);
  __syncthreads();
  ScatterQueryFragments<D>(M.q, M.qf);
  __syncthreads();

  WarpState<KC> W;
  W.m[0] = W.m[1] = -INFINITY;
  W.l[0] = W.l[1] = 0.f;
#pragma unroll
  for (int mt = 0; mt < KC; ++mt) W.acc[mt][0] = W.acc[mt][1] = W.acc[mt][2] = W.acc[mt][3] = 0.f;
  // Padding rows are never stored: they need no mask.
  RowKeys rk{M.limit, M.lo, INT_MAX, 0, P.softcap * 1.4426950408889634f};
  for (int r = 0; r < kRows; ++r) {
    if (M.qrow[r] < 0) continue;
    rk.lim_min = min(rk.lim_min, M.limit[r]);
    rk.lo_max = max(rk.lo_max, M.lo[r]);
  }
  __half* pbuf = reinterpret_cast<__half*>(M.wbuf[warp]);
  float* xs = reinterpret_cast<float*>(M.wbuf[u * S::kChanWarps]);  // the group's buffers
  const bool reporter = lane == 0 && wl == 0;

  // fp16 page tiles (sink and unflushed tail), straight from global memory, round-robin over
  // the groups.
  for (int tile = t_begin, n = 0; tile < t_end; ++tile) {
    if (tile >= r_lo && tile < r_hi) continue;
    if (n++ % S::kGroups != u) continue;
    const __half* kp;
    const __half* vp;
    if (!FpTileRows(P, w, table, tile, G, D, &kp, &vp)) {
      if (reporter) ReportAttentionError(P, b, kErrBlockTable, tile);
      continue;
    }
    PageTile<S>(kp, vp, min(G, N - tile * G), M.q, tile * G, rk, cb, xs, u, wl, pbuf, W);
  }

  // Record tiles from the ring. After the group's `empty` arrivals its first warp refills the
  // stage with the record kStages further on (its table entry read before the wait for this one).
  for (int k = u; k < nrec; k += S::kGroups) {
    const int stage = k % S::kStages;
    const uint32_t parity = (k / S::kStages) & 1;
    const int next = k + S::kStages;
    const int next_id = next < nrec ? table[r_lo + next] : -1;
    if (lane == 0) {
      while (atomicAdd(&M.issued[stage], 0) != k) {
      }
    }
    __syncwarp();
    BarrierWait(&M.full[stage], parity);
    const int tile = r_lo + k;
    const int id = table[tile];
    if (id >= 0 && id < P.num_record_blocks) {
      RecordTile<S>(P, M.u.ring[stage], M.qf, tile * G, rk, cb, xs, u, wl, pbuf, W);
    } else if (reporter) {
      ReportAttentionError(P, b, kErrBlockTable, tile);
    }
    __syncwarp();
    if (lane == 0) BarrierArrive(&M.empty[stage]);
    if (next < nrec && wl == 0) {
      BarrierWait(&M.empty[stage], parity);
      IssueRecord<S>(P, M.u.ring[stage], &M.full[stage], next_id, h, lane, kWarpSize);
      __syncwarp();
      if (lane == 0) atomicExch(&M.issued[stage], next);
    }
  }
  __syncthreads();     // the ring's memory becomes the merge area
  LaunchDependents();  // the split merge may start launching (it waits for this grid's end)

  // Merge the groups: sums of l over the thread groups, then maxima and weights across groups.
  float l0 = W.l[0], l1 = W.l[1];
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  if (g == 0 && wl == 0) {
    M.wm[u][2 * c] = W.m[0];
    M.wm[u][2 * c + 1] = W.m[1];
    M.wl[u][2 * c] = l0;
    M.wl[u][2 * c + 1] = l1;
  }
  float* acc = M.u.merge.acc[u];
#pragma unroll
  for (int mt = 0; mt < KC; ++mt) {
    const int d = cb + S::kDw / 8 * g + 2 * mt;
    acc[(2 * c) * D + d] = W.acc[mt][0];
    acc[(2 * c + 1) * D + d] = W.acc[mt][1];
    acc[(2 * c) * D + d + 1] = W.acc[mt][2];
    acc[(2 * c + 1) * D + d + 1] = W.acc[mt][3];
  }
  __syncthreads();
  if (tid < kRows) {
    float mx = -INFINITY;
    for (int v = 0; v < S::kGroups; ++v) mx = fmaxf(mx, M.wm[v][tid]);
    float L = 0.f;
    for (int v = 0; v < S::kGroups; ++v) {
      if (M.wm[v][tid] != -INFINITY) L += M.wl[v][tid] * exp2f(M.wm[v][tid] - mx);
    }
    M.m[tid] = mx;
    M.l[tid] = L;
  }
  __syncthreads();
  float* out = M.u.merge.out;
  for (int idx = tid; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D;
    float o = 0.f;
    for (int v = 0; v < S::kGroups; ++v) {
      if (M.wm[v][r] != -INFINITY) o += M.u.merge.acc[v][idx] * exp2f(M.wm[v][r] - M.m[r]);
    }
    out[idx] = o;
  }
  __syncthreads();
  constexpr float kLn2 = 0.6931471805599453f;
  if (P.splits > 1) {
    for (int idx = tid; idx < kRows * D; idx += blockDim.x) {
      const int r = idx / D, d = idx % D;
      if (M.qrow[r] < 0) continue;
      P.part_acc[(static_cast<size_t>(M.qrow[r]) * P.splits + split) * D + d] = out[idx];
    }
    if (tid < kRows && M.qrow[tid] >= 0) {
      float* ml = P.part_ml + (static_cast<size_t>(M.qrow[tid]) * P.splits + split) * 2;
      ml[0] = M.m[tid] == -INFINITY ? -INFINITY : M.m[tid] * kLn2;  // natural-log domain
      ml[1] = M.l[tid];
    }
    return;
  }
  // One split: fold in the sink logit (log2 domain), normalize, un-rotate, store.
  if (tid < kRows) {
    const float sink = P.sinks != nullptr && M.qrow[tid] >= 0
                           ? P.sinks[M.qrow[tid] % P.Hq] * 1.4426950408889634f
                           : -INFINITY;
    M.alpha[tid] = FoldSink(sink, &M.m[tid], &M.l[tid], [](float x) { return exp2f(x); });
  }
  __syncthreads();
  for (int idx = tid; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D;
    out[idx] = M.l[r] > 0.f ? out[idx] * M.alpha[r] / M.l[r] : 0.f;
  }
  if (P.v_rotate) BlockFwht(out, kRows, D, P.log2D);
  for (int idx = tid; idx < kRows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx % D;
    if (M.qrow[r] >= 0)
      StoreElem(P.out, RowElement(M.qrow[r], P.Hq, P.out_stride, D, d), P.out_dtype, out[idx]);
  }
  if (P.lse && tid < kRows && M.qrow[tid] >= 0) {
    P.lse[M.qrow[tid]] = M.m[tid] * kLn2 + logf(M.l[tid]);
  }
#endif
}

// Calls f(S{}) for the Shape<> of (D, G, key bits, value bits, layout) when the family has it
// (kFits); false otherwise. One head dim per translation unit (attention_mma_family.cuh).
template <class S, class F>
bool CallIfFits(F& f) {
  if constexpr (S::kFits) {
    f(S{});
    return true;
  } else {
    return false;
  }
}
template <int D, int G, int KB, class F>
bool WithValueBits(int vb, bool narrow, F& f) {
  if (narrow && (D == 128 || D == 256)) {
    switch (vb) {
      case 2:
        return CallIfFits<Shape<D, G, KB, 2, 64>>(f);
      case 4:
        return CallIfFits<Shape<D, G, KB, 4, 64>>(f);
      case 8:
        return CallIfFits<Shape<D, G, KB, 8, 64>>(f);
      default:
        return false;
    }
  }
  switch (vb) {
    case 2:
      return CallIfFits<Shape<D, G, KB, 2>>(f);
    case 4:
      return CallIfFits<Shape<D, G, KB, 4>>(f);
    case 8:
      return CallIfFits<Shape<D, G, KB, 8>>(f);
    default:
      return false;
  }
}
template <int D, int G, class F>
bool WithKeyBits(int kb, int vb, bool narrow, F& f) {
  switch (kb) {
    case 2:
      return WithValueBits<D, G, 2>(vb, narrow, f);
    case 4:
      return WithValueBits<D, G, 4>(vb, narrow, f);
    case 8:
      return WithValueBits<D, G, 8>(vb, narrow, f);
    default:
      return false;
  }
}
template <int D, class F>
bool WithTileTokens(int G, int kb, int vb, bool narrow, F& f) {
  switch (G) {
    case 64:
      return WithKeyBits<D, 64>(kb, vb, narrow, f);
    case 128:
      return WithKeyBits<D, 128>(kb, vb, narrow, f);
    default:
      return false;
  }
}

}  // namespace mma
}  // namespace gpu
}  // namespace kvarn
