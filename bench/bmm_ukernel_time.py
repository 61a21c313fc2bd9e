"""batch_matmul uKernels with vendor routes vs numpy vs torch on attention: QKᵀ (T in M and N) and A·V (T in M and K).

Heads × head dim (default 12 × 64, BERT-base); the job's distribution is T uniform in 1..--t-max as a joint
Explicit one (the diagonal of the class grid). The tuner plans its classes, builds its uKernels and routes
every class where numpy was faster to numpy; then the dispatcher (as shipped), numpy and torch are timed
at a sample of T (alternating, best of rounds), and the dispatcher's speedup over each is summarised as a
geometric mean and the worst T. Timings on a shared machine are noisy: compare within one run.

    PYTHONPATH=.:clients/python python bench/bmm_ukernel_time.py [--heads 12] [--d 64] [--t-max 512]
"""

from __future__ import annotations

import kernelfleet  # noqa: F401  (first: thread settings before numpy's BLAS starts)

import argparse
import math
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kernelfleet.dispatch import VENDOR
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.bmm_tuner import BmmRangeTask, random_pair, tune_bmm_range, verify_bmm


def _median(fn: Callable[[], object], min_seconds: float = 0.02) -> float:
    fn()
    samples: list[float] = []
    deadline = time.perf_counter() + min_seconds
    while len(samples) < 5 or (time.perf_counter() < deadline and len(samples) < 2000):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--t-max", type=int, default=512)
    ap.add_argument("--ukernels", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(max(1, len(__import__("os").sched_getaffinity(0))))
    target = tvm_target(host_target())
    sample = sorted({1, 2, 3, 4, 7, 8, 13, 16, 31, 32, 50, 64, 100, 128, 200, 256, 384, 511, 512} & set(range(1, args.t_max + 1)))
    cases = {
        "QK^T": ({"B": args.heads, "K": args.d}, lambda t: {"M": t, "N": t}),
        "A.V": ({"B": args.heads, "N": args.d}, lambda t: {"M": t, "K": t}),
    }
    for name, (static, tup) in cases.items():
        support = [(tup(t), 1.0) for t in range(1, args.t_max + 1)]
        task = BmmRangeTask(static=static, support=support, target=target, work_dir=Path(tempfile.mkdtemp()),
                            max_ukernels=args.ukernels)
        began = time.perf_counter()
        outcome = tune_bmm_range(task)
        tuned_s = time.perf_counter() - began
        d = outcome.dispatcher(static)
        assert verify_bmm(d, static) is None
        table = outcome.table
        routed = [
            f"{table.class_bounds(c)[0][0]}..{table.class_bounds(c)[0][1]}:{table.cells[table.cell_index(c)]}"
            for c in table.grid()
            if table.cells[table.cell_index(c)] is not None
        ]
        print(f"\n{name}  B={args.heads} {static}  tuned in {tuned_s:.1f} s, uKernels {sorted(outcome.candidates[i]['id'] for i in range(len(outcome.candidates)))}")
        print("  classes (T range: program): " + ", ".join(routed))
        print(f"  {'T':>4} {'program':>14} {'ours µs':>10} {'numpy µs':>10} {'torch µs':>10} {'vs numpy':>9} {'vs torch':>9}")
        vs_np, vs_torch = [], []
        for t in sample:
            a, bt = random_pair({**static, **tup(t)}, seed=t)
            b = bt.transpose(0, 2, 1)
            out = np.empty((a.shape[0], a.shape[1], bt.shape[1]), np.float32)
            ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
            best = {"ours": math.inf, "numpy": math.inf, "torch": math.inf}
            for _ in range(args.rounds):
                best["ours"] = min(best["ours"], _median(lambda: d(a, bt, out)))
                best["numpy"] = min(best["numpy"], _median(lambda: np.matmul(a, b, out=out)))
                best["torch"] = min(best["torch"], _median(lambda: torch.bmm(ta, tb, out=tout)))
            vs_np.append(best["numpy"] / best["ours"])
            vs_torch.append(best["torch"] / best["ours"])
            prog = d.program({**static, **tup(t)}) or "miss"
            print(f"  {t:>4} {prog:>14} {best['ours'] * 1e6:>10.1f} {best['numpy'] * 1e6:>10.1f} "
                  f"{best['torch'] * 1e6:>10.1f} {vs_np[-1]:>8.2f}x {vs_torch[-1]:>8.2f}x")
        gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))  # noqa: E731
        print(f"  speedup of the dispatcher: vs numpy geomean {gm(vs_np):.2f}x worst {min(vs_np):.2f}x; "
              f"vs torch geomean {gm(vs_torch):.2f}x worst {min(vs_torch):.2f}x  (uKernel classes: "
              f"{sum(1 for c in table.cells if c not in (None, VENDOR))}/{sum(1 for c in table.cells if c)})")


if __name__ == "__main__":
    main()
