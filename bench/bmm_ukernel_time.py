"""batch_matmul uKernels with vendor routes vs numpy vs torch on attention: QKᵀ (T in M and N) and A·V (T in M and K).

Heads × head dim (default 12 × 64, BERT-base); the job's distribution is T uniform in 1..--t-max as a joint
Explicit one (the diagonal of the class grid). The tuner plans its classes, builds its uKernels and routes
every class where numpy was faster to numpy; then the dispatcher (as shipped), numpy and torch are timed
at a sample of T (alternating, best of rounds), and the dispatcher's speedup over each is summarised as a
geometric mean and the worst T. Timings on a shared machine are noisy: compare within one run.

    PYTHONPATH=.:clients/python python bench/bmm_ukernel_time.py [--heads 12] [--d 64] [--t-max 512]
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAMPLE_T = (1, 2, 3, 4, 7, 8, 13, 16, 31, 32, 50, 64, 100, 128, 200, 256, 384, 511, 512)


def _median(fn: Callable[[], object], min_seconds: float = 0.02) -> float:
    fn()
    samples: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 2000):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _best_of(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    best = dict.fromkeys(fns, math.inf)
    for _ in range(rounds):  # alternating, so load on the machine weighs on all three alike
        for name, fn in fns.items():
            best[name] = min(best[name], _median(fn))
    return best


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--t-max", type=int, default=512)
    ap.add_argument("--ukernels", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    importlib.import_module("kernelfleet")  # first: its thread settings before numpy's and torch's pools start
    import numpy as np
    import torch

    from kernelfleet import vendor
    from service.tuning.hardware import host_target
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.ukernel.bmm_tuner import BmmRangeTask, BmmUKernelTuner, random_pair, verify_bmm
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink

    torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
    target = tvm_target(host_target())
    sample = [t for t in SAMPLE_T if t <= args.t_max]
    cases: dict[str, tuple[dict[str, int], Callable[[int], dict[str, int]], str]] = {
        "QK^T": ({"B": args.heads, "K": args.d}, lambda t: {"M": t, "N": t}, "BNK"),
        "A.V": ({"B": args.heads, "N": args.d}, lambda t: {"M": t, "K": t}, "BKN"),
    }
    for name, (static, tup, layout) in cases.items():
        support = [(tup(t), 1.0) for t in range(1, args.t_max + 1)]
        task = BmmRangeTask(
            static=static,
            support=support,
            target=target,
            work_dir=Path(tempfile.mkdtemp()),
            max_ukernels=args.ukernels,
        )
        began = time.perf_counter()
        outcome = BmmUKernelTuner().tune(task, QuietRangeSink())
        tuned_s = time.perf_counter() - began
        d = outcome.dispatcher(static)
        assert verify_bmm(d, static) is None
        table = outcome.table
        cells = table.cells_of(layout)  # the routes for Bt as this case holds it
        planned = [c for c in table.grid() if cells[table.cell_index(c)] is not None]
        routes = [
            f"{table.class_bounds(c)[0][0]}..{table.class_bounds(c)[0][1]}:{cells[table.cell_index(c)]}"
            for c in planned
        ]
        built = sorted(str(r["id"]) for r in outcome.candidates)
        print(f"\n{name}  B={args.heads} {static}  tuned in {tuned_s:.1f} s, uKernels built {built}")
        print("  classes (T range: program): " + ", ".join(routes))
        head = ("T", "program", "ours µs", "numpy µs", "torch µs", "vs numpy", "vs torch")
        print("  {:>4} {:>12} {:>10} {:>10} {:>10} {:>9} {:>9}".format(*head))
        vs_np, vs_torch = [], []
        for t in sample:
            shape = {**static, **tup(t)}
            # as attention holds them: K[B,T,d] contiguous for QKᵀ (Bt = K), V[B,T,d] for A·V (Bt = Vᵀ, a view)
            a, bt = random_pair(shape, seed=t, bt_layout=layout)
            b = bt.transpose(0, 2, 1)  # numpy's right operand: Kᵀ (a view) or V (contiguous)
            out = np.empty((a.shape[0], a.shape[1], bt.shape[1]), np.float32)
            tensors: Any = (torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out))
            best = _best_of(
                {
                    "ours": lambda d=d, a=a, bt=bt, out=out: d(a, bt, out),
                    "numpy": lambda a=a, b=b, out=out: np.matmul(a, b, out=out),
                    "torch": lambda ts=tensors: torch.bmm(ts[0], ts[1], out=ts[2]),
                },
                args.rounds,
            )
            vs_np.append(best["numpy"] / best["ours"])
            vs_torch.append(best["torch"] / best["ours"])
            prog = d.program(shape, layout) or "miss"
            print(
                f"  {t:>4} {prog:>12} {best['ours'] * 1e6:>10.1f} {best['numpy'] * 1e6:>10.1f} "
                f"{best['torch'] * 1e6:>10.1f} {vs_np[-1]:>8.2f}x {vs_torch[-1]:>8.2f}x"
            )
        ours_classes = sum(1 for c in cells if c is not None and not vendor.is_vendor(c))
        print(
            f"  dispatcher speedup: vs numpy geomean {_geomean(vs_np):.2f}x worst {min(vs_np):.2f}x; "
            f"vs torch geomean {_geomean(vs_torch):.2f}x worst {min(vs_torch):.2f}x "
            f"(classes on uKernels: {ours_classes}/{len(planned)})"
        )


if __name__ == "__main__":
    main()
