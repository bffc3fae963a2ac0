#include "core/managed_cache.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/abi_struct.h"
#include "core/checked.h"
#include "core/checksum.h"
#include "core/ops.h"

namespace kvarn {
namespace {

std::string SeqName(int64_t id) { return "sequence " + std::to_string(id); }

Status NotFound(int64_t id) { return {KVARN_ERR_NOT_FOUND, SeqName(id) + " does not exist"}; }

// The status of an operation that caught std::bad_alloc (the message needs no allocation).
Status OutOfMemory() { return {KVARN_ERR_OUT_OF_MEMORY, "out of memory"}; }

// For a >= 0, b > 0; never overflows (a may be near INT64_MAX).
int64_t CeilDiv(int64_t a, int64_t b) { return a / b + (a % b != 0); }

}  // namespace

// ---- creation -----------------------------------------------------------------------------

Status ManagedCache::Create(Context* ctx, const kvarn_cache_options_t& o,
                            std::unique_ptr<ManagedCache>* out) {
  std::unique_ptr<ManagedCache> c(new ManagedCache());
  KVARN_RETURN_IF_ERROR(ParseConfig(&o.config, &c->cfg_));
  if (o.num_layers < 1 || o.num_layers > 4096) return InvalidArgument("num_layers outside 1..4096");
  if (o.num_kv_heads < 1 || o.num_kv_heads > 1024) {
    return InvalidArgument("num_kv_heads outside 1..1024");
  }
  if (o.max_sequences < 1) return InvalidArgument("max_sequences must be >= 1");
  if (o.max_tokens < 1) return InvalidArgument("max_tokens must be >= 1");
  c->ctx_ = ctx;
  c->public_cfg_ = o.config;
  c->L_ = o.num_layers;
  c->Hk_ = o.num_kv_heads;
  c->max_tokens_ = o.max_tokens;
  c->max_sequences_ = o.max_sequences;
  const int G = c->cfg_.G;
  // Records hold at most max_tokens tokens; pages hold each sequence's sink and tail (+1 for a
  // tail that spills into the next tile during an append or speculation).
  const int64_t blocks = CeilDiv(o.max_tokens, G);
  const int64_t pages = static_cast<int64_t>(o.max_sequences) * (c->cfg_.sink_tiles + 2);
  if (blocks > INT32_MAX / 2 || pages > INT32_MAX / 2) {
    return {KVARN_ERR_CAPACITY, "max_tokens or max_sequences too large"};
  }
  c->num_blocks_ = static_cast<int32_t>(blocks);
  c->num_pages_ = static_cast<int32_t>(pages);
  c->record_stride_ = (c->cfg_.record_bytes() + 15) / 16 * 16;
  c->layers_.resize(c->L_);
  for (Layer& L : c->layers_) {
    KVARN_RETURN_IF_ERROR(ctx->ops->alloc(
        ctx, static_cast<size_t>(c->num_blocks_) * c->Hk_ * c->record_stride_, &L.records));
    KVARN_RETURN_IF_ERROR(
        ctx->ops->alloc(ctx, static_cast<size_t>(c->num_pages_) * c->PageElems() * 2, &L.k_pages));
    KVARN_RETURN_IF_ERROR(
        ctx->ops->alloc(ctx, static_cast<size_t>(c->num_pages_) * c->PageElems() * 2, &L.v_pages));
    L.block_refs.assign(c->num_blocks_, 0);
    // Full capacity now, so that returning an id to a free list never allocates (rollbacks
    // run after an allocation failed and must not fail themselves).
    L.free_blocks.reserve(c->num_blocks_);
    L.free_pages.reserve(c->num_pages_);
    // Free lists are stacks; fill them so that low ids are handed out first.
    for (int32_t b = c->num_blocks_ - 1; b >= 0; --b) L.free_blocks.push_back(b);
    for (int32_t p = c->num_pages_ - 1; p >= 0; --p) L.free_pages.push_back(p);
  }
  *out = std::move(c);
  return Status::Ok();
}

ManagedCache::~ManagedCache() {
  if (dev_tables_) ctx_->ops->free(ctx_, dev_tables_);
  for (Layer& L : layers_) {
    if (L.records) ctx_->ops->free(ctx_, L.records);
    if (L.k_pages) ctx_->ops->free(ctx_, L.k_pages);
    if (L.v_pages) ctx_->ops->free(ctx_, L.v_pages);
  }
}

// ---- helpers ------------------------------------------------------------------------------

ManagedCache::Sequence* ManagedCache::Find(int64_t id) {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

const ManagedCache::Sequence* ManagedCache::Find(int64_t id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

bool ManagedCache::IsRecordTile(const SeqLayer& s, int64_t tile) const {
  return tile >= cfg_.sink_tiles && tile < cfg_.sink_tiles + s.record_tiles;
}

Status ManagedCache::AllocPage(Txn& t, int32_t* page) {
  Layer& L = layers_[t.layer];
  if (L.free_pages.empty()) {
    return {KVARN_ERR_CAPACITY, "no free fp16 page in layer " + std::to_string(t.layer) + " (" +
                                    std::to_string(num_pages_) +
                                    " pages; raise max_sequences or commit speculative tokens)"};
  }
  // Logged before it leaves the free list: if logging fails (no memory), nothing has changed.
  t.new_pages.push_back(L.free_pages.back());
  *page = L.free_pages.back();
  L.free_pages.pop_back();
  return Status::Ok();
}

Status ManagedCache::AllocBlock(Txn& t, int32_t* block) {
  Layer& L = layers_[t.layer];
  if (L.free_blocks.empty()) {
    return {KVARN_ERR_CAPACITY, "record pool of layer " + std::to_string(t.layer) +
                                    " is full (max_tokens " + std::to_string(max_tokens_) + ")"};
  }
  t.new_blocks.push_back(L.free_blocks.back());  // logged first, as in AllocPage
  *block = L.free_blocks.back();
  L.free_blocks.pop_back();
  L.block_refs[*block] = 1;
  return Status::Ok();
}

void ManagedCache::ReleasePage(Txn& t, int32_t page) {
  auto it = std::find(t.new_pages.begin(), t.new_pages.end(), page);
  if (it != t.new_pages.end()) {
    // Taken by this operation: its bytes matter to nobody after a rollback, reuse it now.
    t.new_pages.erase(it);
    layers_[t.layer].free_pages.push_back(page);
  } else {
    t.released_pages.push_back(page);  // held until the operation succeeds
  }
}

void ManagedCache::CommitTxn(Txn& t) {
  Layer& L = layers_[t.layer];
  for (int32_t p : t.released_pages) L.free_pages.push_back(p);
  t = Txn{};
}

void ManagedCache::RollbackTxn(Txn& t, SeqLayer& s) {
  Layer& L = layers_[t.layer];
  for (int32_t p : t.new_pages) L.free_pages.push_back(p);
  for (int32_t b : t.new_blocks) {
    L.block_refs[b] = 0;
    L.free_blocks.push_back(b);
  }
  for (int32_t b : t.shared_blocks) --L.block_refs[b];
  s = std::move(t.saved);  // a move: a rollback never allocates
  t = Txn{};
}

template <typename Op>
Status ManagedCache::AllLayersOrNone(std::vector<SeqLayer>& layers, Op op) {
  std::vector<Txn> txns;
  int started = 0;  // layers whose transaction holds their saved state
  Status st;
  try {
    txns.resize(L_);
    for (int l = 0; l < L_ && st.ok(); ++l) {
      txns[l].layer = l;
      txns[l].saved = layers[l];
      started = l + 1;
      st = op(txns[l], layers[l]);
    }
  } catch (const std::bad_alloc&) {
    // Out of memory anywhere inside (undo logs, tables, staging buffers, worker threads): the
    // undo logs are complete at every allocation, so the rollback below restores everything.
    st = OutOfMemory();
  }
  if (!st.ok()) {
    for (int j = started - 1; j >= 0; --j) RollbackTxn(txns[j], layers[j]);
    return st;
  }
  for (Txn& t : txns) CommitTxn(t);
  return Status::Ok();
}

void ManagedCache::DropTiles(int layer, SeqLayer& s, int64_t first_tile) {
  Layer& L = layers_[layer];
  for (int64_t i = first_tile; i < static_cast<int64_t>(s.table.size()); ++i) {
    const int32_t id = s.table[i];
    if (IsRecordTile(s, i)) {
      if (--L.block_refs[id] == 0) L.free_blocks.push_back(id);
    } else {
      L.free_pages.push_back(id);
    }
  }
  s.table.resize(std::min<size_t>(s.table.size(), first_tile));
  s.record_tiles = static_cast<int32_t>(
      std::max<int64_t>(0, std::min<int64_t>(s.record_tiles, first_tile - cfg_.sink_tiles)));
}

PagedKV ManagedCache::View(int layer, int batch, const int32_t* table, int32_t max_blocks,
                           const int32_t* lens, const int32_t* record_tiles) const {
  const Layer& L = layers_[layer];
  PagedKV kv;
  kv.num_kv_heads = Hk_;
  kv.batch = batch;
  kv.records = static_cast<uint8_t*>(L.records);
  kv.record_stride = record_stride_;
  kv.num_record_blocks = num_blocks_;
  kv.k_pages = static_cast<uint16_t*>(L.k_pages);
  kv.v_pages = static_cast<uint16_t*>(L.v_pages);
  kv.num_pages = num_pages_;
  kv.block_table = table;
  kv.max_blocks_per_seq = max_blocks;
  kv.seq_lens = lens;
  kv.record_tiles = record_tiles;
  return kv;
}

Status ManagedCache::StageTables(PagedKV* kv) {
  if (ctx_->backend == KVARN_BACKEND_CPU) return Status::Ok();  // host memory is its memory
  // GPU contexts read block tables, lengths and record-tile counts from device memory: copy
  // them into the cache's staging buffer (grown on demand; callers hold mutex_).
  const size_t table_n = static_cast<size_t>(kv->batch) * kv->max_blocks_per_seq;
  const size_t bytes = (table_n + 2 * static_cast<size_t>(kv->batch)) * sizeof(int32_t);
  if (bytes > dev_tables_bytes_) {
    if (dev_tables_) ctx_->ops->free(ctx_, dev_tables_);
    dev_tables_ = nullptr;
    dev_tables_bytes_ = 0;
    KVARN_RETURN_IF_ERROR(ctx_->ops->alloc(ctx_, bytes, &dev_tables_));
    dev_tables_bytes_ = bytes;
  }
  int32_t* d = static_cast<int32_t*>(dev_tables_);
  const std::pair<const int32_t*, size_t> parts[] = {
      {kv->block_table, table_n}, {kv->seq_lens, kv->batch}, {kv->record_tiles, kv->batch}};
  int32_t* dst = d;
  for (const auto& part : parts) {
    KVARN_RETURN_IF_ERROR(ctx_->ops->copy(ctx_, dst, part.first, part.second * sizeof(int32_t),
                                          CopyKind::kHostToDevice));
    dst += part.second;
  }
  kv->block_table = d;
  kv->seq_lens = d + table_n;
  kv->record_tiles = d + table_n + kv->batch;
  return Status::Ok();
}

Status ManagedCache::AwaitDevice() {
  // GPU kernels report what they find in device memory at the next synchronization; the cache
  // needs the answer before it commits its bookkeeping.
  return ctx_->backend == KVARN_BACKEND_CPU ? Status::Ok() : ctx_->ops->synchronize(ctx_);
}

Status ManagedCache::FlushCommitted(Txn& t, SeqLayer& s) {
  const int G = cfg_.G;
  std::vector<int32_t> src, dst;
  for (int64_t tile = cfg_.sink_tiles + s.record_tiles; tile < s.committed / G; ++tile) {
    int32_t block;
    KVARN_RETURN_IF_ERROR(AllocBlock(t, &block));
    src.push_back(s.table[tile]);
    dst.push_back(block);
  }
  if (src.empty()) return Status::Ok();
  const PagedKV kv = View(t.layer, 0, nullptr, 0, nullptr, nullptr);
  KVARN_RETURN_IF_ERROR(OpPagedFlush(ctx_, cfg_, kv, src.size(), src.data(), dst.data()));
  for (size_t i = 0; i < src.size(); ++i) {
    const int64_t tile = cfg_.sink_tiles + s.record_tiles;
    ReleasePage(t, src[i]);
    s.table[tile] = dst[i];
    ++s.record_tiles;
  }
  return Status::Ok();
}

Status ManagedCache::AppendTokens(Txn& t, SeqLayer& s, size_t n, kvarn_dtype_t dtype, const void* k,
                                  const void* v, bool commit) {
  const int G = cfg_.G;
  const size_t row_bytes = static_cast<size_t>(Hk_) * cfg_.D * DtypeSize(dtype);
  size_t done = 0;
  // Tile by tile: a completed, committed tile is quantized before the next one starts, so a long
  // prefill needs only one or two pages at a time.
  while (done < n) {
    const int64_t tile = s.len / G;
    if (s.len % G == 0) {
      int32_t page;
      KVARN_RETURN_IF_ERROR(AllocPage(t, &page));
      if (static_cast<int64_t>(s.table.size()) <= tile) s.table.resize(tile + 1, -1);
      s.table[tile] = page;
    }
    const size_t chunk = std::min<size_t>(n - done, G - s.len % G);
    if (s.len + static_cast<int64_t>(chunk) > INT32_MAX) {
      return {KVARN_ERR_CAPACITY, "sequence longer than 2^31 tokens"};
    }
    const int32_t len32 = static_cast<int32_t>(s.len);
    const int32_t rt = s.record_tiles;
    const int32_t indptr[2] = {0, static_cast<int32_t>(chunk)};
    PagedKV kv =
        View(t.layer, 1, s.table.data(), static_cast<int32_t>(s.table.size()), &len32, &rt);
    KVARN_RETURN_IF_ERROR(StageTables(&kv));
    KVARN_RETURN_IF_ERROR(OpPagedAppend(ctx_, cfg_, kv, indptr, dtype,
                                        static_cast<const uint8_t*>(k) + done * row_bytes,
                                        static_cast<const uint8_t*>(v) + done * row_bytes));
    KVARN_RETURN_IF_ERROR(AwaitDevice());
    s.len += chunk;
    done += chunk;
    if (commit) {
      s.committed = s.len;
      if (s.len % G == 0) KVARN_RETURN_IF_ERROR(FlushCommitted(t, s));
    }
  }
  return Status::Ok();
}

Status ManagedCache::CheckCut(const SeqLayer& s, int64_t n, const char* what) const {
  const int G = cfg_.G;
  if (n % G != 0 && IsRecordTile(s, n / G)) {
    return InvalidState(std::string(what) + " to " + std::to_string(n) +
                        " tokens would split tile " + std::to_string(n / G) +
                        ", which is already quantized; cut at a multiple of " + std::to_string(G) +
                        " tokens or inside the fp16 tail");
  }
  return Status::Ok();
}

// ---- sequences ----------------------------------------------------------------------------

Status ManagedCache::AddSequence(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (Find(id)) return {KVARN_ERR_ALREADY_EXISTS, SeqName(id) + " already exists"};
  if (static_cast<int>(seqs_.size()) >= max_sequences_) {
    return {KVARN_ERR_CAPACITY, "max_sequences (" + std::to_string(max_sequences_) + ") reached"};
  }
  Sequence s;
  s.layers.resize(L_);
  seqs_.emplace(id, std::move(s));
  return Status::Ok();
}

Status ManagedCache::RemoveSequence(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  Sequence* s = Find(id);
  if (!s) return NotFound(id);
  for (int l = 0; l < L_; ++l) DropTiles(l, s->layers[l], 0);
  seqs_.erase(id);
  return Status::Ok();
}

Status ManagedCache::Truncate(int64_t id, int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  Sequence* s = Find(id);
  if (!s) return NotFound(id);
  if (n < 0) return InvalidArgument("n_tokens must be >= 0");
  for (int l = 0; l < L_; ++l) {
    if (n < s->layers[l].len) KVARN_RETURN_IF_ERROR(CheckCut(s->layers[l], n, "truncating"));
  }
  // Checked for every layer first: nothing below can fail.
  for (int l = 0; l < L_; ++l) {
    SeqLayer& sl = s->layers[l];
    if (n >= sl.len) continue;
    DropTiles(l, sl, CeilDiv(n, cfg_.G));
    sl.len = n;
    sl.committed = std::min(sl.committed, n);
  }
  return Status::Ok();
}

Status ManagedCache::Fork(int64_t src_id, int64_t dst_id, int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Sequence* src = Find(src_id);
  if (!src) return NotFound(src_id);
  if (Find(dst_id)) return {KVARN_ERR_ALREADY_EXISTS, SeqName(dst_id) + " already exists"};
  if (static_cast<int>(seqs_.size()) >= max_sequences_) {
    return {KVARN_ERR_CAPACITY, "max_sequences (" + std::to_string(max_sequences_) + ") reached"};
  }
  if (n < -1) return InvalidArgument("n_tokens must be >= 0 or -1 (all committed tokens)");
  std::vector<int64_t> keep(L_);
  for (int l = 0; l < L_; ++l) {
    const SeqLayer& sl = src->layers[l];
    keep[l] = n < 0 ? sl.committed : n;
    if (keep[l] > sl.committed) {
      return InvalidArgument("cannot fork " + std::to_string(n) + " tokens: layer " +
                             std::to_string(l) + " has " + std::to_string(sl.committed) +
                             " committed tokens");
    }
    KVARN_RETURN_IF_ERROR(CheckCut(sl, keep[l], "forking"));
  }
  // The map node first (src stays valid: map nodes never move): once the pools have changed,
  // nothing may fail.
  const auto node = seqs_.emplace(dst_id, Sequence{}).first;
  Status st;
  try {
    node->second.layers.resize(L_);
    st = AllLayersOrNone(node->second.layers, [&](Txn& t, SeqLayer& dl) {
      return ForkLayer(t, src->layers[t.layer], keep[t.layer], dl);
    });
  } catch (const std::bad_alloc&) {
    st = OutOfMemory();
  }
  if (!st.ok()) seqs_.erase(node);
  return st;
}

Status ManagedCache::ForkLayer(Txn& t, const SeqLayer& src, int64_t keep, SeqLayer& dst) {
  const int G = cfg_.G;
  Layer& L = layers_[t.layer];
  dst.len = dst.committed = keep;
  dst.record_tiles = static_cast<int32_t>(
      std::max<int64_t>(0, std::min<int64_t>(src.record_tiles, keep / G - cfg_.sink_tiles)));
  const int64_t tiles = CeilDiv(keep, G);
  dst.table.resize(tiles);
  const size_t bytes = PageElems() * 2;
  for (int64_t tile = 0; tile < tiles; ++tile) {
    if (IsRecordTile(dst, tile)) {
      dst.table[tile] = src.table[tile];           // shared, never copied
      t.shared_blocks.push_back(src.table[tile]);  // logged first, as in AllocBlock
      ++L.block_refs[src.table[tile]];
      continue;
    }
    KVARN_RETURN_IF_ERROR(AllocPage(t, &dst.table[tile]));
    for (void* pool : {L.k_pages, L.v_pages}) {
      uint8_t* base = static_cast<uint8_t*>(pool);
      KVARN_RETURN_IF_ERROR(ctx_->ops->copy(ctx_, base + dst.table[tile] * bytes,
                                            base + src.table[tile] * bytes, bytes,
                                            CopyKind::kDeviceToDevice));
    }
  }
  return Status::Ok();
}

Status ManagedCache::Append(int64_t id, int layer, size_t n, kvarn_dtype_t dtype, const void* k,
                            const void* v, uint32_t flags) {
  std::lock_guard<std::mutex> lock(mutex_);
  Sequence* s = Find(id);
  if (!s) return NotFound(id);
  if (layer < 0 || layer >= L_) {
    return InvalidArgument("layer " + std::to_string(layer) + " outside 0.." +
                           std::to_string(L_ - 1));
  }
  KVARN_RETURN_IF_ERROR(CheckDtypeArg(dtype, "dtype"));
  if (flags & ~KVARN_APPEND_SPECULATIVE) return InvalidArgument("unknown append flags");
  if (n == 0) return Status::Ok();
  if (k == nullptr || v == nullptr) return InvalidArgument("k or v is NULL");
  SeqLayer& sl = s->layers[layer];
  const bool speculative = flags & KVARN_APPEND_SPECULATIVE;
  if (!speculative && sl.committed < sl.len) {
    return InvalidState(SeqName(id) + " holds " + std::to_string(sl.len - sl.committed) +
                        " speculative tokens in layer " + std::to_string(layer) +
                        "; commit or truncate them before a committed append");
  }
  Txn t;
  t.layer = layer;
  t.saved = sl;  // may throw: nothing has changed yet
  Status st;
  try {
    st = AppendTokens(t, sl, n, dtype, k, v, !speculative);
  } catch (const std::bad_alloc&) {
    st = OutOfMemory();  // the undo log is complete at every allocation
  }
  if (!st.ok()) {
    RollbackTxn(t, sl);
    return st;
  }
  CommitTxn(t);
  return Status::Ok();
}

Status ManagedCache::Commit(int64_t id, int64_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  Sequence* s = Find(id);
  if (!s) return NotFound(id);
  for (int l = 0; l < L_; ++l) {
    const SeqLayer& sl = s->layers[l];
    if (n > sl.len) {
      return InvalidArgument("cannot commit " + std::to_string(n) + " tokens: layer " +
                             std::to_string(l) + " holds " + std::to_string(sl.len));
    }
    if (n < sl.committed) {
      return InvalidArgument("cannot commit " + std::to_string(n) + " tokens: layer " +
                             std::to_string(l) + " already has " + std::to_string(sl.committed) +
                             " committed (use truncate to roll back)");
    }
  }
  return AllLayersOrNone(s->layers, [&](Txn& t, SeqLayer& sl) {
    sl.committed = n;
    return FlushCommitted(t, sl);
  });
}

Status ManagedCache::Length(int64_t id, int layer, int64_t* tokens, int64_t* committed) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Sequence* s = Find(id);
  if (!s) return NotFound(id);
  if (layer < 0 || layer >= L_) return InvalidArgument("layer out of range");
  if (tokens) *tokens = s->layers[layer].len;
  if (committed) *committed = s->layers[layer].committed;
  return Status::Ok();
}

// ---- attention ----------------------------------------------------------------------------

Status ManagedCache::Attention(int layer, size_t n_seqs, const int64_t* ids,
                               const kvarn_attention_params_t* params, const void* q, void* out,
                               float* lse) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (layer < 0 || layer >= L_) return InvalidArgument("layer out of range");
  if (n_seqs == 0) return Status::Ok();
  if (ids == nullptr) return InvalidArgument("seq_ids is NULL");
  if (n_seqs > static_cast<size_t>(INT32_MAX)) return InvalidArgument("too many sequences");
  AttentionArgs args;
  KVARN_RETURN_IF_ERROR(ParseAttentionParams(params, cfg_, Hk_, &args));
  std::vector<const SeqLayer*> rows(n_seqs);
  int32_t max_blocks = 1;
  for (size_t i = 0; i < n_seqs; ++i) {
    const Sequence* s = Find(ids[i]);
    if (!s) return NotFound(ids[i]);
    rows[i] = &s->layers[layer];
    if (rows[i]->len == 0) {
      return InvalidArgument(SeqName(ids[i]) + " holds no tokens in layer " +
                             std::to_string(layer));
    }
    max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(rows[i]->table.size()));
  }
  std::vector<int32_t> table(n_seqs * max_blocks, 0), lens(n_seqs), rts(n_seqs);
  for (size_t i = 0; i < n_seqs; ++i) {
    std::copy(rows[i]->table.begin(), rows[i]->table.end(), table.begin() + i * max_blocks);
    lens[i] = static_cast<int32_t>(rows[i]->len);
    rts[i] = rows[i]->record_tiles;
  }
  PagedKV kv =
      View(layer, static_cast<int>(n_seqs), table.data(), max_blocks, lens.data(), rts.data());
  KVARN_RETURN_IF_ERROR(StageTables(&kv));
  const size_t total_q = args.q_indptr ? static_cast<size_t>(args.q_indptr[n_seqs]) : n_seqs;
  size_t ws_bytes = 0;
  KVARN_RETURN_IF_ERROR(OpAttentionWorkspace(ctx_, cfg_, kv, args, total_q, &ws_bytes));
  void* ws = nullptr;
  if (ws_bytes > 0) KVARN_RETURN_IF_ERROR(ctx_->ops->alloc(ctx_, ws_bytes, &ws));
  Status st = OpPagedAttention(ctx_, cfg_, kv, args, q, out, lse, ws, ws_bytes);
  // The staged tables and the workspace must outlive the kernels.
  if (st.ok()) st = AwaitDevice();
  if (ws) ctx_->ops->free(ctx_, ws);
  return st;
}

// ---- statistics ---------------------------------------------------------------------------

Status ManagedCache::Stats(kvarn_cache_stats_t* st) const {
  std::lock_guard<std::mutex> lock(mutex_);
  // An output struct (core/abi_struct.h): the fields within stats->size are written.
  KVARN_RETURN_IF_ERROR(CheckOutStruct(st, "stats"));
  kvarn_cache_stats_t r;
  std::memset(&r, 0, sizeof r);
  r.size = sizeof r;
  r.sequences = static_cast<int64_t>(seqs_.size());
  for (const auto& kvp : seqs_) {
    for (const SeqLayer& sl : kvp.second.layers) {
      r.tokens += sl.len;
      r.committed_tokens += sl.committed;
    }
  }
  int64_t blocks = 0, pages = 0;
  for (const Layer& L : layers_) {
    blocks += num_blocks_ - static_cast<int64_t>(L.free_blocks.size());
    pages += num_pages_ - static_cast<int64_t>(L.free_pages.size());
  }
  const int64_t page_bytes = static_cast<int64_t>(PageElems()) * 2 * 2;  // K and V
  const int64_t block_bytes = static_cast<int64_t>(Hk_) * record_stride_;
  r.records = blocks * Hk_;
  r.pages = pages;
  r.bytes_used = blocks * block_bytes + pages * page_bytes;
  r.bytes_capacity =
      static_cast<int64_t>(L_) * (num_blocks_ * block_bytes + num_pages_ * page_bytes);
  r.fp16_bytes = r.tokens * Hk_ * cfg_.D * 2 * 2;
  r.compression_ratio = r.bytes_used > 0 ? static_cast<double>(r.fp16_bytes) / r.bytes_used : 0.0;
  return WriteStruct(r, "stats", st);
}

// ---- export / import ----------------------------------------------------------------------
//
// Blob (little-endian): header, then per layer its records (record_tiles * Hk * record_bytes,
// unpadded) and its fp16 tiles in tile order (K then V, Hk*G*D halves each), then a CRC-32C of
// everything before it.

namespace {

constexpr char kMagic[8] = {'K', 'V', 'A', 'R', 'N', 'S', 'E', 'Q'};
constexpr uint32_t kBlobVersion = 1;

struct BlobHeader {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;
  uint64_t total_bytes;
  int32_t cfg[8];  // D, G, bK, bV, iterations, sink_tiles, key_flags, value_flags
  int32_t num_layers;
  int32_t num_kv_heads;
};

struct BlobLayer {
  int64_t len;
  int64_t committed;
  int32_t record_tiles;
  int32_t page_tiles;
};

void ConfigWords(const kvarn_config_t& c, int32_t* w) {
  w[0] = c.head_dim;
  w[1] = c.tile_tokens;
  w[2] = c.key_bits;
  w[3] = c.value_bits;
  w[4] = c.iterations;
  w[5] = c.sink_tiles;
  w[6] = static_cast<int32_t>(c.key_flags);
  w[7] = static_cast<int32_t>(c.value_flags);
}

}  // namespace

Status ManagedCache::Export(int64_t id, void* buffer, size_t buffer_bytes,
                            size_t* out_bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const Sequence* s = Find(id);
  if (!s) return NotFound(id);
  if (out_bytes == nullptr) return InvalidArgument("out_bytes is NULL");
  const int G = cfg_.G;
  const size_t rb = cfg_.record_bytes();
  const size_t page_bytes = PageElems() * 2;
  size_t total = sizeof(BlobHeader) + L_ * sizeof(BlobLayer);
  for (const SeqLayer& sl : s->layers) {
    const int64_t tiles = CeilDiv(sl.len, G);
    total += static_cast<size_t>(sl.record_tiles) * Hk_ * rb +
             static_cast<size_t>(tiles - sl.record_tiles) * 2 * page_bytes;
  }
  total += sizeof(uint32_t);
  *out_bytes = total;
  if (buffer == nullptr) return Status::Ok();
  if (buffer_bytes < total) {
    return {KVARN_ERR_BUFFER_TOO_SMALL, "export needs " + std::to_string(total) +
                                            " bytes, buffer has " + std::to_string(buffer_bytes)};
  }
  std::vector<uint8_t> blob(total);  // staged: the caller's buffer is written only when complete
  BlobHeader h{};
  std::memcpy(h.magic, kMagic, 8);
  h.version = kBlobVersion;
  h.header_bytes = sizeof(BlobHeader) + L_ * sizeof(BlobLayer);
  h.total_bytes = total;
  ConfigWords(public_cfg_, h.cfg);
  h.num_layers = L_;
  h.num_kv_heads = Hk_;
  std::memcpy(blob.data(), &h, sizeof h);
  size_t off = sizeof h;
  for (const SeqLayer& sl : s->layers) {
    const int64_t tiles = CeilDiv(sl.len, G);
    BlobLayer bl{sl.len, sl.committed, sl.record_tiles,
                 static_cast<int32_t>(tiles - sl.record_tiles)};
    std::memcpy(blob.data() + off, &bl, sizeof bl);
    off += sizeof bl;
  }
  for (int l = 0; l < L_; ++l) {
    const SeqLayer& sl = s->layers[l];
    const Layer& L = layers_[l];
    const int64_t tiles = CeilDiv(sl.len, G);
    for (int64_t tile = 0; tile < tiles; ++tile) {
      if (!IsRecordTile(sl, tile)) continue;
      for (int h2 = 0; h2 < Hk_; ++h2) {
        const uint8_t* src = static_cast<const uint8_t*>(L.records) +
                             (static_cast<size_t>(sl.table[tile]) * Hk_ + h2) * record_stride_;
        KVARN_RETURN_IF_ERROR(
            ctx_->ops->copy(ctx_, blob.data() + off, src, rb, CopyKind::kDeviceToHost));
        off += rb;
      }
    }
    for (int64_t tile = 0; tile < tiles; ++tile) {
      if (IsRecordTile(sl, tile)) continue;
      for (const void* pool : {L.k_pages, L.v_pages}) {
        const uint8_t* src = static_cast<const uint8_t*>(pool) + sl.table[tile] * page_bytes;
        KVARN_RETURN_IF_ERROR(
            ctx_->ops->copy(ctx_, blob.data() + off, src, page_bytes, CopyKind::kDeviceToHost));
        // Slots past the sequence end hold whatever a rolled-back append left there: zero them,
        // so a blob depends only on the sequence's tokens.
        const int64_t valid = std::min<int64_t>(G, sl.len - tile * G);
        const size_t row_bytes = static_cast<size_t>(cfg_.D) * 2;
        for (int h2 = 0; h2 < Hk_; ++h2) {
          uint8_t* head = blob.data() + off + static_cast<size_t>(h2) * G * row_bytes;
          std::memset(head + valid * row_bytes, 0, (G - valid) * row_bytes);
        }
        off += page_bytes;
      }
    }
  }
  const uint32_t crc = Crc32c(blob.data(), off);
  std::memcpy(blob.data() + off, &crc, sizeof crc);
  std::memcpy(buffer, blob.data(), total);
  return Status::Ok();
}

Status ManagedCache::Import(int64_t id, const void* blob_ptr, size_t n) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (blob_ptr == nullptr) return InvalidArgument("blob is NULL");
  if (Find(id)) return {KVARN_ERR_ALREADY_EXISTS, SeqName(id) + " already exists"};
  if (static_cast<int>(seqs_.size()) >= max_sequences_) {
    return {KVARN_ERR_CAPACITY, "max_sequences (" + std::to_string(max_sequences_) + ") reached"};
  }
  const uint8_t* blob = static_cast<const uint8_t*>(blob_ptr);
  auto corrupt = [](const std::string& why) { return Status(KVARN_ERR_CORRUPT_DATA, why); };
  BlobHeader h;
  if (n < sizeof h + sizeof(uint32_t)) return corrupt("blob too short for a header");
  std::memcpy(&h, blob, sizeof h);
  if (std::memcmp(h.magic, kMagic, 8) != 0) return corrupt("not a libkvarn sequence blob");
  if (h.version != kBlobVersion) {
    return corrupt("blob format version " + std::to_string(h.version) + ", expected " +
                   std::to_string(kBlobVersion));
  }
  if (h.total_bytes != n) {
    return corrupt("blob is " + std::to_string(n) + " bytes, its header says " +
                   std::to_string(h.total_bytes) + " (truncated?)");
  }
  uint32_t crc;
  std::memcpy(&crc, blob + n - sizeof crc, sizeof crc);
  if (Crc32c(blob, n - sizeof crc) != crc) return corrupt("checksum mismatch");
  int32_t want[8];
  ConfigWords(public_cfg_, want);
  if (std::memcmp(want, h.cfg, sizeof want) != 0 || h.num_layers != L_ || h.num_kv_heads != Hk_) {
    return corrupt("blob was made by a cache with another config, layer or head count");
  }
  if (h.header_bytes != sizeof h + L_ * sizeof(BlobLayer)) return corrupt("bad header size");
  // The layer table lies inside the blob (a blob may be shorter than its own header claims).
  if (n < static_cast<size_t>(h.header_bytes) + sizeof crc) {
    return corrupt("blob too short for its layer table");
  }
  const int G = cfg_.G;
  const size_t rb = cfg_.record_bytes();
  const size_t page_bytes = PageElems() * 2;
  std::vector<BlobLayer> bl(L_);
  size_t expect = h.header_bytes + sizeof crc;
  for (int l = 0; l < L_; ++l) {
    std::memcpy(&bl[l], blob + sizeof h + l * sizeof(BlobLayer), sizeof(BlobLayer));
    const BlobLayer& b = bl[l];
    const int64_t tiles = b.len >= 0 ? CeilDiv(b.len, G) : -1;
    const int64_t rt_expected = std::max<int64_t>(0, b.committed / G - cfg_.sink_tiles);
    if (b.len < 0 || b.len > INT32_MAX || b.committed < 0 || b.committed > b.len ||
        b.record_tiles != rt_expected || b.page_tiles != tiles - b.record_tiles) {
      return corrupt("inconsistent lengths in layer " + std::to_string(l));
    }
    // In size_t with overflow checks: the counts come from the blob.
    size_t rec_bytes = 0, pg_bytes = 0;
    if (!CheckedMul(&rec_bytes, b.record_tiles, Hk_, rb) ||
        !CheckedMul(&pg_bytes, b.page_tiles, 2, page_bytes) || !CheckedAdd(&expect, rec_bytes) ||
        !CheckedAdd(&expect, pg_bytes)) {
      return corrupt("layer " + std::to_string(l) + " claims more bytes than a blob can hold");
    }
  }
  if (expect != n) return corrupt("blob size does not match its layer table");
  // Append's value rules: what append refuses, import refuses too. fp16 values of the tokens
  // must be finite, slots past a sequence's end zero (as Export writes them), and the scale and
  // zero fields of records finite.
  {
    size_t off = h.header_bytes;
    const size_t row_bytes = static_cast<size_t>(cfg_.D) * 2;
    auto finite_halves = [&](const uint8_t* p, size_t bytes) {
      for (size_t i = 0; i + 1 < bytes; i += 2) {
        uint16_t x;
        std::memcpy(&x, p + i, 2);
        if ((x & 0x7c00u) == 0x7c00u) return false;
      }
      return true;
    };
    for (int l = 0; l < L_; ++l) {
      const BlobLayer& b = bl[l];
      for (int64_t r = 0; r < static_cast<int64_t>(b.record_tiles) * Hk_; ++r, off += rb) {
        for (int f = KVARN_FIELD_K_SCALE; f < KVARN_FIELD_COUNT; ++f) {
          if (f == KVARN_FIELD_V_CODES) continue;
          if (!finite_halves(blob + off + cfg_.layout.offset[f], cfg_.layout.bytes[f])) {
            return corrupt("layer " + std::to_string(l) + ", record " + std::to_string(r) +
                           ": a scale or zero is not finite");
          }
        }
      }
      const int64_t tiles = CeilDiv(b.len, G);
      for (int64_t tile = 0; tile < tiles; ++tile) {
        if (tile >= cfg_.sink_tiles && tile < cfg_.sink_tiles + b.record_tiles) continue;
        const int64_t valid = std::min<int64_t>(G, b.len - tile * G);
        for (int which = 0; which < 2; ++which, off += page_bytes) {
          for (int h2 = 0; h2 < Hk_; ++h2) {
            const uint8_t* head = blob + off + static_cast<size_t>(h2) * G * row_bytes;
            if (!finite_halves(head, valid * row_bytes)) {
              return corrupt("layer " + std::to_string(l) + ", tile " + std::to_string(tile) +
                             ": a NaN or Inf token value");
            }
            const uint8_t* rest = head + valid * row_bytes;
            const size_t rest_bytes = (G - valid) * row_bytes;
            if (rest_bytes > 0 && (rest[0] != 0 || std::memcmp(rest, rest + 1, rest_bytes - 1))) {
              return corrupt("layer " + std::to_string(l) + ", tile " + std::to_string(tile) +
                             ": non-zero bytes past the sequence end");
            }
          }
        }
      }
    }
  }
  // The blob is consistent; running out of records or pages rolls every layer back.
  // The map node first: once the pools have changed, nothing may fail.
  const auto node = seqs_.emplace(id, Sequence{}).first;
  size_t off = h.header_bytes;
  Status st;
  try {
    node->second.layers.resize(L_);
  } catch (const std::bad_alloc&) {
    seqs_.erase(node);
    return OutOfMemory();
  }
  st = AllLayersOrNone(node->second.layers, [&](Txn& t, SeqLayer& sl) -> Status {
    Layer& L = layers_[t.layer];
    sl.len = bl[t.layer].len;
    sl.committed = bl[t.layer].committed;
    sl.record_tiles = bl[t.layer].record_tiles;
    const int64_t tiles = CeilDiv(sl.len, G);
    sl.table.resize(tiles);
    // Records, then fp16 tiles, each in tile order: the order Export writes them.
    for (int64_t tile = 0; tile < tiles; ++tile) {
      if (!IsRecordTile(sl, tile)) continue;
      KVARN_RETURN_IF_ERROR(AllocBlock(t, &sl.table[tile]));
      for (int h2 = 0; h2 < Hk_; ++h2) {
        uint8_t* dst = static_cast<uint8_t*>(L.records) +
                       (static_cast<size_t>(sl.table[tile]) * Hk_ + h2) * record_stride_;
        KVARN_RETURN_IF_ERROR(ctx_->ops->copy(ctx_, dst, blob + off, rb, CopyKind::kHostToDevice));
        off += rb;
      }
    }
    for (int64_t tile = 0; tile < tiles; ++tile) {
      if (IsRecordTile(sl, tile)) continue;
      KVARN_RETURN_IF_ERROR(AllocPage(t, &sl.table[tile]));
      for (void* pool : {L.k_pages, L.v_pages}) {
        KVARN_RETURN_IF_ERROR(
            ctx_->ops->copy(ctx_, static_cast<uint8_t*>(pool) + sl.table[tile] * page_bytes,
                            blob + off, page_bytes, CopyKind::kHostToDevice));
        off += page_bytes;
      }
    }
    return Status::Ok();
  });
  if (!st.ok()) seqs_.erase(node);
  return st;
}

}  // namespace kvarn
