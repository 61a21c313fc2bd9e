"""The static GPU model against the 22 kernel times measured on an H100 (gpu-first-light.md; fixture beside).

The model never saw a GPU: each kernel is rebuilt here from its label, lowered by TVM, and bounded from its
index expressions. Issue 32 asks every measured point within −10 % / +25 % of the prediction; the research
note's hand model reached −10 % / +17 %. The padded twins must then come out conflict-free.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from service.tuning.builder.cuda import cuda_target, pass_config
from service.tuning.gpu_model import gate
from service.tuning.gpu_model.access import analyze
from service.tuning.gpu_model.arch import sm_spec
from service.tuning.gpu_model.bound import predict
from service.tuning.gpu_model.cubin import have_tools
from service.tuning.gpu_model.profile import KernelProfile, profile_module
from service.tuning.tuners.pipeline.profile import profile_gemm_tile
from service.tuning.tuners.pipeline.schedule import GemmTile, conflict_free_pad, schedule_gemm

FIXTURE = json.loads((Path(__file__).parent / "h100_first_light.json").read_text())
TARGET = cuda_target("sm_90a")
H100 = sm_spec("sm_90a", 132)
LOW, HIGH = 0.90, 1.25  # measured / predicted


@cache
def _dense(label: str, n: int, k: int) -> KernelProfile:
    tile = GemmTile.from_label(label)
    return KernelProfile(label, analyze(schedule_gemm(tile, n, k).mod, TARGET, pass_config("sm_90a")), (), H100)


def test_fixture_holds_the_twenty_dense_points() -> None:
    assert len(FIXTURE["dense"]) == 20
    assert {p["layer"] for p in FIXTURE["dense"]} == {"qkv", "ffn_down"}


@pytest.mark.parametrize("point", FIXTURE["dense"], ids=lambda p: f"{p['layer']}-T{p['T']}")
def test_dense_ukernel_time_is_predicted(point: dict) -> None:
    predicted = _dense(point["ukernel"], point["N"], point["K"]).predict(point["T"])
    ratio = point["measured_us"] / (predicted.high_s * 1e6)
    assert LOW <= ratio <= HIGH, (point, predicted.to_dict())
    assert predicted.bound == "shared memory"  # the diagnosis: bank conflicts, not math or DRAM


# The pipeline kind's best config ('/r3f') keeps its register fragment rings on the stack (304-byte frame): its
# loads go through local memory, which the model does not time — the gate rejects such kernels before they are
# ever measured (test_the_gate_rejects_the_register_pipelines_stack_frame). Its unpipelined twin is predicted.
@pytest.mark.parametrize(
    "point", [p for p in FIXTURE["pipeline"] if p["config"].endswith("/r1")], ids=lambda p: p["config"]
)
def test_pipeline_kind_time_is_predicted(point: dict) -> None:
    from service.tuning.tuners.pipeline.lowering import schedule
    from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig

    bm, bn, bk = (int(x) for x in point["config"].split("/")[0].split("x"))
    tm, tn = (int(x) for x in point["config"].split("/")[1].split("x"))
    smem, reg = point["config"].split("/")[2:]
    config = PipelineConfig(
        bm, bn, bk, tm, tn, int(smem[1:].rstrip("a")), smem.endswith("a"), int(reg[1:].rstrip("f")), reg.endswith("f")
    )
    sch = schedule(config, GemmShape(1, point["M"], point["N"], point["K"]))
    access = analyze(sch.mod, TARGET, pass_config("sm_90a"))
    predicted = predict(access, point["M"], H100)
    ratio = point["measured_us"] / (predicted.high_s * 1e6)
    assert LOW <= ratio <= HIGH, (point, predicted.to_dict())


def test_every_first_light_ukernel_fails_the_gate_and_its_padded_twin_passes() -> None:
    for label in sorted({p["ukernel"] for p in FIXTURE["dense"]}):
        point = next(p for p in FIXTURE["dense"] if p["ukernel"] == label)
        first = _dense(label, point["N"], point["K"])
        assert not gate.check(first).passed, label
        tile = GemmTile.from_label(label)
        twin = GemmTile.from_label(f"{label}_p{conflict_free_pad(tile.bk)}")
        fixed = _dense(twin.label().replace("_t", "_t", 1), point["N"], point["K"]) if tile.tn == 1 else None
        if fixed is not None:  # one column per thread: padding alone makes it conflict-free
            assert gate.conflict_ratio(fixed) == 1.0, label
        spread = GemmTile(**{**tile.__dict__, "pad": conflict_free_pad(tile.bk), "interleave": True})
        assert gate.conflict_ratio(_dense(spread.label(), point["N"], point["K"])) == 1.0, label


def test_padding_brings_the_t1_kernels_to_the_research_notes_prediction() -> None:
    # gpu-first-light/static_model_vs_h100.txt: qkv 8x96x32 padded, T ≤ 8, 2.9–5.3 µs
    predicted = _dense("8x96x32_t1x1_s2a_sk8_p4", 2304, 768).predict(1)
    assert predicted.shared_s[0] * 1e6 == pytest.approx(2.91, abs=0.05)
    assert predicted.high_s * 1e6 == pytest.approx(5.25, abs=0.05)


@pytest.mark.skipif(not have_tools(), reason="nvcc/cuobjdump/nvdisasm wheels absent (pip install -e .[cuda-build])")
def test_sass_agrees_with_the_modelled_loads_and_resources() -> None:
    # ptxas figures of the research note: 40 registers and 26624 B of shared memory, no stack; the model's
    # 16-byte loads are LDS.128 in the SASS
    profile = profile_gemm_tile(GemmTile.from_label("8x96x32_t1x1_s2a_sk8"), 2304, 768, TARGET)
    main = next(r for r in profile.resources if r.name == "main_kernel")
    assert (main.registers, main.shared_bytes, main.stack_bytes) == (40, 26624, 0)
    assert main.sass.get("LDS.128", 0) > 0 and main.sass.get("FFMA", 0) > 0 and not main.sass.get("HMMA")
    assert all(load.width_bytes == 16 for load in profile.access.kernels[0].shared_loads)
    assert gate.check(profile).reasons[0] == "local memory: none"


@pytest.mark.skipif(not have_tools(), reason="nvcc/cuobjdump/nvdisasm wheels absent (pip install -e .[cuda-build])")
def test_the_gate_rejects_the_register_pipelines_stack_frame() -> None:
    # the pipeline kind's best first-light config keeps its fragment rings on a 304-byte stack (§4.6)
    from service.tuning.tuners.pipeline.lowering import schedule, source
    from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig

    config, gemm = PipelineConfig(64, 16, 16, 4, 4, 2, True, 3, True), GemmShape(1, 128, 3072, 768)
    profile = profile_module(
        config.key, schedule(config, gemm).mod, TARGET, pass_config("sm_90a"), source(config, gemm, "sm_90a")
    )
    verdict = gate.check(profile)
    assert not verdict.passed and "local memory FAIL" in verdict.reasons[0], verdict
