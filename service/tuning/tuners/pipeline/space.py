"""ALCOP's schedule space for a tiled GEMM on an NVIDIA GPU: tiles × multi-stage, multi-level pipelining.

A configuration is a thread-block tile (B_m, B_n, B_k), a per-thread register tile (t_m × t_n; a
warp's tile is 32 such threads), the shared-memory pipeline depth (1–5 stages, with or without
`cp.async`), the register-level depth (1–3 stages) and whether the inner (register) pipeline is fused
into the outer one (ALCOP Fig. 5.4: its prologue moves into the outer loop instead of draining and
refilling every outer iteration). `dense`, `batch_matmul` and `conv2d` (as an implicit GEMM) all reduce
to a batched GEMM, `GemmShape`.

Pure Python (no pydantic, TVM or Celery): the GPU benchmark imports it on machines that have only
numpy and torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

DTYPE_BYTES = {"float32": 4, "float16": 2}
WARP = 32


@dataclass(frozen=True)
class GemmShape:
    """C[b, m, n] = Σ_k A[b, m, k] · B[b, n, k]: what every supported operator becomes."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str = "float32"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def gemm_of(
    op: str, dims: Mapping[str, int], attrs: Mapping[str, int | bool | str] | None = None, dtype: str = "float32"
) -> GemmShape:
    """The GEMM an operator's full dimension sizes describe (a workload's `bind(shape)`).

    conv2d (NHWC, filter KH×KW×CI×CO) is the implicit GEMM: one output pixel per row
    (M = N·OH·OW), one output channel per column (N = CO), reduction over a filter window (K = KH·KW·CI).
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"pipeline schedules support {', '.join(DTYPE_BYTES)}, not {dtype}")
    if op == "dense":
        return GemmShape(1, dims["M"], dims["N"], dims["K"], dtype)
    if op == "batch_matmul":
        return GemmShape(dims["B"], dims["M"], dims["N"], dims["K"], dtype)
    if op == "conv2d":
        a = attrs or {}
        stride, padding = int(a.get("stride", 1)), int(a.get("padding", 0))
        oh = _conv_out(dims["H"], dims["KH"], stride, padding)
        ow = _conv_out(dims["W"], dims["KW"], stride, padding)
        return GemmShape(1, dims["N"] * oh * ow, dims["CO"], dims["KH"] * dims["KW"] * dims["CI"], dtype)
    raise ValueError(f"pipeline schedules cover dense, batch_matmul and conv2d, not {op!r}")


@dataclass(frozen=True)
class PipelineConfig:
    bm: int
    bn: int
    bk: int
    tm: int  # rows of C per thread
    tn: int  # columns of C per thread
    smem_stages: int = 1  # 1 = a single shared buffer, no pipelining
    async_copy: bool = False  # fill shared memory with cp.async (Ampere+)
    reg_stages: int = 1  # register-level fragments in flight over the inner k loop
    fuse_inner: bool = False  # inner-pipeline fusion (needs smem_stages > 1 and reg_stages > 1)

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def warps(self) -> int:
        return math.ceil(self.threads / WARP)

    def smem_bytes(self, dtype_bytes: int) -> int:
        """Shared memory of one thread block: each stage holds a B_m×B_k and a B_n×B_k tile."""
        return self.smem_stages * (self.bm + self.bn) * self.bk * dtype_bytes

    @property
    def registers_per_thread(self) -> int:
        """Accumulators + register-stage fragments + ~24 for addresses, indices and loop state."""
        return self.tm * self.tn + self.reg_stages * (self.tm + self.tn) + 24

    @property
    def pipelined(self) -> bool:
        return self.smem_stages > 1 or self.reg_stages > 1

    def unpipelined(self) -> PipelineConfig:
        """The same tiles with every pipeline switched off (the benchmark's "tiles only" column)."""
        return replace(self, smem_stages=1, async_copy=False, reg_stages=1, fuse_inner=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PipelineConfig:
        return cls(**{f: data[f] for f in cls.__dataclass_fields__ if f in data})

    @property
    def key(self) -> str:
        """A short stable name, e.g. '64x64x16/4x4/s4a/r2f'."""
        smem = f"s{self.smem_stages}{'a' if self.async_copy else ''}"
        reg = f"r{self.reg_stages}{'f' if self.fuse_inner else ''}"
        return f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}/{smem}/{reg}"


@dataclass(frozen=True)
class SpaceLimits:
    block_tiles: tuple[int, ...] = (16, 32, 64, 128)
    k_tiles: tuple[int, ...] = (8, 16, 32)
    thread_tiles: tuple[int, ...] = (1, 2, 4, 8)
    min_threads: int = 32
    max_threads: int = 256
    smem_per_block: int = 48 << 10  # static __shared__ allocations (what TVM emits) stop at 48 KiB
    max_registers_per_thread: int = 255
    max_smem_stages: int = 5
    max_reg_stages: int = 3


def _fits(size: int, tile: int, smallest: int) -> bool:
    """A tile no larger than the dimension rounded up to a power of two (padding a little is fine,
    padding M=16 to 128 rows is waste), but always allow the smallest tile."""
    return tile == smallest or tile <= 1 << max(0, (size - 1).bit_length())


def tiles(shape: GemmShape, limits: SpaceLimits = SpaceLimits()) -> Iterator[tuple[int, int, int, int, int]]:
    """(B_m, B_n, B_k, t_m, t_n) with a legal thread count, sized to the GEMM."""
    # M is padded to a multiple of B_m inside the kernel (it may be symbolic); N and K are static and
    # must be whole multiples of B_n and B_k
    smallest = min(limits.block_tiles)
    for bm in limits.block_tiles:
        if not _fits(shape.m, bm, smallest):
            continue
        for bn in limits.block_tiles:
            if shape.n % bn:
                continue
            for bk in limits.k_tiles:
                if shape.k % bk:
                    continue
                for tm in limits.thread_tiles:
                    for tn in limits.thread_tiles:
                        if bm % tm or bn % tn:
                            continue
                        threads = (bm // tm) * (bn // tn)
                        if limits.min_threads <= threads <= limits.max_threads and threads % WARP == 0:
                            yield bm, bn, bk, tm, tn


def pipeline_variants(limits: SpaceLimits = SpaceLimits()) -> Iterator[tuple[int, bool, int, bool]]:
    """(smem stages, async copy, register stages, fuse inner). A single shared stage with cp.async would
    wait for each copy right after issuing it, so async starts at 2 stages; fusion moves the inner
    pipeline's prologue into the outer pipelined loop, so it needs both levels pipelined."""
    for smem_stages in range(1, limits.max_smem_stages + 1):
        for async_copy in (False, True) if smem_stages > 1 else (False,):
            for reg_stages in range(1, limits.max_reg_stages + 1):
                for fuse in (False, True) if reg_stages > 1 and smem_stages > 1 else (False,):
                    yield smem_stages, async_copy, reg_stages, fuse


def feasible(config: PipelineConfig, shape: GemmShape, limits: SpaceLimits = SpaceLimits()) -> str | None:
    """Why a configuration cannot run on one thread block's resources, or None."""
    steps = shape.k // config.bk
    if config.smem_stages > steps:
        return f"{config.smem_stages} stages need at least as many k-steps (K/B_k = {steps})"
    smem = config.smem_bytes(shape.dtype_bytes)
    if smem > limits.smem_per_block:
        return f"shared memory {smem} B > {limits.smem_per_block} B per block"
    if config.registers_per_thread > limits.max_registers_per_thread:
        return f"{config.registers_per_thread} registers per thread > {limits.max_registers_per_thread}"
    if config.threads > limits.max_threads or config.threads < limits.min_threads:
        return f"{config.threads} threads per block outside {limits.min_threads}..{limits.max_threads}"
    return None


def enumerate_space(shape: GemmShape, limits: SpaceLimits = SpaceLimits()) -> list[PipelineConfig]:
    """Every feasible configuration for `shape`, in a deterministic order."""
    out: list[PipelineConfig] = []
    variants = list(pipeline_variants(limits))
    for bm, bn, bk, tm, tn in tiles(shape, limits):
        for smem_stages, async_copy, reg_stages, fuse in variants:
            config = PipelineConfig(bm, bn, bk, tm, tn, smem_stages, async_copy, reg_stages, fuse)
            if feasible(config, shape, limits) is None:
                out.append(config)
    return out
