"""A server whose sequence lengths vary: the README's three steps, then a stream of requests at random lengths.

`readme_steps.py` times each sequence length once its whole-forward check has chosen (`settle_check`): what a server
runs after a shape's first requests. A server whose lengths vary keeps meeting new shapes, and each one's check
runs forwards of the model's own (about half of 2 × MODEL_CALLS) before the tables serve it. This bench serves what
such a server sees: `--requests` forwards at lengths drawn from 1..`--s-max` (log-uniform, seeded: short requests
are common, every length occurs), each request run once by eager and once by the accelerated model (alternating
which goes first), and reports the stream's total time on each side. Phases, each on a fresh `accelerate(model,
fleet)`: `checked` (the defaults: the in-model and whole-forward checks) and `unchecked` (`check_in_model=False`:
neither check; the tables trusted as tuned: what the checks cost on this stream). Per phase: eager ÷ accelerate over
the whole stream and over its last half, the requests run as the model's own forward, and how each signature was
decided (its own check, its neighbours, undecided).

    .venv/bin/kernelfleet standalone &          # a fresh data dir: KERNELFLEET_DATA_DIR=/tmp/kf-readme
    PYTHONPATH=.:clients/python .venv/bin/python bench/shape_stream.py --model distilbert --requests 600
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import cpu_model
from readme_steps import onboard, onboarding_arguments, write_json
from whole_model import build_model, model_inputs

PHASES = ("checked", "unchecked")


def lengths(n: int, s_max: int, seed: int) -> list[int]:
    """`n` sequence lengths in 1..s_max, log-uniform (as many in 1..8 as in 16..128)."""
    rng = np.random.default_rng(seed)
    return [int(v) for v in np.clip(np.exp(rng.uniform(0.0, math.log(s_max + 1), n)).astype(int), 1, s_max)]


def own_forwards(fast: Any) -> int:
    """The forwards `fast` has run as the model's own so far, over all its signatures."""
    return sum(int(d["own_forwards"]) for d in fast.forward_decisions().values())


def serve(model: Any, fast: Any, name: str, seqs: list[int]) -> dict[str, Any]:
    """Each request by eager and by `fast`, alternating which runs first; per side the seconds of every request, and
    per request whether `fast` ran it as the model's own forward (its signatures' counts, read between requests)."""
    eager_s, fast_s, own = [], [], []
    vocab = model.config.vocab_size
    with torch.inference_mode():
        for i, seq in enumerate(seqs):
            inputs = model_inputs(name, 1, seq, vocab)
            sides = [(model, eager_s), (fast, fast_s)]
            before = own_forwards(fast)
            for m, out in sides if i % 2 == 0 else sides[::-1]:
                began = time.perf_counter()
                m(**inputs)
                out.append(time.perf_counter() - began)
            own.append(own_forwards(fast) > before)
    decisions = fast.forward_decisions().values()
    half = len(seqs) // 2

    def split(as_own: bool) -> dict[str, Any]:
        picked = [i for i, o in enumerate(own) if o == as_own]
        e, a = sum(eager_s[i] for i in picked), sum(fast_s[i] for i in picked)
        return {"requests": len(picked), "eager_s": e, "accelerate_s": a, "eager_over_accelerate": e / a if a else None}

    return {
        "eager_s": sum(eager_s),
        "accelerate_s": sum(fast_s),
        "eager_over_accelerate": sum(eager_s) / sum(fast_s),
        "last_half_eager_over_accelerate": sum(eager_s[half:]) / sum(fast_s[half:]),
        "own_forwards": own_forwards(fast),
        "as_own": split(True),  # the requests `fast` ran as the model's own forward ...
        "on_tables": split(False),  # ... and those it ran through its layers (tables, checks, routes to PyTorch)
        "signatures": {
            "checked": sum(1 for d in decisions if d["decision"] and not d["between"] and d["eager_s"] is not None),
            "from_neighbours": sum(1 for d in decisions if d["between"]),
            "no_ukernels": sum(1 for d in decisions if d["no_ukernels"]),
            "undecided": sum(1 for d in decisions if d["decision"] is None and not d["no_ukernels"]),
        },
        "chose": {side: sum(1 for d in decisions if d["decision"] == side) for side in ("accelerated", "eager")},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    onboarding_arguments(ap)
    ap.add_argument("--s-max", type=int, default=128, help="the seq range onboarded and served: 1..s_max, batch 1")
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seeds", default="1,2", help="one stream per seed and phase")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"some of {', '.join(PHASES)}")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    model = build_model(args.model, args.layers or None)
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    fleet, record = onboard(model, args)

    from kernelfleet.torch import accelerate

    runs = []
    for seed in (int(s) for s in args.seeds.split(",") if s):
        seqs = lengths(args.requests, args.s_max, seed)
        for phase in (p for p in args.phases.split(",") if p):
            fast = accelerate(model, fleet, print_summary=False, check_in_model=phase != "unchecked")
            try:
                run = {
                    "seed": seed,
                    "phase": phase,
                    "distinct_lengths": len(set(seqs)),
                    **serve(model, fast, args.model, seqs),
                }
            finally:
                fast.close()
            runs.append(run)
            sig = run["signatures"]
            print(
                f"seed {seed} {phase:10s}: {args.requests} requests at {run['distinct_lengths']} lengths; eager "
                f"{run['eager_s']:.2f} s, accelerate {run['accelerate_s']:.2f} s → eager/acc "
                f"{run['eager_over_accelerate']:.2f} (last half {run['last_half_eager_over_accelerate']:.2f}); "
                f"{run['own_forwards']} forwards as the model's own; signatures: {sig['checked']} checked, "
                f"{sig['from_neighbours']} from neighbours, {sig['no_ukernels']} without uKernels, "
                f"{sig['undecided']} undecided; chose {run['chose']}; "
                + "; ".join(
                    f"{label} {run[key]['requests']} requests, eager/acc {run[key]['eager_over_accelerate'] or 0:.2f}"
                    for label, key in (("as the model's own:", "as_own"), ("through the layers:", "on_tables"))
                ),
                flush=True,
            )
    print(
        f"{args.model} on {cpu_model()}, threads: torch {torch.get_num_threads()}; "
        f"onboarding {record['onboarding_s']:.0f} s"
    )
    write_json(args, "bench/shape_stream.py", record, runs=runs)


if __name__ == "__main__":
    main()
