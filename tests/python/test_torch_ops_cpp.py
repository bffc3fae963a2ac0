"""The C++ torch ops (kvarn.torch_ops_cpp, torch.ops.kvarn_cpp.*): bit for bit what the Python
ops (torch.ops.kvarn.*) and the direct package calls give over an engine-style decode loop
(several shapes, GQA, int32 and int64 lists, a status array with injected faults), under
torch.compile(fullgraph=True), and captured in a CUDA graph (CUDA only). Skips without torch or
without a C++ compiler (the extension is compiled on first use)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import kvarn

torch = pytest.importorskip("torch")

from kvarn import torch_ops as py_ops  # noqa: E402
from kvarn import torch_ops_cpp as cpp_ops  # noqa: E402
from test_paged_run import Engine  # noqa: E402

POOLS = ("records", "k_pages", "v_pages", "block_table", "seq_lens", "record_tiles")
LISTS = ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst", "flush_seq")


@pytest.fixture(scope="module", autouse=True)
def built():
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("no C++ compiler: the C++ ops cannot be built (the Python ops are used)")
    assert cpp_ops.available(), cpp_ops.load_error()


class Setup:
    """One engine and three copies of its paged memory and per-step arrays: numpy for the
    direct calls, torch tensors for the Python ops and for the C++ ops (`device`)."""

    def __init__(self, ctx, config, rng, batch, hk, hq, index, device="cpu", copies=3):
        self.config, self.rng, self.hk, self.hq = config, rng, hk, hq
        self.index, self.device = index, device
        self.eng = Engine(config, batch, rng, min_len=70, max_len=220, idle_prob=0.25)
        e = self.eng
        base = kvarn.PagedKV.allocate(
            kvarn.Context("cpu", num_threads=1) if device != "cpu" else ctx, config,
            num_kv_heads=hk, num_record_blocks=e.num_blocks, num_pages=e.num_pages,
            batch=batch, max_blocks_per_seq=e.max_blocks)
        self.kv = [kvarn.PagedKV(*(torch.from_numpy(getattr(base, n).copy()).to(device)
                                   for n in POOLS)) for _ in range(copies)]
        idx = torch.int64 if index == "int64" else torch.int32
        self.meta = [{n: torch.zeros(batch + 1 if n == "token_indptr" else
                                     1 if n == "n_flush" else batch,
                                     dtype=idx if n in ("slot_mapping", "flush_src", "flush_dst",
                                                        "flush_seq") else torch.int32,
                                     device=device) for n in LISTS + ("status",)}
                     for _ in range(copies)]
        d = config.head_dim
        self.k = torch.zeros((batch, hk, d), device=device)
        self.v = torch.zeros_like(self.k)
        self.q = torch.zeros((batch, hq, d), device=device)
        self.out = [torch.zeros_like(self.q) for _ in range(copies)]
        self.lse = [torch.zeros((batch, hq), device=device) for _ in range(copies)]

    def plans(self, ctx, like=None):
        e = self.eng
        plan = kvarn.AttentionPlan(ctx, self.config, batch=e.batch, num_kv_heads=self.hk,
                                   max_blocks_per_seq=e.max_blocks, num_q_heads=self.hq,
                                   like=like)
        flush = kvarn.FlushPlan(ctx, self.config, num_kv_heads=self.hk, max_tiles=e.batch,
                                like=like)
        return plan, flush

    def next(self, fault=False):
        """The next step's metadata into every copy; fresh k, v, q. With `fault`, a NaN key in
        one sequence and a flush entry outside the record pool (when the step flushes)."""
        m = self.eng.next()
        b, d = self.eng.batch, self.config.head_dim
        k = (2.0 * self.rng.standard_normal((b, self.hk, d))).astype(np.float32)
        v = self.rng.standard_normal((b, self.hk, d)).astype(np.float32)
        q = (0.3 * self.rng.standard_normal((b, self.hq, d))).astype(np.float32)
        if fault:
            live = np.flatnonzero(np.diff(m["token_indptr"]))
            if live.size:
                k[m["token_indptr"][live[0]], 0, 5] = np.nan
            if m["n_flush"][0] >= 1:
                m["flush_dst"] = m["flush_dst"].copy()
                m["flush_dst"][0] = self.eng.num_blocks + 7
        for kv, meta in zip(self.kv, self.meta):
            for n in LISTS:
                meta[n].copy_(torch.from_numpy(m[n]))
            kv.block_table.copy_(torch.from_numpy(m["table"]))
            kv.seq_lens.copy_(torch.from_numpy(m["lens"]))
            kv.record_tiles.copy_(torch.from_numpy(m["rtiles"]))
        for dst, src in ((self.k, k), (self.v, v), (self.q, q)):
            dst.copy_(torch.from_numpy(src))
        return m

    def step(self, ops, i, plan, flush):
        kv, t = self.kv[i], self.meta[i]
        ops.paged_append(flush, kv, t["token_indptr"], t["slot_mapping"], self.k, self.v,
                         t["status"])
        ops.paged_flush(flush, kv, t["n_flush"], t["flush_src"], t["flush_dst"], t["flush_seq"],
                        t["status"])
        ops.paged_attention(plan, kv, self.q, self.out[i], self.lse[i], seq_status=t["status"])

    def direct_step(self, ctx, i, plan, flush):
        """The same step through the package's direct calls on numpy views of copy i."""
        kv = kvarn.PagedKV(*(getattr(self.kv[i], n).numpy() for n in POOLS))
        t = {n: x.numpy() for n, x in self.meta[i].items()}
        kvarn.paged_append_run(ctx, self.config, kv, t["token_indptr"], t["slot_mapping"],
                               self.k.numpy(), self.v.numpy(), seq_status=t["status"])
        flush.run(kv, t["n_flush"], t["flush_src"], t["flush_dst"], t["flush_seq"],
                  seq_status=t["status"])
        plan.run(kv, self.q.numpy(), out=self.out[i].numpy(), lse=self.lse[i].numpy(),
                 seq_status=t["status"])

    def assert_same(self, i, j, what):
        for n in POOLS:
            assert torch.equal(getattr(self.kv[i], n), getattr(self.kv[j], n)), f"{what}: {n}"
        assert torch.equal(self.meta[i]["status"], self.meta[j]["status"]), f"{what}: status"
        live = self.meta[i]["status"] == 0
        assert torch.equal(self.out[i][live], self.out[j][live]), f"{what}: out"
        assert torch.equal(self.lse[i][live], self.lse[j][live]), f"{what}: lse"


@pytest.mark.parametrize("preset,d,batch,hk,hq,index", [
    ("k4v2_g64", 64, 3, 1, 1, "int32"),
    ("k4v2_g64", 128, 5, 2, 6, "int64"),   # GQA 3:1
    ("k4v4_g128", 64, 4, 2, 8, "int32"),   # GQA 4:1
    ("k2v2_g64", 96, 2, 1, 4, "int64"),
])
def test_decode_loop_matches_the_python_ops_and_the_direct_calls(ctx, rng, preset, d, batch,
                                                                  hk, hq, index):
    config = kvarn.Config.from_preset(preset, d)
    s = Setup(ctx, config, rng, batch, hk, hq, index)
    plan, flush = s.plans(ctx)
    steps = 200 if config.tile_tokens == 64 else 300
    faulted = 0
    for i in range(steps):
        fault = i in (steps // 2, steps - 20)
        s.next(fault=fault)
        s.step(cpp_ops, 0, plan, flush)
        s.step(py_ops, 1, plan, flush)
        s.direct_step(ctx, 2, plan, flush)
        s.assert_same(0, 1, f"step {i}: C++ vs Python ops")
        s.assert_same(0, 2, f"step {i}: C++ ops vs direct calls")
        if fault:
            faulted += int(s.meta[0]["status"].ne(0).sum())
        for meta in s.meta:
            meta["status"].zero_()  # the engine clears it after reading it
    assert faulted >= 1
    assert s.eng.finished >= 1


def test_argument_errors_and_lifetimes(rng):
    ctx = kvarn.Context("cpu", num_threads=1)
    config = kvarn.Config.from_preset("k4v2_g64", 64)
    s = Setup(ctx, config, rng, 2, 1, 2, "int32", copies=1)
    plan, flush = s.plans(ctx)
    kv, t = s.kv[0], s.meta[0]
    before = cpp_ops.registered_plans()
    h = cpp_ops.handle(plan)
    assert h == kvarn.torch_handle(plan) and cpp_ops.handle(plan) == h
    hf = cpp_ops.handle(flush)
    assert cpp_ops.registered_plans() == before + 2
    pools = [getattr(kv, n) for n in POOLS]
    op = torch.ops.kvarn_cpp.paged_attention
    with pytest.raises(TypeError, match="not a kvarn.AttentionPlan"):
        op(hf, *pools, s.q, s.out[0], None, None, None)
    with pytest.raises(ValueError, match="dtype"):
        op(h, *pools, s.q.double(), s.out[0], None, None, None)
    with pytest.raises(ValueError, match="shape"):
        op(h, *pools, s.q[:1], s.out[0], None, None, None)
    with pytest.raises(ValueError, match="contiguous"):
        op(h, *pools, s.q, s.out[0].transpose(1, 2).contiguous().transpose(1, 2), None, None,
           None)
    with pytest.raises(ValueError, match="decode plan"):
        op(h, *pools, s.q, s.out[0], None, t["token_indptr"], None)
    with pytest.raises(ValueError, match="tile_seqs"):
        torch.ops.kvarn_cpp.paged_flush(hf, *pools, t["n_flush"], t["flush_src"],
                                        t["flush_dst"], None, t["status"])
    with pytest.raises(ValueError, match="int32 or all int64"):
        torch.ops.kvarn_cpp.paged_flush(hf, *pools, t["n_flush"], t["flush_src"],
                                        t["flush_dst"].long(), None, None)
    # Fused-qkv style views: rows further apart than dense.
    wide = torch.zeros((2, 3, 2, 64))
    q_view = wide[:, 0]
    assert not q_view.is_contiguous()
    op(h, *pools, q_view, s.out[0], None, None, None)
    # Without a status array a data error fails the call.
    s.next()
    k_bad = s.k.clone()
    k_bad[0, 0, 0] = float("inf")
    if int(t["token_indptr"][-1]) and int(t["slot_mapping"][0]) >= 0:
        with pytest.raises(RuntimeError, match="non-finite"):
            cpp_ops.paged_append(flush, kv, t["token_indptr"], t["slot_mapping"], k_bad, s.v)
    # Closing a plan or its context drops the registration before anything is freed.
    plan.close()
    with pytest.raises(ValueError, match="no open plan"):
        op(h, *pools, s.q, s.out[0], None, None, None)
    flush.close()
    assert cpp_ops.registered_plans() == before
    plan2, flush2 = s.plans(ctx)
    cpp_ops.paged_attention(plan2, kv, s.q, s.out[0])
    cpp_ops.handle(flush2)
    assert cpp_ops.registered_plans() == before + 2
    ctx.close()
    assert cpp_ops.registered_plans() == before


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(ctx, rng, backend):
    config = kvarn.Config.from_preset("k4v2_g64", 64)
    s = Setup(ctx, config, rng, 4, 2, 4, "int64", copies=2)
    plan, flush = s.plans(ctx)
    cpp_ops.handle(plan), cpp_ops.handle(flush)  # before tracing

    def step(kv, t, k, v, q, out, lse):
        cpp_ops.paged_append(flush, kv, t["token_indptr"], t["slot_mapping"], k, v, t["status"])
        cpp_ops.paged_flush(flush, kv, t["n_flush"], t["flush_src"], t["flush_dst"],
                            t["flush_seq"], t["status"])
        return cpp_ops.paged_attention(plan, kv, q, out, lse, seq_status=t["status"])

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    for i in range(150):
        s.next(fault=i == 100)
        step(s.kv[0], s.meta[0], s.k, s.v, s.q, s.out[0], s.lse[0])
        compiled(s.kv[1], s.meta[1], s.k, s.v, s.q, s.out[1], s.lse[1])
        s.assert_same(0, 1, f"step {i}: compiled vs eager")
        for meta in s.meta:
            meta["status"].zero_()
    # The fake kernels trace with fake tensors (no data touched).
    torch.library.opcheck(
        torch.ops.kvarn_cpp.paged_attention.default,
        (cpp_ops.handle(plan), *(getattr(s.kv[0], n) for n in POOLS), s.q, s.out[0], s.lse[0],
         None, s.meta[0]["status"]),
        test_utils=("test_schema", "test_faketensor"))


def test_fallback_to_the_python_ops_without_the_extension():
    code = (
        "import numpy as np, torch, kvarn\n"
        "from kvarn import torch_ops_cpp as c\n"
        "assert not c.available() and 'disabled' in c.load_error()\n"
        "ctx = kvarn.Context('cpu')\n"
        "cfg = kvarn.Config.from_preset('k4v2_g64', 64)\n"
        "kv = kvarn.PagedKV.allocate(ctx, cfg, num_kv_heads=1, num_record_blocks=2,\n"
        "                            num_pages=2, batch=2, max_blocks_per_seq=2)\n"
        "kv = kvarn.PagedKV(*(torch.from_numpy(getattr(kv, n)) for n in\n"
        "    ('records','k_pages','v_pages','block_table','seq_lens','record_tiles')))\n"
        "plan = kvarn.AttentionPlan(ctx, cfg, batch=2, num_kv_heads=1, max_blocks_per_seq=2,\n"
        "                           num_q_heads=1)\n"
        "out = c.paged_attention(plan, kv, torch.ones(2, 1, 64), torch.full((2, 1, 64), 3.0))\n"
        "assert torch.equal(out, torch.zeros(2, 1, 64))\n"
        "assert c.handle(plan) == kvarn.torch_handle(plan)\n"
    )
    env = dict(os.environ, KVARN_TORCH_OPS_CPP="0")
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def _cuda_ready():
    if not torch.cuda.is_available():
        return False
    return any(b.name == "cuda" and b.available for b in kvarn.backends())


@pytest.mark.skipif(not _cuda_ready(), reason="needs torch with CUDA and the kvarn CUDA backend")
@pytest.mark.parametrize("index", ["int32", "int64"])
def test_cuda_graph_replay_equals_eager(rng, index):
    gpu = kvarn.Context("cuda")
    config = kvarn.Config.from_preset("k4v2_g64", 128)
    # copies: 0 = C++ ops eager, 1 = Python ops eager, 2 = C++ ops in a CUDA graph
    s = Setup(gpu, config, rng, 6, 2, 6, index, device="cuda")
    plan, flush = s.plans(gpu, like=s.meta[0]["status"])
    cpp_ops.handle(plan), cpp_ops.handle(flush)
    graph = torch.cuda.CUDAGraph()
    for i in range(300):
        s.next(fault=i == 200)
        s.step(cpp_ops, 0, plan, flush)
        s.step(py_ops, 1, plan, flush)
        if i == 0:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                s.step(cpp_ops, 2, plan, flush)  # warm-up, also the real step 0
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph):  # capture runs nothing
                s.step(cpp_ops, 2, plan, flush)
        else:
            graph.replay()
        torch.cuda.synchronize()
        s.assert_same(0, 1, f"step {i}: C++ vs Python ops")
        s.assert_same(0, 2, f"step {i}: replay vs eager")
        if i == 200:
            assert bool(s.meta[0]["status"].any())
        for meta in s.meta:
            meta["status"].zero_()


@pytest.mark.parametrize("device,row_bits", [("cpu", 16), ("cpu", 8), ("cuda", 16)])
def test_tail_state_ops_match_the_python_ops(ctx, rng, device, row_bits):
    """The one-pool model's ops (paged_append_flush_tail, paged_attention_tail): C++ ops, eager
    and under torch.compile(fullgraph), bit for bit the Python ops over prefill chunks of up to
    150 tokens into decode-sized slots, then decode steps; on CPU and CUDA tensors."""
    if device == "cuda":
        if not _cuda_ready():
            pytest.skip("needs torch with CUDA and the kvarn CUDA backend")
        ctx = kvarn.Context("cuda")
    b_, hk, hq, d = 4, 2, 4, 128
    config = kvarn.Config.from_preset("k4v2_g64", d, sink_tiles=0)
    g = config.tile_tokens
    chunk, max_len = 150, 450
    max_blocks = max_len // g + 2
    base = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=hk, num_record_blocks=b_ * max_blocks,
                                  num_pages=0, batch=b_, max_blocks_per_seq=max_blocks)
    kvs = [kvarn.PagedKV(*(torch.from_numpy(getattr(base, n).copy()).to(device) for n in POOLS))
           for _ in range(3)]
    slot_bytes = kvarn.tail_state_bytes(config, hk, 1, row_bits)
    tails = [kvarn.TailState.over(ctx, config,
                                  torch.zeros(b_ * slot_bytes, dtype=torch.uint8, device=device),
                                  num_kv_heads=hk, row_bits=row_bits) for _ in range(3)]
    slots = torch.tensor([2, 0, 3, 1], dtype=torch.int32, device=device)
    flush = kvarn.TailFlushPlan(ctx, config, num_kv_heads=hk, batch=b_, max_tokens=b_ * chunk)
    plan = kvarn.AttentionPlan(ctx, config, batch=b_, num_kv_heads=hk,
                               max_blocks_per_seq=max_blocks, num_q_heads=hq,
                               max_q_per_seq=chunk, max_total_q=b_ * chunk)

    def step(ops, kv, tail, indptr, k, v, committed, q, out, lse):
        ops.paged_append_flush_tail(flush, kv, tail, slots, indptr, k, v, committed)
        ops.paged_attention_tail(plan, kv, tail, slots, q, out, lse, q_indptr=indptr)

    def cpp_step(*a):
        step(cpp_ops, *a)

    runs = [lambda *a: step(py_ops, *a), cpp_step,
            torch.compile(cpp_step, backend="aot_eager", fullgraph=True)]
    for kv in kvs:
        kv.block_table.fill_(-1)
    table = np.full((b_, max_blocks), -1, np.int32)
    lens = np.zeros(b_, np.int32)
    free = list(range(b_ * max_blocks - 1, -1, -1))
    prompt = rng.integers(80, 350, size=b_)
    for it in range(12):
        left = prompt - lens
        n = np.where(left > 0, np.minimum(left, rng.integers(1, chunk + 1, size=b_)), 1)
        n = n.astype(np.int32)
        indptr = torch.from_numpy(np.concatenate([[0], np.cumsum(n)]).astype(np.int32))
        tokens = int(indptr[-1])
        indptr = indptr.to(device)
        k = torch.from_numpy((2.0 * rng.standard_normal((tokens, hk, d))).astype(np.float32))
        v = torch.from_numpy(rng.standard_normal((tokens, hk, d)).astype(np.float32))
        q = torch.from_numpy((0.3 * rng.standard_normal((b_ * chunk, hq, d))).astype(np.float32))
        k, v, q = k.to(device), v.to(device), q.to(device)
        for b in range(b_):
            for t in range(int(lens[b]) // g, (int(lens[b]) + int(n[b]) - 1) // g + 1):
                if table[b, t] < 0:
                    table[b, t] = free.pop()
        lens += n
        committed = torch.from_numpy(lens.copy()).to(device)
        outs = []
        for kv, tail, run in zip(kvs, tails, runs):
            kv.block_table.copy_(torch.from_numpy(table))
            kv.seq_lens.copy_(torch.from_numpy(lens))
            out = torch.empty((b_ * chunk, hq, d), device=device)
            lse = torch.empty((b_ * chunk, hq), device=device)
            run(kv, tail, indptr, k, v, committed, q, out, lse)
            outs.append((out[:tokens], lse[:tokens], kv.record_tiles.clone(), kv.records.clone(),
                         tail.states.clone()))
        for got in outs[1:]:
            for a, b in zip(outs[0], got):
                assert torch.equal(a, b), f"step {it}"
    assert int(kvs[0].record_tiles.sum()) > 4
    with pytest.raises(TypeError, match="TailFlushPlan"):
        cpp_ops.paged_append_flush_tail(plan, kvs[1], tails[1], slots, indptr, k, v, committed)
