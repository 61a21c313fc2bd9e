"""Telemetry from inference hosts: what the fleet ran, per (workload, target, shape) and day."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter

from service.api.auth import TelemetryKey
from service.api.deps import SessionDep, unprocessable
from service.api.limits import enforce
from service.api.state import telemetry_bucket
from service.models.fleet import TelemetryAck, TelemetryBatch
from service.store import fleet

router = APIRouter(prefix="/v1/telemetry", tags=["fleet"])


@router.post("", summary="Ingest a batch of usage records (idempotent per batch_id)")
def ingest(batch: TelemetryBatch, session: SessionDep, who: TelemetryKey) -> TelemetryAck:
    enforce(telemetry_bucket(), who.id, "telemetry")
    today = dt.datetime.now(dt.UTC).date()
    for i, record in enumerate(batch.records):
        if record.day is not None and record.day > today:
            unprocessable(["body", "records", i, "day"], f"{record.day} is in the future (today is {today}, UTC)")
    counted = fleet.ingest(session, batch, who.id, today)
    return TelemetryAck(batch_id=batch.batch_id, accepted=len(batch.records) if counted else 0, duplicate=not counted)
