"""bench/gpu_dynamic_bert.py on a CPU host: its arguments are checked before any GPU work, and the like-for-like
summary (per mode, routed T counted 1.0×) is right on synthetic rows."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest

from tests.bench.modules import ROOT, load

bert = load("gpu_dynamic_bert")


def _error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exc:
        bert.parse_args(list(argv))
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_ms_shapes_above_t_max_are_an_argument_error(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, "--t-max", "32")  # the default --ms-shapes has 61, 97, 128
    assert "--ms-shapes 61,97,128 above --t-max 32" in err


def test_ms_shapes_must_be_measured_and_ts_within_t_max(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--ms-shapes 61 not among the measured --ts" in _error(capsys, "--ts", "1,16", "--ms-shapes", "16,61")
    assert "--ts 200 above --t-max 128" in _error(capsys, "--ts", "1,200")
    assert "unknown --layers nope" in _error(capsys, "--layers", "qkv,nope")
    assert "≥ 1" in _error(capsys, "--ts", "0,4")


def test_valid_arguments_and_what_they_become() -> None:
    args = bert.parse_args(["--ts", "16,1,128,16", "--extra-ts", "512,64", "--ms-shapes", "16,128"])
    assert args.ts == [1, 16, 128]
    assert args.extra_ts == [512]  # 64 is inside the headline range, so not "extra"
    assert bert.parse_args(["--t-max", "8", "--ms-trials", "0"]).ts == list(range(1, 9))  # no MS: no MS check
    assert bert.parse_args(["--layers", "all"]).layer_names == list(bert.LAYERS)


def test_the_script_refuses_bad_arguments_before_touching_a_gpu() -> None:
    done = subprocess.run(
        [sys.executable, "bench/gpu_dynamic_bert.py", "--t-max", "8"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "above --t-max 8" in done.stderr and "NoCudaDevice" not in done.stderr


def _row(called: tuple[float, float], graph: tuple[float, float] | None, routed: bool) -> dict[str, Any]:
    row: dict[str, Any] = {"ours_called_us": called[0], "cublas_fp32_called_us": called[1], "routed_to_cublas": routed}
    if graph is not None:
        row.update(ours_graph_us=graph[0], cublas_fp32_graph_us=graph[1])
    return row


# (ours, cuBLAS) µs per mode; T=512 lies beyond --t-max and must not count
ROWS = {
    "1": _row((20.0, 10.0), (5.0, 4.5), routed=True),
    "2": _row((10.0, 20.0), (8.0, 4.0), routed=False),
    "3": _row((10.0, 10.0), (4.0, 8.0), routed=False),
    "4": _row((16.0, 4.0), (2.0, 4.0), routed=False),
    "512": _row((1.0, 100.0), (1.0, 100.0), routed=False),
}


def test_called_mode_summary() -> None:
    s = bert.mode_summary(ROWS, "called", t_max=128)
    assert s["t_measured"] == 4
    assert math.isclose(s["ukernels"]["geomean"], (0.5 * 2.0 * 1.0 * 0.25) ** 0.25)
    assert (s["ukernels"]["worst_t"], s["ukernels"]["worst"]) == (4, 0.25)
    assert math.isclose(s["dispatcher"]["geomean"], (1.0 * 2.0 * 1.0 * 0.25) ** 0.25)  # routed T=1 counts 1.0×
    assert s["routed_t"] == [1]
    assert s["routing_disagrees"] == [4]  # not routed, yet cuBLAS 4× faster as called


def test_kernel_only_mode_summary_and_missing_rows() -> None:
    rows = {**ROWS, "3": _row((10.0, 10.0), None, routed=False)}  # graph capture failed at T=3
    s = bert.mode_summary(rows, "graph", t_max=128)
    assert s["t_measured"] == 3 and s["t_missing"] == [3]
    assert math.isclose(s["ukernels"]["geomean"], (0.9 * 0.5 * 2.0) ** (1 / 3))
    assert math.isclose(s["dispatcher"]["geomean"], (1.0 * 0.5 * 2.0) ** (1 / 3))
    assert (s["dispatcher"]["worst_t"], s["dispatcher"]["worst"]) == (2, 0.5)
    assert s["routing_disagrees"] == [2]  # T=1 was routed and cuBLAS is faster kernel-only too: agrees


def test_worst_ties_name_the_lowest_t_and_nothing_measured_is_an_error() -> None:
    rows = {str(t): _row((10.0, 5.0), None, routed=False) for t in (9, 3, 7)}
    called = bert.mode_summary(rows, "called", t_max=128)
    assert called["ukernels"]["worst_t"] == 3
    assert "error" in bert.mode_summary(rows, "graph", t_max=128)


def test_metaschedule_summary_uses_our_kernel_times() -> None:
    rows = {
        "16": {"ours_kernels_us": 10.0, "ms_pad128_us": 30.0},
        "128": {"ours_kernels_us": 20.0, "ms_pad128_us": 30.0},
    }
    ms = {"exact": {"16": {"us": 12.0, "tuning_s": 40.0}, "128": {"us": 30.0, "tuning_s": 60.0}}}
    s = bert.ms_summary(rows, ms, tuning_s=100.0, t_max=128)
    assert math.isclose(s["geomean_ms_exact_over_ours"], math.sqrt(1.2 * 1.5))
    assert math.isclose(s["geomean_ms_pad128_over_ours"], math.sqrt(3.0 * 1.5))
    assert math.isclose(s["ms_all_shapes_tuning_s_extrapolated"], 50.0 * 128)
    assert math.isclose(s["tuning_cost_ratio"], 50.0 * 128 / 100.0)


def test_routing_mode_comes_from_the_tuner_record() -> None:
    assert bert.routing_mode({"vendor_routes": {"mode": "kernel-only"}}) == "kernel-only"
    assert "called from Python" in bert.routing_mode({"vendor_routes": {"vendor": "cuBLAS (called from Python)"}})
    assert bert.routing_mode({}).startswith("unknown")
