"""Host time per call of the paged run ops: the C++ torch ops (kvarn.torch_ops_cpp,
torch.ops.kvarn_cpp.*) vs the Python torch ops (kvarn.torch_ops, torch.ops.kvarn.*) vs the
package's own calls vs the raw SWIG call (kvarn.capi with the structs made once).

    PYTHONPATH=build/<dir>/bindings/python python3 bench/gpu/torch_ops_host.py [--device cuda]

Tiny shapes that do no work (every slot -1, no flush entry, padding sequences), eager; each call
is timed alone (perf_counter_ns around it) and the table gives the median over --calls calls, in
microseconds. On CUDA this is the time to enqueue (the calls never synchronize); the device is
synchronized every 32 calls outside the timed region so the launch queue never fills.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from typing import Callable, Dict, List

import torch

import kvarn
from kvarn import _arrays as A
from kvarn import _paged, capi
from kvarn import torch_ops as py_ops
from kvarn import torch_ops_cpp as cpp_ops

POOLS = ("records", "k_pages", "v_pages", "block_table", "seq_lens", "record_tiles")


def timed(fn: Callable[[], object], calls: int, cuda: bool) -> float:
    for _ in range(50):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times: List[int] = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
        if cuda and i % 32 == 31:
            torch.cuda.synchronize()
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(times) / 1e3


def setup(device: str, batch: int, hk: int, hq: int, d: int, g: int) -> Dict[str, object]:
    ctx = kvarn.Context("cuda" if device == "cuda" else "cpu", num_threads=1)
    config = kvarn.Config.from_preset(f"k4v2_g{g}", d)
    host = kvarn.PagedKV.allocate(kvarn.Context("cpu", num_threads=1), config, num_kv_heads=hk,
                                  num_record_blocks=2 * batch, num_pages=2 * batch, batch=batch,
                                  max_blocks_per_seq=2)
    kv = kvarn.PagedKV(*(torch.from_numpy(getattr(host, n).copy()).to(device) for n in POOLS))

    def i32(n: int, fill: int = 0) -> torch.Tensor:
        return torch.full((n,), fill, dtype=torch.int32, device=device)

    s = {
        "ctx": ctx, "config": config, "kv": kv,
        "token_indptr": i32(batch + 1), "slot_mapping": i32(batch, -1),
        "n_tiles": i32(1), "src": i32(batch), "dst": i32(batch), "seqs": i32(batch),
        "status": i32(batch),
        "k": torch.zeros((batch, hk, d), device=device),
        "q": torch.zeros((batch, hq, d), device=device),
        "lse": torch.zeros((batch, hq), device=device),
    }
    s["v"] = torch.zeros_like(s["k"])
    s["out"] = torch.zeros_like(s["q"])
    like = s["status"]
    s["plan"] = kvarn.AttentionPlan(ctx, config, batch=batch, num_kv_heads=hk,
                                    max_blocks_per_seq=2, num_q_heads=hq, like=like)
    s["flush"] = kvarn.FlushPlan(ctx, config, num_kv_heads=hk, max_tiles=batch, like=like)
    return s


def raw_swig(s: Dict[str, object], device: str) -> Dict[str, Callable[[], object]]:
    """The SWIG calls alone: structs, addresses and the launch made once, no checks."""
    ctx, config, kv, plan, flush = s["ctx"], s["config"], s["kv"], s["plan"], s["flush"]
    dl = -1 if device == "cuda" else 0
    c_kv, keep = kv._c(ctx, config, dl)
    stream = int(torch.cuda.current_stream().cuda_stream) if device == "cuda" else 0
    addr = {n: A.take(s[n], n, ctx._device, dl, row_strided=True).address
            for n in ("token_indptr", "slot_mapping", "n_tiles", "src", "dst", "seqs", "status",
                      "k", "v", "q", "out", "lse")}
    launch = _paged._launch(stream, addr["status"], 0, 0)
    launch_flush = _paged._launch(stream, addr["status"], flush._ws_address, flush.workspace_bytes)
    launch_attn = _paged._launch(stream, addr["status"], plan._ws_address, plan.workspace_bytes)
    h_ctx, h_plan, c_config = ctx._h(), plan._h(), config._c()
    batch = int(s["src"].shape[0])
    f32 = A.KIND_TO_CODE["f32"]
    s["_keep"] = keep
    return {
        "append": lambda: capi.paged_append_run(h_ctx, c_config, c_kv, launch,
                                                addr["token_indptr"], addr["slot_mapping"],
                                                batch, f32, addr["k"], addr["v"]),
        "flush": lambda: capi.paged_flush_run(h_ctx, c_config, c_kv, launch_flush, batch,
                                              addr["n_tiles"], addr["src"], addr["dst"],
                                              addr["seqs"]),
        "attention": lambda: capi.paged_attention_run(h_ctx, h_plan, c_kv, launch_attn, 0,
                                                      addr["q"], addr["out"], addr["lse"]),
    }


def run(device: str, calls: int, shape: Dict[str, int]) -> Dict[str, Dict[str, float]]:
    s = setup(device, **shape)
    kv, plan, flush = s["kv"], s["plan"], s["flush"]
    cuda = device == "cuda"
    pools = tuple(getattr(kv, n) for n in POOLS)
    rows: Dict[str, Dict[str, float]] = {"append": {}, "flush": {}, "attention": {}}

    def helpers(mod) -> Dict[str, Callable[[], object]]:
        return {
            "append": lambda: mod.paged_append(flush, kv, s["token_indptr"], s["slot_mapping"],
                                               s["k"], s["v"], s["status"]),
            "flush": lambda: mod.paged_flush(flush, kv, s["n_tiles"], s["src"], s["dst"],
                                             s["seqs"], s["status"]),
            "attention": lambda: mod.paged_attention(plan, kv, s["q"], s["out"], s["lse"],
                                                     seq_status=s["status"]),
        }

    def ops(ns, h_flush: int, h_plan: int) -> Dict[str, Callable[[], object]]:
        a, f, t = ns.paged_append.default, ns.paged_flush.default, ns.paged_attention.default
        return {
            "append": lambda: a(h_flush, *pools, s["token_indptr"], s["slot_mapping"], s["k"],
                                s["v"], s["status"]),
            "flush": lambda: f(h_flush, *pools, s["n_tiles"], s["src"], s["dst"], s["seqs"],
                               s["status"]),
            "attention": lambda: t(h_plan, *pools, s["q"], s["out"], s["lse"], None,
                                   s["status"]),
        }

    ctx, config = s["ctx"], s["config"]
    package = {
        "append": lambda: kvarn.paged_append_run(ctx, config, kv, s["token_indptr"],
                                                 s["slot_mapping"], s["k"], s["v"],
                                                 seq_status=s["status"]),
        "flush": lambda: flush.run(kv, s["n_tiles"], s["src"], s["dst"], s["seqs"],
                                   seq_status=s["status"]),
        "attention": lambda: plan.run(kv, s["q"], out=s["out"], lse=s["lse"],
                                      seq_status=s["status"]),
    }
    columns = {}
    if cpp_ops.available():
        columns["C++ op (helper)"] = helpers(cpp_ops)
        columns["C++ op (OpOverload)"] = ops(torch.ops.kvarn_cpp, cpp_ops.handle(flush),
                                             cpp_ops.handle(plan))
    columns["Python op (helper)"] = helpers(py_ops)
    columns["Python op (OpOverload)"] = ops(torch.ops.kvarn, kvarn.torch_handle(flush),
                                            kvarn.torch_handle(plan))
    columns["package call"] = package
    columns["raw SWIG call"] = raw_swig(s, device)
    for column, fns in columns.items():
        for op, fn in fns.items():
            rows[op][column] = timed(fn, calls, cuda)
    if int(s["status"].abs().sum()) != 0:
        raise RuntimeError(f"a call faulted: status {s['status'].tolist()}")
    return rows


def run_tail(calls: int, shape: Dict[str, int]) -> Dict[str, Dict[str, float]]:
    """The one-pool model's ops (paged_append_flush_tail, paged_attention_tail) on CPU tensors
    (the append-flush call is CPU only so far): C++ vs Python op helpers, no work (no tokens,
    empty sequences)."""
    batch, hk, hq, d, g = (shape[n] for n in ("batch", "hk", "hq", "d", "g"))
    ctx = kvarn.Context("cpu", num_threads=1)
    config = kvarn.Config.from_preset(f"k4v2_g{g}", d, sink_tiles=0)
    host = kvarn.PagedKV.allocate(ctx, config, num_kv_heads=hk, num_record_blocks=2 * batch,
                                  num_pages=0, batch=batch, max_blocks_per_seq=2)
    kv = kvarn.PagedKV(*(torch.from_numpy(getattr(host, n).copy()) for n in POOLS))
    tail = kvarn.TailState.over(
        ctx, config, torch.zeros(batch * kvarn.tail_state_bytes(config, hk), dtype=torch.uint8),
        num_kv_heads=hk)
    slots = torch.arange(batch, dtype=torch.int32)
    indptr = torch.zeros(batch + 1, dtype=torch.int32)
    committed = torch.zeros(batch, dtype=torch.int32)
    k = torch.zeros((batch, hk, d))
    q, out = torch.zeros((batch, hq, d)), torch.zeros((batch, hq, d))
    flush = kvarn.TailFlushPlan(ctx, config, num_kv_heads=hk, batch=batch, max_tokens=batch)
    plan = kvarn.AttentionPlan(ctx, config, batch=batch, num_kv_heads=hk, max_blocks_per_seq=2,
                               num_q_heads=hq, like=slots)
    rows: Dict[str, Dict[str, float]] = {"append_flush_tail": {}, "attention_tail": {}}
    mods = {"C++ op (helper)": cpp_ops} if cpp_ops.available() else {}
    mods["Python op (helper)"] = py_ops
    for column, mod in mods.items():
        rows["append_flush_tail"][column] = timed(
            lambda: mod.paged_append_flush_tail(flush, kv, tail, slots, indptr, k, k, committed),
            calls, False)
        rows["attention_tail"][column] = timed(
            lambda: mod.paged_attention_tail(plan, kv, tail, slots, q, out), calls, False)
    return rows


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda", "both"), default="both")
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if args.device == "both" else [args.device]
    if "cuda" in devices and not torch.cuda.is_available():
        if args.device == "cuda":
            raise SystemExit("torch sees no CUDA device")
        devices.remove("cuda")
    shape = {"batch": 2, "hk": 1, "hq": 2, "d": 64, "g": 64}
    print(f"torch {torch.__version__}, kvarn {kvarn.__version__}, python "
          f"{platform.python_version()}, CPU {cpu_model()}")
    if not cpp_ops.available():
        print(f"C++ ops not available: {cpp_ops.load_error()}")
    for device in devices:
        name = torch.cuda.get_device_name() if device == "cuda" else "CPU tensors"
        rows = run(device, args.calls, shape)
        cols = list(next(iter(rows.values())).keys())
        print(f"\n### {name}: host us per call, median of {args.calls} (batch {shape['batch']}, "
              f"Hk {shape['hk']}, Hq {shape['hq']}, D {shape['d']}, G {shape['g']}, no work)\n")
        print("| op | " + " | ".join(cols) + " |")
        print("|---|" + "---:|" * len(cols))
        for op, vals in rows.items():
            print(f"| {op} | " + " | ".join(f"{vals[c]:.1f}" for c in cols) + " |")
    rows = run_tail(args.calls, shape)
    cols = list(next(iter(rows.values())).keys())
    print(f"\n### one-pool model ops, CPU tensors: host us per call, median of {args.calls} "
          f"(same shape, no work)\n")
    print("| op | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for op, vals in rows.items():
        print(f"| {op} | " + " | ".join(f"{vals[c]:.1f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
