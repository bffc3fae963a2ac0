#!/usr/bin/env python3
"""An engine's decode loop over the capturable paged layer (plan / run), self-checking.

    python examples/python/paged_decode.py [--steps 300] [--device cpu|cuda] [--seed 1]

The engine owns the memory: a page pool of fp16 tiles, a record pool, and per step the metadata
the run calls read from the context's memory (write slots, the flush list and its count, block
table, lengths, record tiles, a per-sequence status array). Each step: append by slot
(kvarn.paged_append_run) -> flush of completed tiles (kvarn.FlushPlan.run) -> table update ->
decode attention (kvarn.AttentionPlan.run). The plan and workspaces are made once.

Four slots: slot 0 one long sequence, slots 1 and 2 sequences that finish and restart, slot 3
padding (no token, length 0: zero output rows, lse -inf). Along the way the engine rolls back the
last 5 tokens of slot 2 while they are in the fp16 tail (a rejected draft; records cannot be
rolled back: a record quantizes a whole tile and its fp16 originals are gone once flushed), and
feeds one NaN key row to slot 1 (its seq_status entry becomes NON_FINITE, the other slots
proceed, the engine drops the token and clears the entry).

CPU (numpy arrays): every step is compared bit for bit with the host-list calls
(Context.paged_attention over the same tables). CUDA (needs torch and a CUDA build of kvarn):
torch tensors, the step is captured once in a torch.cuda.CUDAGraph through the torch custom ops
(torch.ops.kvarn.*) and replayed with new metadata; each replay is compared with the CPU backend
over the same pools. Exits non-zero on a mismatch.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import kvarn

D, HK, HQ, BATCH, MAX_LEN = 128, 2, 8, 4, 320
PADDING_SLOT, ROLLBACK_SLOT, FAULT_SLOT, FAULT_STEP, DRAFT = 3, 2, 1, 200, 5


class Engine:
    """Host scheduler: free lists, lengths, block tables; one token per live slot per step."""

    def __init__(self, config: kvarn.Config) -> None:
        self.g, self.sink = config.tile_tokens, config.sink_tiles
        self.max_blocks = -(-MAX_LEN // self.g)
        self.num_pages = BATCH * (self.sink + 2) + 4
        self.num_blocks = BATCH * self.max_blocks
        self.free_pages = list(range(self.num_pages - 1, -1, -1))
        self.free_blocks = list(range(self.num_blocks - 1, -1, -1))
        self.lens = np.zeros(BATCH, np.int32)
        self.target = np.zeros(BATCH, np.int32)
        self.rtiles = np.zeros(BATCH, np.int32)
        self.table = np.zeros((BATCH, self.max_blocks), np.int32)
        self.spent: list = []

    def release(self, b: int) -> None:
        for t in range(-(-int(self.lens[b]) // self.g)):
            record = self.sink <= t < self.sink + self.rtiles[b]
            (self.free_blocks if record else self.free_pages).append(int(self.table[b, t]))
            self.table[b, t] = 0
        self.lens[b] = self.rtiles[b] = self.target[b] = 0

    def schedule(self, step: int) -> dict:
        g = self.g
        self.free_pages += self.spent
        self.spent = []
        for b in range(BATCH):
            if b == PADDING_SLOT:
                continue
            if self.target[b] > 0 and self.lens[b] >= self.target[b]:
                self.release(b)  # finished
            if self.target[b] == 0 and step % 7 != 0:
                self.target[b] = 100000 if b == 0 else 90 + 40 * b
        m = {
            "token_indptr": np.zeros(BATCH + 1, np.int32),
            "slot_mapping": np.full(BATCH, -1, np.int32),
            "n_flush": np.zeros(1, np.int32),
            "flush_src": np.zeros(BATCH, np.int32),
            "flush_dst": np.zeros(BATCH, np.int32),
            "flush_seq": np.zeros(BATCH, np.int32),
        }
        for b in range(BATCH):
            live = self.target[b] > 0
            m["token_indptr"][b + 1] = m["token_indptr"][b] + live
            if not live:
                continue
            pos = int(self.lens[b])
            if pos % g == 0:
                self.table[b, pos // g] = self.free_pages.pop()
            m["slot_mapping"][m["token_indptr"][b]] = self.table[b, pos // g] * g + pos % g
            self.lens[b] = pos + 1
            tile = pos // g
            if (pos + 1) % g == 0 and tile >= self.sink:  # a tile past the sink completed
                i = int(m["n_flush"][0])
                m["n_flush"][0] += 1
                m["flush_src"][i] = self.table[b, tile]
                m["flush_dst"][i] = self.free_blocks.pop()
                m["flush_seq"][i] = b
                self.spent.append(int(self.table[b, tile]))
                self.table[b, tile] = m["flush_dst"][i]
                self.rtiles[b] += 1
        m["table"], m["lens"], m["rtiles"] = self.table.copy(), self.lens.copy(), self.rtiles.copy()
        return m

    def undo(self, m: dict, b: int) -> None:
        """Sequence b faulted: it kept nothing of the step; forget its token and flush."""
        g = self.g
        for i in range(int(m["n_flush"][0])):
            if m["flush_seq"][i] == b:
                self.table[b, (self.lens[b] - 1) // g] = m["flush_src"][i]
                self.free_blocks.append(int(m["flush_dst"][i]))
                self.spent.remove(int(m["flush_src"][i]))
                self.rtiles[b] -= 1
        self.lens[b] -= 1
        if self.lens[b] % g == 0:  # the token had opened a page
            self.free_pages.append(int(self.table[b, self.lens[b] // g]))
            self.table[b, self.lens[b] // g] = 0

    def rollback(self, b: int, n: int) -> bool:
        """Drops the last n tokens of b if they are all fp16 (the tail past the records)."""
        new_len = int(self.lens[b]) - n
        if new_len < 0 or (self.rtiles[b] > 0 and new_len < (self.sink + self.rtiles[b]) * self.g):
            return False  # would cut a record tile
        g = self.g
        for t in range(-(-new_len // g), -(-int(self.lens[b]) // g)):
            self.free_pages.append(int(self.table[b, t]))
            self.table[b, t] = 0
        self.lens[b] = new_len
        return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if not 1 <= args.steps <= MAX_LEN - 16:
        parser.error(f"--steps: 1..{MAX_LEN - 16}")
    if args.device == "cuda":
        try:
            import torch  # noqa: F401
        except ImportError:
            print("SKIP: --device cuda needs torch")
            return 77  # CTest: SKIP_RETURN_CODE
        if not torch.cuda.is_available() or not any(
            b.name == "cuda" and b.available for b in kvarn.backends()
        ):
            print("SKIP: no CUDA device, or libkvarn built without the CUDA backend")
            return 77
    return run(args)


def run(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    config = kvarn.Config.from_preset("k4v2_g64", D)
    eng = Engine(config)
    cpu = kvarn.Context("cpu")
    cuda = args.device == "cuda"
    if cuda:
        import torch
        from kvarn import torch_ops

        ctx = kvarn.Context("cuda")
        dev = lambda a: torch.from_numpy(np.ascontiguousarray(a)).cuda()  # noqa: E731
    else:
        ctx = cpu
        dev = np.array
    print(f"libkvarn {kvarn.__version__}: paged decode loop on {ctx.backend_name}, "
          f"{args.steps} steps")

    # Pools, tables and per-step arrays in the context's memory, allocated once.
    host = kvarn.PagedKV.allocate(cpu, config, num_kv_heads=HK, num_record_blocks=eng.num_blocks,
                                  num_pages=eng.num_pages, batch=BATCH,
                                  max_blocks_per_seq=eng.max_blocks)
    pool_names = ("records", "k_pages", "v_pages", "block_table", "seq_lens", "record_tiles")
    kv = kvarn.PagedKV(*(dev(getattr(host, n)) for n in pool_names)) if cuda else host
    meta_names = ("token_indptr", "slot_mapping", "n_flush", "flush_src", "flush_dst",
                  "flush_seq")
    meta = {n: dev(np.zeros(BATCH + 1 if n == "token_indptr" else 1 if n == "n_flush" else BATCH,
                            np.int32)) for n in meta_names}
    status = dev(np.zeros(BATCH, np.int32))
    k, v = dev(np.zeros((BATCH, HK, D), np.float32)), dev(np.zeros((BATCH, HK, D), np.float32))
    q = dev(np.zeros((BATCH, HQ, D), np.float32))
    out, lse = dev(np.zeros((BATCH, HQ, D), np.float32)), dev(np.zeros((BATCH, HQ), np.float32))
    like = status if cuda else None
    plan = kvarn.AttentionPlan(ctx, config, batch=BATCH, num_kv_heads=HK,
                               max_blocks_per_seq=eng.max_blocks, num_q_heads=HQ, like=like)
    flush = kvarn.FlushPlan(ctx, config, num_kv_heads=HK, max_tiles=BATCH, like=like)
    cpu_plan = plan if not cuda else kvarn.AttentionPlan(
        cpu, config, batch=BATCH, num_kv_heads=HK, max_blocks_per_seq=eng.max_blocks,
        num_q_heads=HQ)
    print(f"plan: {plan}\nflush workspace: {flush.workspace_bytes} bytes")

    def put(dst, src) -> None:
        if cuda:
            dst.copy_(torch.from_numpy(np.ascontiguousarray(src)))
        else:
            dst[...] = src

    def get(a) -> np.ndarray:
        return a.cpu().numpy() if cuda else np.array(a)

    def step() -> None:
        if cuda:  # the torch custom ops: what a torch.compile'd or graph-captured model calls
            torch_ops.paged_append(flush, kv, meta["token_indptr"], meta["slot_mapping"], k, v,
                                   status)
            torch_ops.paged_flush(flush, kv, meta["n_flush"], meta["flush_src"],
                                  meta["flush_dst"], meta["flush_seq"], status)
            torch_ops.paged_attention(plan, kv, q, out, lse, seq_status=status)
        else:
            kvarn.paged_append_run(ctx, config, kv, meta["token_indptr"], meta["slot_mapping"],
                                   k, v, seq_status=status)
            flush.run(kv, meta["n_flush"], meta["flush_src"], meta["flush_dst"],
                      meta["flush_seq"], seq_status=status)
            plan.run(kv, q, out=out, lse=lse, seq_status=status)

    graph = None
    history: dict = {}
    flushes = padded = 0
    rolled_back = faulted = False
    worst = 0.0
    for i in range(args.steps):
        m = eng.schedule(i)
        kk = (2.0 * rng.standard_normal((BATCH, HK, D))).astype(np.float32)
        vv = rng.standard_normal((BATCH, HK, D)).astype(np.float32)
        qq = (0.3 * rng.standard_normal((BATCH, HQ, D))).astype(np.float32)
        fault = i == FAULT_STEP
        if fault:
            kk[m["token_indptr"][FAULT_SLOT], 0, 7] = np.nan
        for n in meta_names:
            put(meta[n], m[n])
        put(kv.block_table, m["table"])
        put(kv.seq_lens, m["lens"])
        put(kv.record_tiles, m["rtiles"])
        put(k, kk)
        put(v, vv)
        put(q, qq)
        if not cuda:
            step()
        elif graph is None:
            # Warm up on a side stream (a real step), then capture the step once.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            print(f"step {i:3d}: captured append -> flush -> attention in a CUDA graph")
        else:
            graph.replay()  # the same kernels over this step's metadata
        st = get(status)
        want = np.zeros(BATCH, np.int32)
        if fault:
            want[FAULT_SLOT] = kvarn.Status.NON_FINITE
        if not np.array_equal(st, want):
            print(f"FAIL: step {i}: seq_status {st.tolist()}, expected {want.tolist()}")
            return 1
        if fault:
            eng.undo(m, FAULT_SLOT)
            put(status, np.zeros(BATCH, np.int32))  # the engine clears what it has read
            faulted = True
            print(f"step {i:3d}: slot {FAULT_SLOT} got a NaN key: seq_status NON_FINITE, "
                  "its token dropped; the other slots proceeded")
        flushes += int(m["n_flush"][0])

        # Check: the host-list call (CPU) over the same pools and tables.
        o, l = get(out), get(lse)
        if cuda:
            for n in pool_names:
                getattr(host, n)[...] = get(getattr(kv, n))
            ref, ref_lse = cpu_plan.run(host, qq, return_lse=True)
        else:
            ref, ref_lse = cpu.paged_attention(config, host, qq, return_lse=True)
        for b in range(BATCH):
            if fault and b == FAULT_SLOT:
                continue  # unspecified for a faulty sequence
            if m["lens"][b] == 0:
                padded += 1
                if o[b].any() or not np.all(np.isneginf(l[b])):
                    print(f"FAIL: step {i}: padding slot {b}: non-zero rows or finite lse")
                    return 1
                continue
            diff = float(np.max(np.abs(o[b] - ref[b])))
            worst = max(worst, diff)
            exact = np.array_equal(o[b], ref[b]) and np.array_equal(l[b], ref_lse[b])
            if (not cuda and not exact) or (cuda and not diff <= 2e-3):
                print(f"FAIL: step {i} slot {b}: run differs from the reference by {diff:g}")
                return 1
        history[i] = (int(m["lens"][ROLLBACK_SLOT]), qq[ROLLBACK_SLOT].copy(),
                      o[ROLLBACK_SLOT].copy())

        # Rollback: the last DRAFT tokens of slot 2 are rejected (all in the fp16 tail).
        b = ROLLBACK_SLOT
        if (not rolled_back and i >= 150 and 0 < eng.lens[b] < eng.target[b]
                and eng.lens[b] % eng.g > DRAFT and (i - DRAFT) in history):
            old_len, old_q, old_out = history[i - DRAFT]
            if old_len != eng.lens[b] - DRAFT or not eng.rollback(b, DRAFT):
                print("FAIL: rollback bookkeeping")
                return 1
            put(kv.seq_lens, eng.lens)
            put(kv.block_table, eng.table)
            qq[b] = old_q
            put(q, qq)
            o2 = get(plan.run(kv, q, out=out, lse=lse))
            diff = float(np.max(np.abs(o2[b] - old_out)))
            if (not cuda and diff != 0.0) or (cuda and not diff <= 2e-3):
                print(f"FAIL: attention after the rollback differs by {diff:g}")
                return 1
            print(f"step {i:3d}: slot {b} rolled back {DRAFT} tokens to {old_len}: attention "
                  "equals the one at that length")
            rolled_back = True
        if i % 50 == 0:
            print(f"step {i:3d}: lengths {m['lens'].tolist()}, record tiles "
                  f"{m['rtiles'].tolist()}, {flushes} tiles flushed")
    if args.steps >= 250 and not (rolled_back and faulted and flushes >= 4 and padded >= args.steps):
        print(f"FAIL: not everything was exercised (rollback {rolled_back}, fault {faulted}, "
              f"flushes {flushes}, padding rows {padded})")
        return 1
    print(f"OK: {args.steps} steps, {flushes} tiles flushed, {padded} padding rows, "
          f"largest |run - reference| = {worst:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
