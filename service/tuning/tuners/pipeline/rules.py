"""ALCOP's legality rules for software pipelining (thesis §3.2–3.3), checked before anything is built.

A `SchedulePlan` is the declarative form of a schedule: its loops after tiling (outermost first), the
buffers cache-read creates (what fills each, in which loop, with how many stages) and the order of the
schedule steps. `check` returns every violated rule by name; `require_legal` raises `IllegalSchedule`.

Which buffers may be pipelined (§3.2):
  async-copy      a pipelined buffer is filled by a copy (a cache-read), never by a computation; only a
                  shared buffer filled from global memory can use cp.async;
  sequential-loop it is filled inside a sequential loop: not bound to threads or blocks, not unrolled or
                  vectorized, and the loop variable does not index the buffer (ALCOP's "first sequential
                  loop whose iteration variable does not index into the buffer");
  sync-scope      on scope-based barriers (shared memory on Ampere) all buffers pipelined on one loop
                  need their barriers at the same place: the same stage count and the same copy kind.
Ordering of schedule steps (§3.3):
  cache-read-before-pipelining   a buffer is pipelined only after cache-read created it;
  tiling-before-pipelining       the loop it is pipelined on exists only after tiling;
  inlining-after-pipelining      inlining a tensor into the buffer's producer first would make the
                                 buffer the output of a computation (ALCOP's case 1).
Multi-level pipelines:
  multi-level     a register buffer pipelined on a loop is fed from a shared buffer that is pipelined
                  on an enclosing loop, or from a buffer that is not pipelined;
  fusion          inner-pipeline fusion needs a pipelined register buffer inside a pipelined shared one.

`check_tir` applies the buffer rules to a scheduled TIR function itself (what `lowering` checks after
scheduling, before building). Pure Python (no TVM import): the rules run in the API process and in the
benchmark alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from service.tuning.tuners.pipeline.space import PipelineConfig

LoopKind = Literal["serial", "blockIdx", "threadIdx", "unrolled", "vectorized"]
StepKind = Literal["tile", "cache_read", "pipeline", "inline"]

RULES = (
    "async-copy",
    "sequential-loop",
    "sync-scope",
    "cache-read-before-pipelining",
    "tiling-before-pipelining",
    "inlining-after-pipelining",
    "multi-level",
    "fusion",
)


@dataclass(frozen=True)
class Loop:
    name: str
    kind: LoopKind = "serial"


@dataclass(frozen=True)
class Buffer:
    name: str
    scope: Literal["shared", "local"]
    source: str  # the tensor or buffer it copies from
    loop: str  # the loop it is filled in (and pipelined on when stages > 1)
    stages: int = 1
    async_copy: bool = False
    indexed_by: frozenset[str] = frozenset()  # loops whose variables index the buffer


@dataclass(frozen=True)
class Step:
    kind: StepKind
    target: str  # a loop (tile), a buffer (cache_read, pipeline) or a tensor (inline)


@dataclass(frozen=True)
class SchedulePlan:
    loops: tuple[Loop, ...]  # outermost first
    buffers: tuple[Buffer, ...]
    steps: tuple[Step, ...]
    global_tensors: frozenset[str] = frozenset()  # kernel inputs in global memory
    fuse_inner: bool = False


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.message}"


class IllegalSchedule(ValueError):
    """A schedule that breaks an ALCOP rule; raised before it is built."""

    def __init__(self, violations: Sequence[Violation]) -> None:
        self.violations = list(violations)
        super().__init__("; ".join(str(v) for v in violations))


@dataclass
class _Index:
    plan: SchedulePlan
    loops: dict[str, tuple[int, Loop]] = field(init=False)
    buffers: dict[str, Buffer] = field(init=False)

    def __post_init__(self) -> None:
        self.loops = {lp.name: (i, lp) for i, lp in enumerate(self.plan.loops)}
        self.buffers = {b.name: b for b in self.plan.buffers}

    def step_at(self, kind: StepKind, target: str) -> int | None:
        for i, s in enumerate(self.plan.steps):
            if s.kind == kind and s.target == target:
                return i
        return None


def check(plan: SchedulePlan) -> list[Violation]:
    """Every rule `plan` breaks (empty: legal)."""
    ix = _Index(plan)
    out: list[Violation] = []
    pipelined = [b for b in plan.buffers if b.stages > 1]
    for b in plan.buffers:
        out += _producer(ix, b)
    for b in pipelined:
        out += _loop(ix, b) + _ordering(ix, b)
    out += _sync_scope(pipelined) + _multi_level(ix, pipelined)
    if plan.fuse_inner:
        outer = [b for b in pipelined if b.scope == "shared"]
        inner = [b for b in pipelined if b.scope == "local" and b.source in {o.name for o in outer}]
        if not inner:
            out.append(Violation("fusion", "inner-pipeline fusion needs a pipelined register buffer fed from a "
                                 "pipelined shared buffer"))
    return out


def require_legal(plan: SchedulePlan) -> None:
    violations = check(plan)
    if violations:
        raise IllegalSchedule(violations)


def _producer(ix: _Index, b: Buffer) -> list[Violation]:
    out = []
    inlined_at = ix.step_at("inline", b.source)
    read_at = ix.step_at("cache_read", b.name)
    # inlining the source before the cache-read makes the buffer the output of the inlined computation
    computed = inlined_at is not None and (read_at is None or inlined_at < read_at)
    if b.stages > 1 and computed:
        out.append(Violation("async-copy", f"{b.name} is produced by the computation of {b.source} inlined into it, "
                             "not by a memory copy, so it cannot be pipelined"))
    if b.async_copy:
        if b.scope != "shared" or b.source not in ix.plan.global_tensors:
            out.append(Violation("async-copy", f"{b.name}: cp.async copies global memory into shared memory; "
                                 f"{b.name} is {b.scope} and fed from {b.source}"))
        elif computed:
            out.append(Violation("async-copy", f"{b.name}: an inlined computation cannot be an asynchronous copy"))
    return out


def _loop(ix: _Index, b: Buffer) -> list[Violation]:
    if b.loop not in ix.loops:
        return [Violation("sequential-loop", f"{b.name} is pipelined on {b.loop!r}, which is not a loop of the "
                          "schedule")]
    _, loop = ix.loops[b.loop]
    out = []
    if loop.kind != "serial":
        out.append(Violation("sequential-loop", f"{b.name} is pipelined on {loop.name}, a {loop.kind} loop; "
                             "only a sequential loop can be pipelined"))
    if loop.name in b.indexed_by:
        out.append(Violation("sequential-loop", f"{loop.name} indexes {b.name}, so each iteration fills a "
                             "different part of it instead of a new stage (a stencil-like buffer)"))
    return out


def _ordering(ix: _Index, b: Buffer) -> list[Violation]:
    out = []
    at = ix.step_at("pipeline", b.name)
    if at is None:
        return [Violation("cache-read-before-pipelining", f"{b.name} has stages but no pipeline step")]
    read = ix.step_at("cache_read", b.name)
    if read is None or read > at:
        out.append(Violation("cache-read-before-pipelining", f"{b.name} is pipelined before cache-read creates it"))
    tiled = ix.step_at("tile", b.loop)
    if tiled is None or tiled > at:
        out.append(Violation("tiling-before-pipelining", f"{b.name} is pipelined on {b.loop} before tiling "
                             "creates that loop"))
    inlined = ix.step_at("inline", b.source)
    if inlined is not None and inlined < at:
        out.append(Violation("inlining-after-pipelining", f"{b.source} is inlined before {b.name} is pipelined; "
                             "pipeline first, then inline"))
    return out


def _sync_scope(pipelined: Sequence[Buffer]) -> list[Violation]:
    out = []
    by_loop: dict[str, list[Buffer]] = {}
    for b in pipelined:
        if b.scope == "shared":
            by_loop.setdefault(b.loop, []).append(b)
    for loop, group in by_loop.items():
        if len({(b.stages, b.async_copy) for b in group}) > 1:
            desc = ", ".join(f"{b.name}: {b.stages} stages{' async' if b.async_copy else ''}" for b in group)
            out.append(Violation("sync-scope", f"shared buffers pipelined on {loop} need their barriers at "
                                 f"different places ({desc})"))
    return out


def _multi_level(ix: _Index, pipelined: Sequence[Buffer]) -> list[Violation]:
    out = []
    for b in pipelined:
        parent = ix.buffers.get(b.source)
        if parent is None or parent.stages <= 1:
            continue
        if b.loop not in ix.loops or parent.loop not in ix.loops:
            continue
        if ix.loops[b.loop][0] <= ix.loops[parent.loop][0]:
            out.append(Violation("multi-level", f"{b.name} is pipelined on {b.loop}, which does not lie inside "
                                 f"{parent.name}'s pipelined loop {parent.loop}"))
    return out


# -- the plan of the tiled GEMM schedule for one configuration --------------------------------------


def gemm_plan(config: PipelineConfig, operands: tuple[str, str] = ("A", "B"), padded: bool = True) -> SchedulePlan:
    """The plan `lowering` applies for `config`: tile, cache-read A/B into shared memory at the outer k loop
    and into registers at the inner one, pipeline both levels, then inline the padding of A."""
    loops = (
        Loop("bx", "blockIdx"),
        Loop("by", "blockIdx"),
        Loop("ty", "threadIdx"),
        Loop("tx", "threadIdx"),
        Loop("ko"),
        Loop("ki"),
        Loop("ii", "unrolled"),
        Loop("jj", "unrolled"),
    )
    buffers: list[Buffer] = []
    steps: list[Step] = [Step("tile", lp.name) for lp in loops]
    # A symbolic M is padded to a multiple of B_m (pad_einsum): A's shared copy reads A_pad, a global view
    # whose padding computation is inlined into the copy last (ALCOP's case 2) and stays a predicated copy
    sources = {operands[0]: f"{operands[0]}_pad" if padded else operands[0], operands[1]: operands[1]}
    for x in operands:
        shared = Buffer(
            f"{x}_shared", "shared", sources[x], "ko", config.smem_stages, config.async_copy, frozenset({"ty", "tx"})
        )
        local = Buffer(f"{x}_local", "local", shared.name, "ki", config.reg_stages, False, frozenset({"ii", "jj"}))
        buffers += [shared, local]
        steps += [Step("cache_read", shared.name), Step("cache_read", local.name)]
    steps += [Step("pipeline", b.name) for b in buffers if b.stages > 1]
    if padded:
        steps.append(Step("inline", sources[operands[0]]))
    return SchedulePlan(loops, tuple(buffers), tuple(steps), frozenset(sources.values()), config.fuse_inner)


def check_config(config: PipelineConfig) -> list[Violation]:
    return check(gemm_plan(config))


# -- the same rules on a scheduled TIR function, before it is built ---------------------------------
# Duck-typed over TVM 0.27's node classes (no TVM import): loops carry `kind`/`annotations`/`body`, stores
# `buffer`/`value`, loads `source`; ForKind 0 is serial.

_SERIAL = 0


def check_tir(func: Any) -> list[Violation]:
    """ALCOP's buffer rules on the loops a schedule annotated with software-pipeline stages: the loop is
    sequential, every statement of an async stage is a copy from global into shared memory, and the shared
    copies of one loop sit in one stage (scope-based barriers)."""
    out: list[Violation] = []
    for loop in _nodes(func.body, lambda n: hasattr(n, "annotations") and "software_pipeline_stage" in n.annotations):
        name = str(loop.loop_var)
        if int(loop.kind) != _SERIAL:
            out.append(Violation("sequential-loop", f"loop {name} is software-pipelined but not sequential"))
        stages = [int(x) for x in loop.annotations["software_pipeline_stage"]]
        async_stages = {int(x) for x in loop.annotations.get("software_pipeline_async_stages", [])}
        children = list(getattr(loop.body, "seq", None) or [loop.body])
        shared_stages = set()
        for stage, child in zip(stages, children, strict=False):
            stores = _nodes(child, lambda n: type(n).__name__ == "BufferStore")
            copies = [st.buffer.scope() == "shared" and _global_copy(st.value) for st in stores]
            if any(copies):
                shared_stages.add(stage)
            if stage in async_stages and not all(copies):
                bad = stores[copies.index(False)]
                out.append(Violation("async-copy", f"stage {stage} of loop {name} is asynchronous but writes "
                                     f"{bad.buffer.name} ({bad.buffer.scope()}) with something other than a copy "
                                     "from global memory"))
        if len(shared_stages) > 1:
            out.append(Violation("sync-scope", f"loop {name} fills shared memory in stages {sorted(shared_stages)}; "
                                 "scope-based barriers need them in one"))
    return out


def _global_copy(value: Any) -> bool:
    """A load from global memory, possibly predicated (if_then_else(p, load, 0)) or cast."""
    kind = type(value).__name__
    if kind in ("TensorLoad", "BufferLoad"):
        source = getattr(value, "source", None)  # TVM expressions refuse `or`: no truth value
        if source is None:
            source = getattr(value, "buffer", None)
        return source is not None and source.scope() == "global"
    if kind == "Cast":
        return _global_copy(value.value)
    if kind == "Call" and str(getattr(value.op, "name", "")).endswith("if_then_else"):
        _, then, other = value.args
        return _global_copy(then) and type(other).__name__ in ("FloatImm", "IntImm")
    return False


def _nodes(node: Any, predicate: Callable[[Any], bool]) -> list[Any]:
    out = [node] if predicate(node) else []
    for attr in ("block", "body", "then_case", "else_case"):
        child = getattr(node, attr, None)
        if child is not None:
            out += _nodes(child, predicate)
    for child in getattr(node, "seq", None) or []:
        out += _nodes(child, predicate)
    return out
