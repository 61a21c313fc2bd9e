"""BERT dense layers on one NVIDIA GPU: our uKernels alone against cuBLAS in the same dtype, kernel-only.

Issue 32's measurement of the kernels themselves (no tuner, no routing), per `--dtype`: what the GPU tuner would
measure, the static model's passing proposals (`service.tuning.tuners.ukernel.gpu_screen`):
- float32: SIMT GEMM tiles and the GEMV family;
- float16 / bfloat16: tensor-core tiles (`service.tuning.tuners.pipeline.tensorcore`: ldmatrix, mma.sync
  m16n8k16, cp.async pipeline, split-K over blockIdx.z where N leaves SMs idle) from T = 16, and the GEMV family
  (`pipeline.gemv`, W streamed into registers, fp16 and bf16) below. (The H200 session of 2026-11-27 measured a
  fixed set of eight unsplit tensor-core tiles instead, and no bf16 GEMV.)
Every kernel serves any M (symbolic M).

Per layer and T, on the same tensors:
- correctness first: each kernel's Y against `F.linear` in fp32 on the same inputs (relative error ≤ 1e-2 in half
  precision, 1e-3 in fp32); a wrong kernel is reported and never timed;
- kernel-only time of each kernel and of cuBLAS (`F.linear` on tensors of the dtype, torch's defaults),
  each captured 50× into one CUDA graph and replayed (`kernelfleet.cuda_ukernel.graph_seconds`), both sides
  cycling through copies of W twice the L2, so neither reads a W left in the L2 by the previous call;
- the two sides interleaved (ours, cuBLAS, ours, cuBLAS, ... `--rounds` times); the row keeps every round's
  sample and reports the medians and their spread.
Our side is the best correct kernel at that T (what a dispatch table routes to). Y is in the inputs' dtype on both
sides (our fp32 accumulators are rounded in the final store, gpu_kernels.build_module), as cuBLAS writes it. The
H200 run of 2026-11-27 predates that: our half-precision Y was fp32 there (twice cuBLAS's output bytes).

Summary: geomean over T of cuBLAS / ours and the worst T, per layer. Goal (issue 32): ≥ 1.0× with no T below 0.9×.

    python bench/gpu_ukernels.py --dtype float16 --out fp16.json   # qkv and ffn_down, T = 1..128 (8 points)
    python bench/gpu_ukernels.py --dry-run                         # CPU host: builds and compiles every kernel

Importable without torch; the dry run needs TVM and nvcc only.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from gpu_dynamic_bert import LAYERS, geomean, int_list  # the same BERT layers and argument parsing (no torch/TVM)

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "clients" / "python"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

TS = (1, 2, 4, 8, 16, 32, 64, 128)
GEMV_MAX_T = 16  # the GEMV family's range (pipeline/gemv.py: T <= 16)
MAX_REL_ERR = 1e-2


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="qkv,ffn_down", help="comma-separated of " + ", ".join(LAYERS))
    parser.add_argument("--ts", type=int_list, default=list(TS), help="T to measure")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per T (ours, cuBLAS, ...)")
    parser.add_argument("--arch", default=None, help="sm_XX (default: the GPU's; the dry run: sm_90a)")
    parser.add_argument("--dry-run", action="store_true", help="build and compile every kernel, no GPU")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")) / "gpu_ukernels.json")
    args = parser.parse_args(argv)
    args.layers = [name.strip() for name in args.layers.split(",") if name.strip()]
    unknown = [name for name in args.layers if name not in LAYERS]
    if unknown:
        parser.error(f"--layers: unknown layer(s) {', '.join(unknown)}; known: {', '.join(LAYERS)}")
    if not args.ts or min(args.ts) < 1:
        parser.error("--ts: give T >= 1")
    return args


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per layer: geomean over T of cuBLAS / ours (ours = best correct kernel) and the worst T."""
    out: dict[str, Any] = {}
    for layer in sorted({r["layer"] for r in rows}):
        ratios = {r["T"]: r["cublas_us"] / r["ours_us"] for r in rows if r["layer"] == layer and r.get("ours_us")}
        if ratios:
            worst = min(ratios, key=lambda t: ratios[t])
            out[layer] = {
                "geomean_cublas_over_ours": round(geomean(list(ratios.values())), 3),
                "worst_T": worst,
                "worst_ratio": round(ratios[worst], 3),
                "goal_met": geomean(list(ratios.values())) >= 1.0 and ratios[worst] >= 0.9,
            }
    return out


# ---- building: TVM and nvcc, no GPU ----


def kernel_tiles(n: int, k: int, dtype: str, arch: str) -> list[Any]:
    """What the GPU tuner would measure: the static model's passing proposals (`gpu_screen.model_ukernels`) at
    T = 1, 16, 64, 128. float32: SIMT GEMM tiles and the GEMV family; float16 / bfloat16 on sm_80+: tensor-core
    tiles (split-K where N leaves SMs idle) from T = 16 and the GEMV family below."""
    from service.tuning.builder.cuda import cuda_target
    from service.tuning.hardware_model import HardwareModel
    from service.tuning.tuners.ukernel.gpu_rules import GPURuleLimits
    from service.tuning.tuners.ukernel.gpu_screen import model_ukernels

    hw = HardwareModel.for_gpu(arch.rstrip("a"))
    screened = model_ukernels(hw, n, k, [1, 16, 64, 128], cuda_target(arch), dtype, limits=GPURuleLimits())
    return [s.tile for s in screened if s.passed]


def build(tile: Any, n: int, k: int, arch: str, dtype: str) -> Any:
    from service.tuning.builder.cuda import cuda_target
    from service.tuning.tuners.ukernel.gpu_kernels import build_module

    return build_module(tile, n, k, cuda_target(arch), dtype)  # SIMT GEMM, GEMV or tensor-core tile


def build_all(layer: str, arch: str, dtype: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(label -> built module, label -> why it failed to build)."""
    n, k = LAYERS[layer]
    built, failed = {}, {}
    for tile in kernel_tiles(n, k, dtype, arch):
        began = time.perf_counter()
        try:
            built[tile.label()] = build(tile, n, k, arch, dtype)
            print(f"  built {layer} {tile.label()} in {time.perf_counter() - began:.1f} s", flush=True)
        except Exception as exc:  # one tile TVM or nvcc refuses must not stop the others
            failed[tile.label()] = f"{type(exc).__name__}: {exc}"[:300]
            print(f"  FAILED {layer} {tile.label()}: {failed[tile.label()]}", flush=True)
    return built, failed


# ---- measuring: torch with CUDA ----


def launcher(module: Any) -> Callable[..., None]:
    """main(X, W, Y) on torch's current stream (recorded under CUDA-graph capture)."""
    from kernelfleet.cuda_ukernel import _from_dlpack, caller_stream

    fn = module["main"]

    def call(x: Any, w: Any, *, out: Any) -> None:
        with caller_stream(x):
            fn(_from_dlpack(x), _from_dlpack(w), _from_dlpack(out))

    return call


def graph_us(call: Callable[..., Any], weights: list[Any]) -> float:
    """Median µs per `call(w)`, 50 calls in one CUDA graph, each on the next copy of W."""
    import torch

    from kernelfleet.cuda_ukernel import graph_seconds

    cycle = itertools.cycle(weights)
    return graph_seconds(torch, lambda: call(next(cycle)), 50, 5) * 1e6


def measure_layer(layer: str, modules: dict[str, Any], ts: list[int], dtype: str, rounds: int) -> list[dict[str, Any]]:
    import torch

    from kernelfleet.cuda_ukernel import weight_copies

    n, k = LAYERS[layer]
    tdtype = getattr(torch, dtype)
    l2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
    w = torch.randn(n, k, device="cuda", dtype=tdtype)
    weights = [w, *(w.clone() for _ in range(weight_copies(n * k * 2, l2) - 1))]
    calls = {label: launcher(module) for label, module in modules.items()}
    gemv = {label for label in modules if label.startswith("gemv_")}
    max_err = MAX_REL_ERR if dtype != "float32" else 1e-3
    rows = []
    for t in ts:
        x = torch.randn(t, k, device="cuda", dtype=tdtype)
        expected = torch.nn.functional.linear(x.float(), w.float())
        row: dict[str, Any] = {"layer": layer, "T": t, "N": n, "K": k, "dtype": dtype, "w_copies": len(weights)}
        errors, wrong = {}, {}
        usable = []
        for label, call in calls.items():
            if label in gemv and t > GEMV_MAX_T:
                continue
            out = torch.full((t, n), float("nan"), device="cuda", dtype=tdtype)  # Y in the inputs' dtype
            try:
                call(x, w, out=out)
                torch.cuda.synchronize()
                err = float((out.float() - expected).abs().max() / expected.abs().max())
            except Exception as exc:
                wrong[label] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            errors[label] = err
            if err <= max_err:  # also false for NaN
                usable.append(label)
            else:
                wrong[label] = f"max relative error {err:.3g}"
        row["max_rel_err"] = errors
        if wrong:
            row["wrong"] = wrong
        samples: dict[str, list[float]] = {label: [] for label in usable}
        samples["cublas"] = []
        outs = {label: torch.empty(t, n, device="cuda", dtype=tdtype) for label in usable}
        for _ in range(rounds):
            for label in usable:
                samples[label].append(graph_us(partial(calls[label], x, out=outs[label]), weights))
            samples["cublas"].append(graph_us(partial(torch.nn.functional.linear, x), weights))
        med = {label: statistics.median(v) for label, v in samples.items()}
        row["samples_us"] = {label: [round(s, 3) for s in v] for label, v in samples.items()}
        row["cublas_us"] = round(med["cublas"], 3)
        ours = {label: v for label, v in med.items() if label != "cublas"}
        if ours:
            best = min(ours, key=lambda label: ours[label])
            row.update(ours_kernel=best, ours_us=round(ours[best], 3), ratio=round(med["cublas"] / ours[best], 3))
        print(
            f"{layer} T={t}: cuBLAS {dtype} {row['cublas_us']} us; best ours "
            f"{row.get('ours_kernel')} {row.get('ours_us')} us; ratio {row.get('ratio')}; wrong: {sorted(wrong)}",
            flush=True,
        )
        rows.append(row)
    return rows


def gpu_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}" + ("a" if major == 9 else "")  # sm_90a: Hopper's full feature set


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    arch = args.arch or ("sm_90a" if args.dry_run else gpu_arch())
    began = time.perf_counter()
    result: dict[str, Any] = {"arch": arch, "dtype": args.dtype, "ts": args.ts, "rows": [], "build_failed": {}}
    if not args.dry_run:
        import torch

        result["device"] = torch.cuda.get_device_name(0)
        result["torch"] = torch.__version__
    for layer in args.layers:
        modules, failed = build_all(layer, arch, args.dtype)
        result["build_failed"][layer] = failed
        if args.dry_run:
            print(f"dry run: {layer}: {len(modules)} kernels built and compiled, {len(failed)} failed")
            continue
        result["rows"] += measure_layer(layer, modules, args.ts, args.dtype, args.rounds)
        result["summary"] = summarize(result["rows"])
        result["seconds"] = round(time.perf_counter() - began, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))  # after each layer: a cut run keeps what it measured
    if not args.dry_run:
        print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
