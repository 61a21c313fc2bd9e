"""What a scheduled TIR module asks of one SM: its shared loads (with the lanes' addresses), FMAs, launch geometry.

The module is lowered by TVM's own CUDA pipeline (what `tirx.build` runs before codegen) and walked kernel
by kernel. Each shared-memory load is evaluated for every thread of the block from its flattened index
expression (loop variables at 0: they are the same in every lane of a warp, so they shift all lanes'
addresses alike and leave the bank pattern unchanged), then split into warps of 32 consecutive threads
(threadIdx.x fastest) and scored by banks.wavefronts.

Two things nvcc does to the loads are modelled, and checked against SASS by the tests:
  - a load inside fully unrolled loops (the innermost loops of constant trip count, ≤ UNROLL_LIMIT
    iterations together) whose address does not depend on one of those loops is issued once, not once per
    iteration (the value stays in a register);
  - scalar loads at consecutive addresses along one unrolled loop are merged into 8- or 16-byte loads
    (LDS.64 / LDS.128) when every address is aligned to the vector, as nvcc merges them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.tuning.gpu_model import banks

UNROLL_LIMIT = 1024  # iterations nvcc unrolls a nest of constant-trip loops into (its default full-unroll budget)
SHARED_SCOPES = ("shared", "shared.dyn")


@dataclass(frozen=True)
class SharedLoad:
    """One shared load instruction of the kernel, as each thread issues it."""

    buffer: str
    width_bytes: int  # per lane: 4, 8 or 16 (LDS, LDS.64, LDS.128)
    per_thread: int  # times each thread issues it over the whole kernel
    phase_wavefronts: float  # per warp-wide issue, averaged over the block's warps (banks.wavefronts)
    warp_wavefronts: float

    @property
    def ideal(self) -> int:
        return banks.ideal_wavefronts(self.width_bytes)

    @property
    def conflict(self) -> float:
        """Wavefronts per issue over the conflict-free count: 1.0 is ideal, 8.0 an 8-way conflict."""
        return self.phase_wavefronts / self.ideal

    def to_dict(self) -> dict[str, Any]:
        return {
            "buffer": self.buffer,
            "width_bytes": self.width_bytes,
            "per_thread": self.per_thread,
            "wavefronts": [round(self.phase_wavefronts, 2), round(self.warp_wavefronts, 2)],
            "ideal": self.ideal,
        }


@dataclass(frozen=True)
class GlobalLoad:
    """One global load instruction (LDG, or the source side of a cp.async), as each thread issues it."""

    buffer: str
    width_bytes: int
    per_thread: int
    sectors: float  # distinct 32-byte sectors per warp-wide issue (ideal: 32·width/32 for coalesced lanes)
    lines: float  # distinct 128-byte lines per warp-wide issue: L1 wavefronts at one line per clock

    def to_dict(self) -> dict[str, Any]:
        return {
            "buffer": self.buffer,
            "width_bytes": self.width_bytes,
            "per_thread": self.per_thread,
            "sectors": round(self.sectors, 2),
            "lines": round(self.lines, 2),
        }


@dataclass(frozen=True)
class KernelAccess:
    """One __global__ kernel of the module: launch geometry (grid as a function of M) and per-thread work."""

    index: int  # order in the module: TVM names them main_kernel, main_kernel_1, ...
    block: tuple[int, int, int]  # threadIdx x, y, z extents
    grid: Callable[[int], int]  # M -> thread blocks launched
    shared_loads: tuple[SharedLoad, ...]
    fma_per_thread: int
    global_loads: tuple[GlobalLoad, ...] = ()
    mma_fma_per_thread: int = 0  # tensor-core FMAs (mma.sync), a warp's MMA shared evenly by its 32 threads
    # the cp.async pipeline's serial k-loop: waits for copy groups each thread executes (one per k-step) and the
    # most groups a wait leaves in flight (stages - 1): what bound.py's tensor-core latency term reads
    async_waits: int = 0
    async_inflight: int = 0
    grid_dims: Callable[[int], tuple[int, int, int]] = lambda m: (1, 1, 1)  # M -> (gridDim.x, .y, .z)

    @property
    def threads(self) -> int:
        return math.prod(self.block)

    @property
    def warps(self) -> int:
        return -(-self.threads // banks.WARP)

    def wavefronts_per_block(self) -> tuple[float, float, float]:
        """(phase model, warp model, ideal) shared-memory wavefronts one thread block issues."""
        phase = sum(s.per_thread * s.phase_wavefronts for s in self.shared_loads) * self.warps
        warp = sum(s.per_thread * s.warp_wavefronts for s in self.shared_loads) * self.warps
        ideal = sum(s.per_thread * s.ideal for s in self.shared_loads) * self.warps
        return phase, warp, ideal

    def l1_lines_per_block(self) -> float:
        """128-byte L1 wavefronts one thread block's global loads take."""
        return sum(g.per_thread * g.lines for g in self.global_loads) * self.warps


@dataclass(frozen=True)
class ModuleAccess:
    kernels: tuple[KernelAccess, ...]
    dram_bytes: Callable[[int], int]  # M -> bytes of every global buffer touched once (+ written and re-read scratch)

    def to_dict(self, m: int) -> dict[str, Any]:
        return {
            "dram_bytes": self.dram_bytes(m),
            "kernels": [
                {
                    "block": list(k.block),
                    "grid": k.grid(m),
                    "fma_per_thread": k.fma_per_thread,
                    "mma_fma_per_thread": k.mma_fma_per_thread,
                    "async_waits": k.async_waits,
                    "shared_loads": [s.to_dict() for s in k.shared_loads],
                    "global_loads": [g.to_dict() for g in k.global_loads],
                }
                for k in self.kernels
            ],
        }


def lower_for_cuda(mod: Any, target: Mapping[str, Any], config: Mapping[str, object]) -> Any:
    """TVM's CUDA lowering (the passes `tirx.build` runs before codegen) without common-subexpression
    elimination, whose let-bound temporaries would only hide the index expressions."""
    import tvm
    from tvm import s_tir

    tgt = tvm.target.Target(dict(target))
    with tgt, tvm.transform.PassContext(config={**config, "tirx.disable_cse_tir": True}):
        bound = tvm.tirx.transform.BindTarget(tgt)(mod)
        lowered = s_tir.pipeline.default_s_tir_pipeline()[0](bound)
    return lowered["main"]


def analyze(mod: Any, target: Mapping[str, Any], config: Mapping[str, object]) -> ModuleAccess:
    """The accesses of a scheduled module's `main` (one symbolic var, M, at most)."""
    func = lower_for_cuda(mod, target, config)
    walker = _Walker()
    walker.stmt(func.body, _Scope())
    params = [p for p in mod["main"].params if hasattr(p, "shape")]  # X, W, Y as declared
    scratch = walker.global_allocs

    def dram_bytes(m: int) -> int:
        total = sum(_bytes(b.shape, b.dtype, m) for b in params)
        return total + 2 * sum(_bytes(shape, dtype, m) for shape, dtype in scratch)  # written, then read back

    return ModuleAccess(tuple(k.finish(i) for i, k in enumerate(walker.kernels)), dram_bytes)


def _bytes(shape: Any, dtype: Any, m: int) -> int:
    return math.prod(int(_evaluate(d, {}, m)) for d in shape) * _dtype_bytes(dtype)


def _dtype_bytes(dtype: Any) -> int:
    import tvm

    dt = tvm.DataType(str(dtype))
    return int(max(1, dt.bits // 8) * dt.lanes)


# ---- evaluating index expressions over every thread at once ----------------------------------------------

Env = dict[str, Any]  # var name -> int or numpy array (one value per thread)


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "FloorDiv": lambda a, b: a // b,
    "FloorMod": lambda a, b: a % b,
    "Div": lambda a, b: np.trunc(np.true_divide(a, b)).astype(np.int64),
    "Mod": lambda a, b: np.fmod(a, b),
    "Min": np.minimum,
    "Max": np.maximum,
    "LT": lambda a, b: a < b,
    "LE": lambda a, b: a <= b,
    "GT": lambda a, b: a > b,
    "GE": lambda a, b: a >= b,
    "EQ": lambda a, b: a == b,
    "NE": lambda a, b: a != b,
    "And": np.logical_and,
    "Or": np.logical_or,
    "BitwiseAnd": lambda a, b: a & b,
    "BitwiseOr": lambda a, b: a | b,
    "BitwiseXor": lambda a, b: a ^ b,
    "LShift": lambda a, b: a << b,
    "RShift": lambda a, b: a >> b,
}


def _evaluate(expr: Any, env: Env, m: int) -> Any:
    """An integer index expression's value, with numpy arrays for per-thread vars. TVM 0.27's expression
    classes are matched by name: several (BufferLoad, Call, Var) live in tvm.ir, not tvm.tirx."""
    if isinstance(expr, int | np.ndarray):
        return expr
    kind = type(expr).__name__
    if kind == "IntImm":
        return int(expr.value)
    if kind == "Var":
        name = str(expr.name)
        return _evaluate(env[name], env, m) if name in env else m  # M: the only free var of a symbolic-M module
    if kind == "Cast":
        return _evaluate(expr.value, env, m)
    if kind in _BINARY:
        return _BINARY[kind](_evaluate(expr.a, env, m), _evaluate(expr.b, env, m))
    if kind == "Select":
        return np.where(
            _evaluate(expr.condition, env, m), _evaluate(expr.true_value, env, m), _evaluate(expr.false_value, env, m)
        )
    if kind == "Ramp":
        return _evaluate(expr.base, env, m)  # the first lane; the width comes from the dtype
    if kind == "Broadcast":
        return _evaluate(expr.value, env, m)
    raise ValueError(f"cannot evaluate {kind} in an index: {expr}")


def _is_load(expr: Any) -> bool:
    return type(expr).__name__ in ("BufferLoad", "TensorLoad")


def _load_scope(load: Any) -> str:
    return str(load.source.scope())


# ---- walking the lowered module ----------------------------------------------------------------------------


@dataclass
class _Scope:
    loops: tuple[tuple[str, int], ...] = ()  # enclosing serial loops, outermost first: (var, trip count)
    lets: dict[str, Any] = field(default_factory=dict)


@dataclass
class _RawLoad:
    buffer: str
    elem_bytes: int  # of one scalar element
    lanes: int  # elements per access already vectorised by TVM (a Ramp index)
    index: Any
    loops: tuple[tuple[str, int], ...]
    lets: dict[str, Any]


@dataclass
class _KernelBuilder:
    threads: dict[str, int] = field(default_factory=dict)  # threadIdx.x -> extent
    blocks: dict[str, Any] = field(default_factory=dict)  # blockIdx.x -> extent expr
    thread_vars: dict[str, str] = field(default_factory=dict)  # var name -> threadIdx.x
    loads: list[_RawLoad] = field(default_factory=list)
    global_loads: list[_RawLoad] = field(default_factory=list)
    fma: int = 0
    mma_fma: int = 0
    async_waits: int = 0
    async_inflight: int = 0

    def finish(self, index: int) -> KernelAccess:
        block = (
            self.threads.get("threadIdx.x", 1),
            self.threads.get("threadIdx.y", 1),
            self.threads.get("threadIdx.z", 1),
        )
        extents = dict(self.blocks)

        def grid(m: int) -> int:
            return math.prod(grid_dims(m))

        def grid_dims(m: int) -> tuple[int, int, int]:
            x, y, z = (
                int(_evaluate(extents[f"blockIdx.{a}"], {}, m)) if f"blockIdx.{a}" in extents else 1 for a in "xyz"
            )
            return x, y, z

        env = self._thread_env(block)
        loads = tuple(_shared_load(raw, env, math.prod(block)) for raw in self.loads)
        global_loads = tuple(_global_load(raw, env, math.prod(block)) for raw in self.global_loads)
        return KernelAccess(
            index, block, grid, loads, self.fma, global_loads, self.mma_fma,
            self.async_waits, self.async_inflight, grid_dims,
        )  # fmt: skip

    def _thread_env(self, block: tuple[int, int, int]) -> Env:
        tid = np.arange(math.prod(block), dtype=np.int64)
        axes = {
            "threadIdx.x": tid % block[0],
            "threadIdx.y": (tid // block[0]) % block[1],
            "threadIdx.z": tid // (block[0] * block[1]),
        }
        env: Env = {name: axes[tag] for name, tag in self.thread_vars.items() if tag in axes}
        env.update({name: 0 for name, tag in self.thread_vars.items() if tag.startswith("blockIdx")})
        return env


class _Walker:
    def __init__(self) -> None:
        self.kernels: list[_KernelBuilder] = []
        self.current: _KernelBuilder | None = None
        self.global_allocs: list[tuple[Any, Any]] = []

    def stmt(self, node: Any, scope: _Scope) -> None:
        from tvm import tirx

        if isinstance(node, tirx.SeqStmt):
            for child in node.seq:
                self.stmt(child, scope)
        elif isinstance(node, tirx.AttrStmt) and node.attr_key == "thread_extent":
            self._launch(node, scope)
        elif isinstance(node, tirx.AttrStmt) and node.attr_key == "async_wait_inflight_count":
            # a cp.async.wait_group (InjectSoftwarePipeline's wait before a k-step's math), executed once per trip
            if self.current is not None:
                self.current.async_waits += math.prod(extent for _, extent in scope.loops)
                self.current.async_inflight = max(self.current.async_inflight, int(_evaluate(node.value, {}, 1)))
            self.stmt(node.body, scope)
        elif isinstance(node, tirx.For):
            extent = _evaluate(node.extent, {}, 1)
            self.stmt(node.body, _Scope((*scope.loops, (str(node.loop_var.name), int(extent))), scope.lets))
        elif isinstance(node, tirx.LetStmt):
            self._exprs([node.value], scope)
            self.stmt(node.body, _Scope(scope.loops, {**scope.lets, str(node.var.name): node.value}))
        elif isinstance(node, tirx.IfThenElse):
            self._exprs([node.condition], scope)
            self.stmt(node.then_case, scope)
            if node.else_case is not None:
                self.stmt(node.else_case, scope)
        elif isinstance(node, tirx.BufferStore):
            self._exprs([*node.indices, node.value], scope)
            self._count_fma(node, scope)
        elif isinstance(node, tirx.Evaluate):
            self._exprs([node.value], scope)
            self._count_mma(node.value, scope)
        else:
            if isinstance(node, tirx.AllocBuffer) and self.current is None:
                buf = node.buffer
                if buf.scope() == "global":
                    self.global_allocs.append((buf.shape, buf.dtype))
            body = getattr(node, "body", None)
            if body is not None:
                self.stmt(body, scope)

    def _launch(self, node: Any, scope: _Scope) -> None:
        tag = str(node.node.thread_tag)
        name = str(node.node.var.name)
        started = self.current is None
        if started:
            self.current = _KernelBuilder()
            self.kernels.append(self.current)
        assert self.current is not None
        self.current.thread_vars[name] = tag
        if tag.startswith("threadIdx"):
            self.current.threads[tag] = int(_evaluate(node.value, {}, 1))
        else:
            self.current.blocks[tag] = node.value
        self.stmt(node.body, scope)
        if started:
            self.current = None

    def _exprs(self, exprs: list[Any], scope: _Scope) -> None:

        if self.current is None:
            return
        found: list[Any] = []
        for expr in exprs:
            _collect_loads(expr, found)
        for load, scope_name in found:
            dt = _dtype(load.ty)
            raw = _RawLoad(
                str(load.source.name), max(1, dt.bits // 8), dt.lanes, load.indices[-1], scope.loops, scope.lets
            )
            (self.current.loads if scope_name in SHARED_SCOPES else self.current.global_loads).append(raw)

    def _count_mma(self, value: Any, scope: _Scope) -> None:
        """`ptx_mma("m16n8k16", ...)`: m·n·k FMAs per warp, issued by each of its 32 threads' call."""
        if self.current is None or type(value).__name__ != "Call" or not str(value.op.name).endswith("mma"):
            return
        shape = re.fullmatch(r"m(\d+)n(\d+)k(\d+)", str(value.args[0].value)) if value.args else None
        if shape:
            per_warp = math.prod(int(d) for d in shape.groups())
            self.current.mma_fma += per_warp // banks.WARP * math.prod(extent for _, extent in scope.loops)

    def _count_fma(self, store: Any, scope: _Scope) -> None:

        if self.current is None or not str(store.buffer.dtype).startswith(("float", "bfloat")):
            return
        value = store.value
        if type(value).__name__ == "Add" and "Mul" in (type(value.a).__name__, type(value.b).__name__):
            lanes = _dtype(value.ty).lanes  # a vectorised update is that many FMAs
            self.current.fma += lanes * math.prod(extent for _, extent in scope.loops)


def _collect_loads(expr: Any, found: list[tuple[Any, str]]) -> None:
    """Every shared or global load inside an expression, with its scope (TVM 0.27 has no Python expression
    visitor). A cp.async's source is a global load of its byte count, recorded as a pseudo-load."""
    kind = type(expr).__name__
    if _is_load(expr):
        scope = _load_scope(expr)
        if scope in SHARED_SCOPES or scope == "global":
            found.append((expr, scope))
        children: list[Any] = list(expr.indices)
    elif kind == "Call":
        children = list(expr.args)
        if "cp_async" in str(expr.op.name) and len(expr.args) >= 5:
            found.append((_CpAsyncSource(expr), "global"))
        elif str(expr.op.name).endswith("ldmatrix") and len(expr.args) >= 7:
            found.append((_LdmatrixSource(expr), "shared"))
    elif kind == "Select":
        children = [expr.condition, expr.true_value, expr.false_value]
    elif kind == "Ramp":
        children = [expr.base, expr.stride]
    elif kind == "Let":
        children = [expr.value, expr.body]
    elif kind in ("Var", "IntImm", "FloatImm", "StringImm"):
        children = []
    else:
        children = [getattr(expr, name) for name in ("a", "b", "value") if hasattr(expr, name)]
    for child in children:
        if not isinstance(child, int | float | str):
            _collect_loads(child, found)


class _CpAsyncSource:
    """The global side of `cp_async_raw(dst, dst_offset, src, src_offset, bytes[, predicate])` (element type: the
    call's) as a load of `bytes` from `src` at `src_offset` elements."""

    def __init__(self, call: Any) -> None:
        import tvm

        args = call.args
        self.source = _Named(str(args[2]).split(".")[0])
        self.indices = [args[3]]
        scalar = tvm.DataType(str(call.ty))
        lanes = int(args[4].value) // max(1, scalar.bits // 8)
        self.ty = f"{scalar}x{lanes}" if lanes > 1 else str(scalar)


class _LdmatrixSource:
    """`ldmatrix(trans, num, type, local, local_offset, access_ptr(type, smem, offset, ...), smem_offset)` as a
    shared load: every lane gives the address of one 16-byte row (x4: four 8×8 matrices per warp)."""

    def __init__(self, call: Any) -> None:
        pointer = call.args[5]
        self.source = _Named(str(pointer.args[1].name))
        self.indices = [pointer.args[2] + call.args[6]]
        self.ty = "float16x8"  # 16 bytes per lane; b16 elements


@dataclass(frozen=True)
class _Named:
    name: str


def _dtype(ty: Any) -> Any:
    import tvm

    return tvm.DataType(str(ty))


def _unrolled(loops: tuple[tuple[str, int], ...]) -> int:
    """How many innermost loops nvcc unrolls fully: the longest suffix within UNROLL_LIMIT iterations."""
    product, count = 1, 0
    for _, extent in reversed(loops):
        if product * extent > UNROLL_LIMIT:
            break
        product *= extent
        count += 1
    return count


def _shared_load(raw: _RawLoad, threads_env: Env, threads: int) -> SharedLoad:
    base_env: Env = {**threads_env, **raw.lets, **{name: 0 for name, _ in raw.loops}}

    def address(**at: int) -> np.ndarray:
        value = _evaluate(raw.index, {**base_env, **at}, 1)
        return np.broadcast_to(np.asarray(value, dtype=np.int64), (threads,))

    origin = address()
    strides = {name: address(**{name: 1}) - origin for name, _ in raw.loops}
    inner = raw.loops[len(raw.loops) - _unrolled(raw.loops) :]
    inner_names = {name for name, _ in inner}
    depends = {name for name, stride in strides.items() if np.any(stride != 0)}
    count = math.prod(extent for name, extent in raw.loops if name in depends or name not in inner_names)
    elems = 1
    for lanes in (16 // raw.elem_bytes, 8 // raw.elem_bytes) if raw.lanes == 1 else ():
        if lanes <= 1:
            continue
        along = [name for name, extent in inner if extent % lanes == 0 and np.all(strides[name] == 1)]
        aligned = np.all(origin % lanes == 0) and all(
            np.all(strides[name] % lanes == 0) for name in inner_names if name not in along[:1]
        )
        if along and aligned:
            elems = lanes
            break
    width = raw.elem_bytes * raw.lanes * elems
    phase, warp = [], []
    for start in range(0, threads, banks.WARP):
        lane_bytes = [int(a) * raw.elem_bytes for a in origin[start : start + banks.WARP]]
        p, w = banks.wavefronts(lane_bytes, width)
        phase.append(p)
        warp.append(w)
    return SharedLoad(raw.buffer, width, count // elems, float(np.mean(phase)), float(np.mean(warp)))


def _global_load(raw: _RawLoad, threads_env: Env, threads: int) -> GlobalLoad:
    """Sectors and 128-byte lines per warp-wide issue; TVM vectorises global loads itself (Ramp / cp.async)."""
    env: Env = {**threads_env, **raw.lets, **{name: 0 for name, _ in raw.loops}}
    origin = np.broadcast_to(np.asarray(_evaluate(raw.index, env, 1), dtype=np.int64), (threads,))
    width = raw.elem_bytes * raw.lanes
    sectors, lines = [], []
    for start in range(0, threads, banks.WARP):
        first = origin[start : start + banks.WARP] * raw.elem_bytes
        touched = {int(b) for a in first for b in range(int(a), int(a) + width, 4)}
        sectors.append(len({b // 32 for b in touched}))
        lines.append(len({b // 128 for b in touched}))
    count = math.prod(extent for _, extent in raw.loops)
    return GlobalLoad(raw.buffer, width, count, float(np.mean(sectors)), float(np.mean(lines)))
