"""The analytical model against hand-computed values, the design space's rejections, importance
estimation, and co-exploration vs random search at equal budget."""

from __future__ import annotations

import pytest

from service.tuning.gemmini.gemmini_h import default_mapping, default_point, matmul_auto_tiles
from service.tuning.gemmini.model import layer_cost, network_cost
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer, Mapping, fit
from service.tuning.tuners.gemmini.importance import ImportanceScheduler, LayerState
from service.tuning.tuners.gemmini.search import co_explore, random_search


def test_gemm_32_cubed_on_a_16x16_array_by_hand() -> None:
    hw = HwConfig(dim=16, sp_kib=64, acc_kib=16, dataflow="WS", dma_buswidth=128)
    lay = Layer.gemm("g", M=32, N=32, K=32)
    m = Mapping({"N": 32, "K": 32, "C": 32})
    assert fit(hw, lay, m) is None
    c = layer_cost(hw, lay, m)
    # one tile. WS compute: (32/16)·(32/16) weight blocks × (32 rows + 16 preload) = 192 cycles.
    # scratchpad reads 32·32·2 + 1024 = 3072 words at 2·16/cycle = 96; DRAM reads 2048 B at 16 B/cycle = 128,
    # writes 1024 B = 64. Tile = max(192, 96, acc max(2048+1024, 2048)/32 = 96, 128) = 192, + first load 128
    # + last store 64 = 384 cycles.
    assert c.cycles == pytest.approx(384)
    assert c.bound == "compute"
    # energy: 32768 MACs·0.561 + 65536 reg·0.487 + acc (3072+2048)·(1.94+0.1005·16/16)
    #   + spad (3072+2048)·(0.49+0.025·64) + DRAM (2048+1024)·100
    expected = 32768 * 0.561 + 65536 * 0.487 + 5120 * (1.94 + 0.1005) + 5120 * (0.49 + 1.6) + 3072 * 100
    assert c.energy_pj == pytest.approx(expected)


def test_gemv_is_dram_bound_and_os_adds_up() -> None:
    lay = Layer.gemm("v", M=1, N=64, K=64)
    m = Mapping({"N": 16, "K": 64, "C": 64})
    ws = layer_cost(HwConfig(dim=16, sp_kib=64, acc_kib=16, dataflow="WS"), lay, m)
    # one tile. WS compute: (64/16)·(64/16) weight blocks × (1 row + 16 preload) = 272 cycles; DRAM reads
    # 4096 B of weights + 64 B of input at 16 B/cycle = 260 per tile. Tile = 272 (compute bound), plus the
    # first load (260) and the last store (64 outputs / 16 = 4).
    assert ws.cycles == pytest.approx(272 + 260 + 4)
    os_ = layer_cost(HwConfig(dim=16, sp_kib=64, acc_kib=16, dataflow="OS"), lay, m)
    # OS, not double-buffered: load 260 + max(compute 1·4·(64+32) = 384, ...) + store 4
    assert os_.cycles == pytest.approx(260 + 384 + 4)


def test_conv_tile_footprint_includes_the_halo() -> None:
    lay = Layer.conv("c", H=10, W=10, CI=16, CO=16, KH=3, KW=3)
    m = Mapping({"N": 1, "P": 4, "Q": 4, "C": 16, "K": 16, "R": 3, "S": 3})
    hw = HwConfig(dim=16, sp_kib=8, acc_kib=4)
    # gemmini.h tiled_conv_total_spad_rows: input rows 4·1 + 3 − 1 = 6 (its halo estimate), so A = 1 channel
    # block · 6·6 = 36 rows, B = 1 · 3·3 · 16 = 144 rows: 180, halved for double buffering: 360 ≤ 512 rows
    assert fit(hw, lay, m) is None
    small = HwConfig(dim=16, sp_kib=4, acc_kib=4)  # 256 rows
    why = fit(small, lay, m)
    assert why is not None and "360 scratchpad rows" in why and "has 256" in why


def test_configs_that_cannot_hold_the_tiles_are_rejected_not_clipped() -> None:
    lay = Layer.gemm("g", M=256, N=256, K=256)
    assert "not a multiple of DIM" in (fit(DEFAULT_HW, lay, Mapping({"N": 24, "K": 16, "C": 16})) or "")
    assert "exceeds" in (fit(DEFAULT_HW, lay, Mapping({"N": 512, "K": 16, "C": 16})) or "")
    acc = fit(DEFAULT_HW, lay, Mapping({"N": 256, "K": 256, "C": 16}))
    assert acc is not None and "accumulator" in acc
    assert "array dim" in (HwConfig(dim=256, sp_kib=8192, acc_kib=4096).problem() or "")
    conv = Layer.conv("c", 8, 8, 16, 16, 3, 3)
    assert "rejects OS" in (fit(HwConfig(dataflow="OS"), conv, default_mapping(DEFAULT_HW, conv)) or "")


def test_default_tiling_follows_gemmini_h() -> None:
    # default 16×16 / 256 KiB / 64 KiB, WS (double-buffered): acc tile_I·tile_J ≤ 32 blocks, spad
    # (I·K + K·J) ≤ 512 blocks; sqrt(32)=5 start, grow J then I (acc full), K fills the spad
    assert matmul_auto_tiles(DEFAULT_HW, 512, 512, 512, "WS") == (5, 6, 32)
    # OS (single buffer): 64 acc blocks → 8×8 start, K = min(32, 512/8); nothing grows
    assert matmul_auto_tiles(DEFAULT_HW, 512, 512, 512, "OS") == (8, 8, 32)
    # the default array is BOTH: the baseline takes the better of the two for this GEMM
    m = default_mapping(DEFAULT_HW, Layer.gemm("g", M=512, N=512, K=512))
    assert m.flow in ("WS", "OS") and (m.t("N"), m.t("K")) == ((80, 96) if m.flow == "WS" else (128, 128))


def test_importance_prefers_layers_that_still_improve_and_drops_stalled_ones() -> None:
    s = ImportanceScheduler([LayerState(1, 1e6, ("a",)), LayerState(10, 1e6, ("b",))], patience=2)
    assert s.next_layer() == 0
    s.record(0, 100.0)
    assert s.next_layer() == 1
    s.record(1, 100.0)
    assert s.next_layer() == 1  # same EDP, ten times the occurrences: larger |∂f/∂t|
    s.record(1, 100.0)
    s.record(1, 100.0)  # two units without improvement: dropped
    assert s.layers[1].dropped and s.next_layer() == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_co_exploration_beats_random_search_at_equal_budget(seed: int) -> None:
    layers = [
        Layer.gemm("qkv", 128, 768, 768, weight=2),
        Layer.gemm("v", 1, 1024, 1024),
        Layer.conv("c", 28, 28, 64, 64, 3, 3, padding=1, weight=3),
    ]
    co = co_explore(layers, 3000, seed=seed)
    rnd = random_search(layers, 3000, seed=seed)
    assert co.calls <= 3000 and rnd.calls <= 3000
    assert co.cost.edp < rnd.cost.edp
    _, default = default_point(layers)
    assert co.cost.edp < default.edp / 5
    # the answer is consistent: every tile fits the chosen config, and the cost is recomputable
    assert all(fit(co.hw, lay, m) is None for lay, m in zip(layers, co.mappings, strict=True))
    assert network_cost(co.hw, layers, co.mappings).edp == pytest.approx(co.cost.edp)
    assert sum(co.allocation) > 0
