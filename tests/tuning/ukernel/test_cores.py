"""Timing with the timing thread and the others on separate cores (service.tuning.tuners.ukernel.cores), and the
paired rounds' use of it: each side's pool started before the pinning."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from service.tuning.tuners.ukernel import cores, tuner

needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable cores")


@needs_two_cores
def test_apart_pins_this_thread_to_its_core_and_the_others_elsewhere_then_restores_them() -> None:
    cpus = os.sched_getaffinity(0)
    stop = threading.Event()
    seen: dict[str, int] = {}

    def idle(name: str) -> None:
        seen[name] = threading.get_native_id()
        stop.wait()

    before = threading.Thread(target=idle, args=("before",))
    before.start()
    while "before" not in seen:
        pass
    me = threading.get_native_id()
    try:
        with cores.apart():
            mine = os.sched_getaffinity(me)
            assert len(mine) == 1 and mine <= cpus
            assert os.sched_getaffinity(seen["before"]) == cpus - mine
            inside = threading.Thread(target=idle, args=("inside",))
            inside.start()
            while "inside" not in seen:
                pass
            assert os.sched_getaffinity(seen["inside"]) == mine  # inherited: why pools must start before
        assert os.sched_getaffinity(me) == cpus
        assert os.sched_getaffinity(seen["before"]) == cpus
        assert os.sched_getaffinity(seen["inside"]) == cpus  # given the process's cores on the way out
    finally:
        stop.set()


def test_paired_rounds_run_each_side_once_before_pinning_and_only_in_a_fresh_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []

    @contextmanager
    def recorded() -> Iterator[None]:
        events.append("apart")
        yield
        events.append("back")

    monkeypatch.setattr(tuner, "apart", recorded)
    monkeypatch.setattr(tuner, "settle", lambda: None)
    monkeypatch.setattr(tuner, "_POOLS_STARTED", set())
    monkeypatch.setattr(tuner, "median_call", lambda fn, *a, **k: fn())

    def side(name: str) -> tuple[str, object]:
        return name, lambda: events.append(name) or 1.0

    _, ours = side("ours")
    libraries = dict([side("numpy"), side("torch")])
    tuner.paired_rounds(ours, libraries, rounds=2, sequential=False)  # type: ignore[arg-type]
    assert events[:4] == ["ours", "numpy", "torch", "apart"] and events[-1] == "back"
    assert events[4:-1].count("ours") == 2  # the rounds, inside
    events.clear()
    tuner.paired_rounds(ours, libraries, rounds=2, sequential=False)  # type: ignore[arg-type]
    assert events[0] == "apart"  # the pools run already
