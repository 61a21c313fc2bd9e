"""NVIDIA GPUs through TVM's CUDA backend: queue `gpu.<arch>`, cuBLAS (through torch) as the vendor library."""

from __future__ import annotations

import re
from collections.abc import Mapping

from service.models import TargetSpec, Toolchain, WorkloadSpec
from service.workers import hardware
from service.workers.platforms.base import TVMPlatform, VendorTiming

_ARCH = re.compile(r"^sm_\d{2,3}a?$")


class CUDAPlatform(TVMPlatform):
    target_kind = "cuda"
    summary = "NVIDIA GPUs through TVM's CUDA codegen; vendor baseline cuBLAS through torch, timed with CUDA graphs"
    detect_priority = 20

    def validate(self, target: TargetSpec) -> str | None:
        if not target.arch or not _ARCH.match(target.arch):
            return "cuda targets need arch as sm_XY, e.g. 'sm_90' for an H100"
        return None

    def queue(self, target: TargetSpec) -> str:
        return f"gpu.{target.arch}"

    def detect(self) -> TargetSpec | None:
        return None  # wired to the GPU description of the host once GPU detection lands

    def toolchain(self) -> Toolchain:
        return hardware.toolchain()

    def mismatch(self, target: TargetSpec) -> str | None:
        host = self.detect()
        if host is None:
            return "this worker has no CUDA GPU"
        if target.arch != host.arch:
            return f"job target arch={target.arch} but this worker's GPU is {host.arch}"
        return None

    def tvm_target(self, target: TargetSpec) -> dict[str, object]:
        return {"kind": "cuda", "arch": target.arch}

    def pass_config(self) -> dict[str, object]:
        return {"tirx.use_async_copy": True}

    def vendor(self, workload: WorkloadSpec, shape: Mapping[str, int]) -> VendorTiming:
        raise NotImplementedError("cuBLAS timing lands with GPU detection")
