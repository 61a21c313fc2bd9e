"""The `ukernel` tuner: one tuning run covers every value 1..S_max of a dense layer's dynamic M.

FTuner's pipeline, with DietCode's cost model (../shared/research/anchors.md §1–2):
  1. the hardware model and rules propose a few micro-kernel tiles, no search (`rules`);
  2. each is compiled once as a shape-generic binary (`kernel`) and timed at a few M only;
  3. the combination DP picks, for every S, the pieces that cover S rows at the least predicted
     cost (`combine`) and the result is compressed into a dispatch table;
  4. the SDK dispatcher and the vendor libraries (numpy, PyTorch) are timed as an inference host calls them, in
     alternation, on a geometric grid of S and the hot shapes; crossings are bisected to the exact S, and
     between agreeing points the DP's cost, calibrated on the measured ones, says where to check
     (`vendor_routes`); every S where a vendor library is faster is routed to the fastest one in the
     published table;
  5. for the heaviest shapes of the distribution, every uKernel is measured as a single-piece program
     and its measured time is compared with DietCode's prediction and FTuner's SIA score (Spearman
     ρ), and the chosen route is measured as the inference host will run it.

Free of Celery and the store: the job runner drives it, the benchmarks call it directly.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.base import StopSignal, TuningStopped
from service.tuning.tuners.ukernel.bounds import MAX_S, MAX_UKERNELS
from service.tuning.tuners.ukernel.combine import TileCost, combine, dispatch_table, sample_ms
from service.tuning.tuners.ukernel.cores import apart
from service.tuning.tuners.ukernel.cost import dietcode_predict, f_mk_from_measurement, rank_sia, spearman
from service.tuning.tuners.ukernel.kernel import UKernel, UKernelArtifact, aligned_empty, build_ukernel
from service.tuning.tuners.ukernel.route_stats import CONFIRM_ROUNDS, MIN_ROUNDS, PointTiming, describe_rule
from service.tuning.tuners.ukernel.rules import dense_candidates
from service.tuning.tuners.ukernel.vendor_routes import decide, fastest_libraries

if TYPE_CHECKING:  # annotations only: the GPU tuner imports this module on hosts without pydantic
    from service.models import TargetSpec, WorkloadSpec


Weighted = Sequence[tuple[Mapping[str, int], float]]  # a distribution's support: (shape, weight) pairs


def weighted_mean(support: Weighted, dim: str) -> int:
    """The support's weight-averaged `dim`, rounded, at least 1: where a range task's rules judge its uKernels."""
    total = sum(w for _, w in support)
    return max(1, round(sum(s[dim] * w for s, w in support) / total))


@dataclass(frozen=True)
class RangeTask:
    workload: WorkloadSpec
    s_max: int
    validate: Sequence[int]  # shapes to measure, heaviest first
    target: TargetSpec
    max_ukernels: int
    work_dir: Path
    representative_m: int = 64  # where the rules judge padding and parallelism
    hardware: HardwareModel | None = None  # default: read from this host
    measure_points: int = 5
    min_repeat_ms: int = 10
    # uKernel id → {M: seconds} an earlier attempt of the same job measured: rebuilt, not re-measured
    measured_before: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    vendor_routes: bool = True  # route every S where the vendor is faster to the vendor
    # the vendor libraries the table may route to (None: every one this worker has); a host that runs PyTorch
    # for every vendor route (kernelfleet.torch.accelerate's default) is served by uKernels only where they
    # beat PyTorch, so its job times PyTorch alone (kinds/host_library.py)
    vendor_libraries: tuple[str, ...] | None = None
    measure_timeout_s: float = 60.0  # GPU: a candidate's build + timing in the measuring child, then it is killed


# Timings on a shared machine vary by several percent run to run; a multi-piece program must beat a
# simpler one by more than that, or the DP would chase noise into fragmented tables.
NOISE_TIE = 0.03


class RangeSink(StopSignal, Protocol):
    def on_ukernel(self, record: dict[str, Any]) -> None:
        """One uKernel newly measured (or failed), as soon as it is: a retried job resumes from these."""

    def on_validated(self, S: int, measured: int) -> None: ...


class QuietRangeSink:
    """A RangeSink that records nothing and never stops: benches and tests override what they watch."""

    def on_ukernel(self, record: dict[str, Any]) -> None:
        pass

    def on_validated(self, S: int, measured: int) -> None:
        pass

    def should_stop(self) -> bool:
        return False


@dataclass
class RangeOutcome:
    table: DispatchTable
    kernels: dict[str, Any]  # UKernel on CPUs, kernelfleet.cuda_ukernel.CudaUKernel on GPUs
    artifacts: dict[str, Any]  # UKernelArtifact-shaped: path, sha256, spec
    predicted_s: list[float]  # predicted seconds of the chosen program at S = 1..s_max
    measured_s: dict[int, float]  # measured seconds of the chosen program at the validated S
    validation: dict[str, Any]
    candidates: list[dict[str, Any]]
    errors: int
    seconds: float
    hardware: dict[str, Any] = field(default_factory=dict)
    dispatcher: Any = None  # the SDK dispatcher that ran the validation (None: the CPU Dispatcher over kernels)

    @property
    def padding_ratio(self) -> float:
        """Padded rows over useful rows, summed over 1..s_max: how much the programs over-compute."""
        mts = self.table.mts
        tuned = [s for s in range(1, self.table.s_max + 1) if not self.table.vendor_at(s)]
        padded = sum(p.tiles * mts[p.ukernel_id] for s in tuned for p in self.table.lookup(s))
        useful = sum(tuned)  # the S routed to the vendor compute no padding of ours
        return padded / useful - 1.0 if useful else 0.0

    @property
    def serves_ukernels(self) -> bool:
        """Whether any S runs on a uKernel: a table that routes every S to the vendor serves nothing."""
        return any(not iv.vendor for iv in self.table.intervals)

    def changes_for(self, library: str) -> bool:
        """Whether any S runs on something other than `library` (a uKernel, or another library where it was
        faster): a table that routes every S to the library its hosts already call changes nothing for them."""
        return any(not iv.vendor or iv.library != library for iv in self.table.intervals)


def _dims(workload: WorkloadSpec) -> tuple[int, int]:
    return workload.dims["N"], workload.dims["K"]


def measure_call_overhead(kernel: UKernel, repeat: int = 200) -> float:
    """Seconds one extra piece costs beyond its kernel time: the Python call, DLPack wrapping, the FFI hop."""
    spec = kernel.spec
    x, out = aligned_empty((spec.mt, spec.K)), aligned_empty((spec.mt, spec.N))
    x[...] = 0.0
    w = kernel.pack_weight(np.zeros((spec.N, spec.K), np.float32))
    bias = kernel.pack_bias(np.zeros(spec.N, np.float32)) if spec.bias else None
    kernel(x, w, out, bias)
    start = time.perf_counter()
    for _ in range(repeat):
        kernel(x, w, out, bias)
    python_path = (time.perf_counter() - start) / repeat
    return max(0.0, python_path - kernel.time(spec.mt, repeat=3, min_repeat_ms=5))


def time_dispatcher(dispatcher: Dispatcher, N: int, K: int, S: int, seed: int = 0, min_seconds: float = 0.02) -> float:
    """Median seconds per call of the dispatcher at S rows, as an inference host calls it (with the layer's
    bias when its epilogue adds one)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((S, K), dtype=np.float32)
    w = rng.standard_normal((N, K), dtype=np.float32)
    bias = _bias(dispatcher.epilogue, N, rng)
    out = aligned_empty((S, N))
    dispatcher(x, w, out, bias=bias)
    return median_call(lambda: dispatcher(x, w, out, bias=bias), min_seconds)


def _bias(epilogue: Epilogue, N: int, rng: np.random.Generator) -> np.ndarray | None:
    return rng.standard_normal(N, dtype=np.float32) if epilogue.bias else None


# After a call, each library's idle worker threads busy-wait before they sleep: TVM's about 1 ms and OpenBLAS's
# about 25 µs (as kernelfleet.runtime configures them), PyTorch's OpenMP workers about 3.5 ms at their defaults
# (3.4 ms of CPU after one `linear` on this 2-core machine). A block timed inside that window shares its cores
# with them and reads slow; alternating libraries, that bias favoured whichever library ran after the
# short-spinning ones. A block on another library than the previous block's starts after this pause.
SETTLE_S = 0.005


def settle() -> None:
    """Wait until the previous library's spinning threads are asleep (SETTLE_S)."""
    time.sleep(SETTLE_S)


# A call at least this long is timed once per block: the paired rounds give the median (route_stats), and at large
# M three calls a block made the vendor timing most of a job's time (issue 31 item 4).
LONG_CALL_S = 0.02


def median_call(
    fn: Callable[[], object],
    min_seconds: float,
    min_samples: int = 5,
    *,
    settled: bool = False,
    long_call_s: float | None = None,
) -> float:
    """Median seconds per call over at least `min_samples` calls and `min_seconds`; with `settled`, after `settle()`
    and one untimed call (which wakes this library's threads), and one timed call only where that call took
    `long_call_s` or more."""
    if settled:
        settle()
        start = time.perf_counter()
        fn()
        if long_call_s is not None and time.perf_counter() - start >= long_call_s:
            min_samples = 1
    samples: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(samples) < min_samples or (time.perf_counter() < deadline and len(samples) < 1000):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_point(
    dispatcher: Dispatcher,
    N: int,
    K: int,
    S: int,
    seed: int = 0,
    rounds: int = MIN_ROUNDS,
    min_seconds: float = 0.002,
    libraries: Sequence[str] | None = None,
    sequential: bool = True,
) -> PointTiming:
    """The dispatcher and every vendor library (`libraries`, default: every one this worker has) at S rows, in
    `rounds` paired rounds, all called as an inference host calls them (`d(x, w, bias=b)`; each library's
    `kernelfleet.vendor.dense_call`, the call a vendor route makes); each side of a round is the median of at
    least 3 calls and `min_seconds`, after the previous library's spinning threads are asleep (`settle`). With
    `sequential`, a shape that looks like a uKernel win gets the rounds a confirmed one needs (route_stats)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((S, K), dtype=np.float32)
    w = rng.standard_normal((N, K), dtype=np.float32)
    epilogue = dispatcher.epilogue
    bias = _bias(epilogue, N, rng)
    dispatcher.prepare(w)
    calls = {lib: vendor.dense_call(lib, epilogue) for lib in (libraries or vendor.available())}
    return paired_rounds(
        lambda: dispatcher(x, w, bias=bias),
        {lib: functools.partial(call, x, w, bias) for lib, call in calls.items()},
        rounds,
        min_seconds,
        sequential=sequential,
    )


_POOLS_STARTED: set[str] = set()  # the sides that have run in this process (their thread pools exist)


def paired_rounds(
    ours: Callable[[], object],
    libraries: Mapping[str, Callable[[], object]],
    rounds: int = MIN_ROUNDS,
    min_seconds: float = 0.002,
    *,
    sequential: bool = True,
) -> PointTiming:
    """`rounds` rounds of our call and each library's, each block a `median_call` after the previous block's
    threads are asleep; with `sequential`, more rounds while the route rule asks for them (route_stats).

    Which side runs first alternates round by round: the block that starts a round pays whatever the pause before it
    cost, and a fixed order charged that to the uKernels every round, a bias toward the libraries the sign test
    cannot see (AMD EPYC Zen 4, 2 cores: the uKernels timed at their one-thread speed for whole stretches of a job
    while PyTorch ran at its two-thread one). What the pause cost there: Linux put this thread and TVM's worker on
    one core after it; the rounds run with this thread and the others on separate cores (`cores.apart`), once each
    side has run here, so that their pools exist before."""

    def block(fn: Callable[[], object]) -> float:
        return median_call(fn, min_seconds, 3, settled=True, long_call_s=LONG_CALL_S)

    def one_round(ours_first: bool) -> tuple[float, dict[str, float]]:
        if ours_first:
            mine = block(ours)
            return mine, {lib: block(fn) for lib, fn in libraries.items()}
        theirs = {lib: block(fn) for lib, fn in libraries.items()}
        return block(ours), theirs

    def timed(n: int, first_round: int) -> PointTiming:  # the order keeps alternating from the rounds taken so far
        samples = [one_round((first_round + i) % 2 == 0) for i in range(n)]
        return PointTiming(tuple(o for o, _ in samples), {lib: tuple(t[lib] for _, t in samples) for lib in libraries})

    for name, fn in (("ours", ours), *libraries.items()):
        if name not in _POOLS_STARTED:  # a pool started inside `apart` would keep this thread's core
            fn()
            _POOLS_STARTED.add(name)
    with apart():
        timing = timed(rounds, 0)
        while sequential and timing.needs_more_rounds:
            timing = timing.merged(timed(max(1, CONFIRM_ROUNDS - timing.rounds), timing.rounds))
    return timing


def time_against_vendor(dispatcher: Dispatcher, N: int, K: int, S: int, seed: int = 0) -> tuple[float, float]:
    """(dispatcher, fastest vendor library) median seconds per call at S rows over `time_point`'s rounds."""
    t = time_point(dispatcher, N, K, S, seed, sequential=False)
    return t.ours_s, t.vendor_s


class UKernelTuner:
    name = "ukernel"

    def tune(self, task: RangeTask, sink: RangeSink) -> RangeOutcome:
        began = time.perf_counter()
        if not 1 <= task.s_max <= MAX_S:
            raise ValueError(f"s_max must be in 1..{MAX_S}, got {task.s_max}")
        w = task.workload
        if w.op != "dense" or w.symbolic != ["M"] or w.dtype != "float32":
            raise ValueError("uKernels tune float32 dense layers (any bias and activation) over one dynamic M")
        epilogue = Epilogue.of_attrs(w.attrs)  # fused into every uKernel's store; the vendor runs it in numpy
        N, K = _dims(task.workload)
        hw = task.hardware or HardwareModel.from_host()
        proposals = dense_candidates(
            hw,
            N,
            K,
            representative_m=task.representative_m,
            top_k=min(task.max_ukernels, MAX_UKERNELS),
            distinct_mt=True,
        )
        if not proposals:
            raise ValueError(f"no uKernel tile passes the hardware rules for N={N}, K={K} on {hw.name}")
        from service.tuning.platforms import tvm_target  # here: GPU hosts import this module without pydantic

        target = tvm_target(task.target)
        kernels: dict[str, UKernel] = {}
        artifacts: dict[str, UKernelArtifact] = {}
        costs: list[TileCost] = []
        candidates: list[dict[str, Any]] = []
        errors = 0
        for c in proposals:
            if sink.should_stop():
                raise TuningStopped("stopped by the job")
            uid = f"mt{c.mt}_nt{c.nt}_kt{c.kt}"
            record: dict[str, Any] = {"id": uid, "tile": list(c.tile), "score": c.score, "reasons": list(c.reasons)}
            candidates.append(record)
            earlier = task.measured_before.get(uid)
            try:
                kernel = build_ukernel(N, K, c.mt, c.nt, c.kt, target, epilogue=epilogue)
                if earlier:
                    cost = TileCost.from_measurements(uid, c.mt, {int(m): sec for m, sec in earlier.items()})
                    record["resumed"] = True
                else:
                    timer = functools.partial(kernel.time, repeat=3, min_repeat_ms=task.min_repeat_ms)
                    cost = TileCost.measure(uid, c.mt, timer, sample_ms(c.mt, task.s_max, task.measure_points))
            except Exception as exc:  # a tile the compiler rejects is recorded, the others go on
                errors += 1
                record["error"] = f"{type(exc).__name__}: {exc}"
                sink.on_ukernel(record)
                continue
            record["measured"] = {str(t * c.mt): s for t, s in zip(cost.tiles, cost.seconds, strict=True)}
            if not earlier:
                sink.on_ukernel(record)
            kernels[uid] = kernel
            costs.append(cost)
            artifacts[uid] = kernel.export(task.work_dir / "artifacts")
        if not costs:
            raise RuntimeError(f"all {len(proposals)} uKernels failed to build or run")

        overhead = statistics.median(measure_call_overhead(k) for k in kernels.values())
        programs = combine(costs, task.s_max, piece_overhead_s=overhead, rel_tie=NOISE_TIE)
        used = {p.ukernel_id for prog in programs for p in prog.pieces}
        # ship only the uKernels some program uses
        costs = [c for c in costs if c.ukernel_id in used]
        kernels = {uid: k for uid, k in kernels.items() if uid in used}
        artifacts = {uid: a for uid, a in artifacts.items() if uid in used}
        programs = combine(
            costs, task.s_max, piece_overhead_s=overhead, rel_tie=NOISE_TIE
        )  # same programs, unused ids gone
        predicted = [prog.cost for prog in programs]

        # the tuned programs against the vendor as the SDK calls both; the vendor keeps every S it wins
        tuned_table = dispatch_table(programs, epilogue=epilogue)
        tuned = Dispatcher(tuned_table, kernels, N=N, K=K)

        def against_vendor(S: int) -> PointTiming:
            if sink.should_stop():
                raise TuningStopped("stopped by the job")
            return time_point(tuned, N, K, S, libraries=task.vendor_libraries)

        def confirm(S: int, timing: PointTiming) -> PointTiming:  # a route boundary or a lone decision: more rounds
            if sink.should_stop():
                raise TuningStopped("stopped by the job")
            return timing.merged(time_point(tuned, N, K, S, seed=1, sequential=False, libraries=task.vendor_libraries))

        decided_by: dict[str, int] = {}
        confirmed: tuple[int, ...] = ()
        if task.vendor_routes:  # a geometric grid, crossings bisected, the calibrated DP cost in between
            decision = decide(task.s_max, predicted, against_vendor, must=task.validate, confirm=confirm)
            sweep, decided_by, confirmed = decision.timed, decision.decided_by, decision.confirmed
            routes = fastest_libraries(decision.vendor, {S: {t.library: t.vendor_s} for S, t in sweep.items()})
        else:
            sweep, routes = {S: against_vendor(S) for S in task.validate}, {}
        table = dispatch_table(programs, routes, epilogue=epilogue)
        measured_kernels = kernels  # the models' rankings are checked on every uKernel the DP used
        kernels = {uid: k for uid, k in kernels.items() if uid in table.mts}
        artifacts = {uid: a for uid, a in artifacts.items() if uid in table.mts}
        dispatcher = Dispatcher(table, kernels, N=N, K=K)
        validation = self._validate(task, hw, measured_kernels, costs, dispatcher, predicted, sink, sweep)
        validation["piece_overhead_s"] = overhead
        validation["vendor_routes"] = {
            "vendor": "the fastest of numpy x @ w.T and PyTorch linear"
            + ("" if epilogue.trivial else f", then {epilogue.describe()}"),
            "libraries": sorted({lib for t in sweep.values() for lib in t.libraries}),
            "shapes_timed": len(sweep),
            "vendor_S": len(routes),
            "vendor_S_by_library": dict(Counter(routes.values())),
            "intervals": [[iv.lo, iv.hi, iv.library] for iv in table.intervals if iv.vendor],
            "rule": describe_rule(),
            "timed_s": {
                str(S): {
                    "tuned": t.ours_s,
                    "vendor": t.vendor_s,
                    **{lib: statistics.median(times) for lib, times in t.libraries.items()},
                    **t.to_dict(),
                }
                for S, t in sorted(sweep.items())
            },
            "decided_by": decided_by,
            "confirmed_S": list(confirmed),
        }
        measured = {int(s): v["chosen_measured_s"] for s, v in validation["shapes"].items()}
        return RangeOutcome(
            table=table,
            kernels=kernels,
            artifacts=artifacts,
            predicted_s=predicted,
            measured_s=measured,
            validation=validation,
            candidates=candidates,
            errors=errors,
            seconds=time.perf_counter() - began,
            hardware=hw.to_dict(),
        )

    @staticmethod
    def _validate(
        task: RangeTask,
        hw: HardwareModel,
        kernels: dict[str, UKernel],
        costs: list[TileCost],
        dispatcher: Dispatcher,
        predicted: list[float],
        sink: RangeSink,
        sweep: Mapping[int, PointTiming],
    ) -> dict[str, Any]:
        """Measure every uKernel alone and the chosen route at the heaviest shapes; rank correlations."""
        N, K = _dims(task.workload)
        shapes: dict[str, Any] = {}
        rho_dc: list[float] = []
        rho_sia: list[float] = []
        for S in task.validate:
            if sink.should_stop():
                raise TuningStopped("stopped by the job")
            measured, dietcode, sia = {}, {}, {}
            sia_scores = dict(rank_sia([(k.spec.mt, k.spec.nt) for k in kernels.values()], S, N, K, hw.cores))
            for cost in costs:
                spec = kernels[cost.ukernel_id].spec
                m0 = cost.tiles[-1] * spec.mt
                f_mk = f_mk_from_measurement(cost.seconds[-1], m0, spec.mt, spec.nt, N, hw.cores)
                dietcode[cost.ukernel_id] = dietcode_predict(f_mk, S, spec.mt, spec.nt, N, hw.cores)
                sia[cost.ukernel_id] = sia_scores[(spec.mt, spec.nt)]
                measured[cost.ukernel_id] = kernels[cost.ukernel_id].time(S, repeat=3, min_repeat_ms=task.min_repeat_ms)
            ids = list(measured)
            tuned_s, vendor_s = (
                (sweep[S].ours_s, sweep[S].vendor_s) if S in sweep else time_against_vendor(dispatcher, N, K, S)
            )
            on_vendor = dispatcher.table is not None and dispatcher.table.vendor_at(S)
            entry: dict[str, Any] = {
                "measured_s": measured,
                "dietcode_s": dietcode,
                "sia_score": sia,
                "route": "vendor" if on_vendor else "ukernel",
                "chosen": [[p.ukernel_id, p.rows] for p in dispatcher.program(S)],
                "chosen_measured_s": time_dispatcher(dispatcher, N, K, S),
                "chosen_predicted_s": predicted[S - 1],
                "tuned_measured_s": tuned_s,  # the tuned program, alternating with the vendor
                "vendor_measured_s": vendor_s,
            }
            if len(ids) >= 2:
                entry["rho_dietcode"] = spearman([dietcode[i] for i in ids], [measured[i] for i in ids])
                entry["rho_sia"] = spearman([-sia[i] for i in ids], [measured[i] for i in ids])
                rho_dc += [entry["rho_dietcode"]] if not math.isnan(entry["rho_dietcode"]) else []
                rho_sia += [entry["rho_sia"]] if not math.isnan(entry["rho_sia"]) else []
            shapes[str(S)] = entry
            sink.on_validated(S, len(ids) + 1)
        return {
            "shapes": shapes,
            "rho_dietcode_mean": statistics.fmean(rho_dc) if rho_dc else None,
            "rho_sia_mean": statistics.fmean(rho_sia) if rho_sia else None,
        }
