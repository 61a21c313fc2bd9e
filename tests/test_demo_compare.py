"""The demo's results table tells the truth: the library each route really runs, the faster of numpy and PyTorch as
the baseline, every contender timed in the same interleaved rounds, the spread, and the machine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import NO_EPILOGUE
from service.demo_compare import (
    Comparison,
    Route,
    Row,
    compare,
    dispatcher_route,
    interleaved,
    machine,
    notes,
    results_table,
)
from tests.clients.vendor_calls import record_library_calls

# M 1..8 routed to numpy, 9..20 on the uKernel "u" (mt=16), 21.. routed to PyTorch
TABLE = DispatchTable(
    (Interval(1, 8, None), Interval(9, 20, Shape((), "u")), Interval(21, 300, None, vendor.TORCH)), {"u": 16}
)
FAKE_UKERNEL = SimpleNamespace(spec=SimpleNamespace(mt=16, nt=16, epilogue=NO_EPILOGUE, dtype="float32"))


def test_every_round_times_every_contender_once_each_round_starting_one_later() -> None:
    log: list[str] = []
    contenders = {name: (lambda name=name: log.append(name)) for name in "ABC"}
    samples = interleaved(contenders, rounds=4, min_sample_s=0, pause_s=0)
    assert {name: len(s) for name, s in samples.items()} == {"A": 4, "B": 4, "C": 4}
    timed = log[2 * len(contenders) :]  # after two calibration calls each; then a sample is one untimed + one timed
    assert timed[1::2] == timed[::2] == list("ABCBCACABABC")


def test_the_baseline_is_the_faster_library_and_the_spread_is_per_round() -> None:
    c = Comparison.of({"dispatcher": [1.0, 2.0, 1.0], vendor.NUMPY: [3.0, 3.0, 3.0], vendor.TORCH: [2.0, 2.0, 4.0]})
    assert c.faster == vendor.TORCH and c.subject_s == 1.0 and c.vendors_s == {vendor.NUMPY: 3.0, vendor.TORCH: 2.0}
    assert c.ratio == 2.0 and c.spread == (1.0, 4.0) and c.rounds == 3
    slower = Comparison.of({"dispatcher": [4.0, 4.0, 5.0], vendor.NUMPY: [2.0, 2.5, 2.0], vendor.TORCH: [3.0] * 3})
    assert slower.faster == vendor.NUMPY and slower.ratio == 0.5 and slower.spread == (0.4, 0.625)


def test_each_route_is_named_by_what_runs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    d = Dispatcher(TABLE, {"u": FAKE_UKERNEL}, N=64, K=32, exact={50: lambda x, w: x @ w.T})  # type: ignore[dict-item]
    assert dispatcher_route(d, 4) == Route("numpy (vendor route)", vendor.NUMPY)
    assert dispatcher_route(d, 12) == Route("uKernels 12@mt16", None)
    assert dispatcher_route(d, 61) == Route("PyTorch (vendor route)", vendor.TORCH)
    assert dispatcher_route(d, 50) == Route("exact-shape kernel (TVM)", None)
    assert dispatcher_route(Dispatcher(None, {}, N=None, K=None), 61) == Route(
        "numpy (no table: fallback)", vendor.NUMPY
    )
    monkeypatch.setattr(vendor, "has_torch", lambda: False)  # a PyTorch route runs numpy here: say so
    assert dispatcher_route(d, 61) == Route("numpy (vendor route) (the table names PyTorch, absent here)", "numpy")


def test_the_subject_is_timed_with_every_library_here_in_the_same_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    called: list[str] = []
    record_library_calls(monkeypatch, called)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((5, 32), dtype=np.float32), rng.standard_normal((24, 32), dtype=np.float32)

    def run(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        called.append("dispatcher")
        return a @ b.T

    c = compare(run, x, w, NO_EPILOGUE, rounds=3, min_sample_s=0, pause_s=0)
    assert set(c.vendors_s) == set(vendor.available()) == {vendor.NUMPY, vendor.TORCH}
    # each: two calibration calls, then per round one untimed and one timed call, in the same rounds
    assert {n: called.count(n) for n in set(called)} == {"dispatcher": 8, vendor.NUMPY: 8, vendor.TORCH: 8}
    assert called[6:12] == ["dispatcher"] * 2 + [vendor.NUMPY] * 2 + [vendor.TORCH] * 2
    assert c.spread[0] <= c.ratio <= c.spread[1] and c.subject_s > 0


def test_the_table_names_each_library_and_calls_a_vendor_route_no_win() -> None:
    def result(ours: float, numpy: float, torch: float) -> Comparison:
        return Comparison.of({"dispatcher": [ours] * 3, vendor.NUMPY: [numpy] * 3, vendor.TORCH: [torch] * 3})

    rows = [
        Row(1, 0.4, Route("PyTorch (vendor route)", vendor.TORCH), result(10e-6, 20e-6, 10e-6)),
        Row(61, 0.2, Route("uKernels 48@mt48 + 13@mt13", None), result(100e-6, 150e-6, 200e-6)),
        Row(200, None, Route("numpy (vendor route)", vendor.NUMPY), result(1e-3, 1e-3, 0.8e-3)),
    ]
    console = Console(record=True, width=240)
    console.print(results_table(rows, "t"))
    out = console.export_text()
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert "numpy (µs)" in out and "PyTorch (µs)" in out
    assert "PyTorch (vendor route)" in lines["1"] and "1.00× vs PyTorch" in lines["1"] and "0.40" in lines["1"]
    assert "uKernels 48@mt48 + 13@mt13" in lines["61"] and "1.50× vs numpy" in lines["61"]
    assert "numpy (vendor route)" in lines["200"] and "0.80× vs PyTorch" in lines["200"] and " - " in lines["200"]
    said = " ".join(notes(rows))
    assert "M = 1: the dispatcher calls PyTorch itself" in said and "M = 200: the dispatcher calls numpy" in said
    assert "not a KernelFleet win" in said and "M = 61: KernelFleet's own kernels" in said


def test_the_machine_line_names_the_cpu_and_each_librarys_threads(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Example CPU 9000 @ 3.0GHz\nflags\t\t: fpu avx2\n")
    line = machine(cpuinfo)
    assert line.startswith("Example CPU 9000 @ 3.0GHz, ") and "usable cores" in line
    assert "TVM (uKernels): " in line and "numpy " in line and "PyTorch " in line
