"""Models: one request that onboards a whole model's operators (parsed on the client, never executed here).

A model groups the distinct workloads the SDK extracted (`kernelfleet.model_import`), each with how often it
occurs in the model and the distribution of its symbolic dims under the model's traffic; the service registers
the workloads, submits one job per tunable op and splits the model's budget between them by priority
(expected FLOPs per call × occurrences: the fleet's FLOPs × weight, per model inference).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernelfleet.models import field_errors
from service.models.distribution import ShapeDistribution
from service.models.fields import DimExpr, DimName, Int, Label, Real, RegistryName, Tags, Text
from service.models.target import TargetSpec
from service.models.workload import WorkloadSpec

MAX_MODEL_OPS = 256


class ModelOp(BaseModel):
    """One distinct operator of the model: a workload body, its occurrences and its shape distribution."""

    model_config = ConfigDict(extra="forbid")

    name: Label = Field(description="unique within the model, e.g. dense(M=batch*seq, …)")
    workload: WorkloadSpec
    occurrences: Int = Field(default=1, ge=1, le=1_000_000, description="how often the op runs per model call")
    distribution: ShapeDistribution = Field(description="the op's symbolic dims under the model's traffic")
    dims: dict[DimName, DimExpr] = Field(
        default_factory=dict,
        max_length=16,
        description="provenance: each dim as an int or an expression of the model's dynamic inputs (M: batch*seq)",
    )
    sources: list[Text] = Field(
        default_factory=list, max_length=64, description="provenance: where in the model the op occurs"
    )


class ModelBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    trials: Int = Field(default=256, ge=1, le=100_000, description="the model's total, split between its jobs")
    min_trials: Int = Field(default=8, ge=1, le=100_000, description="the floor every tunable op's job gets")
    max_shapes: Int = Field(default=4, ge=1, le=128, description="each job's hot shapes (as Budget.max_shapes)")
    seed: Int | None = Field(default=None, ge=0, le=2**31 - 1)
    seconds: Real | None = Field(
        default=None, description="not supported yet: jobs are budgeted in trials, so give budget.trials"
    )

    @field_validator("seconds")
    @classmethod
    def _no_seconds(cls, seconds: float | None) -> None:
        if seconds is not None:
            raise ValueError("a time budget is not supported yet: jobs are budgeted in trials; give budget.trials")
        return None


class ModelSpec(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "name": "bert-tiny",
                    "target": {"kind": "llvm", "mcpu": "host"},
                    "ops": [
                        {
                            "name": "dense(M=batch*seq, N=3072, K=768; bias, gelu)",
                            "workload": {
                                "op": "dense",
                                "dims": {"N": 3072, "K": 768},
                                "symbolic": ["M"],
                                "attrs": {"bias": True, "activation": "gelu"},
                            },
                            "occurrences": 12,
                            "distribution": {
                                "kind": "explicit",
                                "points": [{"shape": {"M": 128}, "weight": 0.7}, {"shape": {"M": 512}, "weight": 0.3}],
                            },
                            "dims": {"M": "batch*seq", "N": 3072, "K": 768},
                        }
                    ],
                    "budget": {"trials": 256, "min_trials": 8},
                }
            ]
        },
    )

    name: str = Field(min_length=1, max_length=100, pattern=r"^[\w.:+/ -]+$")
    kind: RegistryName = Field(
        default="sketch",
        description="the job kind every tunable op is tuned with (GET /v1/kinds)",
    )
    target: TargetSpec
    ops: list[ModelOp] = Field(min_length=1, max_length=MAX_MODEL_OPS)
    budget: ModelBudget = Field(default_factory=ModelBudget)
    tags: Tags = Field(default_factory=dict)

    @model_validator(mode="after")
    def _distinct_names(self) -> ModelSpec:
        seen: dict[str, int] = {}
        errors: list[tuple[tuple[str | int, ...], str, object]] = []
        for i, op in enumerate(self.ops):
            if op.name in seen:
                errors.append((("ops", i, "name"), f"op name {op.name!r} is also ops.{seen[op.name]}'s", op.name))
            seen.setdefault(op.name, i)
        if errors:
            raise field_errors("ModelSpec", errors)
        return self


def op_priority(op: ModelOp) -> float:
    """Expected FLOPs of one call over the op's distribution (its weights normalised) × occurrences: the fleet's
    FLOPs × weight, per model call."""
    support = op.distribution.support()
    total = sum(w for _, w in support)
    # each weight normalised before it scales the FLOPs: a weight of 1e308 times the FLOPs is inf, and inf / inf is
    # the NaN priority that made splitting the budget fail (a 500 on POST /v1/models)
    expected = sum(w / total * op.workload.flops(shape) for shape, w in support)
    return expected * op.occurrences


def split_budget(priorities: list[float], total: int, floor: int) -> list[int]:
    """`total` trials over jobs with these priorities: each gets `floor`, and the rest is split ∝ priority by the
    largest remainder (so the parts add up to `total` exactly). Needs total >= floor × jobs."""
    if not priorities:
        return []
    rest = total - floor * len(priorities)
    if rest < 0:
        raise ValueError(f"{total} trials cannot give {len(priorities)} jobs {floor} each")
    weight = sum(priorities)
    exact = [rest * p / weight if weight > 0 else rest / len(priorities) for p in priorities]
    parts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (parts[i] - exact[i], -priorities[i]))
    for i in by_remainder[: rest - sum(parts)]:
        parts[i] += 1
    return [floor + p for p in parts]
