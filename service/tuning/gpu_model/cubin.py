"""nvcc -cubin -Xptxas -v and cuobjdump -sass on a kernel's CUDA source: resources and the SASS mix, no GPU.

`ptxas -v` reports per kernel the registers, the stack frame, spill stores/loads and static shared bytes;
`cuobjdump -sass` lists the instructions, of which the model counts those that decide a GEMM's speed:
shared loads by width (LDS, LDS.64, LDS.128; LDSM = ldmatrix), global loads (LDG.E.128, LDGSTS = cp.async), FFMA, HMMA /
HGMMA (tensor cores), SHFL (warp shuffles) and LDL / STL (local memory: spills or a stack-resident array).
The SASS mix is counted statically (each instruction once, not per execution).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPCODES = (
    "LDS",
    "LDS.64",
    "LDS.128",
    "LDSM",
    "STS",
    "LDG.E.128",
    "LDGSTS",
    "FFMA",
    "HMMA",
    "HGMMA",
    "SHFL",
    "LDL",
    "STL",
)


@dataclass(frozen=True)
class KernelResources:
    name: str
    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    sass: dict[str, int] = field(default_factory=dict)  # opcode family -> static count

    @property
    def uses_local_memory(self) -> bool:
        return self.stack_bytes > 0 or self.spill_stores > 0 or self.spill_loads > 0 or self.sass.get("LDL", 0) > 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "registers": self.registers,
            "stack_bytes": self.stack_bytes,
            "spill_stores": self.spill_stores,
            "spill_loads": self.spill_loads,
            "shared_bytes": self.shared_bytes,
            "sass": dict(self.sass),
        }


def tool_path(name: str) -> str | None:
    """A CUDA tool (cuobjdump, nvdisasm, ...) from the pinned wheels beside this Python, else from PATH."""
    from kernelfleet.tvm_runtime import wheel_cuda_roots

    for root in wheel_cuda_roots():
        candidate = root / "bin" / name
        if candidate.is_file():
            return str(candidate)
    import shutil

    return shutil.which(name)


def _tool(name: str) -> str:
    found = tool_path(name)
    if found is None:
        raise FileNotFoundError(f"{name} not found (pip install -e .[cuda-build,sass] brings the pinned wheels)")
    return found


def have_tools() -> bool:
    from service.tuning.cuda_toolchain import nvcc_path

    return None not in (tool_path("cuobjdump"), tool_path("nvdisasm"), nvcc_path())


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """Per kernel name: registers, stack, spill stores/loads, shared bytes, from `-Xptxas -v` output."""
    out: dict[str, dict[str, int]] = {}
    current = ""
    for line in log.splitlines():
        if entry := _ENTRY.search(line):
            current = entry.group(1)
            out[current] = {"registers": 0, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0, "shared_bytes": 0}
        elif current and (frame := _FRAME.search(line)):
            out[current].update(
                stack_bytes=int(frame.group(1)), spill_stores=int(frame.group(2)), spill_loads=int(frame.group(3))
            )
        elif current and (used := _USED.search(line)):
            out[current]["registers"] = int(used.group(1))
            out[current]["shared_bytes"] = int(used.group(2) or 0)
    return out


_FUNCTION = re.compile(r"Function : (\w+)")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")


def _family(opcode: str) -> str | None:
    parts = opcode.split(".")
    if parts[0] == "LDS":
        width = next((p for p in parts[1:] if p in ("64", "128")), "")
        return f"LDS.{width}" if width else "LDS"
    if parts[0] == "LDG" and "128" in parts:
        return "LDG.E.128"
    return parts[0] if parts[0] in OPCODES else None


def opcode_counts(listing: str) -> dict[str, Counter[str]]:
    """Per kernel name: the static count of every full opcode in a `cuobjdump -sass` listing (e.g. LDG.E.128)."""
    out: dict[str, Counter[str]] = {}
    current: Counter[str] | None = None
    for line in listing.splitlines():
        if fn := _FUNCTION.search(line):
            current = out.setdefault(fn.group(1), Counter())
        elif current is not None and (ins := _INSTRUCTION.search(line)):
            current[ins.group(1)] += 1
    return out


def parse_sass(listing: str) -> dict[str, Counter[str]]:
    """Per kernel name: static counts of the opcode families in OPCODES."""
    out: dict[str, Counter[str]] = {}
    for name, opcodes in opcode_counts(listing).items():
        families: Counter[str] = Counter()
        for opcode, count in opcodes.items():
            if family := _family(opcode):
                families[family] += count
        out[name] = families
    return out


def compile_listing(source: str, arch: str) -> tuple[str, str]:
    """`nvcc -cubin -O3 -Xptxas -v` for `arch`, then `cuobjdump -sass`: (ptxas's report, the SASS listing)."""
    from service.tuning.cuda_toolchain import configure_cuda_compile

    nvcc = configure_cuda_compile()
    if nvcc is None:
        raise FileNotFoundError("nvcc not found (pip install -e .[cuda-build] brings the pinned wheel)")
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(source)
        built = subprocess.run(
            [str(nvcc), "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", "-o", str(cubin), str(src)],
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            raise RuntimeError(f"nvcc failed: {built.stderr[-2000:]}")
        listing = subprocess.run(
            [_tool("cuobjdump"), "-sass", str(cubin)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "NVDISASM_PATH": str(Path(_tool("nvdisasm")).parent)},
        ).stdout
    return built.stdout + built.stderr, listing


def compile_and_inspect(source: str, arch: str) -> list[KernelResources]:
    """Every kernel of `source` compiled for `arch` (e.g. sm_90a), in the order ptxas reports them."""
    log, listing = compile_listing(source, arch)
    resources, sass = parse_ptxas(log), parse_sass(listing)
    return [
        KernelResources(name=name, sass=dict(sass.get(name, Counter())), **values) for name, values in resources.items()
    ]
