"""BERT-base dense layers on one NVIDIA GPU, fp32, batch 1, T = 1..128 and 512: our dispatcher vs cuBLAS.

Layers Y[T, N] = X[T, K]·W[N, K]ᵀ (../shared/research/gpu.md §4): qkv 2304×768, attn_out 768×768,
ffn_up 3072×768, ffn_down 768×3072. One GPU ukernel run per layer (service.tuning.tuners.ukernel.gpu_tuner:
FTuner GPU rules, symbolic-M pipelined uKernels, depth searched per uKernel, DP table, the T where cuBLAS
was faster routed to cuBLAS) covers every T. Ours against cuBLAS fp32, like against like, in two modes:

- `called` (as a torch host calls them): `CudaDispatcher(x, w)` and `F.linear(x, w)` on the same torch CUDA
  tensors, each called back to back from Python by the same loop, synchronised; Python, table lookup and
  launches included. This is the mode the tuner's cuBLAS routing decision uses (recorded per layer);
- `graph` (kernel-only): both captured 50× in one CUDA graph and replayed (`service.tuning.cublas.time_graph`
  for both), so launch and Python costs vanish. A capture check runs first: a dispatcher that launches off
  torch's current stream would run during capture and leave an empty graph, timed as ~0 µs.

Per layer and mode: geomean over the headline T (1..--t-max) of cuBLAS fp32 / ours and the worst T, for the
dispatcher as shipped (T routed to cuBLAS count 1.0×: they run that very F.linear) and for our uKernels
alone (no routing). Reference columns, kernel-only: cuBLAS TF32 and fp16. MetaSchedule (random cost model:
the GPU host has no xgboost) one kernel tuned at T=128 and run padded, and tuned at exactly T for
--ms-shapes; those compare with our uKernels on the same timer (TVM time_evaluator, kernel-only). Tuning
time: the one ukernel run against per-shape MetaSchedule over every headline T (extrapolated).

Importable without torch, TVM, pydantic, fastapi or celery (argument checks and the summary are tested on
CPU hosts); running needs TVM with CUDA, torch with CUDA and nvcc.

    python bench/gpu_dynamic_bert.py --out results.json                       # qkv, T = 1..128 + 512
    python bench/gpu_dynamic_bert.py --ts 1,16,61,128 --extra-ts "" --ms-shapes 16   # a short run
    bash bench/gpu_session.sh run-bench                                       # on a GPU machine (short set)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "clients" / "python"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

LAYERS = {"qkv": (2304, 768), "attn_out": (768, 768), "ffn_up": (3072, 768), "ffn_down": (768, 3072)}
T_MAX = 128
T_EXTRA = (512,)
MS_SHAPES = (1, 16, 61, 97, 128)
# (ours, cuBLAS fp32) row keys per mode, and what the mode means (the report prints it)
MODES = {
    "called": ("ours_called_us", "cublas_fp32_called_us", "as a torch host calls them (Python loop, synchronised)"),
    "graph": ("ours_graph_us", "cublas_fp32_graph_us", "kernel-only (50 calls in one CUDA graph, replayed)"),
}


# ---- arguments and summary: plain Python, no torch or TVM (tested on CPU hosts) ----


def int_list(text: str) -> list[int]:
    """'1,16,61' -> [1, 16, 61]; '' -> [] (e.g. --extra-ts '' measures no T beyond the headline range)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"T values must be ≥ 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--layers", default="qkv", help="comma-separated of " + ", ".join(LAYERS) + ", or 'all'")
    parser.add_argument("--t-max", type=int, default=T_MAX, help="headline range is T = 1..t-max")
    parser.add_argument("--ts", type=int_list, default=None, help="headline T to measure (default 1..t-max)")
    parser.add_argument("--extra-ts", type=int_list, default=list(T_EXTRA), help="T measured beyond the headline")
    parser.add_argument("--ms-trials", type=int, default=64, help="MetaSchedule trials per shape (0: skip MS)")
    parser.add_argument("--ms-shapes", type=int_list, default=list(MS_SHAPES), help="T tuned exactly by MS")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_dynamic_bert.json")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check everything before any tuning: a bad value found after minutes of GPU time wastes them."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.t_max < 1:
        parser.error(f"--t-max must be ≥ 1, got {args.t_max}")
    names = list(LAYERS) if args.layers == "all" else args.layers.split(",")
    unknown = [n for n in names if n not in LAYERS]
    if unknown:
        parser.error(f"unknown --layers {','.join(unknown)}; choose from {', '.join(LAYERS)} or 'all'")
    args.layer_names = names
    args.ts = sorted(set(args.ts if args.ts is not None else range(1, args.t_max + 1)))
    over = [t for t in args.ts if t > args.t_max]
    if over:
        parser.error(f"--ts {_join(over)} above --t-max {args.t_max}: raise --t-max or use --extra-ts")
    if args.ms_trials < 0:
        parser.error(f"--ms-trials must be ≥ 0, got {args.ms_trials}")
    if args.ms_trials > 0:
        over = [t for t in args.ms_shapes if t > args.t_max]
        if over:
            parser.error(f"--ms-shapes {_join(over)} above --t-max {args.t_max}: MetaSchedule is compared in "
                         "the headline range only; lower them or raise --t-max")  # fmt: skip
        missing = [t for t in args.ms_shapes if t not in args.ts]
        if missing:
            parser.error(f"--ms-shapes {_join(missing)} not among the measured --ts: add them to --ts")
    args.extra_ts = sorted({t for t in args.extra_ts if t > args.t_max})
    return args


def _join(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values)


def geomean(values: Iterable[float]) -> float:
    logs = [math.log(v) for v in values]
    if not logs:
        raise ValueError("geomean of nothing")
    return math.exp(sum(logs) / len(logs))


def _worst(ratios: Mapping[int, float]) -> tuple[int, float]:
    """(T, ratio) of the lowest cuBLAS/ours ratio; the lowest T on ties, so reruns name the same T."""
    t = min(ratios, key=lambda s: (ratios[s], s))
    return t, ratios[t]


def mode_summary(rows: Mapping[str, Mapping[str, Any]], mode: str, t_max: int) -> dict[str, Any]:
    """Ratios cuBLAS fp32 / ours (> 1: ours faster) over the headline T measured in `mode`.

    `ukernels`: our uKernels alone at every T. `dispatcher`: as shipped, where a T the table routes to cuBLAS
    runs that same F.linear and counts 1.0×. `routing_disagrees`: T where this mode's numbers would have
    routed the other way (the routing decision was taken in one mode only)."""
    ours_key, cublas_key, meaning = MODES[mode]
    ukernels: dict[int, float] = {}
    dispatcher: dict[int, float] = {}
    disagrees: list[int] = []
    skipped: list[int] = []
    for key, row in rows.items():
        t = int(key)
        if t > t_max:
            continue
        ours: Any = row.get(ours_key)
        theirs: Any = row.get(cublas_key)
        if not (_positive(ours) and _positive(theirs)):
            skipped.append(t)
            continue
        ratio = theirs / ours
        routed = bool(row.get("routed_to_cublas"))
        ukernels[t] = ratio
        dispatcher[t] = 1.0 if routed else ratio
        if routed != (ratio < 1.0):
            disagrees.append(t)
    out: dict[str, Any] = {"meaning": meaning, "t_measured": len(ukernels), "t_missing": sorted(skipped)}
    if not ukernels:
        return out | {"error": f"no T ≤ {t_max} has both {ours_key} and {cublas_key}"}
    for name, ratios in (("dispatcher", dispatcher), ("ukernels", ukernels)):
        worst_t, worst = _worst(ratios)
        out[name] = {"geomean": geomean(ratios.values()), "worst_t": worst_t, "worst": worst}
    out["routed_t"] = sorted(t for t in ukernels if rows[str(t)].get("routed_to_cublas"))
    out["routing_disagrees"] = sorted(disagrees)
    return out


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v) and v > 0


def ms_summary(
    rows: Mapping[str, Mapping[str, Any]], ms: Mapping[str, Any], tuning_s: float, t_max: int
) -> dict[str, Any]:
    """MetaSchedule / our uKernels on one timer (TVM time_evaluator, kernel-only), and the tuning cost of
    per-shape MetaSchedule over every headline T against our one run (extrapolated from the sampled T)."""
    out: dict[str, Any] = {"timer": "TVM time_evaluator, kernel-only, both sides"}
    exact = {t: e for t, e in (ms.get("exact") or {}).items() if _positive(rows.get(t, {}).get("ours_kernels_us"))}
    if exact:
        out["geomean_ms_exact_over_ours"] = geomean(e["us"] / rows[t]["ours_kernels_us"] for t, e in exact.items())
        mean_tuning = sum(e["tuning_s"] for e in exact.values()) / len(exact)
        out["ms_all_shapes_tuning_s_extrapolated"] = mean_tuning * t_max
        out["tuning_cost_ratio"] = mean_tuning * t_max / tuning_s
    padded = [
        (r["ms_pad128_us"], r["ours_kernels_us"])
        for t, r in rows.items()
        if int(t) <= t_max and _positive(r.get("ms_pad128_us")) and _positive(r.get("ours_kernels_us"))
    ]
    if padded:
        out["geomean_ms_pad128_over_ours"] = geomean(p / o for p, o in padded)
    return out


def summarize(
    rows: Mapping[str, Mapping[str, Any]], ms: Mapping[str, Any], tuning_s: float, t_max: int, routing_mode: str
) -> dict[str, Any]:
    return {
        "t_max": t_max,
        "routing_mode": routing_mode,
        **{mode: mode_summary(rows, mode, t_max) for mode in MODES},
        "metaschedule": ms_summary(rows, ms, tuning_s, t_max),
    }


# ---- measurement: needs torch with CUDA, TVM with CUDA and nvcc ----


def time_called(call: Callable[[], Any], calls: int = 50, repeats: int = 5) -> float:
    """Median µs per `call()` as a host calls it: a Python loop, back to back, synchronised at the end.
    The same loop times ours and cuBLAS, so the two differ only in what they call."""
    import torch

    call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls)
    return sorted(samples)[len(samples) // 2] * 1e6


def graph_problem(call: Callable[[], Any], out: Any, expected: Any) -> str | None:
    """Why one CUDA graph cannot time `call` kernel-only, or None. Kernels launched off torch's current stream
    run eagerly during capture (or break it) and the graph records nothing, which would time as ~0 µs: so
    capture one call into an output filled with NaN, check capture left it alone and a replay fills it."""
    import torch

    call()  # first launches load modules and pick kernels: keep that out of the capture
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize()
    except Exception as exc:
        return f"CUDA graph capture failed: {type(exc).__name__}: {exc}"[:400]
    if not bool(torch.isnan(out).all()):
        return (
            "the call ran during CUDA graph capture instead of being recorded: it launches off torch's current stream"
        )
    graph.replay()
    torch.cuda.synchronize()
    err = float((out - expected).abs().max() / expected.abs().max())
    if not err <= 1e-3:  # also catches NaN: a replay that wrote nothing
        return f"CUDA graph replay gave wrong results (max relative error {err:.3g})"
    return None


def check_dispatcher(dispatcher: Any, n: int, k: int, ts: list[int]) -> float:
    """Max relative error against torch (fp32, TF32 off) over `ts`; device tensors in and out."""
    import torch

    worst = 0.0
    w = torch.randn(n, k, device="cuda")
    for t in ts:
        x = torch.randn(t, k, device="cuda")
        y = dispatcher(x, w)
        assert isinstance(y, torch.Tensor) and y.is_cuda and tuple(y.shape) == (t, n)
        ref = torch.nn.functional.linear(x, w)
        worst = max(worst, float((y - ref).abs().max() / ref.abs().max()))
    return worst


def measure_t(
    program: Any, kernels: Mapping[str, Any], n: int, k: int, t: int, graph_ok: bool, l2_bytes: int = 0
) -> dict[str, Any]:
    """One T: ours and cuBLAS fp32 in both modes on the same tensors, TF32/fp16 references, and our pieces'
    kernel time on TVM's timer (the MetaSchedule comparison's). Both sides cycle through the same copies of W,
    together twice the L2 (`l2_bytes`), so neither reads a W the previous call left in the L2."""
    import itertools

    import torch

    from kernelfleet.cuda_ukernel import weight_copies
    from service.tuning import cublas

    x, w = torch.randn(t, k, device="cuda"), torch.randn(n, k, device="cuda")
    weights = [w, *(w.clone() for _ in range(weight_copies(n * k * 4, l2_bytes) - 1))]
    ours_w, theirs_w = itertools.cycle(weights), itertools.cycle(weights)
    out = torch.empty(t, n, device="cuda")
    linear = torch.nn.functional.linear
    row: dict[str, Any] = {
        "program": [[p.ukernel_id, p.rows] for p in program.program(t)],
        "w_copies": len(weights),
        "ours_called_us": time_called(lambda: program(x, next(ours_w))),  # allocates its output, as F.linear does
        "cublas_fp32_called_us": time_called(lambda: linear(x, next(theirs_w))),
        "ours_kernels_us": sum(kernels[p.ukernel_id].time(p.rows, l2_bytes=l2_bytes) for p in program.program(t)) * 1e6,
        "cublas_fp32_graph_us": cublas.time_linear(t, n, k, l2_bytes=l2_bytes) * 1e6,
        "cublas_tf32_graph_us": cublas.time_linear(t, n, k, tf32=True, l2_bytes=l2_bytes) * 1e6,
        "cublas_fp16_graph_us": cublas.time_linear(t, n, k, dtype="float16", l2_bytes=l2_bytes) * 1e6,
    }
    if graph_ok:
        problem = graph_problem(lambda: program(x, w, out), out, linear(x, w))
        if problem is None:
            row["ours_graph_us"] = cublas.time_graph(lambda: program(x, next(ours_w), out)) * 1e6
        else:
            row["graph_error"] = problem
    return row


def tune_metaschedule(n: int, k: int, m: int, arch: str, trials: int, work: Path) -> tuple[Any, float]:
    """(built module, tuning seconds) of MetaSchedule's best for M=m, with the fast CUDA builder."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from service.tuning.builder.cuda import cuda_target
    from service.tuning.builder.metaschedule import fast_build_cuda, make_builder
    from service.tuning.tuners import tensor_intrinsics
    from service.tuning.tuners.pipeline.schedule import dense_module

    target = tvm.target.Target(cuda_target(arch))
    mod = dense_module(n, k, m)
    began = time.perf_counter()
    tensor_intrinsics.load()
    database = ms.tune_tir(
        mod,
        target,
        str(work / f"ms_{n}_{k}_{m}"),
        max_trials_global=trials,
        num_trials_per_iter=min(32, trials),
        builder=make_builder(max_workers=os.cpu_count() or 4, timeout_sec=120, cuda=True),
        runner=ms.runner.LocalRunner(timeout_sec=30),
        database="memory",
        cost_model="random",
    )
    seconds = time.perf_counter() - began
    sch = ms.tir_integration.compile_tir(database, mod, target)
    if sch is None:
        raise RuntimeError(f"MetaSchedule found nothing for M={m}")
    return fast_build_cuda(sch.mod, target, None), seconds


def time_module_us(module: Any, n: int, k: int, m: int) -> float:
    import numpy as np
    import tvm

    dev = tvm.cuda(0)
    args = [tvm.runtime.tensor(np.random.rand(*shape).astype("float32"), dev) for shape in ((m, k), (n, k), (m, n))]
    result = module.time_evaluator("main", dev, number=100, repeat=5)(*args)
    return float(np.median(result.results)) * 1e6


def routing_mode(validation: Mapping[str, Any]) -> str:
    """How the tuner timed ours against cuBLAS when it routed T to cuBLAS, in its own words."""
    routes = validation.get("vendor_routes") or {}
    if routes.get("routed_on") == "called":
        return "as a torch host calls them (both from Python on torch tensors, synchronised)"
    return str(routes.get("mode") or routes.get("vendor") or "unknown (the tuner did not record it)")


def tune_layer(name: str, s_max: int, arch: str, work: Path) -> Any:
    from service.tuning import gpu
    from service.tuning.builder.cuda import cuda_target
    from service.tuning.hardware_model import HardwareModel
    from service.tuning.tuners.ukernel.gpu_tuner import DenseRange, GPUUKernelTuner
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink

    n, k = LAYERS[name]
    card = gpu.detect()
    hw = card.hardware_model() if card else HardwareModel.for_gpu(arch)
    job = DenseRange(n, k, s_max=s_max, validate=tuple(t for t in (1, 16, 61, 128) if t <= s_max),
                     target=cuda_target(arch), hardware=hw, work_dir=work / name, representative_m=64)  # fmt: skip
    return GPUUKernelTuner().tune_dense(job, QuietRangeSink())


def run_layer(layer: dict[str, Any], args: argparse.Namespace, arch: str, work: Path, save: Callable[[], None]) -> None:
    """Tune, check and measure the layer `layer["layer"]`, filling `layer` as it goes (`save` after each step,
    so a command killed at its time limit still leaves what it measured)."""
    import torch

    from kernelfleet.cuda_ukernel import CudaDispatcher
    from kernelfleet.dispatch import DispatchTable

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cuBLAS unless a column says otherwise
    name = layer["layer"]
    n, k = LAYERS[name]
    ts = [*args.ts, *args.extra_ts]
    layer.update(N=n, K=k, t_max=args.t_max, rows={})
    outcome = tune_layer(name, max(ts), arch, work)
    routed = outcome.dispatcher  # the table as shipped: T where cuBLAS (as called) was faster go to cuBLAS
    # our uKernels at every T: the table before routing (outcome.kernels holds every uKernel it uses)
    program = CudaDispatcher(DispatchTable.from_dict(outcome.validation["tuned_table"]), outcome.kernels, N=n, K=k)
    checked = [t for t in (*range(1, T_MAX + 1), 131, 257, 512) if t <= max(ts)]
    layer.update(
        tuning_s=outcome.seconds,
        routing_mode=routing_mode(outcome.validation),
        max_rel_error=check_dispatcher(program, n, k, checked),
        piece_overhead_s=outcome.validation["piece_overhead_s"],
        dispatch_overhead_us=program.overhead(S=1) * 1e6,
        vendor_routes={key: v for key, v in outcome.validation["vendor_routes"].items() if key != "sweep_s"},
        ukernels=sorted(outcome.kernels),
        candidates=outcome.candidates,
    )
    save()
    graph_ok = True
    for t in ts:
        row = measure_t(program, outcome.kernels, n, k, t, graph_ok, int(outcome.hardware.get("l2_bytes", 0)))
        row["routed_to_cublas"] = bool(routed.routes_to_vendor(t))
        if "graph_error" in row:  # the same launch path fails the same way at every T: do not retry each
            graph_ok = False
            layer["graph_error"] = f"at T={t}: {row['graph_error']}"
        layer["rows"][str(t)] = row
        save()
    layer["metaschedule"] = run_metaschedule(layer, args, arch, work, save)
    layer["summary"] = summarize(
        layer["rows"], layer["metaschedule"], outcome.seconds, args.t_max, layer["routing_mode"]
    )


def run_metaschedule(
    layer: dict[str, Any], args: argparse.Namespace, arch: str, work: Path, save: Callable[[], None]
) -> dict[str, Any]:
    n, k, rows = layer["N"], layer["K"], layer["rows"]
    ms: dict[str, Any] = {"trials": args.ms_trials, "cost_model": "random", "exact": {}}
    layer["metaschedule"] = ms
    if args.ms_trials <= 0:
        return ms
    pad_module, pad_seconds = tune_metaschedule(n, k, 128, arch, args.ms_trials, work)
    pad_us = time_module_us(pad_module, n, k, 128)
    ms["pad128_tuning_s"] = pad_seconds
    for t, row in rows.items():
        if int(t) <= 128:
            row["ms_pad128_us"] = pad_us  # kernel time only: the pad copy is not counted (flatters MS)
    save()
    for t in args.ms_shapes:
        module, seconds = (
            (pad_module, pad_seconds) if t == 128 else tune_metaschedule(n, k, t, arch, args.ms_trials, work)
        )
        us = time_module_us(module, n, k, t)
        ms["exact"][str(t)] = {"us": us, "tuning_s": seconds}
        rows[str(t)]["ms_exact_us"] = us
        save()
    return ms


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kernelfleet.cuda_ukernel import require_cuda
    from service.tuning import cublas, gpu

    require_cuda()
    cublas.torch_cuda()
    card = gpu.detect()
    if card is None:
        raise SystemExit("nvidia-smi reports no GPU")
    result: dict[str, Any] = {"gpu": card.details() | {"arch": card.arch}, "args": _args_record(args), "layers": []}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        for name in args.layer_names:
            layer: dict[str, Any] = {"layer": name}
            result["layers"].append(layer)
            run_layer(layer, args, card.arch, Path(tmp), save)
            save()
            print(name, json.dumps(layer["summary"]), f"max rel err {layer['max_rel_error']:.2e}", flush=True)
    print("wrote", args.out)
    return 0


def _args_record(args: argparse.Namespace) -> dict[str, Any]:
    return {"layers": args.layer_names, "t_max": args.t_max, "ts": args.ts, "extra_ts": args.extra_ts,
            "ms_trials": args.ms_trials, "ms_shapes": args.ms_shapes}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
