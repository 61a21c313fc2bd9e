"""The three families of CUDA uKernel the GPU tuner builds, behind one small set of functions.

  - GEMM tiles (pipeline/schedule.GemmTile): SIMT, shared-memory tiles, pipelined, any M; a piece runs bm rows.
  - GEMV (pipeline/gemv.GemvTile): W streamed into registers, warp-shuffle reductions, for T ≤ 16 (correct for
    any M); a piece runs `bucket` rows.
  - tensor-core tiles (pipeline/tensorcore.TensorCoreTile): fp16/bf16 X and W only, mma.sync on sm_80+, split-K
    optional; a piece runs bm rows.
All compile to a module whose `main(X, W, Y)` takes a symbolic M, so kernelfleet.cuda_ukernel runs any of them;
Y is in the inputs' dtype (fp32 accumulation, rounded in the final store).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from service.tuning.tuners.pipeline.gemv import GemvTile, build_gemv, schedule_gemv
from service.tuning.tuners.pipeline.schedule import GemmTile, build_gemm, schedule_gemm
from service.tuning.tuners.pipeline.tensorcore import TensorCoreTile, build_tensorcore, schedule_tensorcore

UKernelTile = GemmTile | GemvTile | TensorCoreTile
_KIND = {GemmTile: "gemm", GemvTile: "gemv", TensorCoreTile: "tensorcore"}


def rows_per_piece(tile: UKernelTile) -> int:
    """The M granularity a dispatch piece of this uKernel runs (the DP's `mt`)."""
    return tile.bucket if isinstance(tile, GemvTile) else tile.bm


def build_module(tile: UKernelTile, n: int, k: int, target: Mapping[str, Any], dtype: str = "float32") -> Any:
    """The compiled uKernel: X and W in `dtype`, fp32 accumulation, Y in `dtype` too (what `F.linear` returns for
    those inputs, so a dispatch table can mix uKernels and cuBLAS routes)."""
    if isinstance(tile, GemvTile):
        return build_gemv(tile, n, k, target, dtype, out_dtype=dtype)
    if isinstance(tile, TensorCoreTile):
        return build_tensorcore(tile, n, k, target, dtype, out_dtype=dtype)
    return build_gemm(tile, n, k, target, dtype=dtype, out_dtype=dtype)


def scheduled_module(tile: UKernelTile, n: int, k: int, dtype: str = "float32") -> Any:
    """The scheduled (unbuilt) IRModule, what the static GPU model lowers and reads."""
    if isinstance(tile, GemvTile):
        return schedule_gemv(tile, n, k, dtype, out_dtype=dtype).mod
    if isinstance(tile, TensorCoreTile):
        return schedule_tensorcore(tile, n, k, dtype, out_dtype=dtype).mod
    return schedule_gemm(tile, n, k, None, dtype, out_dtype=dtype).mod


def tile_record(tile: UKernelTile) -> dict[str, Any]:
    """What a spec and a candidate record keep of the tile: its fields and its family."""
    return {"kind": _KIND[type(tile)], **dataclasses.asdict(tile)}
