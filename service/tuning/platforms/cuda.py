"""NVIDIA GPUs through TVM's CUDA backend: queue `gpu.<arch>`, cuBLAS (through torch) as the vendor library.

The host's GPU is read by service.tuning.gpu (nvidia-smi + TVM's device attributes + the arch table);
its description goes into TargetSpec.details and so into the fingerprint: an H100 PCIe (114 SMs) and an
H100 SXM (132 SMs) share sm_90 but not their tuned configs.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from service.models import TargetSpec, Toolchain, WorkloadSpec
from service.tuning import cublas, cuda_toolchain, gpu, hardware
from service.tuning.gpu_parts import base_arch
from service.tuning.platforms.base import TVMPlatform, VendorTiming, check_result

log = logging.getLogger(__name__)
_ARCH = re.compile(r"^sm_\d{2,3}a?$")
# details a job may pin; when it does, the worker's GPU must have the same value
_PINNED_DETAILS = ("name", "sm_count", "memory_mib")


class CUDAPlatform(TVMPlatform):
    target_kind = "cuda"
    summary = "NVIDIA GPUs through TVM's CUDA codegen; vendor baseline cuBLAS through torch, timed with CUDA graphs"
    detect_priority = 20

    def validate(self, target: TargetSpec) -> str | None:
        if not target.arch or not _ARCH.match(target.arch):
            return "cuda targets need arch as sm_XY, e.g. 'sm_90' for an H100"
        return None

    def queue(self, target: TargetSpec) -> str:
        return f"gpu.{base_arch(str(target.arch))}"  # an sm_90a job runs on the sm_90 workers

    def describe_host(self) -> gpu.GPUDescription | None:
        return gpu.detect()

    def detect(self) -> TargetSpec | None:
        desc = self.describe_host()
        if desc is None:
            return None
        _warn_on_version_mix(desc.nvcc, desc.cuda)
        return desc.to_target(self.toolchain())

    def toolchain(self) -> Toolchain:
        return hardware.toolchain()

    def mismatch(self, target: TargetSpec) -> str | None:
        return gpu_mismatch(target, self.describe_host())

    def resolve(self, target: TargetSpec) -> TargetSpec:
        """The host's detected GPU details fill in what the job left out (they are part of the fingerprint)."""
        desc = self.describe_host()
        resolved = super().resolve(target)
        if desc is None:
            return resolved
        return resolved.model_copy(
            update={
                "details": {**desc.details(), **target.details},
                "metadata": {**desc.metadata(), **target.metadata},
                "num_cores": desc.sm_count,
            }
        )

    def tvm_target(self, target: TargetSpec) -> dict[str, object]:
        from service.tuning.builder.cuda import cuda_target

        details = target.details
        return cuda_target(
            str(target.arch),
            max_threads_per_block=int(details.get("max_threads_per_block", 1024)),
            max_shared_memory_per_block=int(details.get("smem_per_block", gpu.STATIC_SMEM_PER_BLOCK)),
            thread_warp_size=int(details.get("warp_size", 32)),
            registers_per_block=int(details.get("regs_per_block", gpu.REGISTERS_PER_BLOCK)),
        )

    def pass_config(self, target: TargetSpec) -> dict[str, object]:
        from service.tuning.builder.cuda import pass_config

        return pass_config(str(target.arch))  # async copies on sm_80+

    def metaschedule_builder(self) -> Any:
        from service.tuning.builder.metaschedule import make_builder

        # CUDA candidates build through nvcc; 120 s covers a cold nvcc on a loaded host (gpu.md §3)
        return make_builder(max_workers=hardware.usable_cores(), timeout_sec=120, cuda=True)

    def time_call(self, fn: Callable[..., Any], *args: Any) -> float:
        """Seconds per call as a host calls it back to back: Python call + launch, device synchronised."""
        import tvm

        dev = tvm.cuda(0)
        fn(*args)
        dev.sync()
        samples = []
        for _ in range(5):
            calls = 50
            start = time.perf_counter()
            for _ in range(calls):
                fn(*args)
            dev.sync()
            samples.append((time.perf_counter() - start) / calls)
        return float(np.median(samples))

    def host_call(self, kernel: Any, inputs: list[np.ndarray]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        """A GPU inference host already holds its tensors on the device; a torch host passes torch CUDA tensors
        (TVM takes them through DLPack on torch's current stream), so our kernel pays what the vendor call
        (`F.linear` on the same tensors) pays. Without torch, TVM tensors."""
        try:
            import torch
        except ImportError:
            return kernel.run_device, tuple(kernel.device_args(*inputs))
        out = torch.empty(kernel.output.shape, dtype=getattr(torch, kernel.output.dtype), device="cuda")
        return kernel.run_device, (*(torch.from_numpy(a).cuda() for a in inputs), out)

    def check(self, got: Any, expected: np.ndarray, tolerance: float) -> str | None:
        host = got.numpy() if hasattr(got, "numpy") else got  # a device tensor comes back to the host once
        if hasattr(host, "cpu"):
            host = host.cpu().numpy()
        return check_result(host, expected, tolerance)

    def vendor(self, workload: WorkloadSpec, shape: Mapping[str, int], kernel_only: bool = False) -> VendorTiming:
        """cuBLAS (dense, batch_matmul) or cuDNN (conv2d) through torch, on the workload's layout, with the
        weights rotating through copies larger than this GPU's L2. As a host calls it by default, like
        `time_call` times our kernels; `kernel_only` replays a CUDA graph, like TVM's time_evaluator."""
        if workload.op not in cublas.OPS:
            raise ValueError(f"no GPU vendor baseline for {workload.op}; covered: {', '.join(cublas.OPS)}")
        host = self.describe_host()
        l2 = host.l2_bytes if host is not None else 0
        sizes = workload.bind(shape)
        seconds = cublas.time_op(workload.op, sizes, workload.attrs, workload.dtype, graph=kernel_only, l2_bytes=l2)
        return VendorTiming(cublas.label(workload.dtype, graph=kernel_only, op=workload.op), seconds)


@functools.cache
def _warn_on_version_mix(nvcc: str, driver_cuda: str) -> None:
    """Once per worker: say so when nvcc, torch's CUDA and the driver's CUDA do not fit (a warning, not a
    refusal: CUDA's minor-version compatibility often still loads the kernels, and the log names the pin)."""
    try:
        import torch

        torch_cuda = str(torch.version.cuda or "")
    except ImportError:
        torch_cuda = ""
    for problem in cuda_toolchain.version_problems(nvcc, torch_cuda, driver_cuda):
        log.warning("CUDA versions: %s", problem)


def gpu_mismatch(target: TargetSpec, host: gpu.GPUDescription | None) -> str | None:
    """Why a host with GPU `host` (None: no GPU) must not tune for a cuda `target`, or None."""
    if target.kind != "cuda":
        return f"a CUDA worker does not tune {target.kind} targets"
    if host is None:
        return "this worker has no CUDA GPU"
    if base_arch(str(target.arch)) != base_arch(host.arch):
        return f"job target arch={target.arch} but this worker's GPU is {host.arch} ({host.name})"
    mine = host.details()
    for key in _PINNED_DETAILS:
        if key in target.details and target.details[key] != mine[key]:
            return f"job target {key}={target.details[key]!r} but this worker's GPU has {mine[key]!r}"
    return None
