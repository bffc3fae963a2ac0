"""Accuracy of the attention variants (issue 25): do sinks, sliding windows and softcap add error
to KVarN's quantized cache?

For a gpt-oss-shaped layer (D64, 8 query heads per KV head, learned sinks, a 128-token window on
every other layer), a Gemma-3-shaped one (D256, window 1024) and a Gemma-2-shaped one (D256,
softcap 50, window 4096, scale 224^-0.5), on the seeded synthetic caches of synthetic.py: the
decode-semantics attention error of the managed cache (a query at position t after appending
tokens 0..t; complete tiles past the sink are records) against float64 attention over the exact
fp16 K/V with the same variant, for the plain causal layer and for each variant on the same cache
and queries. Two errors per row: the mean over (position, head) rows of each row's relative L2
error against the exact-cache attention (what the quantization costs; a sink rescales a row and
leaves this unchanged, a window changes which tiles the row attends to), and the worst row's
relative L2 against float64 attention with the same variant over the cache as stored
(dequantized records, fp16 sink and tail): what the variant's implementation adds.

    PYTHONPATH=<build>/bindings/python:. python -m eval.accuracy.variants
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

import kvarn

from .synthetic import SyntheticParams, generate

POSITIONS = 24  # decode positions evaluated per layer, spread over [2G, T)


@dataclasses.dataclass
class Variant:
    name: str
    sinks: bool = False
    sliding_window: int = 0
    logit_softcap: float = 0.0
    scale: float = 0.0  # 0 = 1/sqrt(D)


@dataclasses.dataclass
class Workload:
    name: str
    params: Optional[SyntheticParams]  # None: the austen-d128 model's own K, V and queries
    variants: List[Variant]


WORKLOADS = [
    Workload(
        "gpt-oss-shaped",
        SyntheticParams(n_layers=2, n_kv_heads=2, q_per_kv=8, n_tokens=4096, head_dim=64),
        [
            Variant("plain"),
            Variant("sinks (full layer)", sinks=True),
            Variant("sinks + window 128", sinks=True, sliding_window=128),
        ],
    ),
    Workload(
        "Gemma-3-shaped",
        SyntheticParams(n_layers=2, n_kv_heads=2, q_per_kv=2, n_tokens=4096, head_dim=256),
        [Variant("plain"), Variant("window 1024", sliding_window=1024)],
    ),
    Workload(
        "austen-d128 (real K/V/Q)",
        None,
        [
            Variant("plain"),
            Variant("sinks (full layer)", sinks=True),
            Variant("sinks + window 256", sinks=True, sliding_window=256),
            Variant("softcap 5 + window 512", logit_softcap=5.0, sliding_window=512),
        ],
    ),
    Workload(
        "Gemma-2-shaped",
        SyntheticParams(n_layers=2, n_kv_heads=2, q_per_kv=2, n_tokens=6144, head_dim=256),
        [
            Variant("plain", scale=224**-0.5),
            Variant(
                "softcap 50 + window 4096", logit_softcap=50.0, sliding_window=4096,
                scale=224**-0.5,
            ),
        ],
    ),
]


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, t: int, var: Variant,
              sinks: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """float64 attention of the queries at position t ([Hq, D]) over k, v [Hk, T, D]."""
    hq, d = q.shape
    hk = k.shape[0]
    scale = var.scale if var.scale > 0 else 1.0 / math.sqrt(d)
    lo = max(0, t - var.sliding_window + 1) if var.sliding_window > 0 else 0
    out = np.zeros((hq, d))
    lse = np.zeros(hq)
    for h in range(hq):
        kh = h // (hq // hk)
        s = scale * (k[kh, lo : t + 1].astype(np.float64) @ q[h].astype(np.float64))
        if var.logit_softcap > 0:
            s = var.logit_softcap * np.tanh(s / var.logit_softcap)
        sink = -math.inf if sinks is None else float(sinks[h])
        m = max(s.max(), sink)
        p = np.exp(s - m)
        den = p.sum() + (0.0 if sinks is None else math.exp(sink - m))
        out[h] = p @ v[kh, lo : t + 1].astype(np.float64) / den
        lse[h] = m + math.log(den)
    return out, lse


def stored(ctx: "kvarn.Context", config: "kvarn.Config", k: np.ndarray,
           v: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """K and V [Hk, T, D] with every complete tile past the sink as its record reconstructs."""
    g, sink = config.tile_tokens, config.sink_tiles
    ks, vs = k.astype(np.float32).copy(), v.astype(np.float32).copy()
    n_tiles = k.shape[1] // g
    if n_tiles > sink:
        sl = slice(sink * g, n_tiles * g)
        hk, d = k.shape[0], k.shape[2]
        # [Hk, tiles, G, D] -> tiles x heads records, each [G, D]
        kt = ks[:, sl].reshape(hk, n_tiles - sink, g, d).transpose(1, 0, 2, 3).reshape(-1, g, d)
        vt = vs[:, sl].reshape(hk, n_tiles - sink, g, d).transpose(1, 0, 2, 3).reshape(-1, g, d)
        kd, vd = ctx.dequantize(ctx.quantize(np.ascontiguousarray(kt), np.ascontiguousarray(vt),
                                             config), config)
        back = lambda x: x.reshape(n_tiles - sink, hk, g, d).transpose(1, 0, 2, 3).reshape(
            hk, -1, d)
        ks[:, sl], vs[:, sl] = back(kd), back(vd)
    return ks, vs


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def run_workload(w: Workload, preset: str,
                 ctx: "kvarn.Context") -> Dict[str, Tuple[float, float, int]]:
    """Per variant: (mean row error against exact attention, worst row error against attention
    over the stored cache, rows left out because their exact output is below fp32's range)."""
    if w.params is None:
        from .report import austen_kv_layers  # the report's loader of tests/data/austen

        layers = austen_kv_layers()
    else:
        layers = generate(w.params, seed=0)
        for layer in layers:
            layer["q_positions"] = np.arange(layer["k"].shape[1])
    hk, n_tokens, d = layers[0]["k"].shape
    hq = layers[0]["q"].shape[0]
    config = kvarn.Config.from_preset(preset, d)
    g = config.tile_tokens
    rng = np.random.default_rng(1)
    rows: Dict[str, List[float]] = {var.name: [] for var in w.variants}
    worst = {var.name: 0.0 for var in w.variants}
    underflow = {var.name: 0 for var in w.variants}
    for layer in layers:
        k, v = layer["k"], layer["v"]  # [Hk, T, D]
        # q [Hq, P, D] at q_positions [P]: the evaluated positions, spread over [2G, T).
        at = {int(t): i for i, t in enumerate(layer["q_positions"])}
        cand = np.array(sorted(t for t in at if t >= 2 * g))
        positions = cand[np.linspace(0, len(cand) - 1, POSITIONS).astype(int)]
        q = layer["q"][:, [at[int(t)] for t in positions]]  # [Hq, POSITIONS, D]
        ks, vs = stored(ctx, config, k, v)
        # A learned sink takes a real share of the probability where it sits among the heads'
        # log-denominators: here at each head's lower-quartile plain lse (+- 1), so it dominates
        # the flatter quarter of the rows. (These synthetic lse span 5..190 per head; a sink more
        # than ~87 above a row's lse underflows that row to zeros in fp32, as in any fp32
        # kernel, which the quartile keeps clear of.)
        plain_lse = np.array([
            reference(q[:, i], k, v, int(t), Variant("plain"), None)[1]
            for i, t in enumerate(positions) if i % 3 == 0
        ])
        sinks = (np.percentile(plain_lse, 25, axis=0) + rng.normal(0, 1, hq)).astype(np.float32)
        cache = kvarn.Cache(config, num_layers=1, num_kv_heads=hk, max_tokens=n_tokens + g,
                            ctx=ctx)
        cache.add_sequence(0)
        appended = 0
        for i, t in enumerate(positions):
            t = int(t)
            cache.append(0, 0, np.ascontiguousarray(k[:, appended : t + 1].transpose(1, 0, 2)),
                         np.ascontiguousarray(v[:, appended : t + 1].transpose(1, 0, 2)))
            appended = t + 1
            qt = np.ascontiguousarray(q[:, i][None])  # [1, Hq, D]
            for var in w.variants:
                s = sinks if var.sinks else None
                got = cache.attention(0, [0], qt, scale=var.scale, sinks=s,
                                      sliding_window=var.sliding_window,
                                      logit_softcap=var.logit_softcap)[0]
                ref, _ = reference(q[:, i], k, v, t, var, s)
                # The stored cache: records only for tiles complete at t (the tail is fp16).
                done = (t + 1) // g * g
                kk = np.concatenate([ks[:, :done], k[:, done:]], axis=1)
                vv = np.concatenate([vs[:, :done], v[:, done:]], axis=1)
                same, _ = reference(q[:, i], kk, vv, t, var, s)
                for h in range(hq):
                    if np.linalg.norm(same[h]) < 1e-30:  # below fp32's range: a zero row
                        underflow[var.name] += 1
                        continue
                    rows[var.name].append(rel(got[h], ref[h]))
                    worst[var.name] = max(worst[var.name], rel(got[h], same[h]))
        cache.close()
    return {name: (float(np.mean(rows[name])), worst[name], underflow[name]) for name in rows}


def main() -> None:
    ctx = kvarn.Context(backend="cpu")
    start = time.time()
    print("| workload | preset | variant | row error vs exact cache | vs plain "
          "| worst row vs stored cache | rows below fp32 range |")
    print("|---|---|---|---|---|---|---|")
    for w in WORKLOADS:
        for preset in ("k4v2_g128", "k4v4_g128"):
            errs = run_workload(w, preset, ctx)
            plain = errs[w.variants[0].name][0]
            for var in w.variants:
                mean, worst, under = errs[var.name]
                print(f"| {w.name} | {preset} | {var.name} | {mean:.4f} | {mean / plain:.2f}x "
                      f"| {worst:.1e} | {under} |")
    print(f"\n{time.time() - start:.0f} s; kvarn {kvarn.__version__}; {POSITIONS} decode positions "
          "per layer (synthetic: 2 layers; austen-d128: 6)")


if __name__ == "__main__":
    main()
