"""Gated MLPs with and without gate/up stacking, in one process (issue 33 item 2).

`accelerate` runs a SwiGLU MLP's gate and up projections as one dense layer of twice the width (kernelfleet.
torch_fusion.GatedPair). This compares, on the held-out Llama-style model of `whole_model.py` (2 layers, SwiGLU
1024↔2816, RMSNorm, RoPE): PyTorch eager, `accelerate` as it is (stacked), and `accelerate` with stacking turned
off for this comparison (gate + SiLU fused into one table, up on another: what it ran before). The tables of both
are tuned on this host first (the `whole_model.py` tuner and signed cache; `--reuse-tables` keeps cached ones).
The three contenders alternate their order per round; a sample is at least 0.2 s of back-to-back forwards;
medians of `--rounds` rounds with min–max, at the default thread settings and `thread_policy="managed"`.

    PYTHONPATH=.:clients/python .venv/bin/python bench/accelerate_stacking.py --reuse-tables
"""

from __future__ import annotations

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from common import cpu_model
from whole_model import DEFAULT_CACHE, SignedCache, build_model, extract_workloads, tune_all


def _sample(model: Any, x: Any, min_s: float = 0.2) -> float:
    calls, began = 0, time.perf_counter()
    while True:
        model(inputs_embeds=x)
        calls += 1
        elapsed = time.perf_counter() - began
        if elapsed >= min_s:
            return elapsed / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seqs", default="1,8,64")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--reuse-tables", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("bench/results/accelerate_stacking.md"))
    args = ap.parse_args()
    args.device = "cpu"
    import kernelfleet.torch as kt
    from kernelfleet import torch_fusion

    seqs = [int(s) for s in args.seqs.split(",")]
    model = build_model("llama", args.layers)
    signed = SignedCache(args.cache_dir)
    points = [(1, s, 1.0 / len(seqs)) for s in seqs]
    contenders: dict[str, Any] = {"eager": model}
    for mode in ("stacked", "unstacked"):
        torch_fusion.STACK_GATED_PAIRS = mode == "stacked"  # what extract_torch lists and accelerate runs
        try:
            workloads, _ = extract_workloads(model, "llama", points, "cpu")
            tuning = tune_all(workloads, args, signed)
            fast = kt.accelerate(model, args.cache_dir, target=tuning["target"], trusted_key=signed.public,
                                 telemetry=False, print_summary=False)  # fmt: skip
        finally:
            torch_fusion.STACK_GATED_PAIRS = True
        off = [name for name, layer in fast.layers.items() if not layer._on]
        if off:
            raise SystemExit(f"{mode}: layers without a table: {off}")
        contenders[mode] = fast
        print(f"{mode}: {len(fast.layers)} layers on tables, tuning {tuning['wall_s']:.1f} s", flush=True)

    names = list(contenders)
    lines = [
        "# Gated MLPs: gate/up stacked vs not (issue 33 item 2) — `bench/accelerate_stacking.py`",
        "",
        f"Run {time.strftime('%Y-%m-%dT%H:%M:%S')}: `{' '.join(['bench/accelerate_stacking.py', *sys.argv[1:]])}`; "
        f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads (default), thread_policy "
        "managed; Llama-style "
        f"{args.layers} layers, batch 1; {args.rounds} alternating rounds, medians [min–max] in ms.",
        "",
        "| seq | eager | stacked | unstacked | eager/stacked | eager/unstacked | unstacked/stacked |",
        "|---|---|---|---|---|---|---|",
    ]
    with torch.inference_mode():
        for s in seqs:
            x = torch.randn(1, s, 1024)
            for m in contenders.values():
                for _ in range(3):
                    m(inputs_embeds=x)
            times: dict[str, list[float]] = {k: [] for k in names}
            for r in range(args.rounds):
                for k in names[r % len(names) :] + names[: r % len(names)]:
                    times[k].append(_sample(contenders[k], x) * 1e3)
            med = {k: statistics.median(v) for k, v in times.items()}
            cells = [f"{med[k]:.2f} [{min(times[k]):.2f}–{max(times[k]):.2f}]" for k in names]
            ratios = (med["eager"] / med["stacked"], med["eager"] / med["unstacked"], med["unstacked"] / med["stacked"])
            lines.append(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(f"{r:.2f}×" for r in ratios) + " |")
            print(lines[-1], flush=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
