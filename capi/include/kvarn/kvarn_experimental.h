/*
 * kvarn_experimental.h - research-only entry points of libkvarn.
 *
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 *
 * ============================================================================================
 *  EXPERIMENTAL: NO STABILITY PROMISE. Everything declared in this header may change or
 *  disappear in any release, minor and patch releases included, without a deprecation period
 *  and without a change of the ABI version. It exists for accuracy studies (docs/ACCURACY.md)
 *  and tests; serving code should use kvarn.h alone.
 * ============================================================================================
 *
 * It holds:
 *   - the KVARN_ABLATE_* flags, the values of kvarn_config_t's key_flags / value_flags fields
 *     (kvarn.h keeps the fields, for layout stability; 0 is their only stable value), which
 *     switch parts of the KVarN algorithm off to compute baselines with the same code;
 *   - kvarn_baseline_roundtrip, reference quantizers the KVarN record is compared against;
 *   - the per-request tail state of the one-pool memory model (docs/ENGINES.md): a first form,
 *     CPU and CUDA, for engines to try before it moves to kvarn.h.
 *
 * These functions are exported by libkvarn.so like the stable ones (they are listed in
 * capi/symbols.txt), but their signatures and behaviour are covered by this banner, not by the
 * ABI rules of kvarn.h. The rules of kvarn.h otherwise apply (status codes, kvarn_last_error,
 * nothing written on failure).
 */
#ifndef KVARN_KVARN_EXPERIMENTAL_H_
#define KVARN_KVARN_EXPERIMENTAL_H_

#include "kvarn/kvarn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Ablation switches (kvarn_config_t.key_flags / value_flags), per tensor (K and V separately)
 * ------------------------------------------------------------------------------------------- */

#define KVARN_ABLATE_NONE 0u
#define KVARN_ABLATE_NO_ROTATION 1u      /* the cache holds unrotated vectors */
#define KVARN_ABLATE_NO_NORMALIZATION 2u /* no Sinkhorn passes: plain per-row RTN */

/* ---------------------------------------------------------------------------------------------
 * Baseline quantizers
 * ------------------------------------------------------------------------------------------- */

/* Baseline quantizers for accuracy studies (docs/ACCURACY.md): methods the KVarN record is
 * compared against that its ablation switches cannot express. Host memory, fp32, no context. */
typedef enum kvarn_baseline {
  /* Asymmetric min/max round-to-nearest of each row at `bits` (2..8) bits with an fp16 scale and
   * zero per row: code = clamp(rint((x - z) / s), 0, 2^bits - 1), x' = code * s + z. */
  KVARN_BASELINE_PER_TOKEN_RTN = 0,
  /* fp8 e4m3 (OCP, max 448) with an fp16 per-row scale absmax / 448; `bits` is ignored. */
  KVARN_BASELINE_FP8_E4M3 = 1,
  KVARN_BASELINE_SENTINEL_ = 0x7fffffff
} kvarn_baseline_t;

/* Quantizes and reconstructs each of `rows` rows of `cols` floats (a token's channels) with
 * `method`; `out` may equal `in`. NaN/Inf inputs give KVARN_ERR_NON_FINITE and |x| > 65504
 * KVARN_ERR_OVERFLOW, with nothing written. */
KVARN_API kvarn_status_t kvarn_baseline_roundtrip(kvarn_baseline_t method, int32_t bits,
                                                  size_t rows, int32_t cols, const float* in,
                                                  float* out);

/* ---------------------------------------------------------------------------------------------
 * Per-request tail state: the one-pool memory model (docs/ENGINES.md), CPU and CUDA backends
 *
 * Every complete tile of a sequence is a record block of the engine's block pool (no fp16 sink:
 * the config's sink_tiles must be 0); the tokens past them, the partial tile and those of the
 * current step, live in a fixed-size tail slot per sequence whose index the engine assigns:
 *   tiles [0, record_tiles[b])            record blocks block_table[b][i]
 *   tokens [record_tiles[b] * G, N_b)     rows 0.. of slot tail_slots[b]
 *   slot s:  states + s * slot_bytes: K, then V, each fp16 [Hk][cap][D] in the cache frame,
 *            cap = G - 1 + max_step_tokens rounded up to a multiple of 8;
 *            with row_bits 8: K codes, V codes, each int8 [Hk][cap][D], then K scales, V scales,
 *            each fp16 [Hk][cap]. A row r (the fp16 row the fp16 slot would hold) is stored as
 *            scale = fp16(max_d |r_d| / 127), code_d = clamp(rint(r_d / scale), -127, 127)
 *            (all codes 0 where scale is 0) and reads back as fp16(code_d * scale), for
 *            attention and for the flush alike (docs/ENGINES.md measures its accuracy).
 * A step is append (positions from the lengths after the append; no slot mapping), the flush of
 * the committed complete tiles (from the lengths; no host list), attention; or, where a step's
 * tokens may not fit the slot (prefill chunks), kvarn_paged_append_flush_tail_run (both at once)
 * then attention. The calls follow the
 * run calls' rules (kvarn.h "plan / run": device-resident metadata, launch, status array, error
 * model). CUDA: states and slot_bytes 16-byte aligned, fp16 rows only (row_bits 8 is CPU only
 * so far); the GPU codec's records match the CPU's to its tolerance (docs/FORMAT.md), not bit
 * for bit. ROCm returns KVARN_ERR_UNSUPPORTED.
 * ------------------------------------------------------------------------------------------- */

typedef struct kvarn_tail_state {
  size_t size;             /* sizeof(kvarn_tail_state_t) */
  void* states;            /* num_slots slots of slot_bytes bytes (context memory) */
  size_t slot_bytes;       /* bytes between slots: >= kvarn_tail_state_bytes, a multiple of 2 */
  int32_t max_step_tokens; /* tokens one step may append to a sequence (>= 1; default 1) */
  int32_t num_slots;       /* slots at states (bounds check) */
  const int32_t* slots;    /* [batch] the slot of each sequence (context memory); two sequences
                              holding tokens past their records must not share a slot */
  int32_t row_bits;        /* 0 or 16: fp16 rows (default); 8: int8 rows with an fp16 scale each */
} kvarn_tail_state_t;

KVARN_API void kvarn_tail_state_defaults(kvarn_tail_state_t* tail);

/* Bytes of one tail slot, cap as above: 2 (K, V) * Hk * cap * D * 2 for fp16 rows (row_bits 0 or
 * 16), 2 * Hk * cap * (D + 2) for int8 rows (row_bits 8). */
KVARN_API kvarn_status_t kvarn_tail_state_bytes(const kvarn_config_t* config, int32_t num_kv_heads,
                                                int32_t max_step_tokens, int32_t row_bits,
                                                size_t* out_bytes);

/* Appends tokens into the tail slots: token t of sequence b (t in [token_indptr[b],
 * token_indptr[b+1])) is at position seq_lens[b] - (token_indptr[b+1] - t) (kv->seq_lens are
 * the lengths after this append) and goes, rotated and rounded to fp16, to row
 * position - record_tiles[b] * G of slot tail->slots[b]. Of kv, num_kv_heads, batch, seq_lens
 * and record_tiles are read (block_table must be set, as for attention, but is not read). k, v,
 * max_tokens, dtype and the launch's row strides as for kvarn_paged_append_run. Data errors: a row
 * outside [0, cap), a slot outside the slots, a non-finite or fp16-overflowing row, token_indptr
 * decreasing. */
KVARN_API kvarn_status_t kvarn_paged_append_tail_run(
    kvarn_context_t* context, const kvarn_config_t* config, const kvarn_paged_kv_t* kv,
    const kvarn_tail_state_t* tail, const kvarn_launch_t* launch, const int32_t* token_indptr,
    size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v);

/* Workspace bytes of kvarn_paged_flush_tail_run for `batch` sequences. */
KVARN_API kvarn_status_t kvarn_paged_flush_tail_workspace_size(const kvarn_config_t* config,
                                                               int32_t num_kv_heads, int32_t batch,
                                                               int32_t max_step_tokens,
                                                               size_t* out_bytes);

/* Quantizes, for every sequence b, the tiles record_tiles[b] .. committed[b] / G - 1 (complete
 * and committed) from the rows of its slot into the blocks block_table[b][tile], moves the
 * slot's remaining rows (up to seq_lens[b]) to its start, and writes record_tiles_out[b] (the
 * new count; may be kv->record_tiles itself). Uncommitted tokens are never flushed: rollback
 * stays a length change. committed, record_tiles_out: [batch] int32, context memory.
 * Data errors of a sequence: committed[b] outside [record_tiles[b] * G, seq_lens[b]], a table
 * entry outside the record pool, a slot outside the slots or holding more than cap rows, a
 * scale beyond fp16; such a sequence keeps its slot, blocks and record_tiles_out[b] =
 * record_tiles[b]. Workspace: kvarn_paged_flush_tail_workspace_size bytes.
 * It may run before attention (tokens committed at once, e.g. a prefill chunk: attention then
 * reads the completed tiles as records) or after it (speculative tokens: the committed lengths
 * are known after verification); attention gives the same result either way up to the
 * quantization of the tiles it reads as records. */
KVARN_API kvarn_status_t kvarn_paged_flush_tail_run(
    kvarn_context_t* context, const kvarn_config_t* config, const kvarn_paged_kv_t* kv,
    const kvarn_tail_state_t* tail, const kvarn_launch_t* launch, const int32_t* committed,
    int32_t* record_tiles_out);

/* Workspace bytes of kvarn_paged_append_flush_tail_run for `batch` sequences and at most
 * `max_tokens` appended tokens (the call's max_tokens). */
KVARN_API kvarn_status_t kvarn_paged_append_flush_tail_workspace_size(
    const kvarn_config_t* config, int32_t num_kv_heads, int32_t batch, int32_t max_step_tokens,
    size_t max_tokens, size_t* out_bytes);

/* kvarn_paged_append_tail_run followed by kvarn_paged_flush_tail_run, in one call whose appended
 * tokens need not fit the slot: the tiles complete and committed after the append (record_tiles[b]
 * .. committed[b] / G - 1) are quantized into their blocks from the slot's rows and the input
 * rows, and only the rows past them (the partial tile and the uncommitted tokens, at most cap)
 * stay in the slot. A prefill chunk of any length then needs a slot of G - 1 + (uncommitted
 * tokens of a step) rows, not G - 1 + the chunk. Bit for bit what the two calls give with a slot
 * large enough for the step. Arguments as for the two calls (kv->seq_lens are the lengths after
 * the append, committed[b] in [record_tiles[b] * G, seq_lens[b]]); max_tokens 0 makes it a flush.
 * Data errors of a sequence: those of either call, and more than cap rows left past the new
 * records; such a sequence keeps its slot, blocks and record_tiles_out[b] = record_tiles[b].
 * Workspace: kvarn_paged_append_flush_tail_workspace_size bytes (the staged records, the appended
 * rows in the cache frame and a per-sequence index; 256-byte aligned on a GPU context). CPU and
 * CUDA (fp16 rows; where a D x G tile does not fit the device's shared memory it returns
 * KVARN_ERR_UNSUPPORTED); ROCm returns KVARN_ERR_UNSUPPORTED. */
KVARN_API kvarn_status_t kvarn_paged_append_flush_tail_run(
    kvarn_context_t* context, const kvarn_config_t* config, const kvarn_paged_kv_t* kv,
    const kvarn_tail_state_t* tail, const kvarn_launch_t* launch, const int32_t* token_indptr,
    size_t max_tokens, kvarn_dtype_t dtype, const void* k, const void* v, const int32_t* committed,
    int32_t* record_tiles_out);

/* kvarn_paged_attention_run over records and tail slots (tiles past record_tiles[b] are read
 * from the slot). The plan's config must have sink_tiles 0. */
KVARN_API kvarn_status_t kvarn_paged_attention_tail_run(
    kvarn_context_t* context, const kvarn_attention_plan_t* plan, const kvarn_paged_kv_t* kv,
    const kvarn_tail_state_t* tail, const kvarn_launch_t* launch, const int32_t* q_indptr,
    const void* q, void* out, float* lse);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVARN_KVARN_EXPERIMENTAL_H_ */
