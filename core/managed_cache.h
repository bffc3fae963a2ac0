// The managed KV cache (layer 3): pools per layer on the context's device, sequences with block
// tables, commit/speculation, fork with shared records, export/import. Built only on the layer-1
// and layer-2 operations of core/ops.h.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/backend.h"
#include "core/config.h"

namespace kvarn {

class ManagedCache {
 public:
  static Status Create(Context* ctx, const kvarn_cache_options_t& options,
                       std::unique_ptr<ManagedCache>* out);
  ~ManagedCache();

  Status AddSequence(int64_t id);
  Status RemoveSequence(int64_t id);
  Status Fork(int64_t src, int64_t dst, int64_t n_tokens);
  Status Truncate(int64_t id, int64_t n_tokens);
  Status Append(int64_t id, int layer, size_t n_tokens, kvarn_dtype_t dtype, const void* k,
                const void* v, uint32_t flags);
  Status Commit(int64_t id, int64_t n_tokens);
  Status Length(int64_t id, int layer, int64_t* tokens, int64_t* committed) const;
  Status Attention(int layer, size_t n_seqs, const int64_t* ids,
                   const kvarn_attention_params_t* params, const void* q, void* out, float* lse);
  Status Stats(kvarn_cache_stats_t* stats) const;
  Status Export(int64_t id, void* buffer, size_t buffer_bytes, size_t* out_bytes) const;
  Status Import(int64_t id, const void* blob, size_t blob_bytes);

 private:
  // One sequence in one layer. Tile i is a record tile when sink <= i < sink + record_tiles,
  // otherwise an fp16 page; table[i] names its block or page.
  struct SeqLayer {
    int64_t len = 0;
    int64_t committed = 0;
    int32_t record_tiles = 0;
    std::vector<int32_t> table;
  };
  struct Sequence {
    std::vector<SeqLayer> layers;
  };
  // Pools and allocators of one layer. Record blocks are reference-counted (forks share them);
  // pages belong to exactly one sequence.
  struct Layer {
    void* records = nullptr;
    void* k_pages = nullptr;
    void* v_pages = nullptr;
    std::vector<int32_t> block_refs;
    std::vector<int32_t> free_blocks;
    std::vector<int32_t> free_pages;
  };
  // Undo log of one operation on one layer: pages and blocks it took, pages it released (held
  // back until the operation succeeds, so a rollback finds their bytes intact), and the
  // sequence's state before it.
  struct Txn {
    int layer = 0;
    SeqLayer saved;
    std::vector<int32_t> new_pages, new_blocks, released_pages;
    std::vector<int32_t> shared_blocks;  // references taken on existing blocks (fork)
  };

  ManagedCache() = default;
  bool IsRecordTile(const SeqLayer& s, int64_t tile) const;
  // Drops tiles [first_tile, end) of s: pages back to the pool, block references released.
  void DropTiles(int layer, SeqLayer& s, int64_t first_tile);
  PagedKV View(int layer, int batch, const int32_t* table, int32_t max_blocks, const int32_t* lens,
               const int32_t* record_tiles) const;
  Status AllocPage(Txn& t, int32_t* page);
  Status AllocBlock(Txn& t, int32_t* block);
  void ReleasePage(Txn& t, int32_t page);
  void CommitTxn(Txn& t);
  void RollbackTxn(Txn& t, SeqLayer& s);
  // Runs op(txn, layer_state) on every layer of `layers` under one transaction per layer; if
  // any layer fails, every layer is rolled back and the pools are as before.
  template <typename Op>
  Status AllLayersOrNone(std::vector<SeqLayer>& layers, Op op);
  Status ForkLayer(Txn& t, const SeqLayer& src, int64_t keep, SeqLayer& dst);
  // Quantizes every complete, committed, non-sink fp16 tile of s (in order).
  Status FlushCommitted(Txn& t, SeqLayer& s);
  Status AppendTokens(Txn& t, SeqLayer& s, size_t n, kvarn_dtype_t dtype, const void* k,
                      const void* v, bool commit);
  Sequence* Find(int64_t id);
  const Sequence* Find(int64_t id) const;
  size_t PageElems() const { return static_cast<size_t>(Hk_) * cfg_.G * cfg_.D; }
  Status CheckCut(const SeqLayer& s, int64_t n, const char* what) const;
  // Moves kv's block table, lengths and record-tile counts into the context's memory.
  Status StageTables(PagedKV* kv);
  // Waits for the device and returns what its kernels reported (no-op on the CPU).
  Status AwaitDevice();

  Context* ctx_ = nullptr;
  Config cfg_;
  kvarn_config_t public_cfg_{};
  int L_ = 0, Hk_ = 0;
  int64_t max_tokens_ = 0;
  int max_sequences_ = 0;
  int32_t num_blocks_ = 0, num_pages_ = 0;
  size_t record_stride_ = 0;
  std::vector<Layer> layers_;
  std::map<int64_t, Sequence> seqs_;
  mutable std::mutex mutex_;
  void* dev_tables_ = nullptr;  // StageTables' buffer (GPU contexts)
  size_t dev_tables_bytes_ = 0;
};

}  // namespace kvarn
