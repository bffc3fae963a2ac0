"""Accuracy guard: pins today's quantization errors and method ordering (docs/ACCURACY.md).

Measures, with libkvarn, the relative MSE of K and V and the attention-output error (decode
semantics, the model's own queries) of KVarN and the baselines (Hadamard+RTN, KIVI-style,
per-token RTN, fp8 e4m3) on
  - the austen-d128 KV dump in tests/data/austen (6 layers x 2 KV heads x 1024 tokens, with the
    model's queries at every 4th position), and
  - two small seeded synthetic caches (eval/accuracy/synthetic.py, 2 layers x 1024 tokens).
It fails when any value rises above its threshold in eval/accuracy/guard_thresholds.json
(today's value + 2%), or when the ordering of KVarN and the three baselines of the same bits on
the austen dump changes (pairs within 0.1% of each other are ties and are not checked).

After an intended change of the numbers: `python -m eval.accuracy.report --update-guard`
(from the repository root, kvarn importable), then commit the new json with the reason.

Needs only numpy and kvarn (no matplotlib, no model files). The measurement runs in a child
process with one BLAS thread (small matmuls; OpenBLAS's spinning threads are slow on a busy
2-core machine); about 5 s.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

SOURCE_DIR = pathlib.Path(
    os.environ.get("KVARN_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[2])
)
THRESHOLDS = SOURCE_DIR / "eval" / "accuracy" / "guard_thresholds.json"
DATA = SOURCE_DIR / "tests" / "data" / "austen"

_CHILD = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); "
    "from eval.accuracy.report import guard_measurements; "
    "print('GUARD-JSON ' + json.dumps(guard_measurements()))"
)


@pytest.fixture(scope="module")
def recorded() -> dict:
    assert THRESHOLDS.exists(), f"missing {THRESHOLDS}"
    return json.loads(THRESHOLDS.read_text())


@pytest.fixture(scope="module")
def measured() -> dict:
    for name in ("kv-persuasion-100000-1024.safetensors",
                 "q-persuasion-100000-1024-stride4.safetensors"):
        assert (DATA / name).exists(), f"missing guard data {DATA / name}"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(SOURCE_DIR)], env=env,
                          capture_output=True, text=True, timeout=240)
    sys.stderr.write(proc.stderr)
    assert proc.returncode == 0, f"guard measurement failed:\n{proc.stderr[-4000:]}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("GUARD-JSON ")][-1]
    return json.loads(line[len("GUARD-JSON "):])


def test_every_recorded_value_is_measured(recorded: dict, measured: dict) -> None:
    missing = [f"{wl}/{n}/{m}" for wl, res in recorded["thresholds"].items()
               for n, r in res.items() for m in r
               if m not in measured.get(wl, {}).get(n, {})]
    extra = [f"{wl}/{n}" for wl, res in measured.items() for n in res
             if n not in recorded["thresholds"].get(wl, {})]
    assert not missing and not extra, (
        f"guard set changed: not measured {missing}, not recorded {extra}; rerun "
        "`python -m eval.accuracy.report --update-guard` if intended")


def test_errors_below_thresholds(recorded: dict, measured: dict) -> None:
    failures = []
    for wl, res in recorded["thresholds"].items():
        for name, limits in res.items():
            for metric, limit in limits.items():
                value = measured.get(wl, {}).get(name, {}).get(metric)
                if value is None:
                    continue
                if not value <= limit:
                    was = recorded["values"][wl][name][metric]
                    failures.append(
                        f"{wl} {name} {metric}: {value:.6g} > threshold {limit:.6g} "
                        f"(recorded {was:.6g}, {100 * (value / was - 1):+.2f}%)")
    assert not failures, "accuracy regression:\n  " + "\n  ".join(failures)


def test_method_ordering_on_austen_kv_dump(recorded: dict, measured: dict) -> None:
    sys.path.insert(0, str(SOURCE_DIR))
    from eval.accuracy.report import ordering_violations

    bad = ordering_violations(recorded["orderings"], measured)
    assert not bad, (
        "the ordering of the methods on the austen KV dump changed (recorded in "
        f"{THRESHOLDS.name}, lowest error first):\n  " + "\n  ".join(bad))
