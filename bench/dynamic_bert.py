"""The dynamic-shape `ukernel` tuner on BERT-base, batch 1, sequence length T = 1..128.

Dense layers Y[T, N] = X[T, K]·W[N, K]ᵀ: QKV (K=768, N=2304), attention output (768, 768), FFN up
(768, 3072) and FFN down (3072, 768), plus `odd` (K=999, N=1000), a layer whose dims are not
multiples of the vector width (vocabulary projections, pruned layers: N is padded inside the uKernels).
Contenders per layer and T:

- `ukernel`: the SDK `Dispatcher` over the dispatch table and uKernels of ONE `UKernelTuner.tune`
  job per layer covering T = 1..128, called as a user calls it: `d(x, w)` with plain numpy arrays
  (X as numpy allocates it, so usually not 64-byte aligned: the dispatcher's copy counts), out=None.
  The table routes the T where the job measured numpy faster to numpy (`vendor` intervals), so at
  those T this contender is the dispatcher calling numpy.
- `numpy` (`x @ w.T`, OpenBLAS) and `torch` (`F.linear`, CPU); "vendor" is the faster of the two at
  each T.
- `ms_pad128`: one MetaSchedule kernel tuned for T=128 (`--trials`), used at every T by copying X into
  a zero-padded 128-row buffer (the copy is timed) and returning the first T rows of the output.
- `ms_exact`: a MetaSchedule kernel tuned for exactly that T (`--trials`), at the sampled T only
  (`--ms-shapes`). The T=128 run is the one `ms_pad128` uses: one run, not two.

The attention batch_matmul [12,T,64]·[12,64,T] is measured with numpy and torch only: its second
dimension is dynamic too, and the `ukernel` tuner does not cover it.

Phase 1 (tune) runs in a child process with torch hidden (as in sketch_vs_vendor.py), so that the
MetaSchedule tuning times are the service's. The uKernel tuning time is the job's own `out.seconds`;
per-shape MetaSchedule tuning over all 128 shapes is extrapolated from the mean of the sampled runs.
Phase 2 (measure) loads the exported uKernels as an inference host would, builds the MetaSchedule
configs with `kernelfleet.tvm_kernel.build_kernel`, checks every output against numpy and times the
contenders in interleaved rounds (medians), with no waits between libraries: the SDK's thread settings
(kernelfleet.runtime, applied before numpy loads) keep TVM's and OpenBLAS's idle threads off the cores
(bench/contention.py measures that). `--settle` restores the old wait for torch's and the others'
spinning threads before a sample on another library's threads (`common.wait_for_quiet`).

    .venv-bench/bin/python bench/dynamic_bert.py                      # everything (about an hour on 2 cores)
    .venv-bench/bin/python bench/dynamic_bert.py --quick --out /tmp/dynamic_bert_quick.json   # smoke run
    .venv-bench/bin/python bench/dynamic_bert.py --measure-only       # re-measure the saved tuning results
    .venv-bench/bin/python bench/dynamic_bert.py --no-ms --layers attn_out,odd --out /tmp/db.json  # ukernel vs vendor
"""

from __future__ import annotations

import os
import sys

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)
    import kernelfleet  # noqa: F401  (its thread settings must precede numpy: kernelfleet.runtime)

import argparse
import contextlib
import importlib
import json
import logging
import math
import shlex
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    CheckpointSink,
    Contender,
    OtherLoad,
    blas_info,
    calibrate,
    cores,
    environment_lines,
    host_info,
    is_tuning_child,
    max_abs_errors,
    other_load_line,
    python_sampler,
    quiet_metaschedule,
    run_rounds,
    run_tuning_child,
    set_tvm_threads,
    set_vendor_threads,
    torch_hidden,
    torch_info,
    us,
    vendor_contenders,
    warm_up_tuner,
    write_json,
)

from kernelfleet.dispatch import DispatchTable
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.tvm_kernel import Kernel, build_kernel
from kernelfleet.tvm_runtime import aligned_empty, import_tvm
from kernelfleet.ukernel import UKernel, UKernelSpec, load_ukernel
from service.models import WorkloadSpec
from service.tuning.compute import tolerance
from service.tuning.hardware import host_target
from service.tuning.tuners.sketch import SketchTask, SketchTuner

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "dynamic_bert.json"
S_MAX = 128  # the range one ukernel job covers, and the largest T measured
VALIDATE = (128, 97, 61, 16, 1)  # the shapes the ukernel job validates its choices at
PAD_M = 128  # the M the padded MetaSchedule kernel is tuned for
HEADS, HEAD_DIM = 12, 64
LAYERS: dict[str, tuple[int, int]] = {  # name -> (K, N) of the dense layer
    "qkv": (768, 2304),
    "attn_out": (768, 768),
    "ffn_up": (768, 3072),
    "ffn_down": (3072, 768),
    "odd": (999, 1000),  # no 16-lane nt divides N=1000: the uKernels pad N; K=999 = 3³·37
}
BMM = "attn_bmm"  # Q·Kᵀ of the attention, [12,T,64]·[12,64,T]: not covered by the ukernel tuner
ALL_LAYERS = (*LAYERS, BMM)
GOALS: dict[str, tuple[str, float, str]] = {  # key -> (comparison, target, unit): what the tuner aims at
    "speedup_vs_vendor_geomean": ("≥", 1.3, "×"),
    "speedup_vs_per_shape_ms_geomean": ("≥", 1.0, "×"),
    "worst_speedup_vs_vendor": ("≥", 0.9, "×"),
    "worst_speedup_vs_numpy": ("≥", 0.95, "×"),
    "tuning_cost_ratio": ("≥", 100.0, "×"),
    "dispatch_program_ns_max": ("≤", 5000.0, " ns"),
}
FULL = {"layers": ",".join(ALL_LAYERS), "shapes": f"1-{S_MAX}", "ms_shapes": "1,16,61,97,128", "trials": 64}
FULL_TIMING = {"rounds": 7, "min_sample_ms": 10.0, "pause_ms": 0.0}
QUICK = {"layers": f"attn_out,{BMM}", "shapes": "1,16,61", "ms_shapes": "1,16,61", "trials": 8}
QUICK_TIMING = {"rounds": 3, "min_sample_ms": 5.0, "pause_ms": 0.0}


def dense_workload(K: int, N: int) -> WorkloadSpec:
    return WorkloadSpec(op="dense", dims={"N": N, "K": K}, symbolic=["M"])


def bmm_workload() -> WorkloadSpec:
    return WorkloadSpec(op="batch_matmul", dims={"B": HEADS, "N": S_MAX, "K": HEAD_DIM}, symbolic=["M"])


def geomean(values: Sequence[float]) -> float | None:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


# ------------------------------------------------------------------------------------------------
# Phase 1: tune (child process, torch hidden)
# ------------------------------------------------------------------------------------------------


class ValidationSink:
    """RangeSink: prints the job's validation progress."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.started = time.perf_counter()

    def on_ukernel(self, record: dict[str, Any]) -> None:
        pass

    def on_validated(self, S: int, measured: int) -> None:
        elapsed = time.perf_counter() - self.started
        print(f"  {self.label}: validated S={S} ({measured} programs measured), {elapsed:.1f} s", flush=True)

    def should_stop(self) -> bool:
        return False


def tune_ukernel(name: str, K: int, N: int, args: argparse.Namespace) -> dict[str, Any]:
    from service.tuning.tuners.ukernel.tuner import RangeTask, UKernelTuner

    task = RangeTask(
        dense_workload(K, N),
        s_max=S_MAX,
        validate=list(VALIDATE),
        target=host_target(),
        max_ukernels=args.max_ukernels,
        work_dir=args.artifacts_dir / name,
        vendor_routes=not args.no_vendor_routes,
    )
    started = time.perf_counter()
    out = UKernelTuner().tune(task, ValidationSink(f"{name} ukernel"))
    wall = time.perf_counter() - started
    return {
        "seconds": out.seconds,  # the job's own account
        "wall_s": wall,
        "padding_ratio": out.padding_ratio,
        "table": out.table.to_dict(),
        "intervals": len(out.table.intervals),
        "artifacts": {
            uid: {"path": str(a.path), "sha256": a.sha256, "spec": a.spec.to_dict()} for uid, a in out.artifacts.items()
        },
        "validation": out.validation,
        "predicted_s": out.predicted_s,
        "measured_s": {str(s): v for s, v in out.measured_s.items()},
        "candidates": out.candidates,
        "errors": out.errors,
        "hardware": out.hardware,
    }


def tune_ms(name: str, K: int, N: int, T: int, args: argparse.Namespace) -> dict[str, Any]:
    sink = CheckpointSink(checkpoint=args.trials, label=f"{name} MS T={T}")
    with tempfile.TemporaryDirectory(prefix=f"kf-bench-{name}-T{T}-") as tmp:
        task = SketchTask(dense_workload(K, N), {"M": T}, host_target(), args.trials, Path(tmp), seed=args.seed)
        if not args.verbose:
            quiet_metaschedule()
        sink.started = time.perf_counter()
        outcome = SketchTuner().tune(task, sink)
    return {
        "T": T,
        "tuning_s": time.perf_counter() - sink.started,
        "measured": outcome.measured,
        "errors": outcome.errors,
        "tuner_latency_s": outcome.best_latency_s,
        "config": outcome.best_config,
    }


def ms_tuning_shapes(args: argparse.Namespace) -> list[int]:
    return [] if args.no_ms else sorted({*args.ms_shapes, PAD_M})


def run_tuning(args: argparse.Namespace) -> None:
    data: dict[str, Any] = {
        "benchmark": "dynamic_bert",
        "s_max": S_MAX,
        "validate": list(VALIDATE),
        "trials": args.trials,
        "seed": args.seed,
        "max_ukernels": args.max_ukernels,
        "ms_shapes": ms_tuning_shapes(args),
        "pad_m": PAD_M,
        "quick": args.quick,
        "tuning_environment": {**host_info(), "torch_hidden": torch_hidden()},
        "layers": {},
    }
    env = data["tuning_environment"]
    data["warmup_s"] = 0.0 if args.no_ms else warm_up_tuner()  # the warm-up is MetaSchedule's
    dense = [name for name in args.layers if name in LAYERS]
    print(
        f"phase 1: tuning {', '.join(dense) or 'nothing'} on {env['tvm_target_str']}: one ukernel job (T=1..{S_MAX}) "
        f"and MetaSchedule at T={data['ms_shapes']} ({args.trials} trials each) per layer; torch imported in the "
        f"tuning process: {env['torch_imported']}; one-time warm-up (not counted) {data['warmup_s']:.1f} s",
        flush=True,
    )
    for name in dense:
        K, N = LAYERS[name]
        entry: dict[str, Any] = {"K": K, "N": N, "ms": {}}
        data["layers"][name] = entry
        entry["ukernel"] = tune_ukernel(name, K, N, args)
        uk = entry["ukernel"]
        print(
            f"  {name}: ukernel job {uk['seconds']:.1f} s, {len(uk['artifacts'])} uKernels, {uk['intervals']} "
            f"intervals, padding ratio {uk['padding_ratio']:.3f}",
            flush=True,
        )
        write_json(args.out, data)
        for T in data["ms_shapes"]:
            entry["ms"][str(T)] = row = tune_ms(name, K, N, T, args)
            print(f"  {name} MS T={T}: {row['measured']} measured, {row['tuning_s']:.1f} s", flush=True)
            write_json(args.out, data)
    print(f"wrote {args.out}", flush=True)


# ------------------------------------------------------------------------------------------------
# Phase 2: measure
# ------------------------------------------------------------------------------------------------


def load_dispatcher(uk: dict[str, Any], N: int, K: int) -> tuple[Dispatcher, str]:
    """The dispatcher as an inference host builds it: exported uKernels (sha256-checked) + the table.
    Without the artifacts (--measure-only after a run without --artifacts-dir) the uKernels are compiled
    again from their specs."""
    kernels: dict[str, UKernel] = {}
    source = "loaded from the exported artifacts (sha256-checked)"
    for uid, art in uk["artifacts"].items():
        spec = UKernelSpec.from_dict(art["spec"])
        path = Path(art["path"])
        if path.exists():
            kernels[uid] = load_ukernel(path, spec, art["sha256"])
            continue
        from service.tuning.tuners.ukernel.kernel import build_ukernel

        kernels[uid] = build_ukernel(spec.N, spec.K, spec.mt, spec.nt, spec.kt, spec.target, spec.vec, spec.dtype)
        source = "recompiled from their specs (the exported artifacts are gone)"
    return Dispatcher(DispatchTable.from_dict(uk["table"]), kernels, N=N, K=K), source


class StaticKernel:
    """A MetaSchedule kernel compiled for M = `rows`, run on T ≤ rows rows as a user would run it: X is
    copied into a zero-padded [rows, K] buffer (timed) and the first T rows of the output are returned.

    It calls the compiled function on TVM tensors made once over persistent buffers, because
    `Kernel.__call__` copies every input (the whole weight too) into fresh TVM tensors and allocates
    the output on each call, which would bill MetaSchedule for copies no user needs."""

    def __init__(self, kernel: Kernel, w: np.ndarray, rows: int) -> None:
        tvm = import_tvm()
        (x_info, w_info), y_info = kernel.inputs, kernel.output
        if x_info.shape[0] != rows or w_info.shape != w.shape:
            raise ValueError(f"kernel is for X{list(x_info.shape)} W{list(w_info.shape)}, not {rows} rows W{w.shape}")
        self.rows = rows
        self.x = aligned_empty(x_info.shape)
        self.x[...] = 0.0
        self.w = aligned_empty(w_info.shape)
        self.w[...] = w
        self.y = aligned_empty(y_info.shape)
        self._args = [tvm.runtime.from_dlpack(a) for a in (self.x, self.w, self.y)]
        self._fn = kernel._fn  # no public call on preallocated tensors (see the class docstring)
        self._dirty = 0  # rows past the current T that hold an earlier call's X

    def __call__(self, x: np.ndarray) -> np.ndarray:
        T = x.shape[0]
        self.x[:T] = x
        if self._dirty > T:
            self.x[T : self._dirty] = 0.0
        self._dirty = T
        self._fn(*self._args)
        return self.y[:T]


def dense_contenders(
    torch: Any,
    x: np.ndarray,
    w: np.ndarray,
    dispatcher: Dispatcher,
    padded: StaticKernel | None,
    exact: StaticKernel | None,
) -> list[Contender]:
    def ukernel() -> np.ndarray:
        return dispatcher(x, w)

    # the TVM contenders next to each other: run_rounds settles the threads only between libraries
    out = [Contender("ukernel", python_sampler(ukernel), ukernel, pool="tvm")]
    for name, static in (("ms_pad128", padded), ("ms_exact", exact)):
        if static is not None:
            sample = python_sampler(lambda s=static: s(x))
            out.append(Contender(name, sample, lambda s=static: s(x).copy(), pool="tvm"))
    return [*out, *vendor_contenders(torch, x, w)]


def timed(
    contenders: Sequence[Contender], expected: np.ndarray, tol: float, args: argparse.Namespace
) -> tuple[float, dict[str, Any]]:
    """Check every output, then time the contenders in interleaved rounds; (seconds settling, results)."""
    errors = max_abs_errors(contenders, expected)
    for c in contenders:
        c.number = calibrate(c.sample, args.min_sample_ms / 1e3)
    settle_s = run_rounds(contenders, args.rounds, args.pause_ms / 1e3, settle=args.settle)
    return settle_s, {
        c.name: {
            "median_s": statistics.median(c.samples_s),
            "min_s": min(c.samples_s),
            "max_s": max(c.samples_s),
            "calls_per_sample": c.number,
            "samples_s": c.samples_s,
            "max_abs_err_vs_numpy": errors[c.name],
            "ok": errors[c.name] <= tol,
        }
        for c in contenders
    }


def dispatch_overhead(dispatcher: Dispatcher, shapes: Sequence[int], number: int = 20000) -> dict[str, Any]:
    """ns per `d.program(T)` call (the per-call selection: a memo lookup after T's first call) and per
    `table.lookup(T)` (what T's first call pays: bisect over the intervals and expanding the shape)."""
    program, lookup = {}, {}
    for T in shapes:
        dispatcher.program(T)
        timer = timeit.Timer("p(T)", globals={"p": dispatcher.program, "T": T})
        program[T] = statistics.median(timer.repeat(repeat=5, number=number)) / number * 1e9
        assert dispatcher.table is not None
        timer = timeit.Timer("f(T)", globals={"f": dispatcher.table.lookup, "T": T})
        lookup[T] = statistics.median(timer.repeat(repeat=3, number=number // 10)) / (number // 10) * 1e9
    return {
        "program_ns": {str(T): v for T, v in program.items()},
        "lookup_ns": {str(T): v for T, v in lookup.items()},
        "program_ns_median": statistics.median(program.values()),
        "program_ns_max": max(program.values()),
        "lookup_ns_median": statistics.median(lookup.values()),
        "lookup_ns_max": max(lookup.values()),
    }


def program_text(dispatcher: Dispatcher, T: int) -> str:
    return program_label([[p.ukernel_id, p.rows] for p in dispatcher.program(T)])


def program_label(program: Sequence[Sequence[Any]]) -> str:
    """'48@mt48 + 13@mt13', or 'numpy' where the table routes T to the vendor."""
    return " + ".join(f"{rows}@{uid.split('_')[0]}" for uid, rows in program) or "numpy (vendor route)"


def measure_dense(torch: Any, name: str, entry: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    K, N = entry["K"], entry["N"]
    dispatcher, source = load_dispatcher(entry["ukernel"], N, K)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K), dtype=np.float32)
    dispatcher.prepare(w)
    configs = {int(T): row["config"] for T, row in entry["ms"].items() if row["config"] is not None}
    padded = StaticKernel(build_kernel(configs[PAD_M]), w, PAD_M) if PAD_M in configs else None
    exact = {T: StaticKernel(build_kernel(cfg), w, T) for T, cfg in configs.items() if T in args.shapes}
    overhead = dispatch_overhead(dispatcher, args.shapes)
    print(
        f"{name} (K={K}, N={N}): uKernels {source}; d.program(T) {overhead['program_ns_median']:.0f} ns median "
        f"(max {overhead['program_ns_max']:.0f} ns), first-call table lookup {overhead['lookup_ns_median']:.0f} ns",
        flush=True,
    )
    print(f"  {'T':>4}{'ukernel':>10}{'numpy':>10}{'torch':>10}{'pad128':>10}{'exact':>10}{'vendor/uk':>11}  program")
    rows = []
    for T in args.shapes:
        x = rng.standard_normal((T, K), dtype=np.float32)
        tol = tolerance(dense_workload(K, N), {"M": T})
        contenders = dense_contenders(torch, x, w, dispatcher, padded, exact.get(T))
        settle_s, res = timed(contenders, x @ w.T, tol, args)
        row = {
            "T": T,
            "settle_s": settle_s,
            "flop": 2 * T * N * K,
            "tolerance": tol,
            "x_aligned": x.ctypes.data % 64 == 0,
            "program": [[p.ukernel_id, p.rows] for p in dispatcher.program(T)],
            "contenders": res,
        }
        rows.append(row)
        med = {n: c["median_s"] for n, c in res.items()}
        vendor = _vendor(med)
        bad = [n for n, c in res.items() if not c["ok"]]
        print(
            f"  {T:>4}{us(med['ukernel']):>10}{us(med['numpy']):>10}{us(med.get('torch')):>10}"
            f"{us(med.get('ms_pad128')):>10}{us(med.get('ms_exact')):>10}{vendor / med['ukernel']:>11.2f}  "
            f"{program_text(dispatcher, T)}{'  WRONG OUTPUT: ' + ', '.join(bad) if bad else ''}",
            flush=True,
        )
    return {"name": name, "K": K, "N": N, "ukernel_source": source, "dispatch_overhead": overhead, "rows": rows}


def measure_bmm(torch: Any, args: argparse.Namespace) -> dict[str, Any]:
    print(f"{BMM} ([{HEADS},T,{HEAD_DIM}]·[{HEADS},{HEAD_DIM},T]): numpy and torch only, NOT covered by ukernel")
    print(f"  {'T':>4}{'numpy':>10}{'torch':>10}")
    rng = np.random.default_rng(0)
    rows = []
    for T in args.shapes:
        a = rng.standard_normal((HEADS, T, HEAD_DIM), dtype=np.float32)
        b = rng.standard_normal((HEADS, HEAD_DIM, T), dtype=np.float32)
        at, bt = (torch.from_numpy(a), torch.from_numpy(b)) if torch is not None else (None, None)

        def numpy_call(a: np.ndarray = a, b: np.ndarray = b) -> np.ndarray:
            return a @ b

        def torch_call(at: Any = at, bt: Any = bt) -> Any:
            return torch.matmul(at, bt)

        contenders = [Contender("numpy", python_sampler(numpy_call), numpy_call, pool="openblas")]
        if torch is not None:
            contenders.append(
                Contender("torch", python_sampler(torch_call), lambda f=torch_call: f().numpy(), pool="torch")
            )
        tol = tolerance(bmm_workload(), {"M": T})
        settle_s, res = timed(contenders, a @ b, tol, args)
        rows.append(
            {"T": T, "settle_s": settle_s, "flop": 2 * HEADS * T * T * HEAD_DIM, "tolerance": tol, "contenders": res}
        )
        torch_s = res["torch"]["median_s"] if "torch" in res else None
        print(f"  {T:>4}{us(res['numpy']['median_s']):>10}{us(torch_s):>10}", flush=True)
    return {"name": BMM, "covered_by_ukernel": False, "rows": rows}


def run_measurement(args: argparse.Namespace) -> dict[str, Any]:
    data = json.loads(args.out.read_text())
    # here, not at the top: the tuning child runs with torch hidden
    torch: Any = None if args.no_torch else importlib.import_module("torch")

    set_vendor_threads(torch, cores())
    env = {**host_info(), "blas": blas_info(), "torch": torch_info(torch) if torch is not None else NO_TORCH}
    print(f"phase 2: measuring; numpy and torch use {env['cores']} threads, TVM {env['tvm_threads']}")
    for line in environment_lines(env):
        print("  " + line)
    results = []
    other_load = OtherLoad()
    with torch.inference_mode() if torch is not None else contextlib.nullcontext():
        for name in args.layers:
            if name == BMM:
                results.append(measure_bmm(torch, args))
            elif name in data["layers"]:
                results.append(measure_dense(torch, name, data["layers"][name], args))
            else:
                print(f"{name}: not tuned in {args.out}, skipped")
    env["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    env["other_load"] = round(other_load.fraction(), 3)
    print(other_load_line(env))
    data["measurement"] = {
        "environment": env,
        "command": args.command,
        "rounds": args.rounds,
        "min_sample_ms": args.min_sample_ms,
        "pause_ms": args.pause_ms,
        "settle": args.settle,
        "shapes": args.shapes,
        "layers": results,
    }
    data["summary"] = summarize(data)
    write_json(args.out, data)
    return data


# ------------------------------------------------------------------------------------------------
# Summary and report
# ------------------------------------------------------------------------------------------------


def _speedups(rows: Sequence[dict[str, Any]], other: str | Callable[[dict[str, float]], float]) -> dict[int, float]:
    """T -> (other's median / ukernel's median), where `other` is measured at T."""
    out = {}
    for row in rows:
        med = {n: c["median_s"] for n, c in row["contenders"].items()}
        base = other(med) if callable(other) else med.get(other)
        if base is not None:
            out[row["T"]] = base / med["ukernel"]
    return out


def _vendor(med: dict[str, float]) -> float:
    return min(med[name] for name in ("numpy", "torch") if name in med)


NO_TORCH = {
    "version": "not loaded (--no-torch)",
    "num_threads": 0,
    "blas_info": "-",
    "mkldnn": False,
    "parallel_info": [],
}


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    layers: dict[str, Any] = {}
    all_vendor: list[tuple[str, int, float]] = []
    all_numpy: list[tuple[str, int, float]] = []
    all_exact: list[float] = []
    all_pad: list[float] = []
    uk_seconds = ms_extrapolated = 0.0
    for res in data["measurement"]["layers"]:
        if res["name"] not in LAYERS:
            continue
        name, entry = res["name"], data["layers"][res["name"]]
        vendor = _speedups(res["rows"], _vendor)
        numpy_ = _speedups(res["rows"], "numpy")
        exact = _speedups(res["rows"], "ms_exact")
        pad = _speedups(res["rows"], "ms_pad128")
        ms_runs = [r["tuning_s"] for r in entry["ms"].values()]
        ms_mean = statistics.fmean(ms_runs) if ms_runs else None
        uk = entry["ukernel"]
        worst = min(vendor, key=lambda T: vendor[T])
        worst_np = min(numpy_, key=lambda T: numpy_[T])
        layers[name] = {
            "speedup_vs_vendor_geomean": geomean(list(vendor.values())),
            "worst_T": worst,
            "worst_speedup_vs_vendor": vendor[worst],
            "share_ge_0_9_vendor": sum(v >= 0.9 for v in vendor.values()) / len(vendor),
            "worst_T_numpy": worst_np,
            "worst_speedup_vs_numpy": numpy_[worst_np],
            "vendor_routed_T": sum(not row["program"] for row in res["rows"]),
            "speedup_vs_per_shape_ms_geomean": geomean(list(exact.values())),
            "per_shape_ms_T": sorted(exact),
            "speedup_vs_ms_pad128_geomean": geomean(list(pad.values())),
            "padding_ratio": uk["padding_ratio"],
            "ukernel_tuning_s": uk["seconds"],
            "per_shape_ms_mean_s": ms_mean,
            "per_shape_ms_runs": len(ms_runs),
            "per_shape_ms_extrapolated_s": None if ms_mean is None else ms_mean * S_MAX,
            "tuning_cost_ratio": None if ms_mean is None else ms_mean * S_MAX / uk["seconds"],
            "rho_dietcode_mean": uk["validation"].get("rho_dietcode_mean"),
            "rho_sia_mean": uk["validation"].get("rho_sia_mean"),
            "dispatch_program_ns_median": res["dispatch_overhead"]["program_ns_median"],
            "dispatch_program_ns_max": res["dispatch_overhead"]["program_ns_max"],
        }
        all_vendor += [(name, T, v) for T, v in vendor.items()]
        all_numpy += [(name, T, v) for T, v in numpy_.items()]
        all_exact += exact.values()
        all_pad += pad.values()
        uk_seconds += uk["seconds"]
        ms_extrapolated += layers[name]["per_shape_ms_extrapolated_s"] or 0.0
    if not all_vendor:
        return {"layers": layers, "overall": None, "goals": []}
    worst_name, worst_T, worst_v = min(all_vendor, key=lambda t: t[2])
    worst_np_name, worst_np_T, worst_np_v = min(all_numpy, key=lambda t: t[2])
    overall = {
        "speedup_vs_vendor_geomean": geomean([v for _, _, v in all_vendor]),
        "worst_layer": worst_name,
        "worst_T": worst_T,
        "worst_speedup_vs_vendor": worst_v,
        "share_ge_0_9_vendor": sum(v >= 0.9 for _, _, v in all_vendor) / len(all_vendor),
        "worst_numpy_layer": worst_np_name,
        "worst_numpy_T": worst_np_T,
        "worst_speedup_vs_numpy": worst_np_v,
        "shapes": len(all_vendor),
        "speedup_vs_per_shape_ms_geomean": geomean(all_exact),
        "per_shape_ms_points": len(all_exact),
        "speedup_vs_ms_pad128_geomean": geomean(all_pad),
        "ukernel_tuning_s": uk_seconds,
        "per_shape_ms_extrapolated_s": ms_extrapolated,
        "tuning_cost_ratio": ms_extrapolated / uk_seconds if uk_seconds and ms_extrapolated else None,
        "dispatch_program_ns_max": max(s["dispatch_program_ns_max"] for s in layers.values()),
    }
    goals = []
    for key, (op, target, unit) in GOALS.items():
        value = overall[key]
        met = value is not None and (value >= target if op == "≥" else value <= target)
        goals.append({"goal": key, "op": op, "target": target, "unit": unit, "value": value, "met": met})
    return {"layers": layers, "overall": overall, "goals": goals}


def _x(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}×"


def _f(v: float | None, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


GOAL_TEXT = {
    "speedup_vs_vendor_geomean": "geomean speedup over the faster vendor (min of numpy, torch), all layers and T",
    "speedup_vs_per_shape_ms_geomean": "geomean speedup over per-shape MetaSchedule at the sampled T",
    "worst_speedup_vs_vendor": "no shape slower than 0.9× the faster vendor (worst ratio)",
    "worst_speedup_vs_numpy": "no T slower than 0.95× numpy, the vendor the SDK calls both next to (worst ratio)",
    "tuning_cost_ratio": f"ukernel tuning cheaper than per-shape MetaSchedule over {S_MAX} shapes (extrapolated)",
    "dispatch_program_ns_max": "dispatch selection `d.program(T)`, slowest T of any layer",
}


def _goal_value(goal: dict[str, Any]) -> str:
    digits = 0 if goal["goal"] in ("tuning_cost_ratio", "dispatch_program_ns_max") else 2
    return "n/a" if goal["value"] is None else f"{goal['value']:.{digits}f}{goal['unit']}"


def markdown(data: dict[str, Any]) -> str:
    meas, summ = data["measurement"], data["summary"]
    env = meas["environment"]
    trials = data["trials"]
    lines = [
        f"# uKernel dispatcher vs vendor libraries and MetaSchedule: BERT-base, batch 1, T = 1..{S_MAX}",
        "",
        *(
            ["**QUICK SMOKE RUN** (few shapes, few MetaSchedule trials, few rounds): not a result.", ""]
            if data.get("quick")
            else []
        ),
        f"- command: `{meas['command']}`",
        *(f"- {line}" for line in environment_lines(env)),
        f"- {other_load_line(env)}",
        f"- medians of {meas['rounds']} interleaved rounds per T (each sample ≥ {meas['min_sample_ms']} ms of calls, "
        f"{meas['pause_ms']} ms pause before each"
        + (
            ", and before a sample on other threads than the previous one's (TVM, OpenBLAS, torch), a wait until "
            "the previous library's spinning worker threads are idle"
            if meas.get("settle")
            else ", no waits between libraries (the SDK's thread settings, kernelfleet.runtime)"
        )
        + "); speedups > 1 mean the uKernel dispatcher is faster",
        f"- `ukernel`: one `UKernelTuner.tune` job per layer (T=1..{data['s_max']}, ≤{data['max_ukernels']} "
        f"uKernels, validated at T={data['validate']}), loaded from its exported artifacts and called as "
        "`Dispatcher(table, kernels, N=N, K=K)(x, w)` (W packed once by `prepare`, out=None; X as numpy allocates it)",
        "- `vendor` = the faster of numpy `x @ w.T` (OpenBLAS) and torch `F.linear` at each T",
        f"- `MS-pad@{PAD_M}`: the MetaSchedule kernel tuned for T={PAD_M} ({trials} trials), run at every T by copying "
        f"X into a zero-padded {PAD_M}-row buffer (copy timed) and returning the first T rows",
        f"- `MS exact`: MetaSchedule tuned for exactly that T ({trials} trials, seed {data['seed']}), at "
        f"T={data['ms_shapes']} only; the T={PAD_M} run is the one MS-pad@{PAD_M} uses. MetaSchedule tuned with torch "
        f"hidden: {data['tuning_environment']['torch_hidden']}; one-time tuner warm-up {data['warmup_s']:.1f} s "
        "not counted",
        "",
    ]
    overall = summ["overall"]
    if overall is not None:
        lines += [
            "## Summary",
            "",
            "| layer | K×N | vs vendor (geomean) | worst T (ratio) | T with ≥ 0.9× vendor | worst T vs numpy "
            "(ratio) | T routed to numpy | vs per-shape MS "
            f"(geomean, sampled T) | vs MS-pad@{PAD_M} (geomean) | padding ratio | ukernel tuning s | per-shape MS "
            f"s, {S_MAX} shapes (extrapolated) | tuning cost ratio | ρ DietCode | ρ SIA | d.program(T) ns |",
            "|" + "---|" * 16,
        ]
        for name, s in summ["layers"].items():
            e = data["layers"][name]
            lines.append(
                f"| {name} | {e['K']}×{e['N']} | {_x(s['speedup_vs_vendor_geomean'])} | "
                f"{s['worst_T']} ({_x(s['worst_speedup_vs_vendor'])}) | {s['share_ge_0_9_vendor']:.0%} | "
                f"{s['worst_T_numpy']} ({_x(s['worst_speedup_vs_numpy'])}) | {s['vendor_routed_T']} | "
                f"{_x(s['speedup_vs_per_shape_ms_geomean'])} (T={s['per_shape_ms_T']}) | "
                f"{_x(s['speedup_vs_ms_pad128_geomean'])} | {s['padding_ratio']:.3f} | {s['ukernel_tuning_s']:.1f} | "
                f"{_f(s['per_shape_ms_extrapolated_s'], 0)} (mean {_f(s['per_shape_ms_mean_s'], 1)} s × {S_MAX}) | "
                f"{_x(s['tuning_cost_ratio'], 0)} | {_f(s['rho_dietcode_mean'])} | {_f(s['rho_sia_mean'])} | "
                f"{s['dispatch_program_ns_median']:.0f} (max {s['dispatch_program_ns_max']:.0f}) |"
            )
        lines += [
            f"| **all** | | **{_x(overall['speedup_vs_vendor_geomean'])}** | {overall['worst_layer']} "
            f"T={overall['worst_T']} ({_x(overall['worst_speedup_vs_vendor'])}) | "
            f"{overall['share_ge_0_9_vendor']:.0%} of {overall['shapes']} | {overall['worst_numpy_layer']} "
            f"T={overall['worst_numpy_T']} ({_x(overall['worst_speedup_vs_numpy'])}) | | "
            f"{_x(overall['speedup_vs_per_shape_ms_geomean'])} ({overall['per_shape_ms_points']} points) | "
            f"{_x(overall['speedup_vs_ms_pad128_geomean'])} | | {overall['ukernel_tuning_s']:.1f} | "
            f"{overall['per_shape_ms_extrapolated_s']:.0f} | {_x(overall['tuning_cost_ratio'], 0)} | | | |",
            "",
            f"Per-shape MetaSchedule tuning time over all {S_MAX} shapes is EXTRAPOLATED: the mean wall time of "
            f"the sampled per-shape runs ({data['ms_shapes']}) times {S_MAX}; it was not run for every shape. "
            "The ukernel tuning time is the job's own `out.seconds` (building, timing, combining and validating).",
            "",
            "## Goals",
            "",
            "| goal | target | measured | met |",
            "|---|---|---|---|",
        ]
        for g in summ["goals"]:
            lines.append(
                f"| {GOAL_TEXT[g['goal']]} | {g['op']} {g['target']:g}{g['unit']} | {_goal_value(g)} | "
                f"{'yes' if g['met'] else '**NO**'} |"
            )
        lines.append("")
    for res in meas["layers"]:
        lines += layer_section(data, res)
    return "\n".join(lines) + "\n"


def layer_section(data: dict[str, Any], res: dict[str, Any]) -> list[str]:
    if res["name"] == BMM:
        lines = [
            f"## {BMM}: [{HEADS},T,{HEAD_DIM}]·[{HEADS},{HEAD_DIM},T] — NOT covered by the ukernel tuner",
            "",
            "Both matrix dimensions follow T, and the ukernel tuner handles one dynamic dimension (dense M) only: "
            "no uKernel contender here, numpy and torch only.",
            "",
            "| T | numpy µs | torch µs | output ok |",
            "|---|---|---|---|",
        ]
        for row in res["rows"]:
            c = row["contenders"]
            ok = "yes" if all(v["ok"] for v in c.values()) else "**NO**"
            torch_s = c["torch"]["median_s"] if "torch" in c else None
            lines.append(f"| {row['T']} | {us(c['numpy']['median_s'])} | {us(torch_s)} | {ok} |")
        return [*lines, ""]
    entry = data["layers"][res["name"]]
    uk = entry["ukernel"]
    ov = res["dispatch_overhead"]
    ms_runs = ", ".join(
        f"T={r['T']}: {r['tuning_s']:.1f} s ({r['measured']} measured, {r['errors']} failed)"
        for r in entry["ms"].values()
    )
    rho = "; ".join(
        f"T={S}: DietCode {_f(v.get('rho_dietcode'))}, SIA {_f(v.get('rho_sia'))}"
        for S, v in uk["validation"]["shapes"].items()
    )
    lines = [
        f"## {res['name']}: K={res['K']}, N={res['N']}",
        "",
        f"- ukernel job: {uk['seconds']:.1f} s, {len(uk['artifacts'])} uKernels "
        f"({', '.join(uk['artifacts'])}), {uk['intervals']} table intervals, padding ratio {uk['padding_ratio']:.3f}, "
        f"{uk['errors']} tiles failed; uKernels {res['ukernel_source']}",
        f"- rank correlations (Spearman ρ, measured vs predicted per uKernel): {rho}",
        f"- dispatch selection `d.program(T)`: {ov['program_ns_median']:.0f} ns median, {ov['program_ns_max']:.0f} ns "
        f"max over T (target ≤ 5000 ns); first call per T (`table.lookup`): {ov['lookup_ns_median']:.0f} ns median",
        f"- per-shape MetaSchedule runs: {ms_runs}",
        "",
        f"| T | uKernel µs | numpy µs | torch µs | vendor/uKernel | MS-pad@{PAD_M} µs | MS exact µs | "
        "uKernel GFLOP/s | program | output ok |",
        "|" + "---|" * 10,
    ]
    for row in res["rows"]:
        c = row["contenders"]
        med = {n: v["median_s"] for n, v in c.items()}
        prog = program_label(row["program"])
        ok = (
            "yes"
            if all(v["ok"] for v in c.values())
            else "**NO**: " + ", ".join(n for n, v in c.items() if not v["ok"])
        )
        lines.append(
            f"| {row['T']} | {us(med['ukernel'])} | {us(med['numpy'])} | {us(med.get('torch'))} | "
            f"{_vendor(med) / med['ukernel']:.2f} | {us(med.get('ms_pad128'))} | {us(med.get('ms_exact'))} | "
            f"{row['flop'] / med['ukernel'] / 1e9:.1f} | {prog} | {ok} |"
        )
    return [*lines, ""]


def print_summary(data: dict[str, Any]) -> None:
    o = data["summary"]["overall"]
    if o is None:
        return
    print(
        f"summary: ukernel vs faster vendor geomean {_x(o['speedup_vs_vendor_geomean'])}, worst {o['worst_layer']} "
        f"T={o['worst_T']} {_x(o['worst_speedup_vs_vendor'])}, {o['share_ge_0_9_vendor']:.0%} of T ≥ 0.9×; "
        f"vs per-shape MS {_x(o['speedup_vs_per_shape_ms_geomean'])}, "
        f"vs MS-pad@{PAD_M} {_x(o['speedup_vs_ms_pad128_geomean'])}; tuning {o['ukernel_tuning_s']:.1f} s vs "
        f"{o['per_shape_ms_extrapolated_s']:.0f} s extrapolated ({_x(o['tuning_cost_ratio'], 0)})"
    )
    for g in data["summary"]["goals"]:
        print(
            f"  goal {g['goal']} {g['op']} {g['target']:g}{g['unit']}: {_goal_value(g)} -> "
            f"{'met' if g['met'] else 'NOT met'}"
        )


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    """'1,16,61' or '1-128' or a mix: '1-8,16,32'."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: layers {QUICK['layers']}, T={QUICK['shapes']}, {QUICK['trials']} MetaSchedule trials, "
        f"{QUICK_TIMING['rounds']} rounds (options given explicitly still win)",
    )
    p.add_argument("--layers", help=f"comma list of {', '.join(ALL_LAYERS)} (default: all)")
    p.add_argument("--shapes", help=f"values of T to measure, e.g. 1-128 or 1,16,61 (default 1-{S_MAX})")
    p.add_argument(
        "--ms-shapes", help=f"T tuned per shape with MetaSchedule (default {FULL['ms_shapes']}; {PAD_M} always)"
    )
    p.add_argument("--trials", type=int, help=f"MetaSchedule trials per tuned shape (default {FULL['trials']})")
    p.add_argument("--rounds", type=int, help=f"interleaved measurement rounds (default {FULL_TIMING['rounds']})")
    p.add_argument(
        "--min-sample-ms", type=float, help=f"min length of a sample (default {FULL_TIMING['min_sample_ms']})"
    )
    p.add_argument(
        "--pause-ms",
        type=float,
        help=f"extra sleep before each sample (default {FULL_TIMING['pause_ms']}); samples on another library's "
        "threads than the previous sample's also wait until the process's other threads are idle",
    )
    p.add_argument(
        "--settle",
        action="store_true",
        help="before a sample on another library's threads, wait until the previous library's threads are idle "
        "(the old behaviour; by default the SDK's thread settings make waits unnecessary for TVM and OpenBLAS)",
    )
    p.add_argument(
        "--no-torch",
        action="store_true",
        help="leave torch out: the vendor is numpy alone, the library the SDK dispatcher routes to",
    )
    p.add_argument(
        "--no-vendor-routes",
        action="store_true",
        help="publish the tables whole, every T on uKernels (how tables were before vendor routes)",
    )
    p.add_argument(
        "--no-ms", action="store_true", help="skip MetaSchedule (ms_pad128, ms_exact): the ukernel job vs the vendors"
    )
    p.add_argument("--max-ukernels", type=int, default=8, help="uKernels a ukernel job may propose (default 8)")
    p.add_argument("--seed", type=int, default=0, help="MetaSchedule seed")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results; the markdown report goes next to it")
    p.add_argument(
        "--artifacts-dir",
        type=Path,
        help="where the ukernel jobs export their uKernels (default: a temporary directory for this run; "
        "--measure-only then recompiles them from their specs unless given the directory of the tuning run)",
    )
    phase = p.add_mutually_exclusive_group()
    phase.add_argument("--measure-only", action="store_true", help="skip tuning; measure what --out holds")
    phase.add_argument("--tune-only", action="store_true", help="only tune and write --out")
    p.add_argument("--tvm-threads", type=int, default=cores(), help="TVM_NUM_THREADS (default: the number of cores)")
    p.add_argument("--verbose", action="store_true", help="keep MetaSchedule's log on stdout")
    p.add_argument("--tune-with-torch", action="store_true", help="tune with torch importable (see sketch_vs_vendor)")
    args = p.parse_args(argv)
    defaults = {**QUICK, **QUICK_TIMING} if args.quick else {**FULL, **FULL_TIMING}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.layers = [s.strip() for s in args.layers.split(",") if s.strip()]
    unknown = sorted(set(args.layers) - set(ALL_LAYERS))
    if unknown:
        p.error(f"unknown layers {unknown}; choose from {', '.join(ALL_LAYERS)}")
    args.shapes, args.ms_shapes = int_list(args.shapes), int_list(args.ms_shapes)
    if not all(1 <= T <= S_MAX for T in [*args.shapes, *args.ms_shapes]):
        p.error(f"T must be in 1..{S_MAX}")
    if args.rounds < 1 or args.trials < 1:
        p.error("--rounds and --trials must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    set_tvm_threads(args.tvm_threads)
    if is_tuning_child():
        run_tuning(args)
        return
    args.command = shlex.join([os.path.relpath(sys.executable), os.path.relpath(sys.argv[0]), *argv])
    print(f"command: {args.command}", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-bench-ukernels-") as tmp:
        if args.artifacts_dir is None:
            args.artifacts_dir = Path(tmp)
            argv = [*argv, "--artifacts-dir", tmp]
        if not args.measure_only:
            child_argv = argv if args.tune_only else [*argv, "--tune-only"]
            run_tuning_child(Path(__file__).resolve(), child_argv, with_torch=args.tune_with_torch)
        if args.tune_only:
            return
        tuned_s = time.perf_counter() - started
        data = run_measurement(args)
    report = markdown(data)
    md_path = args.out.with_suffix(".md")
    md_path.write_text(report)
    print()
    print_summary(data)
    measured_s = time.perf_counter() - started - tuned_s
    tuning = "tuning skipped" if args.measure_only else f"tuning {tuned_s:.0f} s"
    print(f"wrote {args.out} and {md_path}; {tuning}, measuring {measured_s:.0f} s")


if __name__ == "__main__":
    main()
