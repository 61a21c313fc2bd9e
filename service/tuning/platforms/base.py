"""The `Platform` interface: one hardware class a worker can tune for (CPUs through LLVM, NVIDIA GPUs, ...).

A platform knows how to recognise its hardware on a host and describe it as a `TargetSpec` (whose
fingerprint keys every record), which queue its workers consume, whether this host can serve a given
target, and how to measure on it: time a call as an inference host makes it, check a result against
the reference, and time the vendor library a user would otherwise call. Job kinds (service.tuning.kinds)
tune through a platform and never ask which one it is.

Implementations live one per module beside this one and are registered by name in `__init__`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from service.models import TargetSpec, Toolchain, WorkloadSpec


def check_result(got: Any, expected: np.ndarray, tolerance: float) -> str | None:
    """Why `got` does not match the reference within `tolerance` (max absolute error), or None."""
    # in float64: a difference taken in a half dtype would round the error itself
    err = float(np.abs(np.asarray(got, dtype=np.float64) - np.asarray(expected, dtype=np.float64)).max())
    if not err <= tolerance:  # NaN fails too
        return f"result disagrees with the reference: max abs error {err:.3g} > {tolerance:.3g}"
    return None


@dataclass(frozen=True)
class VendorTiming:
    """The vendor library's time for one shape, as an inference host calls it, and what ran."""

    label: str  # e.g. "numpy 2.4.6 (openblas 0.3.31 Haswell)" or "cuBLAS fp32 (torch 2.11, CUDA graph)"
    seconds: float


class Platform(ABC):
    target_kind: ClassVar[str]  # the TargetSpec.kind this platform serves
    summary: ClassVar[str]
    # A host serves one platform: the detected one with the highest priority (a GPU host tunes its GPU,
    # not its CPU), unless KERNELFLEET_WORKER_PLATFORM names one.
    detect_priority: ClassVar[int] = 0

    def validate(self, target: TargetSpec) -> str | None:
        """Why `target` is not a complete target of this platform (e.g. an llvm target without mcpu), or None."""
        return None

    @abstractmethod
    def queue(self, target: TargetSpec) -> str:
        """The Celery queue whose workers run on exactly this hardware."""

    @abstractmethod
    def detect(self) -> TargetSpec | None:
        """This host's target of this platform, with its toolchain; None when the host lacks the hardware."""

    @abstractmethod
    def toolchain(self) -> Toolchain:
        """The compiler/simulator versions this host builds and measures with (part of every fingerprint)."""

    @abstractmethod
    def mismatch(self, target: TargetSpec) -> str | None:
        """Why this host must not tune for `target`, or None when it can."""

    def resolve(self, target: TargetSpec) -> TargetSpec:
        """The job's target as this host tunes it: toolchain filled in (the fingerprint needs it)."""
        return target.with_toolchain(self.toolchain())

    # -- measuring ------------------------------------------------------------------------------
    def time_call(self, fn: Callable[..., Any], *args: Any) -> float:
        """Median seconds per call of `fn(*args)` as an inference host calls it (Python call included)."""
        from kernelfleet.tvm_kernel import median_seconds

        return float(median_seconds(fn, *args))

    def host_call(self, kernel: Any, inputs: list[np.ndarray]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """What an inference host calls per request and with which arguments (CPU: the kernel on numpy arrays)."""
        return kernel, tuple(inputs)

    def check(self, got: Any, expected: np.ndarray, tolerance: float) -> str | None:
        """Why `got` does not match the reference within `tolerance` (max absolute error), or None."""
        return check_result(got, expected, tolerance)

    @abstractmethod
    def vendor(self, workload: WorkloadSpec, shape: Mapping[str, int], kernel_only: bool = False) -> VendorTiming:
        """The vendor library's time for this workload and shape, called as an inference host calls it; with
        `kernel_only`, its device time alone (what our kernel-only timings compare with; a platform whose calls
        have no launch to separate answers the same either way)."""


class TVMPlatform(Platform):
    """A platform whose kernels TVM compiles (llvm, cuda): what MetaSchedule and uKernel builds need."""

    @abstractmethod
    def tvm_target(self, target: TargetSpec) -> dict[str, object]:
        """The dict TVM 0.27 takes as `tvm.target.Target(...)`."""

    def pass_config(self, target: TargetSpec) -> dict[str, object]:
        """PassContext options every build for this target needs."""
        return {}

    def metaschedule_builder(self) -> Any:
        """MetaSchedule's builder: compiles candidates in worker processes with a timeout."""
        from service.tuning.builder.metaschedule import make_builder

        return make_builder()

    def metaschedule_runner(self, timeout_s: float, evaluator: Callable[..., list[float]] | None = None) -> Any:
        """MetaSchedule's runner: each candidate measured in its own process, killed after `timeout_s`."""
        from tvm.s_tir import meta_schedule as ms

        return ms.runner.LocalRunner(
            timeout_sec=timeout_s,
            evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=3, min_repeat_ms=50),
            f_run_evaluator=evaluator,
        )
