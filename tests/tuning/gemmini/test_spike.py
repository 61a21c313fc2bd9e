"""Spike in the loop (issue 36 item 5): the generated program's own check, and the Spike checker.

Everywhere: the program's LCG fills (emulated here) keep a QKV-sized reference inside int8, its result line
carries `saturated=`, the parser reads good, incorrect and saturated lines and refuses the old format, and the
checker says "not run" without the tools. With the tools (bench/spike_tools.sh, then KERNELFLEET_RISCV=<prefix>)
the default config and a tuned 32x32 WS winner run bit-exact with nothing saturated."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from service.tuning.gemmini.backends import firesim_program, spike
from service.tuning.gemmini.backends.firesim_program import (
    TARGET_STD,
    TuneResult,
    fill_params,
    parse_uartlog,
    render_program,
)
from service.tuning.gemmini.gemmini_h import default_point
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, Mapping
from service.tuning.tuners.gemmini.search import tune_fixed_hw

QKV = Layer.gemm("qkv-like", M=128, N=768, K=768)  # BERT's Q/K/V projection: 80 % saturated with constant fills
UNET = Layer.conv("conv-unet-3x3", H=64, W=64, CI=32, CO=32, KH=3, KW=3, padding=1)
STRIDED = Layer.conv("conv-s2-pad", H=28, W=28, CI=64, CO=64, KH=3, KW=3, stride=2, padding=1)
WINNER_HW = HwConfig(dim=32, sp_kib=64, acc_kib=64, dataflow="WS")  # a 32x32 WS winner of the headline grid


def lcg_fill(n: int, seed: int, span: int, keep: int) -> np.ndarray:
    """The program's fill() in Python, step for step."""
    out = np.zeros(n, dtype=np.int64)
    s = seed
    for i in range(n):
        s = (s * 1664525 + 1013904223) & 0xFFFFFFFF
        v = ((s >> 16) & 127) % span + 1
        out[i] = (v if (s >> 23) & 1 else -v) if (s >> 24) < keep else 0
    return out


def test_fills_keep_a_qkv_reference_inside_int8_with_many_values() -> None:
    span, keep = fill_params(QKV.C)
    assert (span, keep) == (1, 147)  # K = 768: ±1 at 57 % density
    a = lcg_fill(QKV.N * QKV.C, 1, span, keep).reshape(QKV.N, QKV.C)
    b = lcg_fill(QKV.C * QKV.K, 2, span, keep).reshape(QKV.C, QKV.K)
    ref = a @ b
    assert np.abs(ref).max() < 127  # not one output at the int8 limits
    assert len(np.unique(ref)) > 60  # unlike the 5 distinct values of the constant fills
    assert 0.5 * TARGET_STD < ref.std() <= TARGET_STD


def test_fill_params_scale_with_the_reduction_length() -> None:
    assert fill_params(9) == (3, 256) and fill_params(64) == (1, 256)
    spans_keeps = [fill_params(k) for k in (16, 288, 768, 3072, 4608)]
    assert [k for _, k in spans_keeps] == sorted((k for _, k in spans_keeps), reverse=True)
    assert all(1 <= k <= 256 for _, k in spans_keeps)


def test_program_uses_seeded_fills_and_reports_saturation() -> None:
    maps, _ = default_point([QKV, UNET])
    src = render_program(DEFAULT_HW, list(zip([QKV, UNET], maps, strict=True)))
    assert "fill((elem_t*)A0, 98304, 1u, 1, 147); fill((elem_t*)B0, 589824, 2u, 1, 147);" in src
    assert "fill((elem_t*)In1, 131072, 3u, 1, 241); fill((elem_t*)W1, 9216, 4u, 1, 241);" in src
    assert src.count("saturated=%lu") == 2 and "elem_t_max || ref[i] == elem_t_min" in src
    assert "(i * 7 + 3) % 5" not in src  # the old constant pattern


def test_conv_runs_with_the_layers_real_padding() -> None:
    maps, _ = default_point([STRIDED])
    src = render_program(DEFAULT_HW, [(STRIDED, maps[0])])
    # the 28x28 input as given, stride 2, padding 1 (not a pre-padded 29x29 image with padding 0)
    assert "static elem_t In0[1][28][28][64]" in src
    assert src.count("1, 28, 28, 64, 64, 14, 14, 2, 1, 1, 1, 3") == 2  # tiled_conv and its CPU reference
    assert "padding=1" in re.findall(r"// KF_CANDIDATE .*", src)[0]


def test_a_layer_without_input_dims_runs_pre_padded() -> None:
    lay = Layer("raw", "conv", N=1, P=8, Q=8, C=16, K=16, R=3, S=3, padding=1)  # no H/W recorded
    src = render_program(DEFAULT_HW, [(lay, Mapping({"N": 1, "P": 8, "Q": 8, "K": 16, "R": 3, "S": 3, "C": 16}))])
    assert src.count("1, 10, 10, 16, 16, 8, 8, 1, 1, 1, 0, 3") == 2


def test_parse_reads_correct_incorrect_and_saturated_lines() -> None:
    log = "\n".join(
        [
            "boot noise",
            "TUNE_RESULT id=0 cycles=1200 correct=1 saturated=0",
            "TUNE_RESULT id=1 cycles=99 correct=0 saturated=0",
            "TUNE_RESULT id=2 cycles=7 correct=1 saturated=78643",
        ]
    )
    got = parse_uartlog(log, 3)
    assert got == {0: TuneResult(1200, True, 0), 1: TuneResult(99, False, 0), 2: TuneResult(7, True, 78643)}
    with pytest.raises(ValueError, match="malformed"):  # a binary built before the saturation field
        parse_uartlog("TUNE_RESULT id=0 cycles=1 correct=1", 1)
    with pytest.raises(ValueError, match=r"candidate\(s\) \[1\]"):
        parse_uartlog("TUNE_RESULT id=0 cycles=1 correct=1 saturated=0", 2)


def test_a_check_passes_only_when_exact_and_unsaturated() -> None:
    assert spike.SpikeCheck("a", True, 0).passed and spike.SpikeCheck("a", True, 0).timing is None
    assert not spike.SpikeCheck("b", False, 0).passed
    assert not spike.SpikeCheck("c", True, 3).passed  # right, but the check could not have told


def test_tools_not_installed(tmp_path: Path) -> None:
    with pytest.raises(spike.SpikeNotInstalled, match="KERNELFLEET_RISCV is not set"):
        spike.SpikeTools.from_env({})
    with pytest.raises(spike.SpikeNotInstalled, match=r"spike not installed: no .*/bin/spike"):
        spike.SpikeTools.from_env({"KERNELFLEET_RISCV": str(tmp_path)})
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "spike").write_text("")
    with pytest.raises(spike.SpikeNotInstalled, match="Spike's headers not installed"):
        spike.SpikeTools.from_env({"KERNELFLEET_RISCV": str(tmp_path)})


def test_verdict_without_tools_says_why_and_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("KERNELFLEET_RISCV", "KERNELFLEET_SPIKE"):
        monkeypatch.delenv(var, raising=False)
    maps, _ = default_point([QKV])
    v = spike.verdict(DEFAULT_HW, [QKV], maps)
    assert v == {"status": "not run: KERNELFLEET_RISCV is not set (build the tools with bench/spike_tools.sh)"}


def test_verdict_lists_layers_past_the_mac_limit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    tools = spike.SpikeTools(tmp_path, tmp_path, tmp_path, tmp_path, tmp_path)
    seen: list[list[str]] = []

    def fake_check(hw: HwConfig, cands: list[tuple[Layer, Mapping]], *_: object) -> spike.SpikeRun:
        seen.append([lay.name for lay, _ in cands])
        return spike.SpikeRun(hw.key(), "h", tuple(spike.SpikeCheck(lay.name, True, 0) for lay, _ in cands))

    monkeypatch.setattr(spike, "check", fake_check)
    maps, _ = default_point([QKV, STRIDED])
    v = spike.verdict(DEFAULT_HW, [QKV, STRIDED], maps, tools, max_macs=spike.layer_macs(STRIDED))
    assert seen == [["conv-s2-pad"]] and v["status"] == "passed" and v["not_run"] == ["qkv-like"]
    assert v["checks"] == [{"layer": "conv-s2-pad", "correct": True, "saturated": 0}]  # no timing field


# -- gated on the real tools ------------------------------------------------------------------------------
def _tools() -> spike.SpikeTools:
    try:
        return spike.SpikeTools.from_env()
    except spike.SpikeNotInstalled as exc:
        pytest.skip(f"Spike + libgemmini not available: {exc}")


@pytest.mark.parametrize("which", ["default", "winner-32x32-WS"])
def test_spike_runs_the_program_bit_exact_without_saturation(which: str, tmp_path: Path) -> None:
    tools = _tools()
    layers = [QKV, UNET, STRIDED]
    if which == "default":
        hw = DEFAULT_HW
        maps, _ = default_point(layers)
    else:
        hw = WINNER_HW
        maps = tune_fixed_hw(layers, hw, budget=300).mappings  # tuned tiles, not gemmini.h's own
        assert maps != default_point(layers, hw)[0]
    run = spike.check(hw, list(zip(layers, maps, strict=True)), tools, timeout_s=900, workdir=tmp_path)
    assert [c.layer for c in run.checks] == [lay.name for lay in layers]
    assert all(c.correct for c in run.checks), run
    assert all(c.saturated == 0 for c in run.checks), run
    assert (tools.cache / run.libgemmini / "libgemmini.so").is_file()


def test_spike_sees_saturation_the_old_fills_hid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Wide dense fills (span 4, no zeros) over K = 512: the reference clamps, the line says so, no pass."""
    tools = _tools()
    monkeypatch.setattr(firesim_program, "fill_params", lambda reduction: (4, 256))
    lay = Layer.gemm("g-sat", M=64, N=64, K=512)
    run = spike.check(DEFAULT_HW, [(lay, default_point([lay])[0][0])], tools, timeout_s=300, workdir=tmp_path)
    (c,) = run.checks
    assert c.correct and c.saturated > 64 * 64 // 4 and not run.passed  # 1930 of 4096 here


def test_spike_refuses_a_program_on_another_configs_libgemmini(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Why libgemmini is rebuilt per config: the default program on the 32x32 library does not run."""
    tools = _tools()
    wrong = spike.libgemmini_for(WINNER_HW, tools)
    monkeypatch.setattr(spike, "libgemmini_for", lambda hw, tools: wrong)
    lay = Layer.gemm("g", M=64, N=64, K=64)
    with pytest.raises(spike.SpikeError, match="spike exited"):
        spike.check(DEFAULT_HW, [(lay, default_point([lay])[0][0])], tools, timeout_s=300, workdir=tmp_path)
