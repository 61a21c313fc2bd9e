"""conv2d uKernels as an implicit GEMM: an NHWC conv layer tuned as the dense layer it is over M = N·OH·OW.

O[N,OH,OW,CO] = I[N,H,W,CI] ⊛ F[KH,KW,CI,CO] is Y[M, CO] = X[M, K]·Wᵀ with M = N·OH·OW and K = KH·KW·CI
(X the input's im2col matrix, W the filter as a matrix: kernelfleet.conv_dispatcher). Whatever subset of N, H and
W is symbolic, a tuple only changes M, so the conv layer is tuned by the dense uKernel machinery (rules, cost
model, combination DP: tuners.ukernel.tuner) over the distribution the tuples induce on M (each M weighted by the
mass of the tuples that give it), and served by the dense table behind a ConvDispatcher that maps a tuple to M in
O(1). Its vendor routes are decided as convs (`route_conv`), never by the dense tuner's GEMM sweep. Nothing here is
a second kernel family: only the mapping, the routes, and the checks that the conv built on the dense table
computes the conv.

Free of Celery and the store: the job kind drives it, benchmarks call `tune_conv_range` directly.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from kernelfleet import vendor
from kernelfleet.conv_dispatcher import CONV_DIMS, ConvDispatcher, ConvGeometry
from kernelfleet.dispatcher import Dispatcher
from service.models import TargetSpec, WorkloadSpec
from service.tuning.tuners.ukernel.bounds import MAX_S, MAX_UKERNELS
from service.tuning.tuners.ukernel.combine import overlay_routes
from service.tuning.tuners.ukernel.route_stats import (
    MIN_ROUNDS,
    UKERNEL,
    PointTiming,
    describe_rule,
)
from service.tuning.tuners.ukernel.tuner import (
    QuietRangeSink,
    RangeOutcome,
    RangeSink,
    RangeTask,
    UKernelTuner,
    Weighted,
    median_call,
    paired_rounds,
    weighted_mean,
)
from service.tuning.tuners.ukernel.vendor_routes import to_confirm

GEMM_DIM = "M"
ROUTE_POINTS = 8  # M values a conv's routes are timed at: a call at the largest costs the most of the job


def geometry(workload: WorkloadSpec) -> ConvGeometry:
    """A conv2d workload's stride, padding, filter sizes and static N, H, W, as the SDK dispatcher reads them."""
    d = workload.dims
    return ConvGeometry(
        stride=int(workload.attrs["stride"]),
        padding=int(workload.attrs["padding"]),
        filter=(d["KH"], d["KW"], d["CI"], d["CO"]),
        static={k: d[k] for k in CONV_DIMS if k in d},
    )


def gemm_workload(workload: WorkloadSpec) -> WorkloadSpec:
    """The dense layer a conv2d workload is: N = CO, K = KH·KW·CI, one dynamic M = N·OH·OW."""
    d = workload.dims
    return WorkloadSpec(
        op="dense", dtype=workload.dtype, dims={"N": d["CO"], "K": d["KH"] * d["KW"] * d["CI"]}, symbolic=[GEMM_DIM]
    )


def rows(workload: WorkloadSpec, shape: Mapping[str, int]) -> int:
    """M = N·OH·OW of one tuple of the workload's symbolic dims."""
    return geometry(workload).rows(shape)


def rows_support(workload: WorkloadSpec, support: Weighted) -> list[tuple[dict[str, int], float]]:
    """The distribution the tuples induce on M: each M with the summed weight of the tuples that give it."""
    g = geometry(workload)
    mass: dict[int, float] = {}
    for shape, w in support:
        m = g.rows(shape)
        mass[m] = mass.get(m, 0.0) + w
    return [({GEMM_DIM: m}, w) for m, w in sorted(mass.items())]


def check_tuples(workload: WorkloadSpec, support: Weighted) -> list[dict[str, int]]:
    """Tuples the conv dispatcher is checked at before anything is published: every corner of the support's
    box and, per symbolic dim, one and a half times its largest value (past the tuned range, where the
    table extends its last interval), skipping tuples whose output would be empty."""
    dims = [d for d in CONV_DIMS if d in workload.symbolic]
    ends = [sorted({min(s[d] for s, _ in support), max(s[d] for s, _ in support)}) for d in dims]
    tuples = [dict(zip(dims, combo, strict=True)) for combo in itertools.product(*ends)]
    top = {d: e[-1] for d, e in zip(dims, ends, strict=True)}
    tuples += [{**top, d: top[d] + top[d] // 2 + 1} for d in dims]
    return [t for t in tuples if rows(workload, t) > 0]


def dispatcher_of(outcome: RangeOutcome, workload: WorkloadSpec) -> ConvDispatcher:
    """The SDK's conv dispatcher over a tuned dense outcome, exactly as a host loads it from the table."""
    g = geometry(workload)
    dense = Dispatcher(outcome.table, outcome.kernels, N=g.filter[3] if g.filter else None, K=g.K)
    return ConvDispatcher(dense, g)


def verify_conv(dispatcher: ConvDispatcher, workload: WorkloadSpec, tuples: Sequence[Mapping[str, int]]) -> str | None:
    """Run the conv dispatcher at each tuple against the numpy reference; the first error, or None."""
    from service.tuning.compute import random_inputs, reference, tolerance

    ref = reference(workload)
    for t in tuples:
        inp, flt = random_inputs(workload, t, seed=1)
        got, want = dispatcher(inp, flt), ref(inp, flt)
        if got.shape != want.shape:
            return f"conv at {dict(t)}: output {list(got.shape)}, expected {list(want.shape)}"
        err = float(np.max(np.abs(got - want)))
        if not err <= tolerance(workload, t):
            return f"conv at {dict(t)} (M={rows(workload, t)}): max abs error {err:.3g}"
    return None


def conv_range_task(
    workload: WorkloadSpec,
    support: Weighted,
    target: TargetSpec,
    work_dir: Path,
    *,
    max_ukernels: int = MAX_UKERNELS,
    validate: Sequence[Mapping[str, int]] = (),
) -> RangeTask:
    """The dense range task a conv layer is: M = 1..max M of the support (at most MAX_S: the table extends past
    it), its weighted mean M representative, the hot tuples' M validated. Its vendor routes are not decided on
    the GEMM: a conv's vendors are convolutions, timed at the support's own M (`route_conv`)."""
    over_m = rows_support(workload, support)
    s_max = min(max(s[GEMM_DIM] for s, _ in over_m), MAX_S)
    ms = list(dict.fromkeys(m for m in (rows(workload, t) for t in validate) if m <= s_max))
    return RangeTask(
        workload=gemm_workload(workload),
        s_max=s_max,
        validate=ms,
        target=target,
        max_ukernels=max_ukernels,
        work_dir=work_dir,
        representative_m=min(weighted_mean(over_m, GEMM_DIM), s_max),
        vendor_routes=False,
    )


def route_points(workload: WorkloadSpec, support: Weighted, points: int = ROUTE_POINTS) -> list[dict[str, int]]:
    """Where a conv's routes are timed: one tuple per M for at most `points` of the M the support takes, spread
    geometrically from its smallest to its largest (both included)."""
    by_m: dict[int, dict[str, int]] = {}
    for shape, _ in support:
        by_m.setdefault(rows(workload, shape), dict(shape))
    ms = sorted(m for m in by_m if m > 0)
    if len(ms) > points:
        lo, hi = ms[0], ms[-1]
        targets = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
        ms = sorted({min(ms, key=functools.partial(_log_distance, t)) for t in targets})
    return [by_m[m] for m in ms]


def _log_distance(target: float, m: int) -> float:
    return abs(math.log(m / target))


def time_conv_routes(
    dispatcher: ConvDispatcher, workload: WorkloadSpec, shape: Mapping[str, int], rounds: int = MIN_ROUNDS
) -> PointTiming:
    """The uKernels (the conv dispatcher on its programs, im2col included) and every vendor library this worker
    has, each its own conv as a host calls it (numpy: im2col and `x @ w.T`; PyTorch: conv2d on the channels_last
    view), at one tuple in paired rounds (route_stats): more rounds while the uKernels look like a win."""
    from service.tuning.compute import random_inputs

    g = geometry(workload)
    inp, flt = random_inputs(workload, shape)
    ours = functools.partial(dispatcher, inp, flt)
    libraries: dict[str, Callable[[], object]] = {}
    if vendor.NUMPY in vendor.available():
        on_numpy = ConvDispatcher(Dispatcher(None, {}, N=dispatcher.dense.N, K=dispatcher.dense.K), g)
        libraries[vendor.NUMPY] = functools.partial(on_numpy, inp, flt)
    if vendor.TORCH in vendor.available():
        weight = vendor.torch_conv_weight(flt)
        libraries[vendor.TORCH] = functools.partial(vendor.torch_conv2d, inp, weight, g.stride, g.padding)

    return paired_rounds(ours, libraries, rounds)


def route_conv(outcome: RangeOutcome, workload: WorkloadSpec, support: Weighted) -> RangeOutcome:
    """The tuned dense outcome with its conv routes: at each route point the uKernels and every vendor library's
    conv are timed, and the span of M nearest that point (halfway to its neighbours; the last span reaching
    past the support) goes to a vendor library where one was fastest. The table then names only the uKernels
    some M still runs. The outcome must route nothing yet (its task's `vendor_routes` off): a span this leaves on
    the uKernels would keep a GEMM sweep's vendor route, and its programs are gone from the table."""
    if any(iv.vendor for iv in outcome.table.intervals):
        raise ValueError("a conv's routes are decided as convs: tune its dense layer with vendor_routes=False")
    ours = dispatcher_of(outcome, workload)
    shapes = {rows(workload, shape): shape for shape in route_points(workload, support)}
    timed = {m: time_conv_routes(ours, workload, shape) for m, shape in shapes.items()}
    confirmed = to_confirm(timed)  # a change of route between neighbours, or a lone one: decided on more rounds
    for m in confirmed:
        timed[m] = timed[m].merged(time_conv_routes(ours, workload, shapes[m]))
    points = sorted(timed)
    spans: list[tuple[int, int, str]] = []
    for i, m in enumerate(points):
        lo = 1 if i == 0 else (points[i - 1] + m) // 2 + 1
        hi = m if i == len(points) - 1 else (m + points[i + 1]) // 2
        if timed[m].route != UKERNEL:
            spans.append((lo, hi, timed[m].route))
    table = overlay_routes(outcome.table, spans)
    validation = {
        **outcome.validation,
        "conv_routes": {
            "rule": describe_rule(),
            "timed_s": {str(m): {**timed[m].medians(), **timed[m].to_dict()} for m in points},
            "confirmed_M": confirmed,
            "spans": [list(span) for span in spans],
        },
    }
    return replace(
        outcome,
        table=table,
        kernels={uid: k for uid, k in outcome.kernels.items() if uid in table.mts},
        artifacts={uid: a for uid, a in outcome.artifacts.items() if uid in table.mts},
        validation=validation,
    )


@dataclass
class ConvRangeOutcome:
    workload: WorkloadSpec
    dense: RangeOutcome  # the dense tuning over M: its table, uKernels and validation

    def dispatcher(self) -> ConvDispatcher:
        return dispatcher_of(self.dense, self.workload)


def tune_conv_range(
    workload: WorkloadSpec,
    support: Weighted,
    target: TargetSpec,
    work_dir: Path,
    *,
    max_ukernels: int = MAX_UKERNELS,
    validate: Sequence[Mapping[str, int]] = (),
    vendor_routes: bool = True,
    sink: RangeSink | None = None,
) -> ConvRangeOutcome:
    """Tune an NHWC conv2d layer (CPU) for every tuple of `support` (over its symbolic N, H, W): the dense
    uKernels over M, checked as a conv at the support's corners and past them. Raises when the check fails."""
    task = conv_range_task(workload, support, target, work_dir, max_ukernels=max_ukernels, validate=validate)
    dense = UKernelTuner().tune(task, sink or QuietRangeSink())
    out = ConvRangeOutcome(workload, route_conv(dense, workload, support) if vendor_routes else dense)
    error = verify_conv(out.dispatcher(), workload, check_tuples(workload, support))
    if error:
        raise RuntimeError(error)
    return out


def time_conv(
    dispatcher: ConvDispatcher, workload: WorkloadSpec, shape: Mapping[str, int], min_seconds: float = 0.002
) -> float:
    """Median seconds per call of the conv dispatcher at one tuple, as an inference host calls it (im2col included)."""
    from service.tuning.compute import random_inputs

    inp, flt = random_inputs(workload, shape)
    dispatcher(inp, flt)  # packs the filter
    return median_call(lambda: dispatcher(inp, flt), min_seconds)
