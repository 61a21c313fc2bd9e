"""CPUs through LLVM: queue `cpu.<mcpu>[.no-<ext>...]`, numpy/OpenBLAS as the vendor library."""

from __future__ import annotations

import os
from collections.abc import Mapping

from service.models import TargetSpec, Toolchain, WorkloadSpec
from service.tuning import baseline, gpu, hardware
from service.tuning.platforms.base import TVMPlatform, VendorTiming


class LLVMPlatform(TVMPlatform):
    target_kind = "llvm"
    summary = "CPUs (x86, arm64) through LLVM; vendor baseline numpy/OpenBLAS"
    detect_priority = 10

    def validate(self, target: TargetSpec) -> str | None:
        if not target.mcpu:
            return "llvm targets need mcpu (without it LLVM emits SSE2-only code); e.g. 'znver4'"
        return None

    def queue(self, target: TargetSpec) -> str:
        # a CPU model with some ISA extensions switched off (e.g. AVX-512 hidden by a hypervisor) is other
        # hardware: its workers must not take jobs compiled for the full model
        disabled = "".join(f".no-{f[1:]}" for f in target.features if f.startswith("-"))
        return f"cpu.{target.mcpu}{disabled}"

    def detect(self) -> TargetSpec:
        return hardware.host_target()

    def toolchain(self) -> Toolchain:
        return hardware.toolchain()

    def mismatch(self, target: TargetSpec) -> str | None:
        # A GPU host serves its GPU queue only (host_platform): it must not run a CPU job that reached it
        # anyway, unless its operator made it a CPU worker on purpose.
        if not os.environ.get("KERNELFLEET_WORKER_PLATFORM"):
            card = gpu.detect()
            if card is not None:
                return f"this host is a GPU worker ({card.name}, {card.arch}); CPU jobs go to CPU workers"
        return hardware.mismatch(target)

    def tvm_target(self, target: TargetSpec) -> dict[str, object]:
        out: dict[str, object] = {"kind": "llvm", "mcpu": target.mcpu, "num-cores": target.num_cores}
        if target.features:
            out["mattr"] = [f if f.startswith("-") else f"+{f}" for f in target.features]
        return out

    def vendor(self, workload: WorkloadSpec, shape: Mapping[str, int], kernel_only: bool = False) -> VendorTiming:
        return VendorTiming(baseline.vendor_label(), baseline.measure_vendor(workload, shape))
