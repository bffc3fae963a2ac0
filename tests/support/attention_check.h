// Runs kvarn_paged_attention over a PagedCache and checks it against float64 attention over the
// same cache-frame values (fp16 pages as stored, records dequantized by kvarn_dequantize).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/fp.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace kvt {

struct Queries {
  std::vector<int32_t> indptr;  // empty = decode
  std::vector<float> values;    // [total][Hq][D], as the library reads them (rounded to dtype)
  std::vector<uint8_t> bytes;   // encoded as dtype
  kvarn_dtype_t dtype = KVARN_DTYPE_F32;
  size_t total = 0;
};

// q_lens empty = decode (one query per sequence).
inline Queries MakeQueries(Rng& rng, const std::vector<int>& q_lens, int batch, int Hq, int D,
                           kvarn_dtype_t dtype) {
  Queries q;
  q.dtype = dtype;
  if (q_lens.empty()) {
    q.total = batch;
  } else {
    q.indptr.push_back(0);
    for (int n : q_lens) q.indptr.push_back(q.indptr.back() + n);
    q.total = q.indptr.back();
  }
  q.values.resize(q.total * Hq * D);
  // Each query row has its own magnitude: flat and peaked softmaxes alike.
  for (size_t r = 0; r < q.total * Hq; ++r) {
    const double mag = std::exp(0.7 * rng.Normal());
    for (int d = 0; d < D; ++d) q.values[r * D + d] = static_cast<float>(mag * rng.Normal());
  }
  q.values = RoundTo(q.values, dtype);
  q.bytes = Encode(q.values, dtype);
  return q;
}

// The model variants of kvarn_attention_params_t a test sets (defaults: plain causal).
struct AttnVariant {
  std::vector<float> sinks;  // [Hq] or empty = none
  int window = 0;            // sliding_window
  float softcap = 0.f;       // logit_softcap
  bool prefix = false;       // KVARN_ATTENTION_PREFIX

  void Apply(kvarn_attention_params_t* p) const {
    p->sinks = sinks.empty() ? nullptr : sinks.data();
    p->sliding_window = window;
    p->logit_softcap = softcap;
    p->mode = prefix ? KVARN_ATTENTION_PREFIX : KVARN_ATTENTION_CAUSAL;
  }
  // Keys [lo, hi) query i of nq sees in a sequence of N cached tokens.
  std::pair<int64_t, int64_t> Keys(int64_t N, int64_t nq, int64_t i) const {
    const int64_t p = prefix ? N + i : N - nq + i;
    const int64_t hi = prefix ? N : p + 1;
    const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
    return {lo, std::max(lo, hi)};
  }
};

struct AttnOutput {
  std::vector<uint8_t> out;  // [total][Hq][D] of out_dtype
  std::vector<float> lse;    // [total][Hq]
  kvarn_dtype_t dtype = KVARN_DTYPE_F32;
};

inline ::testing::AssertionResult RunAttention(kvarn_context_t* ctx, PagedCache& pc,
                                               const Queries& q, int Hq, kvarn_dtype_t out_dtype,
                                               int num_splits, float scale, AttnOutput* r,
                                               const AttnVariant& variant = {}) {
  kvarn_attention_params_t p;
  kvarn_attention_params_defaults(&p);
  variant.Apply(&p);
  p.num_q_heads = Hq;
  p.scale = scale;
  p.q_indptr = q.indptr.empty() ? nullptr : q.indptr.data();
  p.q_dtype = q.dtype;
  p.out_dtype = out_dtype;
  p.num_splits = num_splits;
  kvarn_paged_kv_t kv = pc.View();
  size_t ws = 0;
  kvarn_status_t st = kvarn_paged_attention_workspace_size(ctx, &pc.cfg, &kv, &p, q.total, &ws);
  if (st != KVARN_OK) {
    return ::testing::AssertionFailure() << "workspace_size: " << kvarn_last_error();
  }
  std::vector<uint8_t> workspace(ws);
  r->dtype = out_dtype;
  r->out.assign(q.total * Hq * pc.D * DtypeBytes(out_dtype), 0xEE);
  r->lse.assign(q.total * Hq, -12345.f);
  st = kvarn_paged_attention(ctx, &pc.cfg, &kv, &p, q.bytes.data(), r->out.data(), r->lse.data(),
                             ws ? workspace.data() : nullptr, ws);
  if (st != KVARN_OK) {
    return ::testing::AssertionFailure() << "kvarn_paged_attention: " << kvarn_last_error();
  }
  return ::testing::AssertionSuccess();
}

struct AttnErrors {
  double worst_row = 0;    // worst relative L2 of one (query token, head) output row
  double total = 0;        // relative L2 over all outputs
  double worst_lse = 0;    // worst |lse - ref| / (1 + |ref|)
  double max_abs_lse = 0;  // largest |ref lse| (for scale)
};

// Compares r with float64 attention over the cache-frame values of pc.
inline AttnErrors CompareWithReference(kvarn_context_t* ctx, const PagedCache& pc, const Queries& q,
                                       int Hq, float scale, const AttnOutput& r,
                                       const AttnVariant& variant = {}) {
  AttnErrors e;
  const int D = pc.D, Hk = pc.Hk, group = Hq / Hk;
  const bool k_rot = !(pc.cfg.key_flags & KVARN_ABLATE_NO_ROTATION);
  const bool v_rot = !(pc.cfg.value_flags & KVARN_ABLATE_NO_ROTATION);
  const double s = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(D));
  const std::vector<double> out = Decode(r.out.data(), q.total * Hq * D, r.dtype);
  double num = 0, den = 0;
  for (int b = 0; b < pc.batch; ++b) {
    const int64_t N = pc.seq_lens[b];
    const int64_t q0 = q.indptr.empty() ? b : q.indptr[b];
    const int64_t nq = q.indptr.empty() ? 1 : q.indptr[b + 1] - q.indptr[b];
    for (int h = 0; h < Hk; ++h) {
      std::vector<float> K, V;
      EXPECT_TRUE(pc.CacheFrame(ctx, b, h, &K, &V));
      for (int64_t i = 0; i < nq; ++i) {
        for (int g = 0; g < group; ++g) {
          const size_t row = static_cast<size_t>((q0 + i) * Hq + h * group + g);
          std::vector<double> qr(q.values.begin() + row * D, q.values.begin() + (row + 1) * D);
          if (k_rot) HadamardDouble(qr.data(), D);
          const auto keys = variant.Keys(N, nq, i);
          const double sink = variant.sinks.empty() ? -INFINITY : variant.sinks[h * group + g];
          const RefAttentionOut ref =
              RefAttentionKeys(qr.data(), K.data(), V.data(), keys.first, keys.second, D, s,
                               variant.softcap, sink, v_rot);
          const std::vector<double> got(out.begin() + row * D, out.begin() + (row + 1) * D);
          e.worst_row = std::max(e.worst_row, RelL2(got, ref.o));
          for (int d = 0; d < D; ++d) {
            num += (got[d] - ref.o[d]) * (got[d] - ref.o[d]);
            den += ref.o[d] * ref.o[d];
          }
          if (std::isnan(r.lse[row])) {
            e.worst_lse = INFINITY;
          } else if (std::isinf(ref.lse) || std::isinf(r.lse[row])) {
            // -inf (no key, no sink) must be exactly that.
            if (r.lse[row] != ref.lse) e.worst_lse = INFINITY;
          } else {
            e.worst_lse =
                std::max(e.worst_lse, std::fabs(r.lse[row] - ref.lse) / (1 + std::fabs(ref.lse)));
            e.max_abs_lse = std::max(e.max_abs_lse, std::fabs(ref.lse));
          }
        }
      }
    }
  }
  e.total = den > 0 ? std::sqrt(num / den) : 0;
  return e;
}

// Relative L2 between two attention outputs of the same shape.
inline double OutputDistance(const AttnOutput& a, const AttnOutput& b, size_t n) {
  return RelL2(Decode(a.out.data(), n, a.dtype), Decode(b.out.data(), n, b.dtype));
}

// Learned sink logits [Hq] around the scores' own range (a few units), as gpt-oss's.
inline std::vector<float> SinkLogits(Rng& rng, int Hq) {
  std::vector<float> s(Hq);
  for (float& x : s) x = static_cast<float>(1.5 * rng.Normal() + 1.0);
  return s;
}

// One shape of the model-variant suites (CPU: test_attention_variants.cpp; GPU:
// test_cuda_attention.cpp): cache, variant and queries.
struct VariantCase {
  std::string name;
  std::string preset;
  int D, Hk, group;
  std::vector<int> lens;
  std::vector<int> q_lens;  // empty = decode
  int window;
  float softcap;
  bool sinks;
  bool prefix;
  float scale = 0.f;  // 0 = 1/sqrt(D)
  int splits = 0;     // num_splits (0 = automatic)
};
// gtest prints a parameter with this (else as raw bytes, in the test list ctest reads).
inline void PrintTo(const VariantCase& c, std::ostream* os) { *os << c.name; }

struct VariantCaseData {
  PagedCache pc;
  int Hq = 0;
  AttnVariant v;
  Queries q;
};

// The case's paged cache (built on a CPU context through the public calls; record_stride =
// record bytes + stride_padding), its variant (fresh sink logits) and fp32 queries.
inline ::testing::AssertionResult MakeVariantCase(const VariantCase& c, Rng& rng,
                                                  size_t stride_padding, VariantCaseData* s) {
  ContextPtr ctx = MakeCpuContext(2);
  const kvarn_config_t cfg = PresetConfig(c.preset, c.D);
  PagedCacheSpec spec;
  spec.num_kv_heads = c.Hk;
  spec.lens = c.lens;
  spec.stride_padding = stride_padding;
  const ::testing::AssertionResult built = BuildPagedCache(ctx.get(), cfg, spec, rng, &s->pc);
  if (!built) return built;
  s->Hq = c.Hk * c.group;
  if (c.sinks) s->v.sinks = SinkLogits(rng, s->Hq);
  s->v.window = c.window;
  s->v.softcap = c.softcap;
  s->v.prefix = c.prefix;
  s->q = MakeQueries(rng, c.q_lens, s->pc.batch, s->Hq, s->pc.D, KVARN_DTYPE_F32);
  return ::testing::AssertionSuccess();
}

}  // namespace kvt
