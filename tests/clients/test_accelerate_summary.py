"""The speedup accelerate's summary expects from a dispatch document's timings (validation.vendor_routes.timed_s)."""

from __future__ import annotations

import math

import pytest

from kernelfleet.accelerate_summary import AccelerationSummary, LayerSummary, Speedup, expected_speedup


def test_each_timed_s_counts_what_the_table_runs_there_against_pytorch() -> None:
    timed = {
        "1": {"tuned": 1.0, "vendor": 2.0, "numpy": 2.0, "torch": 3.0, "route": "ukernel"},  # uKernels: 3 / 1
        "8": {"tuned": 5.0, "vendor": 2.0, "numpy": 2.0, "torch": 4.0, "route": "numpy"},  # numpy runs: 4 / 2
        "64": {"tuned": 9.0, "vendor": 6.0, "numpy": 7.0, "torch": 6.0, "route": "torch"},  # PyTorch runs: 1
    }
    s = expected_speedup(timed)
    assert s is not None and (s.baseline, s.low, s.high, s.shapes) == ("torch", 1.0, 3.0, 3)
    assert s.geomean == pytest.approx(math.cbrt(3 * 2 * 1))
    assert s.describe() == "1.82x vs PyTorch (1.00-3.00x over 3 timed S)"
    # a layer that runs its vendor routes on PyTorch (vendor_routes="pytorch") expects 1x at S = 8, not numpy's 2x
    on_pytorch = expected_speedup(timed, vendor_on_pytorch=True)
    assert on_pytorch is not None and on_pytorch.geomean == pytest.approx(math.cbrt(3 * 1 * 1))


def test_without_pytorch_timed_the_fastest_library_is_the_baseline_and_no_timings_is_unknown() -> None:
    numpy_only = {"4": {"tuned": 1.0, "vendor": 1.5, "numpy": 1.5, "route": "ukernel"}}
    assert expected_speedup(numpy_only) == Speedup("vendor", 1.5, 1.5, 1.5, 1)
    # a job that recorded no route ran the faster of the two: no speedup where the vendor was faster
    assert expected_speedup({"4": {"tuned": 3.0, "vendor": 1.0}}) == Speedup("vendor", 1.0, 1.0, 1.0, 1)
    for unknown in (None, {}, {"4": {"tuned": 0.0, "vendor": 1.0}}, {"4": {"tuned": "fast"}}, {"4": [1.0, 2.0]}):
        assert expected_speedup(unknown) is None, unknown


def test_the_printed_summary_names_each_layer_and_what_runs_it() -> None:
    summary = AccelerationSummary(
        "ab" * 16,
        (
            LayerSummary("fc1", "12" * 16, "tables", "cache", "+ bias, gelu", None, Speedup("torch", 1.5, 1, 2, 4)),
            LayerSummary("fc2", "34" * 16, "tables", "service", "+ bias"),
            LayerSummary("head", "56" * 16, "pytorch", "none", "none", "workload 565656565656: no table"),
        ),
    )
    assert [layer.name for layer in summary.on_pytorch] == ["head"]
    assert str(summary).splitlines() == [
        "kernelfleet.accelerate (target abababababab): 2 of 3 layers on tuned tables, 1 on PyTorch",
        "  fc1: table 121212121212 from the cache, fused + bias, gelu; 1.50x vs PyTorch (1.00-2.00x over 4 timed S)",
        "  fc2: table 343434343434 from the service, fused + bias; expected speedup unknown (the table has no timings)",
        "  head: PyTorch (workload 565656565656: no table)",
    ]
