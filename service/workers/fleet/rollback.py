"""Rolling back tables that serve slower than what they replaced, on production telemetry (issue 35 item 3).

The daily run reads the hosts' A/B holdout of the window for every served table (kernelfleet.holdout: the calls
served by that table, the calls its hosts held out to run their baseline). A table is retired when, over the
shapes with samples on both sides and weighted by its own traffic there, its served time exceeds
  - the baseline's (what the hosts run without KernelFleet), or
  - the table it replaced (that table's served time at the same shapes from its own days of telemetry, each day
    read relative to the baseline the hosts held out that day, so a slower day does not read as a slower table)
beyond the 95 % interval and by more than `fleet_rollback_margin`. Hosts then get the newest table not retired,
or none (their baseline). The decision rests on every sample of the window, never on one timing.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from service.models.fleet import Rollback
from service.store import catalog
from service.store import dispatch as dispatch_store
from service.store import fleet as fleet_store
from service.store.fleet import HoldoutSums
from service.workers.fleet.savings import Difference, Side, difference, sides

PREVIOUS_LOOKBACK_DAYS = 90  # how far back the replaced table's own telemetry is read


def _sides(rows: list[HoldoutSums]) -> dict[tuple[str, str], tuple[int, Side, Side]]:
    """(shape, baseline) → (served calls, served side, baseline side) where both sides have enough samples."""
    out = {}
    for r in rows:
        pair = sides(r)
        if pair is not None:
            out[(r.shape_key, r.baseline)] = (r.served_calls, *pair)
    return out


def _at_todays_baseline(ours_base: Side, their_served: Side, their_base: Side) -> Side:
    """The previous table's served time at a shape, rescaled to the speed today's baseline ran at: its ratio to
    its own day's baseline × today's baseline mean, with the variance of that product (delta method). Days differ
    (load, clocks), so served times from different days are compared only through their own day's baseline."""
    r = their_served.mean / their_base.mean
    var_r = r * r * (their_served.var_of_mean / their_served.mean**2 + their_base.var_of_mean / their_base.mean**2)
    mean = r * ours_base.mean
    return Side(1, mean, ours_base.mean**2 * var_r + r * r * ours_base.var_of_mean)


def _mix(pairs: list[tuple[float, Side, Side]]) -> Difference:
    """Weighted by the table's own served calls at each shape, normalised: seconds per call of its traffic mix."""
    total = sum(weight for weight, _, _ in pairs)
    return difference((weight / total, a, b) for weight, a, b in pairs) if total > 0 else difference([])


def served_vs_baseline(rows: list[HoldoutSums]) -> Difference:
    """Served − baseline over the rows' shapes with samples on both sides, weighted by their served calls
    (normalised: seconds per call of that traffic mix); `.ratio` is served ÷ baseline time."""
    pairs = []
    for r in rows:
        pair = sides(r)
        if pair is not None:
            pairs.append((float(r.served_calls), pair[0], pair[1]))  # served − baseline
    return _mix(pairs)


def _against_previous(rows: list[HoldoutSums], previous: list[HoldoutSums]) -> Difference:
    ours, theirs = _sides(rows), _sides(previous)
    pairs = []
    for key, (calls, served, base) in ours.items():
        if key in theirs:
            _, their_served, their_base = theirs[key]
            pairs.append((float(calls), served, _at_todays_baseline(base, their_served, their_base)))
    return _mix(pairs)


def check_tables(session: Session, since: dt.date, until: dt.date, margin: float) -> list[Rollback]:
    """Retire every served table its window's telemetry shows slower (see the module docstring); what was done."""
    by_table: dict[tuple[str, str, str], list[HoldoutSums]] = {}
    for r in fleet_store.holdout(session, since, until, by_table=True):
        if r.table_job_id:
            by_table.setdefault((r.workload_hash, r.target_fingerprint, r.table_job_id), []).append(r)
    out = []
    for (wh, fp, job), rows in sorted(by_table.items()):
        table = dispatch_store.latest(session, wh, fp)
        if table is None or table.job_id != job:
            continue  # telemetry of a table no longer served: nothing to roll back
        previous = dispatch_store.served_before(session, wh, fp, table.id)
        against, other_job, diff = "baseline", None, served_vs_baseline(rows)
        if not diff.significantly_above(margin) and previous is not None and previous.job_id:
            lookback = until - dt.timedelta(days=PREVIOUS_LOOKBACK_DAYS)
            old = fleet_store.holdout(
                session, lookback, until, workload_hash=wh, target_fingerprint=fp, table_job_id=previous.job_id
            )
            against, other_job, diff = "previous table", previous.job_id, _against_previous(rows, old)
        if not diff.significantly_above(margin):
            continue
        ratio = diff.ratio or 0.0
        reason = (
            f"rolled back on {until + dt.timedelta(days=1)}: {ratio:.2f}x the {against}'s time over {diff.shapes} "
            f"shapes of production telemetry ({diff.delta:+.3g} s a call ± {diff.ci95:.2g})"
        )
        dispatch_store.retire(session, table, reason)
        now = dispatch_store.latest(session, wh, fp)
        out.append(Rollback(workload_hash=wh, target_fingerprint=fp, label=catalog.workload_label(session, wh),
                            table_job_id=job, against=against, other_job_id=other_job,
                            served_s=diff.a, other_s=diff.b, slowdown_s=diff.delta, ci95_s=diff.ci95,
                            shapes=diff.shapes, now_serving=now.job_id if now is not None else None))  # fmt: skip
    return out
