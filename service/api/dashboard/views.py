"""What each dashboard page shows, read from the store: plain dicts and panels, shared by the HTML pages and
the JSON feeds the pages poll."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy.orm import Session

from kernelfleet.models import ModelView
from service.api.dashboard import job_pages
from service.api.dashboard import panels as ui
from service.api.documents import dispatch_document, job_view, model_view
from service.models import JobState, JobView
from service.settings import get_settings
from service.store import catalog, configs, dispatch, fleet, jobs, models
from service.store.tables import CandidateRow, JobRow, ModelRow
from service.tuning.kinds import KINDS
from service.tuning.platforms.gemmini import GemminiPlatform

MAX_CANDIDATES = 500  # a job page loads at most this many candidates (the rest stay in the store and the API)
PAGE_SIZE = 100  # jobs or models per page of a list
MAX_OFFSET = 1_000_000  # as the API's own lists bound `offset`


class Labels:
    """Short names for workloads and targets, looked up once per page."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._workloads: dict[str, str] = {}
        self._targets: dict[str, dict[str, Any]] = {}

    def workload(self, workload_hash: str) -> str:
        if workload_hash not in self._workloads:
            self._workloads[workload_hash] = catalog.workload_label(self.session, workload_hash) or workload_hash[:12]
        return self._workloads[workload_hash]

    def target(self, fingerprint: str | None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        """{"label": "llvm znver4 ×2", "toolchain": "tvm 0.27.0 · abi 1", "fingerprint": ...}."""
        key = fingerprint or ""
        if key not in self._targets or spec is not None:
            t = catalog.get_target(self.session, fingerprint) if fingerprint else None
            hw = t.model_dump() if t is not None else (spec or {})
            name = " ".join(str(hw[k]) for k in ("kind", "mcpu", "arch") if hw.get(k))
            toolchain = hw.get("toolchain") or {}
            found = {
                "label": f"{name} ×{hw.get('num_cores', 1)}" if name else (key[:12] or "?"),
                "toolchain": " · ".join(f"{k} {v}" for k, v in toolchain.items()) if toolchain else "–",
                "fingerprint": key,
            }
            if spec is not None:
                return found
            self._targets[key] = found
        return self._targets[key]


def job_summary(view: JobView, labels: Labels) -> dict[str, Any]:
    """One job as the jobs list (and the job page header) shows it; polled for live state and progress."""
    return {
        "id": view.id,
        "kind": view.kind,
        "state": view.state,
        "progress": view.progress,
        "trials_done": view.trials_done,
        "trials_total": view.trials_total,
        "workload": labels.workload(view.workload_hash),
        "workload_hash": view.workload_hash,
        "target": labels.target(view.target_fingerprint, None if view.target_fingerprint else view.target)["label"],
        "target_fingerprint": view.target_fingerprint,
        "created_at": view.created_at.isoformat(),
        "started_at": view.started_at.isoformat() if view.started_at else None,
        "finished_at": view.finished_at.isoformat() if view.finished_at else None,
        "worker": view.worker,
        "attempts": view.attempts,
        "waiting_for_worker": view.waiting_for_worker,
        "error": view.error,
        "done": view.done,
        "publication": publication(view),
        "tags": dict(sorted(view.tags.items())),
    }


def publication(view: JobView) -> str:
    """Whether the job published (a config or a dispatch table) and, where something was held back, why."""
    if view.published is True:
        return f"yes; held back: {view.publish_reason}" if view.publish_reason else "yes"
    if view.published is False:
        return f"no: {view.publish_reason or 'nothing was published'}"
    if not view.done:
        return "not yet: a job publishes when it ends"
    # set when a job succeeds (jobs from before it was recorded have none); one that failed never publishes
    return "not recorded" if view.state == JobState.succeeded else f"no: the job {view.state}"


def _live(session: Session) -> set[str]:
    return catalog.live_queues(session, get_settings().worker_stale_after_s)


def job_list(
    session: Session, kind: str | None, target: str | None, state: JobState | None, offset: int = 0
) -> dict[str, Any]:
    """A page of jobs, newest first: `offset` jobs skipped, at most PAGE_SIZE shown."""
    rows, total = jobs.list_rows(session, state, kind, None, PAGE_SIZE, offset, target_fingerprint=target)
    live, labels = _live(session), Labels(session)
    shown = [job_summary(job_view(session, r, live), labels) for r in rows]
    return {"jobs": shown, **_page(len(shown), total, offset, "jobs")}


def _page(shown: int, total: int, offset: int, noun: str) -> dict[str, Any]:
    """A list page's place: `range` (the page shows it; the jobs list's live feed updates it), `more` (an older
    page exists)."""
    last = offset + shown
    where = f"{noun} {offset + 1}–{last} of {total}, newest first" if shown else ""
    if not shown and offset:
        where = f"no {noun} past the first {offset}"
    return {"total": total, "offset": offset, "limit": PAGE_SIZE, "range": where, "more": last < total}


def filter_choices(session: Session) -> dict[str, Any]:
    labels = Labels(session)
    kinds = sorted(set(KINDS.names()) | set(jobs.distinct_kinds(session)))
    targets = [labels.target(t.target_fingerprint) for t in catalog.list_targets(session)]
    return {"kinds": kinds, "targets": targets, "states": [s.value for s in JobState]}


def workload_choices(session: Session) -> list[dict[str, str]]:
    labels = Labels(session)
    return [
        {"hash": w.workload_hash, "label": labels.workload(w.workload_hash)}
        for w in catalog.list_workloads(session, 500)
    ]


def model_summary(view: ModelView) -> dict[str, Any]:
    return {
        "id": view.id,
        "name": view.name,
        "kind": view.kind,
        "state": view.state,
        "progress": view.progress,
        "jobs_done": view.jobs_done,
        "jobs_total": view.jobs_total,
        "skipped": len(view.skipped),
        "trials_done": view.trials_done,
        "trials_total": view.trials_total,
        "created_at": view.created_at.isoformat(),
        "done": view.done,
    }


def model_list(session: Session, offset: int = 0) -> dict[str, Any]:
    """A page of models, newest first (as `job_list`)."""
    rows, total = models.list_rows(session, None, PAGE_SIZE, offset)
    shown = [model_summary(model_view(session, r)) for r in rows]
    return {"models": shown, **_page(len(shown), total, offset, "models")}


def model_page(session: Session, row: ModelRow) -> dict[str, Any]:
    """A model: its progress, states and tags, and per op the workload, where it occurs (sources), occurrences,
    budget share and job."""
    view = model_view(session, row)
    labels = Labels(session)
    # where in the model each op occurs: kept with the op's row (the API's model view does not carry it)
    sources = [list(o.sources or []) for o in models.op_rows(session, row.id)]
    return {
        **model_summary(view),
        "target": labels.target(None, view.target)["label"],
        "states": view.states,
        "tags": dict(sorted(view.tags.items())),
        "rule": view.budget_split.get("rule", ""),
        "total_trials": view.budget_split.get("total_trials"),
        "ops": [
            {
                **op.model_dump(),
                "workload": labels.workload(op.workload_hash),
                "dims_text": ", ".join(f"{k}={v}" for k, v in op.dims.items()),
                "sources": op_sources,
            }
            for op, op_sources in zip(view.ops, sources, strict=True)
        ],
    }


def _point(row: CandidateRow) -> ui.CandidatePoint:
    return ui.CandidatePoint(row.id, row.shape_key, row.config, row.latency_s, row.status, row.error, row.created_at)


def job_data(session: Session, row: JobRow) -> ui.JobData:
    published = dispatch.published_by(session, row.id)
    return ui.JobData(
        job=job_view(session, row, _live(session)),
        candidates=[_point(c) for c in jobs.candidates(session, row.id, MAX_CANDIDATES, 0)],
        candidates_total=jobs.count_candidates(session, row.id),
        dispatch=dispatch_document(session, published, keys=[]) if published else None,
    )


def job_panels(data: ui.JobData) -> list[dict[str, Any]]:
    """The job's page, as the browser draws it (see job_pages)."""
    return [p.to_json() for p in job_pages.job_panels(data)]


def job_feed(session: Session, row: JobRow, known: str | None = None) -> dict[str, Any]:
    """The job's summary, and its panels unless the page already shows this version of them (`known`): a
    page polls each second, and building panels loads the candidates, so an unchanged job costs two queries."""
    view = job_view(session, row, _live(session))
    total = jobs.count_candidates(session, row.id)
    version = f"{view.state}|{view.trials_done}|{total}"
    changed = known != version
    return {
        "job": job_summary(view, Labels(session)),
        "candidates_total": total,
        "version": version,
        "panels": job_panels(job_data(session, row)) if changed else None,
    }


# -- config store -------------------------------------------------------------------------------------------


def config_store(session: Session, workload: str | None, target: str | None) -> dict[str, Any]:
    labels = Labels(session)
    records = configs.list_best(session, workload, target, limit=1000)
    rows = [
        {
            "workload": labels.workload(r.workload_hash),
            "workload_hash": r.workload_hash,
            "target": labels.target(r.target_fingerprint),
            "shape": ",".join(f"{k}={v}" for k, v in r.shape.items()),
            "latency_s": r.latency_s,
            "kind": r.kind,
            "provenance": ", ".join(f"{k}: {v}" for k, v in r.provenance.items()),
            "job_id": r.job_id,
            "updated_at": r.updated_at,
        }
        for r in records
    ]
    tables = [
        {
            "workload": labels.workload(wh),
            "target": labels.target(fp),
            "dim": dim,
            "s_max": s_max,
            "job_id": job_id,
            "created_at": created_at,
        }
        for wh, fp, _, dim, s_max, job_id, created_at in dispatch.latest_per_key(session, workload, target, 200)
    ]
    return {"configs": rows, "tables": tables, "panels": [p.to_json() for p in _config_charts(records)]}


def _config_charts(records: Iterable[Any]) -> list[ui.Panel]:
    """Per (workload, target) with one dynamic dimension: the best config's latency per shape."""
    series: dict[str, list[tuple[float, float]]] = {}
    dim_names: set[str] = set()
    for r in records:
        if len(r.shape) == 1:
            ((dim, size),) = r.shape.items()
            dim_names.add(dim)
            series.setdefault(f"{r.workload_hash[:8]} on {r.target_fingerprint[:8]}", []).append((size, r.latency_s))
    if not series:
        return []
    dim = "/".join(sorted(dim_names))
    return [
        ui.line(
            "best-per-shape",
            "Best config latency per shape",
            ui.Axis(dim),
            ui.Axis("latency (tuner's measurement)", "s", log=True),
            [ui.Series(name, sorted(points), "line") for name, points in series.items()],
        )
    ]


# -- fleet --------------------------------------------------------------------------------------------------


def _epoch_day(day: dt.date) -> float:
    return float((day - dt.date(1970, 1, 1)).days)


def fleet_view(session: Session, days: int) -> dict[str, Any]:
    labels = Labels(session)
    until = dt.datetime.now(dt.UTC).date()
    since = until - dt.timedelta(days=days - 1)
    usage = fleet.usage(session, since, until, limit=200)
    total = fleet.total_seconds(session, since, until)
    by_workload: dict[str, list[float]] = {}
    for u in usage:
        acc = by_workload.setdefault(u.workload_hash, [0, 0.0, 0])
        acc[0] += u.calls
        acc[1] += u.kernel_seconds
        acc[2] += u.fallbacks
    workloads = [
        {
            "workload": labels.workload(wh),
            "workload_hash": wh,
            "calls": int(c),
            "kernel_seconds": s,
            "fallbacks": int(f),
            "share": s / total if total else 0.0,
        }
        for wh, (c, s, f) in sorted(by_workload.items(), key=lambda kv: -kv[1][1])
    ]
    daily: dict[str, list[tuple[float, float]]] = {}
    for day, wh, _, seconds in fleet.usage_by_day(session, since, until):
        daily.setdefault(labels.workload(wh), []).append((_epoch_day(day), seconds))
    reports = fleet.reports(session, limit=60)
    chronological = sorted(reports, key=lambda r: r.day)
    measured = [r for r in chronological if r.measured is not None]
    saved = [(_epoch_day(r.day), r.measured.saved_s_per_day) for r in measured]  # type: ignore[union-attr]
    low = [(_epoch_day(r.day), r.measured.saved_s_per_day - r.measured.ci95_s_per_day) for r in measured]  # type: ignore[union-attr]
    cost = [(_epoch_day(r.day), float(r.cost.get("tuning_s") or 0.0)) for r in chronological]
    expected = [(_epoch_day(r.day), r.expected_saving_s_per_day) for r in chronological]
    day_axis = ui.Axis("day", "day")
    panels = [
        ui.line(
            "usage-by-day",
            "Fleet kernel time per day, by workload",
            day_axis,
            ui.Axis("kernel seconds", "seconds"),
            [ui.Series(name, pts, "line") for name, pts in daily.items()],
            empty="no telemetry in this window",
        ),
        ui.line(
            "savings",
            "Savings vs tuning cost, per daily run",
            day_axis,
            ui.Axis("seconds", "seconds"),
            [
                ui.Series("fleet seconds saved per day (measured: hosts' A/B holdout)", saved, "line"),
                ui.Series("lower end of its 95 % interval", low, "line"),
                ui.Series("tuning worker seconds (every fleet job)", cost, "line"),
                ui.Series("expected saving per day (planned)", expected, "line"),
            ],
            "measured: the window's served calls against the calls hosts held out to run their own baseline",
            empty="no daily fleet run yet",
        ),
    ]
    return {
        "since": since,
        "until": until,
        "total_seconds": total,
        "workloads": workloads,
        "reports": reports,
        "panels": [p.to_json() for p in panels],
    }


# -- Gemmini ------------------------------------------------------------------------------------------------


def gemmini_view(session: Session, job_id: str | None) -> dict[str, Any]:
    """Explored hardware configs of Gemmini jobs: a job's candidates that carry a latency and an energy."""
    labels = Labels(session)
    recent = jobs.rows_on_target_kind(session, GemminiPlatform.target_kind, limit=50)
    choices = [job_summary(job_view(session, r), labels) for r in recent]
    chosen = next((r for r in recent if r.id == job_id), None) if job_id else None
    if job_id and chosen is None:
        raise LookupError(f"job {job_id} is not a Gemmini job")
    candidates: list[ui.CandidatePoint] = []
    for row in [chosen] if chosen else recent:
        candidates = [_point(c) for c in jobs.candidates(session, row.id, MAX_CANDIDATES, 0)]
        if ui.energy_points(candidates) or row is chosen:
            chosen = row
            break
    points = ui.energy_points(candidates)
    scatter = ui.energy_scatter(candidates)
    summary = {
        role: {"latency_s": p.latency_s, "energy_j": p.energy_j, "edp": p.edp, "candidate": p.candidate.id}
        for p in points
        if (role := p.role)
    }
    # a co-tuning job may record its network's EDP, tuned vs default, with what it published
    published = configs.published_by(session, chosen.id, limit=50) if chosen else []
    network = next(
        (r.provenance["network_edp"] for r in published if isinstance(r.provenance.get("network_edp"), dict)), None
    )
    return {
        "jobs": choices,
        "network_edp": network,
        "job": job_summary(job_view(session, chosen), labels) if chosen else None,
        "points": len(points),
        "summary": summary,
        "panels": [scatter.to_json()],
    }
