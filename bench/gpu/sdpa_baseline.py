"""fp16 baselines for the CUDA attention benchmark: PyTorch scaled_dot_product_attention with
each backend it offers (flash, cuDNN, memory-efficient) on the target shapes of bench/RESULTS.md,
in the same run as bench_cuda_attention. Decode: q [B, 32, 1, 128] over K/V [B, 8, ctx, 128] fp16, enable_gqa.
Extend: 2048 new queries over 32768 + 2048 keys, causal aligned to the end (lower right).

    python3 bench/gpu/sdpa_baseline.py [--quick] [--csv FILE] [--head-dim D] [--heads HQ HK]
                                       [--decode-grid] [--graph] [--window W]

The same shape options as bench_cuda_attention (--preset is accepted and ignored: fp16 has none).
--decode-grid: decode at batch 1, 8, 32 over 1k, 4k, 32k and 128k tokens. --graph: time replays
of a CUDA graph of the call (decode), as an engine runs it, instead of eager calls.
--window W: a sliding-window layer's fp16 cost, attention over the last W + nq - 1 keys (what a
windowed flash kernel reads; decode exact, extend with the causal mask over them), to compare with
bench_cuda_attention --window W. Sinks and softcap add no reads and are not modelled.
"""
import argparse
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def time_ms(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    runs = []
    for _ in range(5):
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / iters)
    runs.sort()
    return runs[len(runs) // 2]


def graphed(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream); returns its replay."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv")
    ap.add_argument("--preset", default="k4v2_g128")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, nargs=2, default=(32, 8), metavar=("HQ", "HK"))
    ap.add_argument("--decode-grid", action="store_true")
    ap.add_argument("--graph", action="store_true")
    ap.add_argument("--window", type=int, default=0)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)  # "kernel not used because"
    torch.manual_seed(0)
    (hq, hk), d = a.heads, a.head_dim
    rows = []
    shapes = [(b, c, 1) for b in (1, 8, 32) for c in (4096, 32768, 131072)
              if not (a.quick and c > 32768)]
    shapes.append((1, 32768 + 2048, 2048))
    shapes.append((8, 8192 + 512, 512))
    if a.decode_grid:
        shapes = [(b, c, 1) for b in (1, 8, 32) for c in (1024, 4096, 32768, 131072)]
    print(f"{'batch':>6} {'ctx':>7} {'nq':>5} " + " ".join(f"{n:>10}" for n in BACKENDS))
    for b, c, nq in shapes:
        q = torch.randn(b, hq, nq, d, device="cuda", dtype=torch.float16)
        keys = min(c, a.window + nq - 1) if a.window > 0 else c  # the keys the layer reads
        k = torch.randn(b, hk, keys, d, device="cuda", dtype=torch.float16)
        v = torch.randn(b, hk, keys, d, device="cuda", dtype=torch.float16)
        mask = None
        if nq > 1:
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(nq, keys)
        cells = []
        for name, be in BACKENDS.items():
            try:
                kk, vv = k, v
                if name == "efficient" and d > 256 and hq != hk:
                    # Head dims above 256 have only this backend, which takes no GQA: the
                    # engine's way, K/V repeated per query head (may not fit: then nan).
                    kk = k.repeat_interleave(hq // hk, dim=1)
                    vv = v.repeat_interleave(hq // hk, dim=1)
                with sdpa_kernel([be]):
                    fn = lambda: F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask,
                                                                enable_gqa=kk.shape[1] != hq)
                    if a.graph:
                        fn = graphed(fn)
                    ms = time_ms(fn, 20 if b * c >= (1 << 20) else 100)
            except Exception as e:  # a backend that does not take this shape
                print(f"  {name} b={b} ctx={c}: {type(e).__name__}: {str(e)[:120]}",
                      file=sys.stderr)
                ms = float("nan")
            kk = vv = None
            torch.cuda.empty_cache()
            cells.append(ms)
            rows.append((b, c, nq, name, ms))
        print(f"{b:>6} {c:>7} {nq:>5} " + " ".join(f"{x:>10.4f}" for x in cells))
        del q, k, v
        torch.cuda.empty_cache()
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("D,hq,hk,batch,ctx,nq,backend,ms\n")
            for r in rows:
                f.write(",".join(str(x) for x in (d, hq, hk) + tuple(r)) + "\n")


if __name__ == "__main__":
    main()
