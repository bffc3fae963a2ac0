// Decode and extend attention over records + fp16 pages on the CPU (docs/FORMAT.md section 9).
// The scales are folded into the inner products so the loops run on the integer codes; the
// softmax is an fp32 online softmax per (query token, query head). Work items are
// (sequence, KV head, split); splits are merged by log-sum-exp in a fixed order, and the split
// count depends only on the shape, so results are independent of the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/cpu/cpu_kernels.h"
#include "backends/cpu/dtype_io.h"
#include "backends/cpu/hadamard.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/record_codec.h"
#include "backends/cpu/rtn_pack.h"
#include "backends/cpu/tail_rows.h"
#include "core/thread_pool.h"

namespace kvarn {
namespace cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Tiles per split when the split count is automatic.
constexpr int kTilesPerSplit = 64;
constexpr int kMaxSplits = 64;

// The online-softmax update shared by the scalar paths: scores [n] (scaled; the query sees
// [st.lo, n)) -> softcapped, then probabilities relative to the new max (0 outside what it
// sees); returns the factor that rescales the old state.
float SoftmaxStep(float* scores, int n, float softcap, AttnQuery& st) {
  if (softcap > 0.f) {
    for (int t = st.lo; t < n; ++t) scores[t] = softcap * std::tanh(scores[t] / softcap);
  }
  for (int t = 0; t < st.lo; ++t) scores[t] = kNegInf;
  float mx = kNegInf;
  for (int t = st.lo; t < n; ++t) mx = std::max(mx, scores[t]);
  const float m_new = std::max(*st.m, mx);
  const float alpha = *st.m == kNegInf ? 0.f : std::exp(*st.m - m_new);
  float psum = 0.f;
  for (int t = 0; t < n; ++t) {
    scores[t] = std::exp(scores[t] - m_new);
    psum += scores[t];
  }
  *st.l = *st.l * alpha + psum;
  *st.m = m_new;
  return alpha;
}

}  // namespace

void ScalarAttendRecord(const RecordView& rec, int D, int G, int key_bits, int value_bits,
                        const ScoreParams& sp, AttnQuery* qs, int nq, float* scores, float* vsum) {
  thread_local std::vector<uint8_t> kcodes, vcodes;
  kcodes.resize(static_cast<size_t>(D) * G);
  vcodes.resize(kcodes.size());
  UnpackRows(rec.k_codes, D, G, key_bits, kcodes.data());
  UnpackRows(rec.v_codes, G, D, value_bits, vcodes.data());
  for (int qi = 0; qi < nq; ++qi) {
    AttnQuery& st = qs[qi];
    const int n_valid = st.n_valid;
    if (n_valid <= st.lo) continue;
    const float* q = st.q;
    // q'.K'[:,t] = c_t * (sum_d (q_d a_d) code[d,t] + sum_d q_d z_d)
    float qz = 0.f;
    std::fill(scores, scores + n_valid, 0.f);
    for (int d = 0; d < D; ++d) {
      const float qa = q[d] * rec.ka[d];
      qz += q[d] * rec.kz[d];
      const uint8_t* codes = kcodes.data() + static_cast<size_t>(d) * G;
      for (int t = 0; t < n_valid; ++t) scores[t] += qa * codes[t];
    }
    for (int t = 0; t < n_valid; ++t) scores[t] = sp.scale * rec.kc[t] * (scores[t] + qz);
    const float alpha = SoftmaxStep(scores, n_valid, sp.softcap, st);
    // sum_t p_t V'[t,:] = c' * (sum_t (p_t a'_t) code[t,:] + sum_t p_t z'_t)
    std::fill(vsum, vsum + D, 0.f);
    float pz = 0.f;
    for (int t = 0; t < n_valid; ++t) {
      const float pa = scores[t] * rec.va[t];
      pz += scores[t] * rec.vz[t];
      const uint8_t* codes = vcodes.data() + static_cast<size_t>(t) * D;
      for (int d = 0; d < D; ++d) vsum[d] += pa * codes[d];
    }
    for (int d = 0; d < D; ++d) st.acc[d] = st.acc[d] * alpha + rec.vc[d] * (vsum[d] + pz);
  }
}

void ScalarAttendPage(const uint16_t* k, const uint16_t* v, int D, int G, const ScoreParams& sp,
                      AttnQuery* qs, int nq, float* scores) {
  thread_local std::vector<float> kf, vf;
  kf.resize(static_cast<size_t>(D) * G);
  vf.resize(kf.size());
  int n_max = 0;
  for (int qi = 0; qi < nq; ++qi) n_max = std::max(n_max, qs[qi].n_valid);
  // Only the visible rows: slots past the sequence end may hold anything (NaN included).
  for (size_t e = 0; e < static_cast<size_t>(n_max) * D; ++e) {
    kf[e] = half_to_float(k[e]);
    vf[e] = half_to_float(v[e]);
  }
  for (int qi = 0; qi < nq; ++qi) {
    AttnQuery& st = qs[qi];
    const int n_valid = st.n_valid;
    if (n_valid <= st.lo) continue;
    for (int t = 0; t < n_valid; ++t) {
      const float* kr = kf.data() + static_cast<size_t>(t) * D;
      float s = 0.f;
      for (int d = 0; d < D; ++d) s += st.q[d] * kr[d];
      scores[t] = sp.scale * s;
    }
    const float alpha = SoftmaxStep(scores, n_valid, sp.softcap, st);
    for (int d = 0; d < D; ++d) st.acc[d] *= alpha;
    for (int t = 0; t < n_valid; ++t) {
      const float* vr = vf.data() + static_cast<size_t>(t) * D;
      for (int d = 0; d < D; ++d) st.acc[d] += scores[t] * vr[d];
    }
  }
}

namespace {

int NumSplits(const AttentionArgs& args, int max_tiles) {
  if (args.num_splits > 0) return std::min(args.num_splits, std::max(max_tiles, 1));
  return std::min(kMaxSplits, std::max(1, (max_tiles + kTilesPerSplit - 1) / kTilesPerSplit));
}

// The keys query i of nq sees in a sequence of N cached tokens: [lo, hi) (docs/FORMAT.md
// section 9). Causal: the queries are the last nq cached tokens; prefix: they follow the cache.
struct KeyRange {
  int64_t lo, hi;
};
KeyRange VisibleKeys(const AttentionArgs& args, int64_t N, int64_t nq, int64_t i) {
  const int64_t p = args.prefix ? N + i : N - nq + i;
  const int64_t hi = args.prefix ? N : p + 1;
  const int64_t lo =
      args.sliding_window > 0 ? std::max<int64_t>(0, p - args.sliding_window + 1) : 0;
  return {lo, hi};
}

}  // namespace

Status AttentionWorkspace(Context*, const Config&, const PagedKV&, const AttentionArgs&, size_t,
                          size_t* bytes) {
  *bytes = 0;  // the CPU backend keeps its partial results in its own memory
  return Status::Ok();
}

Status PagedAttention(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                      const void* q, void* out, float* lse, void*, size_t) {
  return AttendBatch(ctx, cfg, kv, args, 0, -1, nullptr, q, out, lse);
}

Status AttendBatch(Context* ctx, const Config& cfg, const PagedKV& kv, const AttentionArgs& args,
                   int max_q_per_seq, int64_t max_total_q, int32_t* seq_status, const void* q,
                   void* out, float* lse) {
  const int D = cfg.D, G = cfg.G, Hk = kv.num_kv_heads, Hq = args.num_q_heads;
  const int group = Hq / Hk;
  const Kernels& K = KernelsFor(ctx->isa);
  // Sink logits are host memory on this backend: a non-finite one fails the call
  // before anything (a sequence's status entry included) is written.
  if (args.sinks != nullptr) {
    for (int h = 0; h < Hq; ++h) {
      if (!std::isfinite(args.sinks[h])) {
        return InvalidArgument("sinks[" + std::to_string(h) + "] is not finite");
      }
    }
  }
  // Query token ranges per sequence.
  std::vector<int64_t> q_begin(kv.batch + 1);
  for (int b = 0; b <= kv.batch; ++b) q_begin[b] = args.q_indptr ? args.q_indptr[b] : b;
  // Extend: a sequence whose query range is not its own faults (the same with or without a
  // status array); decode ranges are b..b+1.
  std::vector<std::string> ranges(kv.batch);
  if (args.q_indptr) {
    ranges = IndptrFaults(args.q_indptr, kv.batch, max_total_q >= 0 ? max_total_q : INT32_MAX,
                          "q_indptr");
  }
  // Which sequences take part: a bad one fails the call (no status array) or only itself.
  std::vector<char> skip(kv.batch, 0);
  // The first tile a sequence's queries see (its first query's window start: windows only move
  // forward); tiles before it are never read.
  std::vector<int> first_tile(kv.batch, 0);
  int max_tiles = 0;
  for (int b = 0; b < kv.batch; ++b) {
    if (seq_status != nullptr && seq_status[b] != 0) {
      skip[b] = 1;
      continue;
    }
    const int64_t nq = q_begin[b + 1] - q_begin[b];
    Status st = ranges[b].empty() ? CheckSequenceTables(cfg, kv, b) : InvalidArgument(ranges[b]);
    if (st.ok() && max_q_per_seq > 0 && nq > max_q_per_seq) {
      st = InvalidArgument("sequence " + std::to_string(b) + " has " + std::to_string(nq) +
                           " query tokens, more than the plan's max_q_per_seq " +
                           std::to_string(max_q_per_seq));
    }
    if (st.ok() && !args.prefix && nq > kv.seq_lens[b] && kv.seq_lens[b] > 0) {
      st = InvalidArgument("sequence " + std::to_string(b) + " has " + std::to_string(nq) +
                           " query tokens but only " + std::to_string(kv.seq_lens[b]) +
                           " cached tokens (the queries' own keys must be appended first)");
    }
    if (!st.ok()) {
      if (seq_status == nullptr) return st;
      seq_status[b] = st.code();
      skip[b] = 1;
      continue;
    }
    // The tiles the sequence's queries see (in 64 bits: seq_lens[b] may be INT32_MAX).
    const int64_t tiles = (int64_t{kv.seq_lens[b]} + G - 1) / G;
    first_tile[b] =
        static_cast<int>(std::min(tiles, VisibleKeys(args, kv.seq_lens[b], nq, 0).lo / G));
    max_tiles = static_cast<int>(std::max<int64_t>(max_tiles, tiles - first_tile[b]));
  }
  const int splits = NumSplits(args, max_tiles);
  const ScoreParams score{args.scale, args.logit_softcap};

  // Rotated queries in fp32 (q' = q H when K is rotated), for the sequences that take part.
  size_t total_q = 0;
  for (int b = 0; b < kv.batch; ++b) {
    if (!skip[b]) total_q = std::max(total_q, static_cast<size_t>(q_begin[b + 1]));
  }
  std::vector<float> qr(total_q * Hq * D);
  for (int b = 0; b < kv.batch; ++b) {
    if (skip[b]) continue;
    for (size_t r = q_begin[b] * Hq; r < static_cast<size_t>(q_begin[b + 1]) * Hq; ++r) {
      // Row r = token * Hq + head; tokens are q_row_stride elements apart.
      const size_t src = (r / Hq) * static_cast<size_t>(args.q_row_stride) + (r % Hq) * D;
      LoadRow(args.q_dtype, q, src, D, qr.data() + r * D);
      if (cfg.k_rotate) K.hadamard(qr.data() + r * D, D);
    }
  }

  // Partial results per (sequence, KV head, split): for each of its queries m, l, acc[D].
  struct Partial {
    std::vector<float> m, l, acc;
  };
  const size_t n_items = static_cast<size_t>(kv.batch) * Hk * splits;
  std::vector<Partial> parts(n_items);
  const size_t page_elems = static_cast<size_t>(Hk) * G * D;

  ctx->pool->ParallelFor(n_items, [&](size_t item) {
    const int b = static_cast<int>(item / (Hk * splits));
    const int h = static_cast<int>((item / splits) % Hk);
    const int split = static_cast<int>(item % splits);
    if (skip[b]) return;
    const int64_t N = kv.seq_lens[b];
    const int64_t nq = q_begin[b + 1] - q_begin[b];
    const int tiles = static_cast<int>((N + G - 1) / G);
    const int first = first_tile[b];
    const int per = (tiles - first + splits - 1) / splits;
    const int t0 = std::min(tiles, first + split * per), t1 = std::min(tiles, t0 + per);
    Partial& P = parts[item];
    const size_t nstate = static_cast<size_t>(nq) * group;
    P.m.assign(nstate, kNegInf);
    P.l.assign(nstate, 0.f);
    P.acc.assign(nstate * D, 0.f);
    std::vector<AttnQuery> qs(nstate);
    std::vector<float> scales, scores((nstate + 4) * G), vsum((nstate + 4) * D);
    std::vector<uint16_t> tail_k, tail_v;  // decoded int8 tail rows
    if (kv.tail_states != nullptr && kv.tail_bits == 8) {
      tail_k.resize(static_cast<size_t>(G) * D);
      tail_v.resize(tail_k.size());
    }
    const int32_t* row = kv.block_table + static_cast<size_t>(b) * kv.max_blocks_per_seq;
    const int64_t rt = kv.record_tiles[b];
    for (int tile = t0; tile < t1; ++tile) {
      const int64_t base = int64_t{tile} * G;
      for (int64_t i = 0; i < nq; ++i) {
        // The part of the tile query i sees: [lo, n_valid) (empty when n_valid <= lo).
        const KeyRange keys = VisibleKeys(args, N, nq, i);
        const int n_valid = static_cast<int>(std::clamp<int64_t>(keys.hi - base, 0, G));
        const int lo = static_cast<int>(std::clamp<int64_t>(keys.lo - base, 0, G));
        for (int g = 0; g < group; ++g) {
          const size_t s = static_cast<size_t>(i) * group + g;
          qs[s] = AttnQuery{qr.data() + ((q_begin[b] + i) * Hq + h * group + g) * D,
                            lo,
                            n_valid,
                            &P.m[s],
                            &P.l[s],
                            P.acc.data() + s * D};
        }
      }
      const bool is_record = tile >= cfg.sink_tiles && tile < cfg.sink_tiles + rt;
      if (is_record) {
        const RecordView rec = ViewRecord(
            cfg, kv.records + (static_cast<size_t>(row[tile]) * Hk + h) * kv.record_stride, scales,
            &K);
        K.attend_record(rec, D, G, cfg.key_bits, cfg.value_bits, score, qs.data(),
                        static_cast<int>(nstate), scores.data(), vsum.data());
      } else if (kv.tail_states != nullptr) {
        // Rows of the tail slot from row (tile - rt) * G; int8 rows are decoded to fp16 first,
        // the rows that hold tokens only (attend_page reads no row past the sequence end).
        const TailRows tail(kv, D);
        const int64_t from = static_cast<int64_t>(tile - rt) * G;
        const int64_t rows = std::clamp<int64_t>(N - base, 0, G);
        K.attend_page(tail.View(kv.tail_slots[b], 0, h, from, rows, tail_k.data()),
                      tail.View(kv.tail_slots[b], 1, h, from, rows, tail_v.data()), D, G, score,
                      qs.data(), static_cast<int>(nstate), scores.data());
      } else {
        const size_t off = row[tile] * page_elems + static_cast<size_t>(h) * G * D;
        K.attend_page(kv.k_pages + off, kv.v_pages + off, D, G, score, qs.data(),
                      static_cast<int>(nstate), scores.data());
      }
    }
  });

  // Merge the splits by log-sum-exp, normalize, un-rotate, store.
  ctx->pool->ParallelFor(static_cast<size_t>(kv.batch) * Hk, [&](size_t bh) {
    const int b = static_cast<int>(bh / Hk), h = static_cast<int>(bh % Hk);
    if (skip[b]) return;
    const int64_t nq = q_begin[b + 1] - q_begin[b];
    std::vector<float> o(D);
    for (int64_t i = 0; i < nq; ++i) {
      for (int g = 0; g < group; ++g) {
        const size_t s = static_cast<size_t>(i) * group + g;
        const size_t token = q_begin[b] + i, head = static_cast<size_t>(h) * group + g;
        // A sink logit joins the denominator with no value: it takes part in the max, so the
        // merge never overflows, and a query that sees no key gets L = 1 and lse = the sink.
        const float sink = args.sinks != nullptr ? args.sinks[head] : kNegInf;
        float M = sink;
        for (int sp = 0; sp < splits; ++sp) M = std::max(M, parts[bh * splits + sp].m[s]);
        float L = sink == kNegInf ? 0.f : std::exp(sink - M);
        std::fill(o.begin(), o.end(), 0.f);
        for (int sp = 0; sp < splits; ++sp) {
          const Partial& P = parts[bh * splits + sp];
          if (P.m[s] == kNegInf) continue;
          const float w = std::exp(P.m[s] - M);
          L += P.l[s] * w;
          for (int d = 0; d < D; ++d) o[d] += P.acc[s * D + d] * w;
        }
        // L == 0: a query that sees no key (a padding slot) gets zeros and lse -inf.
        for (int d = 0; d < D; ++d) o[d] = L == 0.f ? 0.f : o[d] / L;
        if (cfg.v_rotate) K.hadamard(o.data(), D);  // o = o' H
        const size_t qrow = token * Hq + head;
        StoreRow(args.out_dtype, out, token * static_cast<size_t>(args.out_row_stride) + head * D,
                 D, o.data());
        if (lse != nullptr) lse[qrow] = M + std::log(L);
      }
    }
  });
  return Status::Ok();
}

}  // namespace cpu
}  // namespace kvarn
