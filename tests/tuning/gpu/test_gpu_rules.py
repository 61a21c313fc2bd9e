"""FTuner's GPU rules and the GPU hardware model, on fixed H100 / A100 / T4 descriptions (no GPU needed)."""

from __future__ import annotations

import dataclasses

import pytest

from service.tuning.hardware_model import HardwareModel
from service.tuning.tuners.pipeline.schedule import GemmTile
from service.tuning.tuners.ukernel.gpu_rules import (
    GPURuleLimits,
    check_gpu_tile,
    choose_split_k,
    estimated_time,
    gpu_candidates,
    gpu_ukernels,
    grid_blocks,
    resident_blocks,
)
from tests.tuning.gpu.descriptions import ARCHES, card

BERT = {"qkv": (2304, 768), "attn_out": (768, 768), "ffn_up": (3072, 768), "ffn_down": (768, 3072)}


def _hw(arch: str) -> HardwareModel:
    return card(arch).hardware_model()


def test_model_from_detected_gpu_overrides_the_table() -> None:
    h100 = _hw("sm_90")
    assert (h100.sm_count, h100.cores, h100.smem_per_block, h100.regs_per_block) == (132, 132, 49152, 65536)
    assert h100.smem_per_sm == 228 << 10 and h100.max_threads_per_sm == 2048 and h100.max_blocks_per_sm == 32
    pcie = dataclasses.replace(card("sm_90"), name="NVIDIA H100 PCIe", sm_count=114)
    assert pcie.hardware_model().sm_count == 114
    t4 = _hw("sm_75")
    assert t4.max_threads_per_sm == 1024 and t4.smem_per_sm == 64 << 10 and t4.sm_count == 40


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("layer", sorted(BERT))
def test_every_candidate_respects_the_budgets(arch: str, layer: str) -> None:
    hw = _hw(arch)
    n, k = BERT[layer]
    cands = gpu_ukernels(hw, n, k)
    assert 2 <= len(cands) <= 10
    for c in cands:
        t = c.tile
        assert t.problem(n, k) is None
        assert t.threads % hw.warp_size == 0 and t.threads <= hw.max_threads_per_block  # warp alignment
        assert t.smem_bytes() <= hw.smem_per_block  # stage-sized buffers fit the static limit
        assert t.registers_estimate() <= 255 and t.registers_estimate() * t.threads <= hw.regs_per_block
        assert c.blocks_per_sm >= 1 and 0 < c.occupancy <= 1
        ok, _, reasons = check_gpu_tile(hw, n, k, t, c.representative_m)
        assert ok, reasons
    # different representative Ms give different block heights for the combination step to choose from
    assert len({c.tile.bm for c in cands}) >= 2


@pytest.mark.parametrize("arch", ARCHES)
def test_occupancy_every_sm_gets_a_block(arch: str) -> None:
    hw = _hw(arch)
    for m in (1, 16, 128, 512):
        for c in gpu_candidates(hw, 2304, 768, m):
            assert c.blocks >= hw.sm_count, (m, c.tile.label(), c.blocks)


@pytest.mark.parametrize("arch", ARCHES)
def test_split_k_only_when_m_times_n_is_small(arch: str) -> None:
    hw = _hw(arch)
    small = gpu_candidates(hw, 768, 768, 1)
    assert small and all(c.tile.split_k > 1 for c in small)  # 1 row × 768 columns cannot fill the SMs
    big = gpu_candidates(hw, 3072, 768, 4096)
    assert big and all(c.tile.split_k == 1 for c in big)
    tile = GemmTile(16, 64, 32, 2, 2)
    assert choose_split_k(hw, 4096, 3072, 768, tile, GPURuleLimits()) == 1
    split = choose_split_k(hw, 1, 768, 768, tile, GPURuleLimits())
    assert split > 1 and 768 % (32 * split) == 0 and 768 // (32 * split) >= tile.stages
    # a split that is not needed fails rule (f)
    ok, _, reasons = check_gpu_tile(hw, 3072, 768, dataclasses.replace(tile, split_k=4), 4096)
    assert not ok and any(r.startswith("split-K FAIL") for r in reasons)


def test_more_sms_need_more_split() -> None:
    tile = GemmTile(8, 32, 32, 1, 1)
    h100, t4 = _hw("sm_90"), _hw("sm_75")
    assert choose_split_k(h100, 1, 768, 768, tile, GPURuleLimits()) >= choose_split_k(
        t4, 1, 768, 768, tile, GPURuleLimits()
    )
    assert grid_blocks(1, 768, dataclasses.replace(tile, split_k=4)) == 96


@pytest.mark.parametrize(
    ("tile", "rule"),
    [
        (GemmTile(8, 24, 48, 4, 1, 4), "warp alignment FAIL"),  # 48 threads: 1.5 warps
        (GemmTile(1, 128, 64, 1, 2, 4), "shared memory FAIL"),  # 4 × 129 × 64 × 4 B = 132 KiB
        (GemmTile(64, 128, 16, 1, 1, 2), "warp alignment FAIL"),  # 8192 threads
        (GemmTile(64, 64, 16, 8, 8, 2), None),
    ],
)
def test_rules_reject_with_a_reason(tile: GemmTile, rule: str | None) -> None:
    ok, _, reasons = check_gpu_tile(_hw("sm_90"), 2304, 768, tile, 512)
    if rule is None:
        assert ok, reasons
    else:
        assert not ok and any(r.startswith(rule) for r in reasons), reasons


def test_occupancy_limits_and_the_time_model() -> None:
    h100 = _hw("sm_90")
    blocks, bound = resident_blocks(h100, GemmTile(64, 64, 32, 8, 8, 4))  # 64 threads, 64 KiB smem of 228
    assert (blocks, bound) == (3, "shared memory")
    blocks, bound = resident_blocks(h100, GemmTile(64, 64, 16, 2, 2, 2))  # 1024 threads
    assert (blocks, bound) == (2, "threads")
    # padding a 1-row call up to 64 rows costs more than a 1-row tile with split-K
    assert estimated_time(h100, 2304, 768, GemmTile(64, 64, 32, 8, 8), 1) > estimated_time(
        h100, 2304, 768, GemmTile(1, 64, 32, 1, 1, split_k=4), 1
    )
    with pytest.raises(ValueError, match="GPU hardware model"):
        gpu_candidates(HardwareModel.from_cpu_description(["avx2"], {1: 32768}, 4), 768, 768)
