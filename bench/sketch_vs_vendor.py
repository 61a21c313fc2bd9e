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

import json
import os
import sys

# Removed from the environment before numpy, torch or TVM load (they read them once, at load):
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE force OpenBLAS onto a slower kernel than this CPU supports;
# OMP_NUM_THREADS would set TVM's thread count when TVM_NUM_THREADS is unset. TVM_NUM_THREADS itself
# is set (or removed) by `main` from --tvm-threads before TVM starts its thread pool.
STRIPPED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")
_STRIPPED_RECORD = "KF_BENCH_STRIPPED_ENV"


def _reexec_without_overrides() -> None:
    found = {name: os.environ[name] for name in STRIPPED_ENV if name in os.environ}
    if not found:
        return
    env = {k: v for k, v in os.environ.items() if k not in found}
    env[_STRIPPED_RECORD] = json.dumps(found)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    _reexec_without_overrides()

import argparse  # noqa: E402
import logging  # noqa: E402
import re  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import threadpoolctl  # noqa: E402
import tvm  # noqa: E402

from kernelfleet.tvm_kernel import Kernel, build_kernel  # noqa: E402
from service.models import TargetSpec, WorkloadSpec  # noqa: E402
from service.models.config import MeasuredCandidate  # noqa: E402
from service.workers.hardware import host_target  # noqa: E402
from service.workers.tuners.base import TuningTask  # noqa: E402
from service.workers.tuners.compute import random_inputs, reference, tolerance  # noqa: E402
from service.workers.tuners.sketch import SketchTuner  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "sketch_vs_vendor.json"
DEFAULT_SHAPES = "1,16,61,128"
WORKLOAD = WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"])
_TORCH_HIDDEN = "KF_BENCH_TORCH_HIDDEN"
_TUNING_CHILD = "KF_BENCH_TUNING_CHILD"


# ------------------------------------------------------------------------------------------------
# Environment: what ran, recorded in the JSON and printed
# ------------------------------------------------------------------------------------------------


def cores() -> int:
    return host_target().num_cores


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def host_info() -> dict[str, Any]:
    target = host_target()
    return {
        "cpu_model": cpu_model(),
        "cores": target.num_cores,
        "cpu_count": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "tvm": tvm.__version__,
        "tvm_target": target.tvm_target(),
        "tvm_target_str": str(tvm.target.Target(target.tvm_target())),
        "tvm_threads": int(tvm.get_global_func("runtime.NumThreads")()),
        "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", "unset"),
        "stripped_env": json.loads(os.environ.get(_STRIPPED_RECORD, "{}")),
        "torch_imported": "torch" in sys.modules,
    }


def blas_info() -> list[dict[str, Any]]:
    """The BLAS libraries loaded in this process, as threadpoolctl sees them (which OpenBLAS kernel ran)."""
    keys = ("user_api", "internal_api", "version", "architecture", "num_threads", "threading_layer", "prefix")
    return [{k: lib.get(k) for k in keys} for lib in threadpoolctl.threadpool_info()]


def torch_info(torch: Any) -> dict[str, Any]:
    parallel = torch.__config__.parallel_info().splitlines()
    blas = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return {
        "version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "mkl": torch.backends.mkl.is_available(),
        "blas_info": blas.group(1) if blas else "unknown",
        "parallel_info": [line.strip() for line in parallel[:8] if line.strip()],
    }


def _busy_cpu_s() -> float:
    """CPU seconds all processes have spent busy since boot (/proc/stat: user..steal, not idle/iowait)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class OtherLoad:
    """How much of the machine other processes used while we measured (0 = quiet, 1 = all cores)."""

    wall: float = field(default_factory=time.perf_counter)
    busy: float = field(default_factory=_busy_cpu_s)
    own: float = field(default_factory=_own_cpu_s)

    def fraction(self) -> float:
        wall = time.perf_counter() - self.wall
        other = (_busy_cpu_s() - self.busy) - (_own_cpu_s() - self.own)
        return max(0.0, other / (wall * cores()))


# ------------------------------------------------------------------------------------------------
# Phase 1: tune
# ------------------------------------------------------------------------------------------------


@dataclass
class CheckpointSink:
    """Sees every measured candidate; keeps the best `ok` one among the first `checkpoint`."""

    checkpoint: int
    label: str
    started: float = field(default_factory=time.perf_counter)
    measured: int = 0
    errors: int = 0
    best_latency_s: float | None = None
    best_at_checkpoint_s: float | None = None
    best_trace_at_checkpoint: Any = None
    seconds_to_checkpoint: float | None = None

    def on_candidates(self, candidates: list[MeasuredCandidate]) -> None:
        for cand in candidates:
            self.measured += 1
            ok = cand.status == "ok" and cand.latency_s is not None
            self.errors += not ok
            if not ok:
                continue
            assert cand.latency_s is not None
            if self.best_latency_s is None or cand.latency_s < self.best_latency_s:
                self.best_latency_s = cand.latency_s
            if self.measured <= self.checkpoint and (
                self.best_at_checkpoint_s is None or cand.latency_s < self.best_at_checkpoint_s
            ):
                self.best_at_checkpoint_s = cand.latency_s
                self.best_trace_at_checkpoint = cand.config["trace"]
        elapsed = time.perf_counter() - self.started
        if self.seconds_to_checkpoint is None and self.measured >= self.checkpoint:
            self.seconds_to_checkpoint = elapsed
        best = f"{self.best_latency_s * 1e6:.1f} µs" if self.best_latency_s else "none"
        print(
            f"  {self.label}: {self.measured} measured ({self.errors} failed), best {best}, {elapsed:.1f} s", flush=True
        )

    def should_stop(self) -> bool:
        return False


def quiet_metaschedule() -> None:
    """MetaSchedule logs every batch to stdout at its logger's level; keep warnings only.
    (Each tuning run resets the level to DEBUG, so this is called before each one.)"""
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def warm_up_tuner() -> float:
    """Pay once, before the first shape's clock starts, what a long-lived tuning worker pays once per
    process: MetaSchedule's TuneContext imports tvm.s_tir.tensor_intrin (about 15 s) on first use."""
    started = time.perf_counter()
    import tvm.s_tir.tensor_intrin  # noqa: F401
    import xgboost  # noqa: F401

    return time.perf_counter() - started


def tune_shape(m: int, target: TargetSpec, trials: int, checkpoint: int, seed: int | None) -> dict[str, Any]:
    sink = CheckpointSink(checkpoint=checkpoint, label=f"M={m}")
    with tempfile.TemporaryDirectory(prefix=f"kf-bench-M{m}-") as tmp:
        task = TuningTask(WORKLOAD, {"M": m}, target, trials, Path(tmp), seed=seed)
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def run_tuning(args: argparse.Namespace) -> None:
    target = host_target()
    data: dict[str, Any] = {
        "benchmark": "sketch_vs_vendor",
        "workload": WORKLOAD.canonical(),
        "trials": args.trials,
        "checkpoint": args.checkpoint,
        "seed": args.seed,
        "tuner": "sketch (MetaSchedule, xgb cost model)",
        "tuning_environment": {**host_info(), "torch_hidden": os.environ.get(_TORCH_HIDDEN) == "1"},
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


def _hide_torch_env(shim_dir: Path) -> dict[str, str]:
    """An environment in which `import torch` fails (tvm_ffi then skips it) in every process."""
    pkg = shim_dir / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise ModuleNotFoundError('torch is hidden while tuning (bench/sketch_vs_vendor.py)', name='torch')\n"
    )
    path = os.pathsep.join(p for p in (str(shim_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, _TORCH_HIDDEN: "1"}


def tune_in_child(args: argparse.Namespace, argv: Sequence[str]) -> None:
    """Phase 1 in a child process, torch hidden unless --tune-with-torch."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
    if not args.tune_only:
        cmd.append("--tune-only")
    with tempfile.TemporaryDirectory(prefix="kf-bench-shim-") as shim:
        env = dict(os.environ) if args.tune_with_torch else _hide_torch_env(Path(shim))
        subprocess.run(cmd, env={**env, _TUNING_CHILD: "1"}, check=True)


# ------------------------------------------------------------------------------------------------
# Phase 2: measure
# ------------------------------------------------------------------------------------------------

Sampler = Callable[[int], float]  # number of calls -> seconds per call


@dataclass
class Contender:
    name: str
    sample: Sampler
    output: Callable[[], np.ndarray]
    number: int = 1
    samples_s: list[float] = field(default_factory=list)


def python_sampler(fn: Callable[[], object]) -> Sampler:
    """Times a Python callable; one untimed call first wakes the library's threads."""

    def sample(number: int) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number

    return sample


def tvm_sampler(kernel: Kernel, x: np.ndarray, w: np.ndarray) -> Sampler:
    """TVM's time_evaluator (its own warm-up call, then `number` calls in C++ on preallocated tensors)."""
    return lambda number: kernel.time(x, w, number=number, repeat=1)[0]


def calibrate(sample: Sampler, min_sample_s: float) -> int:
    """Calls per sample so that one sample lasts at least `min_sample_s`."""
    number = 1
    while sample(number) * number < min_sample_s and number < 1 << 16:
        number *= 2
    return number


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


def vendor_contenders(torch: Any, x: np.ndarray, w: np.ndarray) -> list[Contender]:
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    linear = torch.nn.functional.linear

    def numpy_call() -> np.ndarray:
        return x @ w.T

    def torch_call() -> Any:
        return linear(xt, wt)  # run_measurement holds torch.inference_mode()

    return [
        Contender("numpy", python_sampler(numpy_call), numpy_call),
        Contender("torch", python_sampler(torch_call), lambda: torch_call().numpy()),
    ]


def max_abs_errors(contenders: Sequence[Contender], expected: np.ndarray) -> dict[str, float]:
    return {c.name: float(np.max(np.abs(c.output() - expected))) for c in contenders}


def run_rounds(contenders: Sequence[Contender], rounds: int, pause_s: float) -> None:
    """Interleaved rounds, starting with a different contender each round; a pause before each
    sample lets the previous library's spinning worker threads go to sleep."""
    for r in range(rounds):
        for i in range(len(contenders)):
            c = contenders[(r + i) % len(contenders)]
            time.sleep(pause_s)
            c.samples_s.append(c.sample(c.number))


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


def set_vendor_threads(torch: Any, n: int) -> None:
    threadpoolctl.threadpool_limits(limits=n, user_api="blas")
    torch.set_num_threads(n)


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


def us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def ratio(num: float | None, den: float | None) -> str:
    return "n/a" if num is None or den is None else f"{num / den:.2f}"


def environment_lines(env: dict[str, Any]) -> list[str]:
    blas = [b for b in env["blas"] if b["user_api"] == "blas"]
    blas_txt = "; ".join(
        f"{b['internal_api']} {b['version']} ({b['architecture']} kernel, {b['num_threads']} threads)" for b in blas
    )
    t = env["torch"]
    stripped = ", ".join(f"{k}={v}" for k, v in env["stripped_env"].items()) or "none were set"
    return [
        f"CPU: {env['cpu_model']}, {env['cores']} cores; load average {env['loadavg']} before measuring",
        f"TVM {env['tvm']}: target {env['tvm_target_str']}; TVM_NUM_THREADS {env['TVM_NUM_THREADS']} "
        f"(TVM uses {env['tvm_threads']} threads)",
        f"numpy {env['numpy']}: {blas_txt or 'no BLAS found'}",
        f"torch {t['version']}: {t['num_threads']} threads, BLAS {t['blas_info']}, mkldnn {t['mkldnn']}; "
        + " | ".join(t["parallel_info"][:4]),
        f"removed from the environment before loading numpy/torch/TVM: {stripped}",
    ]


def other_load_line(env: dict[str, Any]) -> str:
    share = env["other_load"]
    verdict = "" if share < 0.05 else " — WARNING: the machine was busy, these timings are unreliable"
    return f"other processes used {share:.0%} of the CPU while measuring{verdict}"


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
    p.add_argument("--pause-ms", type=float, default=200.0, help="sleep before each sample (idle worker threads)")
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


def set_tvm_threads(n: int) -> None:
    """Before TVM's thread pool starts (it reads TVM_NUM_THREADS once); the tuning child inherits it."""
    if n > 0:
        os.environ["TVM_NUM_THREADS"] = str(n)
    else:
        os.environ.pop("TVM_NUM_THREADS", None)


def main(argv: Sequence[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    set_tvm_threads(args.tvm_threads)
    if os.environ.get(_TUNING_CHILD) == "1":
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
