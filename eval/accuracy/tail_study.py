"""The tail slot's row format in the one-pool memory model (docs/ENGINES.md, issue 23).

KVarN k4v2_g128 on the austen-d128 model, no sink (every tile a record, the one-pool default),
decode semantics (each window a fresh sequence; a query sees its own tile as the tail slot holds
it and the complete tiles before it as records quantized from those rows). Two row formats for
the tail slot (kvarn_tail_state_t.row_bits):

- ``fp16 rows``: the cache-frame row rounded to fp16 (row_bits 16);
- ``int8 rows``: that fp16 row as int8 codes with an fp16 scale (row_bits 8; the format of
  kvarn_experimental.h: scale = fp16(max |r| / 127), codes = rint(r / scale)), so both the
  query's own tile and the records flushed from the slot see the int8 values.

The rows are rotated with the library (kvarn.rotate, its own inverse) and rounded as the CPU
backend does. Metrics against the model on an fp16 cache (sink_study's reference): mean KL in
nats with its standard error over 128-position blocks, perplexity ratio, top-1 agreement.

    python -m eval.accuracy.tail_study [--windows N]      # default 32, as the report
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


def _cache_frame_fp16(x: np.ndarray) -> np.ndarray:
    import kvarn

    return np.asarray(kvarn.rotate(np.ascontiguousarray(x, np.float32))).astype(np.float16)


def _from_cache_frame(r: np.ndarray) -> np.ndarray:
    import kvarn

    return np.asarray(kvarn.rotate(np.ascontiguousarray(r.astype(np.float32))), np.float32)


def fp16_rows(li, k, v):
    return _from_cache_frame(_cache_frame_fp16(k)), _from_cache_frame(_cache_frame_fp16(v))


def int8_round_trip(r16: np.ndarray) -> np.ndarray:
    """The int8 row format applied to fp16 rows [..., D] (kvarn_experimental.h), back as fp16."""
    r = r16.astype(np.float32)
    scale = (np.abs(r).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float16)
    s = scale.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(s > 0, np.clip(np.rint(r / s), -127, 127), 0).astype(np.float32)
    return (codes * s).astype(np.float16)


def int8_rows(li, k, v):
    return (_from_cache_frame(int8_round_trip(_cache_frame_fp16(k))),
            _from_cache_frame(int8_round_trip(_cache_frame_fp16(v))))


def run(n_windows: int) -> Dict[str, Dict[str, float]]:
    from . import austen

    model = austen.load_model()
    fp16 = M.get("fp16")
    k4v2 = M.get("kvarn:k4v2_g128")
    variants = {"fp16 rows": fp16_rows, "int8 rows": int8_rows}
    acc: Dict[str, Dict[str, List[np.ndarray]]] = {n: {"kl": [], "top1": [], "ce": []}
                                                   for n in ["fp16"] + list(variants)}
    t0 = time.time()
    for wi, toks in enumerate(austen_windows(n_windows, 1024)):
        tgt = np.asarray(toks[1:], np.int64)
        ref = model.forward(toks, kv_quantizer=lambda li, k, v: fp16.roundtrip(k, v),
                            tile_tokens=G, sink_tiles=1)[:-1]
        acc["fp16"]["ce"].append(_next_token_stats(ref, ref, tgt)["ce"])
        for name, tail in variants.items():
            logits = model.forward(toks, kv_quantizer=lambda li, k, v: k4v2.roundtrip(k, v),
                                   tile_tokens=G, sink_tiles=0, tail_quantizer=tail)[:-1]
            st = _next_token_stats(ref, logits, tgt)
            for key in ("kl", "top1", "ce"):
                acc[name][key].append(st[key])
        print(f"window {wi + 1}/{n_windows}: {time.time() - t0:.0f}s", file=sys.stderr)
    n_pred = sum(len(x) for x in acc["fp16"]["ce"])
    base = float(np.sum(np.concatenate(acc["fp16"]["ce"])))
    out: Dict[str, Dict[str, float]] = {}
    for name in variants:
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
    print(f"austen-d128, KVarN k4v2_g128, no sink, {meta['windows']} windows x 1024 bytes "
          f"({meta['predictions']} predictions, {meta['seconds']:.0f}s)")
    print("| tail slot rows | KL(fp16 || method), nats | perplexity vs fp16 | top-1 agreement |")
    print("|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['kl']:.4f} +- {r['kl_se']:.4f} | {100 * (r['ppl_ratio'] - 1):+.2f}% "
              f"| {r['top1']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
