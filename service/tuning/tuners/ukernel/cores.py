"""Timing blocks with the timing thread and the libraries' worker threads on separate cores (`apart`).

A job times each block after a short sleep (`tuner.settle`). On a 2-vCPU KVM guest (AMD EPYC Zen 4), once that
thread had slept 20 ms or more, Linux ran it and TVM's worker on the same vCPU (both read on vCPU 1 from /proc after
such blocks) while the other idled, and the block ran at one thread's speed: `bench/pause_cost.py`, a 768×768
uKernel at M = 64, median block 705 µs against 350 µs at its fastest, 36 of 40 blocks slow after 20 ms pauses. A job
then routed whole stretches of S to PyTorch, whose pool was hardly caught that way (555 µs against 491). With the
timing thread pinned to the core it runs on and every other thread of the process to the other cores, the same
blocks ran at 362 µs, 3 of 40 slow, PyTorch's as before (`bench/pause_cost.py --apart`).

Threads inherit their creator's affinity, so a pool started inside `apart` would share the timing thread's core for
good: the libraries' pools must be running before (`tuner.paired_rounds` calls each side once first), and threads
that appear meanwhile get the process's cores back on the way out. This pins the worker's own process, only while it
times: the SDK never pins a host's threads.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

_TASKS = "/proc/self/task"


def _cpu_of(tid: int) -> int | None:
    """The CPU thread `tid` of this process last ran on (/proc's `processor` field), None where unreadable."""
    try:
        with open(f"{_TASKS}/{tid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # after the command name, which may hold spaces
        return int(fields[36])  # field 39 of stat(5), counted from the state (field 3)
    except (OSError, ValueError, IndexError):
        return None


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_TASKS)]
    except OSError:
        return []


@contextmanager
def apart() -> Iterator[None]:
    """This thread on the core it runs on, every other thread of the process on the process's other cores; each
    thread's own affinity back on exit. Nothing changes with one core or without /proc."""
    cpus = os.sched_getaffinity(0)
    me = threading.get_native_id()
    threads = _threads()
    if len(cpus) < 2 or me not in threads:
        yield
        return
    here = _cpu_of(me)
    if here not in cpus:
        here = min(cpus)
    saved: dict[int, set[int]] = {}
    for tid in threads:
        try:
            saved[tid] = os.sched_getaffinity(tid)
            os.sched_setaffinity(tid, {here} if tid == me else cpus - {here})
        except OSError:  # the thread ended meanwhile
            saved.pop(tid, None)
    try:
        yield
    finally:
        for tid in _threads():
            with suppress(OSError):  # (the thread ended meanwhile)
                os.sched_setaffinity(tid, saved.get(tid, cpus))  # a thread started inside: the process's cores
