"""The static GPU model's report (issue 32), on a host without a GPU: (1) the first-light uKernels' predicted
times next to what the H100 measured; (2) what the GPU rules now propose (padded rows, interleaved columns),
gated and ranked by the model, predicted per T next to cuBLAS fp32 as the H100 measured it; (3) what the GPU
screen proposes for fp16 / bf16 (tensor-core tiles with split-K, the GEMV family), predicted per T with the H200's
figures next to cuBLAS in the same dtype as the H200 session measured it.

Every number in parts 2 and 3 is a PREDICTION (a per-SM bound: shared-memory wavefronts, FFMA issue, L1, MMA,
DRAM, the tensor-core k-loop latency); no kernel in them has run on a GPU. cuBLAS figures are measurements
(kernel-only, CUDA graphs): the H100 first light's in part 2, the H200 session's in part 3.

    .venv/bin/python bench/gpu_model_report.py [--out bench/results/gpu_model_report.md]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
from pathlib import Path

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.gpu_model import MODEL_VERSION
from service.tuning.gpu_model.access import analyze
from service.tuning.gpu_model.arch import h200_spec, sm_spec
from service.tuning.gpu_model.bound import predict
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.gemv import GemvTile
from service.tuning.tuners.pipeline.schedule import GemmTile, schedule_gemm
from service.tuning.tuners.ukernel.gpu_kernels import scheduled_module
from service.tuning.tuners.ukernel.gpu_rules import GPURuleLimits
from service.tuning.tuners.ukernel.gpu_screen import TENSOR_CORE_MIN_M, model_ukernels

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "tuning" / "gpu_model" / "h100_first_light.json"
H200 = Path(__file__).resolve().parents[1] / "bench" / "results" / "gpu-h200-2026-11-27"
H200_TS = (1, 2, 4, 8, 16, 32, 64, 128)  # the H200 session's T
GEMV_MAX_T = 16  # the GEMV family's range (bench/gpu_ukernels.py)
LAYERS = {"qkv": (2304, 768), "ffn_down": (768, 3072)}
TS = (1, 2, 4, 8, 16, 32, 61, 64, 97, 128)


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="bench/results/gpu_model_report.md")
    args = parser.parse_args(argv)
    target, spec = cuda_target("sm_90a"), sm_spec("sm_90a", 132)
    fixture = json.loads(FIXTURE.read_text())
    lines = [
        "# Static GPU model report (issue 32)",
        "",
        f"Host: {platform.processor() or platform.machine()}, no GPU. Model: `service.tuning.gpu_model` (H100 SXM, "
        "132 SMs, 1.755–1.98 GHz, 3.0 TB/s). Command: `.venv/bin/python bench/gpu_model_report.py`.",
        "",
        "## 1. First-light uKernels: predicted vs measured on the H100 (kernel-only, fp32)",
        "",
        "| layer | T | uKernel | predicted µs (band) | measured µs | measured / predicted |",
        "|---|---|---|---|---|---|",
    ]
    for p in fixture["dense"]:
        tile = GemmTile.from_label(p["ukernel"])
        pr = predict(analyze(schedule_gemm(tile, p["N"], p["K"]).mod, target, pass_config("sm_90a")), p["T"], spec)
        lines.append(
            f"| {p['layer']} | {p['T']} | {p['ukernel']} | {pr.high_s * 1e6:.1f} "
            f"({pr.low_s * 1e6:.1f}–{pr.high_s * 1e6:.1f}) | {p['measured_us']:.1f} | "
            f"{p['measured_us'] / (pr.high_s * 1e6):.2f} |"
        )
    lines += [
        "",
        "## 2. What the rules propose now, gated and ranked by the model: PREDICTED, not measured",
        "",
        "Per T the passing uKernel with the least bound + launch floor: its predicted time (slow end of the band; "
        "the bound has no latency term, so "
        "at small T it sits at the DRAM floor) and the same plus an assumed 2 µs floor per kernel launched "
        "(arch.SMSpec.launch_floor_s), next to cuBLAS fp32 as measured on the H100; ratio > 1 means the "
        "prediction beats cuBLAS.",
        "",
    ]
    hw = HardwareModel.for_gpu("sm_90")
    cublas = {(p["layer"], p["T"]): p["cublas_fp32_us"] for p in fixture["dense"]}
    for layer, (n, k) in LAYERS.items():
        screened = model_ukernels(hw, n, k, sorted({1, 16, 64, 128}), target, limits=GPURuleLimits())
        passed = [s for s in screened if s.passed]
        lines += [
            f"### {layer} (N={n}, K={k}): {len(screened)} proposals, {len(passed)} pass the gate",
            "",
            "| T | best predicted uKernel | bound µs | + launch floor µs | cuBLAS fp32 measured µs | "
            "cuBLAS / bound | cuBLAS / (bound + floor) |",
            "|---|---|---|---|---|---|---|",
        ]
        ratios, floored = [], []
        profiles = {s.tile: analyze(scheduled_module(s.tile, n, k), target, pass_config("sm_90a")) for s in passed}
        for t in TS:
            best_tile, best = min(
                ((tile, predict(a, t, spec)) for tile, a in profiles.items()), key=lambda x: x[1].with_launch_s
            )
            ratio = cublas[(layer, t)] / (best.high_s * 1e6)
            pessimistic = cublas[(layer, t)] / (best.with_launch_s * 1e6)
            ratios.append(ratio)
            floored.append(pessimistic)
            lines.append(
                f"| {t} | {best_tile.label()} | {best.high_s * 1e6:.1f} ({best.bound}) | "
                f"{best.with_launch_s * 1e6:.1f} | {cublas[(layer, t)]:.1f} | {ratio:.2f} | {pessimistic:.2f} |"
            )
        lines += [
            "",
            f"Geomean cuBLAS / predicted: **{_geomean(ratios):.2f}×** on the bound (worst {min(ratios):.2f}×), "
            f"**{_geomean(floored):.2f}×** with the launch floor (worst {min(floored):.2f}×).",
            "",
        ]
        for s in screened:
            if not s.passed:
                lines.append(f"- gated out: {s.tile.label()}: {'; '.join(r for r in s.verdict.reasons if 'FAIL' in r)}")
        lines.append("")
    lines += _half_precision_section(target)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _half_precision_section(target: dict[str, object]) -> list[str]:
    """§3: the GPU screen's fp16/bf16 proposal sets (tensor-core tiles with K splits from T = 16, the GEMV family
    below), each T's best predicted (H200 figures) against cuBLAS in the same dtype as the H200 session measured
    it; next to it what that session measured for the proposals it had then (no split-K, no bf16 GEMV)."""
    spec = h200_spec()
    hw = HardwareModel.for_gpu("sm_90")
    lines = [
        f"## 3. fp16 / bf16: the screen's proposals (model version {MODEL_VERSION}): PREDICTED, not measured",
        "",
        "What `gpu_screen.model_ukernels` proposes for half precision on sm_90a (tensor-core tiles, K split where "
        f"N·M blocks leave SMs idle, from T = {TENSOR_CORE_MIN_M}; the GEMV family for T ≤ {GEMV_MAX_T}), each T's "
        "best PREDICTED time (bound + launch floor, H200 figures: `gpu_model.arch.h200_spec`, the k-loop latency "
        "term fitted on that session's tensor-core points) against cuBLAS in the same dtype as MEASURED on the H200 "
        "(bench/results/gpu-h200-2026-11-27/). None of these proposals has run on a GPU.",
        "",
        "Where the chosen kernel itself ran in that session (fp16 GEMV tiles, unsplit tensor-core tiles), its measured "
        "time is shown too, and the last column replaces the prediction by it at those T: the model is optimistic "
        "for the GEMV family on the H200 (the same kernels measured 1.1-1.8x their prediction) and for "
        "tensor-core tiles at large grids (up to 2.1x, docs/gpu_model.md).",
        "",
        "| dtype | layer | predicted geomean cuBLAS / ours (worst T) | measured on the H200, old proposals (worst T) "
        "| measured where the same kernel ran, else predicted (worst T) |",
        "|---|---|---|---|---|",
    ]
    details: list[str] = []
    for dtype, name in (("float16", "fp16"), ("bfloat16", "bf16")):
        session = json.loads((H200 / f"{name}.json").read_text())
        cublas = {(r["layer"], r["T"]): r["cublas_us"] for r in session["rows"]}
        ran = {
            (r["layer"], r["T"], label): statistics.median(v)
            for r in session["rows"]
            for label, v in r["samples_us"].items()
            if label != "cublas"
        }
        for layer, (n, k) in LAYERS.items():
            screened = model_ukernels(hw, n, k, [1, 16, 64, 128], target, dtype)
            accesses = {
                s.tile: analyze(scheduled_module(s.tile, n, k, dtype), target, pass_config("sm_90a"))
                for s in screened
                if s.passed
            }
            ratios: dict[int, float] = {}
            mixed: dict[int, float] = {}
            details += [f"### {name} {layer} (N={n}, K={k}): {len(accesses)} proposals pass the gate", ""]
            details += [
                "| T | best predicted uKernel | predicted µs (bound) | cuBLAS measured µs | ratio | "
                "same kernel measured on the H200 µs (ratio) |"
            ]
            details += ["|---|---|---|---|---|---|"]
            for t in H200_TS:
                usable = {x: a for x, a in accesses.items() if not (isinstance(x, GemvTile) and t > GEMV_MAX_T)}
                tile, best = min(
                    ((x, predict(a, t, spec)) for x, a in usable.items()), key=lambda x: x[1].with_launch_s
                )
                ratios[t] = cublas[(layer, t)] / (best.with_launch_s * 1e6)
                measured = ran.get((layer, t, tile.label()))
                mixed[t] = cublas[(layer, t)] / measured if measured else ratios[t]
                seen = f"{measured:.1f} ({mixed[t]:.2f})" if measured else "not run"
                details.append(
                    f"| {t} | {tile.label()} | {best.with_launch_s * 1e6:.1f} ({best.bound}) | "
                    f"{cublas[(layer, t)]:.1f} | {ratios[t]:.2f} | {seen} |"
                )
            details.append("")
            worst = min(ratios, key=lambda t: ratios[t])
            old = session["summary"][layer]
            lines.append(
                f"| {name} | {layer} | **{_geomean(list(ratios.values())):.2f}×** predicted ({ratios[worst]:.2f}× at "
                f"T={worst}) | {old['geomean_cublas_over_ours']:.2f}× ({old['worst_ratio']:.2f}× at "
                f"T={old['worst_T']}) | {_geomean(list(mixed.values())):.2f}× ({min(mixed.values()):.2f}× at "
                f"T={min(mixed, key=lambda t: mixed[t])}) |"
            )
    return [*lines, "", *details]


if __name__ == "__main__":
    main()
