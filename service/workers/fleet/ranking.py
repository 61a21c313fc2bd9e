"""Rank tuning tasks by the fleet time they are expected to save (XTAT's figure: time share × gain).

A task is one workload on one target fingerprint. Its shapes come from telemetry; a shape is a
candidate when the fleet runs it without a tuned kernel:
  untuned          no config or dispatch table covers it on this fingerprint;
  fallback         hosts counted misses for it (the default kernel ran) and nothing covers it;
  older-toolchain  it is tuned only for the same hardware under another toolchain (those configs
                   are never served here: the fingerprint includes the toolchain);
  drift            the served distribution moved away from the one last tuned (total variation above
                   a threshold) or past the end of the dispatch table's tuned range.
Expected saving per day = observed seconds per day × predicted gain, the gain coming from the
speedups this target's jobs measured so far (a prior until there are some).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from service.models.fleet import FleetCandidate, Reason
from service.models.shape import parse_shape_key

DRIFT_TV = 0.5  # total variation distance between observed and tuned distributions that counts as drift
DRIFT_GAIN_FACTOR = 0.5  # past the tuned range the table still runs tuned uKernels, so less is to gain


@dataclass(frozen=True)
class ShapeUsage:
    seconds: float
    calls: int
    fallbacks: int


@dataclass(frozen=True)
class TaskKnowledge:
    """What the store knows about one (workload, target) pair."""

    queue: str
    kind: str  # the job kind that tunes this task (the highest-priority kind that accepts it)
    dim: str | None  # the single dynamic dimension, if there is exactly one
    tuned_shapes: frozenset[str] = frozenset()
    table_s_max: int | None = None
    older_toolchain_shapes: frozenset[str] = frozenset()
    older_toolchain_table: bool = False
    tuned_distribution: Mapping[str, float] = field(default_factory=dict)  # of the last succeeded job
    speedup_prior: float = 1.5  # expected tuned-vs-default speedup on this target
    in_flight: bool = False  # a job for this task is still queued or running
    last_fleet_shapes: frozenset[str] | None = None  # shapes the last finished fleet job for it targeted
    # a table of it was rolled back within the window (production measured it slower): tuning it again the same way
    # would publish the same loss, so it waits until the window has moved past the rollback
    rolled_back: bool = False


def total_variation(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    sp, sq = sum(p.values()) or 1.0, sum(q.values()) or 1.0
    return 0.5 * sum(abs(p.get(k, 0.0) / sp - q.get(k, 0.0) / sq) for k in set(p) | set(q))


def _shape_reasons(key: str, use: ShapeUsage, know: TaskKnowledge, drifted: bool) -> list[Reason]:
    covered = key in know.tuned_shapes
    beyond_range = False
    if not covered and know.table_s_max is not None and know.dim is not None:
        size = parse_shape_key(key).get(know.dim, 0)
        covered = size <= know.table_s_max
        beyond_range = not covered  # the table still serves it by extending its last interval
    if covered:
        return []
    if beyond_range:
        return ["drift"]
    reasons: list[Reason] = ["untuned"]
    if use.fallbacks:
        reasons.append("fallback")
    if key in know.older_toolchain_shapes or know.older_toolchain_table:
        reasons.append("older-toolchain")
    if drifted and know.tuned_distribution:
        reasons.append("drift")
    return reasons


def rank(
    usage: Mapping[tuple[str, str], Mapping[str, ShapeUsage]],
    knowledge: Mapping[tuple[str, str], TaskKnowledge],
    days: int,
) -> list[FleetCandidate]:
    """Every task with something to gain, the largest expected saving per day first."""
    out: list[FleetCandidate] = []
    for (wh, fp), shapes in usage.items():
        know = knowledge[(wh, fp)]
        observed = {k: u.calls for k, u in shapes.items()}
        drifted = bool(know.tuned_distribution) and total_variation(observed, know.tuned_distribution) > DRIFT_TV
        gain_full = max(0.0, 1.0 - 1.0 / max(know.speedup_prior, 1.0))
        reasons: set[Reason] = set()
        per_day: dict[str, float] = {}
        saving = 0.0
        for key, use in shapes.items():
            why = _shape_reasons(key, use, know, drifted)
            if not why:
                continue
            reasons |= set(why)
            seconds = use.seconds / max(days, 1)
            per_day[key] = seconds
            saving += seconds * gain_full * (DRIFT_GAIN_FACTOR if why == ["drift"] else 1.0)
        if not per_day:
            continue
        observed_s = sum(per_day.values())
        stalled = know.last_fleet_shapes is not None and 2 * len(know.last_fleet_shapes & set(per_day)) >= max(
            1, len(know.last_fleet_shapes)
        )
        out.append(
            FleetCandidate(
                workload_hash=wh,
                target_fingerprint=fp,
                queue=know.queue,
                kind=know.kind,
                reasons=sorted(reasons),
                shapes=dict(sorted(per_day.items(), key=lambda kv: -kv[1])),
                observed_s_per_day=observed_s,
                predicted_gain=saving / observed_s if observed_s else 0.0,
                expected_saving_s_per_day=saving,
                stalled=stalled or know.in_flight or know.rolled_back,
            )
        )
    out.sort(key=lambda c: (-c.expected_saving_s_per_day, c.workload_hash, c.target_fingerprint))
    return out


def group_usage(rows: Sequence[tuple[str, str, str, ShapeUsage]]) -> dict[tuple[str, str], dict[str, ShapeUsage]]:
    grouped: dict[tuple[str, str], dict[str, ShapeUsage]] = {}
    for wh, fp, key, use in rows:
        grouped.setdefault((wh, fp), {})[key] = use
    return grouped
