"""Tables route every S where the vendor (numpy) is faster, as the SDK calls both, to the vendor (issue 10 item 3).

Before, a table was published whole: S where numpy beat the tuned program still ran the tuned program.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from kernelfleet.dispatch import VENDOR, DispatchTable, Interval, Shape
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.ukernel import UKernel
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.kinds.ukernel import verify
from service.tuning.tuners.ukernel.combine import TileCost, combine, dispatch_table
from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner
from service.tuning.tuners.ukernel.vendor_routes import (
    DECIDED_BY,
    fastest_libraries,
    geometric_grid,
    vendor_sweep_shapes,
    vendor_wins,
)
from tests.clients.vendor_calls import record_library_calls


def _costs() -> list[TileCost]:
    return [
        TileCost.from_measurements("a", 8, {8: 8e-6, 64: 64e-6}),
        TileCost.from_measurements("b", 3, {3: 4e-6, 30: 40e-6}),
    ]


def test_vendor_intervals_on_the_wire_and_in_lookups() -> None:
    programs = combine(_costs(), 40)
    table = dispatch_table(programs, vendor={1, 2, 3, 4, 39, 40})
    assert table.intervals[0] == Interval(1, 4, None) and table.intervals[-1] == Interval(39, 40, None)
    wire = table.to_dict()
    assert wire["intervals"][0] == [1, 4, VENDOR] and wire["intervals"][-1] == [39, 40, VENDOR]
    again = DispatchTable.from_dict(wire)
    assert again == table
    assert again.lookup(2) == () and again.vendor_at(40) and again.vendor_at(1000)  # a last vendor interval extends
    for S in range(5, 39):  # untouched S keep the optimiser's program
        assert again.lookup(S) == programs[S - 1].pieces and not again.vendor_at(S)
    with pytest.raises(ValueError, match="unknown interval kind"):
        DispatchTable.from_dict({"mts": {}, "intervals": [[1, 4, "gpu"]]})


def test_only_ukernels_a_tuned_interval_uses_are_named() -> None:
    programs = combine(_costs(), 40)
    everything_vendor = dispatch_table(programs, vendor=set(range(1, 41)))
    assert everything_vendor.mts == {} and everything_vendor.intervals == (Interval(1, 40, None),)
    assert set(dispatch_table(programs).mts) <= {"a", "b"}


def test_vendor_wins_decides_unmeasured_s_by_the_nearest_timed_one() -> None:
    timed = {1: (2.0, 1.0), 10: (1.0, 2.0), 20: (3.0, 1.0)}
    wins = vendor_wins(timed, 24)
    # 2..5 are nearer 1 (5 is 4 from 1 and 5 from 10), 15 is as near 10 as 20 (the lower wins), 21.. follow 20
    assert wins == {*range(1, 6), *range(16, 25)}
    table = DispatchTable((Interval(1, 300, Shape((), "a")),), {"a": 4})
    shapes = vendor_sweep_shapes(table, extra=[299])
    assert set(range(1, 257)) <= set(shapes) and {299, 300} <= set(shapes)


def test_dispatcher_runs_numpy_on_vendor_routes_without_counting_a_fallback(ukernels: dict[str, UKernel]) -> None:
    uid, kernel = next(iter(ukernels.items()))
    spec = kernel.spec
    table = DispatchTable(
        (Interval(1, 8, None), Interval(9, 40, Shape((), uid)), Interval(41, 50, None)), {uid: spec.mt}
    )
    d = Dispatcher(table, {uid: kernel}, N=spec.N, K=spec.K)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((spec.N, spec.K), dtype=np.float32)
    for S in (1, 8, 9, 40, 41, 77):
        x = rng.standard_normal((S, spec.K), dtype=np.float32)
        np.testing.assert_allclose(d(x, w), x @ w.T, rtol=1e-4, atol=1e-4)
    assert d.program(5) == () and d.program(77) == () and d.program(9)
    usage = d.usage()
    assert sum(u.fallbacks for u in usage.values()) == 0 and usage[77].calls == 1


def _task(tmp_path: Path, n: int, k: int, s_max: int, **kw: object) -> RangeTask:
    return RangeTask(
        workload=WorkloadSpec(op="dense", dims={"N": n, "K": k}, symbolic=["M"]),
        s_max=s_max,
        validate=[s_max, 1],
        target=host_target(),
        max_ukernels=2,
        work_dir=tmp_path,
        min_repeat_ms=2,
        **kw,  # type: ignore[arg-type]
    )


def test_every_timed_s_runs_on_whichever_was_faster(tmp_path: Path) -> None:
    task = _task(tmp_path, 256, 256, 48)
    out = UKernelTuner().tune(task, QuietRangeSink())
    routes = out.validation["vendor_routes"]
    timed = {int(S): (t["tuned"], t["vendor"]) for S, t in routes["timed_s"].items()}
    # the geometric grid and the hot shapes, as the SDK calls both, plus what the crossings and the model asked for
    assert set(geometric_grid(48)) | {1, 48} <= set(timed) and routes["shapes_timed"] == len(timed)
    assert set(routes["decided_by"]) == set(DECIDED_BY) and sum(routes["decided_by"].values()) == 48
    assert routes["libraries"] == ["numpy", "torch"]  # every vendor library this worker has, timed as the SDK calls it
    for S, (_, vendor) in timed.items():
        record = routes["timed_s"][str(S)]
        samples = record["samples_s"]  # the paired rounds behind the decision, published with it
        assert record["rounds"] >= 3 and all(len(t) == record["rounds"] for t in samples.values())
        libraries = {lib: statistics.median(samples[lib]) for lib in routes["libraries"]}
        fastest = min(libraries, key=lambda lib: libraries[lib])
        assert vendor == libraries[fastest] == record[fastest]
        ratios = [o / v for o, v in zip(samples["ukernel"], samples[fastest], strict=True)]
        # uKernels keep S only when the sign test over >= 5 rounds passes (p <= 0.05) and the median round wins by 5 %
        wins = sum(r < 1 for r in ratios)
        p = sum(math.comb(len(ratios), k) for k in range(wins, len(ratios) + 1)) / 2 ** len(ratios)
        kept = len(ratios) >= 5 and p <= 0.05 and statistics.median(ratios) <= 0.95
        assert out.table.vendor_at(S) == (not kept) == (record["route"] != "ukernel"), (S, ratios)
        if out.table.vendor_at(S):  # and the fastest library runs there
            assert out.table.vendor_library(S) == record["route"] == fastest
    points = sorted(timed)
    for lo, hi in itertools.pairwise(points):  # every crossing between timed S is exact
        if out.table.vendor_at(lo) != out.table.vendor_at(hi):
            assert hi == lo + 1, (lo, hi)
        else:  # and the S between two that agree follow them
            assert all(out.table.vendor_at(S) == out.table.vendor_at(lo) for S in range(lo, hi))
    assert verify(out, task.workload) is None
    for S in (1, 48):
        entry = out.validation["shapes"][str(S)]
        assert entry["route"] == ("vendor" if out.table.vendor_at(S) else "ukernel")
        assert entry["vendor_measured_s"] > 0 and entry["tuned_measured_s"] > 0


def test_a_layer_numpy_always_wins_routes_everything_to_the_vendor(tmp_path: Path) -> None:
    # 16×16 weights: numpy needs about a microsecond, less than any call into TVM costs
    out = UKernelTuner().tune(_task(tmp_path, 16, 16, 8), QuietRangeSink())
    assert not out.serves_ukernels and out.table.intervals == (Interval(1, 8, None),)
    assert out.kernels == {} and out.artifacts == {} and out.padding_ratio == 0.0
    kept = UKernelTuner().tune(_task(tmp_path / "off", 16, 16, 8, vendor_routes=False), QuietRangeSink())
    assert kept.serves_ukernels and all(not iv.vendor for iv in kept.table.intervals)


def test_a_table_that_routes_every_s_to_the_vendor_loads_and_runs_numpy(tmp_path: Path) -> None:
    import datetime as dt

    from kernelfleet.dispatch_cache import DispatchCache, dispatcher_from_doc
    from kernelfleet.models import DispatchDoc

    everything_vendor = dispatch_table(combine(_costs(), 40), vendor=set(range(1, 41)))
    doc = DispatchDoc(
        workload_hash="ab" * 8,
        target_fingerprint="cd" * 8,
        dim="M",
        s_max=40,
        table=everything_vendor.to_dict(),
        ukernels=[],  # no uKernel won anywhere, so none ships
        predicted_latency_s=[1e-6] * 40,
        measured_latency_s={},
        created_at=dt.datetime.now(dt.UTC),
    )
    d = dispatcher_from_doc(doc, DispatchCache(tmp_path), "service")
    assert isinstance(d, Dispatcher)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((7, 24)).astype("float32"), rng.standard_normal((16, 24)).astype("float32")
    np.testing.assert_allclose(d(x, w), x @ w.T, rtol=1e-5)


def test_a_table_of_vendor_routes_only_needs_no_ukernels() -> None:
    # what a job publishes when told to publish even where numpy wins everywhere
    # (KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR=false): the SDK loads it without any uKernel spec
    d = Dispatcher(DispatchTable((Interval(1, 8, None),), {}), {}, N=None, K=None)
    x, w = np.ones((11, 5), np.float32), np.ones((3, 5), np.float32)
    np.testing.assert_allclose(d(x, w), x @ w.T)
    assert not d.fallback and d.usage()[11].fallbacks == 0


def test_each_vendor_s_runs_the_library_fastest_at_it_or_at_the_nearest_timed_s() -> None:
    timed = {1: {"numpy": 1.0, "torch": 2.0}, 10: {"numpy": 3.0, "torch": 2.0}, 20: {"numpy": 1.0, "torch": 1.5}}
    libs = fastest_libraries([1, 2, 5, 6, 10, 15, 16, 30], timed)
    # 5 is nearer 1 than 10; 15 is as near 10 as 20 (the lower wins); 30 is past the last timed S
    assert libs == {1: "numpy", 2: "numpy", 5: "numpy", 6: "torch", 10: "torch", 15: "torch", 16: "numpy", 30: "numpy"}
    with pytest.raises(ValueError, match="no timed S"):
        fastest_libraries([1], {})


def test_consecutive_vendor_s_form_one_interval_per_library() -> None:
    programs = combine(_costs(), 40)
    routes = {1: "numpy", 2: "numpy", 3: "torch", 4: "torch", 40: "torch"}
    table = dispatch_table(programs, routes)
    assert table.intervals[:2] == (Interval(1, 2, None, "numpy"), Interval(3, 4, None, "torch"))
    assert table.intervals[-1] == Interval(40, 40, None, "torch")
    assert [table.vendor_library(s) for s in (1, 3, 5, 40, 400)] == ["numpy", "torch", None, "torch", "torch"]
    assert DispatchTable.from_dict(table.to_dict()) == table
    # a collection of S means numpy, as before libraries were named
    assert dispatch_table(programs, {1, 2}).intervals[0] == Interval(1, 2, None, "numpy")


def test_each_timing_block_starts_after_the_previous_librarys_threads_are_asleep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PyTorch's OpenMP workers spin about 3.5 ms after a call: a block timed right after one shares the cores
    with them. Every block (ours, numpy, PyTorch, each round) starts after `settle`, and each library is timed."""
    from service.tuning.tuners.ukernel import tuner

    events: list[str] = []
    monkeypatch.setattr(tuner, "settle", lambda: events.append("settle"))
    record_library_calls(monkeypatch, events)
    d = Dispatcher(DispatchTable((Interval(1, 8, None),), {}), {}, N=None, K=None)
    timing = tuner.time_point(d, 16, 16, 4, rounds=2, min_seconds=0.0, sequential=False)
    ours, theirs = timing.ours_s, timing.medians()
    del theirs["ukernel"]
    assert set(theirs) == {"numpy", "torch"} and ours > 0 and all(t > 0 for t in theirs.values())
    blocks = [i for i, e in enumerate(events) if e == "settle"]
    assert len(blocks) == 2 * 3  # rounds × (ours + two libraries)
    for i in blocks:  # every block's first call follows its settle
        assert i + 1 < len(events) and events[i + 1] != "settle"


def test_which_side_is_timed_first_alternates_round_by_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The block right after a settle pays what the pause cost; with a fixed order the uKernels paid it every round.
    Rounds alternate who goes first, also across the extra rounds a sequential decision asks for."""
    from service.tuning.tuners.ukernel import tuner

    monkeypatch.setattr(tuner, "settle", lambda: None)
    monkeypatch.setattr(tuner, "_POOLS_STARTED", {"ours", "torch"})  # no first calls: the rounds alone
    order: list[str] = []

    def call(name: str, seconds: list[float]) -> Callable[[], float]:
        times = itertools.cycle(seconds)
        return lambda: order.append(name) or next(times)

    monkeypatch.setattr(tuner, "median_call", lambda fn, *a, **k: fn())
    # ours wins the median but loses the second round: 4 of 5 confirms nothing yet, so more rounds follow
    ours = call("ours", [0.9, 1.1] + [0.9] * 20)
    timing = tuner.paired_rounds(ours, {"torch": call("torch", [1.0])}, rounds=5, sequential=True)
    assert timing.rounds > 5  # the order keeps alternating through the extra rounds
    expected = [side for i in range(timing.rounds) for side in (("ours", "torch"), ("torch", "ours"))[i % 2]]
    assert order == expected
