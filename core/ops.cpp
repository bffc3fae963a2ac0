#include "core/ops.h"

#include <cmath>
#include <string>

#include "core/abi_struct.h"
#include "core/checked.h"

namespace kvarn {

Status CheckContext(const Context* ctx) {
  if (ctx == nullptr || ctx->ops == nullptr) return InvalidArgument("context is NULL");
  return Status::Ok();
}

namespace {

Status CheckDtype(const kvarn_dtype_t& dtype, const char* what) {
  return CheckDtypeArg(dtype, what);
}

// What quantize and dequantize both require: a context, a known dtype and flags, and a record
// stride that holds a record.
Status CheckCodecArgs(Context* ctx, const Config& cfg, kvarn_dtype_t dtype, const char* what,
                      uint32_t flags, size_t record_stride) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  KVARN_RETURN_IF_ERROR(CheckDtype(dtype, what));
  if (flags & ~KVARN_CODEC_CACHE_FRAME) return InvalidArgument("unknown flags");
  if (record_stride < cfg.record_bytes()) {
    return InvalidArgument("record_stride " + std::to_string(record_stride) +
                           " is smaller than the record size " +
                           std::to_string(cfg.record_bytes()));
  }
  return Status::Ok();
}

}  // namespace

Status CheckWorkspaceArg(const void* workspace, size_t bytes, size_t need, const char* what,
                         const char* how) {
  if (need > 0 && workspace == nullptr) {
    return {KVARN_ERR_BUFFER_TOO_SMALL, std::string(what) + " is NULL; this call needs " +
                                            std::to_string(need) + " bytes (" + how + ")"};
  }
  if (bytes < need) {
    return {KVARN_ERR_BUFFER_TOO_SMALL, std::string(what) + " holds " + std::to_string(bytes) +
                                            " bytes; this call needs " + std::to_string(need) +
                                            " (" + how + ")"};
  }
  return Status::Ok();
}

Status CheckDtypeArg(const kvarn_dtype_t& dtype, const char* what) {
  const int32_t v = EnumInt(dtype);
  if (v != KVARN_DTYPE_F32 && v != KVARN_DTYPE_F16 && v != KVARN_DTYPE_BF16) {
    return InvalidArgument(std::string(what) + ": unknown dtype value " + std::to_string(v) +
                           ": must be one of KVARN_DTYPE_F32, KVARN_DTYPE_F16, KVARN_DTYPE_BF16");
  }
  return Status::Ok();
}

bool IsValidDtype(kvarn_dtype_t dtype) {
  return dtype == KVARN_DTYPE_F32 || dtype == KVARN_DTYPE_F16 || dtype == KVARN_DTYPE_BF16;
}

size_t DtypeSize(kvarn_dtype_t dtype) {
  switch (dtype) {
    case KVARN_DTYPE_F32:
      return 4;
    case KVARN_DTYPE_F16:
    case KVARN_DTYPE_BF16:
      return 2;
    default:
      return 0;
  }
}

Status OpRotate(Context* ctx, int32_t head_dim, size_t n_rows, kvarn_dtype_t in_dtype,
                const void* in, kvarn_dtype_t out_dtype, void* out) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  KVARN_RETURN_IF_ERROR(CheckHeadDim(head_dim));
  KVARN_RETURN_IF_ERROR(CheckDtype(in_dtype, "in_dtype"));
  KVARN_RETURN_IF_ERROR(CheckDtype(out_dtype, "out_dtype"));
  if (n_rows == 0) return Status::Ok();
  KVARN_RETURN_IF_ERROR(CheckBufferSize("in or out", n_rows, head_dim, 4));
  if (in == nullptr || out == nullptr) return InvalidArgument("in or out is NULL");
  if (in == out && in_dtype != out_dtype) {
    return InvalidArgument("in-place rotation needs equal in and out dtypes");
  }
  return ctx->ops->rotate(ctx, head_dim, n_rows, in_dtype, in, out_dtype, out);
}

Status OpQuantize(Context* ctx, const Config& cfg, size_t n_tiles, kvarn_dtype_t dtype,
                  const void* k, const void* v, uint32_t flags, void* records,
                  size_t record_stride) {
  KVARN_RETURN_IF_ERROR(CheckCodecArgs(ctx, cfg, dtype, "dtype", flags, record_stride));
  if (n_tiles == 0) return Status::Ok();
  KVARN_RETURN_IF_ERROR(CheckBufferSize("k or v", n_tiles, cfg.G, cfg.D, 4));
  KVARN_RETURN_IF_ERROR(CheckBufferSize("records", n_tiles, record_stride));
  if (k == nullptr || v == nullptr || records == nullptr) {
    return InvalidArgument("k, v or records is NULL");
  }
  return ctx->ops->quantize(ctx, cfg, n_tiles, dtype, k, v, flags, records, record_stride);
}

Status OpDequantize(Context* ctx, const Config& cfg, size_t n_tiles, const void* records,
                    size_t record_stride, uint32_t flags, kvarn_dtype_t out_dtype, void* k,
                    void* v) {
  KVARN_RETURN_IF_ERROR(CheckCodecArgs(ctx, cfg, out_dtype, "out_dtype", flags, record_stride));
  if (n_tiles == 0) return Status::Ok();
  KVARN_RETURN_IF_ERROR(CheckBufferSize("k_out or v_out", n_tiles, cfg.G, cfg.D, 4));
  KVARN_RETURN_IF_ERROR(CheckBufferSize("records", n_tiles, record_stride));
  if (records == nullptr) return InvalidArgument("records is NULL");
  if (k == nullptr && v == nullptr) return InvalidArgument("k_out and v_out are both NULL");
  return ctx->ops->dequantize(ctx, cfg, n_tiles, records, record_stride, flags, out_dtype, k, v);
}

Status ParsePagedKV(const kvarn_paged_kv_t* kv_in, const Config& cfg, PagedKV* out,
                    PagedTables tables) {
  // Growable struct (core/abi_struct.h): fields past kv->size keep the defaults.
  kvarn_paged_kv_t kv_read;
  kvarn_paged_kv_defaults(&kv_read);
  KVARN_RETURN_IF_ERROR(ReadStruct(kv_in, "kv", &kv_read));
  const kvarn_paged_kv_t* in = &kv_read;
  if (in->num_kv_heads <= 0) return InvalidArgument("num_kv_heads must be >= 1");
  if (in->batch < 0) return InvalidArgument("batch must be >= 0");
  if (in->num_pages < 0 || in->num_record_blocks < 0 || in->max_blocks_per_seq < 0) {
    return InvalidArgument("negative pool or table size");
  }
  if (in->num_record_blocks > 0) {
    if (in->records == nullptr) return InvalidArgument("records is NULL");
    if (in->record_stride < cfg.record_bytes() || in->record_stride % 2 != 0) {
      return InvalidArgument("record_stride must be even and >= the record size " +
                             std::to_string(cfg.record_bytes()));
    }
  }
  if (in->num_pages > 0 && (in->k_pages == nullptr || in->v_pages == nullptr)) {
    return InvalidArgument("k_pages or v_pages is NULL");
  }
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("the page pool", in->num_pages, in->num_kv_heads, cfg.G, cfg.D, 2));
  KVARN_RETURN_IF_ERROR(CheckBufferSize("the record pool", in->num_record_blocks, in->num_kv_heads,
                                        in->record_stride));
  const bool read_tables = tables == PagedTables::kRead;
  if (read_tables) {
    KVARN_RETURN_IF_ERROR(
        CheckBufferSize("block_table", in->batch, in->max_blocks_per_seq, sizeof(int32_t)));
    if (in->batch > 0 &&
        (in->block_table == nullptr || in->seq_lens == nullptr || in->record_tiles == nullptr)) {
      return InvalidArgument("block_table, seq_lens or record_tiles is NULL");
    }
  }
  PagedKV kv;
  kv.num_kv_heads = in->num_kv_heads;
  kv.batch = in->batch;
  kv.records = static_cast<uint8_t*>(in->records);
  kv.record_stride = in->record_stride;
  kv.num_record_blocks = in->num_record_blocks;
  kv.k_pages = static_cast<uint16_t*>(in->k_pages);
  kv.v_pages = static_cast<uint16_t*>(in->v_pages);
  kv.num_pages = in->num_pages;
  // Calls that do not read the tables do not see them, whatever the struct holds.
  kv.block_table = read_tables ? in->block_table : nullptr;
  kv.max_blocks_per_seq = in->max_blocks_per_seq;
  kv.seq_lens = read_tables ? in->seq_lens : nullptr;
  kv.record_tiles = read_tables ? in->record_tiles : nullptr;
  *out = kv;
  return Status::Ok();
}

Status ParseAttentionParams(const kvarn_attention_params_t* params_in, const Config& cfg,
                            int num_kv_heads, AttentionArgs* out) {
  // Growable struct (core/abi_struct.h): fields past params->size keep the defaults.
  kvarn_attention_params_t params_read;
  kvarn_attention_params_defaults(&params_read);
  KVARN_RETURN_IF_ERROR(ReadStruct(params_in, "params", &params_read));
  const kvarn_attention_params_t* in = &params_read;
  if (in->num_q_heads <= 0 || in->num_q_heads % num_kv_heads != 0) {
    return InvalidArgument("num_q_heads " + std::to_string(in->num_q_heads) +
                           " must be a positive multiple of num_kv_heads " +
                           std::to_string(num_kv_heads));
  }
  if (!std::isfinite(in->scale) || in->scale < 0.f) {
    return InvalidArgument("scale must be finite and >= 0 (0 = 1/sqrt(head_dim))");
  }
  // Through references: the fields are read as integers before they are used as enums.
  KVARN_RETURN_IF_ERROR(CheckDtypeArg(in->q_dtype, "q_dtype"));
  KVARN_RETURN_IF_ERROR(CheckDtypeArg(in->out_dtype, "out_dtype"));
  if (in->num_splits < 0) return InvalidArgument("num_splits must be >= 0");
  if (in->sliding_window < 0) {
    return InvalidArgument("sliding_window " + std::to_string(in->sliding_window) +
                           " must be >= 0 (0 = full attention; W = the W most recent keys)");
  }
  if (!std::isfinite(in->logit_softcap) || in->logit_softcap < 0.f) {
    return InvalidArgument("logit_softcap must be finite and >= 0 (0 = off)");
  }
  const int32_t mode = EnumInt(in->mode);
  if (mode != KVARN_ATTENTION_CAUSAL && mode != KVARN_ATTENTION_PREFIX) {
    return InvalidArgument("mode: unknown value " + std::to_string(mode) +
                           ": must be KVARN_ATTENTION_CAUSAL or KVARN_ATTENTION_PREFIX");
  }
  AttentionArgs a;
  a.num_q_heads = in->num_q_heads;
  a.scale = in->scale > 0.f ? in->scale : 1.0f / std::sqrt(static_cast<float>(cfg.D));
  a.q_indptr = in->q_indptr;
  a.q_dtype = in->q_dtype;
  a.out_dtype = in->out_dtype;
  a.num_splits = in->num_splits;
  a.sinks = in->sinks;
  a.sliding_window = in->sliding_window;
  a.logit_softcap = in->logit_softcap;
  a.prefix = mode == KVARN_ATTENTION_PREFIX;
  a.q_row_stride = a.out_row_stride = static_cast<int64_t>(a.num_q_heads) * cfg.D;
  *out = a;
  return Status::Ok();
}

Status OpPagedAppend(Context* ctx, const Config& cfg, const PagedKV& kv,
                     const int32_t* token_indptr, kvarn_dtype_t dtype, const void* k,
                     const void* v) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  KVARN_RETURN_IF_ERROR(CheckDtype(dtype, "dtype"));
  if (kv.batch == 0) return Status::Ok();
  if (token_indptr == nullptr) return InvalidArgument("token_indptr is NULL");
  if (token_indptr[kv.batch] > 0 && (k == nullptr || v == nullptr)) {
    return InvalidArgument("k or v is NULL");
  }
  if (token_indptr[kv.batch] > 0 && kv.num_pages == 0) return InvalidArgument("no pages");
  if (token_indptr[kv.batch] < 0) return InvalidArgument("token_indptr[batch] is negative");
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("k or v", token_indptr[kv.batch], kv.num_kv_heads, cfg.D, 4));
  return ctx->ops->paged_append(ctx, cfg, kv, token_indptr, dtype, k, v);
}

Status OpPagedFlush(Context* ctx, const Config& cfg, const PagedKV& kv, size_t n_tiles,
                    const int32_t* src_pages, const int32_t* dst_blocks) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (n_tiles == 0) return Status::Ok();
  if (src_pages == nullptr || dst_blocks == nullptr) {
    return InvalidArgument("src_pages or dst_blocks is NULL");
  }
  if (kv.num_pages == 0 || kv.num_record_blocks == 0) {
    return InvalidArgument("flush needs both a page pool and a record pool");
  }
  KVARN_RETURN_IF_ERROR(CheckBufferSize("src_pages or dst_blocks", n_tiles, sizeof(int32_t)));
  KVARN_RETURN_IF_ERROR(
      CheckBufferSize("the flushed records", n_tiles, kv.num_kv_heads, cfg.record_bytes()));
  // The id lists are host memory on every backend: checked here, once.
  for (size_t i = 0; i < n_tiles; ++i) {
    if (src_pages[i] < 0 || src_pages[i] >= kv.num_pages) {
      return InvalidArgument("src_pages[" + std::to_string(i) +
                             "] = " + std::to_string(src_pages[i]) + " is outside the page pool");
    }
    if (dst_blocks[i] < 0 || dst_blocks[i] >= kv.num_record_blocks) {
      return InvalidArgument("dst_blocks[" + std::to_string(i) + "] = " +
                             std::to_string(dst_blocks[i]) + " is outside the record pool");
    }
  }
  return ctx->ops->paged_flush(ctx, cfg, kv, n_tiles, src_pages, dst_blocks);
}

Status OpAttentionWorkspace(Context* ctx, const Config& cfg, const PagedKV& kv,
                            const AttentionArgs& args, size_t total_q, size_t* bytes) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (bytes == nullptr) return InvalidArgument("out_bytes is NULL");
  KVARN_RETURN_IF_ERROR(CheckBufferSize("q or out", total_q, args.num_q_heads, cfg.D, 4));
  return ctx->ops->attention_workspace(ctx, cfg, kv, args, total_q, bytes);
}

Status OpPagedAttention(Context* ctx, const Config& cfg, const PagedKV& kv,
                        const AttentionArgs& args, const void* q, void* out, float* lse,
                        void* workspace, size_t workspace_bytes) {
  KVARN_RETURN_IF_ERROR(CheckContext(ctx));
  if (kv.batch == 0) return Status::Ok();
  if (q == nullptr || out == nullptr) return InvalidArgument("q or out is NULL");
  // q_indptr is host memory (kvarn.h), so the query count is known here.
  if (args.q_indptr && args.q_indptr[kv.batch] < 0) {
    return InvalidArgument("q_indptr[batch] is negative");
  }
  const size_t total_q = args.q_indptr ? static_cast<size_t>(args.q_indptr[kv.batch]) : kv.batch;
  KVARN_RETURN_IF_ERROR(CheckBufferSize("q or out", total_q, args.num_q_heads, cfg.D, 4));
  size_t need = 0;
  KVARN_RETURN_IF_ERROR(ctx->ops->attention_workspace(ctx, cfg, kv, args, total_q, &need));
  KVARN_RETURN_IF_ERROR(CheckWorkspaceArg(workspace, workspace_bytes, need, "workspace",
                                          "kvarn_paged_attention_workspace_size"));
  return ctx->ops->paged_attention(ctx, cfg, kv, args, q, out, lse, workspace, workspace_bytes);
}

}  // namespace kvarn
