// torch custom ops in C++ over libkvarn's capturable layer 2: torch.ops.kvarn_cpp.paged_append,
// paged_flush and paged_attention, and for the one-pool memory model (kvarn_experimental.h)
// paged_append_flush_tail and paged_attention_tail, with the schemas and semantics of the Python
// ops in kvarn/torch_ops.py (torch.ops.kvarn.*) but no Python in the call path.
//
// Built on first use by kvarn/torch_ops_cpp.py (torch.utils.cpp_extension.load) and linked to
// the libkvarn.so the kvarn package has loaded. A plan is named by an int64 handle (the one
// kvarn.torch_handle gives); torch_ops_cpp.py registers what the calls need (context, plan,
// config, workspace, shape) under it with _register_plan and drops it with _forget_plan before
// the plan or its context is destroyed. The run calls never synchronize or allocate, so the ops
// can be captured in a CUDA graph; on CUDA tensors they run on torch's current stream.
#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#ifdef KVARN_TORCH_OPS_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <kvarn/kvarn.h>
#include <kvarn/kvarn_experimental.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

// DLPack device types, as kvarn's Python package names a context's device.
constexpr int64_t kDlCpu = 1;
constexpr int64_t kDlCuda = 2;

enum PlanKind : int64_t { kFlushPlan = 0, kAttentionPlan = 1, kTailFlushPlan = 2 };

// What one registered plan's calls need. Immutable after registration except `alive`.
struct Entry {
  std::shared_ptr<std::mutex> ctx_lock;  // one per context: calls on a context never overlap
  bool alive = true;                     // guarded by *ctx_lock; false once forgotten
  int64_t kind = kFlushPlan;
  kvarn_context_t* ctx = nullptr;
  const kvarn_attention_plan_t* plan = nullptr;  // attention plans only
  kvarn_config_t config{};
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int64_t dl_type = kDlCpu;
  int64_t device_index = 0;
  bool ctx_has_stream = false;
  int64_t num_kv_heads = 0;
  int64_t batch = 0;  // attention plans
  int64_t num_q_heads = 0;
  int64_t rows = 0;
  bool decode = true;
  at::ScalarType q_dtype = at::kFloat;
  at::ScalarType out_dtype = at::kFloat;
  int64_t max_tiles = 0;   // flush plans
  int64_t max_tokens = 0;  // tail flush plans
};

struct Registry {
  std::mutex mu;
  std::unordered_map<int64_t, std::shared_ptr<Entry>> plans;
  std::unordered_map<kvarn_context_t*, std::weak_ptr<std::mutex>> ctx_locks;
};

Registry& registry() {
  static auto* r = new Registry;  // leaked on purpose: ops may still run during interpreter exit
  return *r;
}

// A plan's entry, locked for one call (its context's lock held until the guard goes).
struct Locked {
  std::shared_ptr<Entry> entry;
  std::unique_lock<std::mutex> lock;
};

Locked acquire(int64_t handle, const char* op) {
  std::shared_ptr<Entry> entry;
  {
    std::lock_guard<std::mutex> g(registry().mu);
    auto it = registry().plans.find(handle);
    if (it != registry().plans.end()) entry = it->second;
  }
  TORCH_CHECK_VALUE(entry, op, ": kvarn handle ", handle,
                    " names no open plan registered with the C++ ops "
                    "(kvarn.torch_ops_cpp.handle registers one)");
  std::unique_lock<std::mutex> lock(*entry->ctx_lock);
  TORCH_CHECK_VALUE(entry->alive, op, ": kvarn handle ", handle, ": the plan is closed");
  return {std::move(entry), std::move(lock)};
}

at::ScalarType scalar_type_of(int64_t kvarn_dtype) {
  switch (kvarn_dtype) {
    case KVARN_DTYPE_F16:
      return at::kHalf;
    case KVARN_DTYPE_BF16:
      return at::kBFloat16;
    default:
      return at::kFloat;
  }
}

kvarn_dtype_t kvarn_dtype_of(at::ScalarType t) {
  return t == at::kHalf ? KVARN_DTYPE_F16 : t == at::kBFloat16 ? KVARN_DTYPE_BF16 : KVARN_DTYPE_F32;
}

[[noreturn]] void fail(const char* op, kvarn_status_t status) {
  const char* detail = kvarn_last_error();
  if (status == KVARN_ERR_INVALID_ARGUMENT) {
    TORCH_CHECK_VALUE(false, op, ": ", kvarn_status_string(status), ": ", detail);
  }
  TORCH_CHECK(false, op, ": ", kvarn_status_string(status), ": ", detail);
}

// Argument checks of one call, with the Python ops' rules (kvarn/_arrays.py): the context's
// device, a dtype of `dtypes`, a shape (-1 = any extent), C-contiguous, or with row_strided rows
// (dim 0) that may be further apart than dense. Returns the row stride in elements (0 = dense).
struct Args {
  const Entry& e;
  const char* op;

  int64_t check(const Tensor& t, const char* name, std::initializer_list<int64_t> shape,
                std::initializer_list<at::ScalarType> dtypes, bool row_strided = false) const {
    const c10::Device dev = t.device();
    const bool on_ctx = e.dl_type == kDlCpu
                            ? dev.is_cpu()
                            : dev.is_cuda() && dev.index() == static_cast<int>(e.device_index);
    TORCH_CHECK_VALUE(on_ctx, op, ": ", name, ": tensor on ", dev, ", the context on ",
                      e.dl_type == kDlCpu ? "cpu" : "a GPU", " device ", e.device_index);
    bool dtype_ok = false;
    for (at::ScalarType d : dtypes) dtype_ok = dtype_ok || t.scalar_type() == d;
    TORCH_CHECK_VALUE(dtype_ok, op, ": ", name, ": dtype ", t.scalar_type(),
                      " is not one the op "
                      "takes here (expected ",
                      *dtypes.begin(), dtypes.size() > 1 ? " or other" : "", ")");
    bool shape_ok = t.dim() == static_cast<int64_t>(shape.size());
    int64_t i = 0;
    for (int64_t want : shape) {
      shape_ok = shape_ok && (want < 0 || t.size(i) == want);
      ++i;
    }
    TORCH_CHECK_VALUE(shape_ok, op, ": ", name, ": shape ", t.sizes(), " does not match (-1: any) ",
                      c10::IntArrayRef(shape));
    if (t.is_contiguous()) return 0;
    if (row_strided && t.dim() >= 2) {
      int64_t row = 1, expected = 1;
      bool inner = true;
      for (int64_t d = t.dim() - 1; d >= 1; --d) {
        inner = inner && (t.size(d) == 1 || t.stride(d) == expected);
        expected *= t.size(d);
        row *= t.size(d);
      }
      if (inner && t.stride(0) >= row) return t.stride(0);
      TORCH_CHECK_VALUE(false, op, ": ", name,
                        ": tensor rows are not C-contiguous and "
                        "non-overlapping (strides ",
                        t.strides(), "); call .contiguous() first");
    }
    TORCH_CHECK_VALUE(false, op, ": ", name, ": tensor is not C-contiguous (strides ", t.strides(),
                      "); call .contiguous() first");
  }

  // kvarn_paged_kv_t over the six pool tensors (PagedKV._c's checks).
  kvarn_paged_kv_t kv(const Tensor& records, const Tensor& k_pages, const Tensor& v_pages,
                      const Tensor& block_table, const Tensor& seq_lens,
                      const Tensor& record_tiles) const {
    TORCH_CHECK_VALUE(block_table.dim() == 2, op, ": block_table: shape ", block_table.sizes(),
                      ", expected (batch, max_blocks_per_seq)");
    TORCH_CHECK_VALUE(k_pages.dim() >= 2, op, ": k_pages: shape ", k_pages.sizes(),
                      ", expected (num_pages, Hk, G, D)");
    const int64_t batch = block_table.size(0), hk = k_pages.size(1);
    check(records, "records", {-1, hk, -1}, {at::kByte});
    check(k_pages, "k_pages", {-1, hk, e.config.tile_tokens, e.config.head_dim},
          {at::kHalf, at::kUInt16});
    check(v_pages, "v_pages", {k_pages.size(0), hk, k_pages.size(2), k_pages.size(3)},
          {at::kHalf, at::kUInt16});
    check(block_table, "block_table", {batch, -1}, {at::kInt});
    check(seq_lens, "seq_lens", {batch}, {at::kInt});
    check(record_tiles, "record_tiles", {batch}, {at::kInt});
    kvarn_paged_kv_t kv;
    kvarn_paged_kv_defaults(&kv);
    kv.num_kv_heads = static_cast<int32_t>(hk);
    kv.batch = static_cast<int32_t>(batch);
    kv.records = records.data_ptr();
    kv.record_stride = static_cast<size_t>(records.size(2));
    kv.num_record_blocks = static_cast<int32_t>(records.size(0));
    kv.k_pages = k_pages.data_ptr();
    kv.v_pages = v_pages.data_ptr();
    kv.num_pages = static_cast<int32_t>(k_pages.size(0));
    kv.block_table = block_table.data_ptr<int32_t>();
    kv.max_blocks_per_seq = static_cast<int32_t>(block_table.size(1));
    kv.seq_lens = seq_lens.data_ptr<int32_t>();
    kv.record_tiles = record_tiles.data_ptr<int32_t>();
    return kv;
  }

  // kvarn_tail_state_t over a layer's slots: `states` (any dtype, contiguous) cut into slots of
  // kvarn_tail_state_bytes (TailState.over's rule).
  kvarn_tail_state_t tail(const Tensor& states, const Tensor& tail_slots, int64_t max_step_tokens,
                          int64_t row_bits, int64_t batch, int64_t hk) const {
    check(tail_slots, "tail_slots", {batch}, {at::kInt});
    size_t slot_bytes = 0;
    const kvarn_status_t s = kvarn_tail_state_bytes(&e.config, static_cast<int32_t>(hk),
                                                    static_cast<int32_t>(max_step_tokens),
                                                    static_cast<int32_t>(row_bits), &slot_bytes);
    if (s != KVARN_OK) fail(op, s);
    TORCH_CHECK_VALUE(states.is_contiguous(), op, ": states: tensor is not C-contiguous");
    const c10::Device dev = states.device();
    TORCH_CHECK_VALUE(
        e.dl_type == kDlCpu ? dev.is_cpu() : dev.is_cuda() && dev.index() == e.device_index, op,
        ": states: tensor on ", dev, ", not on the context's device");
    const size_t nbytes = static_cast<size_t>(states.nbytes());
    TORCH_CHECK_VALUE(nbytes >= slot_bytes, op, ": states: ", nbytes,
                      " bytes, less than one slot (", slot_bytes, ")");
    kvarn_tail_state_t t;
    kvarn_tail_state_defaults(&t);
    t.states = states.data_ptr();
    t.slot_bytes = slot_bytes;
    t.max_step_tokens = static_cast<int32_t>(max_step_tokens);
    t.num_slots = static_cast<int32_t>(nbytes / slot_bytes);
    t.slots = tail_slots.data_ptr<int32_t>();
    t.row_bits = static_cast<int32_t>(row_bits);
    return t;
  }

  int32_t* status(const OptTensor& seq_status, int64_t batch) const {
    if (!seq_status.has_value()) return nullptr;
    check(*seq_status, "seq_status", {batch}, {at::kInt});
    return seq_status->data_ptr<int32_t>();
  }

  // The launch's stream: torch's current stream of the tensors' device on a GPU context (the
  // Python ops' rule; torch's default stream is cudaStreamLegacy when the context has a stream
  // of its own, as NULL would name that one), none on the CPU.
  void* stream(const Tensor& t) const {
    if (e.dl_type == kDlCpu) return nullptr;
#ifdef KVARN_TORCH_OPS_CUDA
    void* s = c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
#else
    void* s =
        c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(t.device()).native_handle();
#endif
    if (s == nullptr && e.ctx_has_stream && e.dl_type == kDlCuda) {
      s = reinterpret_cast<void*>(uintptr_t{1});  // cudaStreamLegacy
    }
    return s;
  }

  kvarn_launch_t launch(void* stream, int32_t* seq_status) const {
    kvarn_launch_t l;
    kvarn_launch_defaults(&l);
    l.stream = stream;
    l.seq_status = seq_status;
    return l;
  }
};

kvarn_index_type_t index_type(const char* op, std::initializer_list<const Tensor*> lists) {
  std::optional<at::ScalarType> seen;
  for (const Tensor* t : lists) {
    if (t == nullptr) continue;
    TORCH_CHECK_VALUE(!seen || *seen == t->scalar_type(), op,
                      ": the slot / flush lists must all be int32 or all int64");
    seen = t->scalar_type();
  }
  return seen == at::kLong ? KVARN_INDEX_INT64 : KVARN_INDEX_INT32;
}

void paged_append(int64_t handle, const Tensor& records, const Tensor& k_pages,
                  const Tensor& v_pages, const Tensor& block_table, const Tensor& seq_lens,
                  const Tensor& record_tiles, const Tensor& token_indptr,
                  const Tensor& slot_mapping, const Tensor& k, const Tensor& v,
                  const OptTensor& seq_status) {
  constexpr const char* op = "kvarn_cpp::paged_append";
  Locked held = acquire(handle, op);
  const Entry& e = *held.entry;
  const Args a{e, op};
  const kvarn_paged_kv_t kv = a.kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles);
  TORCH_CHECK_VALUE(k.dim() == 3, op, ": k: shape ", k.sizes(),
                    ", expected (max_tokens, num_kv_heads, head_dim)");
  const int64_t max_tokens = k.size(0);
  const auto floats = {at::kFloat, at::kHalf, at::kBFloat16};
  const int64_t k_stride =
      a.check(k, "k", {max_tokens, kv.num_kv_heads, e.config.head_dim}, floats, true);
  const int64_t v_stride =
      a.check(v, "v", {max_tokens, kv.num_kv_heads, e.config.head_dim}, {k.scalar_type()}, true);
  a.check(token_indptr, "token_indptr", {kv.batch + 1}, {at::kInt});
  a.check(slot_mapping, "slot_mapping", {max_tokens}, {at::kInt, at::kLong});
  kvarn_launch_t launch = a.launch(a.stream(k), a.status(seq_status, kv.batch));
  launch.k_row_stride = k_stride;
  launch.v_row_stride = v_stride;
  launch.index_type = index_type(op, {&slot_mapping});
  const kvarn_status_t s = kvarn_paged_append_run(
      e.ctx, &e.config, &kv, &launch, token_indptr.data_ptr<int32_t>(),
      static_cast<const int32_t*>(slot_mapping.data_ptr()), static_cast<size_t>(max_tokens),
      kvarn_dtype_of(k.scalar_type()), k.data_ptr(), v.data_ptr());
  if (s != KVARN_OK) fail(op, s);
}

void paged_flush(int64_t handle, const Tensor& records, const Tensor& k_pages,
                 const Tensor& v_pages, const Tensor& block_table, const Tensor& seq_lens,
                 const Tensor& record_tiles, const Tensor& n_tiles, const Tensor& src_pages,
                 const Tensor& dst_blocks, const OptTensor& tile_seqs,
                 const OptTensor& seq_status) {
  constexpr const char* op = "kvarn_cpp::paged_flush";
  Locked held = acquire(handle, op);
  const Entry& e = *held.entry;
  TORCH_CHECK_TYPE(e.kind == kFlushPlan, op, ": handle ", handle, " is not a kvarn.FlushPlan");
  const Args a{e, op};
  const kvarn_paged_kv_t kv = a.kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles);
  TORCH_CHECK_VALUE(kv.num_kv_heads == e.num_kv_heads, op, ": kv: ", kv.num_kv_heads,
                    " KV heads, the FlushPlan was made for ", e.num_kv_heads);
  const int64_t m = e.max_tiles;
  a.check(n_tiles, "n_tiles", {1}, {at::kInt});
  a.check(src_pages, "src_pages", {m}, {at::kInt, at::kLong});
  a.check(dst_blocks, "dst_blocks", {m}, {at::kInt, at::kLong});
  const Tensor* seqs = tile_seqs.has_value() ? &*tile_seqs : nullptr;
  if (seqs != nullptr) a.check(*seqs, "tile_seqs", {m}, {at::kInt, at::kLong});
  TORCH_CHECK_VALUE(!seq_status.has_value() || seqs != nullptr, op,
                    ": tile_seqs: required with seq_status");
  const kvarn_index_type_t itype = index_type(op, {&src_pages, &dst_blocks, seqs});
  kvarn_launch_t launch = a.launch(a.stream(src_pages), a.status(seq_status, kv.batch));
  launch.workspace = e.workspace;
  launch.workspace_bytes = e.workspace_bytes;
  launch.index_type = itype;
  const kvarn_status_t s = kvarn_paged_flush_run(
      e.ctx, &e.config, &kv, &launch, static_cast<size_t>(m), n_tiles.data_ptr<int32_t>(),
      static_cast<const int32_t*>(src_pages.data_ptr()),
      static_cast<const int32_t*>(dst_blocks.data_ptr()),
      seqs != nullptr ? static_cast<const int32_t*>(seqs->data_ptr()) : nullptr);
  if (s != KVARN_OK) fail(op, s);
}

// paged_attention, or paged_attention_tail where states is given.
void attention(const char* op, int64_t handle, const Tensor& records, const Tensor& k_pages,
               const Tensor& v_pages, const Tensor& block_table, const Tensor& seq_lens,
               const Tensor& record_tiles, const Tensor* states, const Tensor* tail_slots,
               int64_t max_step_tokens, int64_t row_bits, const Tensor& q, const Tensor& out,
               const OptTensor& lse, const OptTensor& q_indptr, const OptTensor& seq_status) {
  Locked held = acquire(handle, op);
  const Entry& e = *held.entry;
  TORCH_CHECK_TYPE(e.kind == kAttentionPlan, op, ": handle ", handle,
                   " is not a kvarn.AttentionPlan");
  const Args a{e, op};
  const kvarn_paged_kv_t kv = a.kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles);
  const int64_t rows = e.rows, hq = e.num_q_heads, d = e.config.head_dim;
  // Half-width data may come as raw uint16 (the Python ops accept it too).
  const bool q_wide = e.q_dtype == at::kFloat, out_wide = e.out_dtype == at::kFloat;
  const int64_t q_stride = q_wide ? a.check(q, "q", {rows, hq, d}, {e.q_dtype}, true)
                                  : a.check(q, "q", {rows, hq, d}, {e.q_dtype, at::kUInt16}, true);
  const int64_t out_stride =
      out_wide ? a.check(out, "out", {rows, hq, d}, {e.out_dtype}, true)
               : a.check(out, "out", {rows, hq, d}, {e.out_dtype, at::kUInt16}, true);
  float* lse_ptr = nullptr;
  if (lse.has_value()) {
    a.check(*lse, "lse", {rows, hq}, {at::kFloat});
    lse_ptr = lse->data_ptr<float>();
  }
  const int32_t* indptr = nullptr;
  if (e.decode) {
    TORCH_CHECK_VALUE(!q_indptr.has_value(), op, ": q_indptr: a decode plan takes none");
  } else {
    TORCH_CHECK_VALUE(q_indptr.has_value(), op, ": q_indptr: an extend plan needs int32 [batch+1]");
    a.check(*q_indptr, "q_indptr", {e.batch + 1}, {at::kInt});
    indptr = q_indptr->data_ptr<int32_t>();
  }
  kvarn_launch_t launch = a.launch(a.stream(q), a.status(seq_status, e.batch));
  launch.workspace = e.workspace;
  launch.workspace_bytes = e.workspace_bytes;
  launch.q_row_stride = q_stride;
  launch.out_row_stride = out_stride;
  kvarn_status_t s;
  if (states != nullptr) {
    const kvarn_tail_state_t tail =
        a.tail(*states, *tail_slots, max_step_tokens, row_bits, kv.batch, kv.num_kv_heads);
    s = kvarn_paged_attention_tail_run(e.ctx, e.plan, &kv, &tail, &launch, indptr, q.data_ptr(),
                                       out.data_ptr(), lse_ptr);
  } else {
    s = kvarn_paged_attention_run(e.ctx, e.plan, &kv, &launch, indptr, q.data_ptr(), out.data_ptr(),
                                  lse_ptr);
  }
  if (s != KVARN_OK) fail(op, s);
}

void paged_attention(int64_t handle, const Tensor& records, const Tensor& k_pages,
                     const Tensor& v_pages, const Tensor& block_table, const Tensor& seq_lens,
                     const Tensor& record_tiles, const Tensor& q, const Tensor& out,
                     const OptTensor& lse, const OptTensor& q_indptr, const OptTensor& seq_status) {
  attention("kvarn_cpp::paged_attention", handle, records, k_pages, v_pages, block_table, seq_lens,
            record_tiles, nullptr, nullptr, 0, 0, q, out, lse, q_indptr, seq_status);
}

void paged_append_flush_tail(int64_t handle, const Tensor& records, const Tensor& k_pages,
                             const Tensor& v_pages, const Tensor& block_table,
                             const Tensor& seq_lens, const Tensor& record_tiles,
                             const Tensor& states, const Tensor& tail_slots,
                             int64_t max_step_tokens, int64_t row_bits, const Tensor& token_indptr,
                             const Tensor& k, const Tensor& v, const Tensor& committed,
                             const OptTensor& seq_status) {
  constexpr const char* op = "kvarn_cpp::paged_append_flush_tail";
  Locked held = acquire(handle, op);
  const Entry& e = *held.entry;
  TORCH_CHECK_TYPE(e.kind == kTailFlushPlan, op, ": handle ", handle,
                   " is not a kvarn.TailFlushPlan");
  const Args a{e, op};
  const kvarn_paged_kv_t kv = a.kv(records, k_pages, v_pages, block_table, seq_lens, record_tiles);
  TORCH_CHECK_VALUE(kv.num_kv_heads == e.num_kv_heads && kv.batch == e.batch, op, ": kv: batch ",
                    kv.batch, ", ", kv.num_kv_heads, " KV heads; the TailFlushPlan was made for ",
                    e.batch, ", ", e.num_kv_heads);
  const kvarn_tail_state_t tail =
      a.tail(states, tail_slots, max_step_tokens, row_bits, kv.batch, kv.num_kv_heads);
  TORCH_CHECK_VALUE(k.dim() == 3, op, ": k: shape ", k.sizes(),
                    ", expected (max_tokens, num_kv_heads, head_dim)");
  const int64_t max_tokens = k.size(0);
  TORCH_CHECK_VALUE(max_tokens <= e.max_tokens, op, ": k: ", max_tokens,
                    " tokens, more than the TailFlushPlan's max_tokens ", e.max_tokens);
  const auto floats = {at::kFloat, at::kHalf, at::kBFloat16};
  const int64_t k_stride =
      a.check(k, "k", {max_tokens, kv.num_kv_heads, e.config.head_dim}, floats, true);
  const int64_t v_stride =
      a.check(v, "v", {max_tokens, kv.num_kv_heads, e.config.head_dim}, {k.scalar_type()}, true);
  a.check(token_indptr, "token_indptr", {kv.batch + 1}, {at::kInt});
  a.check(committed, "committed", {kv.batch}, {at::kInt});
  kvarn_launch_t launch = a.launch(a.stream(k), a.status(seq_status, kv.batch));
  launch.workspace = e.workspace;
  launch.workspace_bytes = e.workspace_bytes;
  launch.k_row_stride = k_stride;
  launch.v_row_stride = v_stride;
  const kvarn_status_t s = kvarn_paged_append_flush_tail_run(
      e.ctx, &e.config, &kv, &tail, &launch, token_indptr.data_ptr<int32_t>(),
      static_cast<size_t>(max_tokens), kvarn_dtype_of(k.scalar_type()), k.data_ptr(), v.data_ptr(),
      committed.data_ptr<int32_t>(), record_tiles.data_ptr<int32_t>());
  if (s != KVARN_OK) fail(op, s);
}

void paged_attention_tail(int64_t handle, const Tensor& records, const Tensor& k_pages,
                          const Tensor& v_pages, const Tensor& block_table, const Tensor& seq_lens,
                          const Tensor& record_tiles, const Tensor& states,
                          const Tensor& tail_slots, int64_t max_step_tokens, int64_t row_bits,
                          const Tensor& q, const Tensor& out, const OptTensor& lse,
                          const OptTensor& q_indptr, const OptTensor& seq_status) {
  attention("kvarn_cpp::paged_attention_tail", handle, records, k_pages, v_pages, block_table,
            seq_lens, record_tiles, &states, &tail_slots, max_step_tokens, row_bits, q, out, lse,
            q_indptr, seq_status);
}

// Fake (meta) kernels: the ops return nothing and only write their mutable arguments, so
// tracing needs no shapes from them.
void paged_append_meta(int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       const Tensor&, const OptTensor&) {}
void paged_flush_meta(int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const OptTensor&, const OptTensor&) {}
void paged_attention_meta(int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const OptTensor&, const OptTensor&, const OptTensor&) {}
void paged_append_flush_tail_meta(int64_t, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, int64_t, int64_t, const Tensor&, const Tensor&,
                                  const Tensor&, const Tensor&, const OptTensor&) {}
void paged_attention_tail_meta(int64_t, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                               int64_t, const Tensor&, const Tensor&, const OptTensor&,
                               const OptTensor&, const OptTensor&) {}

// config: the 8 kvarn_config_t fields in order; device: (DLPack type, index, context has a
// stream); shape: (num_kv_heads, batch, num_q_heads, rows, decode, q_dtype, out_dtype,
// max_tiles, or a tail flush plan's max_tokens), dtypes as kvarn_dtype_t.
void register_plan(int64_t handle, int64_t kind, int64_t context, int64_t plan,
                   std::vector<int64_t> config, int64_t workspace, int64_t workspace_bytes,
                   std::vector<int64_t> device, std::vector<int64_t> shape) {
  TORCH_CHECK_VALUE(config.size() == 8 && device.size() == 3 && shape.size() == 8,
                    "kvarn_cpp::_register_plan: config[8], device[3], shape[8]");
  TORCH_CHECK_VALUE(
      kind == kFlushPlan || kind == kTailFlushPlan || (kind == kAttentionPlan && plan != 0),
      "kvarn_cpp::_register_plan: bad kind or plan");
  TORCH_CHECK_VALUE(context != 0, "kvarn_cpp::_register_plan: no context");
  auto e = std::make_shared<Entry>();
  e->kind = kind;
  e->ctx = reinterpret_cast<kvarn_context_t*>(static_cast<uintptr_t>(context));
  e->plan = reinterpret_cast<const kvarn_attention_plan_t*>(static_cast<uintptr_t>(plan));
  kvarn_config_defaults(&e->config);
  e->config.head_dim = static_cast<int32_t>(config[0]);
  e->config.tile_tokens = static_cast<int32_t>(config[1]);
  e->config.key_bits = static_cast<int32_t>(config[2]);
  e->config.value_bits = static_cast<int32_t>(config[3]);
  e->config.iterations = static_cast<int32_t>(config[4]);
  e->config.sink_tiles = static_cast<int32_t>(config[5]);
  e->config.key_flags = static_cast<uint32_t>(config[6]);
  e->config.value_flags = static_cast<uint32_t>(config[7]);
  e->workspace = reinterpret_cast<void*>(static_cast<uintptr_t>(workspace));
  e->workspace_bytes = static_cast<size_t>(workspace_bytes);
  e->dl_type = device[0];
  e->device_index = device[1];
  e->ctx_has_stream = device[2] != 0;
  e->num_kv_heads = shape[0];
  e->batch = shape[1];
  e->num_q_heads = shape[2];
  e->rows = shape[3];
  e->decode = shape[4] != 0;
  e->q_dtype = scalar_type_of(shape[5]);
  e->out_dtype = scalar_type_of(shape[6]);
  (kind == kTailFlushPlan ? e->max_tokens : e->max_tiles) = shape[7];
  Registry& r = registry();
  std::lock_guard<std::mutex> g(r.mu);
  // Slots of contexts whose plans are all gone are dropped (a new context may reuse an address).
  for (auto c = r.ctx_locks.begin(); c != r.ctx_locks.end();) {
    c = c->second.expired() ? r.ctx_locks.erase(c) : std::next(c);
  }
  std::shared_ptr<std::mutex> lock = r.ctx_locks[e->ctx].lock();
  if (!lock) {
    lock = std::make_shared<std::mutex>();
    r.ctx_locks[e->ctx] = lock;
  }
  e->ctx_lock = std::move(lock);
  r.plans[handle] = std::move(e);
}

// Drops a handle, waiting for a call that is running under it; a no-op for unknown handles.
void forget_plan(int64_t handle) {
  std::shared_ptr<Entry> e;
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> g(r.mu);
    auto it = r.plans.find(handle);
    if (it == r.plans.end()) return;
    e = std::move(it->second);
    r.plans.erase(it);
  }
  std::lock_guard<std::mutex> g(*e->ctx_lock);
  e->alive = false;
}

int64_t registered_plans() {
  std::lock_guard<std::mutex> g(registry().mu);
  return static_cast<int64_t>(registry().plans.size());
}

}  // namespace

TORCH_LIBRARY(kvarn_cpp, m) {
  m.def(
      "paged_append(int handle, Tensor records, Tensor(a!) k_pages, Tensor(b!) v_pages, "
      "Tensor block_table, Tensor seq_lens, Tensor record_tiles, Tensor token_indptr, "
      "Tensor slot_mapping, Tensor k, Tensor v, Tensor(c!)? seq_status) -> ()");
  m.def(
      "paged_flush(int handle, Tensor(a!) records, Tensor k_pages, Tensor v_pages, "
      "Tensor block_table, Tensor seq_lens, Tensor record_tiles, Tensor n_tiles, "
      "Tensor src_pages, Tensor dst_blocks, Tensor? tile_seqs, Tensor(b!)? seq_status) -> ()");
  m.def(
      "paged_attention(int handle, Tensor records, Tensor k_pages, Tensor v_pages, "
      "Tensor block_table, Tensor seq_lens, Tensor record_tiles, Tensor q, Tensor(a!) out, "
      "Tensor(b!)? lse, Tensor? q_indptr, Tensor(c!)? seq_status) -> ()");
  m.def(
      "paged_append_flush_tail(int handle, Tensor(a!) records, Tensor k_pages, Tensor v_pages, "
      "Tensor block_table, Tensor seq_lens, Tensor(b!) record_tiles, Tensor(c!) states, "
      "Tensor tail_slots, int max_step_tokens, int row_bits, Tensor token_indptr, Tensor k, "
      "Tensor v, Tensor committed, Tensor(d!)? seq_status) -> ()");
  m.def(
      "paged_attention_tail(int handle, Tensor records, Tensor k_pages, Tensor v_pages, "
      "Tensor block_table, Tensor seq_lens, Tensor record_tiles, Tensor states, "
      "Tensor tail_slots, int max_step_tokens, int row_bits, Tensor q, Tensor(a!) out, "
      "Tensor(b!)? lse, Tensor? q_indptr, Tensor(c!)? seq_status) -> ()");
  // Plan registry (torch_ops_cpp.py); ops with no tensors, so one kernel for every key.
  m.def(
      "_register_plan(int handle, int kind, int context, int plan, int[] config, int workspace, "
      "int workspace_bytes, int[] device, int[] shape) -> ()",
      &register_plan);
  m.def("_forget_plan(int handle) -> ()", &forget_plan);
  m.def("_registered_plans() -> int", &registered_plans);
}

TORCH_LIBRARY_IMPL(kvarn_cpp, CPU, m) {
  m.impl("paged_append", &paged_append);
  m.impl("paged_flush", &paged_flush);
  m.impl("paged_attention", &paged_attention);
  m.impl("paged_append_flush_tail", &paged_append_flush_tail);
  m.impl("paged_attention_tail", &paged_attention_tail);
}

TORCH_LIBRARY_IMPL(kvarn_cpp, CUDA, m) {
  m.impl("paged_append", &paged_append);
  m.impl("paged_flush", &paged_flush);
  m.impl("paged_attention", &paged_attention);
  m.impl("paged_append_flush_tail", &paged_append_flush_tail);
  m.impl("paged_attention_tail", &paged_attention_tail);
}

TORCH_LIBRARY_IMPL(kvarn_cpp, Meta, m) {
  m.impl("paged_append", &paged_append_meta);
  m.impl("paged_flush", &paged_flush_meta);
  m.impl("paged_attention", &paged_attention_meta);
  m.impl("paged_append_flush_tail", &paged_append_flush_tail_meta);
  m.impl("paged_attention_tail", &paged_attention_tail_meta);
}
