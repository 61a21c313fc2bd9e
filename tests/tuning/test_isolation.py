"""GPU measurements in a killable child process (service.tuning.isolation), with stand-in measurements.

No GPU is needed: a hung kernel is a function that never returns, a fault that kills the process is an
`os._exit`, and a sticky CUDA error is the text the CUDA runtime raises. The real faulting and hanging
kernels run in tests/tuning/gpu/test_on_gpu.py when a GPU is there.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time

import pytest

from service.tuning.isolation import IsolatedRunner, MeasureCrashed, MeasureTimeout, is_sticky_cuda_error


def child_pid() -> int:
    return os.getpid()


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


def test_an_ordinary_failure_keeps_the_child() -> None:
    with IsolatedRunner(timeout_s=30) as runner:
        first = runner.run(child_pid)
        with pytest.raises(ValueError, match="no uKernel tile fits"):
            runner.run(build_error)
        assert runner.run(child_pid) == first and runner.restarts == 0


def test_sticky_errors_are_recognised() -> None:
    assert is_sticky_cuda_error("cudaErrorLaunchFailure: unspecified launch failure")
    assert is_sticky_cuda_error(RuntimeError("CUDA error: misaligned address"))
    assert not is_sticky_cuda_error("CUDA_ERROR_OUT_OF_MEMORY")  # not sticky: the context survives
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
