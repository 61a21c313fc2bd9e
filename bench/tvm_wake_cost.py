"""What a uKernel call pays when TVM's worker has gone to sleep since the last one (issue 33: the tables' forward).

Inside an accelerated forward, uKernel calls are separated by the model's own ops (attention, norms: 0.1-2 ms on one
thread). TVM's worker spins TVM_THREAD_POOL_SPIN_COUNT sched_yield()s after a call and then sleeps; the SDK sets that
count to 1000 (kernelfleet.runtime: off the cores before a BLAS call needs them). This bench builds a BERT-base
768×768 uKernel (mt6, nt64, the job's `build_ukernel` for this host), keeps `--copies` packed weights so that each
call streams its weight from beyond L2 as in a model, and times single calls after a gap of: nothing, a busy wait of
100 / 500 / 2000 µs on the calling thread, or a one-thread PyTorch GEMM (256×768×768, a stand-in for the model's own
ops). Each spin count in `--spin-counts` runs in a child process (TVM reads it when its pool starts); medians and
quartiles of `--calls` calls per gap.

    PYTHONPATH=.:clients/python .venv/bin/python bench/tvm_wake_cost.py --spin-counts 1000,30000
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

GAPS: tuple[int | str, ...] = (0, 100, 500, 2000, "torch")


def child(calls: int, copies: int, m: int) -> None:
    import numpy as np
    import torch

    from kernelfleet.tvm_runtime import aligned_empty
    from service.tuning.hardware import host_target
    from service.tuning.platforms import tvm_target
    from service.tuning.tuners.ukernel.kernel import build_ukernel

    torch.set_num_threads(1)  # as inside a forward that runs uKernels (kernelfleet.torch_forward)
    n = k = 768
    uk = build_ukernel(n, k, 6, 64, 4, tvm_target(host_target()))
    rng = np.random.default_rng(0)
    weights = [uk.device_weight(uk.pack_weight(rng.standard_normal((n, k), dtype=np.float32))) for _ in range(copies)]
    x = aligned_empty((m, k), "float32")
    x[...] = rng.standard_normal((m, k))
    out = aligned_empty((m, n), "float32")
    other, other_w = torch.randn(256, k), torch.randn(k, k)

    def busy(us: float) -> None:
        end = time.perf_counter() + us * 1e-6
        while time.perf_counter() < end:
            pass

    for gap in GAPS:
        seconds = []
        for i in range(calls):
            if gap == "torch":
                torch.nn.functional.linear(other, other_w)
            elif gap:
                busy(float(gap))
            began = time.perf_counter()
            uk.run_aligned(x, weights[i % copies], out)
            seconds.append(time.perf_counter() - began)
        q1, _, q3 = statistics.quantiles(seconds, n=4)
        label = f"{gap} µs busy" if isinstance(gap, int) else "a PyTorch GEMM"
        print(
            f"  after {label:>14}: median {statistics.median(seconds) * 1e6:6.0f} µs "
            f"(quartiles {q1 * 1e6:.0f}-{q3 * 1e6:.0f})",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spin-counts", default="1000,30000")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--copies", type=int, default=60, help="packed weights called in turn (60: 135 MiB)")
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.calls, args.copies, args.m)
        return
    from common import cpu_model

    print(f"# {cpu_model()}, {len(os.sched_getaffinity(0))} cores; 768x768 uKernel at M = {args.m}")
    for count in (c for c in args.spin_counts.split(",") if c):
        print(f"TVM_THREAD_POOL_SPIN_COUNT={count}", flush=True)
        env = {**os.environ, "TVM_THREAD_POOL_SPIN_COUNT": count}
        argv = [sys.argv[0], "--child", "--calls", str(args.calls), "--copies", str(args.copies), "--m", str(args.m)]
        subprocess.run([sys.executable, *argv], env=env, check=True)


if __name__ == "__main__":
    main()
