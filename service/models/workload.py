"""Workloads: an operator from the registry, its static dimensions and its named symbolic ones."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from service.models.operators import OPERATORS, OperatorDef
from service.models.shape import MAX_DIM

DType = Literal["float32", "float16"]


class WorkloadSpec(BaseModel):
    """What a user posts: e.g. a BERT-base QKV projection with dynamic sequence length `M`."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"op": "dense", "dtype": "float32", "dims": {"N": 2304, "K": 768}, "symbolic": ["M"]}]
        },
    )

    op: str = Field(description="operator name from the registry: " + ", ".join(sorted(OPERATORS)))
    dtype: DType = "float32"
    dims: dict[str, int] = Field(default_factory=dict, description="static dimension sizes")
    symbolic: list[str] = Field(default_factory=list, description="dimensions whose size varies at run time")
    attrs: dict[str, int | bool] = Field(default_factory=dict, description="operator attributes")

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        if op not in OPERATORS:
            raise ValueError(f"unknown operator {op!r}; known: {', '.join(sorted(OPERATORS))}")
        return op

    @field_validator("dims")
    @classmethod
    def _positive_dims(cls, dims: dict[str, int]) -> dict[str, int]:
        for name, size in dims.items():
            if not 1 <= size <= MAX_DIM:
                raise ValueError(f"dimension {name}={size} out of range 1..{MAX_DIM}")
        return dims

    @model_validator(mode="after")
    def _complete(self) -> WorkloadSpec:
        op = OPERATORS[self.op]
        known = set(op.dims)
        for name in [*self.dims, *self.symbolic]:
            if name not in known:
                raise ValueError(f"{self.op} has no dimension {name!r}; its dimensions are {', '.join(op.dims)}")
        both = set(self.dims) & set(self.symbolic)
        if both:
            raise ValueError(f"dimension(s) {', '.join(sorted(both))} cannot be both static and symbolic")
        if len(set(self.symbolic)) != len(self.symbolic):
            raise ValueError("symbolic dimensions must be distinct")
        missing = known - set(self.dims) - set(self.symbolic)
        if missing:
            raise ValueError(f"dimension(s) {', '.join(sorted(missing))} need a size in dims or a place in symbolic")
        for name in self.attrs:
            if name not in op.attrs:
                raise ValueError(f"{self.op} has no attribute {name!r}; its attributes are {list(op.attrs) or 'none'}")
        self.attrs = {**op.attrs, **self.attrs}
        for name, value in self.attrs.items():
            if isinstance(op.attrs[name], bool) != isinstance(value, bool):
                raise ValueError(f"attribute {name!r} must be {type(op.attrs[name]).__name__}")
            if not isinstance(value, bool) and not 0 <= value <= 64:
                raise ValueError(f"attribute {name!r}={value} out of range 0..64")
        if self.op == "conv2d" and self.attrs["stride"] < 1:
            raise ValueError("attribute 'stride' must be >= 1")
        return self

    @property
    def operator(self) -> OperatorDef:
        return OPERATORS[self.op]

    def canonical(self) -> dict[str, object]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "dims": dict(sorted(self.dims.items())),
            "symbolic": sorted(self.symbolic),
            "attrs": dict(sorted(self.attrs.items())),
        }

    @property
    def hash(self) -> str:
        """Content hash of the canonical form: the workload's identity everywhere."""
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def bind(self, shape: Mapping[str, int]) -> dict[str, int]:
        """Full sizes of every dimension for one concrete value of the symbolic ones."""
        missing = [d for d in self.symbolic if d not in shape]
        extra = [d for d in shape if d not in self.symbolic]
        if missing or extra:
            raise ValueError(
                f"shape must give exactly the symbolic dimensions {self.symbolic}; "
                f"missing {missing or 'none'}, unexpected {extra or 'none'}"
            )
        for name, size in shape.items():
            if not 1 <= int(size) <= MAX_DIM:
                raise ValueError(f"shape {name}={size} out of range 1..{MAX_DIM}")
        full = {**self.dims, **{d: int(shape[d]) for d in self.symbolic}}
        if self.op == "conv2d":
            derived = self.operator.derived(full, self.attrs)
            if min(derived.values()) < 1:
                raise ValueError(f"conv2d output would be empty for {full} with attrs {self.attrs}")
        return full

    def flops(self, shape: Mapping[str, int]) -> int:
        return self.operator.flops(self.bind(shape), self.attrs)


class Workload(WorkloadSpec):
    """A registered workload as the service returns it."""

    model_config = ConfigDict(extra="ignore")
    workload_hash: str
