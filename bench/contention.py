"""Thread contention between the SDK dispatcher (TVM's thread pool) and numpy (OpenBLAS's) in one process.

Dense 512→1024 (K=512, N=1024) at M = 65..96, as issue 10 item 4 reported it. Each mode runs in
`--processes` fresh processes (where each library's worker threads land is decided per process,
which is what made the slowdown bimodal). A process times, in interleaved blocks and with no sleeps:
- `dispatcher alone`: calls of the SDK Dispatcher back to back;
- `numpy alone`: `x @ w.T` back to back;
- `alternating`: dispatcher, numpy, dispatcher, numpy, ... each call timed on its own;
and reports the median call per library, alone and alternating. Goal: in every process, both libraries
alternating within 15 % of their times alone.

Modes:
- `defaults`: both libraries as they default (KERNELFLEET_NO_THREAD_CONFIG=1): the behaviour before the fix;
- `sdk`: `import kernelfleet` before numpy (kernelfleet.runtime configures TVM; since issue 33 item 3 it leaves
  OpenBLAS as the host set it, so OpenBLAS spins as it defaults here too);
- `numpy-first`: numpy imported first (the same settings now; the import order alone differs).

    PYTHONPATH=.:clients/python .venv/bin/python bench/contention.py                # all modes, 5 processes each
    PYTHONPATH=.:clients/python .venv/bin/python bench/contention.py --modes sdk --processes 3
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from common import STRIPPED_ENV, blas_info, host_info, write_json

from service.tuning.platforms import tvm_target

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = BENCH_DIR / "results" / "contention.json"
N, K = 1024, 512
M_RANGE = range(65, 97)
GOAL = 1.15  # alternating / alone, per library and process
MODES = ("defaults", "sdk", "numpy-first")
# variables that decide the thread pools: children start from none of them, each mode sets its own
THREAD_ENV = ("TVM_NUM_THREADS", "TVM_BIND_THREADS", "TVM_THREAD_POOL_SPIN_COUNT", "OPENBLAS_THREAD_TIMEOUT")


def build_kernel(directory: Path) -> dict[str, Any]:
    """One uKernel for the layer, chosen by the rules as a ukernel job would, exported like a job's artifact."""
    from service.tuning.hardware import host_target
    from service.tuning.hardware_model import HardwareModel
    from service.tuning.tuners.ukernel.kernel import build_ukernel
    from service.tuning.tuners.ukernel.rules import dense_candidates

    best = dense_candidates(HardwareModel.from_host(), N, K, representative_m=80, top_k=1, distinct_mt=True)[0]
    artifact = build_ukernel(N, K, best.mt, best.nt, best.kt, tvm_target(host_target())).export(directory)
    return {"path": str(artifact.path), "sha256": artifact.sha256, "spec": artifact.spec.to_dict()}


# ------------------------------------------------------------------------------------------------
# One fresh process
# ------------------------------------------------------------------------------------------------


def child(mode: str, kernel: dict[str, Any], blocks: int, reps: int) -> dict[str, Any]:
    # the import order is the experiment: kernelfleet configures the thread pools when it is imported
    # (unless KERNELFLEET_NO_THREAD_CONFIG), and OpenBLAS only if numpy has not loaded it yet
    first = ("numpy", "kernelfleet") if mode == "numpy-first" else ("kernelfleet", "numpy")
    for name in first:
        importlib.import_module(name)
    import numpy as np

    from kernelfleet.dispatch import DispatchTable, Interval, Shape
    from kernelfleet.dispatcher import Dispatcher
    from kernelfleet.ukernel import UKernelSpec, load_ukernel

    spec = UKernelSpec.from_dict(kernel["spec"])
    uk = load_ukernel(Path(kernel["path"]), spec, kernel["sha256"])
    table = DispatchTable((Interval(1, M_RANGE.stop, Shape((), "u")),), {"u": spec.mt})
    dispatcher = Dispatcher(table, {"u": uk}, N=N, K=K)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K), dtype=np.float32)
    dispatcher.prepare(w)
    xs = [rng.standard_normal((m, K), dtype=np.float32) for m in M_RANGE]
    for x in xs:  # correctness, and every S's program memoised before timing
        np.testing.assert_allclose(dispatcher(x, w), x @ w.T, rtol=1e-3, atol=1e-3)

    def ukernel(x: Any) -> None:
        dispatcher(x, w)

    def numpy_call(x: Any) -> None:
        x @ w.T

    times: dict[str, list[float]] = {"dispatcher_alone": [], "numpy_alone": [], "dispatcher_alt": [], "numpy_alt": []}
    clock = time.perf_counter
    for _ in range(blocks):
        for name, fn in (("dispatcher_alone", ukernel), ("numpy_alone", numpy_call)):
            for _ in range(reps):
                for x in xs:
                    t0 = clock()
                    fn(x)
                    times[name].append(clock() - t0)
        for _ in range(reps):
            for x in xs:
                t0 = clock()
                ukernel(x)
                t1 = clock()
                numpy_call(x)
                t2 = clock()
                times["dispatcher_alt"].append(t1 - t0)
                times["numpy_alt"].append(t2 - t1)
    med = {name: statistics.median(v) for name, v in times.items()}
    from threadpoolctl import threadpool_info

    return {
        "median_s": med,
        "dispatcher_ratio": med["dispatcher_alt"] / med["dispatcher_alone"],
        "numpy_ratio": med["numpy_alt"] / med["numpy_alone"],
        "env": {name: os.environ.get(name, "unset") for name in THREAD_ENV},
        "blas_threads": [i.get("num_threads") for i in threadpool_info() if i.get("user_api") == "blas"],
        "loadavg": [round(v, 2) for v in os.getloadavg()],
    }


def run_child(mode: str, kernel_json: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in (*STRIPPED_ENV, *THREAD_ENV)}
    if mode == "defaults":
        env["KERNELFLEET_NO_THREAD_CONFIG"] = "1"
    else:
        env.pop("KERNELFLEET_NO_THREAD_CONFIG", None)
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", mode, "--kernel-json", str(kernel_json)]
    cmd += ["--blocks", str(args.blocks), "--reps", str(args.reps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    worst = max(max(r["dispatcher_ratio"], r["numpy_ratio"]) for r in runs)
    return {
        "processes": len(runs),
        "within_goal": sum(max(r["dispatcher_ratio"], r["numpy_ratio"]) <= GOAL for r in runs),
        "worst_ratio": worst,
        "met": worst <= GOAL,
    }


def environment_lines(env: dict[str, Any]) -> list[str]:
    blas = "; ".join(f"{b['internal_api']} {b['version']} ({b['architecture']})" for b in env["blas"])
    return [
        f"CPU: {env['cpu_model']}, {env['cores']} cores; load average {env['loadavg']} before measuring",
        f"TVM {env['tvm']} (target {env['tvm_target_str']}), numpy {env['numpy']} with {blas or 'no BLAS found'}",
    ]


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# Dispatcher and numpy alternating in one process: dense {K}→{N}, M = {M_RANGE.start}..{M_RANGE.stop - 1}",
        "",
        f"- command: `{data['command']}`",
        *(f"- {line}" for line in environment_lines(data["environment"])),
        "- the machine is shared (other jobs ran beside this one): see each process's load average",
        f"- per process: {data['blocks']} interleaved blocks of {data['reps']}×{len(M_RANGE)} calls per library "
        "alone and alternating; median µs per call; no sleeps anywhere",
        f"- goal: alternating ≤ {GOAL:.2f}× alone for both libraries in every process",
        "",
        "| mode | process | dispatcher alone µs | dispatcher alternating µs | ratio | numpy alone µs | "
        "numpy alternating µs | ratio | load avg | thread env |",
        "|" + "---|" * 10,
    ]
    for mode, entry in data["modes"].items():
        for i, r in enumerate(entry["runs"], 1):
            m = r["median_s"]
            env = ", ".join(f"{k}={v}" for k, v in r["env"].items() if v != "unset") or "none set"
            lines.append(
                f"| {mode} | {i} | {m['dispatcher_alone'] * 1e6:.0f} | {m['dispatcher_alt'] * 1e6:.0f} | "
                f"{r['dispatcher_ratio']:.2f} | {m['numpy_alone'] * 1e6:.0f} | {m['numpy_alt'] * 1e6:.0f} | "
                f"{r['numpy_ratio']:.2f} | {r['loadavg'][0]} | {env} |"
            )
    lines += ["", "| mode | processes within goal | worst ratio | goal met |", "|---|---|---|---|"]
    for mode, entry in data["modes"].items():
        s = entry["summary"]
        met = "yes" if s["met"] else "**NO**"
        lines.append(f"| {mode} | {s['within_goal']}/{s['processes']} | {s['worst_ratio']:.2f} | {met} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    p.add_argument("--processes", type=int, default=5, help="fresh processes per mode (default 5)")
    p.add_argument("--blocks", type=int, default=3, help="interleaved blocks per process (default 3)")
    p.add_argument("--reps", type=int, default=5, help="passes over M=65..96 per block (default 5)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--kernel-json", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kernel = json.loads(args.kernel_json.read_text())
        print(json.dumps(child(args.child, kernel, args.blocks, args.reps)), flush=True)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = sorted(set(modes) - set(MODES))
    if unknown or args.processes < 1:
        p.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}; --processes ≥ 1")
    command = " ".join([os.path.relpath(sys.executable), os.path.relpath(sys.argv[0]), *(argv or sys.argv[1:])])
    data: dict[str, Any] = {
        "benchmark": "contention",
        "command": command,
        "blocks": args.blocks,
        "reps": args.reps,
        "environment": {**host_info(), "blas": blas_info()},
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="kf-bench-contention-") as tmp:
        kernel_json = Path(tmp) / "kernel.json"
        kernel_json.write_text(json.dumps(build_kernel(Path(tmp))))
        # modes interleaved process by process, so machine load drifts hit every mode alike
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for i in range(args.processes):
            for mode in modes:
                r = run_child(mode, kernel_json, args)
                runs[mode].append(r)
                m = {k: v * 1e6 for k, v in r["median_s"].items()}
                print(
                    f"{mode:12s} process {i + 1}: dispatcher {r['dispatcher_ratio']:.2f}× "
                    f"({m['dispatcher_alone']:.0f} → {m['dispatcher_alt']:.0f} µs), numpy {r['numpy_ratio']:.2f}× "
                    f"({m['numpy_alone']:.0f} → {m['numpy_alt']:.0f} µs), load {r['loadavg'][0]}",
                    flush=True,
                )
    for mode in modes:
        data["modes"][mode] = {"runs": runs[mode], "summary": summarise(runs[mode])}
        s = data["modes"][mode]["summary"]
        print(f"{mode}: {s['within_goal']}/{s['processes']} within {GOAL:.2f}×, worst {s['worst_ratio']:.2f}×")
    write_json(args.out, data)
    args.out.with_suffix(".md").write_text(markdown(data))
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
