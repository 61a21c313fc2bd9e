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
- `gated_pairs(root)`: SwiGLU/GeGLU MLPs, `act(gate(x)) * up(x)` in one parent's traced forward with gate and up
  dense layers of one shape on the same input: `accelerate` stacks them into one layer of twice the width
  (`stacked_linear`: X is read once, one call), rewrites the parent's forward to call a unit computing
  act(first half) · second half (`rewrite_gated_pairs`), and `extract_torch` lists the stacked layer's workload.

This module imports torch (its two users already have).
"""

from __future__ import annotations

import logging
import operator
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


@dataclass(frozen=True)
class GatedPair:
    """`act(gate(x)) * up(x)` in one parent's forward (a SwiGLU/GeGLU MLP), gate and up dense layers of the same
    shape on the same input: `accelerate` runs both as one dense layer on the stacked weight [W_gate; W_up] (X read
    once, one call of twice the width), then act(first half) · second half."""

    gate: str  # qualified names
    up: str
    activation_module: str
    activation: str
    dense: DenseLayer  # of the stacked layer: N = 2 × the gate's N

    @property
    def name(self) -> str:
        """The stacked layer's name: `mlp.gate_proj+up_proj`."""
        return f"{self.gate}+{self.up.rpartition('.')[2]}"


# Whether gated pairs are stacked (import and runtime read it on each call): False only to measure what stacking
# gains (bench/accelerate_ab.py --compare stacking), the gates then fusing their activation as any other layer.
STACK_GATED_PAIRS = True


def fused_activations(root: nn.Module) -> dict[str, Fusion]:
    """Per dense layer (qualified name), the activation module `accelerate` fuses into it (see the module doc);
    gates of a `GatedPair` are not listed: the pair runs them."""
    return fusions(root)[0]


def gated_pairs(root: nn.Module) -> dict[str, GatedPair]:
    """The gated pairs `accelerate` stacks, by the gate's qualified name."""
    return fusions(root)[1]


def fusions(root: nn.Module) -> tuple[dict[str, Fusion], dict[str, GatedPair]]:
    """`fused_activations` and `gated_pairs` from one trace of each parent (for callers that need both)."""
    owners: Counter[int] = Counter()  # module → how many parents hold it (shared modules are never fused)
    for module in root.modules():
        for child in module.children():
            owners[id(child)] += 1
    activations: dict[str, Fusion] = {}
    pairs: dict[str, GatedPair] = {}
    seen: set[int] = set()
    for pname, parent in root.named_modules():
        if id(parent) in seen:
            continue
        seen.add(id(parent))
        children = dict(parent.named_children())
        if not any(dense_layer(c) is not None for c in children.values()):
            continue
        graph = own_forward(parent, pname)
        if graph is None:
            continue
        own = _OwnGraph(pname, children, graph, owners)
        found = own.gated_pairs() if STACK_GATED_PAIRS else {}
        pairs.update(found)
        for fusion in own.activations():
            if fusion.layer not in found:
                activations[fusion.layer] = fusion
    return activations, pairs


@dataclass
class _OwnGraph:
    """One parent's traced forward, with its children by attribute name."""

    pname: str
    children: dict[str, nn.Module]
    graph: fx.Graph
    owners: Counter[int]

    def __post_init__(self) -> None:
        self.calls = Counter(n.target for n in self.graph.nodes if n.op == "call_module")

    def qualified(self, attr: Any) -> str:
        return f"{self.pname}.{attr}" if self.pname else str(attr)

    def _sole(self, node: fx.Node) -> nn.Module | None:
        """The child a call_module node calls, when it is called once here, held by this parent alone and its
        output has one user."""
        child = self.children.get(node.target) if node.op == "call_module" else None  # type: ignore[arg-type]
        if child is None or self.calls[node.target] != 1 or self.owners[id(child)] != 1 or len(node.users) != 1:
            return None
        return child

    def _activation_of_layer(self, node: fx.Node) -> tuple[fx.Node, nn.Module, str, DenseLayer] | None:
        """For an activation call on a dense layer's output alone: (the layer's node, the layer, activation,
        its DenseLayer)."""
        act = self.children.get(node.target) if node.op == "call_module" else None  # type: ignore[arg-type]
        activation = activation_of(act)
        if act is None or activation is None or self.calls[node.target] != 1 or self.owners[id(act)] != 1:
            return None
        if node.kwargs or len(node.args) != 1 or not isinstance(node.args[0], fx.Node):
            return None
        layer_node = node.args[0]
        layer = self._sole(layer_node)
        dense = dense_layer(layer) if layer is not None else None
        if layer is None or dense is None:
            return None
        return layer_node, layer, activation, dense

    def activations(self) -> list[Fusion]:
        out = []
        for node in self.graph.nodes:
            found = self._activation_of_layer(node)
            if found is not None:
                layer_node = found[0]
                out.append(Fusion(self.qualified(layer_node.target), self.qualified(node.target), found[2]))
        return out

    def gated_pairs(self) -> dict[str, GatedPair]:
        out: dict[str, GatedPair] = {}
        for node in self.graph.nodes:
            if not _is_mul(node) or node.kwargs or len(node.args) != 2:
                continue
            for act_node, up_node in (node.args, node.args[::-1]):
                if not isinstance(act_node, fx.Node) or not isinstance(up_node, fx.Node) or len(act_node.users) != 1:
                    continue
                found = self._activation_of_layer(act_node)
                up = self._sole(up_node)
                up_dense = dense_layer(up) if up is not None else None
                if found is None or up_dense is None or up_node.kwargs:
                    continue
                gate_node, gate, activation, gate_dense = found
                if up is gate or gate_dense != up_dense or gate_dense.transposed or up_node.args != gate_node.args:
                    continue
                if gate.weight.dtype != up.weight.dtype or gate.weight.device != up.weight.device:  # type: ignore[union-attr]
                    continue
                stacked = DenseLayer(2 * gate_dense.N, gate_dense.K, gate_dense.bias, False)
                name = self.qualified(gate_node.target)
                out[name] = GatedPair(name, self.qualified(up_node.target), self.qualified(act_node.target),
                                      activation, stacked)  # fmt: skip
                break
        return out


def _is_mul(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in (operator.mul, torch.mul)
    return node.op == "call_method" and node.target == "mul"


def stacked_linear(gate: nn.Module, up: nn.Module) -> nn.Linear:
    """One Linear computing [gate(x), up(x)]: its weight is [W_gate; W_up] (and its bias [b_gate; b_up]) as one
    tensor, and the two layers' parameters become views of it (new Parameters, sharing its storage and its version
    counter), so the pair's memory is not doubled and an update to either (`load_state_dict`, in place under
    no_grad) is an update of the stacked layer that its packed copy sees."""
    weight = gate.weight
    assert isinstance(weight, torch.Tensor)
    n, k = weight.shape
    layer = nn.Linear(k, 2 * n, bias=gate.bias is not None, device="meta")  # parameters replaced: none allocated
    for name in ("weight", "bias"):
        g, u = getattr(gate, name), getattr(up, name)
        if g is None:
            continue
        with torch.no_grad():
            both = torch.cat([g, u])
        # a call autograd must record finds the stacked weight requiring grad and runs on PyTorch, as others do
        setattr(layer, name, nn.Parameter(both, requires_grad=g.requires_grad or u.requires_grad))
        setattr(gate, name, nn.Parameter(both[:n], requires_grad=g.requires_grad))
        setattr(up, name, nn.Parameter(both[n:], requires_grad=u.requires_grad))
    return layer


def rewrite_gated_pairs(parent: nn.Module, units: list[tuple[GatedPair, nn.Module]]) -> fx.GraphModule:
    """`parent` with each pair's gate, activation, up and product replaced by one call of its unit (a module
    computing act(gate(x)) · up(x) at once): its own forward, traced and rewritten (`torch.fx`). The result keeps
    every child (the pair's layers too, unused: state-dict keys stay those of the original) and the parent's
    public attributes; its class is a GraphModule of the same name."""
    graph = own_forward(parent, type(parent).__name__)
    assert graph is not None  # the pairs were found on this very trace
    calls = {n.target: n for n in graph.nodes if n.op == "call_module"}
    for pair, unit in units:
        gate_attr, up_attr, act_attr = (q.rpartition(".")[2] for q in (pair.gate, pair.up, pair.activation_module))
        gate, up, act = calls[gate_attr], calls[up_attr], calls[act_attr]
        (product,) = act.users
        unit_attr = f"{gate_attr}_{up_attr}"
        while unit_attr in parent._modules or hasattr(parent, unit_attr):
            unit_attr += "_"
        parent.add_module(unit_attr, unit)
        with graph.inserting_before(product):
            fused = graph.call_module(unit_attr, gate.args)
        product.replace_all_uses_with(fused)
        for node in (product, act, up, gate):
            graph.erase_node(node)
    rewritten = fx.GraphModule(parent, graph, class_name=type(parent).__name__)
    for name, child in parent.named_children():
        if name not in rewritten._modules:
            rewritten.add_module(name, child)
    for name, value in vars(parent).items():
        if not name.startswith("_") and not hasattr(rewritten, name):
            setattr(rewritten, name, value)
    rewritten.train(parent.training)
    return rewritten


def own_forward(parent: nn.Module, name: str) -> fx.Graph | None:
    try:
        return _ChildrenAsLeaves().trace(parent)
    except Exception as exc:  # control flow on tensor values, signatures fx cannot bind: nothing fused under it
        log.debug("cannot trace %s (%s): no activation fused into its layers", name or "the module", exc)
        return None
