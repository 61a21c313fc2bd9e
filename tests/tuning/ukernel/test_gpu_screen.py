"""The GPU tuner's proposals: chosen, gated and ordered by the static GPU model (no GPU needed)."""

from __future__ import annotations

import pytest

from service.tuning.builder.cuda import cuda_target
from service.tuning.gpu_model.arch import sm_spec
from service.tuning.gpu_model.cubin import have_tools
from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.gemv import GemvTile
from service.tuning.tuners.pipeline.schedule import GemmTile
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
