"""Numpy fp32 Llama forward pass with a KV-cache quantization hook, plus scoring helpers.

Why this exists: the accuracy study needs to measure what a quantized KV cache does to a real
model's predictions without a GPU or torch. A decode loop over T tokens would be far too slow in
numpy, so `LlamaModel.forward` runs a whole window of T tokens at once and reproduces *decode
semantics* exactly: a query at position t attends to every earlier key as a decode step at t
would see it in a tiled cache (own, still-open tile and sink tiles exact, completed tiles
quantized). The model-specific modules (austen.py, smollm2.py) only load weights and tokenize;
the forward pass and the scoring (cross entropy, KL, top-1 agreement) live here so both models
share one implementation.

Conventions (HF Llama): RMSNorm `x * rsqrt(mean(x^2) + eps) * w`; linear weights [out, in] with
y = x W^T; RoPE with the rotate-half pairing (channel i pairs with i + D/2, angle
pos * theta^(-2i/D)); GQA (query head h uses KV head h // (n_heads / n_kv_heads)); SwiGLU MLP
`w2(silu(w1 x) * w3 x)`; final norm and output head (tied to the embedding when absent).

Run `python -m eval.accuracy.llama_np --check` for the self-check on a small random model.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

LN2 = math.log(2.0)

# A KV quantizer: (layer, k [Hk,T,D] f32, v [Hk,T,D] f32) -> (kq, vq), same shapes, the
# quantized-then-dequantized cache. Only rows of complete, non-sink tiles are ever read.
KVQuantizer = Callable[[int, np.ndarray, np.ndarray], "tuple[np.ndarray, np.ndarray]"]


# ---------------------------------------------------------------------- BLAS threads
_blas_limit = None


def set_blas_threads(n) -> int:
    """Limit OpenBLAS to n threads (via threadpoolctl; a no-op returning 0 without it).

    Why: on this 2-core machine, when another process is also busy, OpenBLAS's spinning
    worker threads make a 2-thread numpy run 4-10x SLOWER than a 1-thread one (measured: a
    512-token SmolLM2 forward 11.7 s with 2 threads vs 3.0 s with 1, while another eval ran).
    n: an int, or "auto": 1 if the 1-minute load average already exceeds 0.7 (someone else
    is computing), else all cores. Results do not depend on the thread count in practice
    (OpenBLAS splits output blocks, not the reductions). Returns the count set."""
    global _blas_limit
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return 0
    if n == "auto" or n is None:
        import os
        n = 1 if os.getloadavg()[0] > 0.7 else (os.cpu_count() or 1)
    n = int(n)
    _blas_limit = threadpool_limits(limits=n, user_api="blas")
    return n


def _init_threads_from_env():
    import os
    v = os.environ.get("KVARN_EVAL_THREADS")
    if v:
        set_blas_threads(v if v == "auto" else int(v))


_init_threads_from_env()


@dataclasses.dataclass
class LlamaConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    vocab: int = 256


def fp16_kv(layer: int, k: np.ndarray, v: np.ndarray):
    """KV hook for the fp16 baseline: round the cache to fp16 (round to nearest even)."""
    return (k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32))


def identity_kv(layer: int, k: np.ndarray, v: np.ndarray):
    """KV hook that changes nothing (used by the self-check)."""
    return k, v


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    ms = np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32)
    return (x * (1.0 / np.sqrt(ms + np.float32(eps)))).astype(np.float32) * w


def rope_tables(positions: np.ndarray, head_dim: int, theta: float):
    """cos/sin tables [T, D] for rotate-half RoPE (angles in float64, then rounded to fp32)."""
    half = head_dim // 2
    inv_freq = theta ** (-(2.0 * np.arange(half, dtype=np.float64)) / head_dim)
    ang = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos = np.cos(ang).astype(np.float32)
    sin = np.sin(ang).astype(np.float32)
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x [H, T, D] -> x*cos + rotate_half(x)*sin, rotate_half(x) = [-x2, x1]."""
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return np.ascontiguousarray(x * cos + rot * sin, dtype=np.float32)


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _softmax_inplace(s: np.ndarray) -> np.ndarray:
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


class LlamaModel:
    """A Llama decoder in numpy fp32.

    weights: {'embed': [vocab, dim], 'norm': [dim], 'head': [vocab, dim] or absent/None (tied),
    'layers': [ {'attn_norm','wq','wk','wv','wo','mlp_norm','w1' (gate),'w3' (up),'w2' (down)} ]}
    with linear weights [out, in]. Q/K rows must be in HF rotate-half order.
    """

    def __init__(self, config: LlamaConfig, weights: dict):
        c = config
        self.config = c
        f32 = lambda a: np.ascontiguousarray(np.asarray(a, dtype=np.float32))
        self.embed = f32(weights["embed"])
        assert self.embed.shape == (c.vocab, c.dim), self.embed.shape
        self.norm = f32(weights["norm"])
        head = weights.get("head")
        self.tied = head is None
        # Stored transposed so the hot path is a plain x @ W.
        self.head_t = np.ascontiguousarray((self.embed if head is None else f32(head)).T)
        assert len(weights["layers"]) == c.n_layers
        qd, kd = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        self.layers = []
        for lw in weights["layers"]:
            wq, wk, wv = f32(lw["wq"]), f32(lw["wk"]), f32(lw["wv"])
            assert wq.shape == (qd, c.dim) and wk.shape == (kd, c.dim) and wv.shape == (kd, c.dim)
            w1, w3, w2 = f32(lw["w1"]), f32(lw["w3"]), f32(lw["w2"])
            assert w1.shape == (c.hidden, c.dim) and w3.shape == w1.shape
            assert w2.shape == (c.dim, c.hidden)
            self.layers.append({
                "attn_norm": f32(lw["attn_norm"]),
                "mlp_norm": f32(lw["mlp_norm"]),
                "wqkv_t": np.ascontiguousarray(np.concatenate([wq, wk, wv], 0).T),
                "wo_t": np.ascontiguousarray(f32(lw["wo"]).T),
                "w13_t": np.ascontiguousarray(np.concatenate([w1, w3], 0).T),
                "w2_t": np.ascontiguousarray(w2.T),
            })

    # ------------------------------------------------------------------ attention
    @staticmethod
    def _quantizable_rows(T: int, G: int, sink_tiles: int) -> np.ndarray:
        """Bool [T]: key rows that a decode step ever reads quantized (complete, non-sink)."""
        s = np.arange(T)
        return (s // G >= sink_tiles) & (s < (T // G) * G)

    def _attend_blocked(self, q, k, v, kq, vq, G, sink_tiles):
        """Causal attention in query blocks of one tile (G tokens).

        For every query in tile i the selection is the same: keys of tiles j < i come from the
        mixed cache (quantized where complete and non-sink, exact in the sink), keys of tile i
        are exact. So each block costs one matmul over its causal prefix, no double work.
        q [Hq,T,D] pre-scaled; k, v [Hk,T,D]; kq, vq None (exact cache) or [Hk,T,D].
        """
        Hq, T, D = q.shape
        Hk = k.shape[0]
        rep = Hq // Hk
        if kq is None:
            kc, vc = k, v
        else:
            m = self._quantizable_rows(T, G, sink_tiles)[None, :, None]
            kc = np.where(m, kq, k).astype(np.float32)
            vc = np.where(m, vq, v).astype(np.float32)
        # Keys pre-transposed and contiguous: BLAS is several times slower on transposed views.
        kT = np.ascontiguousarray(k.transpose(0, 2, 1))
        kcT = kT if kc is k else np.ascontiguousarray(kc.transpose(0, 2, 1))
        v = np.ascontiguousarray(v)
        vc = v if vc is v else np.ascontiguousarray(vc)
        q4 = np.ascontiguousarray(q).reshape(Hk, rep, T, D)
        out = np.empty((Hk, rep, T, D), dtype=np.float32)
        tri = np.triu(np.full((G, G), -np.inf, dtype=np.float32), 1)
        for qs in range(0, T, G):
            qe = min(qs + G, T)
            B = qe - qs
            qb = np.ascontiguousarray(q4[:, :, qs:qe, :]).reshape(Hk, rep * B, D)
            if qs:
                keys = np.concatenate([kcT[:, :, :qs], kT[:, :, qs:qe]], axis=2)
                vals = np.concatenate([vc[:, :qs], v[:, qs:qe]], axis=1)
            else:
                keys, vals = np.ascontiguousarray(kT[:, :, :qe]), v[:, :qe]
            s = np.matmul(qb, keys).reshape(Hk, rep, B, qe)
            s[..., qs:qe] += tri[:B, :B]
            _softmax_inplace(s)
            out[:, :, qs:qe, :] = np.matmul(s.reshape(Hk, rep * B, qe), vals).reshape(
                Hk, rep, B, D)
        return out.reshape(Hq, T, D)

    def _attend_masked(self, q, k, v, kq, vq, G, sink_tiles):
        """Reference implementation, literally as specified: scores from both the exact and the
        quantized keys, a per-(query, key) selection mask, and the probabilities split between
        the exact and quantized values. O(T^2) memory; used by the self-check."""
        Hq, T, D = q.shape
        Hk = k.shape[0]
        rep = Hq // Hk
        t = np.arange(T)[:, None]
        s_ = np.arange(T)[None, :]
        ti, tj = t // G, s_ // G
        use_q = (s_ <= t) & (tj != ti) & (tj >= sink_tiles) & (s_ < (T // G) * G)
        if kq is None:
            use_q[:] = False
            kq, vq = k, v
        kk = np.repeat(k, rep, axis=0)
        vv = np.repeat(v, rep, axis=0)
        kkq = np.repeat(kq, rep, axis=0)
        vvq = np.repeat(vq, rep, axis=0)
        se = q @ kk.transpose(0, 2, 1)
        sq = q @ kkq.transpose(0, 2, 1)
        s = np.where(use_q[None], sq, se)
        s = np.where((s_ <= t)[None], s, -np.inf).astype(np.float32)
        p = _softmax_inplace(s)
        pq = np.where(use_q[None], p, 0.0).astype(np.float32)
        pe = np.where(use_q[None], 0.0, p).astype(np.float32)
        return (pe @ vv + pq @ vvq).astype(np.float32)

    # ------------------------------------------------------------------ forward
    def forward(self, tokens: Sequence[int], kv_quantizer: Optional[KVQuantizer] = None,
                tile_tokens: int = 128, sink_tiles: int = 1, return_qkv: bool = False,
                logit_rows=None, attention: str = "blocked",
                tail_quantizer: Optional[KVQuantizer] = None):
        """Logits float32 [T, vocab] for one window of T tokens (positions 0..T-1).

        kv_quantizer: None for an exact fp32 cache, or a callable (layer, k, v) -> (kq, vq) on
        post-RoPE k, v [Hk, T, D] (see fp16_kv). Decode semantics: a query in tile i = t // G
        reads key s <= t (tile j) exactly if j == i, j < sink_tiles or tile j is incomplete,
        and quantized otherwise. tile_tokens is G.
        return_qkv: also return a list per layer of (q [Hq,T,D], k [Hk,T,D], v [Hk,T,D]),
        q and k post-RoPE (exact values, q unscaled).
        logit_rows: optional index/slice of positions to compute logits for (e.g. slice(-1,
        None) during generation); the head is the most expensive matmul for large vocabs.
        attention: "blocked" (fast) or "masked" (the O(T^2)-memory reference).
        tail_quantizer: None, or a callable (layer, k, v) -> (k, v) giving the values a cache
        holds before quantization (a tail kept at reduced precision, e.g. int8 rows): they
        replace the exact keys and values everywhere, the kv_quantizer's input included.
        """
        c = self.config
        tokens = np.asarray(tokens, dtype=np.int64)
        T = tokens.shape[0]
        H, Hk, D = c.n_heads, c.n_kv_heads, c.head_dim
        G = int(tile_tokens)
        attend = {"blocked": self._attend_blocked, "masked": self._attend_masked}[attention]
        cos, sin = rope_tables(np.arange(T), D, c.rope_theta)
        scale = np.float32(1.0 / math.sqrt(D))
        x = self.embed[tokens]
        qkv_out = []
        for li, L in enumerate(self.layers):
            y = rms_norm(x, L["attn_norm"], c.norm_eps)
            qkv = y @ L["wqkv_t"]
            q = qkv[:, :H * D].reshape(T, H, D).transpose(1, 0, 2)
            k = qkv[:, H * D:(H + Hk) * D].reshape(T, Hk, D).transpose(1, 0, 2)
            v = np.ascontiguousarray(qkv[:, (H + Hk) * D:].reshape(T, Hk, D).transpose(1, 0, 2))
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            if tail_quantizer is not None:
                k, v = tail_quantizer(li, k.copy(), v.copy())
                k = np.ascontiguousarray(k, dtype=np.float32)
                v = np.ascontiguousarray(v, dtype=np.float32)
            kq = vq = None
            if kv_quantizer is not None:
                kq, vq = kv_quantizer(li, k.copy(), v.copy())
                kq = np.asarray(kq, dtype=np.float32)
                vq = np.asarray(vq, dtype=np.float32)
                if kq.shape != k.shape or vq.shape != v.shape:
                    raise ValueError(f"kv_quantizer returned {kq.shape}, {vq.shape}; "
                                     f"expected {k.shape}")
            if return_qkv:
                qkv_out.append((q, k, v))
            o = attend(q * scale, k, v, kq, vq, G, sink_tiles)
            x = x + o.transpose(1, 0, 2).reshape(T, H * D) @ L["wo_t"]
            y = rms_norm(x, L["mlp_norm"], c.norm_eps)
            h = y @ L["w13_t"]
            x = x + (silu(h[:, :c.hidden]) * h[:, c.hidden:]) @ L["w2_t"]
        if logit_rows is not None:
            x = x[logit_rows]
        logits = rms_norm(x, self.norm, c.norm_eps) @ self.head_t
        return (logits, qkv_out) if return_qkv else logits

    def generate(self, tokens: Sequence[int], n_new: int, stop: Optional[int] = None):
        """Greedy generation by re-running the window (no incremental cache; fine for short
        prompts). Returns the list of new token ids."""
        seq = list(int(t) for t in tokens)
        new = []
        for _ in range(n_new):
            nxt = int(np.argmax(self.forward(seq, logit_rows=slice(-1, None))[0]))
            new.append(nxt)
            seq.append(nxt)
            if stop is not None and nxt == stop:
                break
        return new


# ---------------------------------------------------------------------- scoring helpers
def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Natural-log probabilities, float32, along the last axis."""
    x = np.asarray(logits, dtype=np.float32)
    m = x.max(axis=-1, keepdims=True)
    lse = np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True, dtype=np.float64))
    return (x - m - lse.astype(np.float32)).astype(np.float32)


def cross_entropy_bits(logits_or_logprobs: np.ndarray, targets: np.ndarray,
                       is_logprobs: bool = False) -> np.ndarray:
    """Per-position cross entropy in bits: -log2 p(target)."""
    lp = logits_or_logprobs if is_logprobs else log_softmax(logits_or_logprobs)
    t = np.asarray(targets, dtype=np.int64)
    return -lp[np.arange(t.shape[0]), t].astype(np.float64) / LN2


def kl_divergence(ref_logprobs: np.ndarray, logprobs: np.ndarray) -> np.ndarray:
    """Per-position KL(ref || other) in nats, from log-probabilities [..., vocab]."""
    r = np.asarray(ref_logprobs, dtype=np.float64)
    o = np.asarray(logprobs, dtype=np.float64)
    return np.sum(np.exp(r) * (r - o), axis=-1)


def top1_agreement(ref_logprobs_or_argmax: np.ndarray, other: np.ndarray) -> float:
    """Fraction of positions whose argmax agrees. Accepts logits/log-probs [N, vocab] or
    argmax index arrays [N]."""
    a = np.asarray(ref_logprobs_or_argmax)
    b = np.asarray(other)
    if a.ndim > 1:
        a = a.argmax(axis=-1)
    if b.ndim > 1:
        b = b.argmax(axis=-1)
    return float(np.mean(a == b))


def score_windows(model: LlamaModel, tokens: np.ndarray, window: int, n_windows: int,
                  kv_quantizer: Optional[KVQuantizer] = None, tile_tokens: int = 128,
                  sink_tiles: int = 1, offset: int = 0, stride: Optional[int] = None,
                  token_nbytes: Optional[np.ndarray] = None, reference=None,
                  keep_logprobs: bool = False, logprobs_dtype=np.float32,
                  progress: bool = False) -> dict:
    """Score consecutive windows of a token stream with next-token cross entropy.

    Window w covers tokens[offset + w*stride : offset + w*stride + window] (stride defaults to
    window, i.e. consecutive non-overlapping windows) and is run as a fresh sequence (positions
    0..window-1, its first tile is the sink); positions 0..window-2 predict tokens 1..window-1,
    so each window contributes window-1 predictions.

    token_nbytes: bytes of text per token id (None = 1 byte per token, byte-level models);
    bits_per_byte = total bits / total bytes of the predicted tokens.
    reference: compare against another run, per position: a previous result of this function
    with keep_logprobs=True (same windows), the string "exact" (run the model again with an
    exact cache), or a KV hook (run again with that hook). Adds 'kl_nats' (mean KL(ref||this)),
    'kl_per_window', 'top1_agreement' (argmax agreement), 'ref_bits_per_byte' when re-run.

    Returns a dict: bits_per_byte, bits_per_token, perplexity (per token), n_predicted, n_bytes,
    windows [(start, end)], target_logprob [n_windows, window-1] (natural log of p(next
    token)), argmax [n_windows, window-1], seconds, and logprobs [n_windows, window-1, vocab]
    (logprobs_dtype) if keep_logprobs.
    """
    tokens = np.asarray(tokens)
    stride = window if stride is None else stride
    wins = [(offset + w * stride, offset + w * stride + window) for w in range(n_windows)]
    if wins[-1][1] > tokens.shape[0]:
        raise ValueError(f"need {wins[-1][1]} tokens, have {tokens.shape[0]}")
    nb = None if token_nbytes is None else np.asarray(token_nbytes, dtype=np.int64)
    ref_dict = reference if isinstance(reference, dict) else None
    if ref_dict is not None:
        if "logprobs" not in ref_dict or list(ref_dict["windows"]) != wins:
            raise ValueError("reference result must have keep_logprobs and the same windows")
    ref_hook = None
    if isinstance(reference, str):
        if reference != "exact":
            raise ValueError(reference)
    elif callable(reference):
        ref_hook = reference
    tgt_lp, amax, kept, kls, tops = [], [], [], [], []
    ref_bits = 0.0
    total_bits = 0.0
    total_bytes = 0
    t0 = time.time()
    for wi, (a, b) in enumerate(wins):
        toks = tokens[a:b]
        lp = log_softmax(model.forward(toks, kv_quantizer=kv_quantizer,
                                       tile_tokens=tile_tokens, sink_tiles=sink_tiles))[:-1]
        tgt = toks[1:].astype(np.int64)
        t_lp = lp[np.arange(tgt.shape[0]), tgt]
        tgt_lp.append(t_lp)
        amax.append(lp.argmax(axis=-1).astype(np.int32))
        total_bits += float(-np.sum(t_lp, dtype=np.float64) / LN2)
        total_bytes += int(tgt.shape[0] if nb is None else nb[tgt].sum())
        if keep_logprobs:
            kept.append(lp.astype(logprobs_dtype))
        if reference is not None:
            if ref_dict is not None:
                rlp = ref_dict["logprobs"][wi].astype(np.float32)
            else:
                rlp = log_softmax(model.forward(toks, kv_quantizer=ref_hook,
                                                tile_tokens=tile_tokens,
                                                sink_tiles=sink_tiles))[:-1]
                ref_bits += float(-np.sum(rlp[np.arange(tgt.shape[0]), tgt],
                                          dtype=np.float64) / LN2)
            kls.append(kl_divergence(rlp, lp))
            tops.append(rlp.argmax(axis=-1) == amax[-1])
        if progress:
            print(f"  window {wi + 1}/{len(wins)}: {time.time() - t0:.1f}s", file=sys.stderr)
    n_pred = sum(x.shape[0] for x in tgt_lp)
    res = {
        "bits_per_byte": total_bits / total_bytes,
        "bits_per_token": total_bits / n_pred,
        "perplexity": float(math.exp(total_bits * LN2 / n_pred)),
        "n_predicted": n_pred,
        "n_bytes": total_bytes,
        "windows": wins,
        "target_logprob": np.stack(tgt_lp),
        "argmax": np.stack(amax),
        "seconds": time.time() - t0,
    }
    if keep_logprobs:
        res["logprobs"] = np.stack(kept)
    if reference is not None:
        res["kl_per_window"] = np.array([k.mean() for k in kls])
        res["kl_nats"] = float(np.mean(np.concatenate(kls)))
        res["top1_agreement"] = float(np.mean(np.concatenate(tops)))
        if ref_dict is None:
            res["ref_bits_per_byte"] = ref_bits / total_bytes
    return res


# ---------------------------------------------------------------------- safetensors
_ST_DTYPES = {"F16": np.float16, "F32": np.float32, "BF16": None, "I32": np.int32,
              "I64": np.int64, "U8": np.uint8, "F64": np.float64}


def read_safetensors(path: str) -> dict:
    """Read a safetensors file with numpy: 8-byte LE header length N, N bytes of JSON
    {name: {dtype, shape, data_offsets}}, then the raw little-endian data. Returns arrays in
    their stored dtype (BF16 is widened to float32)."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        raw = buf[base + b:base + e]
        if info["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<"))
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def rel_diff(a: np.ndarray, ref: np.ndarray) -> dict:
    """Difference of a against ref: max |a-ref| / max |ref| ('max_rel', the scale-normalized
    max error) and ||a-ref|| / ||ref|| ('fro_rel')."""
    a = np.asarray(a, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    d = np.abs(a - r)
    return {"max_abs": float(d.max()), "max_rel": float(d.max() / np.abs(r).max()),
            "fro_rel": float(np.linalg.norm(a - r) / np.linalg.norm(r))}


# ---------------------------------------------------------------------- self-check
def random_model(seed: int = 0, cfg: Optional[LlamaConfig] = None) -> LlamaModel:
    """A small random Llama for tests (GQA 3)."""
    cfg = cfg or LlamaConfig(dim=96, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=32,
                             hidden=160, rope_theta=10000.0, norm_eps=1e-5, vocab=50)
    rng = np.random.default_rng(seed)
    g = lambda *s: (rng.standard_normal(s) / math.sqrt(s[-1])).astype(np.float32)
    qd, kd = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    layers = [dict(attn_norm=1 + 0.1 * g(cfg.dim), mlp_norm=1 + 0.1 * g(cfg.dim),
                   wq=2 * g(qd, cfg.dim), wk=2 * g(kd, cfg.dim), wv=g(kd, cfg.dim),
                   wo=g(cfg.dim, qd), w1=g(cfg.hidden, cfg.dim), w3=g(cfg.hidden, cfg.dim),
                   w2=g(cfg.dim, cfg.hidden)) for _ in range(cfg.n_layers)]
    return LlamaModel(cfg, dict(embed=g(cfg.vocab, cfg.dim), norm=1 + 0.1 * g(cfg.dim),
                                head=None, layers=layers))


def self_check(model: LlamaModel, tokens: Sequence[int], tile_tokens: int = 128,
               sink_tiles: int = 1, verbose: bool = True) -> bool:
    """Checks the decode-semantics hook on `model` for one window:
    1. identity hook == no hook (bitwise);
    2. a hook that scrambles only rows never read quantized (sink tiles, the incomplete last
       tile) changes nothing (bitwise);
    3. a hook that scrambles one complete non-sink tile j changes no logit at positions in
       tiles <= j and changes the logits of later tiles;
    4. the blocked attention equals the literal masked reference: end to end with no hook and
       a noisy hook, and per layer on identical q, k, v with the fp16 and noisy hooks.
    Needs at least sink_tiles + 2 complete tiles plus a partial one for full coverage."""
    G = tile_tokens
    toks = np.asarray(tokens)
    T = toks.shape[0]
    n_full = T // G
    ok = True

    def report(name, cond, detail=""):
        nonlocal ok
        ok &= bool(cond)
        if verbose:
            print(f"  [{'ok' if cond else 'FAIL'}] {name} {detail}")

    base = model.forward(toks, tile_tokens=G, sink_tiles=sink_tiles)
    ident = model.forward(toks, kv_quantizer=identity_kv, tile_tokens=G, sink_tiles=sink_tiles)
    report("identity hook == no hook", np.array_equal(base, ident))

    never = ~LlamaModel._quantizable_rows(T, G, sink_tiles)

    def scramble_never(layer, k, v):
        k, v = k.copy(), v.copy()
        k[:, never] = 1e3 * np.sign(k[:, never]) + 7.0
        v[:, never] = -v[:, never] + 5.0
        return k, v

    pert = model.forward(toks, kv_quantizer=scramble_never, tile_tokens=G, sink_tiles=sink_tiles)
    report("scrambling sink/incomplete tiles changes nothing", np.array_equal(base, pert),
           f"(sink rows {sink_tiles * G}, tail rows {T - n_full * G})")

    j = sink_tiles  # first quantizable tile
    if n_full > j + 1:
        def scramble_j(layer, k, v):
            k, v = k.copy(), v.copy()
            k[:, j * G:(j + 1) * G] *= -3.0
            v[:, j * G:(j + 1) * G] += 2.0
            return k, v
        pj = model.forward(toks, kv_quantizer=scramble_j, tile_tokens=G, sink_tiles=sink_tiles)
        before = np.array_equal(base[:(j + 1) * G], pj[:(j + 1) * G])
        after = np.all(np.abs(base[(j + 1) * G:] - pj[(j + 1) * G:]).max(axis=-1) > 0)
        report(f"scrambling tile {j} only affects queries in later tiles", before and after)
    else:
        report("tile-locality check skipped (window too short)", True)

    rng = np.random.default_rng(1)

    def noisy(layer, k, v):
        return (k + 0.05 * rng.standard_normal(k.shape).astype(np.float32) * np.abs(k).mean(),
                v + 0.05 * rng.standard_normal(v.shape).astype(np.float32) * np.abs(v).mean())

    # End to end only with continuous hooks: a rounding hook (fp16, RTN) is discontinuous, so
    # the ~1e-6 float32 reordering differences between the two implementations can flip one
    # rounding in a later layer and move a logit by ~1e-3; per layer, on identical inputs,
    # the two must agree for every hook.
    for name, hook in (("none", None), ("noisy", noisy)):
        rng = np.random.default_rng(1)
        a = model.forward(toks, kv_quantizer=hook, tile_tokens=G, sink_tiles=sink_tiles)
        rng = np.random.default_rng(1)
        b = model.forward(toks, kv_quantizer=hook, tile_tokens=G, sink_tiles=sink_tiles,
                          attention="masked")
        err = float(np.abs(a - b).max() / np.abs(b).max())
        report(f"blocked == masked reference end to end, hook={name}", err < 1e-4,
               f"(max rel {err:.1e})")
    _, qkv = model.forward(toks, return_qkv=True)
    scale = np.float32(1.0 / math.sqrt(model.config.head_dim))
    worst = 0.0
    for li, (q, k, v) in enumerate(qkv):
        for hook in (fp16_kv, noisy):
            kq, vq = hook(li, k, v)
            a = model._attend_blocked(q * scale, k, v, kq, vq, G, sink_tiles)
            b = model._attend_masked(q * scale, k, v, kq, vq, G, sink_tiles)
            worst = max(worst, float(np.abs(a - b).max() / np.abs(b).max()))
    report("blocked == masked reference per layer, hooks fp16 and noisy", worst < 1e-5,
           f"(max rel {worst:.1e})")
    return ok


def check_main(argv, check, doc) -> int:
    """The `python -m <module> --check [--threads N|auto]` entry of the model modules: sets the
    BLAS threads (default auto, see set_blas_threads) and runs `check`; else prints `doc`."""
    if "--check" not in argv[1:]:
        print(doc)
        return 0
    threads = argv[argv.index("--threads") + 1] if "--threads" in argv else "auto"
    n = set_blas_threads(threads)
    print(f"BLAS threads: {n or 'default (threadpoolctl missing)'}")
    return check()


def _main(argv):
    if "--check" not in argv:
        print(__doc__)
        return 0
    m = random_model()
    toks = np.random.default_rng(2).integers(0, m.config.vocab, size=64 * 4 + 37)
    print("llama_np self-check on a random GQA-3 model, T=%d, G=64, sink=1" % len(toks))
    ok = self_check(m, toks, tile_tokens=64, sink_tiles=1)
    print("  sink_tiles=0:")
    ok &= self_check(m, toks, tile_tokens=64, sink_tiles=0)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
