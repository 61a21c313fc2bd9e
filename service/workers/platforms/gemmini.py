"""Gemmini systolic-array accelerators: queue `firesim`, measured by simulators (FireSim in production)."""

from __future__ import annotations

from collections.abc import Mapping

from service.models import TargetSpec, Toolchain, WorkloadSpec
from service.workers.platforms.base import Platform, VendorTiming


class GemminiPlatform(Platform):
    target_kind = "gemmini"
    summary = "Gemmini accelerators (BACO co-tuning), measured by ZigZag/SCALE-Sim here and FireSim in production"

    def validate(self, target: TargetSpec) -> str | None:
        if not target.arch:
            return "gemmini targets need arch: the accelerator generator config, e.g. 'default'"
        return None

    def queue(self, target: TargetSpec) -> str:
        return "firesim"

    def detect(self) -> TargetSpec | None:
        return None  # a worker opts in with its measurement backend once the Gemmini backends land

    def toolchain(self) -> Toolchain:
        raise NotImplementedError("lands with the Gemmini backends")

    def mismatch(self, target: TargetSpec) -> str | None:
        return "this worker has no Gemmini measurement backend"

    def vendor(self, workload: WorkloadSpec, shape: Mapping[str, int]) -> VendorTiming:
        raise NotImplementedError("lands with the Gemmini backends")
