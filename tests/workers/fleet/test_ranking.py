"""Ranking tasks by expected fleet time saved, with each reason on hand-built cases."""

from __future__ import annotations

import math

from service.workers.fleet.ranking import ShapeUsage, TaskKnowledge, rank, total_variation


def _know(**kw: object) -> TaskKnowledge:
    base: dict[str, object] = {"queue": "cpu.x", "kind": "ukernel", "dim": "M", "speedup_prior": 2.0}
    base.update(kw)
    return TaskKnowledge(**base)  # type: ignore[arg-type]


def test_expected_saving_is_time_times_gain_and_orders_tasks() -> None:
    usage = {
        ("w1", "f"): {"M=1": ShapeUsage(70.0, 100, 0), "M=2": ShapeUsage(70.0, 100, 5)},
        ("w2", "f"): {"M=8": ShapeUsage(700.0, 10, 0)},
    }
    knowledge = {("w1", "f"): _know(), ("w2", "f"): _know(kind="sketch", speedup_prior=1.25)}
    out = rank(usage, knowledge, days=7)
    # w1: 20 s/day × (1 − 1/2) = 10; w2: 100 s/day × (1 − 1/1.25) = 20
    assert [c.workload_hash for c in out] == ["w2", "w1"]
    assert math.isclose(out[0].expected_saving_s_per_day, 20.0) and out[0].kind == "sketch"
    assert math.isclose(out[1].expected_saving_s_per_day, 10.0) and out[1].kind == "ukernel"
    assert out[1].reasons == ["fallback", "untuned"] and out[1].shapes == {"M=1": 10.0, "M=2": 10.0}


def test_covered_shapes_drop_out_and_each_reason_is_named() -> None:
    usage = {("w", "f"): {"M=4": ShapeUsage(7.0, 10, 0), "M=50": ShapeUsage(7.0, 10, 0), "M=9": ShapeUsage(7.0, 1, 0)}}
    # M=4 has a config; M=9 is tuned only under another toolchain; M=50 has nothing
    know = _know(tuned_shapes=frozenset({"M=4"}), older_toolchain_shapes=frozenset({"M=9"}))
    (c,) = rank(usage, {("w", "f"): know}, days=7)
    assert set(c.shapes) == {"M=50", "M=9"} and set(c.reasons) == {"older-toolchain", "untuned"}
    assert math.isclose(c.expected_saving_s_per_day, 2 * 1.0 * 0.5)
    # a dispatch table up to 40 covers M=4 and M=9; M=50 is served past its tuned range: drift, half the gain
    (d,) = rank(usage, {("w", "f"): _know(table_s_max=40)}, days=7)
    assert set(d.shapes) == {"M=50"} and d.reasons == ["drift"]
    assert math.isclose(d.expected_saving_s_per_day, 1.0 * 0.5 * 0.5)
    fully = _know(tuned_shapes=frozenset({"M=4", "M=9", "M=50"}))
    assert rank(usage, {("w", "f"): fully}, days=7) == []


def test_drift_in_the_distribution_and_stalls() -> None:
    assert total_variation({"a": 1}, {"a": 2}) == 0 and math.isclose(total_variation({"a": 1}, {"b": 1}), 1.0)
    usage = {("w", "f"): {"M=7": ShapeUsage(7.0, 10, 0)}}
    drifted = _know(kind="sketch", tuned_distribution={"M=64": 1.0})
    (c,) = rank(usage, {("w", "f"): drifted}, days=7)
    assert "drift" in c.reasons and not c.stalled
    again = _know(kind="sketch", last_fleet_shapes=frozenset({"M=7"}))  # the last fleet job changed nothing
    assert rank(usage, {("w", "f"): again}, days=7)[0].stalled
    busy = _know(in_flight=True)
    assert rank(usage, {("w", "f"): busy}, days=7)[0].stalled
    rolled_back = _know(rolled_back=True)  # production measured its last table slower: not tuned again this window
    assert rank(usage, {("w", "f"): rolled_back}, days=7)[0].stalled
