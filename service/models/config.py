"""Tuned configurations as stored and served."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field

from kernelfleet.models import ConfigRecord

CandidateStatus = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class MeasuredCandidate:
    """One candidate a tuner built and ran: its config, and its latency or why it has none."""

    config: dict[str, Any]
    latency_s: float | None
    status: CandidateStatus
    error: str | None = None


class Fallback(BaseModel):
    kind: Literal["default"] = "default"
    advice: str = (
        "No tuned config for this workload, target and shape: run the operator's default kernel "
        "(the vendor library, e.g. numpy/OpenBLAS) and submit a tuning job for this shape."
    )


class ConfigMiss(BaseModel):
    detail: str
    workload_hash: str
    target_fingerprint: str
    shape: dict[str, int]
    fallback: Fallback = Field(default_factory=Fallback)


class LookupKey(BaseModel):
    workload: str = Field(min_length=1, max_length=64)
    target: str = Field(min_length=1, max_length=64)
    shape: dict[str, int]


class BatchLookup(BaseModel):
    keys: list[LookupKey] = Field(min_length=1, max_length=1000)


class BatchLookupResult(BaseModel):
    results: list[ConfigRecord | ConfigMiss]


class ImportedRecord(BaseModel):
    """A config measured elsewhere (e.g. an existing MetaSchedule database) brought into the store."""

    workload_hash: str
    target: dict[str, Any]
    shape: dict[str, int]
    latency_s: float = Field(gt=0)
    config: dict[str, Any]
    source: str = Field(max_length=200)


class ImportRequest(BaseModel):
    records: list[ImportedRecord] = Field(min_length=1, max_length=10_000)


class ImportResult(BaseModel):
    imported: int
    improved: int
