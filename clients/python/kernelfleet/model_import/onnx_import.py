"""Workloads of an ONNX model, read with the `onnx` package (parsed here, never run).

`MatMul` on a 2-D right operand and `Gemm` → `dense` (an `Add` of a 1-D [N] initializer that is the only consumer
becomes its bias; a following `Relu`, `Gelu`, or x·Sigmoid(x) its activation); `MatMul` of two batched operands →
`batch_matmul`; `Conv` (2-d, ungrouped) → `conv2d`. The graph inputs' `dim_param`s are the symbols; shapes are
propagated through the graph as products of them (so a Reshape to [-1, 768] of a [batch, seq, 768] tensor gives
M = batch*seq), falling back to onnx's own shape inference where this propagation does not know an operator.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kernelfleet.model_import.expr import Mono, as_dim, product
from kernelfleet.model_import.graph import ExtractedOp, ModelGraph, ModelImportError

Shape = list[Mono | None]  # None: a dim this extractor does not know

_SAME_SHAPE = {
    "Relu", "Gelu", "Sigmoid", "Tanh", "Erf", "Softmax", "LogSoftmax", "Cast", "Identity", "Dropout",
    "LayerNormalization", "Neg", "Sqrt", "Exp", "Log", "Abs", "Clip", "LeakyRelu", "HardSigmoid", "HardSwish",
    "BatchNormalization", "InstanceNormalization", "Not", "Reciprocal", "Softplus", "Elu", "Selu", "Mish",
    "SimplifiedLayerNormalization", "SkipLayerNormalization", "FastGelu", "BiasGelu", "QuickGelu", "Floor", "Ceil",
    "Round", "Sign", "IsNaN", "CumSum", "Trilu",
}  # fmt: skip
_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Where", "Equal", "Less", "Greater", "LessOrEqual",
              "GreaterOrEqual", "And", "Or", "Xor", "Max", "Min", "Mod", "BitShift", "PRelu"}  # fmt: skip
# GEMM-like or heavy operators no workload expresses (yet): listed as unsupported, never dropped silently
_HEAVY = {
    "ConvTranspose", "Einsum", "LSTM", "GRU", "RNN", "MatMulInteger", "QLinearMatMul", "QLinearConv", "ConvInteger",
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "DeformConv", "MatMulNBits", "QAttention",
    "FusedMatMul", "FusedConv", "QGemm", "DynamicQuantizeMatMul",
}  # fmt: skip
_DTYPES = {1: "float32", 10: "float16", 11: "float64", 16: "bfloat16", 2: "uint8", 3: "int8", 5: "int16",
           6: "int32", 7: "int64", 9: "bool"}  # fmt: skip


def _import_onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ModelImportError("extract_onnx needs the onnx package: pip install 'kernelfleet[models]'") from None
    return onnx


def _symbol(param: str) -> str:
    name = re.sub(r"\W", "_", param.strip()) or "dim"
    return name if not name[0].isdigit() else "d_" + name


def extract_onnx(model: str | Path | Any) -> ModelGraph:
    """Read an ONNX file (path) or `onnx.ModelProto` and collect its workloads."""
    onnx = _import_onnx()
    source = "ModelProto"
    if isinstance(model, str | Path):
        source = Path(model).name
        try:
            model = onnx.load(str(model), load_external_data=False)
        except FileNotFoundError:
            raise ModelImportError(f"no ONNX file at {model}") from None
        except Exception as exc:
            raise ModelImportError(f"{model} is not an ONNX model ({type(exc).__name__}: {exc})") from None
    if not isinstance(model, onnx.ModelProto):
        raise ModelImportError(f"extract_onnx takes a path or an onnx.ModelProto, got {type(model).__name__}")
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # a model onnx cannot infer is still read with this module's own propagation
        inferred = model
    return _Reader(onnx, model.graph, inferred.graph, source).read()


class _Reader:
    def __init__(self, onnx: Any, graph: Any, inferred: Any, source: str) -> None:
        self.onnx, self.g = onnx, graph
        self.shapes: dict[str, Shape] = {}
        self.dtypes: dict[str, str] = {}
        self.consts: dict[str, list[int]] = {}
        self.inferred: dict[str, Any] = {vi.name: vi for vi in (*inferred.value_info, *inferred.output)}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
        self.fused: set[int] = set()
        self.source = source

    def read(self) -> ModelGraph:
        inputs: dict[str, str] = {}
        for init in self.g.initializer:
            self.shapes[init.name] = [Mono.const(d) for d in init.dims]
            self.dtypes[init.name] = _DTYPES.get(init.data_type, str(init.data_type))
            if init.data_type == 7 and len(init.dims) <= 1:  # int64 shape/axes constants
                self.consts[init.name] = [int(v) for v in self.onnx.numpy_helper.to_array(init).reshape(-1)]
        for vi in self.g.input:
            if vi.name in self.shapes:
                continue
            shape, dtype = self._from_type(vi, inputs=inputs)
            self.shapes[vi.name], self.dtypes[vi.name] = shape, dtype
        if not inputs:
            raise ModelImportError(
                "no dynamic dims: no graph input has a symbolic dim (dim_param), so every workload would be one "
                "fixed shape; export the model with dynamic axes (e.g. torch.onnx.export(..., dynamic_axes="
                '{"input_ids": {0: "batch", 1: "seq"}}))'
            )
        self.graph = ModelGraph(source=self.source, inputs=inputs)
        for i, node in enumerate(self.g.node):
            self.visit(i, node)
        return self.graph

    def _from_type(self, vi: Any, inputs: dict[str, str] | None = None) -> tuple[Shape, str]:
        t = vi.type.tensor_type
        dtype = _DTYPES.get(t.elem_type, str(t.elem_type))
        shape: Shape = []
        if not t.HasField("shape"):
            return [], dtype
        for axis, d in enumerate(t.shape.dim):
            if d.HasField("dim_value"):
                shape.append(Mono.const(d.dim_value))
            elif d.HasField("dim_param") and inputs is not None:
                name = _symbol(d.dim_param)
                inputs.setdefault(name, f"{vi.name}[{axis}]")
                shape.append(Mono.symbol(name))
            elif d.HasField("dim_param") and _symbol(d.dim_param) in self.graph.inputs:
                shape.append(Mono.symbol(_symbol(d.dim_param)))
            else:
                shape.append(None)
        return shape, dtype

    def shape(self, name: str) -> Shape | None:
        if name in self.shapes:
            return self.shapes[name]
        if name in self.inferred:
            shape, dtype = self._from_type(self.inferred[name])
            self.dtypes.setdefault(name, dtype)
            return shape
        return None

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                return self.onnx.helper.get_attribute_value(a)
        return default

    def visit(self, i: int, node: Any) -> None:
        op, name = node.op_type, node.name or f"{node.op_type}_{i}"
        if node.op_type == "Constant" and node.output:
            value = self.attr(node, "value")
            if value is not None:
                self.shapes[node.output[0]] = [Mono.const(d) for d in value.dims]
                if value.data_type == 7 and len(value.dims) <= 1:
                    self.consts[node.output[0]] = [int(v) for v in self.onnx.numpy_helper.to_array(value).reshape(-1)]
            return
        try:
            out = self.propagate(node)
        except _Unsupported as why:
            self.graph.skip(op, str(why), name)
            out = None
        if out is not None and node.output:
            self.shapes[node.output[0]] = out
            self.dtypes.setdefault(node.output[0], self.dtypes.get(node.input[0], "float32") if node.input else "")
        for extra in node.output[1:] if out is not None else node.output:
            if extra and extra not in self.shapes:
                shape = self.shape(extra)
                if shape is not None:
                    self.shapes[extra] = shape
        if op in ("MatMul", "Gemm", "Conv") or i in self.fused:
            return
        if op in _HEAVY:
            self.graph.skip(op, "no KernelFleet operator expresses it", name)
        else:
            self.graph.other(op if node.domain in ("", "ai.onnx") else f"{node.domain}.{op}")

    def propagate(self, node: Any) -> Shape | None:
        """The output shape, recording a workload on the way for MatMul, Gemm and Conv."""
        op = node.op_type
        ins = [self.shape(n) if n else None for n in node.input]
        if op == "MatMul":
            return self.matmul(node, ins[0], ins[1])
        if op == "Gemm":
            return self.gemm(node, ins)
        if op == "Conv":
            return self.conv(node, ins[0], ins[1])
        if op in _SAME_SHAPE and ins and ins[0] is not None:
            return list(ins[0])
        if op in _BROADCAST and all(s is not None for s in ins):
            return _broadcast([s for s in ins if s is not None])
        if op == "Transpose" and ins[0] is not None:
            perm = self.attr(node, "perm") or list(reversed(range(len(ins[0]))))
            return [ins[0][p] for p in perm]
        if op == "Reshape" and ins[0] is not None and node.input[1] in self.consts:
            return _reshape(ins[0], self.consts[node.input[1]])
        if op == "Flatten" and ins[0] is not None:
            axis = self.attr(node, "axis", 1) % (len(ins[0]) or 1)
            return [_prod(ins[0][:axis]), _prod(ins[0][axis:])]
        if op in ("Unsqueeze", "Squeeze") and ins[0] is not None:
            axes = self.attr(node, "axes") or (self.consts.get(node.input[1]) if len(node.input) > 1 else None)
            return _squeeze(ins[0], axes, op == "Unsqueeze")
        if node.output:
            return self.shape(node.output[0])
        return None

    def dtype(self, name: str) -> str:
        self.shape(name)
        return self.dtypes.get(name, "float32")

    def dims(self, **values: Mono | Shape | None) -> dict[str, int | str]:
        out: dict[str, int | str] = {}
        for dim, value in values.items():
            m = _prod(value) if isinstance(value, list) else value
            if m is None:
                raise _Unsupported(f"dim {dim} is unknown or not a product of the model's dynamic inputs")
            out[dim] = as_dim(m)
        return out

    def add(self, node: Any, op: str, dims: dict[str, int | str], attrs: dict[str, Any]) -> None:
        name = node.name or f"{node.op_type}_{list(self.g.node).index(node)}"
        self.graph.add(ExtractedOp(op, dims, attrs, self.dtype(node.input[0]), 1, [name]))

    def matmul(self, node: Any, a: Shape | None, b: Shape | None) -> Shape:
        if a is None or b is None or not a or not b:
            raise _Unsupported("operand shapes unknown")
        if len(a) < 2 or len(b) < 2:
            raise _Unsupported("matrix-vector product (a 1-D operand)")
        if len(b) == 2:
            fused_bias, activation = self.epilogue(node, b[1])
            attrs: dict[str, Any] = {"bias": fused_bias}
            if activation:
                attrs["activation"] = activation
            self.add(node, "dense", self.dims(M=a[:-1], N=b[1], K=a[-1]), attrs)
            return [*a[:-1], b[1]]
        batch = _broadcast([a[:-2], b[:-2]])
        self.add(node, "batch_matmul", self.dims(B=batch, M=a[-2], N=b[-1], K=a[-1]), {})
        return [*batch, a[-2], b[-1]]

    def gemm(self, node: Any, ins: list[Shape | None]) -> Shape:
        a, b = ins[0], ins[1]
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            raise _Unsupported("operand shapes unknown")
        m, k = (a[1], a[0]) if self.attr(node, "transA", 0) else (a[0], a[1])
        n = b[0] if self.attr(node, "transB", 0) else b[1]
        bias = len(node.input) > 2 and bool(node.input[2])
        fused_bias, activation = self.epilogue(node, n, allow_bias=not bias)
        attrs: dict[str, Any] = {"bias": bias or fused_bias}
        if activation:
            attrs["activation"] = activation
        self.add(node, "dense", self.dims(M=m, N=n, K=k), attrs)
        return [m, n]

    def conv(self, node: Any, x: Shape | None, w: Shape | None) -> Shape | None:
        if x is None or w is None or not x or not w:
            raise _Unsupported("operand shapes unknown")
        if len(x) != 4:
            raise _Unsupported(f"{len(x) - 2}-d convolution")
        group = self.attr(node, "group", 1)
        if group != 1:
            raise _Unsupported(f"grouped convolution (group={group})")
        kh, kw = w[2], w[3]
        if kh is None or kw is None or not kh.is_const or not kw.is_const:
            raise _Unsupported("kernel size unknown")
        strides = list(self.attr(node, "strides", [1, 1]))
        dilations = list(self.attr(node, "dilations", [1, 1]))
        auto_pad = self.attr(node, "auto_pad", b"NOTSET")
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
        if dilations != [1, 1]:
            raise _Unsupported(f"dilated convolution (dilations={dilations})")
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            if strides != [1, 1] or kh.coef % 2 == 0 or kw.coef % 2 == 0:
                raise _Unsupported(f"auto_pad={auto_pad} with strides {strides} or an even kernel")
            pads = [(kh.coef - 1) // 2, (kw.coef - 1) // 2] * 2
        else:
            pads = list(self.attr(node, "pads", [0, 0, 0, 0]))
        if len(set(pads)) != 1 or strides[0] != strides[1]:
            raise _Unsupported(f"unequal strides/pads over H and W (strides={strides}, pads={pads})")
        stride, padding = strides[0], pads[0]
        _, activation = self.epilogue(node, None, allow_bias=False)
        attrs: dict[str, Any] = {"stride": stride, "padding": padding}
        if activation:
            attrs["activation"] = activation
        self.add(node, "conv2d", self.dims(N=x[0], H=x[2], W=x[3], CI=x[1], CO=w[0], KH=kh, KW=kw), attrs)
        out_hw: Shape = []
        for size, k in ((x[2], kh.coef), (x[3], kw.coef)):
            if size is not None and size.is_const:
                out_hw.append(Mono.const((size.coef + 2 * padding - k) // stride + 1))
            else:
                out_hw.append(size if stride == 1 and 2 * padding == k - 1 else None)
        return [x[0], w[0], *out_hw]

    def only_consumer(self, tensor: str) -> Any | None:
        users = self.consumers.get(tensor, [])
        graph_outputs = {o.name for o in self.g.output}
        return users[0] if len(users) == 1 and tensor not in graph_outputs else None

    def epilogue(self, node: Any, n: Mono | None, allow_bias: bool = True) -> tuple[bool, str | None]:
        """A bias Add (1-D [N] initializer) and then an activation, each the only consumer, fused into the GEMM."""
        index = {id(x): i for i, x in enumerate(self.g.node)}
        tensor, bias = node.output[0], False
        while True:
            user = self.only_consumer(tensor)
            if user is None:
                return bias, self._silu(tensor, index)
            if user.op_type == "Add" and allow_bias and not bias:
                other = [x for x in user.input if x != tensor]
                shape = self.shapes.get(other[0]) if len(other) == 1 else None
                if shape is None or len(shape) != 1 or n is None or shape[0] != n:
                    return bias, None
                bias = True
                self.fused.add(index[id(user)])
                tensor = user.output[0]
            elif user.op_type in ("Relu", "Gelu", "FastGelu"):
                activation = "relu" if user.op_type == "Relu" else "gelu"
                approximate = self.attr(user, "approximate", b"none")
                if user.op_type == "FastGelu" or approximate in (b"tanh", "tanh"):
                    activation = "gelu_tanh"
                self.fused.add(index[id(user)])
                return bias, activation
            else:
                return bias, None

    def _silu(self, tensor: str, index: dict[int, int]) -> str | None:
        """x · Sigmoid(x) where x is only used there: SiLU."""
        users = self.consumers.get(tensor, [])
        if len(users) != 2 or {u.op_type for u in users} != {"Sigmoid", "Mul"}:
            return None
        sig = next(u for u in users if u.op_type == "Sigmoid")
        mul = next(u for u in users if u.op_type == "Mul")
        if sorted(mul.input) != sorted([tensor, sig.output[0]]) or self.only_consumer(sig.output[0]) is not mul:
            return None
        self.fused.update((index[id(sig)], index[id(mul)]))
        return "silu"


class _Unsupported(Exception):
    pass


def _prod(dims: Sequence[Mono | None]) -> Mono | None:
    return None if any(d is None for d in dims) else product([d for d in dims if d is not None])


def _broadcast(shapes: list[Shape]) -> Shape:
    """numpy broadcasting; an unknown dim next to a known one (not 1) is taken to be that one."""
    rank = max(len(s) for s in shapes)
    out: Shape = []
    for axis in range(rank):
        dims = [s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0]
        known = {d for d in dims if d is not None and d != Mono.const(1)}
        if len(known) == 1:
            out.append(known.pop())
        else:
            out.append(Mono.const(1) if not known and None not in dims else None)
    return out


def _reshape(shape: Shape, target: list[int]) -> Shape | None:
    out: Shape = [shape[i] if v == 0 and i < len(shape) else Mono.const(v) for i, v in enumerate(target)]
    if -1 in target:
        total, rest = _prod(shape), _prod([d for d, v in zip(out, target, strict=True) if v != -1])
        left = total.divide(rest) if total is not None and rest is not None else None
        out[target.index(-1)] = left
    return out


def _squeeze(shape: Shape, axes: list[int] | None, unsqueeze: bool) -> Shape | None:
    if unsqueeze:
        if axes is None:
            return None
        out: Shape = list(shape)
        for a in sorted(x % (len(shape) + len(axes)) for x in axes):
            out.insert(a, Mono.const(1))
        return out
    if axes is None:
        return [d for d in shape if d != Mono.const(1)] if all(d is not None for d in shape) else None
    drop = {a % len(shape) for a in axes}
    return [d for i, d in enumerate(shape) if i not in drop]
