// The tensor-core path of paged attention (sm_80+): D128, G 64/128, 4-bit keys, 2-bit values.
// Included by attention_kernels.cu (AttnParams, BlockFwht, the work-item layout and the merge
// are shared with the general kernel there).
//
// Decode reads every record once per KV head and does little arithmetic on it, so the kernel is
// built to keep HBM busy: whole records stream into a CTA-wide shared-memory ring (sm_90: one
// bulk asynchronous copy per record, completing on an mbarrier; sm_80: cp.async) of kStages
// records, so that kStages - kWarps records per CTA are in flight while the warps compute on the
// others (G 128: 6 stages, 2 CTAs per SM; G 64: 8 stages, 3 CTAs per SM).
//
// Each warp takes a whole record at a time (record k of the split goes to warp k % kWarps) and
// keeps its own online softmax; the CTA's 4 warps merge at the end. A record's query fragments
// (which depend on its channel scales) are built once per record, and its G tokens are one
// softmax step. Per record, with 8 query rows n (zero-padded):
//   scores  S^T[t, n] = sum_d code[d, t] * (q'[n, d] a_d)      (mma m16n8k16: M tokens, K d)
//   values  O^T[d, n] += sum_t code[t, d] * (p[n, t] a'_t)     (mma m16n8k16: M d, K tokens)
// The integer codes are the A operand, unpacked to fp16 with byte permutes and the 0x6400
// exponent trick (1024 + code; the 1024 times the other operand's column sums, which an all-ones
// A gives, is subtracted once). Which token or channel sits at which fragment position is
// chosen so that every byte a thread loads feeds its own fragments (TM = G / 16 m-tiles):
//   scores: m-tile j, row g -> token 2TMg + 2j (low nibble), row g+8 -> the next token (high
//           nibble); k slot 2c+e+8h -> channel 16i + c + 4(e + 2h) (the 4 channel rows a thread
//           reads are 4 apart, so the 4 thread columns c read 4 neighbouring rows: at most a
//           2-way bank conflict where adjacent channels would give 4-way)
//   values: m-tile mt, row g -> channel 16g + 4(mt/2) + 2(mt%2), row g+8 -> the next channel;
//           k slot -> token 16kc + slot (identity, so P comes from shared memory by ldmatrix).
#pragma once

#if !KVARN_GPU_HAS_MMA
#error "attention_mma.cuh is CUDA-only (inline PTX; 32-lane mma.sync/ldmatrix tiles)"
#endif

namespace kvarn {
namespace gpu {
namespace mma {

constexpr int kWarps = 4;
constexpr int kD = 128;
constexpr int kKChunks = kD / 16;        // k-chunks of the score product, m-tiles of the values
// Halves per row of a warp's P buffer for TM m-tiles of 16 tokens (+8: no bank conflicts).
template <int TM>
constexpr int PStride() {
  return 16 * TM + 8;
}

// The record ring of one tile size (k4v2, D128).
template <int G>
struct Ring {
  static constexpr int kTM = G / 16;      // m-tiles of 16 tokens: a warp takes a whole record
  static constexpr int kSlots = kWarps;   // records consumed at once, one per warp
  // Stages: the records consumed plus those in flight. G 128: 6 (83 KB; 2 CTAs per SM with up to
  // 255 registers per thread); G 64: 8 (58 KB; 3 CTAs per SM, 168 registers).
  static constexpr int kStages = G == 128 ? 6 : 8;
  static constexpr int kMinCtasPerSm = G == 128 ? 2 : 3;
  static constexpr int kRecordBytes = G * kD * 6 / 8 + 6 * kD + 6 * G;
  static constexpr int kStageBytes = (kRecordBytes + 127) / 128 * 128;
  static_assert(kRecordBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
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
  asm volatile("{\n .reg .b64 state;\n mbarrier.arrive.shared.b64 state, [%0];\n}\n" ::"r"(
                   SmemAddr(bar))
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
  asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];\n" ::"r"(SmemAddr(bar))
               : "memory");
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

// Per-warp state of the online softmax over the tiles it visits (log2 domain).
struct WarpState {
  float m[2];              // running max of rows 2c, 2c+1 (warp-uniform per row)
  float l[2];              // partial sums of this thread's tokens
  float acc[kKChunks][4];  // O^T fragments: m-tile mt, (channel, row) pairs as in Mma16816
};

// What a record's scores need besides the products, for rows n = 2c, 2c+1: the token scales
// and the offsets of low-nibble tokens (qzl = sum q z - 1024 sum q a) and of high-nibble tokens,
// whose products come 16x scaled (qzh = sum q z - 1024 sum q a / 16).
struct ScoreTerms {
  float qzl[2], qzh[2];
};
constexpr float kHiNibble = 1.f / 16.f;

// Scores of one tile into s (C fragments of TM m-tiles), with masking (kMask: some key of the
// tile is past some row's limit) and softmax; writes p * a'_t (or p) for rows n = 2c, 2c+1 to
// the warp's P buffer and returns in alpha the rescale factors and in pzz the value-zero sums
// sum p z'_t of the two rows (0 for pages).
template <int TM, bool kMask>
__device__ __forceinline__ void Softmax(float (&s)[TM][4], const float (&ct)[2 * TM],
                                        const float (&va)[2 * TM], const float (&vz)[2 * TM],
                                        bool is_record, const ScoreTerms& T, int key0, int lim0,
                                        int lim1, int g, int c, WarpState& W, __half* pbuf,
                                        float (&alpha)[2], float (&pzz)[2]) {
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < TM; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {  // e: token 2*TM*g + 2j + e (C rows g and g+8)
      const int t = 2 * TM * g + 2 * j + e;
      const int key = key0 + t;
      float a = s[j][2 * e], b = s[j][2 * e + 1];
      if (is_record) {
        if (e == 0) {
          a = ct[2 * j] * (a + T.qzl[0]);
          b = ct[2 * j] * (b + T.qzl[1]);
        } else {
          a = ct[2 * j + 1] * fmaf(a, kHiNibble, T.qzh[0]);
          b = ct[2 * j + 1] * fmaf(b, kHiNibble, T.qzh[1]);
        }
      }
      if (kMask) {
        a = key < lim0 ? a : -INFINITY;
        b = key < lim1 ? b : -INFINITY;
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
  const float mn0 = fmaxf(W.m[0], mx0), mn1 = fmaxf(W.m[1], mx1);
  // A row with no key yet keeps m = -inf; subtracting 0 then gives 2^-inf = 0 for its p and alpha.
  const float ms0 = mn0 == -INFINITY ? 0.f : mn0, ms1 = mn1 == -INFINITY ? 0.f : mn1;
  alpha[0] = FastExp2(W.m[0] - ms0);
  alpha[1] = FastExp2(W.m[1] - ms1);
  W.m[0] = mn0;
  W.m[1] = mn1;
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
  W.l[0] = W.l[0] * alpha[0] + sum0;
  W.l[1] = W.l[1] * alpha[1] + sum1;
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
__device__ __forceinline__ void ScatterQueryFragments(const float* q, float* qf) {
  for (int idx = threadIdx.x; idx < kKChunks * 4 * kWarpSize; idx += blockDim.x) {
    const int i = idx / (4 * kWarpSize), lane = (idx / 4) % kWarpSize, r = idx % 4;
    qf[QueryFragmentSlot(i, lane, r)] = q[(lane >> 2) * kD + 16 * i + (lane & 3) + 4 * r];
  }
}

// One warp's pass over a whole record tile (G tokens from key0) held in shared memory.
// lim_min: the smallest key limit of the CTA's query rows (no masking below it).
template <int G>
__device__ __forceinline__ void RecordTile(const AttnParams& P, const uint8_t* rec,
                                           const float* qf, int key0, int lim0, int lim1,
                                           int lim_min, __half* pbuf, WarpState& W) {
  constexpr int TM = G / 16;
  const int lane = threadIdx.x % kWarpSize, g = lane >> 2, c = lane & 3;
  // B fragments of the score product: (q' a) for row n = g, channels 16i + c + 4r, r = 0..3.
  uint32_t qa[kKChunks][2], qal[kKChunks][2];  // B operand, high and low fp16 parts
  float qz = 0.f;                               // sum q z
#pragma unroll
  for (int i = 0; i < kKChunks; ++i) {
    const float4 q4 = *reinterpret_cast<const float4*>(qf + QueryFragmentSlot(i, lane, 0));
    const float q[4] = {q4.x, q4.y, q4.z, q4.w};
    float a[4], z[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int d = 16 * i + c + 4 * r;
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
  for (int i = 0; i < kKChunks; ++i) {
    MmaColumnSums(bsum, qa[i]);
    MmaColumnSums(bsum, qal[i]);
  }
  qz += __shfl_xor_sync(0xffffffffu, qz, 1);
  qz += __shfl_xor_sync(0xffffffffu, qz, 2);
  ScoreTerms T;
#pragma unroll
  for (int e = 0; e < 2; ++e) {  // rows n = 2c + e live in the lanes of thread group 2c + e
    const float z = __shfl_sync(0xffffffffu, qz, (2 * c + e) * 4);
    const float bias = kCodeBias * bsum[e];
    T.qzl[e] = z - bias;
    T.qzh[e] = z - bias * kHiNibble;
  }

  // Scores: byte j of the TM bytes a thread reads from channel row d holds tokens 2TMg + 2j
  // (low nibble) and 2TMg + 2j + 1 (high nibble).
  float s[TM][4];
#pragma unroll
  for (int j = 0; j < TM; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
  constexpr int kWords = TM / 4;  // 32-bit words per channel row and thread
  const uint8_t* kcodes = rec + P.off_kcodes + TM * g;
  constexpr int kRowBytes = G / 2;  // 4-bit codes of G tokens
#pragma unroll
  for (int i = 0; i < kKChunks; ++i) {
    uint32_t w[4][kWords];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const uint8_t* row = kcodes + (16 * i + c + 4 * r) * kRowBytes;
      if constexpr (kWords == 2) {
        const uint2 u = *reinterpret_cast<const uint2*>(row);
        w[r][0] = u.x;
        w[r][1] = u.y;
      } else {
        w[r][0] = *reinterpret_cast<const uint32_t*>(row);
      }
    }
#pragma unroll
    for (int j = 0; j < TM; ++j) {
      const uint32_t z01 = PairBytes(w[0][j / 4], w[1][j / 4], j % 4);
      const uint32_t z23 = PairBytes(w[2][j / 4], w[3][j / 4], j % 4);
      // Rows g + 8 (the high nibbles) come 16x scaled: Softmax divides.
      const uint32_t a[4] = {BiasedCodes<0x0F>(z01), BiasedCodes<0xF0>(z01),
                             BiasedCodes<0x0F>(z23), BiasedCodes<0xF0>(z23)};
      Mma16816(s[j], a, qa[i]);
      Mma16816(s[j], a, qal[i]);
    }
  }
  float ct[2 * TM], va[2 * TM], vz[2 * TM];
  LoadTokenScales<TM>(rec + P.off_kc, g, ct);
  LoadTokenScales<TM>(rec + P.off_va, g, va);
  LoadTokenScales<TM>(rec + P.off_vz, g, vz);
  float alpha[2], pzz[2];
  if (key0 + G > lim_min) {
    Softmax<TM, true>(s, ct, va, vz, true, T, key0, lim0, lim1, g, c, W, pbuf, alpha, pzz);
  } else {
    Softmax<TM, false>(s, ct, va, vz, true, T, key0, lim0, lim1, g, c, W, pbuf, alpha, pzz);
  }

  // Values: O^T[d, n] for d = 16g + 4k + {0..3}.
  float o[kKChunks][4];
#pragma unroll
  for (int mt = 0; mt < kKChunks; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  // The code bias of the value product, 1024 * (sum over tokens of the fp16 P operand), comes
  // from an all-ones A like the score bias: psum[e] for row 2c + e.
  float psum[4] = {0.f, 0.f, 0.f, 0.f};
  const uint8_t* vcodes = rec + P.off_vcodes;
  constexpr int kVRowBytes = kD / 4;  // 2-bit codes of D channels
#pragma unroll
  for (int kc = 0; kc < TM; ++kc) {
    uint32_t b[2];
    LdMatrixX2(b, pbuf + (lane % 8) * PStride<TM>() + 16 * kc + 8 * ((lane / 8) % 2));
    MmaColumnSums(psum, b);
    const uint8_t* base = vcodes + (16 * kc + 2 * c) * kVRowBytes + 4 * g;
    const uint32_t x = *reinterpret_cast<const uint32_t*>(base);
    const uint32_t y = *reinterpret_cast<const uint32_t*>(base + kVRowBytes);
    const uint32_t u = *reinterpret_cast<const uint32_t*>(base + 8 * kVRowBytes);
    const uint32_t v = *reinterpret_cast<const uint32_t*>(base + 9 * kVRowBytes);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t zxy = PairBytes(x, y, k), zuv = PairBytes(u, v, k);
      // m-tile 2k + half: rows g take the codes at bit 4 half, rows g + 8 at 4 half + 2.
      const uint32_t a0[4] = {BiasedCodes<0x03>(zxy), BiasedCodes<0x0C>(zxy),
                              BiasedCodes<0x03>(zuv), BiasedCodes<0x0C>(zuv)};
      Mma16816(o[2 * k], a0, b);
      const uint32_t a1[4] = {BiasedCodes<0x30>(zxy), BiasedCodes<0xC0>(zxy),
                              BiasedCodes<0x30>(zuv), BiasedCodes<0xC0>(zuv)};
      Mma16816(o[2 * k + 1], a1, b);
    }
  }
  // acc = alpha * acc + c'_d * ((o - pb) / 2^shift + pzz); channel of o[mt][0..1] =
  // 16g + 4(mt/2) + 2(mt%2) (codes at bit 4(mt%2)), of o[mt][2..3] the next one (2 bits up).
  const uint4* vcp = reinterpret_cast<const uint4*>(rec + P.off_vc + 2 * (16 * g));
  const uint4 c0 = vcp[0], c1 = vcp[1];
  const uint32_t cw[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
  // (o - pb) * inv + pzz = o * inv + off, with off per row and code shift (inv = 2^-shift).
  const float pb[2] = {kCodeBias * psum[0], kCodeBias * psum[1]};
  float off[4][2];
#pragma unroll
  for (int sh = 0; sh < 4; ++sh) {
    const float inv = 1.f / static_cast<float>(1 << (2 * sh));
    off[sh][0] = fmaf(-pb[0], inv, pzz[0]);
    off[sh][1] = fmaf(-pb[1], inv, pzz[1]);
  }
#pragma unroll
  for (int mt = 0; mt < kKChunks; ++mt) {
    const float2 cv = Half2AsFloat2(cw[mt]);  // channels 16g + 2mt, +1
    const int sh0 = mt % 2 ? 2 : 0, sh1 = sh0 + 1;  // code shifts 4(mt%2) and 4(mt%2) + 2 bits
    const float inv0 = 1.f / static_cast<float>(1 << (2 * sh0));
    const float inv1 = 1.f / static_cast<float>(1 << (2 * sh1));
    W.acc[mt][0] = fmaf(cv.x, fmaf(o[mt][0], inv0, off[sh0][0]), W.acc[mt][0] * alpha[0]);
    W.acc[mt][1] = fmaf(cv.x, fmaf(o[mt][1], inv0, off[sh0][1]), W.acc[mt][1] * alpha[1]);
    W.acc[mt][2] = fmaf(cv.y, fmaf(o[mt][2], inv1, off[sh1][0]), W.acc[mt][2] * alpha[0]);
    W.acc[mt][3] = fmaf(cv.y, fmaf(o[mt][3], inv1, off[sh1][1]), W.acc[mt][3] * alpha[1]);
  }
  __syncwarp();
}

// One warp's pass over an fp16 page tile (sink or tail) of G tokens, read from global memory:
// the same fragments, from halves. `valid` counts the tile's tokens before the sequence end.
template <int G>
__device__ __forceinline__ void PageTile(const __half* kp, const __half* vp, int valid,
                                         const float* qs, int key0, int lim0, int lim1,
                                         __half* pbuf, WarpState& W) {
  constexpr int TM = G / 16;
  const int lane = threadIdx.x % kWarpSize, g = lane >> 2, c = lane & 3;
  uint32_t qh[kKChunks][2], ql[kKChunks][2];
  const float* qrow = qs + g * kD;
#pragma unroll
  for (int i = 0; i < kKChunks; ++i) {
    const float4 q4 = *reinterpret_cast<const float4*>(qrow + 16 * i + 4 * c);
    SplitHalf2(q4.x, q4.y, &qh[i][0], &ql[i][0]);
    SplitHalf2(q4.z, q4.w, &qh[i][1], &ql[i][1]);
  }
  float s[TM][4];
#pragma unroll
  for (int j = 0; j < TM; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
    const int t0 = 2 * TM * g + 2 * j;
    // Rows past the sequence end may hold anything: their scores are masked below, and their
    // values are never read (zeroed), so NaN cannot leak in.
    const __half* r0 = kp + static_cast<size_t>(t0) * kD;
    const __half* r1 = r0 + kD;
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      const uint2 u0 = __ldg(reinterpret_cast<const uint2*>(r0 + 16 * i + 4 * c));
      const uint2 u1 = __ldg(reinterpret_cast<const uint2*>(r1 + 16 * i + 4 * c));
      const uint32_t a[4] = {u0.x, u1.x, u0.y, u1.y};
      Mma16816(s[j], a, qh[i]);
      Mma16816(s[j], a, ql[i]);
    }
  }
  float none[2 * TM];
  float alpha[2], pzz[2];
  Softmax<TM, true>(s, none, none, none, false, ScoreTerms{}, key0, lim0, lim1, g, c, W, pbuf, alpha,
                    pzz);
  float o[kKChunks][4];
#pragma unroll
  for (int mt = 0; mt < kKChunks; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
#pragma unroll
  for (int kc = 0; kc < TM; ++kc) {
    uint32_t b[2];
    LdMatrixX2(b, pbuf + (lane % 8) * PStride<TM>() + 16 * kc + 8 * ((lane / 8) % 2));
    uint32_t rows[4][8];  // tokens 16kc + 2c + {0, 1, 8, 9}, channels 16g .. 16g+15
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int t = 16 * kc + 2 * c + (r & 1) + 8 * (r >> 1);
      const uint4* p = reinterpret_cast<const uint4*>(vp + static_cast<size_t>(t) * kD + 16 * g);
      uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
      if (t < valid) {
        lo = __ldg(p);
        hi = __ldg(p + 1);
      }
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
      for (int e = 0; e < 8; ++e) rows[r][e] = w[e];
    }
#pragma unroll
    for (int mt = 0; mt < kKChunks; ++mt) {
      // Word mt of a row holds channels 16g + 2mt, +1 (rows g and g+8 of m-tile mt).
      const uint32_t a[4] = {__byte_perm(rows[0][mt], rows[1][mt], 0x5410),
                             __byte_perm(rows[0][mt], rows[1][mt], 0x7632),
                             __byte_perm(rows[2][mt], rows[3][mt], 0x5410),
                             __byte_perm(rows[2][mt], rows[3][mt], 0x7632)};
      Mma16816(o[mt], a, b);
    }
  }
#pragma unroll
  for (int mt = 0; mt < kKChunks; ++mt) {
    W.acc[mt][0] = W.acc[mt][0] * alpha[0] + o[mt][0];
    W.acc[mt][1] = W.acc[mt][1] * alpha[1] + o[mt][1];
    W.acc[mt][2] = W.acc[mt][2] * alpha[0] + o[mt][2];
    W.acc[mt][3] = W.acc[mt][3] * alpha[1] + o[mt][3];
  }
  __syncwarp();
}

template <int G>
struct MmaSmem {
  // The record ring while tiles stream; the per-warp outputs of the CTA merge after.
  union {
    unsigned char ring[Ring<G>::kStages][Ring<G>::kStageBytes];
    struct {
      float acc[kWarps][kRows * kD];
      float out[kRows * kD];
    } merge;
  } u;
  float q[kRows * kD];                 // rotated queries * scale * log2(e)
  alignas(16) float qf[kKChunks * 4 * kWarpSize];  // the same, in QueryFragmentSlot order
  __half p[kWarps][kRows * PStride<Ring<G>::kTM>()];  // per-warp probabilities
  float wm[kWarps][kRows], wl[kWarps][kRows];
  float m[kRows], l[kRows];
  int limit[kRows], qrow[kRows];
  uint64_t full[Ring<G>::kStages];   // the stage's record has landed
  uint64_t empty[Ring<G>::kStages];  // the stage's warp is done with it
};

__device__ __forceinline__ const uint8_t* RecordAt(const AttnParams& P, int id, int h) {
  return P.records + (static_cast<size_t>(id) * P.Hk + h) * P.record_stride;
}

// Starts the copy of record `id` into `stage`; its `full` barrier completes when it has landed.
// Called by all 32 lanes (index li of n) of the issuing warp, and every lane arrives on `full`:
// each lane's arrival releases its own reads of the record that stage held before to the warp
// that waits for the new one (mbarrier.arrive releases the arriving thread's accesses only).
// kBulk (sm_90): lane 0 starts one bulk copy (its arrival expects the bytes). Otherwise every
// lane copies 16 bytes at a time with cp.async, arriving when its copies complete. A bad table
// entry copies nothing but still arrives, and the consumers, who check the entry themselves,
// skip the tile.
template <int G, bool kBulk>
__device__ __forceinline__ void IssueRecord(const AttnParams& P, MmaSmem<G>& S, int stage, int id,
                                            int h, int li, int n) {
  const bool ok = id >= 0 && id < P.num_record_blocks;
  if constexpr (kBulk) {
    if (ok && li == 0) {
      BulkCopy(S.u.ring[stage], RecordAt(P, id, h), Ring<G>::kRecordBytes, &S.full[stage]);
    } else {
      BarrierArrive(&S.full[stage]);
    }
  } else {
    if (ok) {
      const uint8_t* src = RecordAt(P, id, h);
      for (int off = li * 16; off < Ring<G>::kRecordBytes; off += n * 16) {
        CpAsync16(S.u.ring[stage] + off, src + off);
      }
      CpAsyncArrive(&S.full[stage]);
    } else {
      BarrierArrive(&S.full[stage]);
    }
  }
}

// kBulk: sm_90's bulk copies (else cp.async, sm_80+). Ring<G>::kMinCtasPerSm CTAs per SM.
template <int G, bool kBulk>
__global__ void __launch_bounds__(kWarps * 32, Ring<G>::kMinCtasPerSm)
    MmaAttentionKernel(AttnParams P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using R = Ring<G>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  MmaSmem<G>& S = *reinterpret_cast<MmaSmem<G>*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane >> 2, c = lane & 3;
  WorkItem w;
  if (!ReadWorkItem(P, G, kRows, &w)) return;
  const int split = w.split, h = w.h, b = w.b, N = w.N, rt = w.rt, tiles = w.tiles;
  const int t_begin = split * P.tiles_per_split;
  const int t_end = min(tiles, t_begin + P.tiles_per_split);
  // The record tiles of this split, [r_lo, r_hi); the others in [t_begin, t_end) are pages.
  const int r_lo = max(t_begin, P.sink_tiles), r_hi = min(t_end, P.sink_tiles + rt);
  const int nrec = max(0, r_hi - r_lo);
  const int32_t* table = P.block_table + static_cast<size_t>(b) * P.max_blocks;

  // Warp v consumes the records k = v, v + kWarps, ... from stages k % kStages. When it is done
  // with record k it refills that stage with record k + kStages, which another warp consumes:
  // every wait is on a smaller record index, so the ring cannot deadlock.
  if (tid == 0) {
    for (int st = 0; st < R::kStages; ++st) {
      BarrierInit(&S.full[st], kWarpSize);
      BarrierInit(&S.empty[st], 1);
    }
    BarrierInitFence();
  }
  if (tid < kRows) SetRow(P, w, tid, S.qrow, S.limit);
  __syncthreads();
  // Start the ring: its first copies overlap the query setup and the page tiles.
  for (int k = warp; k < min(nrec, R::kStages); k += kWarps) {
    IssueRecord<G, kBulk>(P, S, k, table[r_lo + k], h, lane, kWarpSize);
  }
  // Scores in the log2 domain.
  LoadQueries(P, S.qrow, kD, P.scale * 1.4426950408889634f, S.q);
  __syncthreads();
  ScatterQueryFragments(S.q, S.qf);
  __syncthreads();

  WarpState W;
  W.m[0] = W.m[1] = -INFINITY;
  W.l[0] = W.l[1] = 0.f;
#pragma unroll
  for (int mt = 0; mt < kKChunks; ++mt)
    W.acc[mt][0] = W.acc[mt][1] = W.acc[mt][2] = W.acc[mt][3] = 0.f;
  const int lim0 = S.limit[2 * c], lim1 = S.limit[2 * c + 1];
  int lim_min = INT_MAX;  // padding rows are never stored: they need no mask
  for (int r = 0; r < kRows; ++r) lim_min = S.qrow[r] >= 0 ? min(lim_min, S.limit[r]) : lim_min;
  const size_t page_elems = static_cast<size_t>(P.Hk) * G * kD;
  __half* pbuf = S.p[warp];
  const bool reporter = lane == 0;

  // fp16 page tiles (sink and unflushed tail), straight from global memory, round-robin over
  // the warps.
  for (int tile = t_begin, n = 0; tile < t_end; ++tile) {
    if (tile >= r_lo && tile < r_hi) continue;
    if (n++ % kWarps != warp) continue;
    const int id = table[tile];
    if (id < 0 || id >= P.num_pages) {
      if (reporter) ReportAttentionError(P, b, kErrBlockTable, tile);
      continue;
    }
    const size_t off = static_cast<size_t>(id) * page_elems + static_cast<size_t>(h) * G * kD;
    PageTile<G>(reinterpret_cast<const __half*>(P.k_pages) + off,
                reinterpret_cast<const __half*>(P.v_pages) + off, min(G, N - tile * G), S.q,
                tile * G, lim0, lim1, pbuf, W);
  }

  // Record tiles from the ring. After its `empty` arrival the warp refills the stage with the
  // record kStages further on (its table entry read before the wait for this one).
  for (int k = warp; k < nrec; k += kWarps) {
    const int stage = k % R::kStages;
    const uint32_t parity = (k / R::kStages) & 1;
    const int next = k + R::kStages;
    const int next_id = next < nrec ? table[r_lo + next] : -1;
    BarrierWait(&S.full[stage], parity);
    const int tile = r_lo + k;
    const int id = table[tile];
    if (id >= 0 && id < P.num_record_blocks) {
      RecordTile<G>(P, S.u.ring[stage], S.qf, tile * G, lim0, lim1, lim_min, pbuf, W);
    } else if (reporter) {
      ReportAttentionError(P, b, kErrBlockTable, tile);
    }
    __syncwarp();
    if (lane == 0) BarrierArrive(&S.empty[stage]);
    if (next < nrec) {
      BarrierWait(&S.empty[stage], parity);
      IssueRecord<G, kBulk>(P, S, stage, next_id, h, lane, kWarpSize);
    }
  }
  __syncthreads();  // the ring's memory becomes the merge area
  LaunchDependents();  // the split merge may start launching (it waits for this grid's end)

  // Merge the warps: sums of l over the thread groups, then maxima and weights across warps.
  float l0 = W.l[0], l1 = W.l[1];
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, o);
    l1 += __shfl_xor_sync(0xffffffffu, l1, o);
  }
  if (g == 0) {
    S.wm[warp][2 * c] = W.m[0];
    S.wm[warp][2 * c + 1] = W.m[1];
    S.wl[warp][2 * c] = l0;
    S.wl[warp][2 * c + 1] = l1;
  }
  float* acc = S.u.merge.acc[warp];
#pragma unroll
  for (int mt = 0; mt < kKChunks; ++mt) {
    const int d = 16 * g + 2 * mt;
    acc[(2 * c) * kD + d] = W.acc[mt][0];
    acc[(2 * c + 1) * kD + d] = W.acc[mt][1];
    acc[(2 * c) * kD + d + 1] = W.acc[mt][2];
    acc[(2 * c + 1) * kD + d + 1] = W.acc[mt][3];
  }
  __syncthreads();
  if (tid < kRows) {
    float M = -INFINITY;
    for (int v = 0; v < kWarps; ++v) M = fmaxf(M, S.wm[v][tid]);
    float L = 0.f;
    for (int v = 0; v < kWarps; ++v) {
      if (S.wm[v][tid] != -INFINITY) L += S.wl[v][tid] * exp2f(S.wm[v][tid] - M);
    }
    S.m[tid] = M;
    S.l[tid] = L;
  }
  __syncthreads();
  float* out = S.u.merge.out;
  for (int idx = tid; idx < kRows * kD; idx += blockDim.x) {
    const int r = idx / kD;
    float o = 0.f;
    for (int v = 0; v < kWarps; ++v) {
      if (S.wm[v][r] != -INFINITY) o += S.u.merge.acc[v][idx] * exp2f(S.wm[v][r] - S.m[r]);
    }
    out[idx] = o;
  }
  __syncthreads();
  constexpr float kLn2 = 0.6931471805599453f;
  if (P.splits > 1) {
    for (int idx = tid; idx < kRows * kD; idx += blockDim.x) {
      const int r = idx / kD, d = idx % kD;
      if (S.qrow[r] < 0) continue;
      P.part_acc[(static_cast<size_t>(S.qrow[r]) * P.splits + split) * kD + d] = out[idx];
    }
    if (tid < kRows && S.qrow[tid] >= 0) {
      float* ml = P.part_ml + (static_cast<size_t>(S.qrow[tid]) * P.splits + split) * 2;
      ml[0] = S.m[tid] == -INFINITY ? -INFINITY : S.m[tid] * kLn2;  // natural-log domain
      ml[1] = S.l[tid];
    }
    return;
  }
  for (int idx = tid; idx < kRows * kD; idx += blockDim.x) {
    const int r = idx / kD;
    out[idx] = S.l[r] > 0.f ? out[idx] / S.l[r] : 0.f;
  }
  if (P.v_rotate) BlockFwht(out, kRows, kD, P.log2D);
  for (int idx = tid; idx < kRows * kD; idx += blockDim.x) {
    const int r = idx / kD, d = idx % kD;
    if (S.qrow[r] >= 0)
      StoreElem(P.out, static_cast<size_t>(S.qrow[r]) * kD + d, P.out_dtype, out[idx]);
  }
  if (P.lse && tid < kRows && S.qrow[tid] >= 0) {
    P.lse[S.qrow[tid]] = S.m[tid] * kLn2 + logf(S.l[tid]);
  }
#endif
}

}  // namespace mma
}  // namespace gpu
}  // namespace kvarn
