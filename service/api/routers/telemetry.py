"""Telemetry from inference hosts: what the fleet ran, per (workload, target, shape) and day."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter

from service.api.auth import TelemetryKey
from service.api.deps import SessionDep
from service.api.limits import enforce
from service.api.state import telemetry_bucket
from service.models.fleet import TelemetryAck, TelemetryBatch
from service.store import fleet

router = APIRouter(prefix="/v1/telemetry", tags=["fleet"])


@router.post("", summary="Ingest a batch of usage records (idempotent per batch_id)")
def ingest(batch: TelemetryBatch, session: SessionDep, who: TelemetryKey) -> TelemetryAck:
    enforce(telemetry_bucket(), who.id, "telemetry")
    today = dt.datetime.now(dt.UTC).date()  # for records without a day; a day given is in fields.Day's window
    counted = fleet.ingest(session, batch, who.id, today)
    return TelemetryAck(batch_id=batch.batch_id, accepted=len(batch.records) if counted else 0, duplicate=not counted)
