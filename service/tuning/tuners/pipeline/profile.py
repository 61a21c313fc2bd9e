"""A pipeline GEMM tile (schedule.GemmTile) profiled by the static GPU model (service.tuning.gpu_model): the
tuner's kernels as the model sees them, built and compiled here, modelled there."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.tuning.builder.cuda import pass_config
from service.tuning.gpu_model.profile import KernelProfile, profile_module
from service.tuning.tuners.pipeline.schedule import build_gemm, cuda_source, schedule_gemm


def profile_gemm_tile(
    tile: Any,
    n: int,
    k: int,
    target: Mapping[str, Any],
    dtype: str = "float32",
    compiled: bool = True,
    sm_count: int | None = None,
) -> KernelProfile:
    """A dense uKernel (pipeline/schedule.GemmTile) over a symbolic M, profiled."""
    arch = str(target["arch"])
    source = cuda_source(build_gemm(tile, n, k, target, dtype=dtype)) if compiled else None
    mod = schedule_gemm(tile, n, k, None, dtype).mod
    return profile_module(tile.label(), mod, target, pass_config(arch), source, sm_count)
