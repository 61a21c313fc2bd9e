"""What `kernelfleet.torch.accelerate` replaces and fuses in a PyTorch module: one answer for import and runtime.

`extract_torch` (the workloads a model is tuned for) and `accelerate` (the layers that run on the tables) both ask
this module, so every workload an onboarding tunes is one a layer will call, with the epilogue the layer runs:

- `dense_layers(root)`: the layers `accelerate` replaces: `nn.Linear` and transformers' GPT-2 `Conv1D` whose
  weight (and bias) are parameters, by qualified name.
- `fused_activations(root)`: per dense layer, the activation module its output goes to and nowhere else, read by
  pattern matching on the traced forward of the layer's parent (`torch.fx`, every child a leaf: only the parent's
  own code is traced, so it works on blocks whose model as a whole cannot be traced). The activation must be a
  module (`activation_of` knows it), called once, on the layer's output alone, and both must belong to that one
  parent: `accelerate` then runs the activation in the layer's epilogue and puts an `nn.Identity` in its place.
  A functional activation (`F.gelu(self.fc(x))`) or a parent whose forward cannot be traced fuses nothing.

This module imports torch (its two users already have).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

log = logging.getLogger(__name__)


def activation_of(module: Any) -> str | None:
    """The kernelfleet.epilogue activation a module computes, or None when it is not one known to match exactly."""
    if isinstance(module, nn.ReLU):
        return "relu"
    if isinstance(module, nn.SiLU):
        return "silu"
    if isinstance(module, nn.GELU):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(module.approximate)
    name = type(module).__name__
    if name == "GELUActivation":  # transformers: F.gelu (erf), or the same erf formula in Python
        return "gelu"
    if name in ("NewGELUActivation", "GELUTanh", "PytorchGELUTanh"):
        return "gelu_tanh"
    if name == "SiLUActivation":
        return "silu"
    return None


@dataclass(frozen=True)
class DenseLayer:
    """A layer `accelerate` replaces: Y[M, N] = X[M, K]·Wᵀ (+ bias)."""

    N: int
    K: int
    bias: bool
    transposed: bool  # Conv1D: W stored [K, N]


def dense_layer(module: nn.Module) -> DenseLayer | None:
    params = module._parameters
    if not isinstance(params.get("weight"), nn.Parameter) or not isinstance(params.get("bias"), nn.Parameter | None):
        return None  # weights that are not parameters (e.g. computed): left to PyTorch
    if isinstance(module, nn.Linear):
        return DenseLayer(module.out_features, module.in_features, module.bias is not None, False)
    weight = getattr(module, "weight", None)
    if type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.ndim == 2:
        return DenseLayer(int(weight.shape[1]), int(weight.shape[0]), getattr(module, "bias", None) is not None, True)
    return None


def dense_layers(root: nn.Module) -> dict[str, DenseLayer]:
    """The layers `accelerate` replaces, by qualified name ("" for a root that is one)."""
    out: dict[str, DenseLayer] = {}
    for name, module in root.named_modules():  # a module reachable twice is listed once, under its first name
        layer = dense_layer(module)
        if layer is not None:
            out[name] = layer
    return out


@dataclass(frozen=True)
class Fusion:
    """A dense layer whose output goes to `activation_module` alone: the layer's epilogue computes `activation`."""

    layer: str
    activation_module: str
    activation: str


class _ChildrenAsLeaves(fx.Tracer):
    """Traces one module's own forward: each child module call stays one node."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def fused_activations(root: nn.Module) -> dict[str, Fusion]:
    """Per dense layer (qualified name), the activation module `accelerate` fuses into it (see the module doc)."""
    owners: Counter[int] = Counter()  # module → how many parents hold it (shared modules are never fused)
    for module in root.modules():
        for child in module.children():
            owners[id(child)] += 1
    fusions: dict[str, Fusion] = {}
    seen: set[int] = set()
    for pname, parent in root.named_modules():
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        children = dict(parent.named_children())
        if not any(dense_layer(c) is not None for c in children.values()):
            continue
        graph = _own_forward(parent, pname)
        if graph is None:
            continue
        calls = Counter(n.target for n in graph.nodes if n.op == "call_module")
        for node in graph.nodes:
            layer = children.get(node.target) if node.op == "call_module" else None
            if layer is None or dense_layer(layer) is None or calls[node.target] != 1 or len(node.users) != 1:
                continue
            user = next(iter(node.users))
            act = children.get(user.target) if user.op == "call_module" else None
            activation = activation_of(act)
            if (
                act is None
                or activation is None
                or calls[user.target] != 1
                or user.args != (node,)
                or user.kwargs
                or owners[id(layer)] != 1
                or owners[id(act)] != 1
            ):
                continue
            name = f"{pname}.{node.target}" if pname else str(node.target)
            fusions[name] = Fusion(name, f"{pname}.{user.target}" if pname else str(user.target), activation)
    return fusions


def _own_forward(parent: nn.Module, name: str) -> fx.Graph | None:
    try:
        return _ChildrenAsLeaves().trace(parent)
    except Exception as exc:  # control flow on tensor values, signatures fx cannot bind: nothing fused under it
        log.debug("cannot trace %s (%s): no activation fused into its layers", name or "the module", exc)
        return None
