"""Binding lifetimes as a tested contract (issue 28): each scenario of lifetime_script.py runs in
a child interpreter under `-X dev` and must exit 0 (a crash or a double free at a collection or
at interpreter exit shows up as its exit status). The child inherits the environment: in the
ASan build (tests/python_tests.cmake) it runs with the ASan runtime preloaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize(
    "scenario", ["cycles", "exit_cycles", "context_first", "dependents_first", "threads"]
)
def test_lifetime_scenario_exits_cleanly(scenario):
    proc = subprocess.run(
        [sys.executable, "-X", "dev", os.path.join(HERE, "lifetime_script.py"), scenario],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert f"ok {scenario}" in proc.stdout
    assert "Exception ignored" not in proc.stderr, proc.stderr[-4000:]
