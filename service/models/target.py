"""Hardware targets and the one target fingerprint.

The fingerprint covers everything that changes which kernel is fastest or whether a stored config
still applies: the hardware (kind, CPU model or GPU arch, cores, features) and the toolchain (TVM
version and the tuner ABI that wrote the config). Two records with different fingerprints never
answer for each other.

A target's kind names a platform of the tuning engine (service.tuning.platforms): whether the platform
exists, accepts the target and which queue serves it are the engine's to say, checked at submission.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from service.models.fields import DetailValue, Int, Key, RegistryName

# Bumped whenever the format of stored configs changes in a way old readers cannot apply.
TUNER_ABI = "1"

_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
# A CPU model, a GPU arch, a version, an LLVM feature ('-name' switches one off)
HardwareName = Annotated[str, StringConstraints(pattern=_NAME.pattern)]
# `mcpu: "host"` (or `arch: "host"`) on a job names the hardware the live workers of that platform serve, so
# an example copied from the docs runs on whatever machine the fleet has.
HOST_ALIAS = "host"


class Toolchain(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tvm: HardwareName = Field(description="TVM version that compiled the kernel")
    tuner_abi: HardwareName = TUNER_ABI


class TargetSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"kind": "llvm", "mcpu": "znver4", "num_cores": 2}]},
    )

    kind: RegistryName = Field(
        description="hardware platform: llvm (CPUs), cuda (NVIDIA GPUs), gemmini (Gemmini accelerators); "
        "GET /v1/platforms lists what this service knows",
    )
    mcpu: HardwareName | None = Field(default=None, description="LLVM CPU model (llvm targets)")
    arch: HardwareName | None = Field(default=None, description="GPU arch or accelerator config")
    num_cores: Int = Field(default=1, ge=1, le=1024)
    features: list[HardwareName] = Field(
        default_factory=list,
        max_length=64,
        description="LLVM features on top of mcpu's; '-name' switches one off (e.g. '-avx512f' where a "
        "hypervisor hides AVX-512)",
    )
    details: dict[Key, DetailValue] = Field(
        default_factory=dict,
        max_length=32,
        description="hardware details a worker detected, e.g. a GPU's name, SM count, memory, driver and CUDA "
        "versions; part of the fingerprint (filled in by the worker when omitted on jobs)",
    )
    metadata: dict[Key, DetailValue] = Field(
        default_factory=dict,
        max_length=32,
        description="facts recorded with the target but not part of the fingerprint, e.g. a GPU's UUID and the "
        "driver's full version (the fingerprint keeps only its branch)",
    )
    toolchain: Toolchain | None = Field(default=None, description="filled in by the worker when omitted on jobs")

    @model_validator(mode="after")
    def _canonical_features(self) -> TargetSpec:
        self.features = sorted(set(self.features))  # one fingerprint whatever the order and repeats
        return self

    @property
    def is_host_alias(self) -> bool:
        return HOST_ALIAS in (self.mcpu, self.arch)

    def hardware(self) -> dict[str, object]:
        return self.model_dump(exclude={"toolchain", "metadata"})

    def with_toolchain(self, toolchain: Toolchain) -> TargetSpec:
        return self.model_copy(update={"toolchain": toolchain})

    @property
    def fingerprint(self) -> str:
        if self.toolchain is None:
            raise ValueError("a target fingerprint needs the toolchain (target.toolchain)")
        fields = self.model_dump(exclude={"metadata"})
        if not fields["details"]:
            del fields["details"]  # targets without details keep the fingerprints they had before the field existed
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]


class Target(TargetSpec):
    """A registered, fully specified target as the service returns it."""

    model_config = ConfigDict(extra="ignore")
    target_fingerprint: str
