// The per-request tail state (kvarn_experimental.h) on the GPU backend, against the CPU backend
// (the oracle) step by step: the same engine loop (speculative tokens with rollback, chunks of
// up to max_step tokens, sequences finishing and being replaced) runs on a CPU and a GPU context
// with the same inputs. After every step the tail slots are bit-equal (the rotation is the
// CPU's), record_tiles agrees, every flushed record matches the CPU's as the codec suite
// requires of the GPU codec (codes identical but for a few in 10^4, reconstruction within
// relative L2 2e-2), and the attention outputs and lse agree to the kernels' precision, on the
// tensor-core decode and extend kernels and the general kernel. The flush writes exactly the
// records kvarn_quantize makes on the same device. Faults stay in their sequence. Skips without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "kvarn/kvarn_experimental.h"
#include "support/gpu_test.h"
#include "support/kvarn_test.h"
#include "support/reference.h"

namespace {

using kvt::DeviceBuffer;
using kvt::IsError;

struct PlanDeleter {
  void operator()(kvarn_attention_plan_t* p) const { kvarn_attention_plan_destroy(p); }
};
using PlanPtr = std::unique_ptr<kvarn_attention_plan_t, PlanDeleter>;

struct Case {
  const char* preset;
  int D, Hk, group, batch, max_step, steps;
  int window;  // sliding window (0 = full)
  bool sinks;  // learned sink logits
  // kvarn_paged_append_flush_tail_run for every append and flush: prefill chunks of up to 2G + 17
  // tokens (committed at once, past what the slot holds) between speculative and decode steps.
  bool append_flush = false;
  std::string Name() const {
    std::string n = std::string(preset) + "_D" + std::to_string(D) + "_Hk" + std::to_string(Hk) +
                    "_gqa" + std::to_string(group) + "_s" + std::to_string(max_step);
    if (window) n += "_w" + std::to_string(window);
    if (sinks) n += "_sinks";
    if (append_flush) n += "_af";
    return n;
  }
};
// gtest prints a parameter with this (else as raw bytes, a pointer among them, in the test list).
void PrintTo(const Case& c, std::ostream* os) { *os << c.Name(); }

std::vector<float> Random(kvt::Rng& rng, size_t n, double scale) {
  std::vector<float> x(n);
  for (auto& e : x) e = static_cast<float>(scale * rng.Normal());
  return x;
}

// Host metadata of one layer of the one-pool model (shared by both contexts' steps).
struct Engine {
  Engine(const kvarn_config_t& cfg, const Case& c, int max_len)
      : cfg(cfg), c(c), G(cfg.tile_tokens), max_len(max_len) {
    max_blocks = (max_len + c.max_step) / G + 2;
    num_blocks = c.batch * max_blocks;
    record_stride = (kvt::RecordBytes(cfg) + 15) / 16 * 16;  // the tensor-core kernels' alignment
    EXPECT_EQ(kvarn_tail_state_bytes(&cfg, c.Hk, c.max_step, 16, &slot_bytes), KVARN_OK);
    table.assign(static_cast<size_t>(c.batch) * max_blocks, -1);
    lens.assign(c.batch, 0);
    committed.assign(c.batch, 0);
    rtiles.assign(c.batch, 0);
    target.assign(c.batch, 0);
    slots.resize(c.batch);
    for (int b = 0; b < c.batch; ++b) slots[b] = c.batch - 1 - b;  // any assignment works
    for (int r = num_blocks - 1; r >= 0; --r) free_blocks.push_back(r);
  }
  int32_t& Entry(int b, int tile) { return table[static_cast<size_t>(b) * max_blocks + tile]; }
  void Reserve(int b, int n) {
    for (int64_t tile = lens[b] / G; tile <= (lens[b] + n - 1) / G; ++tile) {
      int32_t& e = Entry(b, static_cast<int>(tile));
      if (e >= 0) continue;
      ASSERT_FALSE(free_blocks.empty());
      // Blocks are taken from the middle as well as the end, so ids are not in order.
      const size_t pick = free_blocks.size() / 2;
      e = free_blocks[pick];
      free_blocks.erase(free_blocks.begin() + static_cast<std::ptrdiff_t>(pick));
    }
  }
  void Release(int b) {
    for (int t = 0; t < max_blocks; ++t) {
      if (Entry(b, t) >= 0) free_blocks.push_back(Entry(b, t));
      Entry(b, t) = -1;
    }
    lens[b] = committed[b] = rtiles[b] = 0;
  }

  kvarn_config_t cfg;
  Case c;
  int G, max_len, max_blocks, num_blocks;
  size_t record_stride, slot_bytes = 0;
  std::vector<int32_t> table, lens, committed, rtiles, target, slots, free_blocks;
};

// One context's memory for the engine: pools and per-step arrays. Host vectors on the CPU,
// device buffers on the GPU; the same byte sizes, so the pools compare byte for byte.
struct Side {
  Side(kvarn_context_t* ctx, const Engine& e, size_t max_tokens, size_t ws_bytes)
      : ctx(ctx),
        gpu(!IsCpu(ctx)),
        records(Alloc(static_cast<size_t>(e.num_blocks) * e.c.Hk * e.record_stride)),
        states(Alloc(static_cast<size_t>(e.c.batch) * e.slot_bytes)),
        table(Alloc(e.table.size() * 4)),
        lens(Alloc(e.c.batch * 4)),
        rtiles(Alloc(e.c.batch * 4)),
        committed(Alloc(e.c.batch * 4)),
        slots(Alloc(e.c.batch * 4)),
        status(Alloc(e.c.batch * 4)),
        indptr(Alloc((e.c.batch + 1) * 4)),
        k(Alloc(max_tokens * e.c.Hk * e.cfg.head_dim * 4)),
        v(Alloc(max_tokens * e.c.Hk * e.cfg.head_dim * 4)),
        q(Alloc(max_tokens * e.c.Hk * e.c.group * e.cfg.head_dim * 4)),
        out(Alloc(max_tokens * e.c.Hk * e.c.group * e.cfg.head_dim * 4)),
        lse(Alloc(max_tokens * e.c.Hk * e.c.group * 4)),
        sinks(Alloc(e.c.Hk * e.c.group * 4)),
        ws(Alloc(std::max<size_t>(ws_bytes, 256))) {
    // Poison: record bytes 0xA5, slot rows NaN (rows past a sequence are never read).
    Put(records, std::vector<uint8_t>(records.size(), 0xA5));
    Put(states, std::vector<uint16_t>(states.size() / 2, 0x7e00));
  }
  static bool IsCpu(kvarn_context_t* ctx) {
    kvarn_backend_t b;
    EXPECT_EQ(kvarn_context_get_backend(ctx, &b), KVARN_OK);
    return b == KVARN_BACKEND_CPU;
  }
  struct Mem {
    std::vector<uint8_t> host;
    std::shared_ptr<DeviceBuffer> dev;
    size_t size() const { return dev ? dev->bytes() : host.size(); }
  };
  Mem Alloc(size_t bytes) {
    Mem m;
    if (gpu) {
      m.dev = std::make_shared<DeviceBuffer>(ctx, bytes);
    } else {
      m.host.resize(bytes);
    }
    return m;
  }
  static void* Ptr(Mem& m) { return m.dev ? m.dev->get() : m.host.data(); }
  template <typename T>
  static void Put(Mem& m, const std::vector<T>& x) {
    if (m.dev) {
      m.dev->Upload(x);
    } else {
      ASSERT_LE(x.size() * sizeof(T), m.host.size());
      std::memcpy(m.host.data(), x.data(), x.size() * sizeof(T));
    }
  }
  template <typename T>
  static std::vector<T> Get(const Mem& m) {
    if (m.dev) return m.dev->Download<T>();
    std::vector<T> x(m.host.size() / sizeof(T));
    std::memcpy(x.data(), m.host.data(), x.size() * sizeof(T));
    return x;
  }

  kvarn_paged_kv_t View(const Engine& e) {
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = e.c.Hk;
    kv.batch = e.c.batch;
    kv.records = Ptr(records);
    kv.record_stride = e.record_stride;
    kv.num_record_blocks = e.num_blocks;
    kv.block_table = static_cast<const int32_t*>(Ptr(table));
    kv.max_blocks_per_seq = e.max_blocks;
    kv.seq_lens = static_cast<const int32_t*>(Ptr(lens));
    kv.record_tiles = static_cast<const int32_t*>(Ptr(rtiles));
    return kv;
  }
  kvarn_tail_state_t Tail(const Engine& e) {
    kvarn_tail_state_t t;
    kvarn_tail_state_defaults(&t);
    t.states = Ptr(states);
    t.slot_bytes = e.slot_bytes;
    t.max_step_tokens = e.c.max_step;
    t.num_slots = e.c.batch;
    t.slots = static_cast<const int32_t*>(Ptr(slots));
    return t;
  }
  kvarn_launch_t Launch(bool with_status) {
    kvarn_launch_t l;
    kvarn_launch_defaults(&l);
    l.seq_status = with_status ? static_cast<int32_t*>(Ptr(status)) : nullptr;
    l.workspace = Ptr(ws);
    l.workspace_bytes = ws.size();
    return l;
  }

  kvarn_context_t* ctx;
  bool gpu;
  Mem records, states, table, lens, rtiles, committed, slots, status, indptr, k, v, q, out, lse,
      sinks, ws;
};

// The worst disagreements seen over a test, printed at its end (the next tolerance decision
// needs them, not only the first row past a bound).
struct Worst {
  double out_row = 0, out_l2 = 0, lse_abs = 0;
};

// Attention outputs agree to the precision the two backends' records share. The GPU codec is
// not bit-exact with the CPU one (a few codes per tile land one step apart; see the codec suite),
// so each side attends over slightly different values; one 2-bit value code one step apart moves
// that value by a third of its range, so a row whose weight sits on that token moves by a few
// percent of its largest entry (1.55% and 2.0% on an H100 in session 13, past the 1.5% bound then
// in force). Bounds: per row 5% of the row's largest entry, over all rows of a step a relative
// L2 error of 0.5%.
::testing::AssertionResult CloseOut(const std::vector<float>& want, const std::vector<float>& got,
                                    size_t rows, int D, Worst* worst) {
  double sum_err = 0, sum_norm = 0;
  for (size_t r = 0; r < rows; ++r) {
    double norm = 0, err = 0;
    for (int d = 0; d < D; ++d) {
      const double w = want[r * D + d], g = got[r * D + d];
      if (!std::isfinite(g))
        return ::testing::AssertionFailure() << "out row " << r << " is not finite";
      norm = std::max(norm, std::fabs(w));
      err = std::max(err, std::fabs(w - g));
      sum_err += (w - g) * (w - g);
      sum_norm += w * w;
    }
    worst->out_row = std::max(worst->out_row, err / (norm + 1e-30));
    if (err > 5e-2 * norm + 1e-5) {
      return ::testing::AssertionFailure()
             << "out row " << r << ": max error " << err << " against max |x| " << norm;
    }
  }
  const double rel_l2 = std::sqrt(sum_err / std::max(sum_norm, 1e-30));
  worst->out_l2 = std::max(worst->out_l2, rel_l2);
  if (rel_l2 > 5e-3) return ::testing::AssertionFailure() << "out: relative L2 error " << rel_l2;
  return ::testing::AssertionSuccess();
}

// lse (natural log of the softmax denominator) is compared absolutely: its values sit near 0,
// where a relative bound means nothing (session 13: 5.5e-4 against |lse| 6.2e-3 failed one).
// 2e-2 is a 2% change of the denominator.
::testing::AssertionResult CloseLse(const std::vector<float>& want, const std::vector<float>& got,
                                    size_t rows, Worst* worst) {
  for (size_t r = 0; r < rows; ++r) {
    if (!std::isfinite(got[r]))
      return ::testing::AssertionFailure() << "lse row " << r << " is not finite";
    const double err = std::fabs(static_cast<double>(want[r]) - got[r]);
    worst->lse_abs = std::max(worst->lse_abs, err);
    if (err > 2e-2) {
      return ::testing::AssertionFailure()
             << "lse row " << r << ": " << got[r] << " vs " << want[r];
    }
  }
  return ::testing::AssertionSuccess();
}

class CudaTailState : public ::testing::TestWithParam<Case> {};

TEST_P(CudaTailState, LockstepWithTheCpuBackend) {
  const Case c = GetParam();
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  auto cpu = kvt::MakeCpuContext(2);
  KVT_SEEDED_RNG(rng, 0);
  kvarn_config_t cfg = kvt::PresetConfig(c.preset, c.D);
  cfg.sink_tiles = 0;
  const int G = cfg.tile_tokens, Hq = c.Hk * c.group, D = c.D;
  const int max_len = 3 * G + 40;
  Engine e(cfg, c, max_len);
  const int max_chunk = c.append_flush ? std::max(c.max_step, 2 * G + 17) : c.max_step;
  const size_t max_tokens = static_cast<size_t>(c.batch) * max_chunk;
  size_t ws_flush = 0;
  if (c.append_flush) {
    KVT_ASSERT_OK(kvarn_paged_append_flush_tail_workspace_size(&cfg, c.Hk, c.batch, c.max_step,
                                                               max_tokens, &ws_flush));
  } else {
    KVT_ASSERT_OK(
        kvarn_paged_flush_tail_workspace_size(&cfg, c.Hk, c.batch, c.max_step, &ws_flush));
  }

  // Plans: extend (one query per new token) and decode; with the variants of the case.
  kvarn_attention_params_t ap;
  kvarn_attention_params_defaults(&ap);
  ap.num_q_heads = Hq;
  ap.sliding_window = c.window;
  kvarn_attention_shape_t ext;
  kvarn_attention_shape_defaults(&ext);
  ext.batch = c.batch;
  ext.num_kv_heads = c.Hk;
  ext.max_blocks_per_seq = e.max_blocks;
  ext.max_q_per_seq = max_chunk;
  ext.max_total_q = static_cast<int64_t>(max_tokens);
  kvarn_attention_shape_t dec = ext;
  dec.max_q_per_seq = 0;
  dec.max_total_q = 0;
  struct Ctx {
    kvarn_context_t* ctx;
    std::unique_ptr<Side> side;
    PlanPtr ext, dec;
  };
  Ctx sides[2] = {{cpu.get(), nullptr, nullptr, nullptr}, {gpu.get(), nullptr, nullptr, nullptr}};
  const std::vector<float> sink_logits = Random(rng, static_cast<size_t>(Hq), 1.0);
  for (Ctx& s : sides) {
    size_t ws = ws_flush;
    s.side = std::make_unique<Side>(s.ctx, e, max_tokens, 0);
    kvarn_attention_params_t p = ap;
    if (c.sinks) {
      Side::Put(s.side->sinks, sink_logits);
      p.sinks = static_cast<const float*>(Side::Ptr(s.side->sinks));
    }
    kvarn_attention_plan_t* raw = nullptr;
    KVT_ASSERT_OK(kvarn_attention_plan_create(s.ctx, &cfg, &ext, &p, &raw));
    s.ext.reset(raw);
    KVT_ASSERT_OK(kvarn_attention_plan_create(s.ctx, &cfg, &dec, &p, &raw));
    s.dec.reset(raw);
    size_t a = 0;
    KVT_ASSERT_OK(kvarn_attention_plan_workspace_size(s.ext.get(), &a));
    ws = std::max(ws, a);
    KVT_ASSERT_OK(kvarn_attention_plan_workspace_size(s.dec.get(), &a));
    ws = std::max(ws, a);
    s.side->ws = s.side->Alloc(std::max<size_t>(ws, 256));
    Side::Put(s.side->slots, e.slots);
  }
  const char* dec_kernel = nullptr;
  const char* ext_kernel = nullptr;
  KVT_ASSERT_OK(kvarn_attention_plan_kernel(sides[1].dec.get(), &dec_kernel));
  KVT_ASSERT_OK(kvarn_attention_plan_kernel(sides[1].ext.get(), &ext_kernel));
  std::printf("[ kernels  ] %s: decode %s, extend %s\n", c.Name().c_str(), dec_kernel, ext_kernel);

  for (int b = 0; b < c.batch; ++b) e.target[b] = static_cast<int32_t>(rng.Int(G + 1, max_len));
  int flushed_tiles = 0, replaced = 0;
  Worst worst;
  // Printed however the test ends (an ASSERT returns early).
  struct PrintWorst {
    const Worst& w;
    std::string name;
    ~PrintWorst() {
      std::printf(
          "[ errors   ] %s: worst out row %.3g of its max, worst out rel L2 %.3g, worst lse %.3g\n",
          name.c_str(), w.out_row, w.out_l2, w.lse_abs);
    }
  } print_worst{worst, c.Name()};
  size_t codes = 0, code_diff = 0;  // over every record compared
  for (int step = 0; step < c.steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const bool decode = step % 3 == 2;
    // Append-flush: every other non-decode step is a prefill chunk, committed at once.
    const bool prefill = c.append_flush && step % 3 == 0;
    // New tokens per sequence: a decode step appends one each; else 1.. what the slot allows
    // (uncommitted tokens still in the slot count against max_step), or a prefill chunk.
    std::vector<int32_t> indptr(c.batch + 1, 0);
    for (int b = 0; b < c.batch; ++b) {
      const int room = prefill ? std::min(max_chunk, max_len + c.max_step - e.lens[b])
                               : c.max_step - (e.lens[b] - e.committed[b]);
      const int n = decode ? 1 : static_cast<int>(rng.Int(1, std::max(1, room)));
      ASSERT_GE(room, n);
      e.Reserve(b, n);
      e.lens[b] += n;
      indptr[b + 1] = indptr[b] + n;
    }
    const size_t total = static_cast<size_t>(indptr[c.batch]);
    const auto k = Random(rng, total * c.Hk * D, 1.0), v = Random(rng, total * c.Hk * D, 1.0);
    const auto q = Random(rng, total * Hq * D, 1.0);
    std::vector<std::vector<float>> outs, lses;
    for (Ctx& s : sides) {
      Side& m = *s.side;
      Side::Put(m.table, e.table);
      Side::Put(m.lens, e.lens);
      Side::Put(m.rtiles, e.rtiles);
      Side::Put(m.indptr, indptr);
      Side::Put(m.k, k);
      Side::Put(m.v, v);
      Side::Put(m.q, q);
      Side::Put(m.status, std::vector<int32_t>(c.batch, 0));
      kvarn_paged_kv_t kv = m.View(e);
      kvarn_tail_state_t tail = m.Tail(e);
      kvarn_launch_t launch = m.Launch(true);
      if (c.append_flush) {
        // A prefill chunk commits its tokens now (its complete tiles become records before
        // attention reads them); other steps commit after verification.
        Side::Put(m.committed, prefill ? e.lens : e.committed);
        KVT_ASSERT_OK(kvarn_paged_append_flush_tail_run(
            s.ctx, &cfg, &kv, &tail, &launch, static_cast<const int32_t*>(Side::Ptr(m.indptr)),
            total, KVARN_DTYPE_F32, Side::Ptr(m.k), Side::Ptr(m.v),
            static_cast<const int32_t*>(Side::Ptr(m.committed)),
            static_cast<int32_t*>(Side::Ptr(m.rtiles))));
      } else {
        KVT_ASSERT_OK(kvarn_paged_append_tail_run(
            s.ctx, &cfg, &kv, &tail, &launch, static_cast<const int32_t*>(Side::Ptr(m.indptr)),
            total, KVARN_DTYPE_F32, Side::Ptr(m.k), Side::Ptr(m.v)));
      }
      KVT_ASSERT_OK(kvarn_paged_attention_tail_run(
          s.ctx, decode ? s.dec.get() : s.ext.get(), &kv, &tail, &launch,
          decode ? nullptr : static_cast<const int32_t*>(Side::Ptr(m.indptr)), Side::Ptr(m.q),
          Side::Ptr(m.out), static_cast<float*>(Side::Ptr(m.lse))));
      auto out = Side::Get<float>(m.out), lse = Side::Get<float>(m.lse);
      out.resize(total * Hq * D);
      lse.resize(total * Hq);
      outs.push_back(out);
      lses.push_back(lse);
      EXPECT_EQ(Side::Get<int32_t>(m.status), std::vector<int32_t>(c.batch, 0));
    }
    ASSERT_TRUE(CloseOut(outs[0], outs[1], total * Hq, D, &worst));
    ASSERT_TRUE(CloseLse(lses[0], lses[1], total * Hq, &worst));

    // Verification: keep some of the uncommitted tokens, commit some of the kept ones (a prefill
    // chunk was committed whole).
    for (int b = 0; b < c.batch && !prefill; ++b) {
      e.lens[b] = static_cast<int32_t>(rng.Int(
          std::max(e.committed[b], e.lens[b] - (indptr[b + 1] - indptr[b]) + 1), e.lens[b]));
      // At most max_step - 1 tokens stay uncommitted, so the next step can append one.
      const int lo = std::max(e.committed[b], e.lens[b] - c.max_step + 1);
      e.committed[b] =
          rng.Int(0, 3) == 0 ? static_cast<int32_t>(rng.Int(lo, e.lens[b])) : e.lens[b];
    }
    std::vector<std::vector<int32_t>> rts;
    for (Ctx& s : sides) {
      Side& m = *s.side;
      Side::Put(m.lens, e.lens);
      Side::Put(m.committed, e.committed);
      kvarn_paged_kv_t kv = m.View(e);
      kvarn_tail_state_t tail = m.Tail(e);
      kvarn_launch_t launch = m.Launch(true);
      // record_tiles_out is kv's own array: the flush advances it in place.
      if (c.append_flush) {  // max_tokens 0: a flush
        if (prefill) e.committed = e.lens;
        Side::Put(m.committed, e.committed);
        KVT_ASSERT_OK(kvarn_paged_append_flush_tail_run(
            s.ctx, &cfg, &kv, &tail, &launch, nullptr, 0, KVARN_DTYPE_F32, nullptr, nullptr,
            static_cast<const int32_t*>(Side::Ptr(m.committed)),
            static_cast<int32_t*>(Side::Ptr(m.rtiles))));
      } else {
        KVT_ASSERT_OK(kvarn_paged_flush_tail_run(
            s.ctx, &cfg, &kv, &tail, &launch, static_cast<const int32_t*>(Side::Ptr(m.committed)),
            static_cast<int32_t*>(Side::Ptr(m.rtiles))));
      }
      rts.push_back(Side::Get<int32_t>(m.rtiles));
      EXPECT_EQ(Side::Get<int32_t>(m.status), std::vector<int32_t>(c.batch, 0));
    }
    ASSERT_EQ(rts[0], rts[1]);
    for (int b = 0; b < c.batch; ++b) {
      ASSERT_EQ(rts[0][b], e.committed[b] / G) << "sequence " << b;
      flushed_tiles += rts[0][b] - e.rtiles[b];  // e.rtiles: as the step began
    }
    e.rtiles = rts[0];
    // Slots: the rows each sequence holds; records: every flushed tile's block.
    const auto st0 = Side::Get<uint16_t>(sides[0].side->states);
    const auto st1 = Side::Get<uint16_t>(sides[1].side->states);
    const auto rec0 = Side::Get<uint8_t>(sides[0].side->records);
    const auto rec1 = Side::Get<uint8_t>(sides[1].side->records);
    const size_t cap = e.slot_bytes / 2 / (2 * c.Hk * D);
    for (int b = 0; b < c.batch; ++b) {
      const size_t rows = static_cast<size_t>(e.lens[b] - e.rtiles[b] * G);
      for (size_t head = 0; head < 2u * c.Hk; ++head) {
        const size_t off = static_cast<size_t>(e.slots[b]) * (e.slot_bytes / 2) + head * cap * D;
        ASSERT_TRUE(std::equal(st0.begin() + off, st0.begin() + off + rows * D, st1.begin() + off))
            << "sequence " << b << " slot rows, head " << head;
      }
      for (int tile = 0; tile < e.rtiles[b]; ++tile) {
        const size_t off = static_cast<size_t>(e.Entry(b, tile)) * c.Hk * e.record_stride;
        for (int h = 0; h < c.Hk; ++h) {
          const size_t r = off + h * e.record_stride;
          const kvt::DecodedRecord x =
              kvt::DecodeRecord(rec0.data() + r, D, G, cfg.key_bits, cfg.value_bits);
          const kvt::DecodedRecord y =
              kvt::DecodeRecord(rec1.data() + r, D, G, cfg.key_bits, cfg.value_bits);
          for (size_t i = 0; i < x.k_codes.size(); ++i) code_diff += x.k_codes[i] != y.k_codes[i];
          for (size_t i = 0; i < x.v_codes.size(); ++i) code_diff += x.v_codes[i] != y.v_codes[i];
          codes += x.k_codes.size() + x.v_codes.size();
          std::vector<double> kx, ky, vx, vy;
          for (int t = 0; t < G; ++t) {
            for (int d = 0; d < D; ++d) {
              kx.push_back(x.K(t, d));
              ky.push_back(y.K(t, d));
              vx.push_back(x.V(t, d));
              vy.push_back(y.V(t, d));
            }
          }
          ASSERT_LE(kvt::RelL2(ky, kx), 2e-2) << "sequence " << b << ", tile " << tile << " K";
          ASSERT_LE(kvt::RelL2(vy, vx), 2e-2) << "sequence " << b << ", tile " << tile << " V";
        }
      }
    }
    // Finished sequences leave; a new one takes the slot.
    for (int b = 0; b < c.batch; ++b) {
      if (e.committed[b] < e.target[b]) continue;
      e.Release(b);
      e.target[b] = static_cast<int32_t>(rng.Int(G + 1, max_len));
      ++replaced;
    }
  }
  EXPECT_GT(flushed_tiles, c.batch);
  EXPECT_GT(replaced, 0);
  EXPECT_LE(static_cast<double>(code_diff), 1e-3 * static_cast<double>(codes))
      << code_diff << " of " << codes << " codes differ from the CPU's";
}

const Case kCases[] = {
    // preset, D, Hk, group, batch, max_step, steps, window, sinks. About 1.5 tokens a step stay
    // (rollback, decode steps): enough steps for more flushed tiles than sequences and at least
    // one finished sequence (session 13: 90 and 110 steps gave one tile each at G 128).
    {"k4v2_g64", 128, 2, 2, 5, 3, 150, 0, false},
    {"k4v2_g128", 128, 4, 7, 4, 40, 45, 0, false},    // chunks of up to 40 tokens, GQA 7
    {"k4v4_g128", 64, 8, 8, 3, 5, 250, 128, true},    // gpt-oss shaped: window 128 + sinks
    {"k8v8_g128", 256, 2, 4, 3, 9, 240, 200, false},  // Gemma shaped, a window of 200
    {"k2v2_g64", 512, 1, 4, 3, 70, 30, 0, false},     // D 512, chunks past one tile
    // Plain decode (max_step 1: cap = G): one token a step, so 300 steps for two tiles each.
    {"k4v2_g128", 128, 8, 4, 8, 1, 300, 0, false},
    // Append-flush: prefill chunks of up to 2G + 17 tokens into slots of G - 1 + max_step rows.
    {"k4v2_g128", 128, 4, 4, 5, 4, 60, 0, false, true},
    {"k4v4_g64", 64, 8, 8, 4, 2, 60, 128, true, true},
    {"k8v8_g128", 256, 2, 2, 3, 3, 45, 0, false, true},
    {"k2v2_g64", 512, 1, 4, 3, 5, 45, 0, false, true},
};

INSTANTIATE_TEST_SUITE_P(Shapes, CudaTailState, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.Name(); });

// Faults: each stays in its sequence; without a status array the call fails with nothing written.
TEST(CudaTailStateFaults, StayInTheirSequence) {
  KVT_CUDA_CONTEXT_OR_SKIP(gpu);
  KVT_SEEDED_RNG(rng, 0);
  kvarn_config_t cfg = kvt::PresetConfig("k4v2_g64", 128);
  cfg.sink_tiles = 0;
  const Case c{"k4v2_g64", 128, 2, 2, 6, 3, 1, 0, false};
  const int G = cfg.tile_tokens, D = 128;
  Engine e(cfg, c, 4 * G);
  size_t ws_bytes = 0;
  KVT_ASSERT_OK(kvarn_paged_flush_tail_workspace_size(&cfg, c.Hk, c.batch, c.max_step, &ws_bytes));
  Side m(gpu.get(), e, static_cast<size_t>(c.batch) * G, ws_bytes);
  Side::Put(m.slots, e.slots);
  // Every sequence gets G tokens (the slot of max_step 3 holds G - 1 + 3 rows): one tile each.
  std::vector<int32_t> indptr(c.batch + 1);
  for (int b = 0; b <= c.batch; ++b) indptr[b] = b * G;
  for (int b = 0; b < c.batch; ++b) {
    e.Reserve(b, G);
    e.lens[b] = G;
  }
  auto k = Random(rng, static_cast<size_t>(c.batch) * G * c.Hk * D, 1.0);
  const auto v = Random(rng, k.size(), 1.0);
  k[(static_cast<size_t>(indptr[2]) + 5) * c.Hk * D + 3] = NAN;  // sequence 2: a NaN key
  std::vector<int32_t> slots = e.slots;
  slots[5] = c.batch + 4;  // sequence 5: a slot outside the tail state
  Side::Put(m.slots, slots);
  Side::Put(m.table, e.table);
  Side::Put(m.lens, e.lens);
  Side::Put(m.rtiles, e.rtiles);
  Side::Put(m.indptr, indptr);
  Side::Put(m.k, k);
  Side::Put(m.v, v);
  std::vector<int32_t> status(c.batch, 0);
  status[4] = KVARN_ERR_CAPACITY;  // the engine faulted sequence 4 itself
  Side::Put(m.status, status);
  kvarn_paged_kv_t kv = m.View(e);
  kvarn_tail_state_t tail = m.Tail(e);
  kvarn_launch_t launch = m.Launch(true);
  const auto states0 = Side::Get<uint16_t>(m.states);
  KVT_ASSERT_OK(kvarn_paged_append_tail_run(
      gpu.get(), &cfg, &kv, &tail, &launch, static_cast<const int32_t*>(Side::Ptr(m.indptr)),
      indptr[c.batch], KVARN_DTYPE_F32, Side::Ptr(m.k), Side::Ptr(m.v)));
  status = Side::Get<int32_t>(m.status);
  EXPECT_EQ(status, (std::vector<int32_t>{0, 0, KVARN_ERR_NON_FINITE, 0, KVARN_ERR_CAPACITY,
                                          KVARN_ERR_INVALID_ARGUMENT}));
  const auto states1 = Side::Get<uint16_t>(m.states);
  const size_t slot_halves = e.slot_bytes / 2;
  for (int b : {2, 4}) {  // their slots are as before
    const size_t s0 = static_cast<size_t>(e.slots[b]) * slot_halves;
    EXPECT_TRUE(
        std::equal(states0.begin() + s0, states0.begin() + s0 + slot_halves, states1.begin() + s0))
        << "sequence " << b;
  }
  // Flush: sequence 1's block entry is outside the pool, sequence 3's committed is past its
  // length; 0 flushes its tile.
  e.committed = e.lens;
  e.committed[3] = e.lens[3] + 1;
  e.Entry(1, 0) = e.num_blocks + 3;
  Side::Put(m.table, e.table);
  Side::Put(m.committed, e.committed);
  std::vector<int32_t> rt_out(c.batch, -7);
  DeviceBuffer d_rt(gpu.get(), rt_out);
  KVT_ASSERT_OK(kvarn_paged_flush_tail_run(gpu.get(), &cfg, &kv, &tail, &launch,
                                           static_cast<const int32_t*>(Side::Ptr(m.committed)),
                                           static_cast<int32_t*>(d_rt.get())));
  EXPECT_EQ(Side::Get<int32_t>(m.status),
            (std::vector<int32_t>{0, KVARN_ERR_INVALID_ARGUMENT, KVARN_ERR_NON_FINITE,
                                  KVARN_ERR_INVALID_ARGUMENT, KVARN_ERR_CAPACITY,
                                  KVARN_ERR_INVALID_ARGUMENT}));
  EXPECT_EQ(d_rt.Download<int32_t>(), (std::vector<int32_t>{1, 0, 0, 0, 0, 0}));
  // Sequence 0's record is the one kvarn_quantize makes of the same tokens on this device.
  {
    const auto records = Side::Get<uint8_t>(m.records);
    const size_t rb = kvt::RecordBytes(cfg);
    for (int h = 0; h < c.Hk; ++h) {
      std::vector<float> kt(static_cast<size_t>(G) * D), vt(kt.size());
      for (int t = 0; t < G; ++t) {
        for (int d = 0; d < D; ++d) {
          const size_t src = ((static_cast<size_t>(indptr[0]) + t) * c.Hk + h) * D + d;
          kt[static_cast<size_t>(t) * D + d] = k[src];
          vt[static_cast<size_t>(t) * D + d] = v[src];
        }
      }
      DeviceBuffer dk(gpu.get(), kt), dv(gpu.get(), vt), drec(gpu.get(), rb);
      KVT_ASSERT_OK(kvarn_quantize(gpu.get(), &cfg, 1, KVARN_DTYPE_F32, dk.get(), dv.get(), 0,
                                   drec.get(), rb));
      const auto want = drec.Download<uint8_t>();
      const size_t block = static_cast<size_t>(e.Entry(0, 0));
      EXPECT_EQ(std::memcmp(records.data() + (block * c.Hk + h) * e.record_stride, want.data(), rb),
                0)
          << "head " << h;
    }
  }
  // Without a status array a fault fails the whole call at the next synchronization, and no
  // block or slot changes. Only sequence 1 (its block entry) is wrong now: 2 and 4, whose
  // slots were never written, and 5 (no slot) hold no tokens.
  Side::Put(m.slots, e.slots);
  for (int b : {2, 4, 5}) e.lens[b] = 0;
  Side::Put(m.lens, e.lens);
  e.committed = e.lens;
  Side::Put(m.committed, e.committed);
  Side::Put(m.status, std::vector<int32_t>(c.batch, 0));
  const auto rec_before = Side::Get<uint8_t>(m.records);
  const auto states_before = Side::Get<uint16_t>(m.states);
  kvarn_launch_t no_status = m.Launch(false);
  std::vector<int32_t> rts(c.batch, 0);
  Side::Put(m.rtiles, rts);
  KVT_ASSERT_OK(kvarn_paged_flush_tail_run(gpu.get(), &cfg, &kv, &tail, &no_status,
                                           static_cast<const int32_t*>(Side::Ptr(m.committed)),
                                           static_cast<int32_t*>(Side::Ptr(m.rtiles))));
  EXPECT_TRUE(
      IsError(kvarn_context_synchronize(gpu.get()), KVARN_ERR_INVALID_ARGUMENT, "sequence 1"));
  EXPECT_EQ(Side::Get<uint8_t>(m.records), rec_before);
  EXPECT_EQ(Side::Get<uint16_t>(m.states), states_before);
  EXPECT_EQ(Side::Get<int32_t>(m.rtiles), rts);

  // Argument errors found on the host: a misaligned slot stride.
  kvarn_tail_state_t odd = tail;
  odd.slot_bytes = e.slot_bytes + 2;
  odd.num_slots = c.batch - 1;
  EXPECT_TRUE(
      IsError(kvarn_paged_flush_tail_run(gpu.get(), &cfg, &kv, &odd, &launch,
                                         static_cast<const int32_t*>(Side::Ptr(m.committed)),
                                         static_cast<int32_t*>(Side::Ptr(m.rtiles))),
              KVARN_ERR_INVALID_ARGUMENT, "multiple of 16"));
}

}  // namespace
