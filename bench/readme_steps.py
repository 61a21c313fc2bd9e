"""The README's three steps as a new user runs them, against a running service, then the model timed (issue 33).

Nothing of the bench's own tuning is used: `import torch, numpy` first, default thread settings, no environment
variable; the model is built from its config (held out: DistilBERT, 6 layers, or the Llama-style stack of
`whole_model.py`), then

1. `fleet.add_model(extract_torch(model, ...), {"kind": "llvm", "mcpu": "host"}, ranges=..., kind="ukernel")`,
2. `fleet.wait_model(m.id)` (the onboarding time is the wall time of steps 1 and 2, export included),
3. `fast = accelerate(model, fleet)`, which prints its summary,

as README.md writes them. Then eager, `fast` and `torch.compile(dynamic=True)` run the same inputs per sequence
length: `fast` first until its whole-forward check has chosen for that shape (`whole_model.settle_check`, the
forwards reported), then each warmed up (`--warmup-calls` forwards; compile's first call is its compile), then
interleaved rounds, each round starting with another contender (`common.interleaved`), medians with the rounds'
min–max. Ratios eager/accelerate and compile/accelerate per point, and the weighted
geomean over `whole_model.HISTOGRAM` (each point takes the weight of the histogram points nearest to it).

    .venv/bin/kernelfleet standalone &          # a fresh data dir: KERNELFLEET_DATA_DIR=/tmp/kf-readme
    PYTHONPATH=.:clients/python .venv/bin/python bench/readme_steps.py --model distilbert --seqs 1,8,64

One core on every side: run it under `taskset -c 0` (PyTorch's OpenMP and the SDK's TVM pool both size themselves
to the process's CPU affinity); the service's worker keeps its own cores.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy  # noqa: F401  (as a user's code does: numpy and torch load before kernelfleet)
import torch
from common import cpu_model, interleaved
from whole_model import build_model, geomean, model_inputs, seq_weights, settle_check


def onboard(model: Any, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """Steps 1 and 2 of the README, timed; the client and what the service did."""
    from torch.export import Dim

    import kernelfleet
    from kernelfleet.model_import import extract_torch

    fleet = kernelfleet.Client(args.url, api_key=Path(args.api_key_file).read_text().strip())
    ids = torch.randint(0, 100, (2, 16))
    began = time.perf_counter()
    graph = extract_torch(model, {"input_ids": ids}, {"input_ids": {0: Dim("batch"), 1: Dim("seq", max=args.s_max)}})
    m = fleet.add_model(
        graph, {"kind": "llvm", "mcpu": "host"}, ranges={"batch": (1, 1), "seq": (1, args.s_max)}, kind="ukernel"
    )
    done = fleet.wait_model(m.id, timeout_s=args.timeout_s)
    seconds = time.perf_counter() - began
    ops = [{"op": op.name, "state": op.state, "job": op.job_id} for op in done.ops]
    print(f"onboarded in {seconds:.1f} s (export, {len(ops)} jobs, wait): {done.state}; tags {graph.host_library}")
    return fleet, {"onboarding_s": seconds, "model_id": m.id, "ops": ops, "host_library": graph.host_library}


def write_json(args: argparse.Namespace, command: str, record: dict[str, Any], **fields: Any) -> None:
    """The run at `--json` (when given): the command, its arguments, the CPU and threads, the onboarding record and
    `fields`."""
    if not args.json:
        return
    threads = {"torch": torch.get_num_threads(), "tvm": os.environ.get("TVM_NUM_THREADS")}
    body = {"command": command, "args": vars(args) | {"json": str(args.json)}, "cpu": cpu_model(), "threads": threads}
    args.json.write_text(json.dumps({**body, **record, **fields}, indent=1, default=str))


def onboarding_arguments(ap: argparse.ArgumentParser) -> None:
    """The service, the key and the model `onboard` reads (besides `--s-max`)."""
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key-file", default=".kernelfleet/admin.key")
    ap.add_argument("--model", default="distilbert", choices=("distilbert", "llama", "bert", "gpt2"))
    ap.add_argument("--layers", type=int, default=0, help="default: the config's (DistilBERT 6, Llama-style 4)")
    ap.add_argument("--timeout-s", type=float, default=1800, help="how long the onboarding's jobs may take")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    onboarding_arguments(ap)
    ap.add_argument("--seqs", default="1,8,64")
    ap.add_argument("--s-max", type=int, default=128, help="the seq range onboarded: 1..s_max, batch 1")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-sample-s", type=float, default=0.2)
    ap.add_argument("--warmup-calls", type=int, default=40)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    seqs = [int(s) for s in args.seqs.split(",") if s]
    if max(seqs) > args.s_max:
        raise SystemExit(f"--seqs go past --s-max {args.s_max}")
    model = build_model(args.model, args.layers or None)
    if hasattr(model.config, "use_cache"):  # a KV cache in the output is no tensor tree torch.export can read
        model.config.use_cache = False
    fleet, record = onboard(model, args)

    from kernelfleet.torch import accelerate

    fast = accelerate(model, fleet)  # step 3: prints the summary
    contenders = {"eager": model, "accelerate": fast}
    if not args.no_compile:
        contenders["compile"] = torch.compile(model, dynamic=True)
    weights = seq_weights(seqs)
    rows = []
    with torch.inference_mode():
        for seq in seqs:
            inputs = model_inputs(args.model, 1, seq, model.config.vocab_size)
            calls = {name: (lambda m=m, i=inputs: m(**i)) for name, m in contenders.items()}
            check = settle_check(fast, inputs, lambda: None)  # a new shape's first requests pay it (reported)
            for _ in range(args.warmup_calls):
                for call in calls.values():
                    call()
            diff = (fast(**inputs).last_hidden_state - model(**inputs).last_hidden_state).abs().max().item()
            samples = interleaved(calls, args.rounds, args.min_sample_s)
            med = {name: statistics.median(s) for name, s in samples.items()}
            row = {
                "seq": seq,
                "weight": weights[seq],
                "ms": {name: med[name] * 1e3 for name in calls},
                "spread_ms": {name: [min(s) * 1e3, max(s) * 1e3] for name, s in samples.items()},
                "eager_over_accelerate": med["eager"] / med["accelerate"],
                "max_abs_diff": diff,
                "check": check,
            }
            if "compile" in med:
                row["compile_over_accelerate"] = med["compile"] / med["accelerate"]
            rows.append(row)
            spread = ", ".join(f"{n} {a:.2f}–{b:.2f}" for n, (a, b) in row["spread_ms"].items())
            print(
                f"seq {seq:4d} (w {weights[seq]:.2f}): "
                + ", ".join(f"{n} {v:.2f} ms" for n, v in row["ms"].items())
                + f"; eager/acc {row['eager_over_accelerate']:.2f}"
                + (f", compile/acc {row['compile_over_accelerate']:.2f}" if "compile_over_accelerate" in row else "")
                + f" (rounds' min–max: {spread}); max |diff| {diff:.1e}; check: {check['choice']} after "
                + f"{check['forwards']} forwards",
                flush=True,
            )
    names = ["eager_over_accelerate"] + ([] if args.no_compile else ["compile_over_accelerate"])
    summary = {n: geomean({r["seq"]: r[n] for r in rows}, weights) or math.nan for n in names}
    print(
        f"{args.model} on {cpu_model()}, threads: torch {torch.get_num_threads()}, uKernels "
        f"{os.environ.get('TVM_NUM_THREADS')}: weighted geomean "
        + ", ".join(f"{k.replace('_over_', '/')} {v:.2f}" for k, v in summary.items())
        + f"; onboarding {record['onboarding_s']:.0f} s"
    )
    in_model = {name: st["in_model"] for name, st in fast.stats().items() if st["in_model"]}  # what each S kept
    write_json(
        args,
        "bench/readme_steps.py",
        record,
        accelerate_summary=str(fast.summary()),
        points=rows,
        weighted=summary,
        in_model=in_model,
        forward_decisions=fast.forward_decisions(),  # each shape's whole-forward check: both sides' medians
    )
    fast.close()


if __name__ == "__main__":
    main()
