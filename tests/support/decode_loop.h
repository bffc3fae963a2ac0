// An engine's decode loop over the capturable layer 2 (kvarn.h "plan / run"), as the GPU suites
// and the benchmarks drive it: a host scheduler keeps per-slot lengths, block tables and free
// lists, and writes each step's metadata (write slots, flush list, the tables after the flush)
// into fixed-size host arrays; the caller uploads them into the context's memory and runs
// append -> flush -> attention per layer. Sequences grow one token per step, finish at a random
// length and are replaced; a free slot is padding (no token, length 0). Public API only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kvarn/kvarn.h"
#include "support/rng.h"

namespace kvt {

struct DecodeLoopSpec {
  int batch = 8;
  int min_len = 1, max_len = 300;  // a sequence finishes at a length drawn from this range
  double idle_prob = 0.1;          // a finished slot stays padding for a step with this chance
  int max_blocks = 0;              // block_table stride; 0 = enough for max_len
};

// One step's metadata, all sized for the batch (the shapes a captured graph needs).
struct StepMeta {
  std::vector<int32_t> token_indptr;  // [batch + 1]
  std::vector<int32_t> slot_mapping;  // [batch] page * G + position, -1 for padding
  std::vector<int32_t> flush_src, flush_dst, flush_seq;  // [batch] (first n_flush used)
  std::vector<int32_t> n_flush;                          // [1]
  std::vector<int32_t> block_table;                      // [batch][max_blocks] after the flush
  std::vector<int32_t> seq_lens;                         // [batch] after the append
  std::vector<int32_t> record_tiles;                     // [batch] after the flush
  // For the host-list API (kvarn_paged_append / kvarn_paged_flush) of the same step.
  std::vector<int32_t> block_table_before;   // [batch][max_blocks] with this step's pages
  std::vector<int32_t> seq_lens_before;      // [batch] write positions
  std::vector<int32_t> record_tiles_before;  // [batch]
};

class DecodeLoop {
 public:
  DecodeLoop(const kvarn_config_t& cfg, const DecodeLoopSpec& spec, uint64_t seed)
      : G_(cfg.tile_tokens), sink_(cfg.sink_tiles), spec_(spec), rng_(seed) {
    max_blocks_ = spec.max_blocks > 0 ? spec.max_blocks : (spec.max_len + G_ - 1) / G_;
    const int B = spec.batch;
    // Pools that always suffice: every slot at its longest.
    num_pages_ = B * (sink_ + 2);
    num_blocks_ = B * max_blocks_;
    for (int p = num_pages_ - 1; p >= 0; --p) free_pages_.push_back(p);
    for (int r = num_blocks_ - 1; r >= 0; --r) free_blocks_.push_back(r);
    lens_.assign(B, 0);
    target_.assign(B, 0);
    rtiles_.assign(B, 0);
    table_.assign(static_cast<size_t>(B) * max_blocks_, 0);
    for (int b = 0; b < B; ++b) Start(b);
  }

  int num_pages() const { return num_pages_; }
  int num_blocks() const { return num_blocks_; }
  int max_blocks() const { return max_blocks_; }
  int batch() const { return spec_.batch; }
  int finished() const { return finished_; }

  // Schedules the next step: one token for every live slot.
  void Next(StepMeta* m) {
    const int B = spec_.batch;
    m->token_indptr.assign(B + 1, 0);
    m->slot_mapping.assign(B, -1);
    m->flush_src.assign(B, 0);
    m->flush_dst.assign(B, 0);
    m->flush_seq.assign(B, 0);
    m->n_flush.assign(1, 0);
    // Pages flushed by the previous step are free again (its work is enqueued before this one's).
    for (int p : spent_pages_) free_pages_.push_back(p);
    spent_pages_.clear();
    // Finished sequences free their blocks; their slot is padding or starts a new sequence.
    for (int b = 0; b < B; ++b) {
      if (target_[b] > 0 && lens_[b] >= target_[b]) {
        Release(b);
        ++finished_;
        if (!rng_.Bernoulli(spec_.idle_prob)) Start(b);
      } else if (target_[b] == 0 && !rng_.Bernoulli(spec_.idle_prob)) {
        Start(b);
      }
    }
    m->seq_lens_before = lens_;
    for (int b = 0; b < B; ++b) {
      const bool live = target_[b] > 0;
      m->token_indptr[b + 1] = m->token_indptr[b] + (live ? 1 : 0);
      if (!live) continue;
      const int pos = lens_[b], tile = pos / G_;
      if (pos % G_ == 0) Entry(b, tile) = TakePage();
      m->slot_mapping[m->token_indptr[b]] = Entry(b, tile) * G_ + pos % G_;
    }
    m->block_table_before = table_;
    m->record_tiles_before = rtiles_;
    for (int b = 0; b < B; ++b) {
      if (target_[b] == 0) continue;
      const int len = ++lens_[b];
      const int tile = (len - 1) / G_;
      if (len % G_ != 0 || tile < sink_) continue;  // no tile completed, or a sink tile
      const int i = m->n_flush[0]++;
      m->flush_src[i] = Entry(b, tile);
      m->flush_dst[i] = TakeBlock();
      m->flush_seq[i] = b;
      spent_pages_.push_back(Entry(b, tile));  // reusable from the next step on
      Entry(b, tile) = m->flush_dst[i];
      ++rtiles_[b];
    }
    m->block_table = table_;
    m->seq_lens = lens_;
    m->record_tiles = rtiles_;
  }

 private:
  int32_t& Entry(int b, int tile) { return table_[static_cast<size_t>(b) * max_blocks_ + tile]; }
  int TakePage() {
    const int p = free_pages_.back();
    free_pages_.pop_back();
    return p;
  }
  int TakeBlock() {
    const int r = free_blocks_.back();
    free_blocks_.pop_back();
    return r;
  }
  void Start(int b) {
    target_[b] = static_cast<int>(rng_.Int(spec_.min_len, spec_.max_len));
    lens_[b] = 0;
    rtiles_[b] = 0;
  }
  void Release(int b) {
    const int tiles = (lens_[b] + G_ - 1) / G_;
    for (int t = 0; t < tiles; ++t) {
      const bool record = t >= sink_ && t < sink_ + rtiles_[b];
      (record ? free_blocks_ : free_pages_).push_back(Entry(b, t));
      Entry(b, t) = 0;
    }
    target_[b] = 0;
    lens_[b] = 0;
    rtiles_[b] = 0;
  }

  int G_, sink_;
  DecodeLoopSpec spec_;
  Rng rng_;
  int max_blocks_ = 0, num_pages_ = 0, num_blocks_ = 0, finished_ = 0;
  std::vector<int32_t> lens_, target_, rtiles_, table_;
  std::vector<int32_t> free_pages_, free_blocks_, spent_pages_;
};

}  // namespace kvt
