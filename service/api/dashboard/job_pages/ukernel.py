"""The `ukernel` job page: the range its dispatch table covers, the table's intervals, every uKernel proposed."""

from __future__ import annotations

from typing import Any

from kernelfleet.dispatch import DispatchTable
from kernelfleet.tables import ConvTable, DenseTable, table_from_json
from service.api.dashboard import panels as ui
from service.api.dashboard.job_pages.base import JobPage


class UKernelPage(JobPage):
    def panels(self, data: ui.JobData, describe: ui.Describe) -> list[ui.Panel]:
        """The range the table covers (program latency and the program chosen per M, the vendor and the
        speedup where they were measured), the table's intervals, and every uKernel the rules proposed."""
        shapes_table = ui.shape_results(data)[0]  # its per-shape charts would repeat the range chart
        curves = ui.tuning_curves(
            data,
            _seconds_per_row,
            "best seconds per row",
            "a uKernel's best time per row of M over the M it was timed at (uKernels differ in M-tile)",
        )
        # a table over several dims (batch_matmul: kernelfleet.tuple_dispatch) has no M-range panels yet
        table = table_from_json(data.dispatch.table) if data.dispatch is not None else None
        ranged = table.table if isinstance(table, DenseTable | ConvTable) else None
        out = [*(_range_panels(data, ranged) if ranged is not None else []), shapes_table, *curves]
        return [*out, _ukernels_table(data, describe), ui.errors_table(data)]


def _seconds_per_row(c: ui.CandidatePoint) -> float | None:
    measured = c.config.get("measured") or {}
    per_row = [float(sec) / int(m) for m, sec in measured.items() if int(m) > 0]
    return min(per_row) if c.status == "ok" and per_row else None


def _program(table: Any, S: int) -> str:
    pieces = table.lookup(S)  # empty where the table routes S to the vendor library
    on_ukernels = " + ".join(f"{p.rows} rows on {p.ukernel_id}" for p in pieces)
    return on_ukernels or f"the vendor library ({table.vendor_library(S)})"


def _range_panels(data: ui.JobData, table: DispatchTable) -> list[ui.Panel]:
    doc = data.dispatch
    assert doc is not None
    dim = doc.dim
    programs = [_program(table, S) for S in range(1, doc.s_max + 1)]

    def pick(S: float) -> str:
        return programs[int(S) - 1] if 1 <= S <= doc.s_max else _program(table, int(S))

    predicted = [(float(S), t) for S, t in enumerate(doc.predicted_latency_s, start=1)]
    timed, where = _timed_against_vendor(data)
    x = ui.Axis(dim)
    chart = ui.line(
        "range-latency",
        f"Latency across {dim} = 1..{doc.s_max}: the uKernel program chosen per shape vs the vendor",
        x,
        ui.Axis("latency", "s", log=True),
        [
            ui.Series("program (predicted)", predicted, "line", programs),
            ui.Series(
                "uKernel program (measured)", [(S, t) for S, t, _ in timed], "line", [pick(S) for S, _, _ in timed]
            ),
            ui.Series("vendor (measured)", [(S, v) for S, _, v in timed], "line"),
        ],
        f"measured {where}; predicted from each uKernel's measured cost model. Hover a point for the program "
        "the table runs at that shape (or the vendor, where the table routes it there).",
    )
    speedup = ui.line(
        "range-speedup",
        f"Speedup of the uKernel program vs the vendor across {dim}",
        x,
        ui.Axis("vendor / uKernel program", "x"),
        [ui.Series("speedup", [(S, v / t) for S, t, v in timed], "line", [pick(S) for S, _, _ in timed])],
        f"measured {where}; below 1× the table serves the vendor instead",
    )
    intervals = ui.table(
        "intervals",
        "Dispatch table: the program per interval",
        [ui.Column(f"{dim} from"), ui.Column("to"), ui.Column(f"program at {dim} = to"), ui.Column("predicted", "s")],
        [[iv.lo, iv.hi, programs[iv.hi - 1], doc.predicted_latency_s[iv.hi - 1]] for iv in table.intervals],
        f"{len(doc.ukernels)} uKernels shipped; beyond {dim}={doc.s_max} the last interval extends",
    )
    return [chart, speedup, intervals, *_route_decisions(data)]


def _route_decisions(data: ui.JobData) -> list[ui.Panel]:
    """Every timed shape's paired rounds and the decision they gave (issue 31: no route rests on one timing)."""
    assert data.dispatch is not None
    routes = data.dispatch.validation.get("vendor_routes") or {}
    sweep = {S: t for S, t in (routes.get("timed_s") or {}).items() if "samples_s" in t}
    if not sweep:  # tables from before paired rounds were published
        return []
    confirmed = {str(S) for S in routes.get("confirmed_S") or []}

    def row(S: str, t: dict[str, Any]) -> list[ui.Cell]:
        samples = "; ".join(
            f"{side} " + " ".join(f"{1e6 * v:.1f}" for v in times) for side, times in t["samples_s"].items()
        )
        lo, hi = t["ratio_range"]
        return [
            int(S),
            t["route"],
            t["rounds"],
            t["wins"],
            t["sign_test_p"],
            t["ratio_median"],
            f"{lo:.2f}–{hi:.2f}",
            "yes" if S in confirmed else "",
            samples,
        ]

    return [
        ui.table(
            "route-decisions",
            "Route decisions: the paired rounds behind each timed shape",
            [
                ui.Column(data.dispatch.dim),
                ui.Column("route"),
                ui.Column("rounds"),
                ui.Column("uKernel won"),
                ui.Column("sign test p"),
                ui.Column("median ours / library", "x"),
                ui.Column("range"),
                ui.Column("re-timed"),
                ui.Column("per-round medians (µs)"),
            ],
            [row(S, t) for S, t in sorted(sweep.items(), key=lambda item: int(item[0]))],
            routes.get("rule", ""),
        )
    ]


def _timed_against_vendor(data: ui.JobData) -> tuple[list[tuple[float, float, float]], str]:
    """(S, uKernel program seconds, vendor seconds), both timed as the SDK calls them, and where they come from."""
    assert data.dispatch is not None
    sweep = (data.dispatch.validation.get("vendor_routes") or {}).get("timed_s") or {}
    if sweep:  # the tuner timed the program against the vendor (a geometric grid, refined near crossings) to route
        rows = [(float(S), float(t["tuned"]), float(t["vendor"])) for S, t in sweep.items() if t.get("tuned")]
        return sorted(r for r in rows if r[2] > 0), "at the S the tuner timed to route (both as the SDK calls them)"
    # tables from before that sweep: the validated hot shapes
    at = {int(S): float(t) for S, t in data.dispatch.measured_latency_s.items()}
    dim = data.dispatch.dim
    rows = [
        (float(s.shape[dim]), at[s.shape[dim]], s.baseline_latency_s)
        for s in data.job.shapes
        if s.baseline_latency_s and dim in s.shape and at.get(s.shape[dim])  # conv2d rows are (N, H, W) tuples
    ]
    return sorted(rows), "at the validated shapes"


def _ukernels_table(data: ui.JobData, describe: ui.Describe) -> ui.Panel:
    return ui.candidates_table(data, describe, "uKernels proposed and measured")
