"""Workloads: an operator from the registry, its static dimensions and its named symbolic ones."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kernelfleet.models import field_errors
from service.models.fields import AttrValue, DimName, RegistryName, Size
from service.models.operators import OPERATORS, OperatorDef
from service.models.shape import MAX_DIM
from service.settings import get_settings

DType = Literal["float32", "float16", "bfloat16"]  # which kinds tune which: JobKind.dtypes
FieldProblem = tuple[tuple[str | int, ...], str]  # the field to blame (under the workload) and why


class WorkloadSpec(BaseModel):
    """What a user posts: e.g. a BERT-base QKV projection with dynamic sequence length `M`."""

    # Checks added later (size bounds, empty conv2d outputs) apply to what users post, not to workloads the
    # store already holds: those load as they were registered, whatever the bounds are set to today.
    _new: ClassVar[bool] = True

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"op": "dense", "dtype": "float32", "dims": {"N": 2304, "K": 768}, "symbolic": ["M"]}]
        },
    )

    op: RegistryName = Field(description="operator name from the registry: " + ", ".join(sorted(OPERATORS)))
    dtype: DType = "float32"
    dims: dict[DimName, Size] = Field(default_factory=dict, max_length=16, description="static dimension sizes")
    symbolic: list[DimName] = Field(
        default_factory=list, max_length=16, description="dimensions whose size varies at run time"
    )
    attrs: dict[DimName, AttrValue] = Field(
        default_factory=dict,
        max_length=16,
        description="operator attributes (GET /v1/operators lists each one's default and choices)",
    )

    def label(self) -> str:
        """A layer's workload as people read it: 'dense M=? N=3072 K=768 +bias +gelu' (dims in the operator's
        order, ? where dynamic; true flags, an activation, other attribute values; a dtype other than float32)."""
        parts = [self.op, *(f"{d}={self.dims.get(d, '?')}" for d in OPERATORS[self.op].dims)]
        for name, value in self.attrs.items():
            if value is True:
                parts.append(f"+{name}")
            elif name == "activation" and value != "none":
                parts.append(f"+{value}")
            elif not isinstance(value, bool) and name != "activation":
                parts.append(f"{name}={value}")
        if self.dtype != "float32":
            parts.append(self.dtype)
        return " ".join(parts)

    @field_validator("op")
    @classmethod
    def _known_op(cls, op: str) -> str:
        if op not in OPERATORS:
            raise ValueError(f"unknown operator {op!r}; known: {', '.join(sorted(OPERATORS))}")
        return op

    @model_validator(mode="after")
    def _complete(self) -> WorkloadSpec:
        problem = self._structure_problem() or (self._registration_problem() if self._new else None)
        if problem:
            loc, message = problem
            raise field_errors("WorkloadSpec", [(loc, message, self._input_at(loc))])
        return self

    def _structure_problem(self) -> FieldProblem | None:
        """What makes this no workload of its operator, and the field to blame; fills in default attrs."""
        op = OPERATORS[self.op]
        for name in self.dims:
            if name not in op.dims:
                return ("dims", name), f"{self.op} has no dimension {name!r}; its dimensions are {', '.join(op.dims)}"
        for i, name in enumerate(self.symbolic):
            if name not in op.dims:
                return ("symbolic", i), f"{self.op} has no dimension {name!r}; its dimensions are {', '.join(op.dims)}"
            if name in self.dims:
                return ("symbolic", i), f"dimension {name} cannot be both static and symbolic"
            if name in self.symbolic[:i]:
                return ("symbolic", i), f"symbolic dimensions must be distinct; {name} is listed twice"
        missing = set(op.dims) - set(self.dims) - set(self.symbolic)
        if missing:
            return ("dims",), f"dimension(s) {', '.join(sorted(missing))} need a size in dims or a place in symbolic"
        for name in self.attrs:
            if name not in op.attrs:
                known = list(op.attrs) or "none"
                return ("attrs", name), f"{self.op} has no attribute {name!r}; its attributes are {known}"
        self.attrs = {**op.attrs, **self.attrs}
        for name, value in self.attrs.items():
            default = op.attrs[name]
            if any(isinstance(default, t) != isinstance(value, t) for t in (bool, str)):
                return ("attrs", name), f"attribute {name!r} must be {type(default).__name__}"
            if isinstance(value, str) and value not in op.choices.get(name, (default,)):
                choices = ", ".join(op.choices.get(name, (str(default),)))
                return ("attrs", name), f"attribute {name!r}={value!r} is not one of: {choices}"
        if self.op == "conv2d" and int(self.attrs["stride"]) < 1:
            return ("attrs", "stride"), "attribute 'stride' must be >= 1"
        return None

    def _registration_problem(self) -> FieldProblem | None:
        """What a new workload must also pass: no empty output, and bounded sizes at its smallest shape."""
        if self.op == "conv2d":
            padding = int(self.attrs["padding"])
            for size, kernel in (("H", "KH"), ("W", "KW")):
                if size in self.dims and kernel in self.dims and self.dims[size] + 2 * padding < self.dims[kernel]:
                    return ("dims", kernel), (
                        f"{kernel}={self.dims[kernel]} is larger than {size}={self.dims[size]} plus padding "
                        f"2×{padding}: the output would be empty"
                    )
        return self._size_problem(self._smallest(), "")

    def _smallest(self) -> dict[str, int]:
        """Every dimension at its smallest: the static sizes, 1 for the symbolic ones."""
        return {**self.dims, **dict.fromkeys(self.symbolic, 1)}

    def _size_problem(self, full: Mapping[str, int], at: str) -> FieldProblem | None:
        """Whether any tensor or the FLOPs of one call at `full` exceed the service's bounds."""
        settings = get_settings()
        op = self.operator
        for tensor in (*op.input_tensors(self.attrs), op.output):
            sizes = op.tensor_shape(tensor, full, self.attrs)
            elements = math.prod(max(1, s) for s in sizes)
            if elements > settings.max_tensor_elements:
                shown = "×".join(f"{d}={s}" for d, s in zip(tensor.dims, sizes, strict=True))
                return ("dims",), (
                    f"tensor {tensor.name} ({shown}{at}) would hold {elements:.3g} elements, more than "
                    f"KERNELFLEET_MAX_TENSOR_ELEMENTS={settings.max_tensor_elements:.3g}"
                )
        flops = op.flops(full, self.attrs)
        if flops > settings.max_shape_flops:
            return ("dims",), (
                f"one call{at} would take {flops:.3g} FLOPs, more than KERNELFLEET_MAX_SHAPE_FLOPS="
                f"{settings.max_shape_flops:.3g}"
            )
        return None

    def _input_at(self, loc: tuple[str | int, ...]) -> object:
        value: object = self.model_dump()
        for part in loc:
            value = value[part]  # type: ignore[index]
        return value

    @property
    def operator(self) -> OperatorDef:
        return OPERATORS[self.op]

    def canonical(self) -> dict[str, object]:
        return {
            "op": self.op,
            "dtype": self.dtype,
            "dims": dict(sorted(self.dims.items())),
            "symbolic": sorted(self.symbolic),
            "attrs": {
                k: v
                for k, v in sorted(self.attrs.items())
                if not (k in self.operator.hash_omits_default and v == self.operator.attrs.get(k))
            },
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
        if self.symbolic:
            problem = self._size_problem(full, " at " + ", ".join(f"{d}={shape[d]}" for d in self.symbolic))
            if problem:
                raise ValueError(problem[1])
        return full

    def flops(self, shape: Mapping[str, int]) -> int:
        return self.operator.flops(self.bind(shape), self.attrs)


class Workload(WorkloadSpec):
    """A registered workload as the service returns it."""

    model_config = ConfigDict(extra="ignore")
    _new: ClassVar[bool] = False
    workload_hash: str
