"""kvarn.selftest(): passes on this machine, reports every row, and raises on a failing check."""

from __future__ import annotations

import pytest

import kvarn
import kvarn._selftest as st


def test_selftest_passes_for_every_preset():
    report = kvarn.selftest()
    assert report and report.failed == 0
    assert [r["preset"] for r in report.rows] == kvarn.presets()
    for row in report.rows:
        assert row.passed and row["head_dim"] == 128
        assert row["k_rel_mse"] < row["k_rel_mse_rtn"]
        assert row["attention_rel_l2"] < 1e-3 and row["flush_matches_quantize"]
    text = str(report)
    assert "cpu" in text and f"{len(report.rows)} passed, 0 failed" in text


def test_selftest_prints_its_report_unless_told_not_to(capsys):
    report = kvarn.selftest(preset_names=["k4v2_g128"])
    assert capsys.readouterr().out == f"{report}\n"
    kvarn.selftest(preset_names=["k4v2_g128"], verbose=False)
    assert capsys.readouterr().out == ""


def test_selftest_other_head_dims_and_contexts():
    ctx = kvarn.Context("cpu", num_threads=1)
    report = kvarn.selftest(ctx, preset_names=["k4v2_g64", "k8v8_g128"], head_dims=[64, 256])
    assert [(r["preset"], r["head_dim"]) for r in report.rows] == [
        ("k4v2_g64", 64),
        ("k4v2_g64", 256),
        ("k8v8_g128", 64),
        ("k8v8_g128", 256),
    ]
    assert report.passed == 4


def test_selftest_raises_with_the_report_when_a_check_fails(monkeypatch):
    # A "baseline" with no error at all: KVarN cannot beat it, so the round-trip check fails.
    monkeypatch.setattr(st, "rtn_per_token", lambda x, bits: x)
    with pytest.raises(kvarn.SelftestError) as info:
        kvarn.selftest(preset_names=["k4v2_g128"])
    report = info.value.report
    assert report.failed == 1 and "per-token RTN" in report.rows[0]["failures"][0]
    assert "FAILED" in str(report)
    quiet = kvarn.selftest(preset_names=["k4v2_g128"], raise_on_failure=False)
    assert not quiet and quiet.failed == 1
