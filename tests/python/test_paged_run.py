"""The capturable layer 2 through the package (kvarn.AttentionPlan, FlushPlan, paged_*_run) and
the torch custom ops (torch.ops.kvarn.*): an engine-style decode loop whose per-step metadata
lives in arrays gives bit for bit what the host-list calls give; padding slots, per-sequence
faults, extend plans, argument errors. CPU here; the torch parts skip without torch, the CUDA
graph part without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn

D = 128
HK = 2
HQ = 6


class Engine:
    """A host scheduler (as tests/support/decode_loop.h): one token per live slot per step,
    sequences finish at a random length and are replaced; an idle slot is padding."""

    def __init__(self, config, batch, rng, min_len=40, max_len=200, idle_prob=0.3):
        self.g, self.sink = config.tile_tokens, config.sink_tiles
        self.batch, self.rng = batch, rng
        self.min_len, self.max_len, self.idle_prob = min_len, max_len, idle_prob
        self.max_blocks = -(-max_len // self.g)
        self.num_pages = batch * (self.sink + 2)
        self.num_blocks = batch * self.max_blocks
        self.free_pages = list(range(self.num_pages - 1, -1, -1))
        self.free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self.lens = np.zeros(batch, np.int32)
        self.target = np.zeros(batch, np.int32)
        self.rtiles = np.zeros(batch, np.int32)
        self.table = np.zeros((batch, self.max_blocks), np.int32)
        self.spent = []
        self.finished = 0
        for b in range(batch):
            self._start(b)

    def _start(self, b):
        self.target[b] = self.rng.integers(self.min_len, self.max_len + 1)
        self.lens[b] = self.rtiles[b] = 0

    def _release(self, b):
        for t in range(-(-int(self.lens[b]) // self.g)):
            record = self.sink <= t < self.sink + self.rtiles[b]
            (self.free_blocks if record else self.free_pages).append(int(self.table[b, t]))
            self.table[b, t] = 0
        self.target[b] = self.lens[b] = self.rtiles[b] = 0

    def next(self):
        B, G = self.batch, self.g
        m = {
            "token_indptr": np.zeros(B + 1, np.int32),
            "slot_mapping": np.full(B, -1, np.int32),
            "n_flush": np.zeros(1, np.int32),
            "flush_src": np.zeros(B, np.int32),
            "flush_dst": np.zeros(B, np.int32),
            "flush_seq": np.zeros(B, np.int32),
        }
        self.free_pages += self.spent
        self.spent = []
        for b in range(B):
            if self.target[b] > 0 and self.lens[b] >= self.target[b]:
                self._release(b)
                self.finished += 1
                if self.rng.random() >= self.idle_prob:
                    self._start(b)
            elif self.target[b] == 0 and self.rng.random() >= self.idle_prob:
                self._start(b)
        m["lens_before"] = self.lens.copy()
        for b in range(B):
            live = self.target[b] > 0
            m["token_indptr"][b + 1] = m["token_indptr"][b] + live
            if not live:
                continue
            pos = int(self.lens[b])
            if pos % G == 0:
                self.table[b, pos // G] = self.free_pages.pop()
            m["slot_mapping"][m["token_indptr"][b]] = self.table[b, pos // G] * G + pos % G
        m["table_before"] = self.table.copy()
        m["rtiles_before"] = self.rtiles.copy()
        for b in range(B):
            if self.target[b] == 0:
                continue
            self.lens[b] += 1
            n, tile = int(self.lens[b]), (int(self.lens[b]) - 1) // G
            if n % G != 0 or tile < self.sink:
                continue
            i = int(m["n_flush"][0])
            m["n_flush"][0] += 1
            m["flush_src"][i] = self.table[b, tile]
            m["flush_dst"][i] = self.free_blocks.pop()
            m["flush_seq"][i] = b
            self.spent.append(int(self.table[b, tile]))
            self.table[b, tile] = m["flush_dst"][i]
            self.rtiles[b] += 1
        m["table"] = self.table.copy()
        m["lens"] = self.lens.copy()
        m["rtiles"] = self.rtiles.copy()
        return m


def allocate(ctx, config, eng):
    return kvarn.PagedKV.allocate(
        ctx,
        config,
        num_kv_heads=HK,
        num_record_blocks=eng.num_blocks,
        num_pages=eng.num_pages,
        batch=eng.batch,
        max_blocks_per_seq=eng.max_blocks,
    )


class Meta:
    """The per-step arrays of the run calls (numpy on the CPU), reused every step."""

    def __init__(self, batch, max_blocks):
        self.token_indptr = np.zeros(batch + 1, np.int32)
        self.slot_mapping = np.zeros(batch, np.int32)
        self.n_flush = np.zeros(1, np.int32)
        self.flush_src = np.zeros(batch, np.int32)
        self.flush_dst = np.zeros(batch, np.int32)
        self.flush_seq = np.zeros(batch, np.int32)
        self.status = np.zeros(batch, np.int32)

    def load(self, m, kv):
        for name in ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst",
                     "flush_seq"):
            getattr(self, name)[:] = m[name]
        kv.block_table[:] = m["table"]
        kv.seq_lens[:] = m["lens"]
        kv.record_tiles[:] = m["rtiles"]


def decode_plan(ctx, config, eng, **kw):
    return kvarn.AttentionPlan(
        ctx,
        config,
        batch=eng.batch,
        num_kv_heads=HK,
        max_blocks_per_seq=eng.max_blocks,
        num_q_heads=HQ,
        **kw,
    )


def host_step(ctx, config, kv, m, k, v, q):
    """The same step through the host-list calls (tokens compacted, no padding rows)."""
    kv.seq_lens[:] = m["lens_before"]
    kv.block_table[:] = m["table_before"]
    kv.record_tiles[:] = m["rtiles_before"]
    n = int(m["token_indptr"][-1])
    ctx.paged_append(config, kv, m["token_indptr"], k[:n], v[:n])
    nf = int(m["n_flush"][0])
    if nf:
        ctx.paged_flush(config, kv, m["flush_src"][:nf], m["flush_dst"][:nf])
    kv.seq_lens[:] = m["lens"]
    kv.block_table[:] = m["table"]
    kv.record_tiles[:] = m["rtiles"]
    return ctx.paged_attention(config, kv, q, return_lse=True)


def draw(rng, batch):
    k = (2.0 * rng.standard_normal((batch, HK, D))).astype(np.float32)
    v = rng.standard_normal((batch, HK, D)).astype(np.float32)
    q = (0.3 * rng.standard_normal((batch, HQ, D))).astype(np.float32)
    return k, v, q


@pytest.fixture
def config():
    return kvarn.Config.from_preset("k4v2_g64", D)


def test_decode_loop_matches_the_host_list_calls(ctx, config, rng):
    eng = Engine(config, 6, rng, min_len=100, max_len=250, idle_prob=0.4)
    kv_run, kv_host = allocate(ctx, config, eng), allocate(ctx, config, eng)
    meta = Meta(eng.batch, eng.max_blocks)
    plan = decode_plan(ctx, config, eng)
    flush = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=eng.batch)
    assert plan.is_decode and plan.rows == eng.batch
    # The plan names its kernel (the CPU's, or a CUDA one on a GPU context).
    assert plan.kernel == "cpu" if ctx.backend_name == "cpu" else plan.kernel.startswith("cuda-")
    assert flush.workspace_bytes > 0 and flush.workspace.nbytes >= flush.workspace_bytes
    workspace = plan.workspace
    out = np.empty((eng.batch, HQ, D), np.float32)
    lse = np.empty((eng.batch, HQ), np.float32)
    flushes = padded = 0
    for step in range(300):
        m = eng.next()
        k, v, q = draw(rng, eng.batch)
        meta.load(m, kv_run)
        kvarn.paged_append_run(
            ctx, config, kv_run, meta.token_indptr, meta.slot_mapping, k, v,
            seq_status=meta.status,
        )
        flush.run(kv_run, meta.n_flush, meta.flush_src, meta.flush_dst, meta.flush_seq,
                  seq_status=meta.status)
        result = kvarn.paged_attention_run(plan, kv_run, q, out=out, lse=lse,
                                           seq_status=meta.status)
        assert result is out
        ref_out, ref_lse = host_step(ctx, config, kv_host, m, k, v, q)
        np.testing.assert_array_equal(out, ref_out, err_msg=f"step {step}")
        np.testing.assert_array_equal(lse, ref_lse, err_msg=f"step {step}")
        assert not meta.status.any()
        for b in np.flatnonzero(m["lens"] == 0):
            padded += 1
            assert not out[b].any() and np.all(np.isneginf(lse[b]))
        flushes += int(m["n_flush"][0])
    assert plan.workspace is workspace  # allocated once
    assert flushes > 3 and padded > 3 and eng.finished > 3
    for name in ("records", "k_pages", "v_pages"):
        np.testing.assert_array_equal(getattr(kv_run, name), getattr(kv_host, name), name)


def test_fused_qkv_views_and_int64_lists_match_the_dense_step(ctx, config, rng):
    # q, k, v as views of one fused qkv projection [B, (HQ + 2 HK) * D] and out as rows of a
    # wider buffer (no copies: the row strides go to the C call), slot_mapping and the flush
    # lists as int64 (vLLM's dtype): bit for bit the dense int32 step; the gap is not written.
    eng = Engine(config, 6, rng, min_len=100, max_len=250, idle_prob=0.3)
    kv_a, kv_b = allocate(ctx, config, eng), allocate(ctx, config, eng)
    meta = Meta(eng.batch, eng.max_blocks)
    plan = decode_plan(ctx, config, eng)
    flush = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=eng.batch)
    B, nq, nk = eng.batch, HQ * D, HK * D
    wide_out = np.full((B, nq + 24), 7.0, np.float32)
    out_view = wide_out[:, :nq].reshape(B, HQ, D)
    assert not out_view.flags.c_contiguous
    flushes = 0
    for step in range(250):
        m = eng.next()
        k, v, q = draw(rng, B)
        meta.load(m, kv_a)
        kvarn.paged_append_run(ctx, config, kv_a, meta.token_indptr, meta.slot_mapping, k, v,
                               seq_status=meta.status)
        flush.run(kv_a, meta.n_flush, meta.flush_src, meta.flush_dst, meta.flush_seq,
                  seq_status=meta.status)
        want = kvarn.paged_attention_run(plan, kv_a, q, seq_status=meta.status)

        qkv = np.concatenate([q.reshape(B, nq), k.reshape(B, nk), v.reshape(B, nk)], axis=1)
        qv = qkv[:, :nq].reshape(B, HQ, D)
        kview = qkv[:, nq:nq + nk].reshape(B, HK, D)
        vview = qkv[:, nq + nk:].reshape(B, HK, D)
        meta.load(m, kv_b)
        kvarn.paged_append_run(ctx, config, kv_b, meta.token_indptr,
                               meta.slot_mapping.astype(np.int64), kview, vview,
                               seq_status=meta.status)
        flush.run(kv_b, meta.n_flush, meta.flush_src.astype(np.int64),
                  meta.flush_dst.astype(np.int64), meta.flush_seq.astype(np.int64),
                  seq_status=meta.status)
        got = kvarn.paged_attention_run(plan, kv_b, qv, out=out_view, seq_status=meta.status)
        assert got is out_view
        np.testing.assert_array_equal(out_view, want, err_msg=f"step {step}")
        assert np.all(wide_out[:, nq:] == 7.0)
        assert not meta.status.any()
        flushes += int(m["n_flush"][0])
    assert flushes > 3
    for name in ("records", "k_pages", "v_pages"):
        np.testing.assert_array_equal(getattr(kv_a, name), getattr(kv_b, name), name)
    # Lists of mixed integer types, and rows that overlap, are refused.
    with pytest.raises(kvarn.DTypeError, match="the same for all"):
        flush.run(kv_b, meta.n_flush, meta.flush_src.astype(np.int64), meta.flush_dst,
                  meta.flush_seq, seq_status=meta.status)
    with pytest.raises(kvarn.LayoutError, match="contiguous"):
        kvarn.paged_attention_run(plan, kv_b, np.zeros((B, HQ, 2 * D), np.float32)[:, :, :D])


def test_functional_flush_reuses_one_workspace_and_outputs_are_allocated(ctx, config, rng):
    eng = Engine(config, 3, rng, min_len=130, max_len=150, idle_prob=0.0)
    kv = allocate(ctx, config, eng)
    meta = Meta(eng.batch, eng.max_blocks)
    plan = decode_plan(ctx, config, eng)
    seen = set()
    for _ in range(135):
        m = eng.next()
        k, v, q = draw(rng, eng.batch)
        meta.load(m, kv)
        kvarn.paged_append_run(ctx, config, kv, meta.token_indptr, meta.slot_mapping, k, v)
        kvarn.paged_flush_run(ctx, config, kv, meta.n_flush, meta.flush_src, meta.flush_dst)
        seen.update(id(p) for p in ctx._kvarn_flush_plans.values())
        out, lse = plan.run(kv, q, return_lse=True)
        assert out.shape == (eng.batch, HQ, D) and out.dtype == np.float32
        assert lse.shape == (eng.batch, HQ) and np.isfinite(lse).all()
    assert len(seen) == 1
    assert kv.record_tiles.sum() >= 3


def test_faults_stay_in_their_sequence(ctx, config, rng):
    eng = Engine(config, 5, rng, min_len=150, max_len=200, idle_prob=0.0)
    kv_a, kv_b = allocate(ctx, config, eng), allocate(ctx, config, eng)
    meta_a, meta_b = Meta(eng.batch, eng.max_blocks), Meta(eng.batch, eng.max_blocks)
    plan = decode_plan(ctx, config, eng)
    flush = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=eng.batch)

    def step(kv, meta, m, k, v, q):
        meta.load(m, kv)
        kvarn.paged_append_run(ctx, config, kv, meta.token_indptr, meta.slot_mapping, k, v,
                               seq_status=meta.status)
        flush.run(kv, meta.n_flush, meta.flush_src, meta.flush_dst, meta.flush_seq,
                  seq_status=meta.status)
        return plan.run(kv, q, return_lse=True, seq_status=meta.status)

    for _ in range(63):  # the next step completes every sequence's first tile past the sink
        m = eng.next()
        k, v, q = draw(rng, eng.batch)
        step(kv_a, meta_a, m, k, v, q)
        step(kv_b, meta_b, m, k, v, q)
    for _ in range(200):
        m = eng.next()
        k, v, q = draw(rng, eng.batch)
        if m["n_flush"][0] >= 1:
            break
        step(kv_a, meta_a, m, k, v, q)
        step(kv_b, meta_b, m, k, v, q)
    assert m["n_flush"][0] >= 1
    flushing = int(m["flush_seq"][0])
    nan_seq = (flushing + 1) % eng.batch
    kbad = k.copy()
    kbad[m["token_indptr"][nan_seq], 1, 3] = np.nan
    out_b, lse_b = step(kv_b, meta_b, m, k, v, q)
    pages_before = kv_a.k_pages.copy()
    records_before = kv_a.records.copy()
    m_bad = dict(m)
    m_bad["flush_dst"] = m["flush_dst"].copy()
    m_bad["flush_dst"][0] = eng.num_blocks + 3  # outside the record pool
    out_a, lse_a = step(kv_a, meta_a, m_bad, kbad, v, q)
    want = np.zeros(eng.batch, np.int32)
    want[nan_seq] = kvarn.Status.NON_FINITE
    want[flushing] = kvarn.Status.INVALID_ARGUMENT
    np.testing.assert_array_equal(meta_a.status, want)
    healthy = want == 0
    np.testing.assert_array_equal(out_a[healthy], out_b[healthy])
    np.testing.assert_array_equal(lse_a[healthy], lse_b[healthy])
    # The NaN sequence's token was not written; the bad flush entry wrote nothing.
    slot = int(m["slot_mapping"][m["token_indptr"][nan_seq]])
    g = config.tile_tokens
    np.testing.assert_array_equal(kv_a.k_pages[slot // g, :, slot % g],
                                  pages_before[slot // g, :, slot % g])
    # Records: only the other sequences' flush entries wrote (the bad entry wrote nothing).
    rec_a, rec_before = kv_a.records.copy(), records_before.copy()
    for i in range(1, int(m["n_flush"][0])):
        rec_a[m["flush_dst"][i]] = rec_before[m["flush_dst"][i]] = 0
    np.testing.assert_array_equal(rec_a, rec_before)


def test_without_a_status_array_a_fault_fails_the_call(ctx, config, rng):
    eng = Engine(config, 3, rng, idle_prob=0.0)
    kv = allocate(ctx, config, eng)
    meta = Meta(eng.batch, eng.max_blocks)
    m = eng.next()
    meta.load(m, kv)
    k, v, _ = draw(rng, eng.batch)
    k[1, 0, 0] = np.inf
    before = kv.k_pages.copy()
    with pytest.raises(kvarn.NonFiniteError):
        kvarn.paged_append_run(ctx, config, kv, meta.token_indptr, meta.slot_mapping, k, v)
    np.testing.assert_array_equal(kv.k_pages, before)
    meta.n_flush[0] = eng.batch + 1
    with pytest.raises(kvarn.InvalidArgumentError, match="n_tiles"):
        kvarn.paged_flush_run(ctx, config, kv, meta.n_flush, meta.flush_src, meta.flush_dst)


def test_extend_plan_matches_the_host_indptr_call(ctx, config, rng):
    lens = [300, 41, 200, 64, 129]
    from test_paged import build  # the host-list cache builder of the layer-2 tests

    kv, _, _, _ = build(ctx, config, rng, lens)
    q_indptr = np.array([0, 40, 41, 60, 60, 97], np.int32)
    max_total_q = 100
    plan = kvarn.AttentionPlan(
        ctx, config, batch=len(lens), num_kv_heads=HK, max_blocks_per_seq=kv.block_table.shape[1],
        num_q_heads=8, max_q_per_seq=40, max_total_q=max_total_q,
    )
    assert not plan.is_decode and plan.rows == max_total_q
    q = (0.3 * rng.standard_normal((max_total_q, 8, D))).astype(np.float32)
    out = np.full((max_total_q, 8, D), 7.0, np.float32)
    plan.run(kv, q, q_indptr=q_indptr, out=out)
    used = int(q_indptr[-1])
    ref = ctx.paged_attention(config, kv, q[:used], q_indptr=q_indptr)
    np.testing.assert_array_equal(out[:used], ref)
    assert np.all(out[used:] == 7.0)
    with pytest.raises(kvarn.InvalidArgumentError, match="q_indptr"):
        plan.run(kv, q)


def test_argument_errors(ctx, config, rng):
    eng = Engine(config, 4, rng)
    kv = allocate(ctx, config, eng)
    meta = Meta(eng.batch, eng.max_blocks)
    plan = decode_plan(ctx, config, eng)
    q = np.zeros((4, HQ, D), np.float32)
    with pytest.raises(kvarn.DTypeError, match="q_dtype"):
        plan.run(kv, q.astype(np.float16))
    with pytest.raises(kvarn.ShapeError):
        plan.run(kv, np.zeros((3, HQ, D), np.float32))
    with pytest.raises(kvarn.InvalidArgumentError, match="decode plan"):
        plan.run(kv, q, q_indptr=np.arange(5, dtype=np.int32))
    with pytest.raises(kvarn.DTypeError):
        plan.run(kv, q, seq_status=np.zeros(4, np.int64))
    with pytest.raises(kvarn.ShapeError):
        plan.run(kv, q, seq_status=np.zeros(5, np.int32))
    other = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=HK, num_record_blocks=4,
                                   num_pages=4, batch=3, max_blocks_per_seq=eng.max_blocks)
    with pytest.raises(kvarn.InvalidArgumentError, match="plan's shape"):
        plan.run(other, q)
    flush = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=4)
    with pytest.raises(kvarn.InvalidArgumentError, match="tile_seqs"):
        flush.run(kv, meta.n_flush, meta.flush_src, meta.flush_dst, seq_status=meta.status)
    with pytest.raises(kvarn.ShapeError):
        flush.run(kv, meta.n_flush, meta.flush_src[:3], meta.flush_dst)
    with pytest.raises(kvarn.ShapeError):
        kvarn.paged_append_run(ctx, config, kv, meta.token_indptr[:4], meta.slot_mapping,
                               np.zeros((4, HK, D), np.float32), np.zeros((4, HK, D), np.float32))
    with pytest.raises(kvarn.InvalidArgumentError):
        kvarn.AttentionPlan(ctx, config, batch=4, num_kv_heads=5, max_blocks_per_seq=4,
                            num_q_heads=HQ)
    # Closing: the plan's handle is gone; closing the context closes its plans.
    plan.close()
    plan.close()
    with pytest.raises(kvarn.InvalidArgumentError, match="closed"):
        plan.run(kv, q)
    with kvarn.Context("cpu", num_threads=1) as c2:
        p2 = decode_plan(c2, config, eng)
        assert "decode" in repr(p2)
    assert p2._handle is None


def test_torch_ops_on_cpu_tensors_match_the_numpy_calls(ctx, config, rng):
    torch = pytest.importorskip("torch")
    from kvarn import torch_ops

    assert kvarn.register_torch_ops()
    assert hasattr(torch.ops.kvarn, "paged_attention")
    eng = Engine(config, 4, rng, min_len=70, max_len=140, idle_prob=0.2)
    kv_np = allocate(ctx, config, eng)
    kv_t = kvarn.PagedKV(*(torch.from_numpy(getattr(allocate(ctx, config, eng), n).copy())
                           for n in ("records", "k_pages", "v_pages", "block_table", "seq_lens",
                                     "record_tiles")))
    meta = Meta(eng.batch, eng.max_blocks)
    t = {n: torch.zeros_like(torch.from_numpy(getattr(meta, n)))
         for n in ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst",
                   "flush_seq", "status")}
    plan_np = decode_plan(ctx, config, eng)
    flush_np = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=eng.batch)
    plan_t = decode_plan(ctx, config, eng)
    flush_t = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=eng.batch)
    h = kvarn.torch_handle(plan_t)
    assert kvarn.torch_handle(plan_t) == h
    out_t = torch.empty((eng.batch, HQ, D))
    lse_t = torch.empty((eng.batch, HQ))

    def step_t(k, v, q):
        torch_ops.paged_append(flush_t, kv_t, t["token_indptr"], t["slot_mapping"], k, v,
                               t["status"])
        torch_ops.paged_flush(flush_t, kv_t, t["n_flush"], t["flush_src"], t["flush_dst"],
                              t["flush_seq"], t["status"])
        torch_ops.paged_attention(plan_t, kv_t, q, out_t, lse_t, seq_status=t["status"])

    compiled = torch.compile(step_t, backend="aot_eager", fullgraph=True)
    for i in range(140):
        m = eng.next()
        k, v, q = draw(rng, eng.batch)
        meta.load(m, kv_np)
        kvarn.paged_append_run(ctx, config, kv_np, meta.token_indptr, meta.slot_mapping, k, v,
                               seq_status=meta.status)
        flush_np.run(kv_np, meta.n_flush, meta.flush_src, meta.flush_dst, meta.flush_seq,
                     seq_status=meta.status)
        out, lse = plan_np.run(kv_np, q, return_lse=True, seq_status=meta.status)
        for n in ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst",
                  "flush_seq"):
            t[n].copy_(torch.from_numpy(m[n]))
        kv_t.block_table.copy_(torch.from_numpy(m["table"]))
        kv_t.seq_lens.copy_(torch.from_numpy(m["lens"]))
        kv_t.record_tiles.copy_(torch.from_numpy(m["rtiles"]))
        fn = compiled if i % 2 else step_t  # eager and compiled steps interleaved
        fn(torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(q))
        np.testing.assert_array_equal(out_t.numpy(), out, err_msg=f"step {i}")
        np.testing.assert_array_equal(lse_t.numpy(), lse, err_msg=f"step {i}")
        assert not t["status"].any()
    for n in ("records", "k_pages", "v_pages"):
        np.testing.assert_array_equal(getattr(kv_t, n).numpy(), getattr(kv_np, n), n)
    plan_t.close()
    with pytest.raises(Exception, match="no open plan"):
        torch.ops.kvarn.paged_attention(h, *(getattr(kv_t, n) for n in (
            "records", "k_pages", "v_pages", "block_table", "seq_lens", "record_tiles")),
            torch.zeros(eng.batch, HQ, D), out_t, None, None, None)


def test_torch_ops_trace_with_fake_tensors(ctx, config, rng):
    torch = pytest.importorskip("torch")
    from kvarn import torch_ops  # noqa: F401

    eng = Engine(config, 2, rng)
    kv = kvarn.PagedKV(*(torch.from_numpy(getattr(allocate(ctx, config, eng), n).copy())
                         for n in ("records", "k_pages", "v_pages", "block_table", "seq_lens",
                                   "record_tiles")))
    plan = decode_plan(ctx, config, eng)
    handle = kvarn.torch_handle(plan)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True)
    def f(q, out):
        torch.ops.kvarn.paged_attention(handle, kv.records, kv.k_pages, kv.v_pages,
                                        kv.block_table, kv.seq_lens, kv.record_tiles, q, out,
                                        None, None, None)
        return out + 1

    out = torch.full((2, HQ, D), 5.0)
    res = f(torch.zeros(2, HQ, D), out)
    assert torch.equal(res, torch.ones(2, HQ, D))  # two padding slots: zero rows
    assert any("kvarn.paged_attention" in str(n.target) for n in graphs[0].graph.nodes)
    torch.library.opcheck(
        torch.ops.kvarn.paged_attention.default,
        (handle, kv.records, kv.k_pages, kv.v_pages, kv.block_table, kv.seq_lens,
         kv.record_tiles, torch.zeros(2, HQ, D), torch.empty(2, HQ, D), torch.empty(2, HQ),
         None, torch.zeros(2, dtype=torch.int32)),
        test_utils=("test_schema", "test_faketensor"),
    )


def _cuda_ready():
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    return any(b.name == "cuda" and b.available for b in kvarn.backends())


@pytest.mark.skipif(not _cuda_ready(), reason="needs torch with CUDA and the kvarn CUDA backend")
def test_cuda_graph_replays_the_step_with_new_metadata(config, rng):
    import torch
    from kvarn import torch_ops

    gpu = kvarn.Context("cuda")
    cpu = kvarn.Context("cpu", num_threads=2)
    eng = Engine(config, 6, rng, min_len=100, max_len=200, idle_prob=0.3)
    names = ("records", "k_pages", "v_pages", "block_table", "seq_lens", "record_tiles")
    kv_cpu = allocate(cpu, config, eng)
    kv_gpu = kvarn.PagedKV(*(torch.from_numpy(getattr(kv_cpu, n).copy()).cuda() for n in names))
    meta = Meta(eng.batch, eng.max_blocks)
    t = {n: torch.from_numpy(getattr(meta, n)).cuda()
         for n in ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst",
                   "flush_seq", "status")}
    like = t["status"]
    plan = decode_plan(gpu, config, eng, like=like)
    flush = kvarn.FlushPlan(gpu, config, num_kv_heads=HK, max_tiles=eng.batch, like=like)
    plan_cpu = decode_plan(cpu, config, eng)
    k = torch.zeros((eng.batch, HK, D), device="cuda")
    v = torch.zeros_like(k)
    q = torch.zeros((eng.batch, HQ, D), device="cuda")
    out = torch.zeros_like(q)
    lse = torch.zeros((eng.batch, HQ), device="cuda")

    def step():
        torch_ops.paged_append(flush, kv_gpu, t["token_indptr"], t["slot_mapping"], k, v,
                               t["status"])
        torch_ops.paged_flush(flush, kv_gpu, t["n_flush"], t["flush_src"], t["flush_dst"],
                              t["flush_seq"], t["status"])
        torch_ops.paged_attention(plan, kv_gpu, q, out, lse, seq_status=t["status"])

    def load(m, kk, vv, qq):
        for n in ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst",
                  "flush_seq"):
            t[n].copy_(torch.from_numpy(m[n]))
        kv_gpu.block_table.copy_(torch.from_numpy(m["table"]))
        kv_gpu.seq_lens.copy_(torch.from_numpy(m["lens"]))
        kv_gpu.record_tiles.copy_(torch.from_numpy(m["rtiles"]))
        k.copy_(torch.from_numpy(kk))
        v.copy_(torch.from_numpy(vv))
        q.copy_(torch.from_numpy(qq))

    graph = torch.cuda.CUDAGraph()
    captured = False
    for i in range(120):
        m = eng.next()
        kk, vv, qq = draw(rng, eng.batch)
        load(m, kk, vv, qq)
        if not captured:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()  # warm-up, also the real step i
            torch.cuda.current_stream().wait_stream(s)
            # Capture writes nothing: the graph's work runs at replay.
            with torch.cuda.graph(graph):
                step()
            captured = True
        else:
            graph.replay()
        torch.cuda.synchronize()
        assert not t["status"].any().item()
        # The CPU oracle over the GPU's pools and tables.
        for n in names:
            getattr(kv_cpu, n)[...] = getattr(kv_gpu, n).cpu().numpy()
        ref, ref_lse = plan_cpu.run(kv_cpu, qq, return_lse=True)
        np.testing.assert_allclose(out.cpu().numpy(), ref, atol=2e-3, rtol=0,
                                   err_msg=f"step {i}")
        live = m["lens"] > 0
        np.testing.assert_allclose(lse.cpu().numpy()[live], ref_lse[live], atol=1e-3)
