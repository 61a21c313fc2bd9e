"""How long one dense `ukernel` job takes, and what its vendor routes cost at run time (issue 22 item 6).

Runs `UKernelTuner.tune` for one dense layer (default N = K = 768, BERT's attention output) over
M = 1..S_max (default 512), as the job runner does, and prints the job's wall time, how many S were timed
against the vendor (numpy) to decide the routes and how each S was decided.

`--check-all` then times the published dispatcher (vendor routes included: there it calls numpy) against
numpy at EVERY S in 1..S_max with the tuner's own `time_against_vendor`, and prints the geomean and the
worst of vendor / ours (speedup; 1.0 where the route is the vendor, up to noise); an S more than 3 % slower
is re-timed (`--confirm`, keeping each side's fastest) so that a burst of other load is not reported as a
loss. `--rule sweep` decides with the older rule instead (every S ≤ 256, then a stride of 2, and the hot
shapes; the interval ends it also timed are left out); `--rule both` runs both jobs and checks them
alternating per S, for a comparison under the same load.

    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_job_time.py --check-all
    PYTHONPATH=.:clients/python .venv/bin/python bench/ukernel_job_time.py --check-all --rule both

Timings on a shared machine vary by several percent run to run; the job time by more under other load.
"""

from __future__ import annotations

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy or TVM load (see common.STRIPPED_ENV)
    import kernelfleet  # noqa: F401  (its thread settings must precede numpy: kernelfleet.runtime)

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from common import cpu_model

from kernelfleet.dispatcher import Dispatcher
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.tuners.ukernel import tuner as tuner_module
from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner, time_against_vendor
from service.tuning.tuners.ukernel.vendor_routes import Measured, VendorDecision, as_timing, decide, vendor_wins


def sweep_rule(
    s_max: int,
    predicted: Sequence[float],
    measure: Callable[[int], Measured],
    must: Iterable[int] = (),
    grid: Sequence[int] | None = None,
    max_points: int | None = None,
    confirm: object = None,
) -> VendorDecision:
    """The rule before issue 22 item 6, as a stand-in for `decide`: every S ≤ 256, a stride beyond, the hot shapes,
    each decided on its medians (no confirmation rounds)."""
    dense = 256
    shapes = set(range(1, min(s_max, dense) + 1)) | {s for s in must if 1 <= s <= s_max} | {s_max}
    if s_max > dense:
        shapes |= set(range(dense, s_max + 1, math.ceil(s_max / dense)))
    timed = {s: as_timing(measure(s)) for s in sorted(shapes)}
    medians = {s: (t.ours_s, t.vendor_s) for s, t in timed.items()}
    return VendorDecision(frozenset(vendor_wins(medians, s_max)), timed, {"measured": len(timed)})


def run_job(args: argparse.Namespace, rule: str, validate: list[int]) -> tuple[Dispatcher, Any]:
    tuner_module.decide = sweep_rule if rule == "sweep" else decide  # type: ignore[attr-defined]  # the one call site
    with tempfile.TemporaryDirectory() as work:
        task = RangeTask(
            workload=WorkloadSpec(op="dense", dims={"N": args.n, "K": args.k}, symbolic=["M"]),
            s_max=args.s_max,
            validate=validate,
            target=host_target(),
            max_ukernels=args.max_ukernels,
            work_dir=Path(work),
        )
        began = time.perf_counter()
        out = UKernelTuner().tune(task, QuietRangeSink())
        wall = time.perf_counter() - began
    routes = out.validation["vendor_routes"]
    print(f"[{rule}] job wall time: {wall:.1f} s (the job's own account: {out.seconds:.1f} s)")
    print(f"[{rule}] shapes timed against the vendor: {routes['shapes_timed']}; decided by: {routes['decided_by']}")
    print(f"[{rule}] vendor S: {routes['vendor_S']} in intervals {routes['intervals']}")
    print(f"[{rule}] uKernels shipped: {sorted(out.kernels)}")
    return Dispatcher(out.table, out.kernels, N=args.n, K=args.k), out


def check_all(args: argparse.Namespace, dispatchers: dict[str, tuple[Dispatcher, Any]]) -> None:
    """vendor/ours at every S for each rule's dispatcher, the rules alternating per S; a ratio under 0.97 is
    re-timed up to `--confirm` times, keeping each side's fastest (other load only ever adds time)."""
    began = time.perf_counter()
    timed: dict[str, dict[int, tuple[float, float]]] = {rule: {} for rule in dispatchers}
    for S in range(1, args.s_max + 1):
        for rule, (d, _) in dispatchers.items():
            ours, vendor = time_against_vendor(d, args.n, args.k, S)
            for _ in range(args.confirm):
                if vendor / ours >= 0.97:
                    break
                again = time_against_vendor(d, args.n, args.k, S)
                ours, vendor = min(ours, again[0]), min(vendor, again[1])
            timed[rule][S] = (ours, vendor)
    print(f"check at every S (1..{args.s_max}, {time.perf_counter() - began:.0f} s, confirm {args.confirm}):")
    for rule, (_, out) in dispatchers.items():
        speedup = {S: v / o for S, (o, v) in timed[rule].items()}
        worst = min(speedup, key=speedup.__getitem__)
        geomean = math.exp(statistics.fmean(math.log(v) for v in speedup.values()))
        route = "vendor" if out.table.vendor_at(worst) else "uKernel"
        print(f"  [{rule}] vendor/ours geomean {geomean:.3f}, worst {speedup[worst]:.3f} at S={worst} ({route} route)")
        ukernel_S = [S for S in speedup if not out.table.vendor_at(S)]
        if ukernel_S:
            worst_uk = min(ukernel_S, key=speedup.__getitem__)
            print(f"  [{rule}] worst on a uKernel route: {speedup[worst_uk]:.3f} at S={worst_uk}")
        slower = [S for S, v in speedup.items() if v < 0.97]
        print(f"  [{rule}] S more than 3 % slower than numpy: {len(slower)} {slower[:40]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=768)
    ap.add_argument("--k", type=int, default=768)
    ap.add_argument("--s-max", type=int, default=512)
    ap.add_argument("--validate", default="", help="hot shapes, comma-separated (default: S_max, 64, 1)")
    ap.add_argument("--max-ukernels", type=int, default=3)
    ap.add_argument(
        "--rule", choices=("grid", "sweep", "both"), default="grid", help="grid: decide(); sweep: the older rule"
    )
    ap.add_argument("--check-all", action="store_true", help="time the result against numpy at every S")
    ap.add_argument("--confirm", type=int, default=2, help="re-timings of an S the check finds >3 %% slower")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress, also into a log file

    default_hot = sorted({args.s_max, min(64, args.s_max), 1}, reverse=True)
    validate = [int(s) for s in args.validate.split(",") if s] or default_hot
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"layer: dense N={args.n} K={args.k}, M = 1..{args.s_max}, hot shapes {validate}")
    rules = ("grid", "sweep") if args.rule == "both" else (args.rule,)
    dispatchers = {rule: run_job(args, rule, validate) for rule in rules}
    if args.check_all:
        check_all(args, dispatchers)


if __name__ == "__main__":
    main()
