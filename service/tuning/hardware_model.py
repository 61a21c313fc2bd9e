"""The few hardware numbers that decide which uKernel tiles make sense (FTuner's hardware description).

FTuner keeps one Python class per GPU with register, shared-memory and SM counts and derives tile
candidates from them instead of searching (../shared/research/anchors.md §1.2). This is the same
idea for both CPUs and GPUs: a frozen record that the rules read, built from the host (/proc, /sys),
from an explicit description (tests, other machines), or from a table of published GPU properties.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.tuning.gpu_parts import GPU_PARTS, GPUPart, base_arch
from service.tuning.hardware import parse_cpuinfo, usable_cores

_DTYPE_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16, "int8": 8}


@dataclass(frozen=True)
class HardwareModel:
    kind: Literal["cpu", "gpu"]
    name: str
    vector_bits: int  # CPU: SIMD register width; GPU: widest per-thread load (LDG.128)
    vector_registers: int  # CPU: architectural SIMD registers; GPU: max registers per thread
    l1_bytes: int  # per core (CPU) / per SM, L1 + shared memory (GPU)
    l2_bytes: int
    l3_bytes: int
    cores: int  # CPU cores this worker may use / GPU SMs
    sm_count: int = 0
    warp_size: int = 0
    smem_per_sm: int = 0
    regs_per_sm: int = 0
    max_threads_per_block: int = 0
    smem_per_block: int = 0  # GPU: static __shared__ a kernel may use without opting in (48 KiB)
    max_threads_per_sm: int = 0
    max_blocks_per_sm: int = 0
    regs_per_block: int = 0
    async_copy: bool = False  # GPU: cp.async (global -> shared without registers), sm_80 and newer

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of `dtype` per vector register: the alignment unit of the contiguous tile axis."""
        try:
            return self.vector_bits // _DTYPE_BITS[dtype]
        except KeyError:
            raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(_DTYPE_BITS)}") from None

    def overridden(self, **fields: Any) -> HardwareModel:
        """A copy with some fields replaced (e.g. fewer cores for a worker pinned to a subset)."""
        return dataclasses.replace(self, **fields)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, stored next to results so scores can be recomputed later."""
        return dataclasses.asdict(self)

    @classmethod
    def from_cpu_description(
        cls, flags: Iterable[str], caches: Mapping[int, int], cores: int, name: str = "cpu"
    ) -> HardwareModel:
        """From CPU feature flags (/proc/cpuinfo spelling) and data-cache bytes per level {1: .., 2: .., 3: ..}."""
        vector_bits, registers = _simd(set(flags))
        return cls(
            kind="cpu",
            name=name,
            vector_bits=vector_bits,
            vector_registers=registers,
            l1_bytes=caches.get(1, 0),
            l2_bytes=caches.get(2, 0),
            l3_bytes=caches.get(3, 0),
            cores=cores,
        )

    @classmethod
    def from_host(
        cls,
        cpuinfo: Path = Path("/proc/cpuinfo"),
        cache_dir: Path = Path("/sys/devices/system/cpu/cpu0/cache"),
        cores: int | None = None,
    ) -> HardwareModel:
        flags, name = parse_cpuinfo(cpuinfo.read_text() if cpuinfo.exists() else "")
        return cls.from_cpu_description(flags, _caches(cache_dir), cores or usable_cores(), name=name)

    @classmethod
    def for_gpu(cls, arch: str) -> HardwareModel:
        try:
            return GPU_TABLE[base_arch(arch)]
        except KeyError:
            raise ValueError(f"no hardware model for {arch!r}; known: {', '.join(sorted(GPU_TABLE))}") from None


def _simd(flags: set[str]) -> tuple[int, int]:
    """(vector bits, vector registers) of the widest SIMD extension the flags announce."""
    if "avx512f" in flags:
        return 512, 32  # zmm0-31
    if "avx2" in flags or "avx" in flags:
        return 256, 16  # ymm0-15
    if "asimd" in flags or "neon" in flags:
        return 128, 32  # v0-v31; SVE vector length is not in cpuinfo, so NEON width is the safe floor
    return 128, 16  # SSE2 is the x86-64 baseline


_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$", re.IGNORECASE)


def parse_cache_size(text: str) -> int:
    """sysfs cache sizes: '32K', '1024K', '1M', or plain bytes."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"unrecognised cache size {text!r}")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[match.group(2).upper()]
    return int(match.group(1)) * scale


def _caches(cache_dir: Path) -> dict[int, int]:
    """Data (or unified) cache bytes per level; instruction caches don't hold tiles."""
    out: dict[int, int] = {}
    for index in sorted(cache_dir.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified"):
            out[level] = size
    return out


def _of_part(part: GPUPart) -> HardwareModel:
    return HardwareModel(
        kind="gpu",
        name=f"{part.name} ({part.arch})",
        vector_bits=128,
        vector_registers=255,
        l1_bytes=part.l1_bytes,
        l2_bytes=part.l2_bytes,
        l3_bytes=0,
        cores=part.sm_count,
        sm_count=part.sm_count,
        warp_size=32,
        smem_per_sm=part.smem_per_sm,
        regs_per_sm=part.regs_per_sm,
        max_threads_per_block=1024,
        smem_per_block=48 << 10,
        max_threads_per_sm=part.max_threads_per_sm,
        max_blocks_per_sm=part.max_blocks_per_sm,
        regs_per_block=65536,
        async_copy=part.async_copy,
    )


# The uKernel search's view of each arch's part (service.tuning.gpu_parts). Other parts of the same arch differ in
# SM count and L2 only: override those with `overridden(sm_count=..., cores=..., l2_bytes=...)` or build the model
# from a detected GPU (`service.tuning.gpu.GPUDescription.hardware_model`).
GPU_TABLE: dict[str, HardwareModel] = {arch: _of_part(part) for arch, part in GPU_PARTS.items()}
