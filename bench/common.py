"""What the benchmarks in bench/ share: a clean environment, the machine's description, timing loops.

Importing this module loads only the standard library, so a script can call
`reexec_without_overrides()` before numpy, torch or TVM load; everything heavier is imported inside
the functions that need it. The scripts run as `python bench/<script>.py`, which puts bench/ on
sys.path, so they import this module as `common`.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.tuning.platforms import tvm_target

if TYPE_CHECKING:
    import numpy as np

    from service.models.config import MeasuredCandidate

# Removed from the environment before numpy, torch or TVM load (they read them once, at load):
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE force OpenBLAS onto a slower kernel than this CPU supports;
# OMP_NUM_THREADS would set TVM's thread count when TVM_NUM_THREADS is unset. TVM_NUM_THREADS itself
# is set (or removed) by each script from --tvm-threads before TVM starts its thread pool.
STRIPPED_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OMP_NUM_THREADS")
STRIPPED_RECORD = "KF_BENCH_STRIPPED_ENV"
TORCH_HIDDEN = "KF_BENCH_TORCH_HIDDEN"
TUNING_CHILD = "KF_BENCH_TUNING_CHILD"
ISA_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")


def reexec_without_overrides() -> None:
    """Re-execute the running script without STRIPPED_ENV, recording what was removed."""
    found = {name: os.environ[name] for name in STRIPPED_ENV if name in os.environ}
    if not found:
        return
    env = {k: v for k, v in os.environ.items() if k not in found}
    env[STRIPPED_RECORD] = json.dumps(found)
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def set_tvm_threads(n: int) -> None:
    """Before TVM's thread pool starts (it reads TVM_NUM_THREADS once); tuning children inherit it."""
    if n > 0:
        os.environ["TVM_NUM_THREADS"] = str(n)
    else:
        os.environ.pop("TVM_NUM_THREADS", None)


# ------------------------------------------------------------------------------------------------
# The machine: what ran, recorded in the JSON and printed
# ------------------------------------------------------------------------------------------------


def cores() -> int:
    from service.tuning.hardware import host_target

    return host_target().num_cores


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def isa_flags() -> dict[str, bool]:
    """The vector ISA extensions that matter for these kernels, as the kernel reports them."""
    from service.tuning.hardware import cpu_flags

    flags = cpu_flags()
    return {name: name in flags for name in ISA_FLAGS}


def host_info() -> dict[str, Any]:
    import numpy as np
    import tvm

    from service.tuning.hardware import host_target

    target = host_target()
    return {
        "cpu_model": cpu_model(),
        "cores": target.num_cores,
        "cpu_count": os.cpu_count(),
        "isa": isa_flags(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "tvm": tvm.__version__,
        "tvm_target": tvm_target(target),
        "tvm_target_str": str(tvm.target.Target(tvm_target(target))),
        "tvm_threads": int(tvm.get_global_func("runtime.NumThreads")()),
        "TVM_NUM_THREADS": os.environ.get("TVM_NUM_THREADS", "unset"),
        "stripped_env": json.loads(os.environ.get(STRIPPED_RECORD, "{}")),
        "torch_imported": "torch" in sys.modules,
    }


def blas_info() -> list[dict[str, Any]]:
    """The BLAS libraries loaded in this process, as threadpoolctl sees them (which OpenBLAS kernel ran)."""
    import threadpoolctl

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


def set_vendor_threads(torch: Any, n: int) -> None:
    import threadpoolctl

    threadpoolctl.threadpool_limits(limits=n, user_api="blas")
    if torch is not None:  # None: the run leaves torch out (--no-torch)
        torch.set_num_threads(n)


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


def environment_lines(env: dict[str, Any]) -> list[str]:
    blas = [b for b in env["blas"] if b["user_api"] == "blas"]
    blas_txt = "; ".join(
        f"{b['internal_api']} {b['version']} ({b['architecture']} kernel, {b['num_threads']} threads)" for b in blas
    )
    t = env["torch"]
    stripped = ", ".join(f"{k}={v}" for k, v in env["stripped_env"].items()) or "none were set"
    isa = env.get("isa")
    isa_txt = ""
    if isa is not None:
        isa_txt = "; ISA " + " ".join(f"{'+' if on else '-'}{name}" for name, on in isa.items())
    return [
        f"CPU: {env['cpu_model']}, {env['cores']} cores{isa_txt}; load average {env['loadavg']} before measuring",
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


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


# ------------------------------------------------------------------------------------------------
# Tuning in a child process with torch hidden
# ------------------------------------------------------------------------------------------------


def quiet_metaschedule() -> None:
    """MetaSchedule logs every batch to stdout at its logger's level; keep warnings only.
    (Each tuning run resets the level to DEBUG, so this is called before each one.)"""
    import logging

    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)


def warm_up_tuner() -> float:
    """Pay once, before the first shape's clock starts, what a long-lived tuning worker pays once per
    process: MetaSchedule's tensor intrinsics (service.tuning.tuners.tensor_intrinsics: about 2 s) and XGBoost."""
    started = time.perf_counter()
    import xgboost  # noqa: F401

    from service.tuning.tuners import tensor_intrinsics

    tensor_intrinsics.load()

    return time.perf_counter() - started


def hide_torch_env(shim_dir: Path) -> dict[str, str]:
    """An environment in which `import torch` fails (tvm_ffi then skips it) in every process."""
    pkg = shim_dir / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "raise ModuleNotFoundError('torch is hidden while tuning (bench/common.py)', name='torch')\n"
    )
    path = os.pathsep.join(p for p in (str(shim_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, TORCH_HIDDEN: "1"}


def is_tuning_child() -> bool:
    return os.environ.get(TUNING_CHILD) == "1"


def torch_hidden() -> bool:
    return os.environ.get(TORCH_HIDDEN) == "1"


def run_tuning_child(script: Path, argv: Sequence[str], *, with_torch: bool = False) -> None:
    """Run `script argv` in a child process marked as the tuning child, torch hidden unless `with_torch`:
    tvm_ffi would otherwise import torch into every MetaSchedule worker, which the service never does."""
    cmd = [sys.executable, str(script), *argv]
    with tempfile.TemporaryDirectory(prefix="kf-bench-shim-") as shim:
        env = dict(os.environ) if with_torch else hide_torch_env(Path(shim))
        subprocess.run(cmd, env={**env, TUNING_CHILD: "1"}, check=True)


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


# ------------------------------------------------------------------------------------------------
# Timing: interleaved rounds of calibrated samples
# ------------------------------------------------------------------------------------------------

Sampler = Callable[[int], float]  # number of calls -> seconds per call


@dataclass
class Contender:
    name: str
    sample: Sampler
    output: Callable[[], np.ndarray]
    number: int = 1
    samples_s: list[float] = field(default_factory=list)
    pool: str = ""  # the library whose worker threads it runs on ("openblas", "torch", "tvm")


def python_sampler(fn: Callable[[], object]) -> Sampler:
    """Times a Python callable; one untimed call first wakes the library's threads."""

    def sample(number: int) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number

    return sample


def calibrate(sample: Sampler, min_sample_s: float) -> int:
    """Calls per sample so that one sample lasts at least `min_sample_s`."""
    number = 1
    while sample(number) * number < min_sample_s and number < 1 << 16:
        number *= 2
    return number


def timed_calls(fn: Callable[[], object], number: int) -> float:
    """Seconds per call of `number` back-to-back calls."""
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def calls_per_sample(fn: Callable[[], object], min_sample_s: float) -> int:
    """Back-to-back calls so that one sample lasts at least `min_sample_s` (one untimed call first)."""
    fn()
    number = 1
    while timed_calls(fn, number) * number < min_sample_s and number < 1 << 14:
        number *= 2
    return number


def best_time(fn: Callable[[], object], min_sample_s: float, samples: int) -> float:
    """The fastest of `samples` calibrated samples (a peak rate, not a typical one)."""
    number = calls_per_sample(fn, min_sample_s)
    return min(timed_calls(fn, number) for _ in range(samples))


def interleaved(sides: dict[str, Callable[[], object]], rounds: int, min_sample_s: float) -> dict[str, list[float]]:
    """Seconds per call of each side: one calibrated sample per round, each round starting with another side."""
    numbers = {name: calls_per_sample(fn, min_sample_s) for name, fn in sides.items()}
    samples: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for i in range(len(names)):
            name = names[(r + i) % len(names)]
            samples[name].append(timed_calls(sides[name], numbers[name]))
    return samples


def _other_threads_cpu_ns() -> int | None:
    """CPU time (ns) of this process's threads other than the calling one, or None without schedstat."""
    me = threading.get_native_id()
    total = 0
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        if int(tid) == me:
            continue
        try:
            total += int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except FileNotFoundError:  # the thread ended
            continue
        except (OSError, ValueError, IndexError):
            return None
    return total


def wait_for_quiet(max_s: float = 2.0, window_s: float = 0.005, windows: int = 2, fallback_s: float = 0.3) -> float:
    """Sleep until this process's other threads have used (almost) no CPU for `windows` consecutive
    windows: a library's worker threads spin after its last call (on a 2-core VM, OpenBLAS's for about
    0.1 s, TVM's for about 0.25 s) and slow down whichever library runs next. Returns the seconds waited."""
    started = time.perf_counter()
    prev = _other_threads_cpu_ns()
    if prev is None:
        time.sleep(fallback_s)
        return time.perf_counter() - started
    quiet = 0
    while quiet < windows and time.perf_counter() - started < max_s:
        time.sleep(window_s)
        now = _other_threads_cpu_ns()
        if now is None:
            break
        quiet = quiet + 1 if now - prev < 0.05 * window_s * 1e9 else 0
        prev = now
    return time.perf_counter() - started


def run_rounds(contenders: Sequence[Contender], rounds: int, pause_s: float, settle: bool = False) -> float:
    """Interleaved rounds, starting with a different contender each round; a pause before each
    sample lets the previous library's spinning worker threads go to sleep. With `settle`, a sample
    on another library's threads than the previous sample's also waits until the process's other
    threads are idle (`wait_for_quiet`). Returns the seconds spent settling."""
    settled = 0.0
    previous: str | None = None
    for r in range(rounds):
        for i in range(len(contenders)):
            c = contenders[(r + i) % len(contenders)]
            time.sleep(pause_s)
            if settle and (previous is None or c.pool != previous):
                settled += wait_for_quiet()
            previous = c.pool
            c.samples_s.append(c.sample(c.number))
    return settled


def numpy_contender(x: np.ndarray, w: np.ndarray) -> Contender:
    """numpy `x @ w.T` (OpenBLAS): the vendor call the SDK dispatcher routes to."""

    def numpy_call() -> np.ndarray:
        return x @ w.T

    return Contender("numpy", python_sampler(numpy_call), numpy_call, pool="openblas")


def vendor_contenders(torch: Any, x: np.ndarray, w: np.ndarray) -> list[Contender]:
    """numpy `x @ w.T` (OpenBLAS) and, unless `torch` is None, torch `F.linear` on the same arrays; the
    caller holds torch.inference_mode()."""
    if torch is None:
        return [numpy_contender(x, w)]
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    linear = torch.nn.functional.linear

    def torch_call() -> Any:
        return linear(xt, wt)

    return [
        numpy_contender(x, w),
        Contender("torch", python_sampler(torch_call), lambda: torch_call().numpy(), pool="torch"),
    ]


def max_abs_errors(contenders: Sequence[Contender], expected: np.ndarray) -> dict[str, float]:
    import numpy as np

    return {c.name: float(np.max(np.abs(c.output() - expected))) for c in contenders}


# ------------------------------------------------------------------------------------------------
# Formatting
# ------------------------------------------------------------------------------------------------


def us(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e6:.1f}"


def ratio(num: float | None, den: float | None) -> str:
    return "n/a" if num is None or den is None else f"{num / den:.2f}"


def paired(
    a: Callable[[], object], b: Callable[[], object], seconds: float, names: tuple[str, str] = ("a", "b")
) -> dict[str, float]:
    """Medians of per-call times of `a` and `b` called alternately (a, b, b, a, a, b, ...) for about `seconds`, the
    median of the per-pair differences (a - b) and their quartiles: both see the same machine at almost the same
    moment, so a loaded host's swings cancel far better than in back-to-back samples minutes apart."""
    clock = time.perf_counter
    ta: list[float] = []
    tb: list[float] = []
    end = clock() + seconds
    flip = False
    while clock() < end or len(ta) < 50:
        first, second = (b, a) if flip else (a, b)  # each goes first half the time: no order bias
        t0 = clock()
        first()
        t1 = clock()
        second()
        t2 = clock()
        ta.append(t2 - t1 if flip else t1 - t0)
        tb.append(t1 - t0 if flip else t2 - t1)
        flip = not flip
    diffs = sorted(x - y for x, y in zip(ta, tb, strict=True))
    return {
        names[0]: statistics.median(ta),
        names[1]: statistics.median(tb),
        "difference": statistics.median(diffs),
        "difference_q1": diffs[len(diffs) // 4],
        "difference_q3": diffs[(3 * len(diffs)) // 4],
        "pairs": len(ta),
    }
