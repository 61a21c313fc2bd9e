"""bench/gpu_ukernels.py without a GPU: its arguments, its summary, and the kernels it would build (TVM codegen;
nvcc when the wheel is there)."""

from __future__ import annotations

import pytest

from tests.bench.modules import load

ukernels = load("gpu_ukernels")


def test_arguments_name_the_field_that_is_wrong() -> None:
    args = ukernels.parse_args(["--layers", "qkv", "--ts", "1,8", "--dtype", "float32"])
    assert args.layers == ["qkv"] and args.ts == [1, 8] and args.dtype == "float32"
    with pytest.raises(SystemExit):
        ukernels.parse_args(["--layers", "qkv,nope"])
    with pytest.raises(SystemExit):
        ukernels.parse_args(["--ts", "0,4"])


def test_summary_is_the_geomean_of_cublas_over_ours_and_the_worst_t() -> None:
    rows = [
        {"layer": "qkv", "T": 1, "cublas_us": 8.0, "ours_us": 4.0},
        {"layer": "qkv", "T": 16, "cublas_us": 4.0, "ours_us": 4.0},
        {"layer": "qkv", "T": 64, "cublas_us": 4.0, "ours_us": 8.0},
        {"layer": "qkv", "T": 128, "cublas_us": 4.0},  # no correct kernel: not counted
    ]
    summary = ukernels.summarize(rows)["qkv"]
    assert summary["geomean_cublas_over_ours"] == 1.0
    assert (summary["worst_T"], summary["worst_ratio"], summary["goal_met"]) == (64, 0.5, False)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_every_kernel_it_would_time_builds(dtype: str) -> None:
    built, failed = ukernels.build_all("ffn_down", "sm_90a", dtype)
    assert not failed
    families = {label.split("_")[0][:2] for label in built}
    # the static model's proposals: fp32 SIMT GEMM (labels start with a digit) + GEMV; fp16 and bf16 tensor cores
    # (split-K among them on ffn_down's N = 768) + GEMV
    expected = {"float32": {"ge"}, "float16": {"tc", "ge"}, "bfloat16": {"tc", "ge"}}[dtype]
    assert expected <= families and len(built) >= 3
    if dtype != "float32":
        assert any(label.startswith("tc") and "_sk" in label for label in built), sorted(built)
