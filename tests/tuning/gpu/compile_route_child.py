"""Run under the fake driver (tests/tuning/gpu/test_compile_route.py): build what a GPU worker builds, through
TVM's own compile callback, and report what came out as JSON on stdout.

`python -m tests.tuning.gpu.compile_route_child <work dir>`. Like the worker, it loads the wheels' CUDA
runtime before TVM and never sets TVM_CUDA_COMPILE_MODE itself.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from kernelfleet.tvm_runtime import preload_cuda_runtime

N, K = 2304, 768  # BERT-base qkv


def main(work: Path) -> dict[str, Any]:
    cudart = preload_cuda_runtime()
    import tvm

    from service.tuning.builder.cuda import cuda_target
    from service.tuning.cuda_toolchain import captured_device_code
    from service.tuning.tuners.ukernel.gpu_build import build_cuda_ukernel
    from service.tuning.tuners.ukernel.gpu_rules import gpu_ukernels
    from tests.tuning.gpu.descriptions import card

    report: dict[str, Any] = {
        "cuda_enabled": bool(tvm.runtime.enabled("cuda")),
        "gpu_exists": bool(tvm.cuda(0).exist),
        "cudart_preloaded": str(cudart or ""),
        "ukernels": [],
    }
    tiles = [c.tile for c in gpu_ukernels(card("sm_90").hardware_model(), N, K)][:3]
    for tile in tiles:
        with captured_device_code() as blobs:
            kernel = build_cuda_ukernel(tile, N, K, cuda_target("sm_90"))
        path, _ = kernel.export(work)
        shipped = path.read_bytes()
        report["ukernels"].append(
            {
                "tile": tile.label(),
                "blobs": len(blobs),
                "magic": blobs[0][:4].hex() if blobs else "",
                "recorded_sha256": kernel.spec.fatbin_sha256,
                "blob_sha256": hashlib.sha256(blobs[0]).hexdigest() if blobs else "",
                "blob_in_library": bool(blobs) and blobs[0] in shipped,
            }
        )
    report["metaschedule"] = _metaschedule_candidate()
    return report


def _metaschedule_candidate() -> dict[str, Any]:
    """One sampled MetaSchedule candidate through the CUDA builder's own build function."""
    import tvm

    from service.models import TargetSpec, WorkloadSpec
    from service.tuning.builder.metaschedule import fast_build_cuda
    from service.tuning.compute import prim_func
    from service.tuning.cuda_toolchain import captured_device_code
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.sketch import sample_candidates
    from tests.tuning.gpu.descriptions import card

    workload = WorkloadSpec(op="dense", dims={"N": N, "K": K}, symbolic=["M"])
    target = tvm_target(TargetSpec(kind="cuda", arch="sm_90", details=card("sm_90").details()))
    (sch,) = sample_candidates(prim_func(workload, {"M": 16}), target, count=1, seed=1)
    with captured_device_code() as blobs:
        fast_build_cuda(sch.mod, tvm.target.Target(target), None)
    return {"blobs": len(blobs), "magic": blobs[0][:4].hex() if blobs else ""}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
