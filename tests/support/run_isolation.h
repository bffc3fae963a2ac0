// Fault isolation of the capturable layer 2 (kvarn.h "plan / run"), shared by the plan/run fuzzer
// (tests/fuzz/fuzz_paged_run.cpp, CPU) and the isolation suite (tests/test_run_isolation.cpp, CPU
// and GPU). One step of an engine (append by slot -> device-list flush -> attention under a plan)
// over a small batch whose sequences own disjoint pages and record blocks, with malformed
// metadata drawn from a choice source: token_indptr / q_indptr boundaries, write slots, NaN, Inf
// and fp16-overflowing rows, flush entries and counts, lengths, record counts and block-table
// entries, status entries set by the engine, argument errors (struct sizes, NULLs, workspaces)
// and size-0 launches. The step runs with a status array and without one, from the same state.
// Oracles:
//   - every status is defined: OK or a documented data/argument error, never INTERNAL or
//     OUT_OF_MEMORY; a status entry once set never changes;
//   - a call refused for its arguments, or failing without a status array, writes nothing;
//   - a sequence that faulted is untouched from the call it faulted in on (its pages, records);
//   - a sequence reported OK has the pages, records and attention rows (bit for bit) of a clean
//     run of that sequence alone (batch 1, its own rows) from the same state;
//   - without a status array a call fails exactly when, with one, some sequence faults in it.
// Public API only; no gtest, so the fuzzer can use it. A check returns "" or what failed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/fp.h"

namespace kvt {
namespace iso {

// Where the choices come from: the fuzzer's bytes or a seeded generator.
class Choices {
 public:
  virtual ~Choices() = default;
  virtual uint32_t Below(uint32_t n) = 0;  // in [0, n); 0 when n == 0
  bool OneIn(uint32_t n) { return Below(n) == 0; }
};

// Seeded generator (splitmix64) for the data and for the suite's choices.
class Prng : public Choices {
 public:
  explicit Prng(uint64_t seed) : x_(seed) {}
  uint64_t Next() {
    uint64_t z = (x_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint32_t Below(uint32_t n) override { return n == 0 ? 0 : static_cast<uint32_t>(Next() % n); }
  float Uniform() { return static_cast<float>(Next() >> 40) / static_cast<float>(1 << 24); }
  float Value(float scale) { return scale * (2.f * Uniform() - 1.f); }

 private:
  uint64_t x_;
};

// Memory of a context through the public calls.
class Mem {
 public:
  Mem(kvarn_context_t* ctx, size_t bytes) : ctx_(ctx), bytes_(std::max<size_t>(bytes, 1)) {
    if (kvarn_memory_alloc(ctx, bytes_, &ptr_) != KVARN_OK) ptr_ = nullptr;
  }
  template <typename T>
  Mem(kvarn_context_t* ctx, const std::vector<T>& host) : Mem(ctx, host.size() * sizeof(T)) {
    Upload(host);
  }
  ~Mem() {
    if (ptr_) kvarn_memory_free(ctx_, ptr_);
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  bool ok() const { return ptr_ != nullptr; }
  void* get() const { return ptr_; }
  int32_t* i32() const { return static_cast<int32_t*>(ptr_); }
  size_t bytes() const { return bytes_; }
  template <typename T>
  bool Upload(const std::vector<T>& host) {
    const size_t n = host.size() * sizeof(T);
    return ptr_ && n <= bytes_ &&
           (n == 0 ||
            kvarn_memory_copy(ctx_, ptr_, host.data(), n, KVARN_COPY_HOST_TO_DEVICE) == KVARN_OK);
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> out(bytes_ / sizeof(T));
    if (ptr_ && !out.empty()) {
      kvarn_memory_copy(ctx_, out.data(), ptr_, out.size() * sizeof(T), KVARN_COPY_DEVICE_TO_HOST);
    }
    return out;
  }

 private:
  kvarn_context_t* ctx_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

constexpr int kMaxBlocks = 3;  // tiles per sequence (block_table stride)
constexpr uint16_t kPoisonHalf = 0x7e00;
constexpr uint8_t kPoisonByte = 0xCD;

// One step of a batch, as host arrays (uploaded into the context's memory by Run).
struct Step {
  kvarn_config_t cfg{};
  int D = 64, G = 64, Hk = 1, Hq = 1, B = 1;
  int num_pages = 0, num_blocks = 0;
  kvarn_dtype_t dtype = KVARN_DTYPE_F32;
  // Append.
  std::vector<int32_t> token_indptr, slots;
  std::vector<uint8_t> k, v;  // [max_tokens][Hk][D] of dtype
  size_t max_tokens = 0;
  // Flush.
  std::vector<int32_t> src, dst, tile_seqs, n_tiles{0};
  size_t max_tiles = 0;
  // Attention.
  bool decode = true;
  int max_q_per_seq = 0;
  int64_t max_total_q = 0;
  std::vector<int32_t> q_indptr, block_table, seq_lens, record_tiles;
  std::vector<float> q;  // [rows][Hq][D], rows = B (decode) or max_total_q
  // The engine's status entries before the step (status mode only).
  std::vector<int32_t> preset;
  size_t rows() const { return decode ? static_cast<size_t>(B) : static_cast<size_t>(max_total_q); }
};

// The pools before the step.
struct Pools {
  std::vector<uint16_t> k_pages, v_pages;
  std::vector<uint8_t> records;
};

inline size_t RecordBytes(const kvarn_config_t& c) {
  size_t n = 0;
  kvarn_record_bytes(&c, &n);
  return n;
}

inline size_t DtypeBytes(kvarn_dtype_t t) { return t == KVARN_DTYPE_F32 ? 4 : 2; }

inline void PutValue(std::vector<uint8_t>* buf, kvarn_dtype_t t, size_t i, float x) {
  if (t == KVARN_DTYPE_F32) {
    std::memcpy(buf->data() + 4 * i, &x, 4);
    return;
  }
  uint16_t h;
  if (t == KVARN_DTYPE_F16) {
    h = FloatToHalf(x);
  } else {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    h = static_cast<uint16_t>(u >> 16);
  }
  std::memcpy(buf->data() + 2 * i, &h, 2);
}

inline bool IsDataError(int32_t s) {
  return s == KVARN_ERR_INVALID_ARGUMENT || s == KVARN_ERR_NON_FINITE || s == KVARN_ERR_OVERFLOW;
}

// ---- what one run of the step leaves ----------------------------------------------------------

enum Stage { kAppend = 0, kFlush = 1, kAttention = 2, kStages = 3 };

struct Outcome {
  kvarn_status_t call[kStages] = {KVARN_OK, KVARN_OK, KVARN_OK};  // return, then synchronize
  bool ran[kStages] = {false, false, false};
  std::vector<int32_t> status[kStages];  // after each call (status mode)
  std::vector<uint16_t> k_pages[kStages], v_pages[kStages];
  std::vector<uint8_t> records[kStages];
  std::vector<float> out, lse;
};

// ---- running a step ---------------------------------------------------------------------------

class Runner {
 public:
  Runner(kvarn_context_t* ctx, Choices* ch) : ctx_(ctx), ch_(ch) {}

  // Runs `s` from `pools`; with_status: a status array holding s.preset. The argument-error
  // probes (when `probes`) each must be refused and change nothing. "" or what failed.
  std::string Run(const Step& s, const Pools& pools, bool with_status, bool probes, Outcome* o) {
    const size_t rb = RecordBytes(s.cfg);
    Mem kp(ctx_, pools.k_pages), vp(ctx_, pools.v_pages), rec(ctx_, pools.records);
    Mem indptr(ctx_, s.token_indptr), slots(ctx_, s.slots), k(ctx_, s.k), v(ctx_, s.v);
    Mem src(ctx_, s.src), dst(ctx_, s.dst), tseq(ctx_, s.tile_seqs), nt(ctx_, s.n_tiles);
    Mem qi(ctx_, s.q_indptr), table(ctx_, s.block_table), lens(ctx_, s.seq_lens),
        rtiles(ctx_, s.record_tiles), q(ctx_, s.q);
    Mem out(ctx_, std::vector<float>(s.rows() * s.Hq * s.D, 7.f));
    Mem lse(ctx_, std::vector<float>(s.rows() * s.Hq, 7.f));
    Mem status(ctx_, s.preset.empty() ? std::vector<int32_t>(s.B, 0) : s.preset);
    size_t fws_bytes = 0;
    kvarn_paged_flush_workspace_size(&s.cfg, s.Hk, s.max_tiles, &fws_bytes);
    Mem fws(ctx_, fws_bytes);
    for (const Mem* m : {&kp, &vp, &rec,   &indptr, &slots,  &k, &v,   &src, &dst,    &tseq,
                         &nt, &qi, &table, &lens,   &rtiles, &q, &out, &lse, &status, &fws}) {
      if (!m->ok()) return "kvarn_memory_alloc failed: " + std::string(kvarn_last_error());
    }
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = s.Hk;
    kv.batch = s.B;
    kv.records = rec.get();
    kv.record_stride = rb;
    kv.num_record_blocks = s.num_blocks;
    kv.k_pages = kp.get();
    kv.v_pages = vp.get();
    kv.num_pages = s.num_pages;
    kv.block_table = table.i32();
    kv.max_blocks_per_seq = kMaxBlocks;
    kv.seq_lens = lens.i32();
    kv.record_tiles = rtiles.i32();
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.seq_status = with_status ? status.i32() : nullptr;

    // What must not change under a refused call: the pools, the status array and the outputs.
    const auto snapshot = [&] {
      std::vector<uint8_t> all;
      for (const Mem* m : {&kp, &vp, &rec, &status, &out, &lse}) {
        const auto b = m->Download<uint8_t>();
        all.insert(all.end(), b.begin(), b.end());
      }
      return all;
    };
    std::string err;
    const auto refused = [&](kvarn_status_t st, const char* what) {
      if (!err.empty()) return;
      if (st != KVARN_ERR_INVALID_ARGUMENT && st != KVARN_ERR_BUFFER_TOO_SMALL &&
          st != KVARN_ERR_UNSUPPORTED) {
        err = std::string("argument probe '") + what + "' returned " + std::to_string(st) + " (" +
              kvarn_last_error() + ")";
      }
    };
    const auto synced = [&](kvarn_status_t st) {  // a GPU reports data errors here
      return st != KVARN_OK ? st : kvarn_context_synchronize(ctx_);
    };

    // Append.
    if (probes && ch_->OneIn(3)) {
      const auto before = snapshot();
      kvarn_paged_kv_t bad = kv;
      kvarn_launch_t bl = launch;
      const int32_t* ip = indptr.i32();
      const int32_t* sl = slots.i32();
      const void* kk = k.get();
      size_t mt = s.max_tokens;
      switch (ch_->Below(6)) {
        case 0:
          bad.size = ch_->Below(2) ? 0 : 3;
          break;
        case 1:
          bl.size = sizeof bl + 8 + ch_->Below(64);
          break;  // a larger struct, tail unread
        case 2:
          sl = nullptr;
          mt = std::max<size_t>(mt, 1);
          break;
        case 3:
          kk = nullptr;
          mt = std::max<size_t>(mt, 1);
          break;
        case 4:
          bad.num_pages = 0;
          mt = std::max<size_t>(mt, 1);
          break;
        default:
          mt = size_t{1} << 31;
          break;
      }
      struct {
        kvarn_launch_t l;
        uint64_t tail;
      } big{bl, 1};
      refused(kvarn_paged_append_run(ctx_, &s.cfg, &bad, bl.size > sizeof bl ? &big.l : &bl, ip, sl,
                                     mt, s.dtype, kk, v.get()),
              "append");
      kvarn_context_synchronize(ctx_);
      if (err.empty() && snapshot() != before) err = "a refused append changed memory";
      if (!err.empty()) return err;
    }
    o->ran[kAppend] = true;
    o->call[kAppend] =
        synced(kvarn_paged_append_run(ctx_, &s.cfg, &kv, &launch, indptr.i32(), slots.i32(),
                                      s.max_tokens, s.dtype, k.get(), v.get()));
    o->status[kAppend] = status.Download<int32_t>();
    o->k_pages[kAppend] = kp.Download<uint16_t>();
    o->v_pages[kAppend] = vp.Download<uint16_t>();
    o->records[kAppend] = rec.Download<uint8_t>();
    if (!with_status && o->call[kAppend] != KVARN_OK) return "";

    // Flush.
    launch.workspace = fws.get();
    launch.workspace_bytes = fws_bytes;
    if (probes && ch_->OneIn(3)) {
      const auto before = snapshot();
      kvarn_launch_t bl = launch;
      kvarn_paged_kv_t bad = kv;
      const int32_t* n = nt.i32();
      size_t mt = std::max<size_t>(s.max_tiles, 1);
      switch (ch_->Below(4)) {
        case 0:
          bl.workspace = nullptr;
          break;
        case 1:
          bl.workspace_bytes = fws_bytes > 0 ? fws_bytes - 1 : 0;
          mt = s.max_tiles + 1;
          break;
        case 2:
          n = nullptr;
          break;
        default:
          bad.num_record_blocks = 0;
          break;
      }
      refused(
          kvarn_paged_flush_run(ctx_, &s.cfg, &bad, &bl, mt, n, src.i32(), dst.i32(), tseq.i32()),
          "flush");
      kvarn_context_synchronize(ctx_);
      if (err.empty() && snapshot() != before) err = "a refused flush wrote";
      if (!err.empty()) return err;
    }
    o->ran[kFlush] = true;
    o->call[kFlush] =
        synced(kvarn_paged_flush_run(ctx_, &s.cfg, &kv, &launch, s.max_tiles, nt.i32(), src.i32(),
                                     dst.i32(), with_status ? tseq.i32() : nullptr));
    o->status[kFlush] = status.Download<int32_t>();
    o->k_pages[kFlush] = kp.Download<uint16_t>();
    o->v_pages[kFlush] = vp.Download<uint16_t>();
    o->records[kFlush] = rec.Download<uint8_t>();
    if (!with_status && o->call[kFlush] != KVARN_OK) return "";

    // Attention.
    kvarn_attention_shape_t shape;
    kvarn_attention_shape_defaults(&shape);
    shape.batch = s.B;
    shape.num_kv_heads = s.Hk;
    shape.max_blocks_per_seq = kMaxBlocks;
    shape.max_q_per_seq = s.decode ? 0 : s.max_q_per_seq;
    shape.max_total_q = s.max_total_q;
    kvarn_attention_params_t ap;
    kvarn_attention_params_defaults(&ap);
    ap.num_q_heads = s.Hq;
    ap.num_splits = 1;  // the same split count for the batch and each sequence alone
    kvarn_attention_plan_t* plan = nullptr;
    if (probes && ch_->OneIn(3)) {  // a malformed shape or parameters: refused, no plan
      kvarn_attention_shape_t bs = shape;
      kvarn_attention_params_t bp = ap;
      const int32_t host_indptr[2] = {0, 0};
      switch (ch_->Below(7)) {
        case 0:
          bs.batch = -1;
          break;
        case 1:
          bs.num_kv_heads = 0;
          break;
        case 2:
          bs.max_q_per_seq = -1;
          break;
        case 3:
          bs.max_q_per_seq = 1;
          bs.max_total_q = ch_->Below(2) ? -1 : int64_t{1} << 31;
          break;
        case 4:  // num_q_heads not a multiple of num_kv_heads
          bp.num_q_heads = 3;
          bs.num_kv_heads = 2;
          break;
        case 5:  // queries come at run time
          bp.q_indptr = host_indptr;
          break;
        default:
          bs.size = ch_->Below(2) ? 0 : 4097;
          break;
      }
      kvarn_attention_plan_t* bad = nullptr;
      refused(kvarn_attention_plan_create(ctx_, &s.cfg, &bs, &bp, &bad), "plan");
      if (err.empty() && bad != nullptr) err = "a refused plan_create returned a plan";
      kvarn_attention_plan_destroy(bad);
      if (!err.empty()) return err;
    }
    const kvarn_status_t pst = kvarn_attention_plan_create(ctx_, &s.cfg, &shape, &ap, &plan);
    if (pst != KVARN_OK) return "plan_create: " + std::string(kvarn_last_error());
    size_t aws_bytes = 0;
    kvarn_attention_plan_workspace_size(plan, &aws_bytes);
    Mem aws(ctx_, aws_bytes);
    launch.workspace = aws_bytes ? aws.get() : nullptr;
    launch.workspace_bytes = aws_bytes;
    const int32_t* qip = s.decode ? nullptr : qi.i32();
    if (probes && ch_->OneIn(3)) {
      const auto before = snapshot();
      kvarn_launch_t bl = launch;
      struct {
        kvarn_paged_kv_t kv;
        uint64_t tail;
      } big{kv, 1};
      kvarn_paged_kv_t& bad = big.kv;
      const int32_t* bq = qip;
      switch (ch_->Below(4)) {
        case 0:
          bad.batch = s.B + 1;
          break;
        case 1:
          bq = s.decode ? indptr.i32() : nullptr;
          break;
        case 2:
          bad.size = sizeof bad + 8;
          break;  // a newer header asking for more
        default:
          if (aws_bytes == 0) {
            bad.max_blocks_per_seq = kMaxBlocks + 1;
          } else {
            bl.workspace = nullptr;
          }
          break;
      }
      refused(kvarn_paged_attention_run(ctx_, plan, &bad, &bl, bq, q.get(), out.get(),
                                        static_cast<float*>(lse.get())),
              "attention");
      kvarn_context_synchronize(ctx_);
      if (err.empty() && snapshot() != before) err = "a refused attention wrote";
    }
    if (err.empty()) {
      o->ran[kAttention] = true;
      o->call[kAttention] = synced(kvarn_paged_attention_run(
          ctx_, plan, &kv, &launch, qip, q.get(), out.get(), static_cast<float*>(lse.get())));
      o->status[kAttention] = status.Download<int32_t>();
      o->k_pages[kAttention] = kp.Download<uint16_t>();
      o->v_pages[kAttention] = vp.Download<uint16_t>();
      o->records[kAttention] = rec.Download<uint8_t>();
      o->out = out.Download<float>();
      o->lse = lse.Download<float>();
    }
    kvarn_attention_plan_destroy(plan);
    return err;
  }

 private:
  kvarn_context_t* ctx_;
  Choices* ch_;
};

// ---- making a step ----------------------------------------------------------------------------

// A step's well-formed layout and its malformations, drawn from `ch`; the data (K/V, queries)
// from a generator seeded by `ch`.
struct Scenario {
  Step step;
  Pools pools;
  std::vector<int> n;          // tokens appended per sequence (well formed)
  std::vector<int> owner;      // flush entry -> sequence (well formed)
  bool flush_data_ok = true;   // no call-level flush error was drawn
  bool tile_seqs_bad = false;  // tile_seqs out of the batch (read only with a status array)
};

inline int Page(int b, int tile) { return b * kMaxBlocks + tile; }

// kvarn.h's rule for an indptr array: sequence b's range is good when neither of its boundaries
// is bad (indptr[0] != 0, outside [0, limit], below an earlier boundary or above a later one).
inline bool GoodRange(const std::vector<int32_t>& ip, int b, int64_t limit) {
  const auto bad = [&](size_t j) {
    if (ip[j] < 0 || ip[j] > limit || (j == 0 && ip[j] != 0)) return true;
    for (size_t i = 0; i < ip.size(); ++i) {
      if ((i < j && ip[i] > ip[j]) || (i > j && ip[i] < ip[j])) return true;
    }
    return false;
  };
  return !bad(b) && !bad(b + 1);
}

// Builds the state before the step through clean calls on `ctx` (append of each sequence's
// earlier tokens, flush of its record tiles), then the step's metadata. "" or what failed.
inline std::string MakeScenario(kvarn_context_t* ctx, Choices* ch, Scenario* sc) {
  Step& s = sc->step;
  static const char* const kPresets[] = {"k4v2_g64", "k4v4_g64", "k2v2_g64"};
  if (kvarn_config_from_preset(kPresets[ch->Below(3)], 64, &s.cfg) != KVARN_OK) {
    return "config: " + std::string(kvarn_last_error());
  }
  s.cfg.sink_tiles = static_cast<int32_t>(ch->Below(2));
  const int G = s.G = s.cfg.tile_tokens, D = s.D = s.cfg.head_dim, sink = s.cfg.sink_tiles;
  s.Hk = 1 + static_cast<int>(ch->Below(2));
  s.Hq = s.Hk * (1 + static_cast<int>(ch->Below(2)));
  const int B = s.B = 1 + static_cast<int>(ch->Below(5));
  s.num_pages = s.num_blocks = B * kMaxBlocks;
  Prng data(ch->Below(1u << 30));
  const size_t rb = RecordBytes(s.cfg);
  const size_t page_elems = static_cast<size_t>(s.Hk) * G * D;

  // Earlier tokens N[b], then n[b] new ones; the complete non-sink tiles are records, but for
  // a lag of one that this step flushes.
  std::vector<int> N(B), rt(B), lag(B);
  sc->n.assign(B, 0);
  for (int b = 0; b < B; ++b) {
    const int cap = kMaxBlocks * G - 4;
    int len = static_cast<int>(ch->Below(2) ? ch->Below(kMaxBlocks) * G + 60 + ch->Below(4)
                                            : ch->Below(kMaxBlocks * G));
    if (ch->OneIn(6)) len = 0;  // padding slot or a new sequence
    N[b] = std::min(len, cap);
    sc->n[b] = static_cast<int>(ch->Below(4));
    const int complete = std::max(0, N[b] / G - sink);
    lag[b] = complete > 0 ? static_cast<int>(ch->Below(2)) : 0;
    rt[b] = complete - lag[b];
  }

  // The state before the step: pools poisoned, then each sequence's earlier tokens appended and
  // its record tiles flushed, with clean calls.
  {
    Mem kp(ctx, std::vector<uint16_t>(s.num_pages * page_elems, kPoisonHalf));
    Mem vp(ctx, std::vector<uint16_t>(s.num_pages * page_elems, kPoisonHalf));
    Mem rec(ctx, std::vector<uint8_t>(static_cast<size_t>(s.num_blocks) * s.Hk * rb, kPoisonByte));
    std::vector<int32_t> ip(B + 1, 0), sl, src, dst;
    for (int b = 0; b < B; ++b) {
      ip[b + 1] = ip[b] + N[b];
      for (int t = 0; t < N[b]; ++t) sl.push_back(Page(b, t / G) * G + t % G);
      for (int i = 0; i < rt[b]; ++i) {
        src.push_back(Page(b, sink + i));
        dst.push_back(Page(b, sink + i));
      }
    }
    std::vector<float> kv_data(2 * sl.size() * s.Hk * D);
    for (auto& x : kv_data) x = data.Value(2.f);
    Mem dip(ctx, ip), dsl(ctx, sl), dk(ctx, kv_data), dsrc(ctx, src), ddst(ctx, dst),
        dn(ctx, std::vector<int32_t>{static_cast<int32_t>(src.size())});
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = s.Hk;
    kv.batch = B;
    kv.records = rec.get();
    kv.record_stride = rb;
    kv.num_record_blocks = s.num_blocks;
    kv.k_pages = kp.get();
    kv.v_pages = vp.get();
    kv.num_pages = s.num_pages;
    const float* kd = static_cast<const float*>(dk.get());
    if (kvarn_paged_append_run(ctx, &s.cfg, &kv, nullptr, dip.i32(), dsl.i32(), sl.size(),
                               KVARN_DTYPE_F32, kd, kd + sl.size() * s.Hk * D) != KVARN_OK) {
      return "setup append: " + std::string(kvarn_last_error());
    }
    size_t ws = 0;
    kvarn_paged_flush_workspace_size(&s.cfg, s.Hk, src.size(), &ws);
    Mem dws(ctx, ws);
    kvarn_launch_t launch;
    kvarn_launch_defaults(&launch);
    launch.workspace = dws.get();
    launch.workspace_bytes = ws;
    if (kvarn_paged_flush_run(ctx, &s.cfg, &kv, &launch, src.size(), dn.i32(), dsrc.i32(),
                              ddst.i32(), nullptr) != KVARN_OK ||
        kvarn_context_synchronize(ctx) != KVARN_OK) {
      return "setup flush: " + std::string(kvarn_last_error());
    }
    sc->pools.k_pages = kp.Download<uint16_t>();
    sc->pools.v_pages = vp.Download<uint16_t>();
    sc->pools.records = rec.Download<uint8_t>();
  }

  // The step, well formed.
  s.dtype = static_cast<kvarn_dtype_t>(ch->Below(3) == 0   ? KVARN_DTYPE_F16
                                       : ch->Below(2) == 0 ? KVARN_DTYPE_BF16
                                                           : KVARN_DTYPE_F32);
  s.token_indptr.assign(B + 1, 0);
  s.slots.clear();
  for (int b = 0; b < B; ++b) {
    s.token_indptr[b + 1] = s.token_indptr[b] + sc->n[b];
    for (int t = 0; t < sc->n[b]; ++t) {
      const int pos = N[b] + t;
      s.slots.push_back(ch->OneIn(12) ? -1 : Page(b, pos / G) * G + pos % G);  // -1: skipped
    }
  }
  const int total = s.token_indptr[B];
  s.max_tokens = static_cast<size_t>(total) + ch->Below(3);
  s.slots.resize(s.max_tokens, -1);
  const size_t row_vals = static_cast<size_t>(s.Hk) * D;
  s.k.assign(std::max<size_t>(s.max_tokens, 1) * row_vals * DtypeBytes(s.dtype), 0);
  s.v = s.k;
  for (size_t i = 0; i < s.max_tokens * row_vals; ++i) {
    PutValue(&s.k, s.dtype, i, data.Value(3.f));
    PutValue(&s.v, s.dtype, i, data.Value(1.f));
  }
  // Flush: the tiles complete after the step that are not records yet.
  sc->owner.clear();
  s.src.clear();
  s.dst.clear();
  std::vector<int> rt_after(B);
  for (int b = 0; b < B; ++b) {
    const int complete = std::max(0, (N[b] + sc->n[b]) / G - sink);
    rt_after[b] = rt[b];
    for (int i = rt[b]; i < complete; ++i) {
      s.src.push_back(Page(b, sink + i));
      s.dst.push_back(Page(b, sink + i));
      sc->owner.push_back(b);
      ++rt_after[b];
    }
  }
  s.tile_seqs.assign(sc->owner.begin(), sc->owner.end());
  s.n_tiles = {static_cast<int32_t>(s.src.size())};
  s.max_tiles = s.src.size() + ch->Below(2);
  s.src.resize(std::max<size_t>(s.max_tiles, 1), 0);
  s.dst.resize(s.src.size(), 0);
  s.tile_seqs.resize(s.src.size(), 0);
  // Attention over the lengths after the append.
  s.decode = ch->Below(2) == 0;
  s.seq_lens.resize(B);
  s.record_tiles = rt_after;
  s.block_table.resize(static_cast<size_t>(B) * kMaxBlocks);
  for (int b = 0; b < B; ++b) {
    s.seq_lens[b] = N[b] + sc->n[b];
    for (int i = 0; i < kMaxBlocks; ++i) s.block_table[b * kMaxBlocks + i] = Page(b, i);
  }
  s.q_indptr.assign(B + 1, 0);
  s.max_q_per_seq = 4;
  for (int b = 0; b < B; ++b) {
    const int nq = std::min<int>(s.seq_lens[b], static_cast<int>(ch->Below(5)));
    s.q_indptr[b + 1] = s.q_indptr[b] + nq;
  }
  s.max_total_q = s.q_indptr[B] + ch->Below(3);
  s.q.resize(s.rows() * s.Hq * D);
  for (auto& x : s.q) x = data.Value(0.5f);
  s.preset.assign(B, 0);

  const std::vector<int32_t> intended = s.token_indptr;
  // Malformations, each with some chance (a few per step).
  const int n_bad = static_cast<int>(ch->Below(4));
  for (int i = 0; i < n_bad; ++i) {
    const int b = static_cast<int>(ch->Below(B));
    switch (ch->Below(14)) {
      case 0:  // a token_indptr boundary anywhere
        s.token_indptr[ch->Below(B + 1)] = static_cast<int32_t>(ch->Below(total + 4)) - 1;
        break;
      case 1:  // two boundaries swapped (overlapping ranges)
        if (B >= 2) std::swap(s.token_indptr[1 + ch->Below(B)], s.token_indptr[ch->Below(B)]);
        break;
      case 2:  // a write slot outside the pool
        if (total > 0) {
          const int32_t far[] = {s.num_pages * G, s.num_pages * G + 17, -2, INT32_MIN, INT32_MAX};
          s.slots[ch->Below(total)] = far[ch->Below(5)];
        }
        break;
      case 3:  // a NaN, Inf or fp16-overflowing value
        if (total > 0) {
          const float bad[] = {NAN, INFINITY, -INFINITY, 1e6f, -70000.f};
          PutValue(ch->Below(2) ? &s.k : &s.v, s.dtype, ch->Below(total * row_vals),
                   bad[ch->Below(5)]);
        }
        break;
      case 4:  // max_tokens cuts the last sequences
        s.max_tokens = ch->Below(static_cast<uint32_t>(s.max_tokens) + 1);
        break;
      case 5:  // a flush entry outside its pool
        if (!sc->owner.empty()) {
          (ch->Below(2) ? s.src : s.dst)[ch->Below(sc->owner.size())] =
              ch->Below(2) ? -1 : s.num_pages + static_cast<int32_t>(ch->Below(3));
        }
        break;
      case 6:  // a flush of the sequence's incomplete tile (poisoned: NaN)
        if (s.max_tiles > sc->owner.size()) {
          const int tile = std::min(kMaxBlocks - 1, (N[b] + sc->n[b]) / G);
          s.src[sc->owner.size()] = Page(b, tile);
          s.dst[sc->owner.size()] = Page(b, tile);
          s.tile_seqs[sc->owner.size()] = b;
          s.n_tiles[0] = static_cast<int32_t>(sc->owner.size()) + 1;
          sc->owner.push_back(b);
        }
        break;
      case 7:  // call-level flush errors
        if (ch->Below(2)) {
          s.n_tiles[0] = ch->Below(2) ? -1 : static_cast<int32_t>(s.max_tiles) + 1;
        } else if (!sc->owner.empty()) {
          // Outside the batch and not -1 (-1 names an entry of no sequence, which is valid).
          s.tile_seqs[ch->Below(sc->owner.size())] = ch->Below(2) ? -2 : B;
          sc->tile_seqs_bad = true;
        } else {
          break;
        }
        sc->flush_data_ok = false;
        break;
      case 8:  // a q_indptr boundary anywhere, or two swapped
        if (ch->Below(2)) {
          s.q_indptr[ch->Below(B + 1)] = static_cast<int32_t>(ch->Below(s.q_indptr[B] + 4)) - 1;
        } else if (B >= 2) {
          std::swap(s.q_indptr[1 + ch->Below(B)], s.q_indptr[ch->Below(B)]);
        }
        break;
      case 9:  // too many queries for the plan or the sequence
        s.max_q_per_seq = 1 + static_cast<int>(ch->Below(4));
        if (ch->Below(2)) s.max_total_q = ch->Below(static_cast<uint32_t>(s.max_total_q) + 1);
        break;
      case 10:  // a length outside the table, or negative
        s.seq_lens[b] = ch->Below(2) ? -1 : kMaxBlocks * G + 1 + static_cast<int>(ch->Below(G));
        break;
      case 11:  // record tiles beyond the complete tiles, or negative
        s.record_tiles[b] = ch->Below(2) ? -1 : s.seq_lens[b] / G + 1;
        break;
      case 12: {  // a block-table entry outside its pool
        const int tiles = (s.seq_lens[b] + G - 1) / G;
        if (tiles > 0) {
          s.block_table[b * kMaxBlocks + ch->Below(tiles)] =
              ch->Below(2) ? -1 : s.num_pages + static_cast<int32_t>(ch->Below(5));
        }
        break;
      }
      default:  // the engine marked the sequence before the step
        s.preset[b] = KVARN_ERR_CAPACITY;
        break;
    }
  }
  // Slots say which pages a token writes, so a token must not change hands undetected: a
  // sequence whose token_indptr boundaries are both good (kvarn.h) keeps its intended range,
  // else the malformed boundaries are dropped.
  const std::vector<int32_t>& ip = s.token_indptr;
  for (int b = 0; b < B; ++b) {
    if (GoodRange(ip, b, static_cast<int64_t>(s.max_tokens)) &&
        (ip[b] != intended[b] || ip[b + 1] != intended[b + 1])) {
      s.token_indptr = intended;
      break;
    }
  }
  // The rows of q and out follow the (possibly changed) plan bounds.
  s.q.resize(s.rows() * s.Hq * D);
  for (auto& x : s.q) x = data.Value(0.5f);
  return "";
}

// ---- the oracles ------------------------------------------------------------------------------

// Sequence b alone (batch 1) from the batch step: its own rows, entries and table row. With
// `flush` false the flush list is empty (the batch's flush failed as a whole).
inline Step Alone(const Scenario& sc, int b, bool flush) {
  const Step& s = sc.step;
  Step a = s;
  a.B = 1;
  int32_t t0 = s.token_indptr[b], t1 = s.token_indptr[b + 1];
  // A size-0 launch appends nothing (and checks nothing); a bad range is b's fault.
  if (s.max_tokens == 0 || t0 < 0 || t1 < t0 || static_cast<size_t>(t1) > s.max_tokens) {
    t0 = t1 = 0;
  }
  a.token_indptr = {0, t1 - t0};
  a.max_tokens = static_cast<size_t>(t1 - t0);
  a.slots.assign(s.slots.begin() + t0, s.slots.begin() + t1);
  const size_t row = static_cast<size_t>(s.Hk) * s.D * DtypeBytes(s.dtype);
  a.k.assign(s.k.begin() + t0 * row, s.k.begin() + t1 * row);
  a.v.assign(s.v.begin() + t0 * row, s.v.begin() + t1 * row);
  a.src.clear();
  a.dst.clear();
  for (int i = 0; flush && s.max_tiles > 0 && i < s.n_tiles[0] && i < int(sc.owner.size()); ++i) {
    if (sc.owner[i] != b) continue;
    a.src.push_back(s.src[i]);
    a.dst.push_back(s.dst[i]);
  }
  a.max_tiles = s.max_tiles == 0 ? 0 : a.src.size();
  a.n_tiles = {static_cast<int32_t>(a.src.size())};
  a.tile_seqs.assign(a.src.size(), 0);
  a.block_table.assign(s.block_table.begin() + b * kMaxBlocks,
                       s.block_table.begin() + (b + 1) * kMaxBlocks);
  a.seq_lens = {s.seq_lens[b]};
  a.record_tiles = {s.record_tiles[b]};
  int32_t q0 = s.decode ? b : s.q_indptr[b], q1 = s.decode ? b + 1 : s.q_indptr[b + 1];
  if (q0 < 0 || q1 < q0 || static_cast<size_t>(q1) > s.rows()) q0 = q1 = 0;  // b faults there
  a.q_indptr = {0, q1 - q0};
  a.max_total_q = s.max_total_q == 0 ? 0 : std::max(q1 - q0, 1);  // size 0: no attention
  const size_t qrow = static_cast<size_t>(s.Hq) * s.D;
  a.q.assign(s.q.begin() + q0 * qrow, s.q.begin() + q1 * qrow);
  a.q.resize(a.rows() * qrow);
  a.preset = {0};
  return a;
}

// a[ai, ai + n) == b[bi, bi + n), bit for bit (false when either is shorter).
template <typename T>
bool SameSpan(const std::vector<T>& a, size_t ai, const std::vector<T>& b, size_t bi, size_t n) {
  if (n == 0) return true;
  return a.size() >= ai + n && b.size() >= bi + n &&
         std::memcmp(a.data() + ai, b.data() + bi, n * sizeof(T)) == 0;
}

template <typename T>
bool SameRange(const std::vector<T>& a, const std::vector<T>& b, size_t begin, size_t count) {
  return SameSpan(a, begin, b, begin, count);
}

// Runs the scenario with and without a status array and checks every oracle. "" or what failed.
inline std::string Check(kvarn_context_t* ctx, Choices* ch, const Scenario& sc) {
  const Step& s = sc.step;
  const int B = s.B;
  const size_t page_elems = static_cast<size_t>(s.Hk) * s.G * s.D;
  const size_t seq_pages = kMaxBlocks * page_elems;
  const size_t seq_records = kMaxBlocks * s.Hk * RecordBytes(s.cfg);
  const size_t qrow = static_cast<size_t>(s.Hq) * s.D;
  Runner runner(ctx, ch);
  Outcome with, without;
  std::string e = runner.Run(s, sc.pools, true, true, &with);
  if (!e.empty()) return "status mode: " + e;
  Step plain = s;
  plain.preset.clear();
  e = runner.Run(plain, sc.pools, false, false, &without);
  if (!e.empty()) return "no-status mode: " + e;

  // The sequence alone, computed when needed (and its flush decided by the batch's).
  std::vector<Outcome> alone(2 * B);
  std::vector<char> have(2 * B, 0);
  const auto solo = [&](int b, bool flush) -> const Outcome* {
    const int i = 2 * b + flush;
    if (!have[i]) {
      Step a = Alone(sc, b, flush);
      Runner r(ctx, ch);
      if (!r.Run(a, sc.pools, true, false, &alone[i]).empty()) return nullptr;
      have[i] = 1;
    }
    return &alone[i];
  };
  // Output rows of sequence b (none under a size-0 extend launch).
  const auto rows_of = [&](int b, size_t* q0, size_t* nq) {
    *q0 = s.decode ? b : s.q_indptr[b];
    *nq = s.decode ? 1 : s.q_indptr[b + 1] - s.q_indptr[b];
    if (s.rows() == 0) *nq = 0;
  };
  const auto who = [](int b, int stage) {
    static const char* const kNames[] = {"append", "flush", "attention"};
    return "sequence " + std::to_string(b) + " after " + kNames[stage] + ": ";
  };

  // With a status array: every call but a call-level flush error returns OK.
  bool any_preset = false;
  for (int b = 0; b < B; ++b) any_preset = any_preset || s.preset[b] != 0;
  if (with.call[kAppend] != KVARN_OK) {
    return "append with a status array returned " + std::to_string(with.call[kAppend]);
  }
  const bool flush_ok = with.call[kFlush] == KVARN_OK;
  if (!flush_ok && (with.call[kFlush] != KVARN_ERR_INVALID_ARGUMENT || sc.flush_data_ok)) {
    return "flush with a status array returned " + std::to_string(with.call[kFlush]) + ": " +
           kvarn_last_error();
  }
  if (with.call[kAttention] != KVARN_OK) {
    return "attention with a status array returned " + std::to_string(with.call[kAttention]);
  }
  for (int b = 0; b < B; ++b) {
    int faulted = -1;  // the stage b faulted in; -1: before the step (engine), kStages: never
    int32_t code = s.preset[b];
    if (code == 0) faulted = kStages;
    for (int st = 0; st < kStages; ++st) {
      const int32_t now = with.status[st][b];
      if (code != 0 && now != code) return who(b, st) + "a set status entry changed";
      if (code == 0 && now != 0) {
        if (!IsDataError(now)) return who(b, st) + "status " + std::to_string(now);
        code = now;
        faulted = st;
      }
    }
    const size_t p0 = static_cast<size_t>(b) * seq_pages, r0 = b * seq_records;
    const Outcome* a = faulted > kAppend ? solo(b, flush_ok) : nullptr;
    if (faulted > kAppend && a == nullptr) return who(b, kAppend) + "alone, the run failed";
    // Pages: the pre-step state from the append it faulted in; else what it writes alone.
    for (int st = 0; st < kStages; ++st) {
      const auto& want_k = faulted <= kAppend ? sc.pools.k_pages : a->k_pages[kAppend];
      const auto& want_v = faulted <= kAppend ? sc.pools.v_pages : a->v_pages[kAppend];
      if (!SameRange(with.k_pages[st], want_k, p0, seq_pages) ||
          !SameRange(with.v_pages[st], want_v, p0, seq_pages)) {
        return who(b, st) + (faulted <= kAppend ? "faulted, but its pages changed"
                                                : "its pages differ from the run alone");
      }
    }
    if (faulted > kAppend && a->status[kAppend][0] != 0) {
      return who(b, kAppend) + "OK in the batch, faults alone";
    }
    // Records: likewise from the flush.
    for (int st = kFlush; st < kStages; ++st) {
      const auto& want = faulted <= kFlush ? sc.pools.records : a->records[kFlush];
      if (!SameRange(with.records[st], want, r0, seq_records)) {
        return who(b, st) + (faulted <= kFlush ? "faulted, but its records changed"
                                               : "its records differ from the run alone");
      }
    }
    if (faulted > kFlush && a->status[kFlush][0] != 0) {
      return who(b, kFlush) + "OK in the batch, faults alone";
    }
    if (faulted == kStages) {
      if (a->status[kAttention][0] != 0)
        return who(b, kAttention) + "OK in the batch, faults alone";
      size_t q0, nq;
      rows_of(b, &q0, &nq);
      if (!SameSpan(with.out, q0 * qrow, a->out, 0, nq * qrow) ||
          !SameSpan(with.lse, q0 * s.Hq, a->lse, 0, nq * s.Hq)) {
        return who(b, kAttention) + "reported OK, its output rows differ from the run alone";
      }
    }
  }

  // Without a status array: the first failing call writes nothing and is the call where, with a
  // status array and no engine-set entry, the first sequence faults.
  int first_fail = kStages;
  for (int st = 0; st < kStages; ++st) {
    if (without.ran[st] && without.call[st] != KVARN_OK) {
      first_fail = st;
      break;
    }
  }
  if (first_fail < kStages && !IsDataError(without.call[first_fail])) {
    return "without a status array a call returned " + std::to_string(without.call[first_fail]);
  }
  if (!any_preset && !sc.tile_seqs_bad) {
    int first_fault = kStages;
    for (int st = kStages - 1; st >= 0; --st) {
      bool any = st == kFlush && !flush_ok;
      for (int b = 0; b < B; ++b) any = any || with.status[st][b] != 0;
      if (any) first_fault = st;
    }
    if (first_fault != first_fail) {
      return "the first call to fail without a status array (" + std::to_string(first_fail) +
             ") is not the first with a fault under one (" + std::to_string(first_fault) + ")";
    }
  }
  const auto& k_before = first_fail == kAppend ? sc.pools.k_pages : without.k_pages[kAppend];
  const auto& r_before = first_fail <= kFlush ? sc.pools.records : without.records[kFlush];
  if (first_fail < kStages) {
    if (without.k_pages[first_fail] != k_before || without.records[first_fail] != r_before) {
      return "a call that failed without a status array wrote";
    }
  } else {
    // All passed: each sequence equals its run alone.
    for (int b = 0; b < B; ++b) {
      const Outcome* a = solo(b, true);
      if (a == nullptr) return "sequence " + std::to_string(b) + ": alone, the run failed";
      const size_t p0 = static_cast<size_t>(b) * seq_pages, r0 = b * seq_records;
      size_t q0, nq;
      rows_of(b, &q0, &nq);
      if (!SameRange(without.k_pages[kAttention], a->k_pages[kAttention], p0, seq_pages) ||
          !SameRange(without.records[kAttention], a->records[kAttention], r0, seq_records) ||
          !SameSpan(without.out, q0 * qrow, a->out, 0, nq * qrow)) {
        return "sequence " + std::to_string(b) + ": without a status array, differs from alone";
      }
    }
  }
  return "";
}

}  // namespace iso
}  // namespace kvt
