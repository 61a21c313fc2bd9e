"""Workloads of a PyTorch module, read from its `torch.export` graph (the module runs once, on the client, under
export's fake tensors; nothing of it reaches the service).

Each GEMM-like ATen operator becomes a workload: `linear`/`addmm`/`mm`/`matmul` on a 2-D weight → `dense` (with
its bias, and the elementwise activation that is its only consumer fused in); `bmm`/`baddbmm`/`matmul` of two
batched operands → `batch_matmul`; `scaled_dot_product_attention` → two `batch_matmul`s (QKᵀ and A·V);
`conv2d`/`convolution` → `conv2d`. Dims are expressions of the module's dynamic inputs, named after the
`torch.export.Dim`s given for them (M = "batch*seq").

By default (`only_accelerated=True`) the list is what `kernelfleet.torch.accelerate` will run, so an onboarding
tunes nothing the runtime does not call: the dense workloads of the layers it replaces, each with the activation it
fuses into that layer (`kernelfleet.torch_fusion` answers both questions for import and runtime); GEMMs outside
those layers (attention's batch_matmuls, convolutions, a matmul on a bare parameter) are listed as skipped, with
the reason. `only_accelerated=False` lists every GEMM-like operator, for the SDK's dispatchers called directly.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kernelfleet import vendor
from kernelfleet.epilogue import ACTIVATION_OPS
from kernelfleet.model_import.expr import Mono, as_dim, product
from kernelfleet.model_import.graph import ExtractedOp, ModelGraph, ModelImportError

_VIEWS = {"view", "reshape", "_unsafe_view", "alias"}
_SHAPE_ARITHMETIC = {"sym_size", "sym_numel", "sym_stride", "sym_constrain_range_for_size", "_assert_scalar"}
# GEMM-like or heavy operators no workload expresses (yet): listed as unsupported, never dropped silently
_HEAVY = {
    "conv1d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "einsum", "lstm", "gru",
    "rnn_tanh", "rnn_relu", "_convolution", "bilinear", "tensordot", "dot", "vdot", "mv", "addmv", "addbmm",
    "embedding_bag", "_weight_int8pack_mm", "_int_mm", "_scaled_mm",
}  # fmt: skip


def _import_torch() -> Any:
    try:
        import torch
        import torch.export
    except ImportError:
        raise ModelImportError("extract_torch needs PyTorch: pip install 'kernelfleet[models]'") from None
    return torch


def extract_torch(
    module: Any,
    example_inputs: Sequence[Any] | Mapping[str, Any],
    dynamic_shapes: Any,
    *,
    strict: bool = False,
    only_accelerated: bool = True,
) -> ModelGraph:
    """Export `module` with `torch.export.export(module, args, dynamic_shapes=...)` and collect its workloads.

    `example_inputs`: the positional inputs (a tuple) or keyword inputs (a dict). `dynamic_shapes`: as
    torch.export takes it, e.g. `{"input_ids": {0: Dim("batch"), 1: Dim("seq")}}` or `({0: batch, 1: seq},)`;
    each Dim's name becomes the symbol dims are written in. Example sizes of dynamic dims must be at least 2.
    `only_accelerated`: list only what `accelerate` runs (see the module doc).
    """
    torch = _import_torch()
    if not isinstance(module, torch.nn.Module):
        raise ModelImportError(f"extract_torch takes a torch.nn.Module, got {type(module).__name__}")
    if not dynamic_shapes:
        raise ModelImportError(
            "no dynamic dims: pass dynamic_shapes with a torch.export.Dim for the batch and/or sequence axes, e.g. "
            '{"input_ids": {0: Dim("batch"), 1: Dim("seq")}}; without them every dim is a constant'
        )
    args, kwargs = (
        (tuple(example_inputs), {}) if not isinstance(example_inputs, Mapping) else ((), dict(example_inputs))
    )
    try:
        ep = torch.export.export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes, strict=strict)
    except Exception as exc:  # export's own errors are long; keep their first lines, which say what to change
        text = str(exc).strip().splitlines()
        raise ModelImportError(
            f"torch.export failed ({type(exc).__name__}): "
            + " ".join(text[:6])[:1500]
            + " — check dynamic_shapes (dims that export proves equal must share one Dim; example sizes of "
            "dynamic dims must be >= 2; give Dim(..., max=...) where the model bounds a dim)"
        ) from exc
    names, inputs = _symbol_names(torch, module, args, kwargs, dynamic_shapes, ep)
    if not names:
        raise ModelImportError(
            "no dynamic dims: torch.export made every input dim static (a Dim whose size the model fixes is "
            "specialised); give a Dim for an axis that really varies, e.g. batch or sequence"
        )
    graph = ModelGraph(source=type(module).__name__, inputs=inputs, host_library=vendor.TORCH)
    runtime = _AcceleratedLayers(module) if only_accelerated else None
    _Walker(torch, graph, names, runtime).walk(ep.graph)
    return graph


def _leaves(value: Any, spec: Any, path: str) -> Iterator[tuple[str, Any, Any]]:
    """(path, tensor, its dynamic-shape spec) for every tensor leaf of an input."""
    if isinstance(value, list | tuple):
        items = list(spec) if isinstance(spec, list | tuple) else [None] * len(value)
        for i, (v, s) in enumerate(zip(value, items, strict=False)):
            yield from _leaves(v, s, f"{path}[{i}]")
    elif isinstance(value, Mapping):
        named: Mapping[Any, Any] = spec if isinstance(spec, Mapping) else {}
        for k, v in value.items():
            yield from _leaves(v, named.get(k), f"{path}.{k}")
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        yield path, value, spec


def _axis_specs(spec: Any) -> dict[int, Any]:
    if isinstance(spec, Mapping):
        return {int(k): v for k, v in spec.items()}
    if isinstance(spec, list | tuple):
        return dict(enumerate(spec))
    return {}


def _symbol_names(
    torch: Any, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], dynamic_shapes: Any, ep: Any
) -> tuple[dict[Any, str], dict[str, str]]:
    """sympy symbol of each dynamic input dim → its name (the Dim's, else `<input>_<axis>`), and name → where."""
    try:
        bound = dict(inspect.signature(module.forward).bind(*args, **kwargs).arguments)
    except (TypeError, ValueError):  # a forward inspect cannot bind: inputs are named after export's placeholders
        bound = {}
    if isinstance(dynamic_shapes, Mapping):
        specs = [dynamic_shapes.get(name) for name in bound]
    else:
        given = list(dynamic_shapes)
        specs = (given + [None] * len(bound))[: len(bound)]
    leaves = [
        leaf for (name, value), spec in zip(bound.items(), specs, strict=True) for leaf in _leaves(value, spec, name)
    ]
    user = set(ep.graph_signature.user_inputs)
    placeholders = [
        n for n in ep.graph.nodes if n.op == "placeholder" and n.name in user and hasattr(n.meta.get("val"), "shape")
    ]
    names: dict[Any, str] = {}
    inputs: dict[str, str] = {}
    if len(placeholders) != len(leaves):  # unexpected flattening: name symbols by position instead
        leaves = [(n.name, None, None) for n in placeholders]
    for (path, _, spec), node in zip(leaves, placeholders, strict=True):
        axis_specs = _axis_specs(spec)
        for axis, size in enumerate(node.meta["val"].shape):
            expr = size.node.expr if isinstance(size, torch.SymInt) else None
            if expr is None or not expr.is_Symbol or expr in names:
                continue
            dim = axis_specs.get(axis)
            name = getattr(dim, "__name__", None) if dim is not None else None
            if not (isinstance(name, str) and name.isidentifier()):
                name = f"{re.split(r'[.[]', path)[0]}_{axis}"
            while name in inputs:
                name += "_"
            names[expr] = name
            inputs[name] = f"{path}[{axis}]"
    return names, inputs


class _AcceleratedLayers:
    """What `accelerate` replaces in the module and what it fuses (kernelfleet.torch_fusion), by qualified name."""

    def __init__(self, module: Any) -> None:
        from kernelfleet.torch_fusion import dense_layers, fusions

        self.layers = dense_layers(module)
        # by gate, the pairs: the stacked layer is the workload, its up layer runs in it
        self.fusions, self.pairs = fusions(module)
        self.stacked_ups = {p.up for p in self.pairs.values()}
        self.fused_modules = {f.activation_module for f in self.fusions.values()}


_NOT_ACCELERATED = (
    "`accelerate` runs Linear/Conv1D layers only, so PyTorch runs it (only_accelerated=False lists it, for the "
    "SDK's dispatchers called directly)"
)


def _module_path(node: Any) -> str | None:
    """The qualified name of the innermost module whose forward made this node."""
    stack = node.meta.get("nn_module_stack") or {}
    return str(next(reversed(stack.values()))[0]) if stack else None


class _Walker:
    def __init__(
        self, torch: Any, graph: ModelGraph, names: dict[Any, str], runtime: _AcceleratedLayers | None
    ) -> None:
        self.torch, self.graph, self.names, self.runtime = torch, graph, names, runtime
        self.fused: set[Any] = set()

    def mono(self, size: Any) -> Mono | None:
        if isinstance(size, int):
            return Mono.const(size)
        expr = size.node.expr
        if expr.is_Integer:
            return Mono.const(int(expr))
        factors = []
        for f in expr.args if expr.is_Mul else (expr,):
            base, power = f.as_base_exp()
            if f.is_Integer:
                factors.append(Mono.const(int(f)))
            elif base.is_Symbol and base in self.names and power.is_Integer and int(power) > 0:
                factors.append(Mono(1, ((self.names[base], int(power)),)))
            else:
                return None
        return product(factors)

    def render(self, size: Any) -> str:
        """A symbolic size in the inputs' names, e.g. ((h - 1)//2) + 1."""
        if isinstance(size, int):
            return str(size)
        import sympy

        expr = size.node.expr
        return str(expr.xreplace({sym: sympy.Symbol(name) for sym, name in self.names.items()}))

    @staticmethod
    def shape(node: Any) -> tuple[Any, ...]:
        return tuple(node.meta["val"].shape)

    def walk(self, fx_graph: Any) -> None:
        others = []
        for node in fx_graph.nodes:
            if node.op != "call_function":
                continue
            name = _op_name(node.target)
            try:
                handled = self.visit(node, name)
            except _Unsupported as why:
                self.graph.skip(name, str(why), node.name)
                continue
            if not handled:
                others.append((node, name))
        for node, name in others:
            if node in self.fused or name in _SHAPE_ARITHMETIC or not isinstance(name, str):
                continue
            if self.runtime is not None and _module_path(node) in self.runtime.fused_modules:
                continue  # a fused activation's own ops (gelu_new's tanh formula): the layer's epilogue
            if name in _HEAVY:
                self.graph.skip(name, "no KernelFleet operator expresses it", node.name)
            else:
                self.graph.other(name)

    def visit(self, node: Any, name: str) -> bool:
        a = node.args
        if name == "linear":
            x, w = self.shape(a[0]), self.shape(a[1])
            bias = len(a) > 2 and a[2] is not None
            self.dense(node, x[:-1], w[0], x[-1], bias)
        elif name == "addmm":
            self.dense(node, self.shape(a[1])[:1], self.shape(a[2])[1], self.shape(a[1])[1], True)
        elif name == "mm":
            self.dense(node, self.shape(a[0])[:1], self.shape(a[1])[1], self.shape(a[0])[1], False)
        elif name == "matmul":
            self.matmul(node, self.shape(a[0]), self.shape(a[1]))
        elif name in ("bmm", "baddbmm"):
            x, y = (self.shape(a[0]), self.shape(a[1])) if name == "bmm" else (self.shape(a[1]), self.shape(a[2]))
            self.batch_matmul(node, x[:1], x[1], y[2], x[2], "")
        elif "scaled_dot_product" in name and len(a) >= 3:
            q, k, v = self.shape(a[0]), self.shape(a[1]), self.shape(a[2])
            self.batch_matmul(node, q[:-2], q[-2], k[-2], q[-1], ":QK^T")
            self.batch_matmul(node, q[:-2], q[-2], v[-1], v[-2], ":AV")
        elif name in ("conv2d", "convolution"):
            self.conv(node, name)
        else:
            return False
        return True

    def dims(self, **values: Any) -> dict[str, int | str]:
        out: dict[str, int | str] = {}
        for dim, value in values.items():
            sizes = value if isinstance(value, tuple) else (value,)
            monos = [self.mono(v) for v in sizes]
            for size, m in zip(sizes, monos, strict=True):
                if m is None:
                    raise _Unsupported(
                        f"dim {dim} = {self.render(size)} is not a product of the model's dynamic inputs"
                    )
            out[dim] = as_dim(product([m for m in monos if m is not None]))
        return out

    def dtype(self, node: Any) -> str:
        return str(node.meta["val"].dtype).removeprefix("torch.")

    def add(self, node: Any, op: str, dims: dict[str, int | str], attrs: dict[str, Any], suffix: str = "") -> None:
        self.graph.add(ExtractedOp(op, dims, attrs, self.dtype(node), 1, [node.name + suffix]))

    def dense(self, node: Any, m: tuple[Any, ...], n: Any, k: Any, bias: bool) -> None:
        dims = self.dims(M=m, N=n, K=k)
        if self.runtime is not None:  # the layer accelerate replaces, with the activation it fuses there
            path = _module_path(node)
            if path not in self.runtime.layers:
                raise _Unsupported(_NOT_ACCELERATED)
            if path in self.runtime.stacked_ups:
                return  # computed by its gate's stacked layer, listed there
            pair = self.runtime.pairs.get(path)
            if pair is not None:  # [gate; up] as one layer of twice the width; act · product run in PyTorch
                dims = self.dims(M=m, N=2 * n, K=k)
            fusion = self.runtime.fusions.get(path)
            attrs: dict[str, Any] = {"bias": self.runtime.layers[path].bias}
            if fusion is not None:
                attrs["activation"] = fusion.activation
            self.add(node, "dense", dims, attrs)
            return
        fused_bias, activation = self.epilogue(node, allow_bias=not bias, n=n)
        attrs = {"bias": bias or fused_bias}
        if activation:
            attrs["activation"] = activation
        self.add(node, "dense", dims, attrs)

    def batch_matmul(self, node: Any, b: tuple[Any, ...], m: Any, n: Any, k: Any, suffix: str) -> None:
        if self.runtime is not None:
            raise _Unsupported(_NOT_ACCELERATED)
        self.add(node, "batch_matmul", self.dims(B=b, M=m, N=n, K=k), {}, suffix)

    def matmul(self, node: Any, x: tuple[Any, ...], y: tuple[Any, ...]) -> None:
        if len(x) < 2 or len(y) < 2:
            raise _Unsupported("matrix-vector product (a 1-D operand)")
        if len(y) == 2:
            self.dense(node, x[:-1], y[1], x[-1], False)
            return
        batch = self.torch.broadcast_shapes(x[:-2], y[:-2]) if len(x) > 2 else y[:-2]
        self.batch_matmul(node, tuple(batch), x[-2], y[-1], x[-1], "")

    def conv(self, node: Any, name: str) -> None:
        if self.runtime is not None:
            raise _Unsupported(_NOT_ACCELERATED)
        a = list(node.args)
        x, w = self.shape(a[0]), self.shape(a[1])
        if name == "convolution":
            stride, padding, dilation, transposed, groups = a[3], a[4], a[5], a[6], a[8]
        else:
            defaults = [None, None, None, [1], [0], [1], 1]
            a += defaults[len(a) :]
            stride, padding, dilation, transposed, groups = a[3], a[4], a[5], False, a[6]
        if len(x) != 4:
            raise _Unsupported(f"{len(x) - 2}-d convolution")
        if transposed:
            raise _Unsupported("transposed convolution")
        if groups != 1:
            raise _Unsupported(f"grouped convolution (groups={groups})")
        stride, dilation = _pair(stride), _pair(dilation)
        if isinstance(padding, str):
            padding = [0, 0] if padding == "valid" else [(int(k) - 1) // 2 for k in w[2:]]
            if a[4] == "same" and any(int(k) % 2 == 0 for k in w[2:]):
                raise _Unsupported("padding='same' with an even kernel")
        padding = _pair(padding)
        if dilation != [1, 1]:
            raise _Unsupported(f"dilated convolution (dilation={dilation})")
        if stride[0] != stride[1] or padding[0] != padding[1]:
            raise _Unsupported(f"unequal stride/padding over H and W ({stride}, {padding})")
        dims = self.dims(N=x[0], H=x[2], W=x[3], CI=x[1], CO=w[0], KH=w[2], KW=w[3])
        _, activation = self.epilogue(node, allow_bias=False, n=None)
        attrs: dict[str, Any] = {"stride": stride[0], "padding": padding[0]}
        if activation:
            attrs["activation"] = activation
        self.add(node, "conv2d", dims, attrs)

    def epilogue(self, node: Any, allow_bias: bool, n: Any) -> tuple[bool, str | None]:
        """Follow the GEMM's output through views while each node has one consumer: a bias add (a 1-D [N] tensor)
        and then an activation are fused into the workload."""
        cur, bias = node, False
        while len(cur.users) == 1:
            user = next(iter(cur.users))
            if user.op != "call_function":
                break
            name = _op_name(user.target)
            if name in _VIEWS and user.args[0] is cur:
                cur = user
            elif name == "add" and allow_bias and not bias and self._is_bias(user, cur, n):
                bias, cur = True, user
                self.fused.add(user)
            elif name in ACTIVATION_OPS:
                activation = ACTIVATION_OPS[name]
                approximate = user.kwargs.get("approximate", user.args[1] if len(user.args) > 1 else "none")
                if activation == "gelu" and approximate == "tanh":
                    activation = "gelu_tanh"
                self.fused.add(user)
                return bias, activation
            else:
                break
        return bias, None

    def _is_bias(self, add: Any, cur: Any, n: Any) -> bool:
        others = [x for x in add.args if x is not cur]
        if len(others) != 1 or not hasattr(others[0], "meta") or len(add.args) != 2:
            return False
        shape = getattr(others[0].meta.get("val"), "shape", None)
        return shape is not None and len(shape) == 1 and n is not None and shape[0] == n


class _Unsupported(Exception):
    pass


def _pair(value: Any) -> list[int]:
    values = [int(v) for v in (value if isinstance(value, list | tuple) else [value])]
    return values * 2 if len(values) == 1 else values


def _op_name(target: Any) -> str:
    """`aten.linear.default` → "linear"; a Python callable → its name."""
    name = getattr(target, "__name__", str(target))
    packet = getattr(target, "_overloadpacket", None)
    return str(getattr(packet, "__name__", name)).split(".")[0]
