"""BERT-base dense layers on one NVIDIA GPU, fp32, batch 1, T = 1..128 and 512: our dispatcher vs cuBLAS.

Layers Y[T, N] = X[T, K]·W[N, K]ᵀ (../shared/research/gpu.md §4): qkv 2304×768, attn_out 768×768,
ffn_up 3072×768, ffn_down 768×3072. Contenders, side by side in one process:

- `dispatcher`: one GPU ukernel run per layer (service.tuning.tuners.ukernel.gpu_tuner: FTuner GPU
  rules, symbolic-M pipelined uKernels, depth searched per uKernel, DP table, T ranges where cuBLAS
  was faster routed to cuBLAS) covering T = 1..512, called as a GPU host calls
  kernelfleet.cuda_ukernel.CudaDispatcher: torch CUDA tensors in, a torch CUDA tensor out, back to
  back, synchronised (Python, table lookup and launches included); `program` is the same without
  the cuBLAS routing, `program_kernels` the sum of its pieces' kernel times (TVM time_evaluator);
  `cublas_fp32_called` is F.linear called from Python the same way (the routing decision's rival);
- `cublas_fp32`, `cublas_tf32`, `cublas_fp16`: F.linear captured 50× in a CUDA graph (a Python loop
  costs 17–27 µs per call and would hide everything, gpu.md §4); TF32 and fp16 are context columns;
- `ms_pad128`: one MetaSchedule kernel tuned at T=128 (random cost model: the GPU host has no
  xgboost), run at every T on a 128-row padded input (kernel time only: the pad copy is not counted,
  which flatters this column);
- `ms_exact`: MetaSchedule tuned at exactly T, at the sampled T (`--ms-shapes`).

Reports per layer: geomean over T = 1..128 of cuBLAS fp32 / dispatcher, the worst T, tuning time of the
one ukernel run against per-shape MetaSchedule over all 128 T (extrapolated from the sampled runs),
and the dispatcher's per-call overhead. Importable without pydantic, fastapi or celery (the GPU
machine lacks them); running needs TVM with CUDA, torch with CUDA and nvcc.

    python bench/gpu_dynamic_bert.py --out results.json                 # qkv, 64 MS trials per shape
    python bench/gpu_dynamic_bert.py --layers all --ms-trials 128       # all four layers (longer)
    bash bench/gpu_session.sh run                                       # on a GPU machine: tests + this
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "clients" / "python"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

LAYERS = {"qkv": (2304, 768), "attn_out": (768, 768), "ffn_up": (3072, 768), "ffn_down": (768, 3072)}
T_RANGE = tuple(range(1, 129))
T_EXTRA = (512,)
MS_SHAPES = (1, 16, 61, 97, 128)


def _median_us(samples: list[float]) -> float:
    return sorted(samples)[len(samples) // 2] * 1e6


def time_dispatcher_torch(dispatcher: Any, n: int, k: int, t: int, calls: int = 50) -> float:
    """µs per call with torch CUDA tensors, back to back, synchronised (how an inference host calls it)."""
    import torch

    x = torch.randn(t, k, device="cuda")
    w = torch.randn(n, k, device="cuda")
    out = torch.empty(t, n, device="cuda")
    dispatcher(x, w, out)
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            dispatcher(x, w, out)
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls)
    return _median_us(samples)


def check_dispatcher(dispatcher: Any, n: int, k: int, ts: list[int]) -> float:
    """Max relative error against torch (fp32, TF32 off) over `ts`; device tensors in and out."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    worst = 0.0
    w = torch.randn(n, k, device="cuda")
    for t in ts:
        x = torch.randn(t, k, device="cuda")
        y = dispatcher(x, w)
        assert isinstance(y, torch.Tensor) and y.is_cuda and tuple(y.shape) == (t, n)
        ref = torch.nn.functional.linear(x, w)
        worst = max(worst, float((y - ref).abs().max() / ref.abs().max()))
    return worst


def tune_metaschedule(n: int, k: int, m: int, arch: str, trials: int, work: Path) -> tuple[Any, float]:
    """(built module, tuning seconds) of MetaSchedule's best for M=m, with the fast CUDA builder."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from service.tuning.tuners.build import fast_build_cuda, make_builder
    from service.tuning.tuners.pipeline.schedule import cuda_target, dense_module

    target = tvm.target.Target(cuda_target(arch))
    mod = dense_module(n, k, m)
    began = time.perf_counter()
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


def run_layer(name: str, args: argparse.Namespace, arch: str, work: Path) -> dict[str, Any]:
    from service.tuning import cublas, gpu
    from service.tuning.hardware_model import HardwareModel
    from service.tuning.tuners.pipeline.schedule import cuda_target
    from service.tuning.tuners.ukernel.gpu_tuner import DenseRange, GPUUKernelTuner
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink

    n, k = LAYERS[name]
    card = gpu.detect()
    hw = card.hardware_model() if card else HardwareModel.for_gpu(arch)
    ts = [t for t in T_RANGE if t <= args.t_max] + list(T_EXTRA)
    outcome = GPUUKernelTuner().tune_dense(
        DenseRange(
            n,
            k,
            s_max=max(ts),
            validate=(1, 16, 61, 128),
            target=cuda_target(arch),
            hardware=hw,
            work_dir=work / name,
            representative_m=64,
        ),
        QuietRangeSink(),
    )
    from kernelfleet.cuda_ukernel import CudaDispatcher

    routed = outcome.dispatcher  # with the S ranges the tuner measured cuBLAS faster routed to cuBLAS
    from kernelfleet.dispatch import DispatchTable

    # our uKernels at every T: the table before cuBLAS routing (outcome.kernels holds every uKernel it uses)
    tuned = DispatchTable.from_dict(outcome.validation["tuned_table"])
    program = CudaDispatcher(tuned, outcome.kernels, N=n, K=k)
    error = check_dispatcher(program, n, k, [*range(1, 129), 131, 257, 512])
    rows: dict[str, dict[str, Any]] = {}
    for t in ts:
        rows[str(t)] = {
            "dispatcher_us": time_dispatcher_torch(routed, n, k, t),
            "program_us": time_dispatcher_torch(program, n, k, t),
            "program_kernels_us": sum(outcome.kernels[p.ukernel_id].time(p.rows) for p in program.program(t)) * 1e6,
            "program": [[p.ukernel_id, p.rows] for p in program.program(t)],
            "routed_to_cublas": routed.routes_to_vendor(t),
            "cublas_fp32_us": cublas.time_linear(t, n, k) * 1e6,
            "cublas_fp32_called_us": cublas.time_linear_called(t, n, k) * 1e6,
            "cublas_tf32_us": cublas.time_linear(t, n, k, tf32=True) * 1e6,
            "cublas_fp16_us": cublas.time_linear(t, n, k, dtype="float16") * 1e6,
        }
    ms: dict[str, Any] = {"trials": args.ms_trials, "exact": {}}
    if args.ms_trials > 0:
        pad_module, pad_seconds = tune_metaschedule(n, k, 128, arch, args.ms_trials, work)
        pad_us = time_module_us(pad_module, n, k, 128)
        ms["pad128_tuning_s"] = pad_seconds
        for t in ts:
            if t <= 128:
                rows[str(t)]["ms_pad128_us"] = pad_us
        for t in args.ms_shapes:
            module, seconds = (
                (pad_module, pad_seconds) if t == 128 else tune_metaschedule(n, k, t, arch, args.ms_trials, work)
            )
            us = time_module_us(module, n, k, t)
            ms["exact"][str(t)] = {"us": us, "tuning_s": seconds}
            rows[str(t)]["ms_exact_us"] = us
    return {
        "layer": name,
        "N": n,
        "K": k,
        "rows": rows,
        "metaschedule": ms,
        "max_rel_error": error,
        "tuning_s": outcome.seconds,
        "piece_overhead_s": outcome.validation["piece_overhead_s"],
        "dispatch_overhead_us": program.overhead(S=1) * 1e6,
        "vendor_routes": {k: v for k, v in outcome.validation["vendor_routes"].items() if k != "sweep_s"},
        "ukernels": sorted(outcome.kernels),
        "candidates": outcome.candidates,
        "summary": summarize(rows, ms, outcome.seconds),
    }


def summarize(rows: dict[str, dict[str, Any]], ms: dict[str, Any], tuning_s: float) -> dict[str, Any]:
    """Geomean of cuBLAS fp32 / dispatcher over T = 1..128, the worst T, and tuning cost vs per-shape MS."""
    ratios = {int(t): r["cublas_fp32_us"] / r["dispatcher_us"] for t, r in rows.items() if int(t) <= 128}
    kernel_ratios = [r["cublas_fp32_us"] / r["program_kernels_us"] for t, r in rows.items() if int(t) <= 128]
    geo = math.exp(sum(math.log(v) for v in ratios.values()) / len(ratios))
    worst = min(ratios, key=lambda t: ratios[t])
    out: dict[str, Any] = {
        "geomean_vs_cublas_fp32": geo,
        "worst_t": worst,
        "worst_ratio": ratios[worst],
        "t_below_0.9": sorted(t for t, v in ratios.items() if v < 0.9),
        "geomean_kernels_only_vs_cublas_fp32": math.exp(sum(math.log(v) for v in kernel_ratios) / len(kernel_ratios)),
    }
    exact = ms.get("exact") or {}
    if exact:
        per_shape = [rows[t]["ms_exact_us"] / rows[t]["dispatcher_us"] for t in exact]
        out["geomean_vs_ms_exact"] = math.exp(sum(math.log(v) for v in per_shape) / len(per_shape))
        mean_tuning = sum(e["tuning_s"] for e in exact.values()) / len(exact)
        out["ms_all_128_shapes_tuning_s_extrapolated"] = mean_tuning * 128
        out["tuning_cost_ratio"] = mean_tuning * 128 / tuning_s
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--layers", default="qkv", help="comma-separated layer names or 'all'")
    parser.add_argument("--ms-trials", type=int, default=64, help="MetaSchedule trials per shape (0: skip MS)")
    parser.add_argument("--ms-shapes", type=lambda s: [int(v) for v in s.split(",")], default=list(MS_SHAPES))
    parser.add_argument("--t-max", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_dynamic_bert.json")
    args = parser.parse_args(argv)
    from kernelfleet.cuda_ukernel import require_cuda
    from service.tuning import gpu

    require_cuda()
    card = gpu.detect()
    if card is None:
        raise SystemExit("nvidia-smi reports no GPU")
    names = list(LAYERS) if args.layers == "all" else args.layers.split(",")
    result: dict[str, Any] = {"gpu": card.details() | {"arch": card.arch}, "layers": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            layer = run_layer(name, args, card.arch, Path(tmp))
            result["layers"].append(layer)
            print(name, json.dumps(layer["summary"]), f"max rel err {layer['max_rel_error']:.2e}", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
