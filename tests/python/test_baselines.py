"""kvarn.baseline_roundtrip: the accuracy study's non-KVarN baselines, against a numpy
re-derivation and on every error path."""

from __future__ import annotations

import numpy as np
import pytest

import kvarn


def _rtn_numpy(x: np.ndarray, bits: int) -> np.ndarray:
    lo = x.min(axis=-1, keepdims=True).astype(np.float16).astype(np.float32)
    hi = x.max(axis=-1, keepdims=True)
    qmax = np.float32(2**bits - 1)
    scale = ((hi - lo) / qmax).astype(np.float16).astype(np.float32)
    codes = np.clip(np.rint((x - lo) / scale), 0, qmax)
    return codes * scale + lo


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_per_token_rtn_matches_numpy(rng, bits):
    x = (rng.standard_normal((5, 7, 64)) * rng.uniform(0.1, 10, (5, 7, 1))).astype(np.float32)
    got = kvarn.baseline_roundtrip(x, "per_token_rtn", bits)
    assert got.shape == x.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, _rtn_numpy(x, bits), rtol=0, atol=1e-6 * np.abs(x).max())


def test_fp8_matches_ml_dtypes(rng):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = (rng.standard_normal((16, 128)) * rng.uniform(0.01, 100, (16, 1))).astype(np.float32)
    scale = (np.abs(x).max(axis=-1, keepdims=True) / 448).astype(np.float16).astype(np.float32)
    want = (x / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale
    np.testing.assert_array_equal(kvarn.baseline_roundtrip(x, "fp8_e4m3"), want)


def test_more_bits_less_error(rng):
    x = rng.standard_normal((32, 128)).astype(np.float32)
    errs = [
        float(np.mean((kvarn.baseline_roundtrip(x, "per_token_rtn", b) - x) ** 2))
        for b in (2, 4, 8)
    ]
    assert errs[0] > errs[1] > errs[2] > 0


def test_bad_input_raises(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    with pytest.raises(kvarn.InvalidArgumentError, match="method"):
        kvarn.baseline_roundtrip(x, "kivi")
    with pytest.raises(kvarn.InvalidArgumentError, match="bits"):
        kvarn.baseline_roundtrip(x, "per_token_rtn")
    with pytest.raises(kvarn.InvalidArgumentError, match="bits"):
        kvarn.baseline_roundtrip(x, "per_token_rtn", 9)
    with pytest.raises(kvarn.ShapeError):
        kvarn.baseline_roundtrip(np.zeros((3, 0), np.float32), "fp8_e4m3")
    x[1, 3] = np.inf
    with pytest.raises(kvarn.NonFiniteError):
        kvarn.baseline_roundtrip(x, "fp8_e4m3")
    x[1, 3] = 1e6
    with pytest.raises(kvarn.Fp16OverflowError):
        kvarn.baseline_roundtrip(x, "per_token_rtn", 4)
