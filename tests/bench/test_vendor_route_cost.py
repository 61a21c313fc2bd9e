"""bench/vendor_route_cost.py on a few tiny cases: every case runs, is checked against its budget and reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.modules import load


def test_a_short_run_reports_each_case_against_its_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load("vendor_route_cost")
    out = tmp_path / "cost.json"
    bench.main(["--rows", "1", "--conv-batches", "1", "--paired-s", "0.01", "--only", "numpy", "--out", str(out)])
    data = json.loads(out.read_text())
    cases = [r["case"] for r in data["results"]]
    assert any(c.startswith("dense") for c in cases) and any(c.startswith("bmm") for c in cases)
    assert any(c.startswith("conv3x3") for c in cases) and all("numpy" in c for c in cases)
    for r in data["results"]:
        assert r["pairs"] >= 50 and r["budget_s"] == pytest.approx(1e-6 + 0.02 * r["direct"])
        assert r["goal_met"] == (r["difference"] <= r["budget_s"])
    text = out.with_suffix(".txt").read_text().splitlines()
    assert len(text) == len(cases) + 2 and text[-1].endswith(
        f"of {len(cases)} cases within 1 µs + 2 % of the direct call"
    )
    assert text[-1] in capsys.readouterr().out
