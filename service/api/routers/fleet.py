"""The fleet's view: where its kernel time goes, and the daily tuning runs' reports."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Query, status

from service.api.auth import AdminKey, ReadKey
from service.api.deps import SessionDep, unprocessable
from service.models.fleet import FleetReport, FleetRunRequest, MeasuredSaving, UsageRow, UsageView
from service.models.shape import parse_shape_key
from service.store import catalog, fleet
from service.workers.celery_app import CONTROL_QUEUE, FLEET_DAILY, app
from service.workers.fleet.daily import measured_saving

router = APIRouter(prefix="/v1/fleet", tags=["fleet"])


@router.get("/usage", summary="Fleet kernel time by workload, target and shape over the last days")
def usage(
    session: SessionDep,
    _: ReadKey,
    days: int = Query(default=7, ge=1, le=90),
    workload: str | None = Query(default=None, pattern=r"^[0-9a-f]{1,64}$"),
    target: str | None = Query(default=None, pattern=r"^[0-9a-f]{1,64}$"),
    limit: int = Query(default=100, ge=1, le=10_000),
) -> UsageView:
    until = dt.datetime.now(dt.UTC).date()
    since = until - dt.timedelta(days=days - 1)
    rows = fleet.usage(session, since, until, workload, target, limit=limit)
    total = fleet.total_seconds(session, since, until)
    labels = {wh: catalog.workload_label(session, wh) for wh in {r.workload_hash for r in rows}}
    return UsageView(
        since=since,
        until=until,
        total_seconds=total,
        rows=[
            UsageRow(
                workload_hash=r.workload_hash,
                target_fingerprint=r.target_fingerprint,
                label=labels[r.workload_hash],
                shape=parse_shape_key(r.shape_key),
                calls=r.calls,
                kernel_seconds=r.kernel_seconds,
                fallbacks=r.fallbacks,
                share=r.kernel_seconds / total if total else 0.0,
            )
            for r in rows
        ],
    )


MAX_SAVINGS_DAYS = 366


@router.get("/savings", summary="Fleet seconds saved per day, measured by the hosts' A/B holdout")
def savings(
    session: SessionDep,
    _: ReadKey,
    since: dt.date | None = Query(default=None, description="first UTC day (default: `days` before until)"),
    until: dt.date | None = Query(default=None, description="last UTC day (default: today)"),
    days: int = Query(default=7, ge=1, le=MAX_SAVINGS_DAYS),
) -> MeasuredSaving:
    """What the served tables saved against what the hosts run without them, from the calls they held out
    (kernelfleet.holdout), per task and in total, each with its 95 % interval; nothing modelled."""
    last = until or dt.datetime.now(dt.UTC).date()
    first = since or last - dt.timedelta(days=days - 1)
    if first > last:
        unprocessable(["query", "since"], f"{first} is after until ({last})")
    if (last - first).days >= MAX_SAVINGS_DAYS:
        unprocessable(["query", "since"], f"at most {MAX_SAVINGS_DAYS} days at a time")
    return measured_saving(session, first, last)


@router.get("/reports", summary="Daily fleet tuning reports, newest first")
def reports(session: SessionDep, _: ReadKey, limit: int = Query(default=30, ge=1, le=365)) -> list[FleetReport]:
    return fleet.reports(session, limit)


@router.post("/runs", status_code=status.HTTP_202_ACCEPTED, summary="Run the daily fleet tuning now (admin)")
def run_now(body: FleetRunRequest, _: AdminKey) -> dict[str, str]:
    today = dt.datetime.now(dt.UTC).date()
    day = body.day or today
    if day > today:  # it would take that day's scheduled run away
        unprocessable(["body", "day"], f"{day} is in the future (today is {today}, UTC)")
    app.send_task(FLEET_DAILY, kwargs={"day": day.isoformat()}, queue=CONTROL_QUEUE)
    return {"day": day.isoformat(), "status": "queued; a day that already ran does nothing"}
