"""What a model import finds: its GEMM-like operators as KernelFleet workloads, deduplicated with occurrence
counts, each dimension an expression of the model's dynamic inputs, and what could not be expressed.

Nothing here needs torch or onnx: a `ModelGraph` is plain data, built by `extract_torch` or `extract_onnx`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.model_import.expr import Mono, as_dim

ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu")
DTYPES = ("float32", "float16", "bfloat16")  # what a workload may be (the service's WorkloadSpec.dtype)
MAX_SUPPORT = 4096  # points in one explicit distribution (the service's bound)
Attr = int | bool | str


class ModelImportError(ValueError):
    """The model cannot be imported as given; the message says why and what to change."""


@dataclass
class ExtractedOp:
    """One distinct workload of the model: operator, dims (int, or an expression of the model's dynamic inputs such
    as "batch*seq"), attributes, and where in the model it occurs."""

    op: str
    dims: dict[str, int | str]
    attrs: dict[str, Attr] = field(default_factory=dict)
    dtype: str = "float32"
    occurrences: int = 1
    sources: list[str] = field(default_factory=list)  # node names, one per occurrence

    @property
    def symbolic(self) -> list[str]:
        """The dims that vary with the model's dynamic inputs."""
        return [name for name, value in self.dims.items() if isinstance(value, str)]

    @property
    def inputs(self) -> list[str]:
        """The model's dynamic inputs (symbols) this operator's dims depend on."""
        return sorted({s for v in self.dims.values() if isinstance(v, str) for s in Mono.parse(v).symbols})

    def key(self) -> tuple[Any, ...]:
        return self.op, self.dtype, tuple(sorted(self.dims.items())), tuple(sorted(self.attrs.items()))

    def bind(self, values: Mapping[str, int]) -> dict[str, int]:
        """Concrete dims for concrete values of the model's dynamic inputs."""
        return {name: v if isinstance(v, int) else Mono.parse(v).evaluate(values) for name, v in self.dims.items()}

    def flops(self, values: Mapping[str, int]) -> int:
        """FLOPs of one occurrence (the service's operator formulas; an activation is not counted)."""
        return op_flops(self.op, self.bind(values), self.attrs)

    def to_workload(self) -> dict[str, Any]:
        """The workload body as POST /v1/workloads takes it (`activation` is sent as found; a service that does not
        know it yet answers 422 naming the attribute)."""
        return {
            "op": self.op,
            "dtype": self.dtype,
            "dims": {name: v for name, v in self.dims.items() if isinstance(v, int)},
            "symbolic": self.symbolic,
            "attrs": dict(self.attrs),
        }

    def describe(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items() if v is not False)
        return f"{self.op}({dims}{'; ' + attrs if attrs else ''})"


@dataclass
class UnsupportedOp:
    """Operators found and not turned into workloads: by name, with why and where."""

    name: str
    reason: str
    count: int = 0
    sources: list[str] = field(default_factory=list)


def op_flops(op: str, d: Mapping[str, int], attrs: Mapping[str, Attr]) -> int:
    if op == "dense":
        return 2 * d["M"] * d["N"] * d["K"] + (d["M"] * d["N"] if attrs.get("bias") else 0)
    if op == "batch_matmul":
        return 2 * d["B"] * d["M"] * d["N"] * d["K"]
    if op == "conv2d":
        stride, padding = int(attrs.get("stride", 1)), int(attrs.get("padding", 0))
        oh = (d["H"] + 2 * padding - d["KH"]) // stride + 1
        ow = (d["W"] + 2 * padding - d["KW"]) // stride + 1
        return 2 * d["N"] * oh * ow * d["CO"] * d["CI"] * d["KH"] * d["KW"]
    raise ValueError(f"unknown operator {op!r}")


@dataclass
class ModelGraph:
    """The workloads of one model (`ops`, deduplicated), its dynamic inputs (`inputs`: symbol → where it comes from,
    e.g. "input_ids[1]"), the GEMM-like operators it could not express (`unsupported`) and a count of every other
    operator (`other_ops`), so nothing is dropped silently. `host_library` is the vendor library the model's hosts
    run its operators on today (`kernelfleet.vendor`: PyTorch for a model read by `extract_torch`), None when the
    import cannot tell."""

    source: str
    inputs: dict[str, str]
    host_library: str | None = None
    ops: list[ExtractedOp] = field(default_factory=list)
    unsupported: list[UnsupportedOp] = field(default_factory=list)
    other_ops: dict[str, int] = field(default_factory=dict)

    def add(self, op: ExtractedOp) -> ExtractedOp:
        """Record one occurrence; an identical workload already seen counts one more."""
        if op.dtype not in DTYPES:
            where = ", ".join(op.sources) or "?"
            raise ModelImportError(
                f"{op.op} at {where} computes in {op.dtype}; workloads are {', '.join(DTYPES)}: convert the model "
                "(e.g. module.float() or .half()) before importing it"
            )
        for seen in self.ops:
            if seen.key() == op.key():
                seen.occurrences += op.occurrences
                seen.sources.extend(op.sources)
                return seen
        self.ops.append(op)
        return op

    def skip(self, name: str, reason: str, source: str) -> None:
        for u in self.unsupported:
            if (u.name, u.reason) == (name, reason):
                break
        else:
            u = UnsupportedOp(name, reason)
            self.unsupported.append(u)
        u.count += 1
        u.sources.append(source)

    def other(self, name: str) -> None:
        self.other_ops[name] = self.other_ops.get(name, 0) + 1

    def to_workloads(self) -> list[dict[str, Any]]:
        """Each distinct workload as the body POST /v1/workloads takes, in `ops` order."""
        return [op.to_workload() for op in self.ops]

    def _op(self, op: ExtractedOp | int) -> ExtractedOp:
        return self.ops[op] if isinstance(op, int) else op

    def distribution_for(
        self,
        op: ExtractedOp | int,
        histogram: Mapping[str, Mapping[int | str, float]] | None = None,
        ranges: Mapping[str, tuple[int, int]] | None = None,
    ) -> dict[str, Any]:
        """The shape distribution of one workload's symbolic dims (an `explicit` ShapeDistribution body) from the
        traffic over the model's dynamic inputs: `histogram={"seq": {128: 70, 512: 30}, "batch": {1: 1}}`
        (value → weight), or a declared `ranges={"seq": (1, 512)}` (every value equally likely). Inputs are
        independent: a point's weight is the product of its inputs' weights; points that land on the same shape
        add up. Weights are normalised to sum to 1."""
        target = self._op(op)
        needed = target.inputs
        if not needed:
            raise ModelImportError(f"{target.describe()} has no symbolic dims: it needs no distribution")
        factors = []
        for name in needed:
            if histogram is not None and name in histogram:
                points = [(_int_key(name, v), float(w)) for v, w in histogram[name].items()]
                bad = [w for _, w in points if not (math.isfinite(w) and w >= 0)]
                if bad:
                    raise ModelImportError(f"histogram of {name!r}: weights must be finite and >= 0, got {bad[0]}")
                points = [(v, w) for v, w in points if w > 0]
                if not points:
                    raise ModelImportError(f"histogram of {name!r} has no positive weight")
            elif ranges is not None and name in ranges:
                low, high = (int(x) for x in ranges[name])
                if not 1 <= low <= high:
                    raise ModelImportError(f"range of {name!r} must be 1 <= low <= high, got {low}..{high}")
                if high - low + 1 > MAX_SUPPORT:  # checked before the values are listed: 1..10^12 would exhaust memory
                    raise ModelImportError(
                        f"range of {name!r} has {high - low + 1} values, more than the {MAX_SUPPORT} one distribution "
                        "may hold: give a narrower range or a histogram"
                    )
                points = [(v, 1.0) for v in range(low, high + 1)]
            else:
                known = ", ".join(f"{s} ({where})" for s, where in self.inputs.items())
                raise ModelImportError(
                    f"{target.describe()} depends on {name!r}: give its histogram or range (the model's dynamic "
                    f"inputs: {known})"
                )
            factors.append([(name, v, w) for v, w in points])
        merged: dict[tuple[tuple[str, int], ...], float] = {}
        for combo in itertools.product(*factors):
            values = {name: v for name, v, _ in combo}
            shape = tuple((d, target.bind(values)[d]) for d in target.symbolic)
            merged[shape] = merged.get(shape, 0.0) + math.prod(w for _, _, w in combo)
            if len(merged) > MAX_SUPPORT:
                raise ModelImportError(
                    f"{target.describe()}: the inputs' product has more than {MAX_SUPPORT} distinct shapes; "
                    "bucket the histogram more coarsely"
                )
        total = sum(merged.values())
        return {
            "kind": "explicit",
            "points": [{"shape": dict(shape), "weight": w / total} for shape, w in sorted(merged.items())],
        }

    def flops_shares(self, values: Mapping[str, int]) -> list[float]:
        """Each op's share of the model's GEMM FLOPs (occurrences included) at concrete input values."""
        totals = [op.flops(values) * op.occurrences for op in self.ops]
        whole = sum(totals)
        return [t / whole if whole else 0.0 for t in totals]


def _int_key(name: str, value: int | str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise ModelImportError(f"histogram of {name!r}: {value!r} is not an integer size") from None
    if out < 1:
        raise ModelImportError(f"histogram of {name!r}: sizes must be >= 1, got {out}")
    return out


def dims_of(values: Mapping[str, Mono]) -> dict[str, int | str]:
    return {name: as_dim(v) for name, v in values.items()}
