"""The static GPU model's report (issue 32), on a host without a GPU: (1) the first-light uKernels' predicted
times next to what the H100 measured; (2) what the GPU rules now propose (padded rows, interleaved columns),
gated and ranked by the model, predicted per T next to cuBLAS fp32 as the H100 measured it.

Every number in part 2 is a PREDICTION (a per-SM bound: shared-memory wavefronts, FFMA issue, DRAM); no kernel
in it has run on a GPU. cuBLAS figures are the first light's measurements (kernel-only, CUDA graphs).

    .venv/bin/python bench/gpu_model_report.py [--out bench/results/gpu_model_report.md]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.gpu_model.access import analyze
from service.tuning.gpu_model.arch import sm_spec
from service.tuning.gpu_model.bound import predict
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.gemv import default_gemv, schedule_gemv
from service.tuning.tuners.pipeline.schedule import GemmTile, schedule_gemm
from service.tuning.tuners.pipeline.tensorcore import TensorCoreTile, schedule_tensorcore
from service.tuning.tuners.ukernel.gpu_kernels import scheduled_module
from service.tuning.tuners.ukernel.gpu_rules import GPURuleLimits
from service.tuning.tuners.ukernel.gpu_screen import model_ukernels

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "tuning" / "gpu_model" / "h100_first_light.json"
LAYERS = {"qkv": (2304, 768), "ffn_down": (768, 3072)}
TS = (1, 2, 4, 8, 16, 32, 61, 64, 97, 128)
TENSOR_CORE_TILES = ("tc32x64x32_w16x32_s3", "tc64x64x32_w32x32_s4", "tc16x64x64_w16x16_s2")


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
    lines += [
        "## 3. fp16 uKernels (tensor cores: pipeline/tensorcore.py; GEMV: pipeline/gemv.py): PREDICTED, not measured",
        "",
        "Not yet in the tuner: the tensor-core tiles the module's tests build and the fp16 GEMV default, each "
        "predicted per T (mma.sync at an assumed "
        "1024 FMA/clock/SM, `SMSpec.mma_fma_per_clock`), the best + launch floor next to cuBLAS fp16 as measured "
        "on the H100.",
        "",
    ]
    fp16 = {(p["layer"], p["T"]): p["cublas_fp16_us"] for p in fixture["dense"]}
    for layer, (n, k) in LAYERS.items():
        tiles = [TensorCoreTile.from_label(t) for t in TENSOR_CORE_TILES]
        accesses: dict[object, object] = {
            t: analyze(schedule_tensorcore(t, n, k).mod, target, pass_config("sm_90a")) for t in tiles
        }
        gemv = default_gemv(n, k, "float16")  # the GEMV family in fp16 (16-byte W loads staged in registers)
        accesses[gemv] = analyze(schedule_gemv(gemv, n, k, "float16").mod, target, pass_config("sm_90a"))
        ratios = []
        lines += [
            f"### {layer} fp16",
            "",
            "| T | tile | + launch floor µs (bound) | cuBLAS fp16 µs | ratio |",
            "|---|---|---|---|---|",
        ]
        for t in TS:
            tile, best = min(((x, predict(a, t, spec)) for x, a in accesses.items()), key=lambda x: x[1].with_launch_s)
            ratio = fp16[(layer, t)] / (best.with_launch_s * 1e6)
            ratios.append(ratio)
            lines.append(
                f"| {t} | {tile.label()} | {best.with_launch_s * 1e6:.1f} ({best.bound}) | {fp16[(layer, t)]:.1f} | "
                f"{ratio:.2f} |"
            )
        lines += ["", f"Geomean cuBLAS fp16 / predicted: **{_geomean(ratios):.2f}×** (worst {min(ratios):.2f}×).", ""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
