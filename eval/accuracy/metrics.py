"""Error metrics of a quantized KV cache against the exact one (numpy only).

- ``rel_mse(x, xq)``: sum (xq - x)^2 / sum x^2 over the whole tensor, in float64.
- ``attention_decode(q, k, v, kq, vq, tile, sink_tiles)``: causal attention of every query
  position with decode semantics, as a decode loop sees the cache: query t sees the exact K/V of
  the sink tiles and of its own tile (the tile being filled) and the quantized K/V of every
  complete tile between them. Returns per (query head, position) squared errors of the output
  against exact attention, and the squared norms of the exact output. GQA: query head h uses
  KV head h // (Hq / Hk).
- ``attention_rel_error(...)``: sqrt(sum err^2 / sum ref^2) over the positions that see at least
  one quantized tile (t >= (sink_tiles + 1) * G).
- ``cache_stats(k, v)``: the outlier structure of a cache (channel and token magnitude spread).
- ``token_error_profile(x, xq)``: how a method spreads its error over tokens of different norm
  (the mechanism that decides between per-token-normalizing and per-channel methods).

Next-token KL, top-1 agreement and bits per token come from the model runner
(``accuracy.llama_np``); ``kl_top1_bits`` here is a numpy fallback with the same definitions.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import numpy as np


def rel_mse(x: np.ndarray, xq: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    d = np.asarray(xq, dtype=np.float64) - x
    return float(np.sum(d * d) / np.sum(x * x))


def attention_decode(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    kq: Optional[np.ndarray],
    vq: Optional[np.ndarray],
    tile: int = 128,
    sink_tiles: int = 1,
    scale: Optional[float] = None,
    ref: Optional[np.ndarray] = None,
    q_stride: int = 1,
    q_positions: Optional[np.ndarray] = None,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """q [Hq, T, D]; k, v, kq, vq [Hk, T, D] (kq/vq None: that tensor exact). Queries at
    positions t with t % q_stride == q_stride - 1 (all of them with q_stride 1), or, with
    `q_positions` (sorted int array [n]), q is [Hq, n, D]: the queries at those positions.

    Returns (err2 [Hq, n], ref2 [Hq, n], positions [n], ref_out [Hq, n, D]); pass ``ref`` (a
    previous call's ref_out for the same inputs) to skip recomputing the exact attention.
    float32 matmuls and a float64 softmax normalisation (relative output error floor ~1e-6)."""
    hq, _, d = q.shape
    hk, t = k.shape[:2]
    group = hq // hk
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q32 = np.asarray(q, np.float32)
    if q_positions is None:
        positions = np.arange(q_stride - 1, t, q_stride)
        q32 = q32[:, positions]
    else:
        positions = np.asarray(q_positions, np.int64)
        assert q32.shape[1] == positions.size
    k32, v32 = np.asarray(k, np.float32), np.asarray(v, np.float32)
    kq32 = k32 if kq is None else np.asarray(kq, np.float32)
    vq32 = v32 if vq is None else np.asarray(vq, np.float32)
    sink = sink_tiles * tile

    def run(quantized: bool) -> np.ndarray:
        out = np.empty((hq, positions.size, d), np.float32)
        for i0 in range(0, t, tile):
            i1 = min(i0 + tile, t)
            sel = np.nonzero((positions >= i0) & (positions < i1))[0]
            if sel.size == 0:
                continue
            pos = positions[sel]
            mask = np.where(np.arange(i1)[None, :] <= pos[:, None], 0.0, -np.inf).astype(
                np.float32)
            lo = min(sink, i0)  # quantized span [lo, i0): complete tiles after the sink
            for h in range(hk):
                if quantized:
                    kk = np.concatenate([k32[h, :lo], kq32[h, lo:i0], k32[h, i0:i1]])
                    vv = np.concatenate([v32[h, :lo], vq32[h, lo:i0], v32[h, i0:i1]])
                else:
                    kk, vv = k32[h, :i1], v32[h, :i1]
                qs = q32[h * group:(h + 1) * group, sel]  # [group, n, D]
                s = (qs @ kk.T) * np.float32(scale) + mask
                s -= s.max(axis=-1, keepdims=True)
                np.exp(s, out=s)
                o = s @ vv
                o /= s.sum(axis=-1, keepdims=True, dtype=np.float64).astype(np.float32)
                out[h * group:(h + 1) * group, sel] = o
        return out

    if ref is None:
        ref = run(False)
    out = run(True)
    diff = (out - ref).astype(np.float64)
    err2 = np.sum(diff * diff, axis=-1)
    r64 = ref.astype(np.float64)
    ref2 = np.sum(r64 * r64, axis=-1)
    return err2, ref2, positions, ref


def attention_rel_error(err2: np.ndarray, ref2: np.ndarray, positions: np.ndarray,
                        tile: int = 128, sink_tiles: int = 1) -> float:
    """Relative output error over the query positions that see at least one quantized tile."""
    sel = positions >= (sink_tiles + 1) * tile
    return float(math.sqrt(err2[:, sel].sum() / ref2[:, sel].sum()))


def attention_error_by_tile(err2: np.ndarray, ref2: np.ndarray, positions: np.ndarray,
                            tile: int = 128) -> np.ndarray:
    """Relative output error of each query tile (all heads pooled): [ceil(T / tile)]."""
    n_tiles = int(positions.max()) // tile + 1
    out = []
    for i in range(n_tiles):
        sel = (positions >= i * tile) & (positions < (i + 1) * tile)
        e = err2[:, sel].sum()
        r = ref2[:, sel].sum()
        out.append(math.sqrt(e / r) if r > 0 else 0.0)
    return np.array(out)


def cache_stats(k: np.ndarray, v: np.ndarray) -> Dict[str, float]:
    """Outlier structure of K/V [Hk, T, D] (one layer), medians over heads of per-head ratios:
    channel RMS max/median, token L2 norm max/median and p99/median over tokens 1..T-1 (token
    0, the attention sink, stays in the fp16 sink tile; its norm / median is reported apart)."""
    out: Dict[str, float] = {}
    for name, x in (("k", k), ("v", v)):
        x = np.asarray(x, np.float64)
        ch = np.sqrt(np.mean(x * x, axis=-2))  # [H, D]
        tok_all = np.linalg.norm(x, axis=-1)  # [H, T]
        tok = tok_all[:, 1:]
        out[f"{name}_token0_over_median"] = float(np.median(tok_all[:, 0] / np.median(tok, -1)))
        out[f"{name}_channel_max_over_median"] = float(
            np.median(ch.max(-1) / np.median(ch, -1)))
        out[f"{name}_token_max_over_median"] = float(np.median(tok.max(-1) / np.median(tok, -1)))
        out[f"{name}_token_max_over_median_worst_head"] = float(
            np.max(tok.max(-1) / np.median(tok, -1)))
        out[f"{name}_token_p99_over_median"] = float(
            np.median(np.percentile(tok, 99, axis=-1) / np.median(tok, -1)))
    return out


def qk_channel_slope(q: np.ndarray, k: np.ndarray) -> float:
    """Median over query heads of the least-squares slope of log(query channel RMS) against
    log(key channel RMS) of its KV head: > 0 when queries are large on K's large channels
    (then per-channel K errors on those channels are amplified in the scores)."""
    hq, hk = q.shape[0], k.shape[0]
    group = hq // hk
    slopes = []
    for h in range(hk):
        kr = np.log(np.sqrt(np.mean(np.asarray(k[h], np.float64) ** 2, axis=0)) + 1e-30)
        for j in range(group):
            qr = np.log(np.sqrt(np.mean(np.asarray(q[h * group + j], np.float64) ** 2, axis=0))
                        + 1e-30)
            slopes.append(float(np.polyfit(kr, qr, 1)[0]))
    return float(np.median(slopes))


def token_error_profile(x: np.ndarray, xq: np.ndarray, top: float = 0.01) -> Dict[str, float]:
    """Per-token relative error ||xq_t - x_t|| / ||x_t|| of x [H, T, D]: its median over all
    tokens, its median over the top `top` fraction of tokens by norm, and the share of the total
    squared error those top tokens carry."""
    x = np.asarray(x, np.float64)
    d = np.asarray(xq, np.float64) - x
    norm = np.linalg.norm(x, axis=-1).ravel()
    err = np.linalg.norm(d, axis=-1).ravel()
    rel = err / np.maximum(norm, 1e-30)
    n_top = max(1, int(round(top * norm.size)))
    idx = np.argsort(norm)[-n_top:]
    return {
        "rel_median_all": float(np.median(rel)),
        "rel_median_top": float(np.median(rel[idx])),
        "err_share_top": float(np.sum(err[idx] ** 2) / max(np.sum(err**2), 1e-300)),
    }


def kl_top1_bits(logits_ref: np.ndarray, logits: np.ndarray,
                 targets: Optional[np.ndarray] = None) -> Dict[str, float]:
    """Mean KL(p_ref || p) in nats, top-1 agreement and (with targets) mean cross-entropy of
    `logits` in bits, over rows of [T, vocab] logits."""
    def logsm(z: np.ndarray) -> np.ndarray:
        z = np.asarray(z, np.float64)
        z = z - z.max(-1, keepdims=True)
        return z - np.log(np.exp(z).sum(-1, keepdims=True))

    lr, lq = logsm(logits_ref), logsm(logits)
    kl = np.sum(np.exp(lr) * (lr - lq), axis=-1)
    out = {"kl": float(kl.mean()),
           "top1": float(np.mean(lr.argmax(-1) == lq.argmax(-1)))}
    if targets is not None:
        out["bits"] = float(-np.mean(lq[np.arange(len(targets)), targets]) / math.log(2))
    return out
