"""What a job's dashboard page shows, as plain data: panels (charts and tables) built from the job's record.

The dashboard (service/api/dashboard) loads a `JobData` from the store and asks the job page of the
job's kind for its panels (`job_pages`); the dashboard's own SVG module draws them in the browser. A
kind gets a page of its own by adding a `JobPage` there, with no template or JavaScript of its own; a
kind contributes only `describe_config` (what one of its configs chose). This module knows no HTTP,
store or TVM, so the API imports it without a compiler.

The builders here are the generic parts every kind can reuse: tuning curves, per-shape results against
the vendor baseline, every measured candidate, and latency/energy points of hardware candidates.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kernelfleet.models import DispatchDoc, JobView
from service.tuning.kinds.base import summarize_config

Unit = Literal["", "s", "x", "J", "count", "seconds", "day"]
Describe = Callable[[dict[str, Any]], str]  # a config in one line: the job kind's `describe_config`


@dataclass(frozen=True)
class CandidatePoint:
    """One measured candidate of a job, as the store keeps it."""

    id: int
    shape_key: str
    config: dict[str, Any]
    latency_s: float | None
    status: str
    error: str | None
    created_at: dt.datetime


@dataclass(frozen=True)
class JobData:
    """Everything a kind may draw: the job, its candidates (oldest first) and what it published."""

    job: JobView
    candidates: list[CandidatePoint]
    candidates_total: int  # the store may hold more than were loaded
    dispatch: DispatchDoc | None = None  # the dispatch table this job published, if any


@dataclass(frozen=True)
class Axis:
    label: str
    unit: Unit = ""
    log: bool = False


@dataclass(frozen=True)
class Series:
    name: str
    points: list[tuple[float, float]]
    mode: Literal["line", "step", "points"] = "line"
    labels: list[str] | None = None  # hover text per point, e.g. the program chosen for that shape
    emphasis: bool = False  # drawn larger, e.g. the chosen hardware config


@dataclass(frozen=True)
class Column:
    name: str
    unit: Unit = ""  # the browser formats numbers by unit (µs/ms, ×, …)


@dataclass(frozen=True)
class Link:
    text: str
    href: str


Cell = str | int | float | Link | None


@dataclass(frozen=True)
class Panel:
    """A chart (line or scatter: `x`, `y`, `series`) or a table (`columns`, `rows`)."""

    id: str  # unique on its page: stable for tests and links
    title: str
    kind: Literal["line", "scatter", "table"]
    note: str = ""
    x: Axis | None = None
    y: Axis | None = None
    series: list[Series] = field(default_factory=list)
    columns: list[Column] = field(default_factory=list)
    rows: list[list[Cell]] = field(default_factory=list)
    empty: str = "nothing measured yet"

    @property
    def has_data(self) -> bool:
        return bool(self.rows) if self.kind == "table" else any(s.points for s in self.series)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["has_data"] = self.has_data
        return out


def line(panel_id: str, title: str, x: Axis, y: Axis, series: list[Series], note: str = "", empty: str = "") -> Panel:
    return Panel(panel_id, title, "line", note, x, y, series, empty=empty or Panel.empty)


def table(panel_id: str, title: str, columns: list[Column], rows: list[list[Cell]], note: str = "") -> Panel:
    return Panel(panel_id, title, "table", note, columns=columns, rows=rows)


# -- tuning curves ------------------------------------------------------------------------------------------


def _best_so_far(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The running minimum of y, one point per improvement and one at the end (a step curve)."""
    out: list[tuple[float, float]] = []
    best = math.inf
    for x, y in points:
        if y < best:
            best = y
            out.append((x, y))
    if out and points and out[-1][0] != points[-1][0]:
        out.append((points[-1][0], best))
    return out


def tuning_curves(
    data: JobData,
    latency: Callable[[CandidatePoint], float | None] | None = None,
    y_label: str = "best latency",
    note: str = "",
) -> list[Panel]:
    """Best latency so far against candidates measured and against time since the job started, one series
    per shape (or per unit). `latency` picks what a candidate is ranked by (default: its measured latency)."""
    pick = latency or (lambda c: c.latency_s if c.status == "ok" else None)
    start = data.job.started_at or (data.candidates[0].created_at if data.candidates else None)
    by_trial: dict[str, list[tuple[float, float]]] = {}
    by_time: dict[str, list[tuple[float, float]]] = {}
    counts: dict[str, int] = {}
    for c in data.candidates:
        counts[c.shape_key] = counts.get(c.shape_key, 0) + 1
        value = pick(c)
        if value is None or value <= 0:
            continue
        by_trial.setdefault(c.shape_key, []).append((counts[c.shape_key], value))
        if start is not None:
            by_time.setdefault(c.shape_key, []).append((max(0.0, (c.created_at - start).total_seconds()), value))
    y = Axis(y_label, "s", log=True)
    return [
        line(
            "curve-trials",
            "Tuning curve: best latency vs candidates measured",
            Axis("candidates measured", "count"),
            y,
            [Series(k, _best_so_far(v), "step") for k, v in by_trial.items()],
            note,
        ),
        line(
            "curve-time",
            "Tuning curve: best latency vs time",
            Axis("seconds since the job started", "seconds"),
            y,
            [Series(k, _best_so_far(v), "step") for k, v in by_time.items()],
            note,
        ),
    ]


# -- per-shape results against the vendor -------------------------------------------------------------------


def _speedup(tuned: float | None, vendor: float | None) -> float | None:
    return vendor / tuned if tuned and vendor else None


def shape_results(data: JobData) -> list[Panel]:
    """Each planned shape: its weight, trials, state, the tuned kernel and the vendor as an inference host
    calls them, and the speedup; with one dynamic dimension, the same as charts across that dimension."""
    job = data.job
    rows: list[list[Cell]] = [
        [
            ",".join(f"{k}={v}" for k, v in s.shape.items()),
            s.weight,
            f"{s.trials_done}/{s.trials}",
            s.state,
            s.best_latency_s,
            s.baseline_latency_s,
            s.baseline,
            _speedup(s.best_latency_s, s.baseline_latency_s),
        ]
        for s in job.shapes
    ]
    panels = [
        table(
            "shapes",
            "Per-shape results",
            [
                Column("shape"),
                Column("weight"),
                Column("trials"),
                Column("state"),
                Column("tuned (as called)", "s"),
                Column("vendor", "s"),
                Column("vendor library"),
                Column("speedup", "x"),
            ],
            rows,
        )
    ]
    dims = {d for s in job.shapes for d in s.shape}
    if len(dims) == 1 and job.shapes:
        (dim,) = dims
        pts = sorted((s.shape[dim], s.best_latency_s, s.baseline_latency_s) for s in job.shapes)
        tuned = [(float(x), t) for x, t, _ in pts if t]
        vendor = [(float(x), v) for x, _, v in pts if v]
        speed = [(float(x), sp) for x, t, v in pts if (sp := _speedup(t, v))]
        panels += [
            line(
                "shape-latency",
                f"Latency across {dim}: tuned vs vendor",
                Axis(dim),
                Axis("latency as called", "s", log=True),
                [Series("tuned", tuned, "line"), Series("vendor", vendor, "line")],
            ),
            line(
                "shape-speedup",
                f"Speedup vs vendor across {dim}",
                Axis(dim),
                Axis("vendor / tuned", "x"),
                [Series("speedup", speed, "line")],
            ),
        ]
    return panels


# -- candidates ---------------------------------------------------------------------------------------------


def candidates_table(data: JobData, describe: Describe | None = None, title: str = "Measured candidates") -> Panel:
    """Every measured candidate (as many as were loaded), with a one-line summary of its config."""
    summary = describe or summarize_config
    rows: list[list[Cell]] = [
        [c.id, c.shape_key, c.status, c.latency_s, summary(c.config), c.error] for c in data.candidates
    ]
    shown = len(rows)
    note = "" if shown >= data.candidates_total else f"the first {shown} of {data.candidates_total}"
    return table(
        "candidates",
        title,
        [Column("#"), Column("shape"), Column("status"), Column("latency", "s"), Column("config"), Column("error")],
        rows,
        note,
    )


def errors_table(data: JobData) -> Panel:
    """The job's own error and every candidate that failed."""
    rows: list[list[Cell]] = []
    if data.job.error:
        rows.append(["job", data.job.error])
    rows += [[f"candidate #{c.id} ({c.shape_key})", c.error or c.status] for c in data.candidates if c.status != "ok"]
    panel = table("errors", "Errors", [Column("where"), Column("error")], rows)
    return dataclasses.replace(panel, empty=_no_errors(data)) if data.candidates else panel


def _no_errors(data: JobData) -> str:
    """What an empty errors panel says once candidates were measured: none failed (not "nothing measured")."""
    loaded = len(data.candidates)
    if loaded < data.candidates_total:
        return f"no errors in the first {loaded} of {data.candidates_total} candidates: every one was measured ok"
    return f"no errors: all {loaded} candidates were measured ok"


def default_panels(data: JobData, describe: Describe | None = None) -> list[Panel]:
    """The page every kind gets unless it draws its own: curves, per-shape results, candidates, errors, and
    the latency/energy scatter when candidates carry energy (hardware co-tuning)."""
    panels = [*tuning_curves(data), *shape_results(data), candidates_table(data, describe), errors_table(data)]
    scatter = energy_scatter(data.candidates)
    if scatter.has_data:
        panels.insert(0, scatter)
    return panels


# -- latency/energy of explored hardware configs (Gemmini-style co-tuning) -----------------------------------

_ENERGY_KEYS = {"energy_j": 1.0, "energy_mj": 1e-3, "energy_uj": 1e-6, "energy_nj": 1e-9, "energy_pj": 1e-12}
_LATENCY_KEYS = {"latency_s": 1.0, "latency_ms": 1e-3, "latency_us": 1e-6, "latency_ns": 1e-9}


_PREFIXES = ("measured_", "", "model_")  # a measurement wins over an analytical model's estimate


def _scaled(sources: Sequence[dict[str, Any]], keys: dict[str, float]) -> float | None:
    for prefix in _PREFIXES:
        for source in sources:
            for key, scale in keys.items():
                value = source.get(prefix + key)
                if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                    return float(value) * scale
    return None


@dataclass(frozen=True)
class EnergyPoint:
    candidate: CandidatePoint
    latency_s: float
    energy_j: float
    role: str  # "default", "chosen", "explored" (a search's model estimate) or "" (a measured candidate)

    @property
    def edp(self) -> float:
        return self.latency_s * self.energy_j


def _role(config: dict[str, Any]) -> str:
    role = config.get("role")
    if role in ("default", "chosen", "explored"):
        return str(role)
    if config.get("default") is True or config.get("name") == "default":
        return "default"
    return "chosen" if config.get("chosen") is True else ""


def energy_points(candidates: Sequence[CandidatePoint]) -> list[EnergyPoint]:
    """Candidates whose config (or its `metrics`) carries both a latency and an energy, in SI units (keys such
    as `energy_pj` or `latency_s`, optionally prefixed `measured_` or `model_`; the candidate's own latency
    when the config names none).

    Which is the default hardware config and which was chosen is read from the candidate (`role`, or a
    `default`/`chosen` flag); among alternatives for one shape or layer with none marked, the lowest
    energy-delay product is the chosen one."""
    points = []
    for c in candidates:
        if c.status != "ok":
            continue
        metrics = c.config.get("metrics")
        sources = [c.config, metrics] if isinstance(metrics, dict) else [c.config]
        energy = _scaled(sources, _ENERGY_KEYS)
        latency = _scaled(sources, _LATENCY_KEYS) or c.latency_s
        if energy is not None and latency:
            points.append(EnergyPoint(c, latency, energy, _role(c.config)))
    # Alternatives for the same thing (one shape or layer) with none marked chosen: the lowest EDP is. One
    # measurement per layer (a chosen design measured layer by layer) marks nothing: there was no choice.
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.candidate.shape_key, str(p.candidate.config.get("layer", ""))), []).append(i)
    for members in groups.values():
        if len(members) < 2 or any(points[i].role == "chosen" for i in members):
            continue
        # only unmarked measurements compete: a search's model estimates ("explored") were never chosen
        best = min((i for i in members if points[i].role == ""), key=lambda i: points[i].edp, default=None)
        if best is not None:
            points[best] = dataclasses.replace(points[best], role="chosen")
    return points


def _label(p: EnergyPoint) -> str:
    config = p.candidate.config
    name = config.get("name") or config.get("layer") or config.get("id") or f"candidate #{p.candidate.id}"
    return f"{name} ({p.candidate.shape_key}): EDP {p.edp:.3g} J·s"


def energy_scatter(candidates: Sequence[CandidatePoint], panel_id: str = "energy") -> Panel:
    points = energy_points(candidates)
    groups: dict[str, list[EnergyPoint]] = {"explored": [], "": [], "default": [], "chosen": []}
    for p in points:
        groups[p.role].append(p)
    roles = (
        ("explored", "explored (analytical model)"),
        ("", "measured"),
        ("default", "default config"),
        ("chosen", "chosen"),
    )
    series = [
        Series(
            name,
            [(p.latency_s, p.energy_j) for p in ps],
            "points",
            [_label(p) for p in ps],
            emphasis=role in ("default", "chosen"),
        )
        for role, name in roles
        if (ps := groups[role])
    ]
    return Panel(
        panel_id,
        "Explored hardware configs: latency vs energy",
        "scatter",
        "each point is one candidate: measured by the job's backend, or (explored) the search's analytical-model"
        " estimate of a hardware config it visited; lower-left is better (energy-delay product)",
        Axis("latency", "s", log=True),
        Axis("energy", "J", log=True),
        series,
        empty="no candidate carries both a latency and an energy yet",
    )
