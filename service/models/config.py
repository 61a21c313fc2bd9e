"""Tuned configurations as stored and served."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from kernelfleet.models import ConfigRecord, FiniteJsonObject
from service.models.fields import Document, Flag, HexId, Int, Label, Real, Shape, Text
from service.models.target import TargetSpec

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
    shape: Shape


class BatchLookup(BaseModel):
    keys: list[LookupKey] = Field(min_length=1, max_length=1000)


class BatchLookupResult(BaseModel):
    results: list[ConfigRecord | ConfigMiss]


class TraceConfig(BaseModel):
    """A `sketch` config: a MetaSchedule trace, the IRModule it replays on and the TVM target it compiles
    for (what `kernelfleet.tvm_kernel.build_kernel` reads). Checked without TVM, so the API can."""

    model_config = ConfigDict(extra="allow")

    format: Literal["metaschedule-trace"] = "metaschedule-trace"  # kernelfleet.tvm_kernel.CONFIG_FORMAT_TRACE
    trace: list[Any] = Field(min_length=1, description="the trace's JSON (instructions, decisions)")
    module: Document = Field(description="the IRModule as TVM's JSON (tvm.ir.save_json)")
    module_hash: str = Field(pattern=r"^-?[0-9]{1,24}$", description="TVM's structural hash of the module")
    target: dict[str, Any] = Field(min_length=1, description="the TVM target, e.g. {'kind': 'llvm', 'mcpu': ...}")


class UKernelTileConfig(BaseModel):
    """A `ukernel` candidate: one uKernel tile the rules proposed (a dispatch table's building block)."""

    model_config = ConfigDict(extra="allow")

    format: Literal["ukernel-tile"] = "ukernel-tile"
    id: str = Field(pattern=r"^[A-Za-z0-9_]{1,64}$")
    tile: list[Annotated[Int, Field(ge=1, le=1 << 16)]] = Field(min_length=3, max_length=3, description="mt, nt, kt")


_Dim = Annotated[Int, Field(ge=1, le=1 << 24)]


class PipelineGemmShape(BaseModel):
    batch: _Dim
    m: _Dim
    n: _Dim
    k: _Dim
    dtype: Literal["float32", "float16"]


class PipelineSchedule(BaseModel):
    """ALCOP's schedule knobs (service.tuning.tuners.pipeline.space.PipelineConfig as the store keeps it)."""

    bm: Int = Field(ge=1, le=256)
    bn: Int = Field(ge=1, le=256)
    bk: Int = Field(ge=1, le=128)
    tm: Int = Field(ge=1, le=16)
    tn: Int = Field(ge=1, le=16)
    smem_stages: Int = Field(default=1, ge=1, le=5)
    async_copy: Flag = False
    reg_stages: Int = Field(default=1, ge=1, le=3)
    fuse_inner: Flag = False


class PipelineGemmConfig(BaseModel):
    """A `pipeline` config: one pipelined GEMM schedule for one GPU arch and one GEMM shape."""

    model_config = ConfigDict(extra="allow")

    format: Literal["pipeline-gemm"] = "pipeline-gemm"  # service.tuning.kinds.pipeline.CONFIG_FORMAT
    arch: str = Field(pattern=r"^sm_[0-9]{2,3}a?$")
    gemm: PipelineGemmShape
    config: PipelineSchedule


class GemminiCotuneConfig(BaseModel):
    """A `gemmini` config: a Gemmini hardware config and one layer's mapping, with what measured it."""

    model_config = ConfigDict(extra="allow")

    format: Literal["gemmini-cotune"] = "gemmini-cotune"
    layer: Label
    backend: str = Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$", description="what measured it: zigzag, scalesim, firesim")
    hw: FiniteJsonObject = Field(min_length=1, description="the hardware config (array, scratchpad, dataflow, bus)")
    mapping: FiniteJsonObject = Field(min_length=1, description="the layer's tile factors")
    measured_cycles: Real = Field(gt=0)


class ImportedRecord(BaseModel):
    """A config measured elsewhere (e.g. an existing MetaSchedule database) brought into the store."""

    workload_hash: HexId
    target: TargetSpec = Field(description="the target it was measured on, with its toolchain")
    shape: Shape
    latency_s: Real = Field(
        gt=0, description="seconds per call; refused below a plausible floor (see the 422 for the settings)"
    )
    config: FiniteJsonObject = Field(description="format-tagged, in the format of a job kind that publishes configs")
    source: Text


class ImportRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "records": [
                        {
                            "workload_hash": "52a36ef24bd6a82eab95d4c1f0e3a7b2",
                            "target": {
                                "kind": "llvm",
                                "mcpu": "znver4",
                                "num_cores": 2,
                                "toolchain": {"tvm": "0.27.0"},
                            },
                            "shape": {"M": 61},
                            "latency_s": 2.1e-5,
                            "config": {
                                "format": "metaschedule-trace",
                                "trace": [[], []],
                                "module": "<tvm.ir.save_json of the IRModule>",
                                "module_hash": "1234567890",
                                "target": {"kind": "llvm", "mcpu": "znver4", "num-cores": 2},
                            },
                            "source": "metaschedule:/path/to/work_dir",
                        }
                    ]
                }
            ]
        }
    )

    records: list[ImportedRecord] = Field(min_length=1, max_length=10_000)


class ImportResult(BaseModel):
    imported: int
    improved: int
