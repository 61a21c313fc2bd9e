"""Tune batch_matmul uKernels over a distribution of tuples of its symbolic dims, into one TupleDispatchTable.

1. Classes: per symbolic dim, geometric classes over the support's range (kernelfleet.tuple_dispatch.
   geometric_starts: 1, 2, 3–4, 5–8, …); a cell is one class per dim. Only cells the distribution puts
   mass in are planned (a joint Explicit distribution, e.g. attention's T in M and N, fills the diagonal;
   an Independent product fills the grid); the others stay holes, which the SDK serves with numpy as misses.
2. Candidates: the dense FTuner rules (rules.dense_candidates) on the per-batch problem at the support's
   weighted-mean sizes (N, K; B·M rows), the best tile per mt; each is compiled once (bmm_kernel.py).
3. Per cell: every uKernel and every vendor library this worker has (numpy `np.matmul(a, btᵀ)`, PyTorch `bmm`,
   as the SDK calls them: kernelfleet.vendor) are timed, alternating, at the cell's heaviest tuple and its
   smallest, median and largest, in each layout a host passes Bt in (BT_LAYOUTS). Each layout is routed on its
   own timings, since the libraries rank differently on each (A·V's transposed V went to PyTorch on the sum of
   both layouts where numpy won every tuple in its own): the cell gets, per layout, the uKernel with the least
   total time there if it beat that layout's fastest library by 3 % at every tuple in two passes, else the
   library with the least total time in that layout (vendor routes: the dispatcher is then never slower than
   the vendor by more than timing noise at the tuples timed). Each timing starts after 2 ms of warm-up calls,
   so TVM's spinning idle threads are gone.
4. Verification: the dispatcher, as the SDK runs it, against numpy at both corners of every planned cell, in
   both layouts.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernelfleet import vendor
from kernelfleet.bmm_dispatcher import BKN, BNK, BT_LAYOUTS, BmmDispatcher
from kernelfleet.bmm_ukernel import BMM_DIMS, BmmArtifact, BmmUKernel
from kernelfleet.tuple_dispatch import TupleDispatchTable, geometric_starts
from kernelfleet.vendor import is_vendor
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.base import StopSignal
from service.tuning.tuners.ukernel.bmm_kernel import build_bmm_ukernel
from service.tuning.tuners.ukernel.rules import dense_candidates, padded
from service.tuning.tuners.ukernel.tuner import Weighted, settle, weighted_mean

MAX_SYMBOLIC = 3
VENDOR_MARGIN = 0.03  # a class goes to a uKernel only if it beats the libraries by this much at every tuple timed


@dataclass
class BmmRangeTask:
    static: dict[str, int]  # the workload's static dims among B, M, N, K
    support: Weighted  # tuples of the symbolic dims with weights
    target: dict[str, Any]  # a TVM target dict (platforms.tvm_target)
    work_dir: Path
    max_ukernels: int = 4
    vendor_routes: bool = True
    hardware: HardwareModel | None = None
    min_seconds: float = 0.005
    rounds: int = 3

    @property
    def symbolic(self) -> tuple[str, ...]:
        return tuple(d for d in BMM_DIMS if d not in self.static)


@dataclass
class BmmRangeOutcome:
    table: TupleDispatchTable
    kernels: dict[str, BmmUKernel]
    artifacts: dict[str, BmmArtifact]
    measured: dict[str, dict[str, float]]  # "M=5,N=5" → {"<uKernel id or vendor route>@<layout>": seconds}
    candidates: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def dispatcher(self, static: Mapping[str, int]) -> BmmDispatcher:
        return BmmDispatcher(self.table, self.kernels, static)

    @property
    def serves_ukernels(self) -> bool:
        return bool(self.table.ukernel_ids())

    def changes_for(self, library: str) -> bool:
        """Whether any tuple runs on something other than `library` (a uKernel, or another library where it was
        faster): a table that routes every tuple to the library its hosts already call changes nothing for them."""
        return any(c != vendor.route_of(library) for c in self.table.routes())


def bmm_tiles(
    hw: HardwareModel, static: Mapping[str, int], support: Weighted, top_k: int
) -> list[tuple[int, int, int]]:
    """(mt, nt, kt) tiles from the dense rules on one batch's problem at representative sizes."""

    def size(d: str) -> int:
        return static[d] if d in static else weighted_mean(support, d)

    k = static.get("K") or padded(size("K"), 16)  # a symbolic K is padded to kt: any kt ≤ 16 divides it
    rows = size("B") * size("M")
    cands = dense_candidates(hw, size("N"), k, representative_m=rows, top_k=top_k, distinct_mt=True)
    if "N" in static:  # a static N must be a multiple of nt (the binary pads only symbolic dims)
        cands = [c for c in cands if static["N"] % c.nt == 0] or cands
    return [c.tile for c in cands]


def _median_call(fn: Callable[[], object], min_seconds: float, warmup: float = 0.002, *, settled: bool) -> float:
    """Median seconds per call after `warmup` seconds of calls: the previous program's idle threads (TVM's spin
    about a millisecond after a call, on the cores OpenBLAS then wants) are gone before timing starts; with
    `settled` (the previous program ran on another library's threads), after `settle` too (PyTorch's spin about
    3.5 ms)."""
    if settled:
        settle()
    end = time.perf_counter() + warmup
    fn()
    while time.perf_counter() < end:
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(samples) < 3 or (time.perf_counter() < deadline and len(samples) < 200):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def random_pair(shape: Mapping[str, int], seed: int = 0, bt_layout: str = BNK) -> tuple[np.ndarray, np.ndarray]:
    """Random A[B,M,K] and Bt[B,N,K]; `bt_layout` BKN gives Bt as the transposed view of a contiguous
    [B,K,N] array (attention's A·V passes V[B,T,d] so), BNK a contiguous Bt (QKᵀ's K[B,T,d])."""
    rng = np.random.default_rng(seed)
    B, M, N, K = (shape[d] for d in BMM_DIMS)
    a = rng.standard_normal((B, M, K), dtype=np.float32)
    if bt_layout == BKN:
        return a, rng.standard_normal((B, K, N), dtype=np.float32).transpose(0, 2, 1)
    return a, rng.standard_normal((B, N, K), dtype=np.float32)


def time_programs(
    kernels: Mapping[str, BmmUKernel],
    shape: Mapping[str, int],
    min_seconds: float,
    rounds: int,
    layouts: Sequence[str] = BT_LAYOUTS,
) -> dict[str, float]:
    """Seconds per call of every uKernel and of every vendor library this worker has (under its wire route:
    "vendor" for numpy, "vendor:torch"), at one shape, in alternating rounds (best round each), with Bt in each
    of `layouts`: keyed `<program>@<layout>` (`timed_key`). A host passes Bt contiguous or as a transposed view,
    and the libraries' speeds depend on which, so each layout is routed on its own times."""
    out: dict[str, float] = {}
    for layout in layouts:
        for uid, t in time_layout(kernels, shape, min_seconds, rounds, layout).items():
            out[timed_key(uid, layout)] = t
    return out


def timed_key(program: str, layout: str) -> str:
    return f"{program}@{layout}"


def _programs(timed: Mapping[str, float], layout: str) -> list[str]:
    """The uKernel ids and vendor routes timed in `layout`."""
    suffix = "@" + layout
    return [key.removesuffix(suffix) for key in timed if key.endswith(suffix)]


def fastest_library(timed: Sequence[Mapping[str, float]], layout: str) -> str:
    """The vendor route with the least time over the tuples timed with Bt in `layout`."""
    routes = [r for r in _programs(timed[0], layout) if is_vendor(r)]
    return min(routes, key=lambda r: sum(t[timed_key(r, layout)] for t in timed))


def time_layout(
    kernels: Mapping[str, BmmUKernel], shape: Mapping[str, int], min_seconds: float, rounds: int, layout: str
) -> dict[str, float]:
    a, bt = random_pair(shape, bt_layout=layout)
    out = np.empty((a.shape[0], a.shape[1], bt.shape[1]), np.float32)
    fns: dict[str, Callable[[], object]] = {uid: functools.partial(k, a, bt, out) for uid, k in kernels.items()}
    for lib in vendor.available():  # as the dispatcher calls them for `d(a, bt)`: a new C (into `out`, PyTorch's
        # result would be copied once more, a cost the dispatcher's callers do not pay)
        fns[vendor.route_of(lib)] = functools.partial(vendor.bmm, lib, a, bt)
    best = {uid: float("inf") for uid in fns}
    previous = None  # the thread pool the previous block ran on: the uKernels share TVM's
    for _ in range(rounds):
        for uid, fn in fns.items():
            pool = uid if is_vendor(uid) else "tvm"
            best[uid] = min(best[uid], _median_call(fn, min_seconds, settled=pool != previous))
            previous = pool
    return best


def _fastest_vendor(times: Mapping[str, float], layout: str) -> float:
    return min(times[timed_key(r, layout)] for r in _programs(times, layout) if is_vendor(r))


def _fastest_ukernel(timed: Sequence[Mapping[str, float]], kernels: Collection[str], layout: str) -> str:
    return min(kernels, key=lambda uid: sum(t[timed_key(uid, layout)] for t in timed))


def _wins(timed: Sequence[Mapping[str, float]], uid: str, layout: str) -> bool:
    """Whether the uKernel beat the fastest library in `layout` by the margin at every tuple timed."""
    return all(t[timed_key(uid, layout)] * (1 + VENDOR_MARGIN) < _fastest_vendor(t, layout) for t in timed)


def route_cell(
    kernels: Mapping[str, BmmUKernel], samples: Sequence[Mapping[str, int]], task: BmmRangeTask
) -> tuple[dict[str, str], list[dict[str, float]]]:
    """A planned cell's program per Bt layout, and its timings at each sample (full shapes): per layout, the uKernel
    with the least total time there if it beat that layout's fastest library at every sample, by the margin, and
    again when timed once more (each keeps its best time of both passes: load on a shared machine only ever adds
    time, and it came in bursts that made a library look slow for a whole pass), else that layout's library with
    the least total time. With `task.vendor_routes` off, the uKernel in every layout."""
    timed = [time_programs(kernels, shape, task.min_seconds, task.rounds) for shape in samples]
    ours = {layout: _fastest_ukernel(timed, kernels, layout) for layout in BT_LAYOUTS}
    if not task.vendor_routes:
        return ours, timed
    winners = {ours[layout] for layout in BT_LAYOUTS if _wins(timed, ours[layout], layout)}
    if winners:
        for shape, first in zip(samples, timed, strict=True):
            again = time_programs({uid: kernels[uid] for uid in winners}, shape, task.min_seconds, task.rounds)
            for key, t in again.items():
                first[key] = min(first[key], t)
    routes = {lay: uid if _wins(timed, uid, lay) else fastest_library(timed, lay) for lay, uid in ours.items()}
    return routes, timed


def plan_cells(
    symbolic: Sequence[str], support: Weighted
) -> tuple[TupleDispatchTable, dict[int, list[tuple[dict[str, int], float]]]]:
    """An all-hole table over the support's box, and the support's tuples grouped by cell index."""
    starts = tuple(
        tuple(geometric_starts(min(s[d] for s, _ in support), max(s[d] for s, _ in support))) for d in symbolic
    )
    his = tuple(max(s[d] for s, _ in support) for d in symbolic)
    size = 1
    for s in starts:
        size *= len(s)
    empty = TupleDispatchTable(tuple(symbolic), starts, his, (None,) * size)
    groups: dict[int, list[tuple[dict[str, int], float]]] = {}
    for shape, w in support:
        classes = empty.class_of([shape[d] for d in symbolic])
        assert classes is not None
        groups.setdefault(empty.cell_index(classes), []).append(({d: shape[d] for d in symbolic}, w))
    return empty, groups


def cell_samples(points: Sequence[tuple[dict[str, int], float]]) -> list[dict[str, int]]:
    """Where a cell is timed: its heaviest tuple and its smallest, median and largest by work (padding waste
    varies within a class, so one point would not speak for it), deduplicated."""
    by_work = sorted(points, key=lambda p: (int(np.prod(list(p[0].values()))), sorted(p[0].items())))
    picks = [max(points, key=lambda p: p[1]), by_work[0], by_work[len(by_work) // 2], by_work[-1]]
    out: list[dict[str, int]] = []
    for shape, _ in picks:
        if shape not in out:
            out.append(shape)
    return out


class BmmUKernelTuner:
    name = "ukernel-bmm"

    def tune(self, task: BmmRangeTask, sink: StopSignal) -> BmmRangeOutcome:
        """The whole run, not interrupted: it reports nothing as it goes (the job records the tiles and a retry
        runs it again from the start), so the job asks `sink` whether to go on once this returns."""
        began = time.perf_counter()
        symbolic = task.symbolic
        if not 1 <= len(symbolic) <= MAX_SYMBOLIC:
            raise ValueError(f"batch_matmul uKernels take 1..{MAX_SYMBOLIC} symbolic dims, got {list(symbolic)}")
        hw = task.hardware or HardwareModel.from_host()
        tiles = bmm_tiles(hw, task.static, task.support, task.max_ukernels)
        static_mnk = {d: v for d, v in task.static.items() if d != "B"}
        kernels: dict[str, BmmUKernel] = {}
        records: list[dict[str, Any]] = []
        for mt, nt, kt in tiles:
            uid = f"bmm{mt}x{nt}x{kt}"
            kernels[uid] = build_bmm_ukernel(
                mt, nt, kt, task.target, M=static_mnk.get("M", 0), N=static_mnk.get("N", 0), K=static_mnk.get("K", 0)
            )
            records.append({"id": uid, "tile": [mt, nt, kt]})
        empty, groups = plan_cells(symbolic, task.support)
        cells: dict[str, list[str | None]] = {layout: list(empty.cells) for layout in BT_LAYOUTS}
        measured: dict[str, dict[str, float]] = {}
        for index, points in sorted(groups.items()):
            samples = [{**task.static, **sample} for sample in cell_samples(points)]
            routes, timed = route_cell(kernels, samples, task)
            for shape, times in zip(samples, timed, strict=True):
                measured[",".join(f"{d}={shape[d]}" for d in symbolic)] = times
            for layout, route in routes.items():
                cells[layout][index] = route
        table = per_layout_table(empty, cells)
        used = table.ukernel_ids()
        kernels = {uid: k for uid, k in kernels.items() if uid in used}
        artifacts = {uid: k.export(task.work_dir) for uid, k in kernels.items()}
        return BmmRangeOutcome(table, kernels, artifacts, measured, records, time.perf_counter() - began)


def per_layout_table(empty: TupleDispatchTable, cells: Mapping[str, Sequence[str | None]]) -> TupleDispatchTable:
    """The table over `empty`'s grid with each layout's cells: BNK's as `cells` (what a table read before routes
    were per layout, or by an SDK from then, runs for any layout), another layout's under `layouts` only where
    they differ from them."""
    default = tuple(cells[BNK])
    layouts = {layout: tuple(c) for layout, c in cells.items() if layout != BNK and tuple(c) != default}
    return TupleDispatchTable(empty.dims, empty.starts, empty.his, default, layouts)


def verification_shapes(table: TupleDispatchTable, static: Mapping[str, int]) -> list[dict[str, int]]:
    """Both corners of every planned cell (every program's class runs at its smallest and largest tuple)."""
    out = []
    for classes in table.grid():
        if table.cells[table.cell_index(classes)] is None:
            continue
        bounds = table.class_bounds(classes)
        for corner in (0, 1):
            out.append({**static, **{d: b[corner] for d, b in zip(table.dims, bounds, strict=True)}})
    return out


def verify_bmm(dispatcher: BmmDispatcher, static: Mapping[str, int], rtol: float = 1e-4) -> str | None:
    """Run the dispatcher as the SDK does, Bt in each layout (each runs its own routes), against numpy in float64;
    the first error, or None."""
    assert dispatcher.table is not None
    for i, shape in enumerate(verification_shapes(dispatcher.table, static)):
        for layout in BT_LAYOUTS:
            a, bt = random_pair(shape, seed=i, bt_layout=layout)
            got = dispatcher(a, bt)
            want = np.matmul(a.astype(np.float64), bt.astype(np.float64).transpose(0, 2, 1))
            scale = max(1.0, float(np.abs(want).max()))
            err = float(np.abs(got - want).max()) / scale
            if err > rtol * max(1.0, np.sqrt(shape["K"])):
                return f"program for {shape}, Bt {layout}: max relative error {err:.3g}"
    return None
