"""A seeded synthetic KV cache with the structure of large models' caches.

    from eval.accuracy.synthetic import SyntheticParams, generate
    layers = generate(SyntheticParams(n_layers=4, n_tokens=2048), seed=0)
    # -> list of dicts {"q": [Hq,T,D], "k": [Hk,T,D], "v": [Hk,T,D]} float32 (fp16-representable)

What it models (each item is a parameter of SyntheticParams, defaults in brackets):

- **Outlier channels in K** (`n_outlier_pairs` [2] RoPE pairs = 4 channels, each 10-30x the
  median channel, `outlier_scale` [(10, 30)]). As in Llama-family models they sit in
  low-frequency RoPE pairs (pair index in the upper half of 0..D/2) and carry a consistent sign
  (a mean of `outlier_mean` [1.0] standard deviations) before RoPE, so they look like a large,
  slowly rotating bias.
- **Channel spread** of the other channels: log-normal with sigma `channel_sigma` [0.3] (K and V).
- **RoPE-like paired channels**: K and Q are built pre-RoPE and rotated with the rotate-half
  pairing (channel i pairs with i + D/2), angle = pos * `rope_theta` [10000] ^ (-2i/D).
- **Per-token magnitude spread**: every token's K and V are scaled by log-normal factors with
  sigma `token_sigma` [0.35]; a fraction `rare_token_prob` [0.005] of tokens (the "bad token
  scales") are scaled by a further factor drawn uniformly from `rare_token_scale` [(10, 50)],
  in K and V alike (independent draws of the factor, the same tokens); `rare_tokens_in_k`
  [True] False keeps them in V only (the K of such a token then has an ordinary norm).
- **Attention sink**: token 0 has a key along the queries' mean direction, so it draws
  `sink_score` [4.0] score standard deviations above the others, and a small value
  (`sink_value_scale` [0.1] of a typical token's).
- **Queries correlated with keys**: keys and queries share a per-token latent that follows an
  AR(1) process across positions (`latent_corr` [0.97]), so a query resembles the keys of recent
  tokens; each query head mixes the latent through its own random near-identity map with
  correlation `qk_corr` [0.6] and adds a mean direction (shared with the sink key). A query's
  channel c is scaled by K's channel scale to the power `q_channel_exponent` [0.5]: queries are
  larger where keys are larger, as measured on both real models of the report (the slope of
  log query-channel RMS against log key-channel RMS is 0.5-0.7 on austen-d128 and about 0.5 on
  SmolLM2-135M; see docs/ACCURACY.md). Queries are then rescaled per head so the standard
  deviation of their scaled scores 1/sqrt(D) q.k over the typical keys (not the sink, not the
  rare tokens) is `score_std` [2.0]; a rare token's key is 10-50x larger, so its score is too
  (such tokens draw much of the attention of the queries they align with).

Values are rounded to fp16 (a cache holds fp16). Everything derives from `seed` (numpy PCG64):
the same seed and parameters give the same arrays, up to the summation order of the BLAS in two
float64 matmuls (invisible after the fp16 rounding in practice; the guard's 2% margin covers it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Tuple

import numpy as np


@dataclasses.dataclass(frozen=True)
class SyntheticParams:
    n_layers: int = 4
    n_kv_heads: int = 2
    q_per_kv: int = 4
    n_tokens: int = 2048
    head_dim: int = 128
    rope_theta: float = 10000.0
    n_outlier_pairs: int = 2
    outlier_scale: Tuple[float, float] = (10.0, 30.0)
    outlier_mean: float = 1.0
    channel_sigma: float = 0.3
    token_sigma: float = 0.35
    rare_token_prob: float = 0.005
    rare_token_scale: Tuple[float, float] = (10.0, 50.0)
    rare_tokens_in_k: bool = True
    sink_score: float = 4.0
    sink_value_scale: float = 0.1
    latent_corr: float = 0.97
    qk_corr: float = 0.6
    q_channel_exponent: float = 0.5
    score_std: float = 2.0

    def describe(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))


def rope(x: np.ndarray, theta: float, positions: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of x [..., T, D] (channel i pairs with i + D/2)."""
    d = x.shape[-1]
    half = d // 2
    inv = theta ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _ar1(rng: np.random.Generator, n: int, d: int, corr: float) -> np.ndarray:
    """A [n, d] AR(1) process with unit marginal variance."""
    noise = rng.standard_normal((n, d))
    out = np.empty((n, d))
    out[0] = noise[0]
    a, b = corr, math.sqrt(1.0 - corr * corr)
    for t in range(1, n):
        out[t] = a * out[t - 1] + b * noise[t]
    return out


def _fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _layer(p: SyntheticParams, rng: np.random.Generator) -> Dict[str, np.ndarray]:
    d, t, hk, g = p.head_dim, p.n_tokens, p.n_kv_heads, p.q_per_kv
    half = d // 2
    pos = np.arange(t)
    ks, vs, qs = [], [], []
    for _ in range(hk):
        # Channel scales of K (pre-RoPE): log-normal, plus outlier RoPE pairs in the
        # low-frequency half with a consistent sign.
        k_ch = np.exp(p.channel_sigma * rng.standard_normal(d))
        k_mean = np.zeros(d)
        pairs = rng.choice(np.arange(half // 2, half), size=p.n_outlier_pairs, replace=False)
        for i in pairs:
            for c in (i, i + half):
                k_ch[c] = rng.uniform(*p.outlier_scale) * np.median(k_ch)
                k_mean[c] = p.outlier_mean * rng.choice([-1.0, 1.0])
        v_ch = np.exp(p.channel_sigma * rng.standard_normal(d))

        # Token magnitudes: log-normal spread, rare tokens 10-50x (same tokens in K and V).
        k_tok = np.exp(p.token_sigma * rng.standard_normal(t))
        v_tok = np.exp(p.token_sigma * rng.standard_normal(t))
        rare = rng.random(t) < p.rare_token_prob
        rare[0] = False
        k_rare = rng.uniform(*p.rare_token_scale, size=int(rare.sum()))
        if p.rare_tokens_in_k:
            k_tok[rare] *= k_rare
        v_tok[rare] *= rng.uniform(*p.rare_token_scale, size=int(rare.sum()))

        latent = _ar1(rng, t, d, p.latent_corr)
        k_pre = (k_mean[None, :] + latent) * k_ch[None, :] * k_tok[:, None]
        v = _ar1(rng, t, d, p.latent_corr) * v_ch[None, :] * v_tok[:, None]

        # Queries: per head a random near-identity mix of the latent, correlated with the keys'
        # latent, scaled per channel by k_ch ** q_channel_exponent, plus a mean direction.
        q_mean_dir = rng.standard_normal(d)
        q_mean_dir /= np.linalg.norm(q_mean_dir)
        head_qs = []
        for _h in range(g):
            mix = np.eye(d) + 0.3 * rng.standard_normal((d, d)) / math.sqrt(d)
            content = latent @ mix
            noise = rng.standard_normal((t, d))
            q_pre = p.qk_corr * content + math.sqrt(1 - p.qk_corr**2) * noise
            q_pre = q_pre * (k_ch ** p.q_channel_exponent)[None, :] \
                + 0.5 * q_mean_dir[None, :] * math.sqrt(d)
            head_qs.append(q_pre)

        k_rot = rope(k_pre, p.rope_theta, pos)
        # Attention sink: token 0's key along the (RoPE'd at position 0 = identity) mean query
        # direction; its norm is set below once the query scale is known.
        k_rot[0] = q_mean_dir * np.median(np.linalg.norm(k_rot[1:], axis=1))
        v[0] *= p.sink_value_scale / max(v_tok[0], 1e-6)

        q_rot = [rope(q, p.rope_theta, pos) for q in head_qs]
        # Rescale each query head so that its scaled scores over non-sink keys have std
        # score_std (measured on a strided sample of queries).
        sample = np.arange(64, t, max(1, t // 256))
        typical = k_rot[1:][~rare[1:]]  # non-sink, non-rare keys
        scale_q = []
        for q in q_rot:
            s = q[sample] @ typical.T / math.sqrt(d)
            scale_q.append(p.score_std / max(float(s.std()), 1e-12))
        q_rot = [q * sq for q, sq in zip(q_rot, scale_q)]
        # Sink key norm: its mean score sink_score stds above the mean score of the others.
        base = np.mean([float((q[sample] @ typical.T).mean()) for q in q_rot]) / math.sqrt(d)
        proj = np.mean([float((q[sample] @ q_mean_dir).mean()) for q in q_rot]) / math.sqrt(d)
        target = base + p.sink_score * p.score_std
        if proj > 1e-9:
            k_rot[0] = q_mean_dir * (target / proj)
        ks.append(k_rot)
        vs.append(v)
        qs.extend(q_rot)
    return {
        "q": _fp16(np.stack(qs)),
        "k": _fp16(np.stack(ks)),
        "v": _fp16(np.stack(vs)),
    }


def generate(params: SyntheticParams = SyntheticParams(), seed: int = 0) -> List[Dict[str, np.ndarray]]:
    """One dict per layer: q [Hk*q_per_kv, T, D], k and v [Hk, T, D], float32 holding fp16
    values (post-RoPE for q and k). Query head h uses KV head h // q_per_kv."""
    rng = np.random.default_rng(np.random.SeedSequence([0x6B7661726E, seed]))
    return [_layer(params, rng) for _ in range(params.n_layers)]
