// One tile matrix (K or V of one record) quantized by one CTA: variance normalization
// (docs/FORMAT.md section 4), round-to-nearest (section 5), scale absorption (section 6) and
// packing (section 7). The fp16 tile stays in shared memory for all iterations (or, where the
// device has too little shared memory for the largest tiles, is re-read from global memory through
// L1/L2).
//
// Thread layout (TileShape): the G x D fp16 tile (token-major, as pages store it) is spread over
// kWarps warps; a warp's lanes form kRowsPerWarp row groups of kLanes lanes (RowLayout<D>), and
// each thread owns kTPT consecutive tokens x kPL channels (chunks of 8 consecutive channels, one
// 16-byte load each). Reductions over channels (per token) are xor-shuffles inside a row group;
// reductions over tokens (per channel) are shuffles across the row groups of a warp, then one
// smem partial per warp summed in a fixed order by thread d. All sums are fp32 trees in a fixed
// order, so a shape always gives the same bits.
//
// Numerics (docs/FORMAT.md section 10: >= 99.99% identical codes vs the CPU reference, not byte
// identity): the deviations of X = (M / e_c) / e_r are computed as w_r * std(M * w_c) with
// reciprocal weights w = exp(-l) (the deviation is scale-equivariant), in fp32 with two passes
// (mean, then squared deviations). The balanced tile B that defines the codes uses IEEE divisions
// in the reference's order (column scale first), so codes match wherever the scales do.
#pragma once

#include <cstdint>

#include "backends/gpu/gpu_common.cuh"
#include "backends/gpu/hadamard_fwht.cuh"

namespace kvarn {
namespace gpu {

constexpr float kStdMin = 1e-3f, kStdMax = 1e3f;
constexpr float kLogMin = -0.3f, kLogMax = 10.0f;
constexpr float kImbFloor = 1e-8f;

template <int D, int G>
struct TileShape {
  using Row = RowLayout<D>;
  static constexpr int kThreads = (D * G / 64 < 512) ? D * G / 64 : 512;
  static constexpr int kWarps = kThreads / kWarpSize;
  static constexpr int kPL = Row::kPerLane;
  static constexpr int kTPT = G / (Row::kRowsPerWarp * kWarps);
  static_assert(kTPT * kPL * kThreads == D * G, "tile layout");
  static_assert(kTPT >= 4 && kThreads >= D, "tile layout");
  static_assert(kThreads % kMaxWarpSize == 0, "whole warps on every target (G >= 64)");
  // CTAs per SM the register budget aims for (about 80 registers per thread below 512 threads).
  static constexpr int kMinBlocks = kThreads >= 512 ? 1 : 65536 / (kThreads * 80);

  // Dynamic shared memory, in floats: red[W][D], six per-channel vectors, mm[2][W][4];
  // then the fp16 tile when it is kept in shared memory.
  static constexpr size_t kAuxFloats = static_cast<size_t>(kWarps) * D + 6 * D + G + 2 * kWarps * 4;
  static constexpr size_t kAuxBytes = (kAuxFloats * 4 + 15) / 16 * 16;
  static constexpr size_t kTileBytes = static_cast<size_t>(G) * D * 2;
};

template <int D, int G>
struct TileSmem {
  static constexpr int W = TileShape<D, G>::kWarps;
  float* red;    // [W][D] per-warp partials over tokens, per channel
  float* chv;    // [D] a reduced per-channel value (mean, min)
  float* chv2;   // [D] a second one (max, deviation)
  float* cl;     // [D] channel log scale
  float* cbest;  // [D] channel log scale of the best iterate
  float* cw;     // [D] channel weight (exp(-cl), later the scale exp(cbest))
  float* cstd;   // [D] channel deviation of the current iterate
  float* mm;     // [2][W][4] min/max partials (double-buffered by iteration)
  __device__ explicit TileSmem(float* base) {
    red = base;
    chv = red + W * D;
    chv2 = chv + D;
    cl = chv2 + D;
    cbest = cl + D;
    cw = cbest + D;
    cstd = cw + D;
    mm = cstd + D;
  }
  __device__ float& MM(int parity, int warp, int i) { return mm[(parity * W + warp) * 4 + i]; }
};

// Byte offsets of the record fields (docs/FORMAT.md section 7).
struct RecordOffsets {
  uint32_t off[KVARN_FIELD_COUNT];
};

__device__ __forceinline__ float ClampF(float x, float lo, float hi) {
  return fminf(fmaxf(x, lo), hi);
}

template <int D, int G>
struct TileCta {
  using S = TileShape<D, G>;
  using L = typename S::Row;
  static constexpr int kTPT = S::kTPT, kPL = S::kPL, W = S::kWarps;

  int tid, warp, lane, ld, lt, t0;
  const uint16_t* tile;  // G x D fp16, token-major (shared or global memory)

  __device__ explicit TileCta(const uint16_t* t) : tile(t) {
    tid = threadIdx.x;
    warp = tid / kWarpSize;
    lane = tid % kWarpSize;
    ld = lane % L::kLanes;
    lt = lane / L::kLanes;
    t0 = (warp * L::kRowsPerWarp + lt) * kTPT;
  }
  __device__ __forceinline__ int Chan(int j) const { return L::Channel(ld, j / 8) + (j % 8); }

  // The thread's 8 values of chunk c of its token k, and all kPL values of its token k.
  __device__ __forceinline__ void LoadChunk(int k, int c, float* x) const {
    const uint4 u =
        *reinterpret_cast<const uint4*>(tile + static_cast<size_t>(t0 + k) * D + L::Channel(ld, c));
    Unpack8Halves(u, x);
  }
  __device__ __forceinline__ void LoadRow(int k, float (&x)[kPL]) const {
#pragma unroll
    for (int c = 0; c < L::kChunks; ++c) LoadChunk(k, c, &x[c * 8]);
  }

  // Sum / min / max over the channels of a row group (every lane gets the result).
  __device__ __forceinline__ static float SumLanes(float x) {
#pragma unroll
    for (int m = 1; m < L::kLanes; m *= 2) x += __shfl_xor_sync(kFullMask, x, m);
    return x;
  }
  __device__ __forceinline__ static float MinLanes(float x) {
#pragma unroll
    for (int m = 1; m < L::kLanes; m *= 2) x = fminf(x, __shfl_xor_sync(kFullMask, x, m));
    return x;
  }
  __device__ __forceinline__ static float MaxLanes(float x) {
#pragma unroll
    for (int m = 1; m < L::kLanes; m *= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, m));
    return x;
  }
  template <int N>
  __device__ __forceinline__ static float TreeSum(float (&a)[N]) {
#pragma unroll
    for (int w = 1; w < N; w *= 2) {
#pragma unroll
      for (int i = 0; i + w < N; i += 2 * w) a[i] += a[i + w];
    }
    return a[0];
  }

  // Per-channel total over all tokens of per-thread partials p[j] (kOp 0 sum, 1 min, 2 max)
  // into out[d], visible to all threads on return.
  template <int kOp>
  __device__ __forceinline__ void ReduceTokens(float (&p)[kPL], float* out,
                                               TileSmem<D, G>& s) const {
#pragma unroll
    for (int j = 0; j < kPL; ++j) {
#pragma unroll
      for (int m = L::kLanes; m < kWarpSize; m *= 2) {
        const float o = __shfl_xor_sync(kFullMask, p[j], m);
        p[j] = kOp == 0 ? p[j] + o : (kOp == 1 ? fminf(p[j], o) : fmaxf(p[j], o));
      }
    }
    if (lt == 0) {
#pragma unroll
      for (int c = 0; c < L::kChunks; ++c) {
        float4* dst = reinterpret_cast<float4*>(s.red + warp * D + L::Channel(ld, c));
        dst[0] = make_float4(p[c * 8], p[c * 8 + 1], p[c * 8 + 2], p[c * 8 + 3]);
        dst[1] = make_float4(p[c * 8 + 4], p[c * 8 + 5], p[c * 8 + 6], p[c * 8 + 7]);
      }
    }
    __syncthreads();
    if (tid < D) {
      float a = s.red[tid];
#pragma unroll
      for (int w = 1; w < W; ++w) {
        const float o = s.red[w * D + tid];
        a = kOp == 0 ? a + o : (kOp == 1 ? fminf(a, o) : fmaxf(a, o));
      }
      out[tid] = a;
    }
    __syncthreads();
  }

  // Deviation over channels of M * wc (wc: the weights of the thread's channels) of every token
  // of the row group, returned for the lane's own token t0 + ld (lanes ld < kTPT; the others get
  // a copy of token t0). The row stays in registers between the two passes.
  __device__ __forceinline__ float TokenStd(const float (&wc)[kPL]) const {
    float own = 0.f;
#pragma unroll
    for (int k = 0; k < kTPT; ++k) {
      float x[kPL], a[kPL];
      LoadRow(k, x);
#pragma unroll
      for (int j = 0; j < kPL; ++j) x[j] *= wc[j], a[j] = x[j];
      const float mean = SumLanes(TreeSum<kPL>(a)) * (1.0f / D);
#pragma unroll
      for (int j = 0; j < kPL; ++j) {
        const float dv = x[j] - mean;
        a[j] = dv * dv;
      }
      const float ss = SumLanes(TreeSum<kPL>(a));
      if (k == 0 || k == ld) own = ss;
    }
    return sqrtf(own * (1.0f / static_cast<float>(D - 1)));
  }

  // v[k] = the value of lane k of this row group (the owner of token t0 + k).
  __device__ __forceinline__ void FromOwners(float own, float (&v)[kTPT]) const {
#pragma unroll
    for (int k = 0; k < kTPT; ++k) v[k] = __shfl_sync(kFullMask, own, lane - ld + k);
  }

  // Deviation over tokens of every channel of M * wt (wt: weights of the thread's tokens), into
  // out[d] for tid < D (the caller synchronizes before others read it).
  __device__ __forceinline__ void ChannelStd(const float (&wt)[kTPT], float* out,
                                             TileSmem<D, G>& s) const {
    float p[kPL];
#pragma unroll
    for (int j = 0; j < kPL; ++j) p[j] = 0.f;
#pragma unroll
    for (int k = 0; k < kTPT; ++k) {
      float x[kPL];
      LoadRow(k, x);
#pragma unroll
      for (int j = 0; j < kPL; ++j) p[j] += x[j] * wt[k];
    }
    ReduceTokens<0>(p, s.chv, s);
    float mean[kPL];
#pragma unroll
    for (int j = 0; j < kPL; ++j) mean[j] = s.chv[Chan(j)] * (1.0f / G), p[j] = 0.f;
#pragma unroll
    for (int k = 0; k < kTPT; ++k) {
      float x[kPL];
      LoadRow(k, x);
#pragma unroll
      for (int j = 0; j < kPL; ++j) {
        const float dv = x[j] * wt[k] - mean[j];
        p[j] += dv * dv;
      }
    }
    ReduceTokens<0>(p, out, s);
    if (tid < D) out[tid] = sqrtf(out[tid] * (1.0f / static_cast<float>(G - 1)));
  }

  // imb = max/min of the token deviations (one per owner lane) + max/min of the channel
  // deviations (s.cstd, visible), identical in every thread.
  __device__ __forceinline__ float Imbalance(float tstd_own, TileSmem<D, G>& s, int parity) const {
    float tmin = tstd_own, tmax = tstd_own;  // non-owner lanes hold a copy of token t0
    float cmin = 3.0e38f, cmax = -3.0e38f;
    if (tid < D) cmin = s.cstd[tid], cmax = s.cstd[tid];
#pragma unroll
    for (int m = 1; m < kWarpSize; m *= 2) {
      tmin = fminf(tmin, __shfl_xor_sync(kFullMask, tmin, m));
      tmax = fmaxf(tmax, __shfl_xor_sync(kFullMask, tmax, m));
      cmin = fminf(cmin, __shfl_xor_sync(kFullMask, cmin, m));
      cmax = fmaxf(cmax, __shfl_xor_sync(kFullMask, cmax, m));
    }
    if (lane == 0) {
      s.MM(parity, warp, 0) = tmin;
      s.MM(parity, warp, 1) = tmax;
      s.MM(parity, warp, 2) = cmin;
      s.MM(parity, warp, 3) = cmax;
    }
    __syncthreads();
    tmin = s.MM(parity, 0, 0), tmax = s.MM(parity, 0, 1);
    cmin = s.MM(parity, 0, 2), cmax = s.MM(parity, 0, 3);
#pragma unroll
    for (int w = 1; w < W; ++w) {
      tmin = fminf(tmin, s.MM(parity, w, 0));
      tmax = fmaxf(tmax, s.MM(parity, w, 1));
      cmin = fminf(cmin, s.MM(parity, w, 2));
      cmax = fmaxf(cmax, s.MM(parity, w, 3));
    }
    return tmax / fmaxf(tmin, kImbFloor) + cmax / fmaxf(cmin, kImbFloor);
  }

  __device__ __forceinline__ void LoadChannelVec(const float* src, float (&w)[kPL]) const {
#pragma unroll
    for (int j = 0; j < kPL; ++j) w[j] = src[Chan(j)];
  }

  // Section 4: leaves the scales of the best iterate in st (the thread's tokens) and s.cw
  // (channels, visible to all on return). kRowsTok: rows are tokens (V), else channels (K).
  // Token state (log scale, weight, deviation, best) lives in the owner lane of each token
  // (lane ld = k of the row group holds token t0 + k), so each log/exp runs once per token;
  // the weights reach the other lanes by shuffles. Channel state lives in smem, thread d owns d.
  template <bool kRowsTok>
  __device__ void Normalize(int iterations, TileSmem<D, G>& s, float (&st)[kTPT]) const {
    float tl = 0.f, tbest = 0.f, tw_own = 1.f, tw[kTPT], wc[kPL];
#pragma unroll
    for (int k = 0; k < kTPT; ++k) tw[k] = 1.f;
#pragma unroll
    for (int j = 0; j < kPL; ++j) wc[j] = 1.f;
    if (tid < D) s.cl[tid] = 0.f, s.cbest[tid] = 0.f, s.cw[tid] = 1.f;
    float tstd = TokenStd(wc);
    ChannelStd(tw, s.cstd, s);
    __syncthreads();
    float best = Imbalance(tstd, s, 0);
    for (int it = 1; it <= iterations; ++it) {
      if (kRowsTok) {
        // V: columns are channels, rows are tokens.
        if (tid < D) {
          const float l =
              ClampF(s.cl[tid] + logf(ClampF(s.cstd[tid], kStdMin, kStdMax)), kLogMin, kLogMax);
          s.cl[tid] = l;
          s.cw[tid] = expf(-l);
        }
        __syncthreads();
        LoadChannelVec(s.cw, wc);
        // Row deviations of M / e_c (times the previous row weight), then the row update.
        const float S = TokenStd(wc);
        tl = ClampF(tl + logf(ClampF(S * tw_own, kStdMin, kStdMax)), kLogMin, kLogMax);
        tw_own = expf(-tl);
        tstd = S * tw_own;
        FromOwners(tw_own, tw);
        ChannelStd(tw, s.chv2, s);
        if (tid < D) s.cstd[tid] = s.chv2[tid] * s.cw[tid];
        __syncthreads();
      } else {
        // K: columns are tokens, rows are channels.
        tl = ClampF(tl + logf(ClampF(tstd, kStdMin, kStdMax)), kLogMin, kLogMax);
        tw_own = expf(-tl);
        FromOwners(tw_own, tw);
        ChannelStd(tw, s.chv2, s);
        if (tid < D) {
          const float sd = s.chv2[tid];
          const float l =
              ClampF(s.cl[tid] + logf(ClampF(sd * s.cw[tid], kStdMin, kStdMax)), kLogMin, kLogMax);
          s.cl[tid] = l;
          s.cw[tid] = expf(-l);
          s.cstd[tid] = sd * s.cw[tid];
        }
        __syncthreads();
        LoadChannelVec(s.cw, wc);
        tstd = TokenStd(wc) * tw_own;
      }
      const float imb = Imbalance(tstd, s, it & 1);
      if (imb <= best) {  // ties go to the later iterate
        best = imb;
        tbest = tl;
        if (tid < D) s.cbest[tid] = s.cl[tid];
      }
    }
    FromOwners(expf(tbest), st);
    if (tid < D) s.cw[tid] = expf(s.cbest[tid]);
    __syncthreads();
  }

  // Normalizes (optionally), rounds, absorbs and packs the tile into the matrix's fields of the
  // record `rec`. Returns true when an absorbed value overflows fp16 (this thread's part).
  template <bool kRowsTok>
  __device__ bool Quantize(int bits, bool normalize, int iterations, uint8_t* rec,
                           const RecordOffsets& ro, TileSmem<D, G>& s) const {
    float st[kTPT], sc[kPL];
    if (normalize && iterations > 0) {
      Normalize<kRowsTok>(iterations, s, st);
      LoadChannelVec(s.cw, sc);
    } else {
#pragma unroll
      for (int k = 0; k < kTPT; ++k) st[k] = 1.f;
#pragma unroll
      for (int j = 0; j < kPL; ++j) sc[j] = 1.f;
      if (tid < D) s.cw[tid] = 1.f;  // read only by the same thread below
    }
    // B = (M / s_col) / s_row (section 4, IEEE divisions), then RTN per row (section 5).
    const float qmax = static_cast<float>((1 << bits) - 1);
    bool overflow = false;
    if (kRowsTok) {
      // Rows are tokens: min/max over the row group's channels, then codes, in one pass.
      uint8_t* codes = rec + ro.off[KVARN_FIELD_V_CODES];
#pragma unroll
      for (int k = 0; k < kTPT; ++k) {
        float x[kPL];
        LoadRow(k, x);
#pragma unroll
        for (int j = 0; j < kPL; ++j) x[j] = (x[j] / sc[j]) / st[k];
        float mn = x[0], mx = x[0];
#pragma unroll
        for (int j = 1; j < kPL; ++j) mn = fminf(mn, x[j]), mx = fmaxf(mx, x[j]);
        const float lo = MinLanes(mn);
        const float step = fmaxf((MaxLanes(mx) - lo) / qmax, 1e-10f);
#pragma unroll
        for (int c = 0; c < L::kChunks; ++c) {
          uint64_t word = 0;
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float q = rintf((x[c * 8 + e] - lo) / step);
            word |= static_cast<uint64_t>(ClampF(q, 0.f, qmax)) << (e * bits);
          }
          StoreBytes(
              codes + static_cast<size_t>(t0 + k) * (D * bits / 8) + L::Channel(ld, c) * bits / 8,
              word, bits);
        }
        if (ld == 0) {
          const uint16_t a = FloatToHalfBits(st[k] * step);
          const uint16_t z = FloatToHalfBits(st[k] * lo);
          overflow |= !HalfBitsFinite(a) || !HalfBitsFinite(z);
          reinterpret_cast<uint16_t*>(rec + ro.off[KVARN_FIELD_V_SCALE])[t0 + k] = a;
          reinterpret_cast<uint16_t*>(rec + ro.off[KVARN_FIELD_V_ZERO])[t0 + k] = z;
        }
      }
      if (tid < D) {
        const uint16_t c = FloatToHalfBits(s.cw[tid]);
        overflow |= !HalfBitsFinite(c);
        reinterpret_cast<uint16_t*>(rec + ro.off[KVARN_FIELD_V_CHANNEL_SCALE])[tid] = c;
      }
    } else {
      // Rows are channels: per-channel min/max over tokens (first pass), codes (second pass).
      float mn[kPL], mx[kPL];
#pragma unroll
      for (int j = 0; j < kPL; ++j) mn[j] = 3.0e38f, mx[j] = -3.0e38f;
#pragma unroll
      for (int k = 0; k < kTPT; ++k) {
        float x[kPL];
        LoadRow(k, x);
#pragma unroll
        for (int j = 0; j < kPL; ++j) {
          const float b = (x[j] / st[k]) / sc[j];
          mn[j] = fminf(mn[j], b), mx[j] = fmaxf(mx[j], b);
        }
      }
      ReduceTokens<1>(mn, s.chv, s);
      ReduceTokens<2>(mx, s.chv2, s);
      // Codes chunk by chunk (8 channels at a time keeps the register footprint small). Row d
      // of the codes holds G codes; this thread's kTPT consecutive tokens are kTPT*bits/8 bytes.
      uint8_t* codes = rec + ro.off[KVARN_FIELD_K_CODES];
#pragma unroll
      for (int c = 0; c < L::kChunks; ++c) {
        float lo[8], step[8];
        uint64_t word[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          lo[e] = s.chv[L::Channel(ld, c) + e];
          step[e] = fmaxf((s.chv2[L::Channel(ld, c) + e] - lo[e]) / qmax, 1e-10f);
          word[e] = 0;
        }
#pragma unroll
        for (int k = 0; k < kTPT; ++k) {
          float x[8];
          LoadChunk(k, c, x);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float q = rintf(((x[e] / st[k]) / sc[c * 8 + e] - lo[e]) / step[e]);
            word[e] |= static_cast<uint64_t>(ClampF(q, 0.f, qmax)) << (k * bits);
          }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          StoreBytes(
              codes + static_cast<size_t>(L::Channel(ld, c) + e) * (G * bits / 8) + t0 * bits / 8,
              word[e], kTPT * bits / 8);
        }
      }
      if (tid < D) {
        const float lo_d = s.chv[tid];
        const float step_d = fmaxf((s.chv2[tid] - lo_d) / qmax, 1e-10f);
        const float sr = s.cw[tid];
        const uint16_t a = FloatToHalfBits(sr * step_d);
        const uint16_t z = FloatToHalfBits(sr * lo_d);
        overflow |= !HalfBitsFinite(a) || !HalfBitsFinite(z);
        reinterpret_cast<uint16_t*>(rec + ro.off[KVARN_FIELD_K_SCALE])[tid] = a;
        reinterpret_cast<uint16_t*>(rec + ro.off[KVARN_FIELD_K_ZERO])[tid] = z;
      }
      if (ld == 0) {
#pragma unroll
        for (int k = 0; k < kTPT; ++k) {
          const uint16_t c = FloatToHalfBits(st[k]);
          overflow |= !HalfBitsFinite(c);
          reinterpret_cast<uint16_t*>(rec + ro.off[KVARN_FIELD_K_TOKEN_SCALE])[t0 + k] = c;
        }
      }
    }
    return overflow;
  }

  // Stores the low n bytes of `word` (n in {1, 2, 4, 8}; `p` aligned to n).
  __device__ __forceinline__ static void StoreBytes(uint8_t* p, uint64_t word, int n) {
    switch (n) {
      case 1:
        *p = static_cast<uint8_t>(word);
        break;
      case 2:
        *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(word);
        break;
      case 4:
        *reinterpret_cast<uint32_t*>(p) = static_cast<uint32_t>(word);
        break;
      default:
        *reinterpret_cast<uint2*>(p) =
            make_uint2(static_cast<uint32_t>(word), static_cast<uint32_t>(word >> 32));
        break;
    }
  }
};

}  // namespace gpu
}  // namespace kvarn
