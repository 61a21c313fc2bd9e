"""What hardware this worker runs on, and whether a job's target is that hardware."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: GPU measurement hosts run the parsers here without pydantic
    from service.models import TargetSpec, Toolchain


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def pin_tvm_threads() -> None:
    """Configure TVM's and OpenBLAS's thread pools as the SDK does on inference hosts (kernelfleet.runtime).

    TVM then uses every core the target names (unset, it assumes hyper-threading and uses half the logical
    CPUs: one thread on a 2-core VM, while the fingerprint says two), its workers are not pinned and spin
    briefly, so a job times its kernels and numpy under the thread settings the SDK gives users. Must run
    before TVM starts its thread pool (and, for OpenBLAS, before numpy loads); the measurement processes
    MetaSchedule spawns inherit it.
    """
    from kernelfleet.runtime import configure_threads

    configure_threads()


@functools.cache
def toolchain() -> Toolchain:
    import tvm

    from service.models import Toolchain

    return Toolchain(tvm=tvm.__version__)


# ISA extensions whose absence changes the code LLVM may emit; switching one off switches off what
# depends on it (-avx512f takes every AVX-512 subset with it)
_CHECKED_EXTENSIONS = ("avx512f", "avx2", "fma", "avx")


def parse_cpuinfo(text: str) -> tuple[list[str], str]:
    """(feature flags, model name) of the first CPU in /proc/cpuinfo text (x86 `flags`, arm64 `Features`)."""
    flags: list[str] = []
    name = "cpu"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("flags", "Features") and not flags:  # cpu0 is enough
            flags = value.split()
        elif key == "model name" and name == "cpu":
            name = value.strip()
    return flags, name


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU feature flags Linux reports for this host (empty where /proc/cpuinfo has none)."""
    try:
        return frozenset(parse_cpuinfo(cpuinfo.read_text())[0])
    except OSError:
        return frozenset()


@functools.cache
def host_target() -> TargetSpec:
    """The llvm target of this host: `mcpu` (without it LLVM emits SSE2-only code) minus the extensions
    that model implies but this CPU does not expose. A VM may report znver4 yet hide AVX-512, and code
    compiled for plain znver4 then dies with SIGILL."""
    import tvm
    from tvm.target import codegen

    from service.models import TargetSpec

    mcpu = codegen.llvm_get_system_cpu()
    flags = cpu_flags()
    implied = set(codegen.llvm_get_cpu_features(tvm.target.Target({"kind": "llvm", "mcpu": mcpu})))
    disabled = [f"-{ext}" for ext in _CHECKED_EXTENSIONS if flags and ext in implied and ext not in flags]
    return TargetSpec(kind="llvm", mcpu=mcpu, num_cores=usable_cores(), features=disabled, toolchain=toolchain())


def mismatch(target: TargetSpec) -> str | None:
    """Why this worker must not tune the llvm `target`, or None when it is this host's CPU."""
    host = host_target()
    if target.mcpu != host.mcpu:
        return f"job target mcpu={target.mcpu} but this worker's CPU is {host.mcpu}"
    if target.features != host.features:
        return f"job target features {target.features} but this worker's CPU has {host.features}"
    if target.num_cores > host.num_cores:
        return f"job target has {target.num_cores} cores but this worker has {host.num_cores}"
    return None
