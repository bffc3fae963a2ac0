// The extend path on tensor cores (sm_80+): D128, G 64/128, 4-bit keys, 2-bit values, many query
// rows per sequence (chunked prefill, verification of long drafts). Included by
// attention_kernels.cu after attention_mma.cuh, whose MMA and unpack helpers it uses.
//
// FlashAttention-2 layout: a CTA takes 64 query rows (4 warps of 16, the MMA's M) of one
// (sequence, KV head, split) and walks the split's tiles in key order. Each tile is unpacked once
// by the whole CTA into shared memory and then read by every warp with ldmatrix, so the unpack
// is amortized over 64 rows (the decode kernel unpacks per 8 rows):
//   keys   ks[d][t] = code[d, t]           exact integers in fp16; the scales stay out so that
//                                           the scores keep the decode kernel's precision
//   values vs[t][d] = (code a'_t + z'_t) c'_d  dequantized to fp16 (the rounding only touches
//                                           the output, as flash attention's fp16 V does)
// and per warp, for its 16 rows,
//   S[n, t] = c_t * (sum_d (q'_n,d a_d) ks[d][t] + sum_d q'_n,d z_d)   (q a split hi + lo)
//   O[n, :] += softmax(S) vs                                           (P from registers)
// Two CTAs share an SM (111 KB of shared memory each), so one CTA's unpack and softmax overlap
// the other's tensor-core work. A record is copied (cp.async) into a one-record stage while the
// CTA computes on the previous tile; fp16 pages (sink, tail) are copied into the same layout.
// ks and vs rows are 16-byte chunks XOR-swizzled by row % 8, so the 8 rows an ldmatrix phase
// reads fall on distinct banks without padding.
//
// Unpacking with one shift and one LOP3 pairs code k with code k+4 of a 32-bit word of keys
// (8 tokens) and code k with code k+8 of a word of values (16 channels), so token and channel
// positions in ks/vs are permuted inside their 8 (16) groups: TokenPos / ChannelPos. Scores and
// probabilities live at token positions throughout; only the causal mask, the token scales and
// the final store translate.
#pragma once

#if !KVARN_GPU_HAS_MMA
#error "attention_extend.cuh is CUDA-only (inline PTX; 32-lane mma.sync/ldmatrix tiles)"
#endif

// The decode kernel's fragments, ring constants and code unpacking (mma::).
#include "backends/gpu/attention_mma.cuh"

namespace kvarn {
namespace gpu {
namespace ext {

constexpr int kD = 128;  // the extend kernel's shape: D128, k4v2
constexpr int kKChunks = kD / 16;

constexpr int kWarps = 4;
constexpr int kCtaRows = 16 * kWarps;  // query rows per CTA
constexpr int kCtasPerSm = 2;

template <int G>
struct Layout {
  static constexpr int kNT = G / 8;  // score n-tiles of 8 token positions
  static constexpr int kRecordBytes = mma::Shape<kD, G, 4, 2>::kRecordBytes;
  static constexpr int kStageBytes = mma::Shape<kD, G, 4, 2>::kStageBytes;
};

template <int G>
struct ExtendSmem {
  unsigned char stage[Layout<G>::kStageBytes];  // the next record (raw)
  __half ks[kD * G];  // key codes, [channel][token position] (swizzled: KsAt)
  __half vs[G * kD];  // values, [token position][channel position] (swizzled: VsAt)
  // The rows' queries (rotated, times scale * log2 e) in A-fragment order, one 8 KB slice per
  // warp; at the end each warp's outputs, [row][channel].
  float q[kCtaRows * kD];
  float ka[kD], kz[kD];  // the tile's key channel scales and zeros (pages: 1, 0)
  float kc[G];           // its key token scales by token position (pages: 1)
  int qrow[kCtaRows], limit[kCtaRows], lo[kCtaRows];  // rows and their keys [lo, limit)
};

// Token t's position inside its group of 8 (nibbles k and k+4 of a word side by side), and back.
__device__ __forceinline__ int TokenPos(int t) {
  return (t & ~7) | ((t & 3) << 1) | ((t >> 2) & 1);
}
// Channel d's position inside its group of 16 (2-bit fields k and k+8 side by side), and back.
__device__ __forceinline__ int ChannelPos(int d) {
  return (d & ~15) | ((d & 7) << 1) | ((d >> 3) & 1);
}
__device__ __forceinline__ int ChannelAt(int p) {
  return (p & ~15) | ((p & 15) >> 1) | ((p & 1) << 3);
}

// Offsets (halves) of element `col` of row `row` in a [rows][cols] fp16 array whose 16-byte
// chunks are XOR-swizzled by row % 8.
template <int kCols>
__device__ __forceinline__ int Swizzled(int row, int col) {
  return row * kCols + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

__device__ __forceinline__ __half2 U2H(uint32_t u) { return *reinterpret_cast<const __half2*>(&u); }
__device__ __forceinline__ uint32_t H2U(__half2 h) {
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Four 8x8 fp16 matrices, transposed: B fragments of two n-tiles from a [k][n] array.
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __half* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(mma::SmemAddr(p))
               : "memory");
#endif
}
__device__ __forceinline__ void CpAsyncCommit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Unpacks the record in `rec` (shared memory) into ks, vs and the key scales; whole CTA.
template <int G>
__device__ __forceinline__ void UnpackRecord(const AttnParams& P, const uint8_t* rec,
                                             ExtendSmem<G>& S) {
  const __half2 bias = __float2half2_rn(mma::kCodeBias);
  // Keys: 4 words (32 tokens) of one channel row per thread and step; (1024 + code) - 1024 is
  // exact.
  constexpr int kQuadsPerRow = G / 32;
  for (int idx = threadIdx.x; idx < kD * kQuadsPerRow; idx += blockDim.x) {
    const int d = idx / kQuadsPerRow, w0 = 4 * (idx % kQuadsPerRow);
    const uint4 u = *reinterpret_cast<const uint4*>(rec + P.off_kcodes + d * (G / 2) + 4 * w0);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      uint32_t h[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // tokens 8w + k and 8w + k + 4: positions 2k, 2k + 1
        h[k] = H2U(__hsub2(U2H(mma::BiasedCodes<0x0F>(words[e] >> (4 * k))), bias));
      }
      *reinterpret_cast<uint4*>(S.ks + Swizzled<G>(d, 8 * (w0 + e))) =
          make_uint4(h[0], h[1], h[2], h[3]);
    }
  }
  // Values: 4 words (64 channels) of one token row per thread and step.
  const __half* va = reinterpret_cast<const __half*>(rec + P.off_va);
  const __half* vz = reinterpret_cast<const __half*>(rec + P.off_vz);
  for (int idx = threadIdx.x; idx < G * 2; idx += blockDim.x) {
    const int t = idx / 2, w0 = 4 * (idx % 2);
    const uint4 u = *reinterpret_cast<const uint4*>(rec + P.off_vcodes + t * (kD / 4) + 4 * w0);
    const uint32_t words[4] = {u.x, u.y, u.z, u.w};
    const __half2 a = __half2half2(va[t]), z = __half2half2(vz[t]);
    const int tp = TokenPos(t);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int w = w0 + e;  // channels 16w .. 16w + 15
      const uint4 cl = *reinterpret_cast<const uint4*>(rec + P.off_vc + 2 * (16 * w));
      const uint4 ch = *reinterpret_cast<const uint4*>(rec + P.off_vc + 2 * (16 * w + 8));
      const uint32_t lo[4] = {cl.x, cl.y, cl.z, cl.w}, hi[4] = {ch.x, ch.y, ch.z, ch.w};
      uint32_t h[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {  // channels 16w + k and 16w + k + 8: positions 2k, 2k + 1
        const uint32_t c = __byte_perm(lo[k / 2], hi[k / 2], (k & 1) ? 0x7632 : 0x5410);
        const __half2 x = __hsub2(U2H(mma::BiasedCodes<0x03>(words[e] >> (2 * k))), bias);
        h[k] = H2U(__hmul2(__hfma2(x, a, z), U2H(c)));
      }
      *reinterpret_cast<uint4*>(S.vs + Swizzled<kD>(tp, 16 * w)) =
          make_uint4(h[0], h[1], h[2], h[3]);
      *reinterpret_cast<uint4*>(S.vs + Swizzled<kD>(tp, 16 * w + 8)) =
          make_uint4(h[4], h[5], h[6], h[7]);
    }
  }
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    S.ka[d] = HalfAt(rec + P.off_ka, d);
    S.kz[d] = HalfAt(rec + P.off_kz, d);
  }
  for (int t = threadIdx.x; t < G; t += blockDim.x) S.kc[TokenPos(t)] = HalfAt(rec + P.off_kc, t);
}

// Copies an fp16 page tile (global memory) into the same layout, unit scales; rows from `valid`
// on may hold anything (even NaN) and are stored as zeros.
template <int G>
__device__ __forceinline__ void CopyPage(const __half* kp, const __half* vp, int valid,
                                         ExtendSmem<G>& S) {
  for (int idx = threadIdx.x; idx < G * (kD / 8); idx += blockDim.x) {
    const int t = idx / (kD / 8), d0 = 8 * (idx % (kD / 8));
    uint4 ku = make_uint4(0, 0, 0, 0), vu = ku;
    if (t < valid) {
      ku = __ldg(reinterpret_cast<const uint4*>(kp + static_cast<size_t>(t) * kD + d0));
      vu = __ldg(reinterpret_cast<const uint4*>(vp + static_cast<size_t>(t) * kD + d0));
    }
    const __half* kh = reinterpret_cast<const __half*>(&ku);
    const __half* vh = reinterpret_cast<const __half*>(&vu);
    const int tp = TokenPos(t);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      S.ks[Swizzled<G>(d0 + e, tp)] = kh[e];
      S.vs[Swizzled<kD>(tp, ChannelPos(d0 + e))] = vh[e];
    }
  }
  for (int d = threadIdx.x; d < kD; d += blockDim.x) {
    S.ka[d] = 1.f;
    S.kz[d] = 0.f;
  }
  for (int t = threadIdx.x; t < G; t += blockDim.x) S.kc[t] = 1.f;
}

// One warp's online-softmax state for its 16 rows: lane (g, c) holds rows g and g + 8.
struct RowState {
  float m[2], l[2];    // running max (log2 domain) and this lane's partial sum
  float o[kD / 8][4];  // O fragments: n-tile nt = channel positions 8nt + 2c, +1
};

// One warp's pass over the tile in ks/vs (keys from key0): scores, softcap (cap2 = c log2 e;
// 0 = off), softmax, values. kMask: some key of the tile lies outside some key range [lo, limit)
// of the warp's rows r0 (lanes' rows g) and r0 + 8.
template <int G, bool kMask>
__device__ __forceinline__ void WarpTile(const ExtendSmem<G>& S, const float4* qfrag, int key0,
                                         int r0, float cap2, RowState& R) {
  using L = Layout<G>;
  constexpr int NT = L::kNT;
  const int lane = threadIdx.x % kWarpSize, c = lane & 3;
  float s[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
  float qz0 = 0.f, qz1 = 0.f;
  const float2* ka = reinterpret_cast<const float2*>(S.ka);
  const float2* kz = reinterpret_cast<const float2*>(S.kz);
  // ldmatrix row addresses: matrix lane / 8 = (k half, n half), row lane % 8. The matrices of
  // n-tile pair np sit in 16-byte chunk 2np + lane / 16 of their rows, stored at chunk
  // (2np + lane / 16) ^ (row % 8) = 2np ^ x (2np is even): four patterns, then +8 chunks.
  const int ld_row = (lane & 8) + (lane & 7), x = ((lane >> 4) ^ lane) & 7;
  int chunk_off[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) chunk_off[j] = ((2 * j) ^ x) * 8;
  const __half* kbase = S.ks + ld_row * G;
#pragma unroll
  for (int i = 0; i < kKChunks; ++i) {
    // A fragments (rows g, g + 8; channels 16i + 2c, +1 and 16i + 2c + 8, +9) of q' a.
    const float4 x = qfrag[(2 * i) * kWarpSize + lane], y = qfrag[(2 * i + 1) * kWarpSize + lane];
    const float2 a01 = ka[8 * i + c], a23 = ka[8 * i + 4 + c];
    const float2 z01 = kz[8 * i + c], z23 = kz[8 * i + 4 + c];
    uint32_t hi[4], lo[4];
    mma::SplitHalf2(x.x * a01.x, x.y * a01.y, &hi[0], &lo[0]);
    mma::SplitHalf2(x.z * a01.x, x.w * a01.y, &hi[1], &lo[1]);
    mma::SplitHalf2(y.x * a23.x, y.y * a23.y, &hi[2], &lo[2]);
    mma::SplitHalf2(y.z * a23.x, y.w * a23.y, &hi[3], &lo[3]);
    qz0 += x.x * z01.x + x.y * z01.y + y.x * z23.x + y.y * z23.y;
    qz1 += x.z * z01.x + x.w * z01.y + y.z * z23.x + y.w * z23.y;
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t b[4];
      LdMatrixX4Trans(b, kbase + (16 * i) * G + chunk_off[np & 3] + 64 * (np >> 2));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma::Mma16816(s[2 * np], hi, b0);
      mma::Mma16816(s[2 * np], lo, b0);
      mma::Mma16816(s[2 * np + 1], hi, b1);
      mma::Mma16816(s[2 * np + 1], lo, b1);
    }
  }
#pragma unroll
  for (int o = 1; o < 4; o *= 2) {
    qz0 += __shfl_xor_sync(kFullMask, qz0, o);
    qz1 += __shfl_xor_sync(kFullMask, qz1, o);
  }

  // Softmax. Score columns 2c, 2c + 1 of n-tile nt are token positions 8nt + 2c, +1: tokens
  // 8nt + c and 8nt + c + 4.
  const float2* kc = reinterpret_cast<const float2*>(S.kc);
  float mx0 = -INFINITY, mx1 = -INFINITY;
  int lim0 = 0, lim1 = 0, lo0 = 0, lo1 = 0;
  if (kMask) {
    lim0 = S.limit[r0];
    lim1 = S.limit[r0 + 8];
    lo0 = S.lo[r0];
    lo1 = S.lo[r0 + 8];
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 ct = kc[4 * nt + c];
    float v0 = ct.x * (s[nt][0] + qz0), v1 = ct.y * (s[nt][1] + qz0);
    float v2 = ct.x * (s[nt][2] + qz1), v3 = ct.y * (s[nt][3] + qz1);
    if (cap2 > 0.f) {
      v0 = Softcap(v0, cap2);
      v1 = Softcap(v1, cap2);
      v2 = Softcap(v2, cap2);
      v3 = Softcap(v3, cap2);
    }
    if (kMask) {
      const int t0 = key0 + 8 * nt + c, t1 = t0 + 4;
      v0 = t0 < lim0 && t0 >= lo0 ? v0 : -INFINITY;
      v1 = t1 < lim0 && t1 >= lo0 ? v1 : -INFINITY;
      v2 = t0 < lim1 && t0 >= lo1 ? v2 : -INFINITY;
      v3 = t1 < lim1 && t1 >= lo1 ? v3 : -INFINITY;
    }
    s[nt][0] = v0;
    s[nt][1] = v1;
    s[nt][2] = v2;
    s[nt][3] = v3;
    mx0 = fmaxf(mx0, fmaxf(v0, v1));
    mx1 = fmaxf(mx1, fmaxf(v2, v3));
  }
#pragma unroll
  for (int o = 1; o < 4; o *= 2) {
    mx0 = fmaxf(mx0, __shfl_xor_sync(kFullMask, mx0, o));
    mx1 = fmaxf(mx1, __shfl_xor_sync(kFullMask, mx1, o));
  }
  const float mn0 = fmaxf(R.m[0], mx0), mn1 = fmaxf(R.m[1], mx1);
  // A row with no key yet keeps m = -inf; subtracting 0 then gives 2^-inf = 0 for p and alpha.
  const float ms0 = mn0 == -INFINITY ? 0.f : mn0, ms1 = mn1 == -INFINITY ? 0.f : mn1;
  const float alpha0 = mma::FastExp2(R.m[0] - ms0), alpha1 = mma::FastExp2(R.m[1] - ms1);
  R.m[0] = mn0;
  R.m[1] = mn1;
  float sum0 = 0.f, sum1 = 0.f;
  uint32_t pa[NT][2];  // fp16 P pairs of rows g and g + 8: the A fragments of the value product
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float p0 = mma::FastExp2(s[nt][0] - ms0), p1 = mma::FastExp2(s[nt][1] - ms0);
    const float p2 = mma::FastExp2(s[nt][2] - ms1), p3 = mma::FastExp2(s[nt][3] - ms1);
    sum0 += p0 + p1;
    sum1 += p2 + p3;
    pa[nt][0] = mma::PackHalf2(p0, p1);
    pa[nt][1] = mma::PackHalf2(p2, p3);
  }
  R.l[0] = R.l[0] * alpha0 + sum0;
  R.l[1] = R.l[1] * alpha1 + sum1;
  if (__any_sync(kFullMask, alpha0 != 1.f || alpha1 != 1.f)) {  // most tiles keep the max
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      R.o[nt][0] *= alpha0;
      R.o[nt][1] *= alpha0;
      R.o[nt][2] *= alpha1;
      R.o[nt][3] *= alpha1;
    }
  }

  // Values: k-chunk kk = token positions 16kk .. 16kk + 15 = score n-tiles 2kk, 2kk + 1.
  const __half* vbase = S.vs + ld_row * kD;
#pragma unroll
  for (int kk = 0; kk < G / 16; ++kk) {
    const uint32_t a[4] = {pa[2 * kk][0], pa[2 * kk][1], pa[2 * kk + 1][0], pa[2 * kk + 1][1]};
#pragma unroll
    for (int np = 0; np < kD / 16; ++np) {
      uint32_t b[4];
      LdMatrixX4Trans(b, vbase + (16 * kk) * kD + chunk_off[np & 3] + 64 * (np >> 2));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma::Mma16816(R.o[2 * np], a, b0);
      mma::Mma16816(R.o[2 * np + 1], a, b1);
    }
  }
}

// Starts the copy of tile k of the split into the stage when it is a record with a valid table
// entry (else nothing) and commits it.
template <int G>
__device__ __forceinline__ void IssueTile(const AttnParams& P, ExtendSmem<G>& S,
                                          const int32_t* table, int t_begin, int ntiles, int r_lo,
                                          int r_hi, int h, int k) {
  if (k < ntiles) {
    const int tile = t_begin + k;
    const int id = table[tile];
    if (tile >= r_lo && tile < r_hi && id >= 0 && id < P.num_record_blocks) {
      const uint8_t* src = mma::RecordAt(P, id, h);
      unsigned char* dst = S.stage;
      for (int off = threadIdx.x * 16; off < Layout<G>::kRecordBytes; off += blockDim.x * 16) {
        mma::CpAsync16(dst + off, src + off);
      }
    }
  }
  CpAsyncCommit();
}

template <int G>
__global__ void __launch_bounds__(kWarps * 32, kCtasPerSm) ExtendAttentionKernel(AttnParams P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  extern __shared__ __align__(128) unsigned char smem_raw[];
  ExtendSmem<G>& S = *reinterpret_cast<ExtendSmem<G>*>(smem_raw);
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int g = lane >> 2, c = lane & 3;
  WorkItem w;
  if (!ReadWorkItem(P, G, kCtaRows, &w)) return;
  const int split = w.split, h = w.h, b = w.b, N = w.N;
  // Tiles wholly before the first row's window are never read.
  const int t_begin = FirstVisibleTile(P, w, G) + split * P.tiles_per_split;
  const int t_end = min(w.tiles, t_begin + P.tiles_per_split);
  const int ntiles = max(0, t_end - t_begin);
  const int r_lo = max(t_begin, P.sink_tiles), r_hi = min(t_end, P.sink_tiles + w.rt);
  const int32_t* table = P.block_table + static_cast<size_t>(b) * P.max_blocks;

  if (tid < kCtaRows) SetRow(P, w, tid, S.qrow, S.limit, S.lo);
  __syncthreads();
  // The first record loads while the queries are set up.
  IssueTile<G>(P, S, table, t_begin, ntiles, r_lo, r_hi, h, 0);

  for (int idx = tid; idx < kCtaRows * kD; idx += blockDim.x) {
    const int r = idx / kD, d = idx % kD;
    S.q[idx] = S.qrow[r] >= 0
                   ? LoadElem(P.q, RowElement(S.qrow[r], P.Hq, P.q_stride, kD, d), P.q_dtype)
                   : 0.f;
  }
  __syncthreads();
  if (P.k_rotate) BlockFwht(S.q, kCtaRows, kD, P.log2D);
  // Each warp reorders its own 16 rows into A-fragment order (scores in the log2 domain).
  const float qscale = P.scale * 1.4426950408889634f;
  float* qslice = S.q + warp * 16 * kD;
  {
    float v[kKChunks][8];
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {  // (row g, g + 8) x (channel 16i + 2c + {0, 1}, + 8)
        const int row = g + 8 * ((e >> 1) & 1), d = 16 * i + 2 * c + (e & 1) + 8 * (e >> 2);
        v[i][e] = qslice[row * kD + d] * qscale;
      }
    }
    __syncwarp();
    float4* frag = reinterpret_cast<float4*>(qslice);
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      frag[(2 * i) * kWarpSize + lane] = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
      frag[(2 * i + 1) * kWarpSize + lane] = make_float4(v[i][4], v[i][5], v[i][6], v[i][7]);
    }
    __syncwarp();
  }
  const float4* qfrag = reinterpret_cast<const float4*>(qslice);
  const int r0 = 16 * warp + g, r1 = r0 + 8;
  // The warp's key ranges over its valid rows: no mask for a tile inside [lo_max, lmin), nothing
  // to do for one wholly outside [lo_min, lmax).
  int lmin = INT_MAX, lmax = 0, lo_min = INT_MAX, lo_max = 0;
  if (S.qrow[r0] >= 0) {
    lmin = min(lmin, S.limit[r0]), lmax = max(lmax, S.limit[r0]);
    lo_min = min(lo_min, S.lo[r0]), lo_max = max(lo_max, S.lo[r0]);
  }
  if (S.qrow[r1] >= 0) {
    lmin = min(lmin, S.limit[r1]), lmax = max(lmax, S.limit[r1]);
    lo_min = min(lo_min, S.lo[r1]), lo_max = max(lo_max, S.lo[r1]);
  }
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    lmin = min(lmin, __shfl_xor_sync(kFullMask, lmin, o));
    lmax = max(lmax, __shfl_xor_sync(kFullMask, lmax, o));
    lo_min = min(lo_min, __shfl_xor_sync(kFullMask, lo_min, o));
    lo_max = max(lo_max, __shfl_xor_sync(kFullMask, lo_max, o));
  }
  const float cap2 = P.softcap * 1.4426950408889634f;

  RowState R;
  R.m[0] = R.m[1] = -INFINITY;
  R.l[0] = R.l[1] = 0.f;
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) R.o[nt][0] = R.o[nt][1] = R.o[nt][2] = R.o[nt][3] = 0.f;
  for (int k = 0; k < ntiles; ++k) {
    CpAsyncWait<0>();  // tile k's copies (this thread's) have landed
    __syncthreads();   // everyone's; ks/vs are free
    const int tile = t_begin + k;
    const bool is_record = tile >= r_lo && tile < r_hi;
    const int id = table[tile];
    const __half* kp = nullptr;
    const __half* vp = nullptr;
    const bool ok = is_record ? id >= 0 && id < P.num_record_blocks
                              : FpTileRows(P, w, table, tile, G, kD, &kp, &vp);
    if (!ok) {
      if (tid == 0) ReportAttentionError(P, b, kErrBlockTable, tile);
    } else if (is_record) {
      UnpackRecord<G>(P, S.stage, S);
    } else {
      CopyPage<G>(kp, vp, min(G, N - tile * G), S);
    }
    __syncthreads();  // ks/vs are ready; the stage is free for the next record
    IssueTile<G>(P, S, table, t_begin, ntiles, r_lo, r_hi, h, k + 1);
    const int key0 = tile * G;
    if (ok && key0 < lmax && key0 + G > lo_min) {
      if (key0 + G > lmin || key0 < lo_max) {
        WarpTile<G, true>(S, qfrag, key0, r0, cap2, R);
      } else {
        WarpTile<G, false>(S, qfrag, key0, r0, cap2, R);
      }
    }
  }
  CpAsyncWait<0>();

  float l0 = R.l[0], l1 = R.l[1];
#pragma unroll
  for (int o = 1; o < 4; o *= 2) {
    l0 += __shfl_xor_sync(kFullMask, l0, o);
    l1 += __shfl_xor_sync(kFullMask, l1, o);
  }
  const int q0 = S.qrow[r0], q1 = S.qrow[r1];
  constexpr float kLn2 = 0.6931471805599453f;
  if (P.splits > 1) {
    // Partial state for the merge kernel (m in the natural-log domain; an empty split has
    // m = -inf).
#pragma unroll
    for (int nt = 0; nt < kD / 8; ++nt) {
      const int d0 = ChannelAt(8 * nt + 2 * c), d1 = ChannelAt(8 * nt + 2 * c + 1);
      if (q0 >= 0) {
        float* acc = P.part_acc + (static_cast<size_t>(q0) * P.splits + split) * kD;
        acc[d0] = R.o[nt][0];
        acc[d1] = R.o[nt][1];
      }
      if (q1 >= 0) {
        float* acc = P.part_acc + (static_cast<size_t>(q1) * P.splits + split) * kD;
        acc[d0] = R.o[nt][2];
        acc[d1] = R.o[nt][3];
      }
    }
    if (c == 0) {
      if (q0 >= 0) {
        float* ml = P.part_ml + (static_cast<size_t>(q0) * P.splits + split) * 2;
        ml[0] = R.m[0] == -INFINITY ? -INFINITY : R.m[0] * kLn2;
        ml[1] = l0;
      }
      if (q1 >= 0) {
        float* ml = P.part_ml + (static_cast<size_t>(q1) * P.splits + split) * 2;
        ml[0] = R.m[1] == -INFINITY ? -INFINITY : R.m[1] * kLn2;
        ml[1] = l1;
      }
    }
    return;
  }
  // One split: fold in the sink logits (log2 domain), normalize into the warp's own slice (its
  // query fragments are no longer read), un-rotate over the CTA, store.
  const auto exp2 = [](float x) { return exp2f(x); };
  constexpr float kLog2e = 1.4426950408889634f;
  const float a0 =
      FoldSink(P.sinks && q0 >= 0 ? P.sinks[q0 % P.Hq] * kLog2e : -INFINITY, &R.m[0], &l0, exp2);
  const float a1 =
      FoldSink(P.sinks && q1 >= 0 ? P.sinks[q1 % P.Hq] * kLog2e : -INFINITY, &R.m[1], &l1, exp2);
  const float inv0 = l0 > 0.f ? a0 / l0 : 0.f, inv1 = l1 > 0.f ? a1 / l1 : 0.f;
#pragma unroll
  for (int nt = 0; nt < kD / 8; ++nt) {
    const int d0 = ChannelAt(8 * nt + 2 * c), d1 = ChannelAt(8 * nt + 2 * c + 1);
    qslice[g * kD + d0] = R.o[nt][0] * inv0;
    qslice[g * kD + d1] = R.o[nt][1] * inv0;
    qslice[(g + 8) * kD + d0] = R.o[nt][2] * inv1;
    qslice[(g + 8) * kD + d1] = R.o[nt][3] * inv1;
  }
  __syncthreads();
  if (P.v_rotate) BlockFwht(S.q, kCtaRows, kD, P.log2D);
  for (int idx = tid; idx < kCtaRows * kD; idx += blockDim.x) {
    const int r = idx / kD, d = idx % kD;
    if (S.qrow[r] >= 0) {
      StoreElem(P.out, RowElement(S.qrow[r], P.Hq, P.out_stride, kD, d), P.out_dtype, S.q[idx]);
    }
  }
  if (P.lse && c == 0) {
    if (q0 >= 0) P.lse[q0] = R.m[0] * kLn2 + logf(l0);
    if (q1 >= 0) P.lse[q1] = R.m[1] * kLn2 + logf(l1);
  }
#endif
}

}  // namespace ext
}  // namespace gpu
}  // namespace kvarn
