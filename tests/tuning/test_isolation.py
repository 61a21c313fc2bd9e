"""GPU measurements in a killable child process (service.tuning.isolation), with stand-in measurements.

No GPU is needed: a hung kernel is a function that never returns, a fault that kills the process is an
`os._exit`, and a CUDA error is an exception carrying the text a CUDA runtime raises (known or not). The
real faulting and hanging kernels run in tests/tuning/gpu/test_on_gpu.py when a GPU is there.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import pytest

from service.tuning.isolation import IsolatedRunner, MeasureCrashed, MeasureTimeout


def child_pid() -> int:
    return os.getpid()


_poisoned = False  # set in a child: stands for a CUDA context that went bad and stays bad in that process


def poison() -> int:
    global _poisoned
    _poisoned = True
    return os.getpid()


def is_poisoned() -> bool:
    return _poisoned


# CUDA errors no list knew: 717 is what a faulting kernel raised on an H100 (research/gpu-first-light.md §1)
UNSEEN_CUDA_ERRORS = [
    "cudaErrorInvalidAddressSpace: operation not supported on global/shared address space",
    "CUDA error 7717 (cudaErrorSomethingNobodyHasSeen): the device did a thing",
]


def raise_error(kind: type[Exception], message: str) -> None:
    raise kind(message)


def hang() -> None:
    while True:  # a kernel that never finishes, holding the process
        time.sleep(1)


def die() -> None:
    os._exit(139)  # what a segfault in the driver looks like from outside


def sticky_fault() -> None:
    raise RuntimeError("CUDA: an illegal memory access was encountered (CUDA_ERROR_ILLEGAL_ADDRESS)")


def build_error() -> None:
    raise ValueError("no uKernel tile fits")


def test_a_hung_measurement_is_killed_at_the_deadline_and_the_next_one_runs() -> None:
    with IsolatedRunner(timeout_s=3) as runner:
        first = runner.run(child_pid)
        began = time.monotonic()
        with pytest.raises(MeasureTimeout, match="no answer in 3 s"):
            runner.run(hang)
        assert time.monotonic() - began < 10
        assert runner.run(child_pid) != first  # a fresh child
        assert runner.restarts == 1


def test_a_fresh_childs_start_up_is_not_charged_to_the_measurement() -> None:
    # starting the child (interpreter, TVM's popen worker) takes about a second, far over this deadline
    with IsolatedRunner(timeout_s=0.5) as runner:
        assert runner.run(child_pid) > 0 and runner.restarts == 0
    with IsolatedRunner(timeout_s=30, startup_timeout_s=0.01) as runner, pytest.raises(MeasureTimeout, match="_ready"):
        runner.run(child_pid)  # a child that cannot start in time is killed like a hung one


def test_a_dead_child_and_a_sticky_cuda_error_replace_the_child() -> None:
    with IsolatedRunner(timeout_s=30) as runner:
        first = runner.run(child_pid)
        with pytest.raises(MeasureCrashed, match="died"):
            runner.run(die)
        second = runner.run(child_pid)
        assert second != first
        with pytest.raises(RuntimeError, match="illegal memory access"):
            runner.run(sticky_fault)
        assert runner.run(child_pid) not in (first, second)  # its CUDA context was poisoned: replaced
        assert runner.restarts == 2


@pytest.mark.parametrize("message", UNSEEN_CUDA_ERRORS)
def test_a_cuda_error_never_seen_before_retires_the_child(message: str) -> None:
    with IsolatedRunner(timeout_s=30) as runner:
        first = runner.run(poison)
        assert runner.run(is_poisoned)  # the same child, its state kept between calls
        with pytest.raises(RuntimeError) as raised:
            runner.run(raise_error, RuntimeError, message)
        assert type(raised.value) is RuntimeError and str(raised.value) == f"RuntimeError: {message}"  # as raised
        assert not runner.run(is_poisoned)  # a new child: what the old one held is gone
        assert runner.run(child_pid) != first and runner.restarts == 1


def test_any_failure_retires_the_child() -> None:
    # a plain Python error may follow a launch whose fault has not surfaced yet: no failure keeps the child
    with IsolatedRunner(timeout_s=30) as runner:
        first = runner.run(poison)
        with pytest.raises(ValueError, match="no uKernel tile fits"):
            runner.run(build_error)
        assert not runner.run(is_poisoned) and runner.run(child_pid) != first and runner.restarts == 1
        second = runner.run(child_pid)
        with pytest.raises(KeyError):
            runner.run(raise_error, KeyError, "W_shared")
        assert runner.run(child_pid) not in (first, second) and runner.restarts == 2


def test_a_successful_measurement_keeps_the_child() -> None:
    with IsolatedRunner(timeout_s=30) as runner:
        first = runner.run(poison)
        assert [runner.run(child_pid) for _ in range(3)] == [first] * 3
        assert runner.run(is_poisoned) and runner.restarts == 0


def test_the_deadline_must_be_positive() -> None:
    with pytest.raises(ValueError):
        IsolatedRunner(timeout_s=0)


def hangs_at_four_stages(config: object, *_: object) -> tuple[float, None]:
    """A stand-in for lowering.time_kernel: the 4-stage candidate hangs, the others take 10 µs."""
    if getattr(config, "smem_stages", 0) == 4:
        hang()
    return 1e-5, None


def test_the_pipeline_measurer_records_a_hung_candidate_and_goes_on() -> None:
    from service.models import TargetSpec, WorkloadSpec
    from service.tuning.tuners.pipeline.lowering import Measurer
    from service.tuning.tuners.pipeline.space import PipelineConfig

    workload = WorkloadSpec(op="dense", dims={"N": 256, "K": 256}, symbolic=["M"])
    measurer = Measurer(workload, {"M": 64}, TargetSpec(kind="cuda", arch="sm_90"), 3, measure=hangs_at_four_stages)
    base = PipelineConfig(bm=64, bn=64, bk=16, tm=4, tn=4, smem_stages=2, async_copy=True)
    configs = [base, dataclasses.replace(base, smem_stages=4), dataclasses.replace(base, bk=32)]
    try:
        began = time.monotonic()
        seconds = measurer(configs)
    finally:
        measurer.close()
    assert seconds[0] == seconds[2] == 1e-5 and math.isinf(seconds[1])
    assert "no answer in 3 s" in measurer.errors[configs[1]]
    assert time.monotonic() - began < 20
