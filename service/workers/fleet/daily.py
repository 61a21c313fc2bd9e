"""The daily fleet run: rank what the fleet spends time on, split the budget, submit jobs, re-measure, report.

Free of Celery: the `fleet.daily` task calls `run_daily`. A day runs at most once (the store's
fleet_runs row for the day is claimed first), so several beat processes, restarts or a manual
trigger on the same day do nothing new.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import random
import statistics
import traceback
from collections.abc import Iterable, Mapping

from pydantic import TypeAdapter
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelfleet import vendor
from service.models import Budget, JobSpec, JobState, TargetSpec, Workload, normalized_support, shape_key
from service.models.distribution import Explicit, ShapeDistribution, ShapePoint
from service.models.fleet import FleetCandidate, FleetReport, MeasuredSaving, Regression, SilentTask
from service.models.shape import parse_shape_key
from service.settings import Settings
from service.store import catalog, configs
from service.store import dispatch as dispatch_store
from service.store import fleet as fleet_store
from service.store.db import session_scope
from service.store.tables import BestConfigRow, JobRow, JobShapeRow, ModelOpRow, ModelRow, TargetRow, utcnow
from service.tuning.admission import fleet_kind
from service.tuning.kinds import KINDS, JobKind
from service.tuning.kinds.host_library import HOST_LIBRARY_TAG
from service.tuning.platforms import queue_for
from service.workers.fleet.ranking import ShapeUsage, TaskKnowledge, group_usage, rank
from service.workers.fleet.rollback import check_tables, served_vs_baseline
from service.workers.fleet.savings import measure
from service.workers.fleet.scheduler import Task, allocate
from service.workers.submission import submit

log = logging.getLogger(__name__)
MAX_JOB_SHAPES = 8


def _terminal(state: str) -> bool:
    return JobState(state).terminal


def _speedup_prior(session: Session, fingerprint: str, default: float, since: dt.date, until: dt.date) -> float:
    """What tuning a task on this target is expected to gain, clipped to [1, 10]: the hosts' own A/B speedup
    (baseline ÷ served time over the traffic the target's tables served in the window) where they measured
    one; else the geometric mean of baseline/best over this target's finished job shapes (the worker's vendor
    as baseline, which need not be what the hosts run); else `default`."""
    measured = _measured_speedup(session, fingerprint, since, until)
    if measured is not None:
        return min(10.0, max(1.0, measured))
    q = (
        select(JobShapeRow.baseline_latency_s, JobShapeRow.best_latency_s)
        .join(JobRow, JobRow.id == JobShapeRow.job_id)
        .where(
            JobRow.target_fingerprint == fingerprint,
            JobShapeRow.best_latency_s.is_not(None),
            JobShapeRow.baseline_latency_s.is_not(None),
        )
        .limit(1000)
    )
    logs = [math.log(b / t) for b, t in session.execute(q) if b and t and b > 0 and t > 0]
    if not logs:
        return default
    return min(10.0, max(1.0, math.exp(sum(logs) / len(logs))))


def _measured_speedup(session: Session, fingerprint: str, since: dt.date, until: dt.date) -> float | None:
    """Baseline ÷ served time over the calls this target's tables served in [since, until], from the hosts' A/B
    holdout (shapes with enough samples on both sides, weighted by their served calls); None without any."""
    rows = fleet_store.holdout(session, since, until, target_fingerprint=fingerprint, by_table=True)
    served = served_vs_baseline([r for r in rows if r.table_job_id]).ratio
    return 1.0 / served if served else None


def _support_keys(distribution: dict[str, object]) -> dict[str, float]:
    dist: ShapeDistribution = TypeAdapter(ShapeDistribution).validate_python(distribution)
    return {shape_key(s): w for s, w in normalized_support(dist)}


def _knowledge(
    session: Session,
    workload: Workload,
    target: TargetSpec,
    fp: str,
    kind: JobKind,
    window_start: dt.date,
    speedup_prior: float,
) -> TaskKnowledge:
    wh = workload.workload_hash
    tuned = frozenset(
        session.scalars(
            select(BestConfigRow.shape_key).where(
                BestConfigRow.workload_hash == wh, BestConfigRow.target_fingerprint == fp
            )
        )
    )
    table = dispatch_store.latest(session, wh, fp)
    siblings = [
        row.target_fingerprint
        for row in session.scalars(select(TargetRow))
        if row.target_fingerprint != fp and TargetSpec(**row.spec).hardware() == target.hardware()
    ]
    older = frozenset(
        session.scalars(
            select(BestConfigRow.shape_key).where(
                BestConfigRow.workload_hash == wh, BestConfigRow.target_fingerprint.in_(siblings)
            )
        )
    )
    older_table = any(dispatch_store.latest(session, wh, s) is not None for s in siblings)
    recent = list(
        session.scalars(select(JobRow).where(JobRow.workload_hash == wh).order_by(JobRow.created_at.desc()).limit(50))
    )
    mine = [j for j in recent if j.target_fingerprint == fp or j.tags.get("fleet_target") == fp]
    last_ok = next((j for j in mine if j.state == JobState.succeeded.value), None)
    tuned_dist = _support_keys(last_ok.distribution) if last_ok is not None else {}
    fleet_jobs = [j for j in mine if j.tags.get("fleet_target") == fp]
    in_flight = any(not _terminal(j.state) for j in fleet_jobs)
    # only a fleet job that succeeded and still left its shapes untuned says the task stalled; a failed or
    # cancelled one says nothing about the task, so it is tried again
    last_fleet = next((j for j in fleet_jobs if _terminal(j.state)), None)
    if last_fleet is not None and last_fleet.state != JobState.succeeded.value:
        last_fleet = None
    one_dim = workload.symbolic[0] if len(workload.symbolic) == 1 else None
    return TaskKnowledge(
        queue=queue_for(target),
        kind=kind.name,
        dim=one_dim,
        tuned_shapes=tuned,
        table_s_max=table.s_max if table is not None else None,
        older_toolchain_shapes=older,
        older_toolchain_table=older_table,
        tuned_distribution=tuned_dist,
        speedup_prior=speedup_prior,
        in_flight=in_flight,
        last_fleet_shapes=frozenset(_support_keys(last_fleet.distribution)) if last_fleet is not None else None,
        rolled_back=dispatch_store.retired_since(
            session, wh, fp, dt.datetime.combine(window_start, dt.time(), tzinfo=dt.UTC)
        ),
    )


def _valid_shapes(workload: Workload, keys: Iterable[str]) -> list[str]:
    """Telemetry shapes this workload can take (hosts may report garbage; jobs must not fail on it)."""
    out = []
    for key in keys:
        try:
            shape = parse_shape_key(key)
            if set(shape) == set(workload.symbolic):
                workload.bind(shape)
                out.append(key)
        except ValueError:
            continue
    return out


def _most_held_out_library(held_out: Mapping[str, int]) -> str | None:
    """The vendor library most of a layer's held-out calls ran (what its hosts run without KernelFleet), or None
    when its hosts hold nothing out for a library this service knows."""
    known = {b: n for b, n in held_out.items() if b in vendor.LIBRARIES and n > 0}
    return max(sorted(known), key=known.__getitem__) if known else None


def _job_spec(
    c: FleetCandidate,
    workload: Workload,
    target: TargetSpec,
    all_shapes: dict[str, float],
    trials: int,
    day: dt.date,
    host_library: str | None,
) -> JobSpec:
    weights = KINDS.get(c.kind).fleet_shapes(workload, all_shapes, c.shapes)  # heaviest first, below
    top = sorted(weights.items(), key=lambda kv: -kv[1])[:4096]
    points = [ShapePoint(shape=parse_shape_key(k), weight=max(w, 1e-12)) for k, w in top]
    return JobSpec(
        kind=c.kind,
        workload=c.workload_hash,
        target=target,
        distribution=Explicit(points=points),
        budget=Budget(trials=trials, max_shapes=min(MAX_JOB_SHAPES, len(c.shapes))),
        tags={
            "fleet_run": day.isoformat(),
            "fleet_target": c.target_fingerprint,
            "fleet_units": str(c.units),
            # whom the job tunes for: a table that changes nothing for these hosts is not published
            **({HOST_LIBRARY_TAG: host_library} if host_library else {}),
        },
    )


def _fleet_jobs(session: Session, day: dt.date) -> list[JobRow]:
    """Jobs earlier days' fleet runs submitted (90 days back) that started, oldest first."""
    since = dt.datetime.combine(day - dt.timedelta(days=90), dt.time(), tzinfo=dt.UTC)
    ran = select(JobRow).where(JobRow.created_at >= since, JobRow.started_at.is_not(None))
    return [r for r in session.scalars(ran.order_by(JobRow.created_at)) if _fleet_day(r, day)]


def _newest_succeeded(rows: list[JobRow]) -> dict[tuple[str, str], JobRow]:
    """Each task's newest succeeded job: its tuning is what runs now."""
    latest: dict[tuple[str, str], JobRow] = {}
    for row in rows:
        if row.state == JobState.succeeded.value and row.finished_at is not None:
            latest[(row.workload_hash, row.tags.get("fleet_target", ""))] = row
    return latest


def _cost(rows: list[JobRow]) -> dict[str, object]:
    """The worker seconds every fleet job cost: failed, cancelled and superseded ones too, a retried job from its first
    attempt's start, and a job still running up to now (issue 35 item 2), split by state; and their CPU seconds
    (`cpu_s`: every attempt that ended in a worker, the vendor timings inside the jobs included)."""
    newest = {row.id for row in _newest_succeeded(rows).values()}
    now = utcnow()
    cost = cpu = 0.0
    cost_by_state: dict[str, float] = {}
    jobs_by_state: dict[str, int] = {}
    for row in rows:
        assert row.started_at is not None
        seconds = max(0.0, ((row.finished_at or now) - row.started_at).total_seconds())
        state = "superseded" if row.state == JobState.succeeded.value and row.id not in newest else row.state
        cost += seconds
        cpu += row.cpu_seconds or 0.0
        cost_by_state[state] = cost_by_state.get(state, 0.0) + seconds
        jobs_by_state[state] = jobs_by_state.get(state, 0) + 1
    return {"tuning_s": cost, "cpu_s": cpu, "cost_by_state": cost_by_state, "jobs_by_state": jobs_by_state}


def _modelled(session: Session, rows: list[JobRow], usage_per_day: dict[tuple[str, str], float]) -> dict[str, object]:
    """A model, never called a measurement: each task's newest succeeded job's geomean speedup (timed in the worker
    against its own baseline) applied to the task's fleet time now. The measured saving is `measure`'s."""
    saved, jobs = 0.0, 0
    for row in _newest_succeeded(rows).values():
        shapes = session.scalars(select(JobShapeRow).where(JobShapeRow.job_id == row.id)).all()
        logs = [
            math.log(s.baseline_latency_s / s.best_latency_s)
            for s in shapes
            if s.best_latency_s and s.baseline_latency_s and s.best_latency_s > 0
        ]
        if not logs:
            continue
        speedup = math.exp(sum(logs) / len(logs))
        usage = usage_per_day.get((row.workload_hash, row.tags.get("fleet_target", "")), 0.0)
        saved += usage * max(0.0, speedup - 1.0)  # time the baseline would take now, minus the time it takes
        jobs += 1
    return {"jobs": jobs, "saved_s_per_day": saved}


def _seconds_per_unit(rows: list[JobRow], prior: float) -> dict[str, float]:
    """Queue → the median worker seconds per scheduler unit of its finished fleet jobs (tag fleet_units), the
    prior where none finished: what turns the day's worker-second budget into units."""
    per_queue: dict[str, list[float]] = {}
    for row in rows:
        units = row.tags.get("fleet_units")
        if row.finished_at is None or row.started_at is None or not units or not str(units).isdigit():
            continue
        seconds = (row.finished_at - row.started_at).total_seconds()
        per_queue.setdefault(row.queue, []).append(max(0.0, seconds) / max(1, int(units)))
    return {q: statistics.median(v) if v else prior for q, v in per_queue.items()}


def measured_saving(session: Session, since: dt.date, until: dt.date) -> MeasuredSaving:
    """The fleet's saving over [since, until] from the hosts' A/B holdout (service.workers.fleet.savings)."""
    usage = fleet_store.usage(session, since, until, limit=1_000_000)
    days = fleet_store.observed_days(session, since, until)
    labels = {wh: catalog.workload_label(session, wh) for wh in {u.workload_hash for u in usage}}
    return measure(usage, fleet_store.holdout(session, since, until), since, until, days, labels)


def _merit(measured: MeasuredSaving, tuning_s: float) -> list[float] | None:
    """[low, estimate, high] of the measured saving per day ÷ the tuning seconds (XTAT's figure of merit)."""
    if tuning_s <= 0:
        return None
    saved, ci = measured.saved_s_per_day, measured.ci95_s_per_day
    return [(saved - ci) / tuning_s, saved / tuning_s, (saved + ci) / tuning_s]


MAX_LAYER_NAMES = 8
SILENT_LOOKBACK_DAYS = 90


def _silent(session: Session, until: dt.date, after_days: int) -> list[SilentTask]:
    """Tasks seen in the last SILENT_LOOKBACK_DAYS whose telemetry stopped `after_days` or more before `until`
    (the last day the run reads), most recently seen first: named in the report and not tuned; tables kept."""
    since = until - dt.timedelta(days=SILENT_LOOKBACK_DAYS)
    out = []
    for (wh, fp), last in fleet_store.last_seen(session, since, until).items():
        days_silent = (until - last).days
        if days_silent < after_days:
            continue
        published = dispatch_store.latest(session, wh, fp) is not None or bool(configs.list_best(session, wh, fp, 1))
        out.append(SilentTask(workload_hash=wh, target_fingerprint=fp, label=catalog.workload_label(session, wh),
                              last_seen=last, days_silent=days_silent, published=published))  # fmt: skip
    return sorted(out, key=lambda t: (t.days_silent, t.workload_hash, t.target_fingerprint))


def _layers(session: Session, workload_hash: str) -> list[str]:
    """'model: op name' of the onboarded models' ops on this workload (at most MAX_LAYER_NAMES, then a count)."""
    query = (
        select(ModelRow.name, ModelOpRow.name)
        .join(ModelRow, ModelRow.id == ModelOpRow.model_id)
        .where(ModelOpRow.workload_hash == workload_hash)
        .order_by(ModelRow.name, ModelOpRow.idx)
    )
    names = list(dict.fromkeys(f"{model}: {op}" for model, op in session.execute(query)))
    extra = len(names) - MAX_LAYER_NAMES
    return names[:MAX_LAYER_NAMES] + ([f"(+{extra} more)"] if extra > 0 else [])


def _fleet_day(row: JobRow, day: dt.date) -> bool:
    """Whether a job was submitted by an earlier day's fleet run."""
    run_day = row.tags.get("fleet_run")
    return bool(run_day) and str(run_day) < day.isoformat()


def _remeasure(session: Session, host_fp: str, sample: int, ratio: float, seed: int) -> tuple[int, list[Regression]]:
    """Re-time a sample of published configs for this worker's own hardware; flag the ones that got slower."""
    from kernelfleet.tvm_kernel import build_kernel, median_seconds
    from service.tuning.compute import random_inputs

    rows = list(session.scalars(select(BestConfigRow).where(BestConfigRow.target_fingerprint == host_fp)))
    random.Random(seed).shuffle(rows)
    regressions, measured = [], 0
    for row in rows[:sample]:
        workload = catalog.get_workload(session, row.workload_hash)
        if workload is None:
            continue
        try:
            kernel = build_kernel(row.config)
            now = float(median_seconds(kernel, *random_inputs(workload, row.shape)))
        except Exception:
            log.exception("re-measuring %s %s failed", row.workload_hash, row.shape_key)
            continue
        measured += 1
        if now > row.latency_s * ratio:
            regressions.append(
                Regression(
                    workload_hash=row.workload_hash,
                    target_fingerprint=host_fp,
                    label=workload.label(),
                    shape=row.shape_key,
                    stored_s=row.latency_s,
                    measured_s=now,
                )
            )
    return measured, regressions


def run_daily(day: dt.date, settings: Settings, host_fingerprint: str | None) -> FleetReport | None:
    """Run the fleet cron for `day`; None when that day already ran."""
    with session_scope() as s:
        if not fleet_store.claim_run(s, day, settings.fleet_run_stale_s):
            log.info("fleet run for %s already exists: nothing to do", day)
            return None
    report = FleetReport(day=day, state="running", created_at=utcnow(), window_days=settings.fleet_window_days)
    try:
        _plan_and_submit(day, settings, host_fingerprint, report)
        report.state = "done"
    except Exception as exc:
        log.exception("fleet run for %s failed", day)
        report.state, report.error = "failed", "".join(traceback.format_exception_only(exc)).strip()
    report.finished_at = utcnow()
    with session_scope() as s:
        fleet_store.save_report(s, report)
    return report


def _plan_and_submit(day: dt.date, settings: Settings, host_fp: str | None, report: FleetReport) -> None:
    since, until = day - dt.timedelta(days=settings.fleet_window_days), day - dt.timedelta(days=1)
    with session_scope() as s:  # first: what is retired here is neither served nor counted as tuned below
        report.rollbacks = check_tables(s, since, until, settings.fleet_rollback_margin)
    with session_scope() as s:
        rows = fleet_store.usage(s, since, until)
        days = max(1, fleet_store.observed_days(s, since, until))
        total = fleet_store.total_seconds(s, since, until)
        report.fleet_seconds_per_day = total / days
        grouped = group_usage(
            [
                (r.workload_hash, r.target_fingerprint, r.shape_key, ShapeUsage(r.kernel_seconds, r.calls, r.fallbacks))
                for r in rows
            ]
        )
        hosts = fleet_store.host_baselines(s, since, until)
        report.silent = _silent(s, until, settings.fleet_silent_after_days)
        silent = {(t.workload_hash, t.target_fingerprint) for t in report.silent}
        knowledge, targets, workloads, usable = {}, {}, {}, {}
        priors: dict[str, float] = {}
        for (wh, fp), shapes in grouped.items():
            if (wh, fp) in silent:
                continue  # its hosts stopped reporting: the window's older telemetry is not tuned for again
            workload, target = catalog.get_workload(s, wh), catalog.get_target(s, fp)
            if workload is None or target is None:
                continue  # telemetry for something never registered here: nothing to tune it with
            valid = _valid_shapes(workload, shapes)
            if not valid:
                continue
            spec = TargetSpec(**target.model_dump(exclude={"target_fingerprint"}))
            kind = fleet_kind(workload, spec)
            if kind is None:
                continue  # no registered kind tunes this workload on this target
            targets[(wh, fp)], workloads[(wh, fp)] = spec, workload
            usable[(wh, fp)] = {k: shapes[k] for k in valid}
            if fp not in priors:  # one per target: every task on it shares its hosts' measured speedup
                priors[fp] = _speedup_prior(s, fp, settings.fleet_prior_speedup, since, until)
            knowledge[(wh, fp)] = _knowledge(s, workload, spec, fp, kind, since, priors[fp])
        candidates = rank(usable, knowledge, days)
        for c in candidates:  # named as people read them: the workload, and the models' layers that run it
            c.label = workloads[(c.workload_hash, c.target_fingerprint)].label()
            c.layers = _layers(s, c.workload_hash)
        report.observed_days = days
        jobs = _fleet_jobs(s, day)
        report.cost = _cost(jobs)
        report.modelled = _modelled(s, jobs, {k: sum(u.seconds for u in v.values()) / days for k, v in grouped.items()})
        report.measured = measured_saving(s, since, until)
        report.savings_per_tuning_s = _merit(report.measured, float(report.cost["tuning_s"]))  # type: ignore[arg-type]

    # budget per hardware class, in units; a kind that covers everything in one job saturates after a unit
    unit = settings.fleet_unit_trials
    by_queue: dict[str, list[FleetCandidate]] = {}
    for c in candidates[: settings.fleet_max_tasks]:
        by_queue.setdefault(c.queue, []).append(c)
    submitted: list[FleetCandidate] = []
    unit_s = _seconds_per_unit(jobs, settings.fleet_prior_unit_s)
    for queue, group in sorted(by_queue.items()):
        seconds = unit_s.get(queue, settings.fleet_prior_unit_s)
        budget_units = min(settings.fleet_daily_trials // unit, int(settings.fleet_daily_worker_s // seconds))
        report.budget[queue] = budget_units * unit
        report.budget_s[queue] = settings.fleet_daily_worker_s
        report.unit_s[queue] = seconds
        tasks = [
            Task(
                key=f"{c.workload_hash}/{c.target_fingerprint}",
                expected_saving=c.expected_saving_s_per_day,
                saturates_after=KINDS.get(c.kind).saturates_after,
                stalled=c.stalled,
            )
            for c in group
        ]
        units = allocate(tasks, budget_units)
        spent = 0
        for c in group:
            n = units.get(f"{c.workload_hash}/{c.target_fingerprint}", 0)
            if n == 0:
                continue
            c.trials = KINDS.get(c.kind).fleet_trials(n, unit)
            c.units = n
            spent += c.trials  # what the job was given (a ukernel job builds its uKernels whatever its units)
            key = (c.workload_hash, c.target_fingerprint)
            all_shapes = {k: u.seconds for k, u in usable[key].items()}
            library = _most_held_out_library(hosts.get(key, {}))
            job_spec = _job_spec(c, workloads[key], targets[key], all_shapes, c.trials, day, library)
            with session_scope() as s:
                c.job_id = submit(s, job_spec, c.workload_hash).id
            submitted.append(c)
        report.spent[queue] = spent
        report.planned_s[queue] = sum(c.units for c in group) * seconds
    report.candidates = candidates
    report.expected_saving_s_per_day = sum(c.expected_saving_s_per_day for c in submitted)

    if host_fp is not None and settings.fleet_remeasure_sample > 0:
        with session_scope() as s:
            report.remeasured, report.regressions = _remeasure(
                s, host_fp, settings.fleet_remeasure_sample, settings.fleet_regression_ratio, day.toordinal()
            )
