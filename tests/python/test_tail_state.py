"""The experimental per-request tail state through the package (kvarn.TailState,
paged_append_tail_run, TailFlushPlan (run, append_run), AttentionPlan.run(tail=...)): engine
loops (speculative tokens with rollback; long prefill chunks into decode-sized slots) give, bit
for bit, what the managed cache (kvarn.Cache) gives for the same steps. CPU."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn

D = 128
HK = 2
HQ = 4
B = 4
STEP = 3  # tokens a sequence may append per step (a token and up to two drafts)


@pytest.fixture
def config():
    # The one-pool model: the sink is a block like every tile.
    return kvarn.Config.from_preset("k4v2_g64", D, sink_tiles=0)


def test_speculative_loop_matches_the_managed_cache(ctx, config, rng):
    g = config.tile_tokens
    max_len = 200
    max_blocks = (max_len + STEP) // g + 1
    kv = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=HK, num_record_blocks=B * max_blocks,
                                num_pages=0, batch=B, max_blocks_per_seq=max_blocks)
    tail = kvarn.TailState(ctx, config, num_kv_heads=HK, num_slots=B, max_step_tokens=STEP)
    assert tail.slot_bytes == kvarn.tail_state_bytes(config, HK, STEP) == 2 * HK * 72 * D * 2
    slots = np.array([3, 1, 0, 2], np.int32)
    flush = kvarn.TailFlushPlan(ctx, config, num_kv_heads=HK, batch=B, max_step_tokens=STEP)
    plan = kvarn.AttentionPlan(ctx, config, batch=B, num_kv_heads=HK,
                               max_blocks_per_seq=max_blocks, num_q_heads=HQ,
                               max_q_per_seq=STEP, max_total_q=B * STEP)
    cache = kvarn.Cache(config, num_kv_heads=HK, max_tokens=B * (max_len + g), max_sequences=B,
                        ctx=ctx)
    free = list(range(B * max_blocks - 1, -1, -1))
    kv.block_table[:] = -1
    kv.seq_lens[:] = 0
    kv.record_tiles[:] = 0
    committed = np.zeros(B, np.int32)
    status = np.zeros(B, np.int32)
    for b in range(B):
        cache.add_sequence(b)
    flushed = rolled_back = 0
    for step in range(200):
        n = rng.integers(1, STEP + 1, size=B).astype(np.int32)
        indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        tokens = int(indptr[-1])
        k = (2.0 * rng.standard_normal((tokens, HK, D))).astype(np.float32)
        v = rng.standard_normal((tokens, HK, D)).astype(np.float32)
        q = (0.3 * rng.standard_normal((B * STEP, HQ, D))).astype(np.float32)
        for b in range(B):  # a block for each tile the new tokens touch
            first, last = int(kv.seq_lens[b]), int(kv.seq_lens[b]) + int(n[b]) - 1
            for t in range(first // g, last // g + 1):
                if kv.block_table[b, t] < 0:
                    kv.block_table[b, t] = free.pop()
        kv.seq_lens[:] += n
        kvarn.paged_append_tail_run(ctx, config, kv, tail, slots, indptr, k, v,
                                    seq_status=status)
        out, lse = plan.run(kv, q, q_indptr=indptr, return_lse=True, seq_status=status,
                            tail=tail, tail_slots=slots)
        for b in range(B):
            cache.append(b, 0, k[indptr[b]:indptr[b + 1]], v[indptr[b]:indptr[b + 1]],
                         speculative=True)
        ref_out, ref_lse = cache.attention(0, list(range(B)), q[:tokens], q_indptr=indptr,
                                           return_lse=True)
        np.testing.assert_array_equal(out[:tokens], ref_out, err_msg=f"step {step}")
        np.testing.assert_array_equal(lse[:tokens], ref_lse, err_msg=f"step {step}")
        # Verification keeps 1..n tokens; the rest is rolled back by a length change.
        keep = np.array([rng.integers(1, int(x) + 1) for x in n], np.int32)
        rolled_back += int((n - keep).sum())
        committed += keep
        kv.seq_lens[:] = committed
        before = kv.record_tiles.copy()
        flush.run(kv, tail, slots, committed, seq_status=status)
        flushed += int((kv.record_tiles - before).sum())
        assert np.array_equal(kv.record_tiles, committed // g)
        for b in range(B):
            cache.commit(b, int(committed[b]))
            cache.truncate(b, int(committed[b]))
        assert not status.any()
        for b in range(B):  # finished: the slot serves a new request
            if committed[b] >= max_len - STEP:
                free += [int(x) for x in kv.block_table[b] if x >= 0]
                kv.block_table[b] = -1
                kv.seq_lens[b] = kv.record_tiles[b] = committed[b] = 0
                cache.remove_sequence(b)
                cache.add_sequence(b)
    assert flushed > 10 and rolled_back > 50


def test_long_prefill_chunks_fit_a_decode_sized_slot(ctx, config, rng):
    """TailFlushPlan.append_run: prompts prefilled in chunks of up to 200 tokens into slots
    sized for decode (max_step_tokens 1, 64 rows), then decode; against the managed cache."""
    g = config.tile_tokens
    chunk, max_len = 200, 700
    max_blocks = max_len // g + 2
    kv = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=HK, num_record_blocks=B * max_blocks,
                                num_pages=0, batch=B, max_blocks_per_seq=max_blocks)
    tail = kvarn.TailState(ctx, config, num_kv_heads=HK, num_slots=B)  # max_step_tokens 1
    assert tail.slot_bytes == 2 * HK * g * D * 2
    slots = np.array([2, 0, 3, 1], np.int32)
    flush = kvarn.TailFlushPlan(ctx, config, num_kv_heads=HK, batch=B, max_tokens=B * chunk)
    plan = kvarn.AttentionPlan(ctx, config, batch=B, num_kv_heads=HK,
                               max_blocks_per_seq=max_blocks, num_q_heads=HQ,
                               max_q_per_seq=chunk, max_total_q=B * chunk)
    cache = kvarn.Cache(config, num_kv_heads=HK, max_tokens=B * (max_len + g), max_sequences=B,
                        ctx=ctx)
    kv.block_table[:] = -1
    kv.seq_lens[:] = 0
    kv.record_tiles[:] = 0
    free = list(range(B * max_blocks - 1, -1, -1))
    prompt = rng.integers(150, 600, size=B)
    long_chunks = 0
    for b in range(B):
        cache.add_sequence(b)
    for step in range(25):
        left = prompt - kv.seq_lens
        n = np.where(left > 0, np.minimum(left, rng.integers(1, chunk + 1, size=B)), 1)
        n = n.astype(np.int32)
        long_chunks += int((n > g).sum())
        indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        tokens = int(indptr[-1])
        k = (2.0 * rng.standard_normal((tokens, HK, D))).astype(np.float32)
        v = rng.standard_normal((tokens, HK, D)).astype(np.float32)
        q = (0.3 * rng.standard_normal((B * chunk, HQ, D))).astype(np.float32)
        for b in range(B):
            first, last = int(kv.seq_lens[b]), int(kv.seq_lens[b]) + int(n[b]) - 1
            for t in range(first // g, last // g + 1):
                if kv.block_table[b, t] < 0:
                    kv.block_table[b, t] = free.pop()
        kv.seq_lens[:] += n
        committed = kv.seq_lens.copy()  # every token is committed at once
        flush.append_run(kv, tail, slots, indptr, k, v, committed)
        assert np.array_equal(kv.record_tiles, committed // g)
        out, lse = plan.run(kv, q, q_indptr=indptr, return_lse=True, tail=tail,
                            tail_slots=slots)
        for b in range(B):
            cache.append(b, 0, k[indptr[b]:indptr[b + 1]], v[indptr[b]:indptr[b + 1]])
        ref_out, ref_lse = cache.attention(0, list(range(B)), q[:tokens], q_indptr=indptr,
                                           return_lse=True)
        np.testing.assert_array_equal(out[:tokens], ref_out, err_msg=f"step {step}")
        np.testing.assert_array_equal(lse[:tokens], ref_lse, err_msg=f"step {step}")
    assert long_chunks > 5
    with pytest.raises(kvarn.ShapeError, match="max_tokens"):
        big = np.zeros((B * chunk + 1, HK, D), np.float32)
        flush.append_run(kv, tail, slots, np.zeros(B + 1, np.int32), big, big,
                         kv.seq_lens.copy())


def test_int8_rows(ctx, config, rng):
    """row_bits 8: half the slot bytes (int8 rows with an fp16 scale), attention over tail rows
    within the rows' rounding of the fp16 slot's."""
    g = config.tile_tokens
    assert kvarn.tail_state_bytes(config, HK, 1, row_bits=8) == 2 * HK * g * (D + 2)
    outs = []
    n = np.array([5, 63, 1, 30], np.int32)
    indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
    tokens = int(indptr[-1])
    k = (2.0 * rng.standard_normal((tokens, HK, D))).astype(np.float32)
    v = rng.standard_normal((tokens, HK, D)).astype(np.float32)
    q = (0.3 * rng.standard_normal((B * g, HQ, D))).astype(np.float32)
    for bits in (16, 8):
        kv = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=HK, num_record_blocks=B,
                                    num_pages=0, batch=B, max_blocks_per_seq=1)
        kv.block_table[:, 0] = np.arange(B)
        kv.seq_lens[:] = n
        kv.record_tiles[:] = 0
        tail = kvarn.TailState(ctx, config, num_kv_heads=HK, num_slots=B, row_bits=bits)
        assert tail.row_bits == bits and "row_bits" in repr(tail)
        slots = np.arange(B, dtype=np.int32)
        kvarn.paged_append_tail_run(ctx, config, kv, tail, slots, indptr, k, v)
        plan = kvarn.AttentionPlan(ctx, config, batch=B, num_kv_heads=HK, max_blocks_per_seq=1,
                                   num_q_heads=HQ, max_q_per_seq=g, max_total_q=B * g)
        outs.append(plan.run(kv, q, q_indptr=indptr, tail=tail, tail_slots=slots)[:tokens])
    rel = np.linalg.norm(outs[1] - outs[0]) / np.linalg.norm(outs[0])
    assert 0 < rel < 1e-2
    with pytest.raises(kvarn.InvalidArgumentError, match="row_bits"):
        kvarn.tail_state_bytes(config, HK, 1, row_bits=4)


def test_argument_errors(ctx, config):
    with pytest.raises(kvarn.UnsupportedError, match="sink_tiles"):
        kvarn.tail_state_bytes(kvarn.Config.from_preset("k4v2_g64", D), HK)
    with pytest.raises(kvarn.InvalidArgumentError, match="max_step_tokens"):
        kvarn.tail_state_bytes(config, HK, 0)
    kv = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=HK, num_record_blocks=4, num_pages=0,
                                batch=B, max_blocks_per_seq=2)
    tail = kvarn.TailState(ctx, config, num_kv_heads=HK, num_slots=B)
    plan = kvarn.AttentionPlan(ctx, config, batch=B, num_kv_heads=HK, max_blocks_per_seq=2,
                               num_q_heads=HQ)
    q = np.zeros((B, HQ, D), np.float32)
    with pytest.raises(kvarn.InvalidArgumentError, match="give both"):
        plan.run(kv, q, tail=tail)
    with pytest.raises(kvarn.ShapeError, match="tail_slots"):
        plan.run(kv, q, tail=tail, tail_slots=np.zeros(B + 1, np.int32))


@pytest.mark.parametrize("row_bits", [16, 8])
def test_torch_ops_match_the_direct_calls(ctx, config, rng, row_bits):
    """torch.ops.kvarn.paged_append_flush_tail / paged_attention_tail on CPU tensors, eager and
    under torch.compile(fullgraph=True), give bit for bit what the direct calls give: a loop of
    prefill chunks (up to 150 tokens into slots sized for decode) and decode steps."""
    torch = pytest.importorskip("torch")
    from kvarn import torch_ops

    g = config.tile_tokens
    chunk, max_len = 150, 500
    max_blocks = max_len // g + 2
    np_kv = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=HK, num_record_blocks=B * max_blocks,
                                   num_pages=0, batch=B, max_blocks_per_seq=max_blocks)
    np_tail = kvarn.TailState(ctx, config, num_kv_heads=HK, num_slots=B, row_bits=row_bits)
    kvs = [kvarn.PagedKV(*(torch.from_numpy(getattr(np_kv, n).copy()) for n in (
        "records", "k_pages", "v_pages", "block_table", "seq_lens", "record_tiles")))
        for _ in range(2)]
    states = [torch.zeros(B * np_tail.slot_bytes, dtype=torch.uint8) for _ in range(2)]
    tails = [kvarn.TailState.over(ctx, config, s, num_kv_heads=HK, row_bits=row_bits)
             for s in states]
    assert tails[0].num_slots == B and tails[0].slot_bytes == np_tail.slot_bytes
    slots = np.array([1, 3, 0, 2], np.int32)
    flush = kvarn.TailFlushPlan(ctx, config, num_kv_heads=HK, batch=B, max_tokens=B * chunk)
    plan = kvarn.AttentionPlan(ctx, config, batch=B, num_kv_heads=HK,
                               max_blocks_per_seq=max_blocks, num_q_heads=HQ,
                               max_q_per_seq=chunk, max_total_q=B * chunk)

    def step(kv, tail, t_slots, indptr, k, v, committed, q, out, lse):
        torch_ops.paged_append_flush_tail(flush, kv, tail, t_slots, indptr, k, v, committed)
        torch_ops.paged_attention_tail(plan, kv, tail, t_slots, q, out, lse, q_indptr=indptr)

    steps = [step, torch.compile(step, backend="aot_eager", fullgraph=True)]
    for kv in [np_kv] + kvs:
        kv.block_table[:] = -1
        kv.seq_lens[:] = 0
        kv.record_tiles[:] = 0
    free = list(range(B * max_blocks - 1, -1, -1))
    prompt = rng.integers(100, 400, size=B)
    for it in range(14):
        left = prompt - np_kv.seq_lens
        n = np.where(left > 0, np.minimum(left, rng.integers(1, chunk + 1, size=B)), 1)
        n = n.astype(np.int32)
        indptr = np.concatenate([[0], np.cumsum(n)]).astype(np.int32)
        tokens = int(indptr[-1])
        k = (2.0 * rng.standard_normal((B * chunk, HK, D))).astype(np.float32)
        v = rng.standard_normal((B * chunk, HK, D)).astype(np.float32)
        q = (0.3 * rng.standard_normal((B * chunk, HQ, D))).astype(np.float32)
        for b in range(B):
            first, last = int(np_kv.seq_lens[b]), int(np_kv.seq_lens[b]) + int(n[b]) - 1
            for t in range(first // g, last // g + 1):
                if np_kv.block_table[b, t] < 0:
                    np_kv.block_table[b, t] = free.pop()
        np_kv.seq_lens[:] += n
        committed = np_kv.seq_lens.copy()
        flush.append_run(np_kv, np_tail, slots, indptr, k[:tokens], v[:tokens], committed)
        want_out, want_lse = plan.run(np_kv, q, q_indptr=indptr, return_lse=True, tail=np_tail,
                                      tail_slots=slots)
        for kv, tail, fn in zip(kvs, tails, steps):
            kv.block_table.copy_(torch.from_numpy(np_kv.block_table))
            kv.seq_lens.copy_(torch.from_numpy(np_kv.seq_lens))
            out = torch.empty((B * chunk, HQ, D))
            lse = torch.empty((B * chunk, HQ))
            fn(kv, tail, torch.from_numpy(slots), torch.from_numpy(indptr),
               torch.from_numpy(k[:tokens]), torch.from_numpy(v[:tokens]),
               torch.from_numpy(committed), torch.from_numpy(q), out, lse)
            assert np.array_equal(kv.record_tiles.numpy(), np_kv.record_tiles)
            np.testing.assert_array_equal(out.numpy()[:tokens], want_out[:tokens],
                                          err_msg=f"step {it}")
            np.testing.assert_array_equal(lse.numpy()[:tokens], want_lse[:tokens])
            np.testing.assert_array_equal(kv.records.numpy(), np_kv.records)
    assert int(np_kv.record_tiles.sum()) > 4
    kvarn._paged.forget_torch_handle(flush)
