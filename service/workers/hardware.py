"""What hardware this worker runs on, and whether a job's target is that hardware."""

from __future__ import annotations

import functools
import os

from service.models import TargetSpec, Toolchain


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pin_tvm_threads() -> None:
    """Make TVM's runtime use every core the target names.

    Unset, TVM assumes hyper-threading on x86 and uses half the logical CPUs: one thread on a 2-core VM,
    while the target (and the fingerprint) says two. Must run before TVM starts its thread pool; the
    measurement processes MetaSchedule spawns inherit it.
    """
    os.environ.setdefault("TVM_NUM_THREADS", str(usable_cores()))


@functools.cache
def toolchain() -> Toolchain:
    import tvm

    return Toolchain(tvm=tvm.__version__)


@functools.cache
def host_target() -> TargetSpec:
    """The llvm target of this host, `mcpu` included (without it LLVM emits SSE2-only code)."""
    from tvm.target import codegen

    return TargetSpec(kind="llvm", mcpu=codegen.llvm_get_system_cpu(), num_cores=usable_cores(), toolchain=toolchain())


def mismatch(target: TargetSpec) -> str | None:
    """Why this worker must not tune for `target`, or None when it matches the host."""
    host = host_target()
    if target.kind != "llvm":
        return f"this worker tunes llvm targets on {host.mcpu}; the job asks for a {target.kind} target"
    if target.mcpu != host.mcpu:
        return f"job target mcpu={target.mcpu} but this worker's CPU is {host.mcpu}"
    if target.num_cores > host.num_cores:
        return f"job target has {target.num_cores} cores but this worker has {host.num_cores}"
    return None
