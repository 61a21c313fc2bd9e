"""The GPU tuner's proposals: chosen, gated and ordered by the static GPU model (no GPU needed); for fp16/bf16 the
tensor-core tiles (with K splits) from T = 16 and the GEMV family below, for fp32 never tensor cores."""

from __future__ import annotations

import pytest

from service.tuning.builder.cuda import cuda_target
from service.tuning.gpu_model.arch import sm_spec
from service.tuning.gpu_model.cubin import have_tools
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.gemv import GemvTile
from service.tuning.tuners.pipeline.schedule import GemmTile
from service.tuning.tuners.pipeline.tensorcore import TensorCoreTile
from service.tuning.tuners.ukernel import gpu_screen
from service.tuning.tuners.ukernel.gpu_build import build_cuda_ukernel
from service.tuning.tuners.ukernel.gpu_kernels import rows_per_piece, tile_record

N, K = 768, 768
TARGET = cuda_target("sm_90a")


@pytest.fixture(scope="module")
def screened() -> list[gpu_screen.Screened]:
    return gpu_screen.model_ukernels(HardwareModel.for_gpu("sm_90"), N, K, [1, 16, 128], TARGET)


def test_passing_proposals_come_first_and_every_one_is_conflict_free(screened: list[gpu_screen.Screened]) -> None:
    flags = [s.passed for s in screened]
    assert flags == sorted(flags, reverse=True) and any(flags)
    for s in screened:
        assert s.model["predicted"]["predicted_us"] > 0
        if s.passed:
            assert "shared loads:" in s.verdict.reasons[1] and "FAIL" not in " ".join(s.verdict.reasons)


def test_small_t_gets_a_gemv_kernel_and_large_t_gemm_tiles(screened: list[gpu_screen.Screened]) -> None:
    gemv = [s for s in screened if s.passed and isinstance(s.tile, GemvTile)]
    assert len(gemv) == 1 and gemv[0].representative_m == 1
    assert any(isinstance(s.tile, GemmTile) and s.representative_m == 128 for s in screened if s.passed)


def test_each_m_keeps_at_most_per_m_tiles_of_distinct_bm_fastest_first(screened: list[gpu_screen.Screened]) -> None:
    at = [s for s in screened if s.passed and s.representative_m == 128 and isinstance(s.tile, GemmTile)]
    assert 1 <= len(at) <= 2 and len({s.tile.bm for s in at}) == len(at)
    assert [s.predicted_s for s in at] == sorted(s.predicted_s for s in at)


def test_an_arch_without_figures_keeps_the_rules_order_and_says_so() -> None:
    out = gpu_screen.model_ukernels(HardwareModel.for_gpu("sm_75"), N, K, [16], cuda_target("sm_75"))
    assert out and all(s.predicted_s is None and s.verdict.reasons[0].startswith("not modelled") for s in out)


@pytest.mark.skipif(not have_tools(), reason="needs the nvcc wheel (cuda-build extra)")
def test_a_gemv_ukernel_is_built_with_its_bucket_as_piece_rows() -> None:
    tile = GemvTile.from_label("gemv_4x64_s1_r4v4_b4")
    kernel = build_cuda_ukernel(tile, N, K, TARGET)
    assert kernel.spec.mt == rows_per_piece(tile) == 4 and kernel.spec.tile == tile_record(tile)
    assert kernel.spec.tile["kind"] == "gemv"


def test_a_tile_tvm_cannot_build_is_ranked_last_and_gated_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise ValueError("stand-in for a schedule TVM rejects")

    monkeypatch.setattr(gpu_screen, "scheduled_module", refuse)
    profiles = gpu_screen._Profiles(N, K, TARGET, sm_spec("sm_90a", 132), "float32")
    proposal = gpu_screen._GemvProposal(GemvTile.from_label("gemv_4x64_s1_r4v4_b4"), 1)
    assert profiles.predicted_s(proposal.tile, 1) == float("inf")
    result = profiles.screened(proposal)
    assert not result.passed and result.verdict.reasons[0].startswith("build FAIL: ValueError: stand-in")


# --- fp16 / bf16: tensor-core tiles next to the GEMV family ------------------------------------------------------

LAYERS = {"qkv": (2304, 768), "ffn_down": (768, 3072)}
HALF_MS = [1, 8, 16, 128]


@pytest.fixture(scope="module")
def half_screened() -> dict[tuple[str, str], list[gpu_screen.Screened]]:
    hw = HardwareModel.for_gpu("sm_90")
    return {
        (dtype, layer): gpu_screen.model_ukernels(hw, n, k, HALF_MS, TARGET, dtype)
        for dtype in ("float16", "bfloat16")
        for layer, (n, k) in LAYERS.items()
    }


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_half_precision_gets_tensor_cores_from_t16_and_a_gemv_below(
    half_screened: dict[tuple[str, str], list[gpu_screen.Screened]], dtype: str, layer: str
) -> None:
    screened = half_screened[(dtype, layer)]
    passed = [s for s in screened if s.passed]
    tensor = [s for s in passed if isinstance(s.tile, TensorCoreTile)]
    gemv = [s for s in passed if isinstance(s.tile, GemvTile)]
    assert tensor and all(s.representative_m >= gpu_screen.TENSOR_CORE_MIN_M for s in tensor)
    assert {s.representative_m for s in tensor} >= {16}
    assert len(gemv) == 1 and gemv[0].representative_m <= 8
    assert gemv[0].tile.load_bytes(dtype) == 16  # the staged 16-byte-load tiles win ties (H200: 3.5 vs 4.7 µs)
    assert not [s for s in screened if isinstance(s.tile, GemmTile)]  # no SIMT tiles on half inputs on sm_80+
    for s in tensor:
        assert s.tile.problem(*LAYERS[layer], dtype) is None
        assert s.to_record()["gemm_tile"]["kind"] == "tensorcore" and rows_per_piece(s.tile) == s.tile.bm
        assert "mma.sync" in s.reasons[0] and s.model["predicted"]["predicted_us"] > 0


def test_ffn_down_splits_k_where_n_leaves_sms_idle(
    half_screened: dict[tuple[str, str], list[gpu_screen.Screened]],
) -> None:
    """N = 768: at most 48 blocks per row block without a split on 132 SMs; the model ranks split tiles first."""
    for dtype in ("float16", "bfloat16"):
        tensor = [s for s in half_screened[(dtype, "ffn_down")] if s.passed and isinstance(s.tile, TensorCoreTile)]
        assert any(s.tile.split_k > 1 for s in tensor), [s.tile.label() for s in tensor]
        assert any("K split" in s.reasons[0] for s in tensor)


def test_fp32_never_gets_tensor_cores(screened: list[gpu_screen.Screened]) -> None:
    """TF32 would change the numerics: float32 stays on SIMT tiles and the GEMV family."""
    assert screened and not [s for s in screened if isinstance(s.tile, TensorCoreTile)]
    pool = gpu_screen.model_ukernels(HardwareModel.for_gpu("sm_90"), *LAYERS["ffn_down"], [16], TARGET, "float32")
    assert pool and not [s for s in pool if isinstance(s.tile, TensorCoreTile)]


def test_a_tensor_core_tile_is_one_variant_its_depth_already_chosen() -> None:
    from service.tuning.tuners.ukernel.gpu_tuner import GPUUKernelTuner

    tile = TensorCoreTile.from_label("tc16x32x64_w16x16_s3_sk4")
    hw = HardwareModel.for_gpu("sm_90")
    assert GPUUKernelTuner._variants(tile, *LAYERS["ffn_down"], "sm_90a", hw) == [tile]
    chosen, timings = GPUUKernelTuner._best_depth(None, [tile], {}, hw, 16)  # type: ignore[arg-type]
    assert chosen == tile and timings == {}
