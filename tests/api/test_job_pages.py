"""The dashboard panels kinds build (service/api/dashboard/panels.py): tuning curves, per-shape results and the
latency/energy scatter, from candidate records as the store keeps them. Pure functions; the browser test draws
them from real jobs."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import subprocess
import sys
from typing import Any

from kernelfleet.models import JobView
from service.api.dashboard import job_pages
from service.api.dashboard import panels as ui
from service.tuning.kinds import KINDS

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _cand(
    i: int, shape: str, latency: float | None, config: dict[str, Any] | None = None, **kw: Any
) -> ui.CandidatePoint:
    status = kw.pop("status", "ok" if latency else "error")
    return ui.CandidatePoint(
        i, shape, config or {}, latency, status, kw.pop("error", None), T0 + dt.timedelta(seconds=10 * i)
    )


def _job(shapes: list[dict[str, Any]], **kw: Any) -> JobView:
    return JobView(
        id="j",
        kind=kw.get("kind", "sketch"),
        state="succeeded",
        workload_hash="w",
        target={},
        target_fingerprint=None,
        progress=1.0,
        trials_done=4,
        trials_total=4,
        error=kw.get("error"),
        attempts=1,
        created_at=T0,
        started_at=T0,
        shapes=shapes,
    )


def _panel(panels: list[ui.Panel], panel_id: str) -> ui.Panel:
    return next(p for p in panels if p.id == panel_id)


def test_tuning_curves_keep_the_best_so_far_per_shape() -> None:
    cands = [
        _cand(1, "M=8", 4e-6),
        _cand(2, "M=8", 5e-6),
        _cand(3, "M=8", None, error="build failed"),
        _cand(4, "M=8", 2e-6),
        _cand(5, "M=8", 3e-6),
        _cand(6, "M=64", 9e-6),
    ]
    data = ui.JobData(_job([]), cands, len(cands))
    trials, time = ui.tuning_curves(data)
    by_name = {s.name: s.points for s in trials.series}
    # x counts every candidate of the shape (failed ones too); y steps down only on improvements
    assert by_name == {"M=8": [(1, 4e-6), (4, 2e-6), (5, 2e-6)], "M=64": [(1, 9e-6)]}
    assert {s.name: s.points for s in time.series}["M=8"] == [(10.0, 4e-6), (40.0, 2e-6), (50.0, 2e-6)]
    errors = ui.errors_table(ui.JobData(_job([], error="worker died"), cands, len(cands)))
    assert errors.rows == [["job", "worker died"], ["candidate #3 (M=8)", "build failed"]]


def test_shape_results_chart_tuned_and_vendor_across_the_dimension() -> None:
    shapes = [
        {"shape": {"M": 64}, "weight": 0.5, "trials": 2, "trials_done": 2, "state": "succeeded",
         "best_latency_s": 2e-6, "baseline": "numpy", "baseline_latency_s": 4e-6},
        {"shape": {"M": 8}, "weight": 0.5, "trials": 2, "trials_done": 2, "state": "failed"},
    ]  # fmt: skip
    panels = ui.shape_results(ui.JobData(_job(shapes), [], 0))
    assert _panel(panels, "shapes").rows[0][-1] == 2.0  # speedup = vendor / tuned
    latency = _panel(panels, "shape-latency")
    assert [(s.name, s.points) for s in latency.series] == [("tuned", [(64.0, 2e-6)]), ("vendor", [(64.0, 4e-6)])]
    assert _panel(panels, "shape-speedup").series[0].points == [(64.0, 2.0)]
    json.dumps([p.to_json() for p in panels])  # what the dashboard sends the browser


def test_energy_points_read_units_prefixes_and_roles() -> None:
    cands = [
        _cand(1, "net", 2e-3, {"measured_energy_pj": 5e9, "model_energy_pj": 1.0, "layer": "conv1"}),
        _cand(2, "net", None, {"metrics": {"latency_ms": 4.0, "energy_mj": 2.0}}, status="ok"),
        _cand(3, "net", 1e-3, {"energy_j": 0.01, "role": "default"}),
        _cand(4, "net", 1e-3, {"tile": 8}),  # no energy: not a hardware point
        _cand(5, "net", None, {"energy_j": 1.0}, error="timeout"),  # failed: not a point
    ]
    points = ui.energy_points(cands)
    got = [(p.candidate.id, p.latency_s, p.energy_j, p.role) for p in points]
    # the measured energy wins over the model's; the chosen one (none marked) has the lowest energy-delay product
    assert got == [(1, 2e-3, 5e-3, ""), (2, 4e-3, 2e-3, "chosen"), (3, 1e-3, 0.01, "default")]
    points = ui.energy_points([*cands, _cand(6, "net", 5e-3, {"energy_j": 0.5, "chosen": True})])
    assert [p.candidate.id for p in points if p.role == "chosen"] == [6]
    scatter = ui.energy_scatter(cands)
    names = {s.name: len(s.points) for s in scatter.series}
    assert names == {"measured": 1, "default config": 1, "chosen": 1} and scatter.has_data
    assert "conv1" in next(s for s in scatter.series if s.name == "measured").labels[0]  # type: ignore[index]
    assert not ui.energy_scatter([_cand(1, "M=8", 1e-6)]).has_data  # a CPU job: the empty state
    # one chosen design measured layer by layer: points, but no choice among them to mark
    layers = [_cand(i, "network", 1e-3 * i, {"layer": f"L{i}", "measured_energy_pj": 1e9}) for i in (1, 2)]
    assert [p.role for p in ui.energy_points(layers)] == ["", ""]


def test_every_kind_draws_a_page_and_the_module_needs_no_compiler() -> None:
    data = ui.JobData(_job([]), [_cand(1, "M=8", 1e-6, {"format": "x", "a": 1})], 1)
    for kind in KINDS.all():
        panels = job_pages.job_panels(dataclasses.replace(data, job=data.job.model_copy(update={"kind": kind.name})))
        assert panels and len({p.id for p in panels}) == len(panels), kind.name
    code = (
        "import sys; import service.tuning.kinds.sketch, service.tuning.kinds.ukernel, service.api.app; "
        "import service.api.dashboard.job_pages.ukernel, service.api.dashboard.job_pages.pipeline; "
        "assert not [m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')], 'imports TVM'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_ukernel_page_shows_the_paired_rounds_behind_each_route() -> None:
    from kernelfleet.dispatch import DispatchTable, Interval, Shape
    from kernelfleet.models import DispatchDoc
    from service.tuning.tuners.ukernel.route_stats import PointTiming, describe_rule

    won = PointTiming((1e-6,) * 5, {"numpy": (2e-6,) * 5, "torch": (3e-6,) * 5})
    lost = PointTiming((3e-6, 1e-6, 3e-6), {"numpy": (2e-6,) * 3, "torch": (1.5e-6,) * 3})
    timed = {"1": lost, "2": won}
    table = DispatchTable((Interval(1, 1, None, "torch"), Interval(2, 2, Shape((), "u"))), {"u": 2})
    doc = DispatchDoc(
        workload_hash="w",
        target_fingerprint="t",
        dim="M",
        s_max=2,
        table=table.to_dict(),
        ukernels=[],
        predicted_latency_s=[1e-6, 1e-6],
        measured_latency_s={},
        validation={
            "vendor_routes": {
                "rule": describe_rule(),
                "confirmed_S": [1],
                "timed_s": {S: {"tuned": t.ours_s, "vendor": t.vendor_s, **t.to_dict()} for S, t in timed.items()},
            }
        },
        job_id="j",
        created_at=T0,
    )
    data = ui.JobData(_job([], kind="ukernel"), [], 0, doc)
    panel = _panel(job_pages.job_panels(data), "route-decisions")
    assert "sign test" in panel.note
    by_m = {row[0]: row for row in panel.rows or []}
    assert by_m[1][1] == "torch" and by_m[1][2] == 3 and by_m[1][3] == 1 and by_m[1][7] == "yes"
    assert by_m[2][1] == "ukernel" and by_m[2][3] == 5 and by_m[2][4] == 1 / 32
    assert "ukernel 1.0 1.0 1.0 1.0 1.0; numpy 2.0" in str(by_m[2][8])


def test_the_errors_panel_says_no_errors_once_candidates_were_measured_ok() -> None:
    ok = [_cand(i, f"M={i}", 1e-6) for i in (1, 2)]
    assert ui.errors_table(ui.JobData(_job([]), [], 0)).empty == "nothing measured yet"
    every = ui.errors_table(ui.JobData(_job([]), ok, 2))
    assert not every.has_data and every.empty == "no errors: all 2 candidates were measured ok"
    first = ui.errors_table(ui.JobData(_job([]), ok, 48))  # the page loads only the first candidates
    assert first.empty == "no errors in the first 2 of 48 candidates: every one was measured ok"
    failed = ui.errors_table(ui.JobData(_job([]), [*ok, _cand(3, "M=3", None, error="timeout")], 3))
    assert failed.has_data and failed.rows == [["candidate #3 (M=3)", "timeout"]]
