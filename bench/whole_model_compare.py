"""Accelerate under one OMP_WAIT_POLICY against PyTorch at its best over two runs of `bench/whole_model.py`.

`OMP_WAIT_POLICY` must be set before torch loads, so one process measures one policy. An accelerated model wants
PASSIVE (torch's OpenMP threads otherwise spin after each op and take the cores the uKernels need); PyTorch alone
may be faster with the default (spinning) policy. This takes, per point, `accelerate` from the first run and the
faster of the two runs' eager (and torch.compile) medians, so the ratio is against PyTorch at its better setting.
The runs are separate processes on the same machine, minutes apart: not side by side, unlike each run's own table.

    PYTHONPATH=.:clients/python .venv/bin/python bench/whole_model.py --omp-wait-policy passive ...
    PYTHONPATH=.:clients/python .venv/bin/python bench/whole_model.py --omp-wait-policy default --reuse-tables \\
        --json bench/results/whole_model_default_policy.json ...
    python bench/whole_model_compare.py bench/results/whole_model.json bench/results/whole_model_default_policy.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any


def _rows(run: dict[str, Any], model: str) -> dict[tuple[str, int, int], dict[str, Any]]:
    return {(r["kind"], r["batch"], r["seq"]): r for r in run["models"][model]["measure"]["rows"]}


def compare(accel_run: dict[str, Any], other_run: dict[str, Any]) -> list[str]:
    lines = [
        f"accelerate from: {accel_run['command']} (OMP_WAIT_POLICY {accel_run['OMP_WAIT_POLICY']})",
        f"PyTorch at its best of that run and: {other_run['command']} (OMP_WAIT_POLICY {other_run['OMP_WAIT_POLICY']})",
    ]
    for model in accel_run["models"]:
        mine, other = _rows(accel_run, model), _rows(other_run, model)
        for kind, batch in sorted({(k[0], k[1]) for k in mine}):
            keys = sorted(k for k in mine if k[:2] == (kind, batch) and k in other)
            if not keys:
                continue
            lines.append(f"{model} {kind} batch {batch}:")
            logs = {"eager": 0.0, "compile": 0.0}
            worst: dict[str, tuple[float, int]] = {}
            total = 0.0
            for key in keys:
                a, b = mine[key]["median_s"], other[key]["median_s"]
                weight = mine[key]["weight"]
                total += weight
                parts = []
                for name in logs:
                    best = min(a[name], b[name])
                    ratio = best / a["accelerate"]
                    logs[name] += weight * math.log(ratio)
                    worst[name] = min(worst.get(name, (math.inf, 0)), (ratio, key[2]))
                    parts.append(f"{name} {a[name] * 1e3:.2f} / {b[name] * 1e3:.2f} ms → {ratio:.2f}×")
                lines.append(f"  seq {key[2]:4d}: accelerate {a['accelerate'] * 1e3:.2f} ms; " + "; ".join(parts))
            summary = ", ".join(
                f"best {name}/accelerate {math.exp(logs[name] / total):.2f}× (worst {worst[name][0]:.2f}× at "
                f"seq {worst[name][1]})"
                for name in logs
            )
            lines.append(f"  => weighted geomean: {summary}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("accelerate_run", type=Path, help="the run whose accelerate times are used")
    ap.add_argument("other_run", type=Path, help="a run under the other OMP_WAIT_POLICY")
    args = ap.parse_args()
    runs = [json.loads(p.read_text()) for p in (args.accelerate_run, args.other_run)]
    print("\n".join(compare(*runs)))


if __name__ == "__main__":
    main()
