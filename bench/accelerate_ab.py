"""Two settings of `accelerate` against each other and against eager PyTorch, in one process (issue 33).

`--compare` picks what differs between variant A and variant B; everything else is the same model, the same
tables (tuned on this host first with the `whole_model.py` tuner and signed cache; `--reuse-tables` keeps cached
ones) and the default thread settings, with torch and numpy imported before kernelfleet:

- `stacking`: a SwiGLU MLP's gate and up projections as one stacked dense layer (A, what `accelerate` runs) or
  gate + SiLU fused into one table and up on another (B) — item 2;
- `vendor-routes`: the S a table gives to a vendor library run on PyTorch (A, `vendor_routes="pytorch"`) or on the
  library the table names, numpy where it timed numpy faster in isolation (B, `vendor_routes="table"`).

The three contenders alternate their order per round; a sample is at least 0.2 s of back-to-back forwards;
medians of `--rounds` rounds with min–max.

    PYTHONPATH=.:clients/python .venv/bin/python bench/accelerate_ab.py --compare stacking --model llama --reuse-tables
    PYTHONPATH=.:clients/python .venv/bin/python bench/accelerate_ab.py --compare vendor-routes --model bert
"""

from __future__ import annotations

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy  # noqa: F401  (the natural import order: numpy and torch before kernelfleet)
import torch
from common import cpu_model
from whole_model import DEFAULT_CACHE, SignedCache, build_model, extract_workloads, model_inputs, tune_all


@contextlib.contextmanager
def _stacking(on: bool) -> Iterator[None]:
    from kernelfleet import torch_fusion

    torch_fusion.STACK_GATED_PAIRS = on  # what extract_torch lists and accelerate runs
    try:
        yield
    finally:
        torch_fusion.STACK_GATED_PAIRS = True


# --compare → ((name A, setup A, accelerate kwargs A), (name B, ...)); a setup wraps extraction, tuning, accelerate
COMPARISONS: dict[str, tuple[tuple[str, Callable[[], Any], dict[str, Any]], ...]] = {
    "stacking": (
        ("stacked", lambda: _stacking(True), {}),
        ("unstacked", lambda: _stacking(False), {}),
    ),
    "vendor-routes": (
        ("pytorch", contextlib.nullcontext, {"vendor_routes": "pytorch"}),
        ("table", contextlib.nullcontext, {"vendor_routes": "table"}),
    ),
}


def _sample(model: Any, inputs: dict[str, Any], min_s: float = 0.2) -> float:
    calls, began = 0, time.perf_counter()
    while True:
        model(**inputs)
        calls += 1
        elapsed = time.perf_counter() - began
        if elapsed >= min_s:
            return elapsed / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare", choices=sorted(COMPARISONS), required=True)
    ap.add_argument("--model", default="llama", help="bert, gpt2, distilbert or llama (whole_model.build_model)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seqs", default="1,8,64")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--reuse-tables", action="store_true")
    ap.add_argument("--max-ukernels", type=int, default=3, help="uKernels per table (as whole_model.py)")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/accelerate_<compare>_<model>.md")
    args = ap.parse_args()
    args.device = "cpu"
    import kernelfleet.torch as kt

    out = args.out or Path(f"bench/results/accelerate_{args.compare.replace('-', '_')}_{args.model}.md")
    seqs = [int(s) for s in args.seqs.split(",")]
    model = build_model(args.model, args.layers)
    signed = SignedCache(args.cache_dir)
    points = [(1, s, 1.0 / len(seqs)) for s in seqs]
    contenders: dict[str, Any] = {"eager": model}
    for name, setup, kwargs in COMPARISONS[args.compare]:
        with setup():
            workloads, _ = extract_workloads(model, args.model, points, "cpu")
            tuning = tune_all(workloads, args, signed)
            fast = kt.accelerate(model, args.cache_dir, target=tuning["target"], trusted_key=signed.public,
                                 telemetry=False, print_summary=False, **kwargs)  # fmt: skip
        off = [layer for layer, wrapper in fast.layers.items() if not wrapper._on]
        if off:
            raise SystemExit(f"{name}: layers without a table: {off}")
        contenders[name] = fast
        print(f"{name}: {len(fast.layers)} layers on tables, tuning {tuning['wall_s']:.1f} s", flush=True)

    names = list(contenders)
    a, b = names[1], names[2]
    lines = [
        f"# `accelerate` A/B: {args.compare} — `bench/accelerate_ab.py`",
        "",
        f"Run {time.strftime('%Y-%m-%dT%H:%M:%S')}: `{' '.join(['bench/accelerate_ab.py', *sys.argv[1:]])}`; "
        f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads (default), thread_policy "
        f"managed; {args.model}, {args.layers} layers, batch 1; {args.rounds} alternating rounds, medians "
        "[min–max] in ms.",
        "",
        f"| seq | eager | {a} | {b} | eager/{a} | eager/{b} | {b}/{a} |",
        "|---|---|---|---|---|---|---|",
    ]
    vocab = int(getattr(model.config, "vocab_size", 30522))
    with torch.inference_mode():
        for s in seqs:
            inputs = model_inputs(args.model, 1, s, vocab)
            for m in contenders.values():
                for _ in range(3):
                    m(**inputs)
            times: dict[str, list[float]] = {k: [] for k in names}
            for r in range(args.rounds):
                for k in names[r % len(names) :] + names[: r % len(names)]:
                    times[k].append(_sample(contenders[k], inputs) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            cells = [f"{med[k]:.2f} [{min(times[k]):.2f}–{max(times[k]):.2f}]" for k in names]
            ratios = (med["eager"] / med[a], med["eager"] / med[b], med[b] / med[a])
            lines.append(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.2f}×" for r in ratios) + " |")
            print(lines[-1], flush=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
