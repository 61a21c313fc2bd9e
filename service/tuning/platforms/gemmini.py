"""Gemmini systolic-array accelerators: queue `firesim`, measured by the worker's backend.

The backend is a worker setting, KERNELFLEET_GEMMINI_BACKEND: `zigzag` (default), `scalesim`, or `firesim`
(then KERNELFLEET_FIRESIM_DIR = the FireSim checkout, KERNELFLEET_FIRESIM_REGISTRY = the bitstream registry
JSON, optional KERNELFLEET_FIRESIM_CMD / _BUILD / _ROCC_TESTS / _PLATFORM / _HOSTS / _SIM_DIR / _FPGA_DB /
_METASIM / _SOURCEME_ARGS, see docs/firesim.md). A host serves this platform only when
KERNELFLEET_WORKER_PLATFORM=gemmini picks it (its priority is below the CPU's).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cached_property

from service.models import TargetSpec, Toolchain, WorkloadSpec
from service.tuning.gemmini.backends import Backend, get_backend
from service.tuning.platforms.base import Platform, VendorTiming


class GemminiPlatform(Platform):
    target_kind = "gemmini"
    summary = "Gemmini accelerators (BACO co-tuning), measured by ZigZag/SCALE-Sim here and FireSim in production"
    detect_priority = -10

    def validate(self, target: TargetSpec) -> str | None:
        if not target.arch:
            return "gemmini targets need arch: the accelerator generator config, e.g. 'default'"
        return None

    def queue(self, target: TargetSpec) -> str:
        return "firesim"

    @property
    def backend_name(self) -> str:
        return os.environ.get("KERNELFLEET_GEMMINI_BACKEND", "zigzag")

    @cached_property
    def backend(self) -> Backend:
        if self.backend_name == "firesim":
            env = os.environ
            optional: dict[str, object] = {
                arg: env[var]
                for var, arg in (
                    ("KERNELFLEET_FIRESIM_BUILD", "build_cmd"),
                    ("KERNELFLEET_FIRESIM_ROCC_TESTS", "rocc_tests_dir"),
                    ("KERNELFLEET_FIRESIM_PLATFORM", "platform"),
                    ("KERNELFLEET_FIRESIM_SIM_DIR", "simulation_dir"),
                    ("KERNELFLEET_FIRESIM_FPGA_DB", "fpga_db"),
                    ("KERNELFLEET_FIRESIM_SOURCEME_ARGS", "sourceme_args"),
                )
                if var in env
            }
            if "KERNELFLEET_FIRESIM_HOSTS" in env:  # "host:spec,host:spec", e.g. "localhost:one_fpgas_spec"
                optional["run_farm_hosts"] = [
                    tuple(h.split(":", 1)) for h in env["KERNELFLEET_FIRESIM_HOSTS"].split(",")
                ]
            if env.get("KERNELFLEET_FIRESIM_METASIM", "") in ("1", "true", "yes"):
                optional["metasimulation"] = True
            return get_backend(
                "firesim",
                firesim_dir=env.get("KERNELFLEET_FIRESIM_DIR", "firesim"),
                registry=env.get("KERNELFLEET_FIRESIM_REGISTRY", "firesim-bitstreams.json"),
                firesim_cmd=env.get("KERNELFLEET_FIRESIM_CMD", "firesim"),
                **optional,
            )
        return get_backend(self.backend_name)

    def detect(self) -> TargetSpec | None:
        if self.backend.available() is not None:
            return None
        return TargetSpec(
            kind="gemmini", arch="default", details={"backend": self.backend.name}, toolchain=self.toolchain()
        )

    def toolchain(self) -> Toolchain:
        return Toolchain(tvm=self.backend.version())  # the measuring tool is this platform's "compiler"

    def mismatch(self, target: TargetSpec) -> str | None:
        why = self.backend.available()
        return f"this worker's Gemmini backend {self.backend.name} cannot run: {why}" if why else None

    def vendor(self, workload: WorkloadSpec, shape: Mapping[str, int], kernel_only: bool = False) -> VendorTiming:
        """Gemmini-Default (16×16, 256 KiB / 64 KiB, gemmini.h's tiling) measured by this worker's backend."""
        from service.tuning.gemmini.gemmini_h import default_point
        from service.tuning.gemmini.space import DEFAULT_HW
        from service.tuning.gemmini.workloads import CLOCK_HZ, layer_of

        layer = layer_of(workload, shape)
        maps, _ = default_point([layer])
        (m,) = self.backend.measure(DEFAULT_HW, [layer], maps)
        return VendorTiming(
            f"Gemmini default 16x16 256/64 KiB, gemmini.h tiling, {m.cycles:.0f} cycles by {m.backend} at 1 GHz",
            m.cycles / CLOCK_HZ,
        )
