"""A compiled kernel library a job publishes, named by the hash of its bytes (a dispatch table lists it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Artifact:
    ukernel_id: str
    sha256: str
    spec: dict[str, Any]  # what the SDK needs to load it: the uKernel's tile, symbolic dim, entry point
    data: bytes
