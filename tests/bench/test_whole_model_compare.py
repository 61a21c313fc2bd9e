"""bench/whole_model_compare.py on synthetic runs: accelerate from one run against PyTorch at its best of two."""

from __future__ import annotations

import math
from typing import Any

from tests.bench.modules import load

compare = load("whole_model_compare").compare


def _run(policy: str, times: dict[int, tuple[float, float, float]]) -> dict[str, Any]:
    rows = [
        {"kind": "forward", "batch": 1, "seq": seq, "weight": 0.5,
         "median_s": {"eager": e, "accelerate": a, "compile": c}}
        for seq, (e, a, c) in times.items()
    ]  # fmt: skip
    return {"command": f"whole_model.py --omp-wait-policy {policy}", "OMP_WAIT_POLICY": policy,
            "models": {"bert": {"measure": {"rows": rows}}}}  # fmt: skip


def test_the_ratio_is_against_pytorchs_faster_setting_per_point() -> None:
    passive = _run("PASSIVE", {1: (0.020, 0.010, 0.018), 8: (0.040, 0.050, 0.045)})
    default = _run("default", {1: (0.015, 0.030, 0.020), 8: (0.060, 0.090, 0.030)})
    lines = compare(passive, default)
    # seq 1: eager best 15 ms / 10 → 1.5×, compile best 18 / 10 → 1.8×; seq 8: 40 / 50 → 0.8×, 30 / 50 → 0.6×
    assert "  seq    1: accelerate 10.00 ms; eager 20.00 / 15.00 ms → 1.50×; compile 18.00 / 20.00 ms → 1.80×" in lines
    assert "compile 45.00 / 30.00 ms → 0.60×" in lines[-2]
    eager, comp = math.sqrt(1.5 * 0.8), math.sqrt(1.8 * 0.6)
    assert lines[-1] == (
        f"  => weighted geomean: best eager/accelerate {eager:.2f}× (worst 0.80× at seq 8), "
        f"best compile/accelerate {comp:.2f}× (worst 0.60× at seq 8)"
    )
