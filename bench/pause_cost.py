"""What a pause before a timing block costs the block, and whom (issue 33 round 6: the tuner's timing order).

A `ukernel` job decides each route from paired rounds of blocks, each block after a short sleep (`tuner.settle`,
so the previous library's spinning threads are asleep). This bench repeats that pattern with a BERT-base
768×768 uKernel (the job's own `build_ukernel`, the SDK's thread settings) and PyTorch's `F.linear` at M rows:
`--blocks` rounds of (sleep P ms, uKernel block, sleep P ms, PyTorch block), each block a `tuner.median_call`, for
each pause P in `--pauses-ms`, on all cores (torch and TVM at their defaults). Per pause: each side's median
block and how many uKernel blocks ran at least 1.4× slower than its fastest one (on two cores: at about its
one-thread speed).

`--apart`: the blocks run as a job's paired rounds now do, with this thread pinned to its core and the process's
other threads (TVM's worker, PyTorch's) to the others (service.tuning.tuners.ukernel.cores.apart).

    PYTHONPATH=.:clients/python .venv/bin/python bench/pause_cost.py [--apart]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time

import numpy as np
import torch
from common import cpu_model

from kernelfleet.tvm_runtime import aligned_empty
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.cores import apart
from service.tuning.tuners.ukernel.kernel import build_ukernel
from service.tuning.tuners.ukernel.tuner import median_call

SLOW = 1.4  # a block this much slower than the side's fastest counts as slow


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--m", type=int, default=64)
    p.add_argument("--n", type=int, default=768)
    p.add_argument("--k", type=int, default=768)
    p.add_argument("--tile", default="4x96x4", help="mt x nt x kt (the tuner's first AVX-512 tile for 768x768)")
    p.add_argument("--pauses-ms", default="5,20,50")
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--apart", action="store_true", help="this thread and the others on separate cores")
    args = p.parse_args()
    mt, nt, kt = (int(v) for v in args.tile.split("x"))
    uk = build_ukernel(args.n, args.k, mt, nt, kt, tvm_target(host_target()))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((args.n, args.k), dtype=np.float32)
    x = aligned_empty((args.m, args.k), "float32")
    x[...] = rng.standard_normal((args.m, args.k))
    y = aligned_empty((args.m, args.n), "float32")
    packed = uk.device_weight(uk.pack_weight(w))
    sides = {
        "ukernel": functools.partial(uk.run_aligned, x, packed, y),
        "torch": functools.partial(torch.nn.functional.linear, torch.from_numpy(x), torch.from_numpy(w)),
    }
    for fn in sides.values():
        fn()  # both pools run before `apart` pins this process's threads
    print(
        f"{cpu_model()}, torch threads {torch.get_num_threads()}, dense {args.n}x{args.k} at M={args.m}"
        + (", timing thread apart from the others" if args.apart else "")
    )
    with apart() if args.apart else contextlib.nullcontext():
        run(sides, args)


def run(sides: dict[str, functools.partial[object]], args: argparse.Namespace) -> None:
    for pause in (float(v) / 1e3 for v in args.pauses_ms.split(",")):
        blocks: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.blocks):
            for name, fn in sides.items():
                time.sleep(pause)
                blocks[name].append(median_call(fn, 0.002, 5))
        line = [f"pause {pause * 1e3:4.0f} ms:"]
        for name, b in blocks.items():
            slow = sum(v > SLOW * min(b) for v in b)
            median, fastest = statistics.median(b) * 1e6, min(b) * 1e6
            line.append(f"{name} median {median:6.0f} us (fastest {fastest:.0f}, {slow}/{len(b)} slow)")
        print("  ".join(line), flush=True)


if __name__ == "__main__":
    main()
