/*
 * paged_decode.c - an engine's decode loop over the capturable paged layer of libkvarn (C99).
 *
 * The engine (this file) owns the memory: a page pool of fp16 tiles, a record pool, and per step
 * the metadata of kvarn.h's "plan / run" calls, all in the context's memory. Each step:
 *   1. the scheduler picks a write slot for every live sequence (a new page when a tile starts);
 *   2. kvarn_paged_append_run writes the new K/V tokens by slot (vLLM's slot_mapping);
 *   3. a sequence whose tile completed gets a flush entry (page -> new record block) and
 *      kvarn_paged_flush_run quantizes the device list; the engine's block table then names the
 *      record block and the page goes back to the free list;
 *   4. kvarn_paged_attention_run runs decode attention under a plan made once.
 * One attention plan and two workspaces are made before the loop; the *_run calls take every
 * per-step value from the context's memory, so on a GPU they could be captured in a CUDA graph
 * once and replayed (see examples/python/paged_decode.py for a capture).
 *
 * The loop runs 4 slots for 300 steps: slot 0 one long sequence, slots 1 and 2 sequences that
 * finish and restart, slot 3 padding (no token, seq_lens 0: zero output rows, lse -inf). Along
 * the way the engine
 *   - rolls back the last tokens of slot 2 (a rejected speculative draft) by lowering its length,
 *     while they are still in the fp16 tail, and checks that attention then equals what it was
 *     when the sequence last had that length;
 *   - feeds a NaN key row to slot 1 once: seq_status[1] becomes KVARN_ERR_NON_FINITE, slot 1 is
 *     left as it was (the engine drops that token), the other slots proceed.
 * Every step is checked against kvarn_paged_attention (the host-list call) over the same tables
 * and pools: bit for bit on the CPU, within 1e-3 of the largest output on a GPU. Exits 1 on a
 * failing call or a mismatch.
 *
 *   paged_decode [--backend cpu|cuda] [--steps N]     (exit 77: the backend is not available)
 *
 * Build: cc -std=c99 paged_decode.c $(pkg-config --cflags --libs kvarn) -lm
 * Copyright 2026 The libkvarn Authors. SPDX-License-Identifier: Apache-2.0
 */
#include <kvarn/kvarn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_DIM 128
#define NUM_KV_HEADS 2
#define NUM_Q_HEADS 8
#define BATCH 4
#define MAX_LEN 320    /* the longest sequence: slot 0 reaches 300 + a few */
#define PADDING_SLOT 3 /* never holds a sequence */
#define ROLLBACK_SLOT 2
#define ROLLBACK_TOKENS 5
#define FAULT_SLOT 1
#define HISTORY 8 /* steps of q/out kept for the rollback check */

static int ok(kvarn_status_t status, const char* call) {
  if (status == KVARN_OK) return 1;
  fprintf(stderr, "error: %s\n  -> %s (status %d): %s\n", call, kvarn_status_string(status),
          (int)status, kvarn_last_error());
  return 0;
}
#define CHECK(call)                    \
  do {                                 \
    if (!ok((call), #call)) goto done; \
  } while (0)
#define FAIL(...)                 \
  do {                            \
    fprintf(stderr, "FAIL: ");    \
    fprintf(stderr, __VA_ARGS__); \
    fprintf(stderr, "\n");        \
    goto done;                    \
  } while (0)

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double uniform01(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return (double)((rng_state * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
}
static void fill_gaussian(float* x, size_t n, double scale) {
  size_t i;
  for (i = 0; i < n; ++i) {
    double u1 = uniform01(), u2 = uniform01();
    if (u1 < 1e-300) u1 = 1e-300;
    x[i] = (float)(scale * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

/* ---- the engine's scheduler state (host) ------------------------------------------------- */
typedef struct {
  int G, sink, max_blocks, num_pages, num_blocks;
  int32_t len[BATCH];    /* tokens of each slot's sequence (0: padding) */
  int32_t target[BATCH]; /* the length at which it finishes; 0 = the slot is idle */
  int32_t rtiles[BATCH]; /* tiles held as records */
  int32_t* table;        /* [BATCH][max_blocks]: pages (fp16 tiles) or record blocks */
  int32_t *free_pages, *free_blocks;
  int n_free_pages, n_free_blocks;
  int32_t spent[BATCH]; /* pages flushed this step, free from the next step on */
  int n_spent;
} engine_t;

/* One step's metadata, sized for the batch (what a captured graph would read). */
typedef struct {
  int32_t token_indptr[BATCH + 1];
  int32_t slot_mapping[BATCH];
  int32_t n_flush[1];
  int32_t flush_src[BATCH], flush_dst[BATCH], flush_seq[BATCH];
} step_t;

static int32_t* entry(engine_t* e, int b, int tile) { return &e->table[b * e->max_blocks + tile]; }

static void release(engine_t* e, int b) {
  const int tiles = (e->len[b] + e->G - 1) / e->G;
  int t;
  for (t = 0; t < tiles; ++t) {
    const int record = t >= e->sink && t < e->sink + e->rtiles[b];
    if (record) {
      e->free_blocks[e->n_free_blocks++] = *entry(e, b, t);
    } else {
      e->free_pages[e->n_free_pages++] = *entry(e, b, t);
    }
    *entry(e, b, t) = 0;
  }
  e->len[b] = e->rtiles[b] = e->target[b] = 0;
}

/* Schedules one token for every live slot; fills the metadata and advances the lengths and
 * tables to what they are after this step's append and flush. */
static void schedule(engine_t* e, step_t* s, int step) {
  int b;
  for (b = 0; b < e->n_spent; ++b) e->free_pages[e->n_free_pages++] = e->spent[b];
  e->n_spent = 0;
  for (b = 0; b < BATCH; ++b) {
    if (b == PADDING_SLOT) continue;
    if (e->target[b] > 0 && e->len[b] >= e->target[b]) release(e, b); /* finished */
    if (e->target[b] == 0 && step % 7 != 0) e->target[b] = b == 0 ? 100000 : 90 + 40 * b;
  }
  s->token_indptr[0] = 0;
  s->n_flush[0] = 0;
  for (b = 0; b < BATCH; ++b) {
    const int live = e->target[b] > 0;
    s->token_indptr[b + 1] = s->token_indptr[b] + live;
    s->slot_mapping[b] = -1; /* rows past token_indptr[BATCH] are padding */
  }
  for (b = 0; b < BATCH; ++b) {
    int pos, tile;
    if (e->target[b] == 0) continue;
    pos = e->len[b];
    tile = pos / e->G;
    if (pos % e->G == 0) *entry(e, b, tile) = e->free_pages[--e->n_free_pages];
    s->slot_mapping[s->token_indptr[b]] = *entry(e, b, tile) * e->G + pos % e->G;
    e->len[b] = pos + 1;
    if (e->len[b] % e->G == 0 && tile >= e->sink) { /* a tile past the sink completed */
      const int i = s->n_flush[0]++;
      s->flush_src[i] = *entry(e, b, tile);
      s->flush_dst[i] = e->free_blocks[--e->n_free_blocks];
      s->flush_seq[i] = b;
      e->spent[e->n_spent++] = s->flush_src[i];
      *entry(e, b, tile) = s->flush_dst[i];
      ++e->rtiles[b];
    }
  }
}

/* A faulty sequence kept nothing of this step: undo its token (and its flush entry). */
static void undo(engine_t* e, const step_t* s, int b) {
  int i;
  for (i = 0; i < s->n_flush[0]; ++i) {
    if (s->flush_seq[i] != b) continue;
    *entry(e, b, (e->len[b] - 1) / e->G) = s->flush_src[i]; /* the page holds the tile still */
    e->free_blocks[e->n_free_blocks++] = s->flush_dst[i];
    --e->rtiles[b];
    --e->n_spent; /* its page was the last one marked spent for b: find and drop it */
    {
      int j;
      for (j = 0; j <= e->n_spent; ++j) {
        if (e->spent[j] == s->flush_src[i]) {
          e->spent[j] = e->spent[e->n_spent];
          break;
        }
      }
    }
  }
  --e->len[b];
  if (e->len[b] % e->G == 0) { /* the token had opened a page: give it back */
    e->free_pages[e->n_free_pages++] = *entry(e, b, e->len[b] / e->G);
    *entry(e, b, e->len[b] / e->G) = 0;
  }
}

/* Drops the last n tokens of sequence b. Only fp16 tokens can be dropped: a record is the
 * quantization of a whole tile of G tokens (per-channel scales, Sinkhorn normalization over the
 * tile), and once its page was flushed the fp16 originals are gone (the page is reused), so
 * keeping only some of a record's tokens would need values that no longer exist. An engine that
 * speculates keeps the tile of its draft tokens in fp16 until they are accepted (delays the
 * flush), as the managed cache does for uncommitted tokens; here the tail is always fp16. */
static int rollback(engine_t* e, int b, int n) {
  const int fp16_from = (e->sink + e->rtiles[b]) * e->G; /* first token of the fp16 tail */
  const int new_len = e->len[b] - n;
  int t;
  if (e->rtiles[b] > 0 && new_len < fp16_from) return 0; /* would cut a record */
  if (new_len < 0) return 0;
  for (t = (new_len + e->G - 1) / e->G; t < (e->len[b] + e->G - 1) / e->G; ++t) {
    e->free_pages[e->n_free_pages++] = *entry(e, b, t); /* tail pages no longer used */
    *entry(e, b, t) = 0;
  }
  e->len[b] = new_len;
  return 1;
}

int main(int argc, char** argv) {
  int exit_code = 1, steps = 300, i, b, step;
  kvarn_backend_t backend = KVARN_BACKEND_CPU;
  kvarn_context_options_t copt;
  kvarn_context_t* ctx = NULL;
  kvarn_config_t cfg;
  kvarn_attention_shape_t shape;
  kvarn_attention_params_t params;
  kvarn_attention_plan_t* plan = NULL;
  kvarn_paged_kv_t kv;
  kvarn_launch_t launch;
  engine_t e;
  step_t s;
  size_t record_bytes = 0, stride, page_bytes, flush_ws_bytes = 0, attn_ws_bytes = 0,
         ref_ws_bytes = 0;
  const size_t kv_elems = (size_t)BATCH * NUM_KV_HEADS * HEAD_DIM;
  const size_t q_elems = (size_t)BATCH * NUM_Q_HEADS * HEAD_DIM;
  const size_t row = (size_t)NUM_Q_HEADS * HEAD_DIM;
  float *k = NULL, *v = NULL, *q = NULL, *out = NULL, *ref = NULL, *lse = NULL, *ref_lse = NULL;
  float hist_q[HISTORY][NUM_Q_HEADS * HEAD_DIM], hist_out[HISTORY][NUM_Q_HEADS * HEAD_DIM];
  int32_t hist_len[HISTORY];
  int32_t status[BATCH], seq_lens[BATCH], zeros[BATCH] = {0};
  /* Context memory. */
  void *d_records = NULL, *d_kpages = NULL, *d_vpages = NULL, *d_table = NULL, *d_lens = NULL,
       *d_rtiles = NULL, *d_indptr = NULL, *d_slots = NULL, *d_nflush = NULL, *d_src = NULL,
       *d_dst = NULL, *d_seq = NULL, *d_status = NULL, *d_k = NULL, *d_v = NULL, *d_q = NULL,
       *d_out = NULL, *d_lse = NULL, *d_ref = NULL, *d_ref_lse = NULL, *d_flush_ws = NULL,
       *d_attn_ws = NULL, *d_ref_ws = NULL;
  int flushes = 0, padded_rows = 0, rolled_back = 0, faulted = 0;
  double max_diff = 0.0;
  memset(&e, 0, sizeof e);

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      ++i;
      if (strcmp(argv[i], "cuda") == 0) {
        backend = KVARN_BACKEND_CUDA;
      } else if (strcmp(argv[i], "cpu") != 0) {
        fprintf(stderr, "unknown backend %s (cpu or cuda)\n", argv[i]);
        return 2;
      }
    } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = atoi(argv[++i]);
      if (steps < 1 || steps > MAX_LEN - 16) {
        fprintf(stderr, "--steps: 1..%d\n", MAX_LEN - 16);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: %s [--backend cpu|cuda] [--steps N]\n", argv[0]);
      return 2;
    }
  }

  kvarn_context_options_defaults(&copt);
  copt.backend = backend;
  if (kvarn_context_create(&copt, &ctx) != KVARN_OK) {
    if (backend != KVARN_BACKEND_CPU) {
      printf("SKIP: backend %s is not available here: %s\n", kvarn_backend_name(backend),
             kvarn_last_error());
      return 77;
    }
    ok(KVARN_ERR_BACKEND_UNAVAILABLE, "kvarn_context_create");
    return 1;
  }
  printf("libkvarn %s, paged decode loop on the %s backend, %d steps\n", kvarn_version_string(),
         kvarn_backend_name(backend), steps);

  /* ---- pools and plan, made once ------------------------------------------------------- */
  CHECK(kvarn_config_from_preset("k4v2_g64", HEAD_DIM, &cfg));
  CHECK(kvarn_record_bytes(&cfg, &record_bytes));
  stride = record_bytes + (record_bytes & 1);
  e.G = cfg.tile_tokens;
  e.sink = cfg.sink_tiles;
  e.max_blocks = (MAX_LEN + e.G - 1) / e.G;
  e.num_pages = BATCH * (e.sink + 2) + 4; /* sink + the tail + a fresh page, per slot */
  e.num_blocks = BATCH * e.max_blocks;
  e.table = (int32_t*)calloc((size_t)BATCH * e.max_blocks, sizeof(int32_t));
  e.free_pages = (int32_t*)malloc((size_t)e.num_pages * sizeof(int32_t));
  e.free_blocks = (int32_t*)malloc((size_t)e.num_blocks * sizeof(int32_t));
  k = (float*)malloc(kv_elems * 4);
  v = (float*)malloc(kv_elems * 4);
  q = (float*)malloc(q_elems * 4);
  out = (float*)malloc(q_elems * 4);
  ref = (float*)malloc(q_elems * 4);
  lse = (float*)malloc((size_t)BATCH * NUM_Q_HEADS * 4);
  ref_lse = (float*)malloc((size_t)BATCH * NUM_Q_HEADS * 4);
  if (!e.table || !e.free_pages || !e.free_blocks || !k || !v || !q || !out || !ref || !lse ||
      !ref_lse) {
    FAIL("out of host memory");
  }
  for (i = 0; i < e.num_pages; ++i) e.free_pages[e.n_free_pages++] = e.num_pages - 1 - i;
  for (i = 0; i < e.num_blocks; ++i) e.free_blocks[e.n_free_blocks++] = e.num_blocks - 1 - i;
  page_bytes = (size_t)NUM_KV_HEADS * (size_t)e.G * HEAD_DIM * 2;

#define ALLOC(ptr, bytes) CHECK(kvarn_memory_alloc(ctx, (bytes), &(ptr)))
  ALLOC(d_records, (size_t)e.num_blocks * NUM_KV_HEADS * stride);
  ALLOC(d_kpages, (size_t)e.num_pages * page_bytes);
  ALLOC(d_vpages, (size_t)e.num_pages * page_bytes);
  ALLOC(d_table, (size_t)BATCH * e.max_blocks * 4);
  ALLOC(d_lens, BATCH * 4);
  ALLOC(d_rtiles, BATCH * 4);
  ALLOC(d_indptr, (BATCH + 1) * 4);
  ALLOC(d_slots, BATCH * 4);
  ALLOC(d_nflush, 4);
  ALLOC(d_src, BATCH * 4);
  ALLOC(d_dst, BATCH * 4);
  ALLOC(d_seq, BATCH * 4);
  ALLOC(d_status, BATCH * 4);
  ALLOC(d_k, kv_elems * 4);
  ALLOC(d_v, kv_elems * 4);
  ALLOC(d_q, q_elems * 4);
  ALLOC(d_out, q_elems * 4);
  ALLOC(d_lse, (size_t)BATCH * NUM_Q_HEADS * 4);
  ALLOC(d_ref, q_elems * 4);
  ALLOC(d_ref_lse, (size_t)BATCH * NUM_Q_HEADS * 4);
#define UPLOAD(dst, src, bytes) \
  CHECK(kvarn_memory_copy(ctx, (dst), (src), (bytes), KVARN_COPY_HOST_TO_DEVICE))
#define DOWNLOAD(dst, src, bytes) \
  CHECK(kvarn_memory_copy(ctx, (dst), (src), (bytes), KVARN_COPY_DEVICE_TO_HOST))
  UPLOAD(d_status, zeros, sizeof zeros); /* the engine clears the status array */

  kvarn_paged_kv_defaults(&kv);
  kv.num_kv_heads = NUM_KV_HEADS;
  kv.batch = BATCH;
  kv.records = d_records;
  kv.record_stride = stride;
  kv.num_record_blocks = e.num_blocks;
  kv.k_pages = d_kpages;
  kv.v_pages = d_vpages;
  kv.num_pages = e.num_pages;
  kv.block_table = (const int32_t*)d_table;
  kv.max_blocks_per_seq = e.max_blocks;
  kv.seq_lens = (const int32_t*)d_lens;
  kv.record_tiles = (const int32_t*)d_rtiles;

  kvarn_attention_shape_defaults(&shape);
  shape.batch = BATCH;
  shape.num_kv_heads = NUM_KV_HEADS;
  shape.max_blocks_per_seq = e.max_blocks;
  shape.max_q_per_seq = 0; /* decode */
  kvarn_attention_params_defaults(&params);
  params.num_q_heads = NUM_Q_HEADS;
  CHECK(kvarn_attention_plan_create(ctx, &cfg, &shape, &params, &plan));
  CHECK(kvarn_attention_plan_workspace_size(plan, &attn_ws_bytes));
  CHECK(kvarn_paged_flush_workspace_size(&cfg, NUM_KV_HEADS, BATCH, &flush_ws_bytes));
  CHECK(kvarn_paged_attention_workspace_size(ctx, &cfg, &kv, &params, BATCH, &ref_ws_bytes));
  ALLOC(d_attn_ws, attn_ws_bytes ? attn_ws_bytes : 1);
  ALLOC(d_flush_ws, flush_ws_bytes ? flush_ws_bytes : 1);
  ALLOC(d_ref_ws, ref_ws_bytes ? ref_ws_bytes : 1);
  printf(
      "plan: batch %d, %d KV heads, %d query heads, %d blocks per sequence; workspaces: "
      "attention %zu B, flush %zu B\n",
      BATCH, NUM_KV_HEADS, NUM_Q_HEADS, e.max_blocks, attn_ws_bytes, flush_ws_bytes);
  kvarn_launch_defaults(&launch);
  launch.seq_status = (int32_t*)d_status;

  /* ---- the loop ------------------------------------------------------------------------ */
  for (step = 0; step < steps; ++step) {
    const int fault_step = step == 200;
    int rollback_now = 0;
    schedule(&e, &s, step);
    fill_gaussian(k, kv_elems, 2.0);
    fill_gaussian(v, kv_elems, 1.0);
    fill_gaussian(q, q_elems, 0.3);
    if (fault_step) { /* a NaN in slot 1's key row (an upstream overflow, a bad input) */
      if (s.token_indptr[FAULT_SLOT + 1] == s.token_indptr[FAULT_SLOT]) FAIL("slot 1 is idle");
      k[(size_t)s.token_indptr[FAULT_SLOT] * NUM_KV_HEADS * HEAD_DIM + 7] = NAN;
    }
    for (b = 0; b < BATCH; ++b) seq_lens[b] = e.len[b];
    UPLOAD(d_indptr, s.token_indptr, sizeof s.token_indptr);
    UPLOAD(d_slots, s.slot_mapping, sizeof s.slot_mapping);
    UPLOAD(d_nflush, s.n_flush, sizeof s.n_flush);
    UPLOAD(d_src, s.flush_src, sizeof s.flush_src);
    UPLOAD(d_dst, s.flush_dst, sizeof s.flush_dst);
    UPLOAD(d_seq, s.flush_seq, sizeof s.flush_seq);
    UPLOAD(d_table, e.table, (size_t)BATCH * e.max_blocks * 4);
    UPLOAD(d_lens, seq_lens, sizeof seq_lens);
    UPLOAD(d_rtiles, e.rtiles, sizeof e.rtiles);
    UPLOAD(d_k, k, kv_elems * 4);
    UPLOAD(d_v, v, kv_elems * 4);
    UPLOAD(d_q, q, q_elems * 4);

    /* append -> flush -> attention, on one status array. */
    launch.workspace = NULL;
    launch.workspace_bytes = 0;
    CHECK(kvarn_paged_append_run(ctx, &cfg, &kv, &launch, (const int32_t*)d_indptr,
                                 (const int32_t*)d_slots, BATCH, KVARN_DTYPE_F32, d_k, d_v));
    launch.workspace = d_flush_ws;
    launch.workspace_bytes = flush_ws_bytes;
    CHECK(kvarn_paged_flush_run(ctx, &cfg, &kv, &launch, BATCH, (const int32_t*)d_nflush,
                                (const int32_t*)d_src, (const int32_t*)d_dst,
                                (const int32_t*)d_seq));
    launch.workspace = d_attn_ws;
    launch.workspace_bytes = attn_ws_bytes;
    CHECK(kvarn_paged_attention_run(ctx, plan, &kv, &launch, NULL, d_q, d_out, (float*)d_lse));
    /* The reference: the host-list call over the same tables and pools. */
    CHECK(kvarn_paged_attention(ctx, &cfg, &kv, &params, d_q, d_ref, (float*)d_ref_lse, d_ref_ws,
                                ref_ws_bytes));
    DOWNLOAD(status, d_status, sizeof status); /* waits for the step */
    DOWNLOAD(out, d_out, q_elems * 4);
    DOWNLOAD(ref, d_ref, q_elems * 4);
    DOWNLOAD(lse, d_lse, (size_t)BATCH * NUM_Q_HEADS * 4);
    DOWNLOAD(ref_lse, d_ref_lse, (size_t)BATCH * NUM_Q_HEADS * 4);
    flushes += s.n_flush[0];

    for (b = 0; b < BATCH; ++b) {
      const int want = fault_step && b == FAULT_SLOT ? KVARN_ERR_NON_FINITE : 0;
      if (status[b] != want) {
        FAIL("step %d: seq_status[%d] = %d (%s), expected %d", step, b, (int)status[b],
             kvarn_status_string((kvarn_status_t)status[b]), want);
      }
    }
    if (fault_step) {
      /* The faulty sequence kept nothing of the step; the engine drops the token, clears the
       * entry and carries on (its output row is unspecified: not compared). */
      undo(&e, &s, FAULT_SLOT);
      UPLOAD(d_status, zeros, sizeof zeros);
      faulted = 1;
      printf("step %3d: slot %d got a NaN key: seq_status = %s; the other slots proceeded\n", step,
             FAULT_SLOT, kvarn_status_string(KVARN_ERR_NON_FINITE));
    }
    for (b = 0; b < BATCH; ++b) {
      const size_t r0 = (size_t)b * row;
      size_t j;
      if (fault_step && b == FAULT_SLOT) continue;
      if (seq_lens[b] == 0) { /* padding: zero rows, lse -inf */
        for (j = 0; j < row; ++j) {
          if (out[r0 + j] != 0.f) FAIL("step %d: padding slot %d has a non-zero output", step, b);
        }
        for (j = 0; j < NUM_Q_HEADS; ++j) {
          const float l = lse[(size_t)b * NUM_Q_HEADS + j];
          if (!(isinf(l) && l < 0)) FAIL("step %d: padding slot %d has lse %g", step, b, l);
        }
        ++padded_rows;
        continue;
      }
      for (j = 0; j < row; ++j) {
        const double d = fabs((double)out[r0 + j] - (double)ref[r0 + j]);
        if (!(d <= max_diff)) max_diff = d; /* also catches NaN */
      }
      if (backend == KVARN_BACKEND_CPU) {
        if (memcmp(out + r0, ref + r0, row * 4) != 0 ||
            memcmp(lse + (size_t)b * NUM_Q_HEADS, ref_lse + (size_t)b * NUM_Q_HEADS,
                   NUM_Q_HEADS * 4) != 0) {
          FAIL("step %d slot %d: attention_run differs from kvarn_paged_attention", step, b);
        }
      } else if (!(max_diff <= 1e-3)) {
        FAIL("step %d slot %d: attention_run differs from kvarn_paged_attention by %g", step, b,
             max_diff);
      }
    }
    /* History of the rollback slot: q and out at each length. */
    memcpy(hist_q[step % HISTORY], q + ROLLBACK_SLOT * row, row * 4);
    memcpy(hist_out[step % HISTORY], out + ROLLBACK_SLOT * row, row * 4);
    hist_len[step % HISTORY] = seq_lens[ROLLBACK_SLOT];

    /* ---- rollback: a draft of ROLLBACK_TOKENS tokens of slot 2 is rejected --------------- */
    rollback_now = !rolled_back && step >= 150 && e.target[ROLLBACK_SLOT] > 0 &&
                   e.len[ROLLBACK_SLOT] % e.G >= ROLLBACK_TOKENS + 1 &&
                   e.len[ROLLBACK_SLOT] < e.target[ROLLBACK_SLOT];
    if (rollback_now) {
      const int want_len = e.len[ROLLBACK_SLOT] - ROLLBACK_TOKENS;
      const int h = (step - ROLLBACK_TOKENS) % HISTORY; /* the step that ended at want_len */
      if (hist_len[h] != want_len) FAIL("rollback bookkeeping: %d != %d", hist_len[h], want_len);
      if (!rollback(&e, ROLLBACK_SLOT, ROLLBACK_TOKENS)) FAIL("rollback refused");
      /* Attention at the lowered length, with that step's query, equals that step's output. */
      for (b = 0; b < BATCH; ++b) seq_lens[b] = e.len[b];
      memcpy(q + ROLLBACK_SLOT * row, hist_q[h], row * 4);
      UPLOAD(d_q, q, q_elems * 4);
      UPLOAD(d_lens, seq_lens, sizeof seq_lens);
      UPLOAD(d_table, e.table, (size_t)BATCH * e.max_blocks * 4);
      CHECK(kvarn_paged_attention_run(ctx, plan, &kv, &launch, NULL, d_q, d_out, (float*)d_lse));
      DOWNLOAD(out, d_out, q_elems * 4);
      for (i = 0; i < (int)row; ++i) {
        const double d = fabs((double)out[ROLLBACK_SLOT * row + i] - (double)hist_out[h][i]);
        if (backend == KVARN_BACKEND_CPU ? d != 0.0 : !(d <= 1e-3)) {
          FAIL("rollback: attention at length %d differs from before by %g", want_len, d);
        }
      }
      printf(
          "step %3d: slot %d rolled back from %d to %d tokens (fp16 tail); attention equals "
          "the one at that length\n",
          step, ROLLBACK_SLOT, want_len + ROLLBACK_TOKENS, want_len);
      rolled_back = 1;
    }
    if (step % 50 == 0) {
      printf("step %3d: lengths", step);
      for (b = 0; b < BATCH; ++b) printf(" %3d", (int)seq_lens[b]);
      printf(" | record tiles");
      for (b = 0; b < BATCH; ++b) printf(" %d", (int)e.rtiles[b]);
      printf(" | %d flushes so far\n", flushes);
    }
  }
  if (steps >= 250 && (!rolled_back || !faulted || flushes < 4 || padded_rows < steps)) {
    FAIL("the loop did not exercise everything (rollback %d, fault %d, flushes %d, padding %d)",
         rolled_back, faulted, flushes, padded_rows);
  }
  printf("OK: %d steps, %d tiles flushed, %d padding rows, largest |run - host-list| = %g\n", steps,
         flushes, padded_rows, max_diff);
  exit_code = 0;

done:
  kvarn_attention_plan_destroy(plan);
  if (ctx != NULL) {
    void* bufs[] = {d_records, d_kpages,  d_vpages,   d_table,   d_lens,  d_rtiles,
                    d_indptr,  d_slots,   d_nflush,   d_src,     d_dst,   d_seq,
                    d_status,  d_k,       d_v,        d_q,       d_out,   d_lse,
                    d_ref,     d_ref_lse, d_flush_ws, d_attn_ws, d_ref_ws};
    for (i = 0; i < (int)(sizeof bufs / sizeof bufs[0]); ++i) kvarn_memory_free(ctx, bufs[i]);
  }
  kvarn_context_destroy(ctx);
  free(e.table);
  free(e.free_pages);
  free(e.free_blocks);
  free(k);
  free(v);
  free(q);
  free(out);
  free(ref);
  free(lse);
  free(ref_lse);
  return exit_code;
}
