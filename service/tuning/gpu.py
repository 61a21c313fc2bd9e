"""Which NVIDIA GPU this host has, described well enough to key tuning records (the cuda fingerprint).

Three sources, each parsed by a pure function so tests can feed fixed descriptions of an H100, an
A100 and a T4 (sm_75) without a GPU:
  - `nvidia-smi --query-gpu=uuid,name,compute_cap,memory.total,driver_version --format=csv,noheader,nounits`
    (identity, name, arch, memory, driver), and the banner of plain `nvidia-smi` (the driver's CUDA version);
  - the device attributes TVM's CUDA runtime reads (SM count, shared memory and threads per block, warp
    size, L2), when TVM can open the GPU;
  - the per-arch part (service.tuning.gpu_parts) for what
    neither reports: registers per block and shared memory per SM.
`nvcc --version` gives the CUDA toolkit that compiles the kernels (part of the toolchain).

Importable without pydantic (GPU measurement hosts lack it); only `to_target` needs service.models.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.models import TargetSpec, Toolchain
    from service.tuning.hardware_model import HardwareModel

SMI_QUERY = ("uuid", "name", "compute_cap", "memory.total", "driver_version")
# Registers per thread block is 64 K 32-bit registers on every arch from sm_50 on (CUDA C programming
# guide, compute-capability table); shared memory per SM differs per arch (service.tuning.gpu_parts).
REGISTERS_PER_BLOCK = 65536
STATIC_SMEM_PER_BLOCK = 49152  # without the opt-in attribute a kernel's static __shared__ is capped at 48 KiB


@dataclass(frozen=True)
class GPUDescription:
    name: str
    arch: str  # sm_XY
    sm_count: int
    memory_mib: int
    smem_per_block: int  # bytes a kernel may use without opting in
    smem_per_sm: int
    regs_per_block: int
    max_threads_per_block: int
    warp_size: int
    l2_bytes: int
    driver: str
    cuda: str  # the driver's CUDA version ("13.0"); "" when unknown
    nvcc: str = ""  # the toolkit that compiles kernels ("13.0.88"); "" when absent
    uuid: str = ""  # nvidia-smi's GPU-... identity: which physical device, never part of the fingerprint

    @property
    def driver_branch(self) -> str:
        """The driver's major version ('580' of '580.159.04'): a patch release of the same branch changes no
        kernel's speed enough to orphan every tuned record, so only the branch is in the fingerprint."""
        return self.driver.split(".", 1)[0]

    def hardware_model(self) -> HardwareModel:
        """This GPU's own SM count, limits and L2 over its arch's row of the published table."""
        from service.tuning.hardware_model import HardwareModel

        return HardwareModel.for_gpu(self.arch).overridden(
            name=f"{self.name} ({self.arch})",
            cores=self.sm_count,
            sm_count=self.sm_count,
            l2_bytes=self.l2_bytes,
            smem_per_block=self.smem_per_block,
            regs_per_block=self.regs_per_block,
            warp_size=self.warp_size,
            max_threads_per_block=self.max_threads_per_block,
        )

    def details(self) -> dict[str, str | int]:
        """What goes into TargetSpec.details (and so the fingerprint): the part and the versions that change
        which kernel is fastest. Which physical device and the driver's patch release go to `metadata()`."""
        return {
            "name": self.name,
            "sm_count": self.sm_count,
            "memory_mib": self.memory_mib,
            "smem_per_block": self.smem_per_block,
            "smem_per_sm": self.smem_per_sm,
            "regs_per_block": self.regs_per_block,
            "max_threads_per_block": self.max_threads_per_block,
            "warp_size": self.warp_size,
            "l2_bytes": self.l2_bytes,
            "driver": self.driver_branch,
            "cuda": self.cuda,
            "nvcc": self.nvcc,
        }

    def metadata(self) -> dict[str, str | int]:
        """Recorded with the target, outside the fingerprint."""
        return {"driver_version": self.driver, "uuid": self.uuid}

    def to_target(self, toolchain: Toolchain) -> TargetSpec:
        from service.models import TargetSpec

        return TargetSpec(
            kind="cuda",
            arch=self.arch,
            num_cores=self.sm_count,
            details=self.details(),
            metadata=self.metadata(),
            toolchain=toolchain,
        )


def parse_compute_cap(text: str) -> str:
    """'9.0' -> 'sm_90', '7.5' -> 'sm_75', '10.0' -> 'sm_100'."""
    match = re.fullmatch(r"\s*(\d+)\.(\d)\s*", text)
    if not match:
        raise ValueError(f"unrecognised compute capability {text!r}")
    return f"sm_{match.group(1)}{match.group(2)}"


def parse_smi_query(text: str) -> list[dict[str, str]]:
    """Rows of `nvidia-smi --query-gpu=<SMI_QUERY> --format=csv,noheader,nounits`, one per GPU."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(SMI_QUERY):
            raise ValueError(f"expected {len(SMI_QUERY)} fields ({', '.join(SMI_QUERY)}), got {line!r}")
        rows.append(dict(zip(SMI_QUERY, fields, strict=True)))
    return rows


def visible_row(rows: list[dict[str, str]], visible: str | None) -> dict[str, str] | None:
    """The nvidia-smi row of the GPU that CUDA calls device 0 in this process: the first entry of
    CUDA_VISIBLE_DEVICES (an index into nvidia-smi's list, or a UUID or unique UUID prefix), or nvidia-smi's
    first GPU when the variable is unset. None when the variable hides every GPU or names none of these."""
    if visible is None:
        return rows[0] if rows else None
    first = visible.split(",", 1)[0].strip()
    if not first or first == "-1":
        return None
    if first.isdigit():
        index = int(first)
        return rows[index] if index < len(rows) else None
    if first.startswith("MIG-"):
        raise ValueError(f"CUDA_VISIBLE_DEVICES={visible!r} names a MIG instance; a worker tunes whole GPUs")
    found = [row for row in rows if row["uuid"].startswith(first)]
    return found[0] if len(found) == 1 else None


def parse_smi_cuda_version(banner: str) -> str:
    """The 'CUDA Version: 13.0' of plain `nvidia-smi` output, or ''."""
    match = re.search(r"CUDA Version:\s*([\d.]+)", banner)
    return match.group(1) if match else ""


def parse_nvcc_version(text: str) -> str:
    """'Cuda compilation tools, release 13.0, V13.0.88' -> '13.0.88', or ''."""
    match = re.search(r"release [\d.]+, V([\d.]+)", text)
    return match.group(1) if match else ""


def describe(
    smi_row: Mapping[str, str],
    cuda: str = "",
    attrs: Mapping[str, int] | None = None,
    nvcc: str = "",
) -> GPUDescription:
    """One GPU from an nvidia-smi row, the driver's CUDA version and (when TVM could open it) device attributes.

    `attrs` keys: sm_count, smem_per_block, max_threads_per_block, warp_size, l2_bytes. Missing ones come
    from the arch's published table, so a description never silently says 0 SMs."""
    from service.tuning.gpu_parts import GPU_PARTS, base_arch

    arch = parse_compute_cap(smi_row["compute_cap"])
    table = GPU_PARTS.get(base_arch(arch))
    got = dict(attrs or {})

    def pick(key: str, fallback: int | None) -> int:
        if got.get(key):
            return int(got[key])
        if fallback is None:
            raise ValueError(f"{arch} is not in the GPU table and the device did not report {key}")
        return fallback

    return GPUDescription(
        uuid=smi_row.get("uuid", ""),
        name=smi_row["name"],
        arch=arch,
        sm_count=pick("sm_count", table.sm_count if table else None),
        memory_mib=int(float(smi_row["memory.total"])),
        smem_per_block=pick("smem_per_block", STATIC_SMEM_PER_BLOCK),
        smem_per_sm=table.smem_per_sm if table else pick("smem_per_block", STATIC_SMEM_PER_BLOCK),
        regs_per_block=REGISTERS_PER_BLOCK,
        max_threads_per_block=pick("max_threads_per_block", 1024),
        warp_size=pick("warp_size", 32),
        l2_bytes=pick("l2_bytes", table.l2_bytes if table else None),
        driver=smi_row["driver_version"],
        cuda=cuda,
        nvcc=nvcc,
    )


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def tvm_device_attrs(index: int = 0) -> dict[str, int] | None:
    """What TVM's CUDA runtime reads from the device, or None when TVM cannot open a GPU here."""
    try:
        import tvm
    except ImportError:
        return None
    if not tvm.runtime.enabled("cuda"):
        return None  # the CUDA runtime plugin found no libcuda.so.1 (a CPU-only host)
    dev: Any = tvm.cuda(index)
    if not dev.exist:
        return None
    return {
        "sm_count": int(dev.multi_processor_count),
        "smem_per_block": int(dev.max_shared_memory_per_block),
        "max_threads_per_block": int(dev.max_threads_per_block),
        "warp_size": int(dev.warp_size),
        "l2_bytes": int(dev.l2_cache_size_bytes or 0),
    }


@functools.cache
def nvcc_version() -> str:
    return parse_nvcc_version(_run(["nvcc", "--version"]) or "")


@functools.cache
def detect() -> GPUDescription | None:
    """The GPU this process computes on (CUDA's device 0: the first of CUDA_VISIBLE_DEVICES), or None when
    there is no NVIDIA driver or no visible GPU. Picked by UUID, so the description is of the device the
    kernels run on, not nvidia-smi's row 0."""
    rows = visible_gpus()
    row = visible_row(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if row is None:
        return None
    banner = _run(["nvidia-smi"]) or ""
    return describe(row, parse_smi_cuda_version(banner), tvm_device_attrs(0), nvcc_version())


def visible_gpus() -> list[dict[str, str]]:
    """Every GPU nvidia-smi sees (it ignores CUDA_VISIBLE_DEVICES), one row each."""
    query = _run(["nvidia-smi", f"--query-gpu={','.join(SMI_QUERY)}", "--format=csv,noheader,nounits"])
    return parse_smi_query(query) if query else []
