"""What the twin gains where a forward runs as the model's own (issue 33 round 2, `kernelfleet.torch_twin`).

Per model and sequence length, four sides in one process, timed in interleaved rounds (bench/common.py's
`interleaved`: one calibrated sample per side per round, each round starting with another side; medians):
PyTorch eager (the user's model), a plain deep copy of it (how far two identical models differ in the same
alternation), `accelerate` without the twin (`torch_twin.BUILD_TWIN = False`: such forwards go through the
wrappers on PyTorch, as before) and `accelerate` with it. The tables are bench/whole_model.py's cache for this host
(run it first, e.g. `--quick --threads 1`); models are its `build_model`s, batch 1, under `torch.inference_mode()`.
Each accelerated model runs `--learn` forwards per point first, so the whole-forward check has decided (or the
signature is known to run no uKernel) before timing. Also printed: what the twin's selection costs per forward
(`OwnForward.__call__` around a forward that does nothing, flags synced; the scope's hooks, 1.9 µs, come on top as
before).

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
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    import torch
    from common import cpu_model, interleaved, set_vendor_threads
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
                samples = interleaved(calls, args.rounds, args.min_sample_s)
            med = {side: statistics.median(v) for side, v in samples.items()}
            row = {
                "model": name,
                "seq": seq,
                "ms": {k: round(v * 1e3, 3) for k, v in med.items()},
                "eager_over": {k: round(med["eager"] / v, 3) for k, v in med.items() if k != "eager"},
            }
            result["rows"].append(row)
            print(f"{name} seq {seq}: ms {row['ms']}; eager ÷ side {row['eager_over']}")

        fast = sides_models["twin"]
        own = fast._own
        if own is not None:  # the twin's selection, around a forward that does nothing
            real, scope = own.own, fast._scope
            own.own = lambda *a, **k: None
            scope.bypass = True
            n = 100_000
            t0 = time.perf_counter()
            for _ in range(n):
                own(input_ids=None)
            selection = (time.perf_counter() - t0) / n
            scope.bypass = False
            own.own = real
            flags = len(own.twin.flags)
            print(f"{name}: OwnForward selection {selection * 1e6:.2f} µs a forward ({flags} flags synced)")
            result.setdefault("selection_us", {})[name] = round(selection * 1e6, 3)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
