"""The TVM target and PassContext a CUDA build needs: the limits MetaSchedule's AutoBind reads, and asynchronous
copies (`cp.async`) where the arch has them. Used by the CUDA platform, the builder and every CUDA tuner.

Stdlib only: GPU measurement hosts import this without pydantic.
"""

from __future__ import annotations

import re


def supports_async_copy(arch: str) -> bool:
    """cp.async exists from sm_80 (Ampere) on; ptxas rejects it for older targets."""
    match = re.fullmatch(r"sm_(\d+)a?", arch)
    return bool(match) and int(match.group(1)) >= 80  # type: ignore[union-attr]


def pass_config(arch: str) -> dict[str, object]:
    """The PassContext options for a CUDA build: async copies where the arch has them."""
    return {"tirx.use_async_copy": supports_async_copy(arch)}


def cuda_target(
    arch: str,
    max_threads_per_block: int = 1024,
    max_shared_memory_per_block: int = 49152,
    thread_warp_size: int = 32,
    registers_per_block: int = 65536,
) -> dict[str, object]:
    """The TVM target dict; MetaSchedule's AutoBind needs the limits (gpu.md §3)."""
    return {
        "kind": "cuda",
        "arch": arch,
        "max_threads_per_block": max_threads_per_block,
        "max_shared_memory_per_block": max_shared_memory_per_block,
        "thread_warp_size": thread_warp_size,
        "registers_per_block": registers_per_block,
    }
