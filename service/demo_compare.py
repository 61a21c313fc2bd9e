"""The demo's one results table: what the SDK runs per shape, timed side by side with numpy and PyTorch.

Why it is built this way (issue 31 item 5): the demo used to label every shape without uKernels "numpy (vendor
route)" although its table routed most of them to PyTorch, compared with numpy only, timed the dispatcher and numpy
in separate loops on a shared 2-core machine (one shape's dispatcher time moved 1.7–5.7 ms between repeats), and
printed the job's own timings (taken on the worker) next to its own in a second table that disagreed with it.

Here the label is what the dispatcher really calls for that shape (`route`: the uKernels' program, an exact-shape
kernel, or the library of a vendor route), and the baseline is every vendor library this process has, called as a
user would (kernelfleet.vendor.dense: numpy's `x @ w.T` + epilogue, PyTorch's `linear`). All of them run in
interleaved rounds (`interleaved`), so load that comes and goes hits every contender alike; the ratio is the
faster library's median over the subject's, with the min–max of the same ratio per round as its spread. Where
the table routes a shape to a library, the dispatcher calls that library: about 1× is the honest result there.
"""

from __future__ import annotations

import functools
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.table import Table

from kernelfleet import vendor
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from kernelfleet.runtime import usable_cores
from service.tuning.hardware import parse_cpuinfo

NAMES = {vendor.NUMPY: "numpy", vendor.TORCH: "PyTorch"}
SUBJECT = "dispatcher"
ROUNDS = 40
WIDTH = 160  # the table's width when the output is a file or a pipe (rich assumes 80 there and squeezes it)
MIN_SAMPLE_S = 0.002  # back-to-back calls per sample, so that a sample of a µs-scale call is not timer noise
# Before each sample: long enough for the previous library's worker threads to stop spinning (TVM's ~1 ms,
# OpenBLAS's ~25 µs under the SDK's settings, PyTorch's OpenMP default spin), so no contender pays for another's.
PAUSE_S = 0.005


@dataclass(frozen=True)
class Route:
    """What runs a shape: `label` says it; `library` is the vendor library called for it (None: tuned kernels)."""

    label: str
    library: str | None


def dispatcher_route(d: Dispatcher, S: int) -> Route:
    """What the dispatcher runs for S rows, named truthfully (the library a route names may be absent here)."""
    if d.table is None:
        library = vendor.runnable(d.library(S))
        return Route(f"{NAMES[library]} (no table: fallback)", library)
    routed = d.vendor_route(S)
    if routed is not None:
        library = vendor.runnable(routed)
        absent = "" if library == routed else f" (the table names {NAMES[routed]}, absent here)"
        return Route(f"{NAMES[library]} (vendor route){absent}", library)
    pieces = d.program(S)
    if not pieces:
        return Route("exact-shape kernel (TVM)", None)
    return Route("uKernels " + " + ".join(f"{p.rows}@mt{d.kernels[p.ukernel_id].spec.mt}" for p in pieces), None)


def _calls_per_sample(fn: Callable[[], object], min_sample_s: float) -> int:
    fn()  # the first call may build or pack
    t0 = time.perf_counter()
    fn()
    once = max(time.perf_counter() - t0, 1e-9)
    return max(1, min(4096, math.ceil(min_sample_s / once)))


def interleaved(
    contenders: Mapping[str, Callable[[], object]],
    rounds: int = ROUNDS,
    min_sample_s: float = MIN_SAMPLE_S,
    pause_s: float = PAUSE_S,
) -> dict[str, list[float]]:
    """Seconds per call of each contender, one sample per round: A B C, then B C A, … (each round starts one
    later, so none always runs right after the same other one). A sample is one untimed call (it wakes the
    library's threads, as back-to-back calls find them) and then enough timed calls to last `min_sample_s`."""
    names = list(contenders)
    number = {n: _calls_per_sample(contenders[n], min_sample_s) for n in names}
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            fn, k = contenders[name], number[name]
            time.sleep(pause_s)
            fn()
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            samples[name].append((time.perf_counter() - t0) / k)
    return samples


@dataclass(frozen=True)
class Comparison:
    subject_s: float  # median seconds per call
    vendors_s: dict[str, float]  # library → its median
    faster: str  # the library with the lower median
    ratio: float  # vendors_s[faster] / subject_s: above 1 the subject is faster
    spread: tuple[float, float]  # min and max of that ratio per round
    rounds: int

    @classmethod
    def of(cls, samples: Mapping[str, Sequence[float]], subject: str = SUBJECT) -> Comparison:
        """From interleaved samples: the subject's, and one list per vendor library (round r at index r)."""
        ours = samples[subject]
        vendors = {lib: statistics.median(s) for lib, s in samples.items() if lib != subject}
        faster = min(vendors, key=lambda lib: vendors[lib])
        per_round = [theirs / mine for theirs, mine in zip(samples[faster], ours, strict=True)]
        subject_s = statistics.median(ours)
        ratio = vendors[faster] / subject_s
        return cls(subject_s, vendors, faster, ratio, (min(per_round), max(per_round)), len(per_round))


def compare(
    run: Callable[[np.ndarray, np.ndarray], object],
    x: np.ndarray,
    w: np.ndarray,
    epilogue: Epilogue,
    bias: np.ndarray | None = None,
    rounds: int = ROUNDS,
    min_sample_s: float = MIN_SAMPLE_S,
    pause_s: float = PAUSE_S,
) -> Comparison:
    """`run(x, w)` against every vendor library this process has, on the same arrays, interleaved."""
    contenders: dict[str, Callable[[], object]] = {SUBJECT: functools.partial(run, x, w)}
    for lib in vendor.available():  # each library's call resolved once, as a vendor route makes it
        contenders[lib] = functools.partial(vendor.dense_call(lib, epilogue), x, w, bias if epilogue.bias else None)
    return Comparison.of(interleaved(contenders, rounds, min_sample_s, pause_s))


@dataclass(frozen=True)
class Row:
    M: int
    weight: float | None  # its share of the distribution's calls; None: a shape the distribution never sends
    route: Route
    result: Comparison


def results_table(rows: Sequence[Row], title: str) -> Table:
    libraries = list(rows[0].result.vendors_s) if rows else []
    table = Table(title=title)
    # in a narrow terminal a cell folds onto more lines rather than lose its end to an ellipsis
    for col in ("M", "weight", "runs", "dispatcher (µs)", *(f"{NAMES[lib]} (µs)" for lib in libraries)):
        table.add_column(col, justify="left" if col == "runs" else "right", overflow="fold")
    table.add_column("faster vendor / dispatcher", justify="right", overflow="fold")
    table.add_column("per round, min–max", justify="right", overflow="fold")
    for row in rows:
        c = row.result
        table.add_row(
            str(row.M),
            "-" if row.weight is None else f"{row.weight:.2f}",
            row.route.label,
            f"{c.subject_s * 1e6:.1f}",
            *(f"{c.vendors_s[lib] * 1e6:.1f}" for lib in libraries),
            f"{c.ratio:.2f}× vs {NAMES[c.faster]}",
            f"{c.spread[0]:.2f}–{c.spread[1]:.2f}×",
        )
    return table


def notes(rows: Sequence[Row]) -> list[str]:
    """How to read the table, and what it does not show."""
    rounds = "/".join(sorted({str(row.result.rounds) for row in rows}))
    out = [
        f"each column is a median over {rounds} interleaved rounds (dispatcher and each library in turn, same "
        "arrays); above 1× the dispatcher is faster than the faster library; the spread is that ratio per round"
    ]
    routed: dict[str, list[int]] = {}
    for row in rows:
        if row.route.library is not None:
            routed.setdefault(row.route.library, []).append(row.M)
    for lib, ms in routed.items():
        out.append(
            f"M = {', '.join(map(str, ms))}: the dispatcher calls {NAMES[lib]} itself (the job measured it fastest "
            f"there), so about 1× is the expected result, not a KernelFleet win; below 1× where the other library "
            "is faster on this machine than on the worker"
        )
    tuned = [row.M for row in rows if row.route.library is None]
    if tuned:
        out.append(f"M = {', '.join(map(str, tuned))}: KernelFleet's own kernels against the faster library")
    return out


def machine(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU model and the threads each library computes with: what the table's numbers hold for."""
    try:
        model = parse_cpuinfo(cpuinfo.read_text())[1]
    except OSError:
        model = "unknown CPU"
    threads = [f"TVM (uKernels): {os.environ.get('TVM_NUM_THREADS', 'its default')}", _numpy_threads()]
    if vendor.TORCH in vendor.available():
        threads.append(_torch_threads())
    return f"{model}, {usable_cores()} usable cores of {os.cpu_count()}; threads: " + ", ".join(threads)


def _numpy_threads() -> str:
    from threadpoolctl import threadpool_info

    blas = next((i for i in threadpool_info() if i.get("user_api") == "blas"), None)
    if blas is None:
        return f"numpy {np.__version__}: no BLAS thread pool found"
    return f"numpy {np.__version__} ({blas.get('internal_api')} {blas.get('version')}): {blas.get('num_threads')}"


def _torch_threads() -> str:
    import torch

    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return f"PyTorch {torch.__version__} ({blas.group(1) if blas else 'BLAS unknown'}): {torch.get_num_threads()}"
