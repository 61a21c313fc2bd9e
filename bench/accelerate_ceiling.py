"""The most any Linear-layer replacement could gain on a model on this machine (issue 33's goals).

`accelerate` replaces a model's `nn.Linear` layers and nothing else, so two ceilings bound what it can reach,
whatever kernels its tables hold:

1. **Amdahl**: the eager forward with every `nn.Linear` answered by a stand-in that costs one Python call and
   returns a precomputed output of the right shape (`t_rest`): eager ÷ `t_rest` is the speedup of Linear layers
   that take no time at all.
2. **Roofline**: `t_rest` plus, per Linear call, the time a float32 kernel needs at least on this machine:
   max(2·M·N·K ÷ peak FLOP rate, bytes moved ÷ read bandwidth). Peak rate is the fastest large float32 GEMM any
   library here runs (PyTorch or numpy, 2048³, best of the repeats), or `--nominal-flops-per-cycle` × the clock
   `/proc/cpuinfo` shows when asked (an upper bound no kernel reaches). Bandwidth is the fastest streaming
   read over a buffer as large as the model's Linear weights (so the same caches serve it as serve the model).
   The library column is the faster of `F.linear` and numpy on the layer's own shape, timed alone.

Eager and the stand-in model are timed in alternating rounds (medians, spread shown), at each thread count, torch
and numpy imported before anything of the project, default thread settings. Both ceilings are printed per
sequence length and as the weighted geomean over `whole_model.py`'s quick histogram. A ceiling below a goal
means no Linear kernel, however fast, reaches that goal on this machine for that model.

    PYTHONPATH=.:clients/python .venv/bin/python bench/accelerate_ceiling.py --models distilbert,llama --threads 1,2
"""

from __future__ import annotations

from common import reexec_without_overrides

if __name__ == "__main__":
    reexec_without_overrides()  # before numpy, torch or TVM load (see common.STRIPPED_ENV)

import argparse
import copy
import datetime as dt
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import best_time, cpu_model, host_info, interleaved, set_vendor_threads, write_json
from whole_model import QUICK_SEQS, build_model, model_inputs

QUICK_WEIGHTS = {1: 0.02, 8: 0.20, 64: 0.78}  # whole_model.py --quick's histogram
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "accelerate_ceiling"


@dataclass
class LinearCall:
    """One Linear call of the forward at one sequence length: its shape and the output it stands in with."""

    m: int
    n: int
    k: int
    output: torch.Tensor


@dataclass
class Recorder:
    """Forward hooks that record every Linear call's shape and output (to stand in with later)."""

    calls: dict[str, LinearCall] = field(default_factory=dict)

    def hook(self, name: str) -> Callable[..., None]:
        def record(module: torch.nn.Linear, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            x = args[0]
            m = int(math.prod(x.shape[:-1]))
            self.calls[name] = LinearCall(m, module.out_features, module.in_features, out.detach().clone())

        return record


class StandIn(torch.nn.Module):
    """A Linear that costs one Python call: it returns the output the real layer produced for this input."""

    def __init__(self, output: torch.Tensor) -> None:
        super().__init__()
        self.output = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output


def linear_names(model: torch.nn.Module) -> list[str]:
    return [name for name, mod in model.named_modules() if type(mod) is torch.nn.Linear]


def swap(model: torch.nn.Module, replacements: dict[str, torch.nn.Module]) -> None:
    """Put `replacements` in place of the named submodules."""
    for name, new in replacements.items():
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def peak_gemm_flops(min_sample_s: float) -> dict[str, float]:
    """The fastest large float32 GEMM each library runs here (FLOP/s, best sample)."""
    n = 2048
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    flops = 2.0 * n**3
    return {
        "torch": flops / best_time(lambda: torch.mm(ta, tb), min_sample_s, 5),
        "numpy": flops / best_time(lambda: a @ b, min_sample_s, 5),
    }


def read_bandwidth(nbytes: int, min_sample_s: float) -> dict[str, float]:
    """Fastest streaming read (bytes/s) over float32 data of `nbytes` (the model's Linear weights: the same caches
    serve it): a sum and a matrix-vector product, each in PyTorch and numpy."""
    cols = 4096
    x = np.random.default_rng(2).standard_normal((max(nbytes // (4 * cols), 16), cols), dtype=np.float32)
    v = np.ones(cols, dtype=np.float32)
    xt, vt = torch.from_numpy(x), torch.from_numpy(v)
    return {
        "torch sum": x.nbytes / best_time(lambda: xt.sum(), min_sample_s, 7),
        "numpy sum": x.nbytes / best_time(lambda: x.sum(), min_sample_s, 7),
        "torch mv": x.nbytes / best_time(lambda: torch.mv(xt, vt), min_sample_s, 7),
        "numpy mv": x.nbytes / best_time(lambda: x @ v, min_sample_s, 7),
    }


def nominal_flops(flops_per_cycle: float) -> float | None:
    with open("/proc/cpuinfo") as cpuinfo:
        mhz = [float(line.split(":")[1]) for line in cpuinfo if line.startswith("cpu MHz")]
    return flops_per_cycle * max(mhz) * 1e6 if mhz else None


def library_time(call: LinearCall, min_sample_s: float) -> float:
    """The faster of `F.linear` and numpy on this Linear's shape alone (median of 5 samples each)."""
    rng = np.random.default_rng(call.m * 7 + call.n)
    x = rng.standard_normal((call.m, call.k), dtype=np.float32)
    w = rng.standard_normal((call.n, call.k), dtype=np.float32)
    xt, wt = torch.from_numpy(x), torch.from_numpy(w)
    sides = {
        "torch": lambda: torch.nn.functional.linear(xt, wt),
        "numpy": lambda: x @ w.T,
    }
    timed = interleaved(sides, 5, min_sample_s)
    return min(statistics.median(v) for v in timed.values())


def measure(args: argparse.Namespace, model_name: str, threads: int) -> dict[str, Any]:
    set_vendor_threads(torch, threads)  # PyTorch and numpy's BLAS alike
    model = build_model(model_name, args.layers)
    vocab = model.config.vocab_size
    names = linear_names(model)
    weight_bytes = sum(4 * model.get_submodule(n).weight.numel() for n in names)
    peak = peak_gemm_flops(args.min_sample_s)
    bw = read_bandwidth(weight_bytes, args.min_sample_s)
    peak_flops = max(peak.values())
    nominal = nominal_flops(args.nominal_flops_per_cycle * threads) if args.nominal_flops_per_cycle else None
    bound_flops = max(peak_flops, nominal or 0.0)
    bandwidth = max(bw.values())
    rows = []
    with torch.inference_mode():
        for seq in args.seqs:
            inputs = model_inputs(model_name, 1, seq, vocab)
            recorder = Recorder()
            handles = [model.get_submodule(n).register_forward_hook(recorder.hook(n)) for n in names]
            model(**inputs)
            for h in handles:
                h.remove()
            stand_ins: dict[str, torch.nn.Module] = {n: StandIn(c.output) for n, c in recorder.calls.items()}

            twin = copy.deepcopy(model)  # the same model, its Linear layers answered by stand-ins
            swap(twin, stand_ins)

            def eager(inputs: dict[str, Any] = inputs) -> Any:
                return model(**inputs)

            def rest(twin: torch.nn.Module = twin, inputs: dict[str, Any] = inputs) -> Any:
                return twin(**inputs)

            timed = interleaved({"eager": eager, "rest": rest}, args.rounds, args.min_sample_s)
            t_eager = statistics.median(timed["eager"])
            t_rest = statistics.median(timed["rest"])
            floors, libs = 0.0, 0.0
            shapes: dict[tuple[int, int, int], int] = {}
            for c in recorder.calls.values():
                shapes[(c.m, c.n, c.k)] = shapes.get((c.m, c.n, c.k), 0) + 1
            per_shape = []
            for (m, n, k), count in sorted(shapes.items()):
                flop_s = 2.0 * m * n * k / bound_flops
                byte_s = 4.0 * (n * k + m * k + m * n) / bandwidth
                floor = max(flop_s, byte_s)
                lib = library_time(LinearCall(m, n, k, torch.empty(0)), args.min_sample_s)
                floors += count * floor
                libs += count * lib
                per_shape.append(
                    {
                        "m": m,
                        "n": n,
                        "k": k,
                        "calls": count,
                        "floor_s": floor,
                        "library_s": lib,
                        "library_over_floor": lib / floor,
                        "bound": "compute" if flop_s >= byte_s else "memory",
                    }
                )
            rows.append(
                {
                    "seq": seq,
                    "eager_s": t_eager,
                    "eager_spread_s": [min(timed["eager"]), max(timed["eager"])],
                    "rest_s": t_rest,
                    "rest_spread_s": [min(timed["rest"]), max(timed["rest"])],
                    "linear_share": 1.0 - t_rest / t_eager,
                    "linear_floor_s": floors,
                    "linear_library_s": libs,
                    "ceiling_amdahl": t_eager / t_rest,
                    "ceiling_roofline": t_eager / (t_rest + floors),
                    "shapes": per_shape,
                }
            )
            print(
                f"{model_name} threads={threads} seq={seq}: eager {t_eager * 1e3:.2f} ms, without Linear "
                f"{t_rest * 1e3:.2f} ms (Linear {100 * (1 - t_rest / t_eager):.0f} %), Linear floor "
                f"{floors * 1e3:.2f} ms, libraries alone {libs * 1e3:.2f} ms → ceilings: Amdahl "
                f"{t_eager / t_rest:.2f}×, roofline {t_eager / (t_rest + floors):.2f}×",
                flush=True,
            )
    weights = {s: QUICK_WEIGHTS.get(s, 0.0) for s in args.seqs}
    total = sum(weights.values())

    def wgeo(key: str) -> float | None:
        if total <= 0:
            return None
        return math.exp(sum(weights[r["seq"]] * math.log(r[key]) for r in rows) / total)

    return {
        "model": model_name,
        "layers": args.layers,
        "threads": threads,
        "peak_gemm_flops": peak,
        "nominal_flops": nominal,
        "bound_flops": bound_flops,
        "read_bandwidth": bw,
        "weight_bytes": weight_bytes,
        "rows": rows,
        "weighted_ceiling_amdahl": wgeo("ceiling_amdahl"),
        "weighted_ceiling_roofline": wgeo("ceiling_roofline"),
    }


def render_md(result: dict[str, Any]) -> str:
    lines = [
        f"# `accelerate` ceilings — {result['date']}, {result['host']['cpu_model']}",
        "",
        "Eager ÷ (forward without Linear time) and eager ÷ (that + each Linear's float32 roofline floor); "
        "weighted over the quick histogram (seq 1/8/64 at 0.02/0.20/0.78). Library = faster of F.linear and numpy "
        "on the layer's shape alone.",
        "",
        "| model | threads | seq | eager ms (spread) | Linear share | library ÷ floor (Linear total) | Amdahl ceiling"
        " | roofline ceiling |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        for r in run["rows"]:
            lo, hi = r["eager_spread_s"]
            lines.append(
                f"| {run['model']} | {run['threads']} | {r['seq']} | {r['eager_s'] * 1e3:.2f} ({lo * 1e3:.2f}–"
                f"{hi * 1e3:.2f}) | {100 * r['linear_share']:.0f} % | "
                f"{r['linear_library_s'] / r['linear_floor_s']:.2f}× | {r['ceiling_amdahl']:.2f}× | "
                f"{r['ceiling_roofline']:.2f}× |"
            )
        wa, wr = run["weighted_ceiling_amdahl"], run["weighted_ceiling_roofline"]
        if wa is not None:
            lines.append(f"| {run['model']} | {run['threads']} | **weighted** | | | | **{wa:.2f}×** | **{wr:.2f}×** |")
    lines += ["", "Peak GEMM rate (GFLOP/s) and read bandwidth (GB/s) used for the floors:", ""]
    for run in result["runs"]:
        peak = ", ".join(f"{k} {v / 1e9:.0f}" for k, v in run["peak_gemm_flops"].items())
        bw = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in run["read_bandwidth"].items())
        nominal = f"; nominal {run['nominal_flops'] / 1e9:.0f}" if run["nominal_flops"] else ""
        lines.append(
            f"- {run['model']}, {run['threads']} thread(s): GEMM {peak}{nominal}; read over "
            f"{run['weight_bytes'] / 2**20:.0f} MiB: {bw}"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="distilbert,llama")
    p.add_argument("--layers", type=int, default=2, help="encoder/decoder layers per model (quick set: 2)")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--seqs", default=",".join(map(str, QUICK_SEQS)))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--min-sample-s", type=float, default=0.05)
    p.add_argument(
        "--nominal-flops-per-cycle",
        type=float,
        default=0.0,
        help="per core, e.g. 64 for two AVX-512 FMA ports; 0 = use measured GEMM rates only",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    args.seqs = [int(s) for s in args.seqs.split(",")]
    runs = [measure(args, model, int(t)) for model in args.models.split(",") for t in args.threads.split(",")]
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": {**host_info(), "cpu_model": cpu_model()},
        "argv": list(argv) if argv is not None else None,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out.with_suffix(".json"), result)
    md = render_md(result)
    args.out.with_suffix(".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
