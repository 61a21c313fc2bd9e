"""Sketch tuner vs vendor libraries on the BERT-base dense layer Y = X·Wᵀ (K=768, N=2304).

Phase 1 (tune) runs the project's `SketchTuner` (MetaSchedule, XGBoost cost model) once per shape
with `--trials` trials and keeps two results of that one run: the best candidate among the first
`--checkpoint` measured ("tuned@64") and the final best ("tuned@256"), plus the wall-clock time to
reach each. It runs in a child process in which torch is hidden (see `_hide_torch_env`), so that
tvm_ffi does not import torch into every MetaSchedule worker and the tuning times are the service's.

Phase 2 (measure) builds both kernels with `kernelfleet.tvm_kernel.build_kernel` and times them side
by side with numpy (`x @ w.T`, OpenBLAS) and PyTorch CPU (`F.linear`) in one process, in interleaved
rounds, and reports medians. Every contender's output is checked against numpy.

    .venv-bench/bin/python bench/sketch_vs_vendor.py                  # tune + measure (default shapes)
    .venv-bench/bin/python bench/sketch_vs_vendor.py --measure-only   # re-measure the saved configs
"""

from __future__ import annotations

import os
import sys

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)
    import kernelfleet  # noqa: F401  (its thread settings must precede numpy: kernelfleet.runtime)

import argparse
import json
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    CheckpointSink,
    Contender,
    OtherLoad,
    Sampler,
    blas_info,
    calibrate,
    cores,
    environment_lines,
    host_info,
    is_tuning_child,
    max_abs_errors,
    other_load_line,
    quiet_metaschedule,
    ratio,
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

from kernelfleet.tvm_kernel import Kernel, build_kernel
from service.models import TargetSpec, WorkloadSpec
from service.tuning.compute import random_inputs, reference, tolerance
from service.tuning.hardware import host_target
from service.tuning.tuners.sketch import SketchTask, SketchTuner

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "sketch_vs_vendor.json"
DEFAULT_SHAPES = "1,16,61,128"
WORKLOAD = WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"])


# ------------------------------------------------------------------------------------------------
# Phase 1: tune
# ------------------------------------------------------------------------------------------------


def tune_shape(m: int, target: TargetSpec, trials: int, checkpoint: int, seed: int | None) -> dict[str, Any]:
    sink = CheckpointSink(checkpoint=checkpoint, label=f"M={m}")
    with tempfile.TemporaryDirectory(prefix=f"kf-bench-M{m}-") as tmp:
        task = SketchTask(WORKLOAD, {"M": m}, target, trials, Path(tmp), seed=seed)
        sink.started = time.perf_counter()
        outcome = SketchTuner().tune(task, sink)
    total_s = time.perf_counter() - sink.started
    final = outcome.best_config
    at_checkpoint = None
    if final is not None and sink.best_trace_at_checkpoint is not None:
        at_checkpoint = {**final, "trace": sink.best_trace_at_checkpoint}
    return {
        "M": m,
        "measured": outcome.measured,
        "errors": outcome.errors,
        # The sink hears of candidates one MetaSchedule batch (up to 32) at a time, so this is the
        # time at which the batch holding the checkpoint-th candidate was reported.
        "tuning_s_to_checkpoint": sink.seconds_to_checkpoint if sink.seconds_to_checkpoint is not None else total_s,
        "tuning_s_total": total_s,
        "tuner_latency_s_at_checkpoint": sink.best_at_checkpoint_s,
        "tuner_latency_s_final": outcome.best_latency_s,
        "config_at_checkpoint": at_checkpoint,
        "config_final": final,
    }


def run_tuning(args: argparse.Namespace) -> None:
    target = host_target()
    data: dict[str, Any] = {
        "benchmark": "sketch_vs_vendor",
        "workload": WORKLOAD.canonical(),
        "trials": args.trials,
        "checkpoint": args.checkpoint,
        "seed": args.seed,
        "tuner": "sketch (MetaSchedule, xgb cost model)",
        "tuning_environment": {**host_info(), "torch_hidden": torch_hidden()},
        "shapes": [],
    }
    env = data["tuning_environment"]
    data["warmup_s"] = warm_up_tuner()
    print(
        f"phase 1: tuning dense K=768 N=2304 on {env['tvm_target_str']}, {args.trials} trials per shape, "
        f"checkpoint {args.checkpoint}; torch imported in the tuning process: {env['torch_imported']}; one-time "
        f"warm-up (not counted per shape) {data['warmup_s']:.1f} s",
        flush=True,
    )
    for m in args.shapes:
        if not args.verbose:
            quiet_metaschedule()
        data["shapes"].append(tune_shape(m, target, args.trials, args.checkpoint, args.seed))
        row = data["shapes"][-1]
        print(
            f"  M={m}: {row['measured']} measured, to {args.checkpoint}: {row['tuning_s_to_checkpoint']:.1f} s, "
            f"total {row['tuning_s_total']:.1f} s",
            flush=True,
        )
        write_json(args.out, data)
    print(f"wrote {args.out}", flush=True)


def tune_in_child(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Phase 1 in a child process, torch hidden unless --tune-with-torch."""
    child_argv = [*argv] if args.tune_only else [*argv, "--tune-only"]
    run_tuning_child(Path(__file__).resolve(), child_argv, with_torch=args.tune_with_torch)


# ------------------------------------------------------------------------------------------------
# Phase 2: measure
# ------------------------------------------------------------------------------------------------


def tvm_sampler(kernel: Kernel, x: np.ndarray, w: np.ndarray) -> Sampler:
    """TVM's time_evaluator (its own warm-up call, then `number` calls in C++ on preallocated tensors)."""
    return lambda number: kernel.time(x, w, number=number, repeat=1)[0]


def tvm_contenders(
    shape_row: dict[str, Any], args: argparse.Namespace, x: np.ndarray, w: np.ndarray
) -> list[Contender]:
    out = []
    for key, label in (("config_at_checkpoint", f"tuned@{args.checkpoint}"), ("config_final", f"tuned@{args.trials}")):
        config = shape_row.get(key)
        if config is None:
            print(f"  {label}: no config (no candidate succeeded)")
            continue
        kernel = build_kernel(config)
        out.append(Contender(label, tvm_sampler(kernel, x, w), lambda k=kernel: k(x, w)))
    return out


def measure_shape(torch: Any, row: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    m = row["M"]
    x, w = random_inputs(WORKLOAD, {"M": m}, seed=0)
    contenders = [*tvm_contenders(row, args, x, w), *vendor_contenders(torch, x, w)]
    errors = max_abs_errors(contenders, reference(WORKLOAD)(x, w))
    for c in contenders:
        c.number = calibrate(c.sample, args.min_sample_ms / 1e3)
    run_rounds(contenders, args.rounds, args.pause_ms / 1e3)
    return {
        "M": m,
        "flop": WORKLOAD.flops({"M": m}),
        "tolerance": tolerance(WORKLOAD, {"M": m}),
        "contenders": {
            c.name: {
                "median_s": statistics.median(c.samples_s),
                "min_s": min(c.samples_s),
                "max_s": max(c.samples_s),
                "calls_per_sample": c.number,
                "samples_s": c.samples_s,
                "max_abs_err_vs_numpy": errors[c.name],
            }
            for c in contenders
        },
    }


def run_measurement(args: argparse.Namespace) -> dict[str, Any]:
    data = json.loads(args.out.read_text())
    args.trials, args.checkpoint = data["trials"], data["checkpoint"]
    import torch  # here, not at the top: the tuning child runs with torch hidden

    set_vendor_threads(torch, cores())
    rows = [r for r in data["shapes"] if r["M"] in args.shapes]
    missing = sorted(set(args.shapes) - {r["M"] for r in rows})
    if missing:
        print(f"not tuned in {args.out}, skipped: M={', '.join(map(str, missing))}")
    env = {**host_info(), "blas": blas_info(), "torch": torch_info(torch)}
    print_environment(env)
    print("  " + tuning_line(data))
    results = []
    other_load = OtherLoad()
    with torch.inference_mode():
        for row in rows:
            print(f"measuring M={row['M']} ...", flush=True)
            results.append(measure_shape(torch, row, args))
            print_shape(results[-1], row, args)
    env["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    env["other_load"] = round(other_load.fraction(), 3)
    print(other_load_line(env))
    data["measurement"] = {
        "environment": env,
        "rounds": args.rounds,
        "min_sample_ms": args.min_sample_ms,
        "pause_ms": args.pause_ms,
        "results": results,
    }
    write_json(args.out, data)
    return data


# ------------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------------


def tuning_line(data: dict[str, Any]) -> str:
    env = data["tuning_environment"]
    counts = ", ".join(f"M={r['M']}: {r['measured']} ({r['errors']} failed)" for r in data["shapes"])
    return (
        f"tuning: one run of {data['trials']} trials per shape (seed {data['seed']}), TVM_NUM_THREADS "
        f"{env['TVM_NUM_THREADS']}, torch hidden from the tuner: {env['torch_hidden']}; one-time warm-up of the "
        f"tuning process ({data.get('warmup_s', 0):.1f} s, mostly importing tvm.s_tir.tensor_intrin) not counted "
        f"per shape; candidates measured: {counts}"
    )


def print_environment(env: dict[str, Any]) -> None:
    print(f"phase 2: measuring; numpy and torch use {env['cores']} threads (one per core), TVM {env['tvm_threads']}")
    for line in environment_lines(env):
        print("  " + line)


def print_shape(result: dict[str, Any], row: dict[str, Any], args: argparse.Namespace) -> None:
    m, tuned = result["M"], result["contenders"].get(f"tuned@{args.trials}")
    print(f"M={m}: X {m}×768, W 2304×768, {result['flop'] / 1e6:.1f} MFLOP; tolerance {result['tolerance']:.1e}")
    print(
        f"  {'contender':<12}{'median µs':>11}{'min µs':>10}{'max µs':>10}{'GFLOP/s':>9}"
        f"{'÷ tuned@' + str(args.trials):>14}{'max|err|':>11}  check"
    )
    for name, c in result["contenders"].items():
        check = "ok" if c["max_abs_err_vs_numpy"] <= result["tolerance"] else "FAIL"
        print(
            f"  {name:<12}{us(c['median_s']):>11}{us(c['min_s']):>10}{us(c['max_s']):>10}"
            f"{result['flop'] / c['median_s'] / 1e9:>9.1f}"
            f"{ratio(c['median_s'], tuned['median_s'] if tuned else None):>14}"
            f"{c['max_abs_err_vs_numpy']:>11.2e}  {check}"
        )
    print(
        f"  tuning: {args.checkpoint} trials in {row['tuning_s_to_checkpoint']:.1f} s, "
        f"{row['measured']} measured ({row['errors']} failed) in {row['tuning_s_total']:.1f} s"
    )


def markdown(data: dict[str, Any]) -> str:
    trials, cp = data["trials"], data["checkpoint"]
    meas = data["measurement"]
    rows = {r["M"]: r for r in data["shapes"]}
    head = [
        f"tuned@{cp} µs",
        f"tuned@{trials} µs",
        "numpy µs",
        "torch µs",
        f"numpy/tuned@{trials}",
        f"torch/tuned@{trials}",
        f"tuning s to {cp}",
        f"tuning s to {trials}",
    ]
    lines = [
        "# Sketch tuner vs vendor libraries: dense Y = X·Wᵀ, K=768, N=2304 (BERT-base QKV)",
        "",
        *(f"- {line}" for line in environment_lines(meas["environment"])),
        f"- {other_load_line(meas['environment'])}",
        f"- medians of {meas['rounds']} interleaved rounds (each sample ≥ {meas['min_sample_ms']} ms of calls); "
        "ratios > 1 mean the tuned kernel is faster",
        f"- {tuning_line(data)}",
        f"- tuned@{cp} is the best of the first {cp} measured candidates of that run; its tuning time is taken "
        f"when the batch holding candidate {cp} was reported",
        "",
        "| M | " + " | ".join(head) + " |",
        "|" + "---|" * (len(head) + 1),
    ]
    for res in meas["results"]:
        med = {name: c["median_s"] for name, c in res["contenders"].items()}
        tuned = med.get(f"tuned@{trials}")
        row = rows[res["M"]]
        cells = [
            us(med.get(f"tuned@{cp}")),
            us(tuned),
            us(med.get("numpy")),
            us(med.get("torch")),
            ratio(med.get("numpy"), tuned),
            ratio(med.get("torch"), tuned),
            f"{row['tuning_s_to_checkpoint']:.1f}",
            f"{row['tuning_s_total']:.1f}",
        ]
        lines.append(f"| {res['M']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=256, help="tuning trials per shape (default 256)")
    p.add_argument("--checkpoint", type=int, default=64, help="also report the best of the first N trials")
    p.add_argument(
        "--shapes",
        type=lambda s: [int(v) for v in s.split(",")],
        default=DEFAULT_SHAPES,
        help=f"values of M (default {DEFAULT_SHAPES})",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results; the markdown table goes next to it")
    p.add_argument("--seed", type=int, default=0, help="MetaSchedule seed")
    p.add_argument("--rounds", type=int, default=9, help="interleaved measurement rounds (at least 7)")
    p.add_argument("--min-sample-ms", type=float, default=50.0, help="minimum duration of one timing sample")
    p.add_argument(
        "--pause-ms",
        type=float,
        default=0.0,
        help="sleep before each sample (default 0: the SDK's thread settings keep TVM's and OpenBLAS's idle threads "
        "off the cores; 200 lets torch's spinning threads go idle too)",
    )
    phase = p.add_mutually_exclusive_group()
    phase.add_argument("--measure-only", action="store_true", help="skip tuning; measure the configs in --out")
    phase.add_argument("--tune-only", action="store_true", help="only tune and write --out")
    p.add_argument(
        "--tvm-threads",
        type=int,
        default=cores(),
        help="TVM_NUM_THREADS for tuning and measuring (default: the number of cores; 0 leaves it unset, and "
        "TVM then uses half the logical CPUs on x86)",
    )
    p.add_argument("--verbose", action="store_true", help="keep MetaSchedule's log on stdout")
    p.add_argument(
        "--tune-with-torch",
        action="store_true",
        help="tune with torch importable (tvm_ffi then imports it into every MetaSchedule worker)",
    )
    args = p.parse_args(argv)
    if args.rounds < 7:
        p.error("--rounds must be at least 7")
    if not 1 <= args.checkpoint < args.trials:
        p.error("--checkpoint must be at least 1 and less than --trials")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    set_tvm_threads(args.tvm_threads)
    if is_tuning_child():
        run_tuning(args)
        return
    started = time.perf_counter()
    if not args.measure_only:
        tune_in_child(args, argv)
    if args.tune_only:
        return
    tuned_s = time.perf_counter() - started
    data = run_measurement(args)
    table = markdown(data)
    md_path = args.out.with_suffix(".md")
    md_path.write_text(table)
    print()
    print(table)
    measured_s = time.perf_counter() - started - tuned_s
    tuning = "tuning skipped" if args.measure_only else f"tuning {tuned_s:.0f} s"
    print(f"wrote {args.out} and {md_path}; {tuning}, measuring {measured_s:.0f} s")


if __name__ == "__main__":
    main()
