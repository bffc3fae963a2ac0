"""Shared fixtures of the kvarn Python tests (run by CTest: tests/python_tests.cmake).

Random inputs come from numpy generators seeded per test; the seed is printed (pytest shows it
with a failure) and KVARN_TEST_SEED overrides the base seed.
"""

from __future__ import annotations

import math
import os
import pathlib
import zlib

import numpy as np
import pytest

import kvarn

SOURCE_DIR = pathlib.Path(
    os.environ.get("KVARN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2])
)


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    base = int(os.environ.get("KVARN_TEST_SEED", "20260601"))
    value = base ^ zlib.crc32(request.node.nodeid.encode())
    print(f"seed {value} (KVARN_TEST_SEED={base})")
    return value


@pytest.fixture
def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def ctx() -> kvarn.Context:
    with kvarn.Context("cpu", num_threads=2) as context:
        yield context


def kv_tiles(rng: np.random.Generator, n_tiles: int, g: int, d: int) -> tuple:
    """K/V [n_tiles, G, D] float32 with outlier channels in K (as large models have)."""
    k = rng.standard_normal((n_tiles, g, d))
    k[..., rng.choice(d, size=4, replace=False)] *= 12.0
    k *= rng.uniform(0.5, 2.0, size=(n_tiles, g, 1))
    v = rng.standard_normal((n_tiles, g, d))
    return k.astype(np.float32), v.astype(np.float32)


def paley(m: int) -> np.ndarray:
    """The symmetric Paley matrix of order m = q + 1 (q = 11, 19) of docs/FORMAT.md section 3."""
    q = m - 1
    squares = {0} | {(r * r) % q for r in range(1, q)}
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    p = np.where(np.isin((i + j - 2) % q, list(squares)), 1.0, -1.0)
    p[0, :] = 1.0
    p[:, 0] = 1.0
    p[0, 0] = -1.0
    return p


def hadamard(d: int) -> np.ndarray:
    """The rotation of docs/FORMAT.md section 3: Sylvester, or P_20 (x) S_4 (80), P_12 (x) S_8 (96)."""
    m = {80: 20, 96: 12}.get(d, 1)
    h = np.ones((1, 1))
    while h.shape[0] < d // m:
        h = np.block([[h, h], [h, -h]])
    if m > 1:
        h = np.kron(paley(m), h)
    return h / math.sqrt(d)


def rel_l2(x, ref) -> float:
    x = np.asarray(x, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def attention_reference(
    q, k_cf, v_cf, n_queries: int, d: int, *, sinks=None, sliding_window=0, logit_softcap=0.0,
    mode="causal",
):
    """float64 attention of one sequence in the cache frame (K and V rotated), causal or with
    the model variants of kvarn_attention_params_t. q [n, Hq, D] unrotated; k_cf/v_cf
    [N, Hk, D]; returns (out [n, Hq, D] unrotated, lse)."""
    h = hadamard(d)
    qr = np.asarray(q, np.float64) @ h
    n_tokens, hk = k_cf.shape[:2]
    hq = q.shape[1]
    out = np.zeros((n_queries, hq, d))
    lse = np.zeros((n_queries, hq))
    for i in range(n_queries):
        pos = n_tokens + i if mode == "prefix" else n_tokens - n_queries + i
        hi = n_tokens if mode == "prefix" else pos + 1
        lo = max(0, pos - sliding_window + 1) if sliding_window > 0 else 0
        for head in range(hq):
            kv_head = head // (hq // hk)
            s = k_cf[lo:hi, kv_head].astype(np.float64) @ qr[i, head] / math.sqrt(d)
            if logit_softcap > 0:
                s = logit_softcap * np.tanh(s / logit_softcap)
            sink = -math.inf if sinks is None else float(sinks[head])
            m = max(s.max(initial=-math.inf), sink)
            p = np.exp(s - m)
            den = p.sum() + (0.0 if sinks is None else math.exp(sink - m))
            out[i, head] = p @ v_cf[lo:hi, kv_head].astype(np.float64) / den
            lse[i, head] = m + math.log(den)
    return out @ h, lse
