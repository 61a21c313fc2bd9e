"""What the twin gains where a forward runs as the model's own (issue 33 round 2, `kernelfleet.torch_twin`).

Per model and sequence length, in one process, timed in interleaved rounds (bench/common.py's `interleaved`: one
calibrated sample per side per round, each round starting with another side; medians):
- `eager`: the user's model; `copy`: a plain deep copy of it (how far two identical models differ in the same
  alternation: memory placement);
- `wrappers`: `accelerate` without the twin (`torch_twin.BUILD_TWIN = False`: forwards run as the model's own go
  through the wrappers on PyTorch, as before); `twin`: `accelerate` with it;
- `twin_via_wrappers`: that same accelerated model with its own forwards sent through the wrappers (before and
  after on the very same weights).
The tables are bench/whole_model.py's cache for this host (run it first, e.g. `--quick --threads 1`); models are
its `build_model`s, batch 1, under `torch.inference_mode()`. Each accelerated model runs `--learn` forwards per
point first, so the whole-forward check has decided (or the signature is known to run no uKernel) before timing.
Then `common.paired` (single forwards alternated a, b, b, a, …; median of the per-pair differences and their
quartiles) for twin − twin_via_wrappers (same weights), twin − eager and copy − eager (the placement control).
Also printed: what `OwnForward` costs per forward around forwards that do nothing, to the tables and to the twin
with its training flags copied (the scope's hooks, 1.9 µs, come on top as before).

    taskset -c 1 env PYTHONPATH=.:clients/python .venv/bin/python bench/own_forward.py --threads 1
"""

from __future__ import annotations

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bert,distilbert,llama")
    ap.add_argument("--seqs", default="1,64")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--min-sample-s", type=float, default=0.2)
    ap.add_argument("--learn", type=int, default=40, help="forwards per point before timing (the check needs 34)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--paired-s", type=float, default=6.0, help="seconds per paired comparison (common.paired)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    import torch
    from common import cpu_model, interleaved, paired, set_vendor_threads
    from whole_model import DEFAULT_CACHE, SignedCache, build_model, host_fingerprint, model_inputs

    import kernelfleet  # noqa: F401  (its thread settings must precede numpy: kernelfleet.runtime)
    from kernelfleet import torch_twin
    from kernelfleet.torch import accelerate

    set_vendor_threads(torch, args.threads)
    signed = SignedCache(DEFAULT_CACHE)
    fingerprint, _ = host_fingerprint("cpu")
    result: dict[str, Any] = {"cpu": cpu_model(), "threads": args.threads, "command": " ".join(sys.argv), "rows": []}
    print(f"{result['cpu']}; torch threads {torch.get_num_threads()}; {args.rounds} rounds")

    def accelerated(model: Any, twin: bool) -> Any:
        torch_twin.BUILD_TWIN = twin
        try:
            return accelerate(
                model, DEFAULT_CACHE, target=fingerprint, trusted_key=signed.public, telemetry=False,
                print_summary=False,
            )  # fmt: skip
        finally:
            torch_twin.BUILD_TWIN = True

    for name in args.models.split(","):
        model = build_model(name, args.layers)
        sides_models = {
            "eager": model,
            "copy": copy.deepcopy(model),
            "wrappers": accelerated(model, twin=False),
            "twin": accelerated(model, twin=True),
        }
        twin_fast = sides_models["twin"]

        def through_wrappers(twin_fast: Any = twin_fast, **inputs: Any) -> Any:
            """The twin's accelerated model with its forwards as the model's own through the wrappers (bypass): the
            old path on the same weights, so memory placement is not in the comparison."""
            own = twin_fast._own
            own.own = own.tables
            try:
                return twin_fast(**inputs)
            finally:
                own.own = type(own.twin.root).forward.__get__(own.twin.root)

        for seq in (int(s) for s in args.seqs.split(",")):
            inputs = model_inputs(name, 1, seq, model.config.vocab_size)
            with torch.inference_mode():
                reference = model(**inputs).last_hidden_state
                for side in ("wrappers", "twin"):
                    for _ in range(args.learn):
                        out = sides_models[side](**inputs).last_hidden_state
                    diff = float((out - reference).abs().max())
                    choice = sides_models[side].forward_choice(**inputs)
                    record = next(iter(v for k, v in sides_models[side].forward_decisions().items()
                                       if k.startswith(f"((), (('input_ids', (1, {seq})),")), {})  # fmt: skip
                    print(f"  {name} seq {seq} {side}: check {choice}, no_ukernels {record.get('no_ukernels')}, "
                          f"own forwards {record.get('own_forwards')}, max |diff| {diff:.1e}")  # fmt: skip
                calls = {side: (lambda m=m, i=inputs: m(**i)) for side, m in sides_models.items()}
                calls["twin_via_wrappers"] = lambda i=inputs: through_wrappers(**i)
                samples = interleaved(calls, args.rounds, args.min_sample_s)
                pairs = {  # single forwards alternated a, b, b, a, ...: the other core's load cancels in each pair
                    f"{a} - {b}": paired(calls[a], calls[b], args.paired_s, (a, b))
                    for a, b in (("twin", "twin_via_wrappers"), ("twin", "eager"), ("copy", "eager"))
                }
            med = {side: statistics.median(v) for side, v in samples.items()}
            row = {
                "model": name,
                "seq": seq,
                "ms": {k: round(v * 1e3, 3) for k, v in med.items()},
                "eager_over": {k: round(med["eager"] / v, 3) for k, v in med.items() if k != "eager"},
                "paired": pairs,
            }
            result["rows"].append(row)
            print(f"{name} seq {seq}: ms {row['ms']}; eager ÷ side {row['eager_over']}")
            for label, p in pairs.items():
                print(
                    f"    paired {label}: {p['difference'] * 1e3:+.3f} ms (quartiles {p['difference_q1'] * 1e3:+.3f} "
                    f"… {p['difference_q3'] * 1e3:+.3f}) of {med['eager'] * 1e3:.2f} ms, {p['pairs']} pairs"
                )

        fast = sides_models["twin"]
        own = fast._own
        if own is not None:  # the selection alone, around forwards that do nothing: tables' side, then the twin's
            real_tables, real_own, scope = own.tables, own.own, fast._scope
            own.tables = own.own = lambda *a, **k: None
            costs = {}
            for bypass in (False, True):
                scope.bypass = bypass
                n = 200_000
                t0 = time.perf_counter()
                for _ in range(n):
                    own(input_ids=None)
                costs[bypass] = (time.perf_counter() - t0) / n
            scope.bypass = False
            own.tables, own.own = real_tables, real_own
            flags = len(own.twin.own)
            print(
                f"{name}: OwnForward {costs[False] * 1e6:.2f} µs a forward on the tables, {costs[True] * 1e6:.2f} µs "
                f"on the twin ({flags} training flags copied)"
            )
            result.setdefault("selection_us", {})[name] = {"tables": costs[False] * 1e6, "twin": costs[True] * 1e6}
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
