"""Daily-run claims: once per day, but a failed or abandoned run can be taken over."""

from __future__ import annotations

import datetime as dt

from service.models.fleet import FleetReport
from service.store import fleet
from service.store.db import session_scope
from service.store.tables import FleetRunRow, utcnow

DAY = dt.date(2026, 11, 1)


def test_a_day_runs_once_unless_its_run_failed_or_was_abandoned(use_store: str) -> None:
    with session_scope() as s:
        assert fleet.claim_run(s, DAY, stale_after_s=3600)
    with session_scope() as s:
        assert not fleet.claim_run(s, DAY, stale_after_s=3600)  # running, and fresh
        row = s.get(FleetRunRow, DAY)
        assert row is not None
        row.created_at = utcnow() - dt.timedelta(hours=2)  # its worker died two hours ago
    with session_scope() as s:
        assert fleet.claim_run(s, DAY, stale_after_s=3600)
        fleet.save_report(s, FleetReport(day=DAY, state="failed", created_at=utcnow(), error="boom"))
    with session_scope() as s:
        assert fleet.claim_run(s, DAY, stale_after_s=3600)  # failed: retried
        fleet.save_report(s, FleetReport(day=DAY, state="done", created_at=utcnow()))
    with session_scope() as s:
        assert not fleet.claim_run(s, DAY, stale_after_s=0.001)  # done is done
        assert [r.state for r in fleet.reports(s)] == ["done"]
