"""The KV-cache quantization methods compared in docs/ACCURACY.md, all computed by libkvarn.

    from eval.accuracy.methods import registry, get
    m = get("kvarn:k4v2_g128")
    kq, vq = m.roundtrip(k, v)          # k, v float32 [Hk, T, D] -> reconstructions, same shape

Names:

- ``fp16``: the cache as the model produced it (the reference; inputs are fp16 values).
- ``kvarn:<preset>`` KVarN at a preset (Sinkhorn iterations 8, the library default) and
  ``kvarn:<preset>:T<n>`` at n iterations. Quantized by ``kvarn.Context.quantize`` /
  ``dequantize`` (records; dequantize un-rotates).
- ``had_rtn:<preset>``: Hadamard rotation + per-row RTN, no normalization (QuaRot-style):
  the same record with ``key_flags = value_flags = ABLATE_NO_NORMALIZATION``. K rows are
  channels (per-channel over the tile's G tokens), V rows are tokens.
- ``kivi:<preset>``: KIVI-style, per-channel K over the tile's G tokens and per-token V, no
  rotation, no normalization (flags ``ABLATE_NO_ROTATION | ABLATE_NO_NORMALIZATION``).
  KIVI itself groups K channels over 32-128 tokens and keeps a residual fp16 window; here the
  group is the tile (the recent tile and the sink stay fp16 in the model runs, as for KVarN).
- ``rtn_token:k<b>v<b>``: per-token asymmetric min/max RTN of K and V at b bits with an fp16
  scale and zero per token (``kvarn.baseline_roundtrip(x, "per_token_rtn", bits)``).
- ``fp8_e4m3``: fp8 e4m3 per token with an fp16 scale absmax/448 (``kvarn.baseline_roundtrip(x,
  "fp8_e4m3")``).

The ablation flags (``kvarn.ABLATE_*``) and ``kvarn.baseline_roundtrip`` are the library's
experimental entry points (C header ``kvarn/kvarn_experimental.h``): no stability promise, they may
change in any release (the report records the library version and commit it ran with).

Bytes per token per KV head (K and V together), the convention of every table:
record methods (kvarn, had_rtn, kivi): ``record_bytes / G`` (the stored record, which carries
the same scale vectors whatever the flags: KIVI and Hadamard+RTN would need 2G bytes fewer per
record without the unused column scales); rtn_token: ``2 * (D*b/8 + 4)``; fp8: ``2 * (D + 2)``;
fp16: ``4*D``.

A tensor whose token count is not a multiple of G has its last partial tile left unquantized
(a decode cache holds it in fp16).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

import kvarn

_CTX: Optional[kvarn.Context] = None


def context() -> kvarn.Context:
    """The CPU context all methods use (created once)."""
    global _CTX
    if _CTX is None:
        _CTX = kvarn.Context("cpu")
    return _CTX


def has_baselines() -> bool:
    """Whether the loaded kvarn has ``baseline_roundtrip`` (per-token RTN and fp8)."""
    return hasattr(kvarn, "baseline_roundtrip")


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    family: str  # fp16 | kvarn | had_rtn | kivi | rtn_token | fp8
    key_bits: int
    value_bits: int
    tile_tokens: int = 128  # G of record methods (tile of the decode cache for all)
    iterations: int = 8
    label: str = ""

    @property
    def bits(self) -> str:
        return f"k{self.key_bits}v{self.value_bits}"

    def config(self, head_dim: int) -> kvarn.Config:
        flags = {"kvarn": 0, "had_rtn": kvarn.ABLATE_NO_NORMALIZATION,
                 "kivi": kvarn.ABLATE_NO_ROTATION | kvarn.ABLATE_NO_NORMALIZATION}[self.family]
        preset = f"k{self.key_bits}v{self.value_bits}_g{self.tile_tokens}"
        return kvarn.Config.from_preset(
            preset, head_dim=head_dim, iterations=self.iterations, sink_tiles=0,
            key_flags=flags, value_flags=flags)

    def bytes_per_token(self, head_dim: int) -> float:
        """K+V bytes per token per KV head (see the module docstring)."""
        d = head_dim
        if self.family == "fp16":
            return 4.0 * d
        if self.family == "fp8":
            return 2.0 * (d + 2)
        if self.family == "rtn_token":
            return d * self.key_bits / 8 + 4 + d * self.value_bits / 8 + 4
        return self.config(d).record_bytes / self.tile_tokens

    def roundtrip(self, k: np.ndarray, v: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """Quantize and reconstruct K and V [..., T, D] (float32, unrotated); same shapes out."""
        k = np.ascontiguousarray(k, dtype=np.float32)
        v = np.ascontiguousarray(v, dtype=np.float32)
        if self.family == "fp16":
            return k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
        if self.family == "rtn_token":
            return (kvarn.baseline_roundtrip(k, "per_token_rtn", self.key_bits),
                    kvarn.baseline_roundtrip(v, "per_token_rtn", self.value_bits))
        if self.family == "fp8":
            return kvarn.baseline_roundtrip(k, "fp8_e4m3"), kvarn.baseline_roundtrip(v, "fp8_e4m3")
        return self._records(k, v)

    def _records(self, k: np.ndarray, v: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        *lead, t, d = k.shape
        g = self.tile_tokens
        n_full = t // g
        kq, vq = k.copy(), v.copy()
        if n_full == 0:
            return kq, vq
        config = self.config(d)
        kt = k[..., : n_full * g, :].reshape(-1, g, d)
        vt = v[..., : n_full * g, :].reshape(-1, g, d)
        ctx = context()
        records = ctx.quantize(np.ascontiguousarray(kt), np.ascontiguousarray(vt), config)
        k2, v2 = ctx.dequantize(records, config)
        kq[..., : n_full * g, :] = k2.reshape(*lead, n_full * g, d)
        vq[..., : n_full * g, :] = v2.reshape(*lead, n_full * g, d)
        return kq, vq


def _build() -> Dict[str, Method]:
    out: Dict[str, Method] = {}

    def add(m: Method) -> None:
        out[m.name] = m

    add(Method("fp16", "fp16", 16, 16, label="fp16 cache"))
    for preset in ("k4v2_g128", "k4v2_g64", "k4v4_g128", "k4v4_g64", "k2v2_g128", "k8v8_g128"):
        kb, vb, g = map(int, re.match(r"k(\d)v(\d)_g(\d+)", preset).groups())
        add(Method(f"kvarn:{preset}", "kvarn", kb, vb, g, 8, label=f"KVarN {preset}"))
    for preset in ("k4v2_g128", "k2v2_g128"):
        kb, vb, g = map(int, re.match(r"k(\d)v(\d)_g(\d+)", preset).groups())
        for it in (0, 2, 4, 8, 16):
            add(Method(f"kvarn:{preset}:T{it}", "kvarn", kb, vb, g, it,
                       label=f"KVarN {preset} T={it}"))
    for preset in ("k4v2_g128", "k4v4_g128", "k2v2_g128", "k8v8_g128"):
        kb, vb, g = map(int, re.match(r"k(\d)v(\d)_g(\d+)", preset).groups())
        add(Method(f"had_rtn:{preset}", "had_rtn", kb, vb, g, 0,
                   label=f"Hadamard+RTN {preset}"))
        add(Method(f"kivi:{preset}", "kivi", kb, vb, g, 0, label=f"KIVI-style {preset}"))
        add(Method(f"rtn_token:k{kb}v{vb}", "rtn_token", kb, vb, g, 0,
                   label=f"per-token RTN k{kb}v{vb}"))
    add(Method("fp8_e4m3", "fp8", 8, 8, 128, 0, label="fp8 e4m3"))
    return out


_REGISTRY = _build()


def registry() -> Dict[str, Method]:
    return dict(_REGISTRY)


def get(name: str) -> Method:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; known: {', '.join(_REGISTRY)}") from None


def at_bits(bits: str, g: int = 128) -> List[str]:
    """The main comparison at one bit setting ("k4v2"): KVarN (default iterations) and the
    three baselines of the same bits, then fp8 and fp16 for reference."""
    kb, vb = bits[1], bits[3]
    return [f"kvarn:k{kb}v{vb}_g{g}", f"had_rtn:k{kb}v{vb}_g{g}", f"kivi:k{kb}v{vb}_g{g}",
            f"rtn_token:k{kb}v{vb}"]


def quantizer(name: str) -> Callable[[int, np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray]]:
    """A ``kv_quantizer(layer, k, v) -> (kq, vq)`` for the model runners."""
    m = get(name)
    return lambda layer, k, v: m.roundtrip(k, v)
