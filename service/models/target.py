"""Hardware targets and the one target fingerprint.

The fingerprint covers everything that changes which kernel is fastest or whether a stored config
still applies: the hardware (kind, CPU model or GPU arch, cores, features) and the toolchain (TVM
version and the tuner ABI that wrote the config). Two records with different fingerprints never
answer for each other.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Bumped whenever the format of stored configs changes in a way old readers cannot apply.
TUNER_ABI = "1"

_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


class Toolchain(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tvm: str = Field(pattern=_NAME.pattern, description="TVM version that compiled the kernel")
    tuner_abi: str = Field(default=TUNER_ABI, pattern=_NAME.pattern)


class TargetSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"kind": "llvm", "mcpu": "znver4", "num_cores": 2}]},
    )

    kind: Literal["llvm", "cuda", "gemmini"]
    mcpu: str | None = Field(default=None, pattern=_NAME.pattern, description="LLVM CPU model (llvm targets)")
    arch: str | None = Field(default=None, pattern=_NAME.pattern, description="GPU arch or accelerator config")
    num_cores: int = Field(default=1, ge=1, le=1024)
    features: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="LLVM features on top of mcpu's; '-name' switches one off (e.g. '-avx512f' where a "
        "hypervisor hides AVX-512)",
    )
    toolchain: Toolchain | None = Field(default=None, description="filled in by the worker when omitted on jobs")

    @model_validator(mode="after")
    def _consistent(self) -> TargetSpec:
        if self.kind == "llvm" and not self.mcpu:
            raise ValueError("llvm targets need mcpu (without it LLVM emits SSE2-only code); e.g. 'znver4'")
        if self.kind in ("cuda", "gemmini") and not self.arch:
            raise ValueError(f"{self.kind} targets need arch, e.g. 'sm_80'")
        for feat in self.features:
            if not _NAME.match(feat):
                raise ValueError(f"bad feature name {feat!r}")
        self.features = sorted(set(self.features))
        return self

    @property
    def queue(self) -> str:
        """The Celery queue whose workers run on exactly this hardware."""
        if self.kind == "llvm":
            # a CPU model with some ISA extensions switched off (e.g. AVX-512 hidden by a hypervisor)
            # is other hardware: its workers must not take jobs compiled for the full model
            disabled = "".join(f".no-{f[1:]}" for f in self.features if f.startswith("-"))
            return f"cpu.{self.mcpu}{disabled}"
        if self.kind == "cuda":
            return f"gpu.{self.arch}"
        return "firesim"

    def hardware(self) -> dict[str, object]:
        return self.model_dump(exclude={"toolchain"})

    def with_toolchain(self, toolchain: Toolchain) -> TargetSpec:
        return self.model_copy(update={"toolchain": toolchain})

    @property
    def fingerprint(self) -> str:
        if self.toolchain is None:
            raise ValueError("a target fingerprint needs the toolchain (target.toolchain)")
        blob = json.dumps(self.model_dump(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def tvm_target(self) -> dict[str, object]:
        """The dict TVM 0.27 takes as `tvm.target.Target(...)`."""
        if self.kind == "llvm":
            out: dict[str, object] = {"kind": "llvm", "mcpu": self.mcpu, "num-cores": self.num_cores}
            if self.features:
                out["mattr"] = [f if f.startswith("-") else f"+{f}" for f in self.features]
            return out
        if self.kind == "cuda":
            return {"kind": "cuda", "arch": self.arch}
        raise ValueError(f"{self.kind} targets are not compiled by TVM")


class Target(TargetSpec):
    """A registered, fully specified target as the service returns it."""

    model_config = ConfigDict(extra="ignore")
    target_fingerprint: str
