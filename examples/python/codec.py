#!/usr/bin/env python3
"""Quantize and dequantize K/V tiles with every preset and print the error of each.

    python examples/python/codec.py [--head-dim 128] [--tiles 4] [--seed 1]

The inputs are synthetic keys and values shaped like a large model's (a few outlier channels in
K, a spread of token scales). For each preset: the record size, bits per value, the compression
against fp16, and the relative mean squared error of K and V after a round trip (KVarN), next to
plain per-token round-to-nearest at the same bits. Exits non-zero if a call fails or KVarN's K
error is not below RTN's.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import kvarn


def synthetic_kv(rng: np.random.Generator, n_tiles: int, g: int, d: int):
    k = rng.standard_normal((n_tiles, g, d))
    k[..., rng.choice(d, size=max(2, d // 32), replace=False)] *= 15.0
    k *= rng.uniform(0.5, 2.0, size=(n_tiles, g, 1))
    v = rng.standard_normal((n_tiles, g, d)) * rng.uniform(0.5, 1.5, size=(n_tiles, g, 1))
    return k.astype(np.float16), v.astype(np.float16)


def rtn_per_token(x: np.ndarray, bits: int) -> np.ndarray:
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    scale = np.where(hi > lo, (hi - lo) / ((1 << bits) - 1), 1.0)
    return np.round((x - lo) / scale) * scale + lo


def rel_mse(x: np.ndarray, y: np.ndarray) -> float:
    x = x.astype(np.float64)
    return float(np.sum((x - y) ** 2) / np.sum(x**2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--tiles", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    ctx = kvarn.Context("cpu")
    print(
        f"libkvarn {kvarn.__version__}, backend {ctx.backend_name}, ISA {ctx.cpu_isa_name}, "
        f"{ctx.num_threads} threads"
    )
    print(
        f"{'preset':<10} {'record B':>8} {'bits/val':>8} {'vs fp16':>7}   "
        f"{'K kvarn':>9} {'K rtn':>9}   {'V kvarn':>9} {'V rtn':>9}"
    )
    ok = True
    rng = np.random.default_rng(args.seed)
    for preset in kvarn.presets():
        config = kvarn.Config.from_preset(preset, args.head_dim)
        g, d = config.tile_tokens, config.head_dim
        k, v = synthetic_kv(rng, args.tiles, g, d)
        records = ctx.quantize(k, v, config)  # uint8 [tiles, record_bytes]
        k_out, v_out = ctx.dequantize(records, config)  # float32 [tiles, G, D] each
        k64, v64 = k.astype(np.float64), v.astype(np.float64)
        errors = (
            rel_mse(k64, k_out),
            rel_mse(k64, rtn_per_token(k64, config.key_bits)),
            rel_mse(v64, v_out),
            rel_mse(v64, rtn_per_token(v64, config.value_bits)),
        )
        bits = 8 * config.record_bytes / (2 * g * d)
        print(
            f"{preset:<10} {config.record_bytes:>8} {bits:>8.2f} {16 / bits:>6.2f}x   "
            f"{errors[0]:>9.2e} {errors[1]:>9.2e}   {errors[2]:>9.2e} {errors[3]:>9.2e}"
        )
        ok &= errors[0] < errors[1]
    if not ok:
        print("FAILED: KVarN's K error is not below per-token RTN's", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
