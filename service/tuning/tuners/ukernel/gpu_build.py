"""Build a GPU ukernel job's uKernels in parallel processes before any of them is timed.

The GPU tuner times every pipeline depth of every proposal (gpu_tuner._best_depth). Built one after another
inside the measuring child, each build (TVM lowering, nvcc, the host link of `export_library`) took 1-2 s, and a
BERT layer's ~40 variants did not finish inside the 100 s stage of the H200 session of 2026-11-27
(bench/results/gpu-h200-2026-11-27/). Building needs no GPU and each build is independent, so they run here in
a pool of spawned processes (as MetaSchedule's LocalBuilder does), each exporting a content-addressed library;
the measuring child then only loads and times (`time_library`), and the job publishes those same files.

A variant that TVM or nvcc refuses is returned with its error, and the others go on.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelfleet.cuda_ukernel import CudaUKernel, CudaUKernelSpec, load_cuda_ukernel
from service.tuning.cuda_toolchain import captured_device_code, device_code_sha256
from service.tuning.hardware import usable_cores
from service.tuning.tuners.ukernel.gpu_kernels import UKernelTile, build_module, rows_per_piece, tile_record


def build_cuda_ukernel(
    tile: UKernelTile, N: int, K: int, target: Mapping[str, Any], dtype: str = "float32"
) -> CudaUKernel:
    """Compile one uKernel (GEMM tile, GEMV or tensor-core tile) over a symbolic M, X, W and Y in `dtype`. On a
    GPU host the spec records the sha256 of the device code nvcc returned to TVM, which is what the exported
    library embeds; a host without a CUDA runtime builds CUDA source only and records '' (no device code)."""
    with captured_device_code() as blobs:
        module = build_module(tile, N, K, target, dtype)
    digest = device_code_sha256(blobs)
    spec = CudaUKernelSpec(
        N=N,
        K=K,
        mt=rows_per_piece(tile),
        tile=tile_record(tile),
        target=dict(target),
        dtype=dtype,
        fatbin_sha256=digest,
    )
    return CudaUKernel(module, spec)


@dataclass(frozen=True)
class BuiltLibrary:
    """One uKernel variant's exported library (path, sha256, spec), or why it could not be built."""

    label: str
    path: Path | None = None
    sha256: str = ""
    spec: CudaUKernelSpec | None = None
    error: str | None = None

    def require(self) -> tuple[Path, CudaUKernelSpec]:
        """(path, spec) of the library, or its build error raised."""
        if self.path is None or self.spec is None:
            raise RuntimeError(f"build failed: {self.error}")
        return self.path, self.spec


def _build_and_export(
    tile: UKernelTile, n: int, k: int, target: dict[str, Any], directory: str, dtype: str
) -> dict[str, Any]:
    """In a pool process: build one variant and export it; plain values back (picklable)."""
    kernel = build_cuda_ukernel(tile, n, k, target, dtype)
    path, digest = kernel.export(Path(directory))
    return {"path": str(path), "sha256": digest, "spec": kernel.spec.to_dict()}


def build_libraries(
    tiles: Sequence[UKernelTile],
    n: int,
    k: int,
    target: Mapping[str, Any],
    directory: Path,
    workers: int | None = None,
    dtype: str = "float32",
) -> dict[str, BuiltLibrary]:
    """Every distinct tile built and exported to `directory` by up to `workers` spawned processes (default: the
    cores this process may use), keyed by the tile's label."""
    unique = {tile.label(): tile for tile in tiles}
    if not unique:
        return {}
    directory.mkdir(parents=True, exist_ok=True)
    count = max(1, min(workers or usable_cores(), len(unique)))
    # spawn: a forked child would inherit the parent's CUDA context and TVM state
    context = multiprocessing.get_context("spawn")
    out: dict[str, BuiltLibrary] = {}
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        futures = {
            label: pool.submit(_build_and_export, tile, n, k, dict(target), str(directory), dtype)
            for label, tile in unique.items()
        }
        for label, future in futures.items():
            try:
                done = future.result()
            except Exception as exc:  # one variant TVM or nvcc refuses must not stop the others
                out[label] = BuiltLibrary(label, error=f"{type(exc).__name__}: {exc}"[:2000])
                continue
            spec = CudaUKernelSpec.from_dict(done["spec"])
            out[label] = BuiltLibrary(label, Path(done["path"]), done["sha256"], spec)
    return out


def time_library(path: str, spec: Mapping[str, Any], ms: Sequence[int], l2_bytes: int) -> list[float]:
    """In the measuring child: load a built library and time it at each M (kernel only, L2 flushed before each
    launch), on picklable values."""
    kernel = load_cuda_ukernel(Path(path), CudaUKernelSpec.from_dict(spec))
    return [kernel.time(m, l2_bytes=l2_bytes) for m in ms]
