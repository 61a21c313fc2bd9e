"""The one registry of operators a workload may use.

Workloads are declarative: an operator name from this registry plus dimension sizes. Nothing a user
sends is ever executed; workers build kernels only from the definitions registered here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kernelfleet.epilogue import ACTIVATIONS  # the activations a dense layer may fuse: the SDK runs the same set

Shape = Mapping[str, int]
AttrValue = int | bool | str
Attrs = Mapping[str, AttrValue]


@dataclass(frozen=True)
class TensorDef:
    name: str
    dims: tuple[str, ...]  # each a dimension name, or a derived dimension computed by the operator


@dataclass(frozen=True)
class OperatorDef:
    name: str
    description: str
    dims: tuple[str, ...]
    inputs: tuple[TensorDef, ...]
    output: TensorDef
    flops: Callable[[Shape, Attrs], int]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)  # attribute name -> default
    derived: Callable[[Shape, Attrs], dict[str, int]] = lambda s, a: {}
    optional_inputs: Mapping[str, str] = field(default_factory=dict)  # input name -> bool attr enabling it
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # str attr -> the values it may take
    # attributes added after workloads were stored: left out of the workload's hash while at their default, so
    # every workload registered before they existed keeps its hash (and its stored records)
    hash_omits_default: frozenset[str] = frozenset()

    def input_tensors(self, attrs: Attrs) -> tuple[TensorDef, ...]:
        return tuple(
            t for t in self.inputs if t.name not in self.optional_inputs or attrs[self.optional_inputs[t.name]]
        )

    def tensor_shape(self, tensor: TensorDef, shape: Shape, attrs: Attrs) -> tuple[int, ...]:
        sizes = {**shape, **self.derived(shape, attrs)}
        return tuple(int(sizes[d]) for d in tensor.dims)


def _conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _conv2d_derived(s: Shape, a: Attrs) -> dict[str, int]:
    stride, padding = int(a["stride"]), int(a["padding"])
    return {"OH": _conv_out(s["H"], s["KH"], stride, padding), "OW": _conv_out(s["W"], s["KW"], stride, padding)}


DENSE = OperatorDef(
    name="dense",
    description="Y[M,N] = act(X[M,K] · W[N,K]ᵀ (+ bias[N])), act one of " + ", ".join(ACTIVATIONS),
    dims=("M", "N", "K"),
    inputs=(TensorDef("X", ("M", "K")), TensorDef("W", ("N", "K")), TensorDef("bias", ("N",))),
    optional_inputs={"bias": "bias"},
    output=TensorDef("Y", ("M", "N")),
    attrs={"bias": False, "activation": "none"},
    choices={"activation": ACTIVATIONS},
    hash_omits_default=frozenset({"activation"}),
    flops=lambda s, a: 2 * s["M"] * s["N"] * s["K"] + (s["M"] * s["N"] if a["bias"] else 0),
)

BATCH_MATMUL = OperatorDef(
    name="batch_matmul",
    description="C[B,M,N] = A[B,M,K] · Bt[B,N,K]ᵀ",
    dims=("B", "M", "N", "K"),
    inputs=(TensorDef("A", ("B", "M", "K")), TensorDef("Bt", ("B", "N", "K"))),
    output=TensorDef("C", ("B", "M", "N")),
    flops=lambda s, a: 2 * s["B"] * s["M"] * s["N"] * s["K"],
)

CONV2D = OperatorDef(
    name="conv2d",
    description="NHWC convolution: O[N,OH,OW,CO] = I[N,H,W,CI] ⊛ F[KH,KW,CI,CO]",
    dims=("N", "H", "W", "CI", "CO", "KH", "KW"),
    inputs=(TensorDef("I", ("N", "H", "W", "CI")), TensorDef("F", ("KH", "KW", "CI", "CO"))),
    output=TensorDef("O", ("N", "OH", "OW", "CO")),
    attrs={"stride": 1, "padding": 0},
    derived=_conv2d_derived,
    flops=lambda s, a: 2 * math.prod(_conv2d_derived(s, a).values()) * s["N"] * s["CO"] * s["CI"] * s["KH"] * s["KW"],
)

OPERATORS: dict[str, OperatorDef] = {op.name: op for op in (DENSE, BATCH_MATMUL, CONV2D)}
