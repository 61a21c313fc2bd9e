"""What a GPU candidate must pass before it is timed (issue 32): no local memory, no conflicted shared loads.

  - no spill stores/loads and no stack frame (ptxas), no LDL in the SASS: local memory is DRAM-backed and
    turns a register tile into memory traffic (the first light's `r3f` fragment rings: 304-byte frame);
  - shared loads within MAX_CONFLICT of their conflict-free wavefronts, summed over the kernel's loads as
    each thread issues them (the first light's W tile: 8× — 32 wavefronts per LDS.128 instead of 4).
A candidate without ptxas resources (no nvcc on the host) is judged on its shared loads alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.tuning.gpu_model.profile import KernelProfile

MAX_CONFLICT = 1.25


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]  # one per rule, "FAIL" in the failed ones


def conflict_ratio(profile: KernelProfile) -> float:
    """Shared-load wavefronts the kernel issues over the conflict-free count (1.0 = ideal)."""
    issued = ideal = 0.0
    for kernel in profile.access.kernels:
        for load in kernel.shared_loads:
            issued += load.per_thread * load.phase_wavefronts
            ideal += load.per_thread * load.ideal
    return issued / ideal if ideal else 1.0


def check(profile: KernelProfile) -> Verdict:
    reasons = []
    local = [r for r in profile.resources if r.uses_local_memory]
    reasons.append(
        "local memory: none"
        if not local
        else "local memory FAIL: "
        + ", ".join(f"{r.name} stack {r.stack_bytes} B, spills {r.spill_stores}/{r.spill_loads} B" for r in local)
    )
    ratio = conflict_ratio(profile)
    ok = ratio <= MAX_CONFLICT
    reasons.append(
        f"shared loads{'' if ok else ' FAIL'}: {ratio:.2f}x the conflict-free wavefronts (max {MAX_CONFLICT})"
    )
    return Verdict(not local and ok, tuple(reasons))
