"""Where the sink goes in the one-pool memory model (docs/ENGINES.md, issue 23).

KVarN k4v2_g128 on the austen-d128 model, decode semantics (each window a fresh sequence; a
query sees its own tile exact and the complete tiles before it as the cache holds them), three
choices for tile 0 (the attention sink):

- ``fp16 sink``: tile 0 kept in fp16 (sink_tiles 1, today's two-pool model);
- ``no sink``: tile 0 a record at the layer's preset like every other tile (sink_tiles 0; the
  one-pool model's block, 13,824 bytes per KV head);
- ``k8v8 sink``: tile 0 a k8v8_g128 record (34,304 bytes: three k4v2 blocks in a pool of one
  block size).

Metrics against the same model on an fp16 cache (the report's reference): mean KL(fp16 ||
method) in nats with its standard error over 128-position blocks, perplexity ratio, top-1
agreement; the windows are the report's austen-model windows (consecutive 1024-byte windows
of persuasion.txt from offset 0).

    python -m eval.accuracy.sink_study [--windows N]      # default 32, as the report
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Dict, List

import numpy as np

from . import methods as M
from .report import _next_token_stats, austen_windows

G = 128


def variants() -> Dict[str, tuple]:
    """name -> (sink_tiles, hook(layer, k, v)) over k, v [Hk, T, D]."""
    k4v2 = M.get("kvarn:k4v2_g128")
    k8v8 = M.get("kvarn:k8v8_g128")

    def preset(li, k, v):
        return k4v2.roundtrip(k, v)

    def k8v8_sink(li, k, v):
        kq, vq = k4v2.roundtrip(k[..., G:, :], v[..., G:, :])  # tiles 1.. at the preset
        k0, v0 = k8v8.roundtrip(k[..., :G, :], v[..., :G, :])  # tile 0 at k8v8
        return np.concatenate([k0, kq], axis=-2), np.concatenate([v0, vq], axis=-2)

    return {"fp16 sink": (1, preset), "no sink": (0, preset), "k8v8 sink": (0, k8v8_sink)}


def run(n_windows: int) -> Dict[str, Dict[str, float]]:
    from . import austen

    model = austen.load_model()
    fp16 = M.get("fp16")
    names = list(variants())
    acc: Dict[str, Dict[str, List[np.ndarray]]] = {n: {"kl": [], "top1": [], "ce": []}
                                                   for n in ["fp16"] + names}
    t0 = time.time()
    for wi, toks in enumerate(austen_windows(n_windows, 1024)):
        tgt = np.asarray(toks[1:], np.int64)
        ref = model.forward(toks, kv_quantizer=lambda li, k, v: fp16.roundtrip(k, v),
                            tile_tokens=G, sink_tiles=1)[:-1]
        acc["fp16"]["ce"].append(_next_token_stats(ref, ref, tgt)["ce"])
        for name, (sink, hook) in variants().items():
            logits = model.forward(toks, kv_quantizer=hook, tile_tokens=G, sink_tiles=sink)[:-1]
            st = _next_token_stats(ref, logits, tgt)
            for key in ("kl", "top1", "ce"):
                acc[name][key].append(st[key])
        print(f"window {wi + 1}/{n_windows}: {time.time() - t0:.0f}s", file=sys.stderr)
    n_pred = sum(len(x) for x in acc["fp16"]["ce"])
    base = float(np.sum(np.concatenate(acc["fp16"]["ce"])))
    out: Dict[str, Dict[str, float]] = {}
    for name in names:
        a = acc[name]
        blocks = np.array([x[i:i + 128].mean() for x in a["kl"] for i in range(0, len(x), 128)])
        bits = float(np.sum(np.concatenate(a["ce"])))
        out[name] = {
            "kl": float(np.concatenate(a["kl"]).mean()),
            "kl_se": float(blocks.std(ddof=1) / math.sqrt(len(blocks))),
            "ppl_ratio": float(2.0 ** ((bits - base) / n_pred)),
            "top1": float(np.mean(np.concatenate(a["top1"]))),
        }
    out["_"] = {"windows": n_windows, "predictions": n_pred, "seconds": time.time() - t0}
    return out


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--windows", type=int, default=32)
    a = p.parse_args(argv)
    res = run(a.windows)
    meta = res.pop("_")
    print(f"austen-d128, KVarN k4v2_g128, {meta['windows']} windows x 1024 bytes "
          f"({meta['predictions']} predictions, {meta['seconds']:.0f}s)")
    print("| tile 0 (sink) | KL(fp16 || method), nats | perplexity vs fp16 | top-1 agreement |")
    print("|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['kl']:.4f} +- {r['kl_se']:.4f} | {100 * (r['ppl_ratio'] - 1):+.2f}% "
              f"| {r['top1']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
