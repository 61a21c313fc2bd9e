"""Issue 23 items 2 and 3: only configs Gemmini's generator accepts (each rule failing and passing, citing
its source), searches never score an illegal config, the dataflow is a config dimension (BOTH picks per
layer, convs WS only, the ZigZag backend models OS), gemmini.h's auto tiling against hand-computed values,
and the grid-search baseline."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from service.tuning.gemmini import legality as L
from service.tuning.gemmini.gemmini_h import conv_auto_args, default_mapping, matmul_auto_tiles
from service.tuning.gemmini.model import Cost, LayerCostFn, layer_cost, resolve
from service.tuning.gemmini.space import (
    DEFAULT_HW,
    HwConfig,
    Layer,
    Mapping,
    fit,
    generator_violations,
    legal_acc_kibs,
    legal_sp_kibs,
    minimal_hw,
)
from service.tuning.tuners.gemmini import search as S

OK = HwConfig(dim=16, sp_kib=64, acc_kib=16)


def test_the_default_is_gemminis_default_config() -> None:
    # Configs.scala defaultConfig: 16x16, 256 KiB sp (4 banks), 64 KiB acc (2 banks), Dataflow.BOTH, 128-bit bus
    assert (DEFAULT_HW.dim, DEFAULT_HW.sp_kib, DEFAULT_HW.acc_kib) == (16, 256, 64)
    assert (DEFAULT_HW.dataflow, DEFAULT_HW.dma_buswidth, DEFAULT_HW.input_bits, DEFAULT_HW.acc_bits) == (
        "BOTH",
        128,
        8,
        32,
    )
    assert L.violations(DEFAULT_HW) == [] and DEFAULT_HW.problem() is None
    # gemmini_params.h of the default: BANK_ROWS 4096, ACC_ROWS 1024
    assert (DEFAULT_HW.bank_rows, DEFAULT_HW.acc_rows) == (4096, 1024)


# (rule, a config that breaks it, the source the message cites)
FAILING = [
    (L.dim_at_least_2, replace(OK, dim=1), "GemminiConfigs.scala L276"),
    (L.dim_pow2, replace(OK, dim=24), "GemminiConfigs.scala L277"),
    (L.element_widths, replace(OK, acc_bits=20), "GemminiConfigs.scala L326/L328"),
    (L.element_widths, replace(OK, input_bits=12), "GemminiConfigs.scala L326/L328"),
    (L.input_width_in_header, replace(OK, input_bits=64), "GemminiConfigs.scala L285"),
    # 3 KiB / (4 banks · 16 B rows) = 48 rows: whole, but not a power of two
    (L.sp_bank_rows_pow2, replace(OK, sp_kib=3), "GemminiConfigs.scala L273"),
    # a 64x64 array with 8 KiB: 8192 / (4 · 64) = 32 rows per bank, not a multiple of 64
    (L.sp_bank_rows_multiple_of_dim, HwConfig(dim=64, sp_kib=8, acc_kib=512), "GemminiConfigs.scala L274"),
    # 24 KiB / (2 banks · 16 · 4 B) = 384 rows: a multiple of 16, not a power of two
    (L.acc_bank_rows_pow2, replace(OK, acc_kib=24), "LocalAddr.scala L48"),
    # 1 KiB / (2 · 16 · 4 B) = 8 rows per bank < DIM=16
    (L.acc_bank_rows_multiple_of_dim, replace(OK, acc_kib=1), "GemminiConfigs.scala L278"),
    # 16 KiB sp: 1024 rows = 64 tiles, 62 usable < 128 KiB acc: 1024 rows = 64 tiles
    (L.sp_tiles_cover_acc_tiles, replace(OK, sp_kib=16, acc_kib=128), "GemminiConfigs.scala L257"),
    # 128×32-bit rows in 4 banks: 2 KiB per bank row set; 3 KiB is 1.5 rows per bank (Scala would truncate)
    (L.whole_capacity, HwConfig(dim=128, sp_kib=3, acc_kib=256, input_bits=32), "whole"),
]


@pytest.mark.parametrize(
    ("rule", "cfg", "source"), FAILING, ids=[f"{r.__name__}-{i}" for i, (r, *_) in enumerate(FAILING)]
)
def test_each_rule_has_a_failing_and_a_passing_case(rule: object, cfg: HwConfig, source: str) -> None:
    why = rule(cfg)  # type: ignore[operator]
    assert why is not None and source in why
    assert L.violations(cfg)  # the rule's verdict reaches violations (capacity rules wait for a valid shape)
    assert rule(OK) is None and rule(DEFAULT_HW) is None  # type: ignore[operator]
    assert cfg.problem() is not None


def test_generator_dicts_are_checked_too() -> None:
    gen = DEFAULT_HW.generator_config()
    assert generator_violations(gen) == []
    assert "not square" in generator_violations({**gen, "meshColumns": 8})[0]  # GemminiConfigs.scala L275
    assert "L105" in generator_violations({**gen, "weightType": "SInt16"})[0]  # weight width = input width
    assert "L273" in " ".join(generator_violations({**gen, "sp_capacity_kib": 3}))


def test_the_issue_counts_hold_for_what_the_old_space_allowed() -> None:
    # the old space took any whole KiB that split into banks; most of it is not buildable
    old_like = [HwConfig(dim=16, sp_kib=s, acc_kib=64) for s in range(16, 1025, 16)]
    assert sum(1 for h in old_like if L.violations(h)) > len(old_like) // 2
    # every capacity the legal lists offer is buildable with a small enough accumulator
    for dim in (4, 16, 128):
        for sp in legal_sp_kibs(dim):
            assert not L.sp_bank_rows_pow2(HwConfig(dim=dim, sp_kib=sp)) and not L.whole_capacity(
                HwConfig(dim=dim, sp_kib=sp, acc_kib=legal_acc_kibs(dim)[0])
            )
        for acc in legal_acc_kibs(dim):
            assert L.acc_bank_rows_pow2(HwConfig(dim=dim, acc_kib=acc)) is None


def test_random_and_neighbour_configs_are_legal() -> None:
    rng = random.Random(0)
    for _ in range(300):
        hw = S.random_hw(rng)
        assert L.violations(hw) == []
        assert all(L.violations(n) == [] for n in S.hw_neighbours(hw))
    assert all(L.violations(h) == [] for h in S.hw_grid())


def test_minimal_hw_stays_legal() -> None:
    lay = Layer.gemm("g", 128, 128, 128)
    m = Mapping({"N": 32, "K": 32, "C": 64})
    small = minimal_hw(HwConfig(dim=16, sp_kib=4096, acc_kib=1024), [lay], [m])
    assert L.violations(small) == [] and fit(small, lay, m) is None
    assert small.sp_kib < 4096 and small.acc_kib < 1024


def _guarded() -> tuple[list[HwConfig], LayerCostFn]:
    """An objective that records every config it scores (the searches take it as `cost`)."""
    scored: list[HwConfig] = []

    def spy(hw: HwConfig, layer: Layer, m: Mapping) -> Cost:
        scored.append(hw)
        return layer_cost(hw, layer, m)

    return scored, spy


try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    HAVE_HYPOTHESIS = True
except ImportError:  # pragma: no cover
    HAVE_HYPOTHESIS = False


LAYERS = [
    Layer.gemm("qkv", 128, 768, 768, weight=2),
    Layer.gemm("v", 1, 1024, 1024),
    Layer.conv("c", 28, 28, 64, 64, 3, 3, padding=1, weight=3),
]


@pytest.mark.skipif(not HAVE_HYPOTHESIS, reason="hypothesis not installed")
def test_searches_never_score_an_illegal_config() -> None:
    scored, spy = _guarded()

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        seed=st.integers(0, 10_000),
        search=st.sampled_from(["co", "random", "grid"]),
        layers=st.lists(st.sampled_from(LAYERS), min_size=1, max_size=3, unique_by=lambda x: x.name),
        budget=st.integers(60, 400),
    )
    def run(seed: int, search: str, layers: list[Layer], budget: int) -> None:
        scored.clear()
        fn = {"co": S.co_explore, "random": S.random_search, "grid": S.grid_search}[search]
        try:
            r = fn(layers, budget, seed=seed, cost=spy)
        except RuntimeError:
            return  # nothing valid within a tiny budget
        assert scored and all(L.violations(h) == [] for h in scored)
        assert L.violations(r.hw) == [] and r.calls <= budget
        assert all(m.flow in r.hw.flows(lay) for lay, m in zip(layers, r.mappings, strict=True))

    run()


def test_the_evaluator_refuses_an_illegal_config() -> None:
    scored, spy = _guarded()
    ev = S.Evaluator(10, spy)
    lay = Layer.gemm("g", 64, 64, 64)
    assert ev.layer(replace(OK, sp_kib=3), lay, Mapping({"N": 16, "K": 16, "C": 16})) is None
    assert ev.refused == 1 and ev.calls == 0 and scored == []


# -- dataflow -------------------------------------------------------------------------------------------
def test_both_picks_the_better_dataflow_per_layer_and_convs_run_ws() -> None:
    gemv = Layer.gemm("v", M=1, N=64, K=64)
    m = Mapping({"N": 16, "K": 64, "C": 64})
    both = HwConfig(dim=16, sp_kib=64, acc_kib=16, dataflow="BOTH")
    ws = layer_cost(replace(both, dataflow="WS"), gemv, m)
    os_ = layer_cost(replace(both, dataflow="OS"), gemv, m)
    best = layer_cost(both, gemv, m)
    assert best.edp == min(ws.edp, os_.edp) and best.dataflow == ("WS" if ws.edp <= os_.edp else "OS")
    assert resolve(both, gemv, m).flow == best.dataflow
    conv = Layer.conv("c", 10, 10, 16, 16, 3, 3)
    assert both.flows(conv) == ("WS",) and HwConfig(dataflow="OS").flows(conv) == ()
    assert "rejects OS" in (fit(both, conv, Mapping({"N": 1, "P": 4, "Q": 4, "C": 16, "K": 16}, "OS")) or "")
    assert "not built into" in (fit(replace(both, dataflow="WS"), gemv, m.with_flow("OS")) or "")


def test_zigzag_scores_the_chosen_dataflow() -> None:
    from service.tuning.gemmini.backends import get_backend

    zz = get_backend("zigzag", timeout_s=300)
    if zz.available():
        pytest.skip(zz.available() or "")
    lay = Layer.gemm("g", M=128, N=256, K=256)
    m = Mapping({"N": 64, "K": 128, "C": 256})
    ws, os_ = zz.measure(DEFAULT_HW, [lay, lay], [m.with_flow("WS"), m.with_flow("OS")])
    assert (ws.detail["dataflow_modelled"], os_.detail["dataflow_modelled"]) == ("WS", "OS")
    assert ws.cycles != os_.cycles and ws.energy_pj != os_.energy_pj


# -- gemmini.h's auto tiling, against the C logic by hand -------------------------------------------------
def test_tiled_matmul_auto_by_hand() -> None:
    # default WS: db partition 16384/2/2 = 4096 rows = 256 mats; db acc 512/16 = 32 mats → max_ij 5, max_k 51.
    # 128×768×768 (blocks 8, 48, 48): start (5, 5, 48); spad(5,6,48) = (240+288)·16 = 8448 > 8192 → no J,
    # I likewise, K is at its 48 blocks: stays (5, 5, 48)
    assert matmul_auto_tiles(DEFAULT_HW, 128, 768, 768, "WS") == (5, 5, 48)
    # GEMV 1×4096×4096, WS: I is 1 block; start (1, 5, 51). Each round J+1 then K+1 while tk·(1+tj) ≤ 512
    # (spad rows/16): (6,52) (7,53) (8,54), then J=9 needs 54·10 = 540 → only K: 55·9 = 495, 56·9 = 504, 57·9 > 512
    assert matmul_auto_tiles(DEFAULT_HW, 1, 4096, 4096, "WS") == (1, 8, 56)
    # OS on 512³: single buffer, acc 1024/16 = 64 mats → 8×8, K = min(32, 512/8 = 64); acc full at 8×8
    assert matmul_auto_tiles(DEFAULT_HW, 512, 512, 512, "OS") == (8, 8, 32)


def test_tiled_conv_auto_by_hand() -> None:
    # 3×3, 8×8 output, 16→16 channels on the default: whole layer fits (A = 1·10·10 = 100 rows,
    # B = 1·3·3·16 = 144, C = 64 ≤ 512): nothing shrinks
    small = Layer.conv("s", 10, 10, 16, 16, 3, 3)
    assert conv_auto_args(DEFAULT_HW, small) == [1, 8, 8, 16, 3, 3, 16]
    # ResNet 1×1, 28×28, 128→512: C rows = 32·28·28 = 25088 > 512 (half the accumulator). Shrink the largest
    # (the first of equals): ochs 512 → 496 … → 128, then ochs/kchs alternate down by DIM to 16, then porows
    # and pocols alternate 28 → 27 …; at (23, 23) C = 529 > 512, porows → 22: 22·23 = 506 fits. pocols 24
    # would not (528). Growing each factor by one: only kchs can (A = ⌈kchs/16⌉·22·23 rows ≤ 8192), up to 128
    lay = Layer.conv("r", 28, 28, 128, 512, 1, 1)
    args = conv_auto_args(DEFAULT_HW, lay)
    from service.tuning.gemmini.space import conv_rows

    sp, acc = conv_rows(16, lay, *args)
    assert sp <= 8192 and acc <= 512
    full = [1, 28, 28, 512, 1, 1, 128]
    for i in range(7):
        bigger = list(args)
        bigger[i] += 1
        if bigger[i] <= full[i]:
            s2, a2 = conv_rows(16, lay, *bigger)
            assert s2 > 8192 or a2 > 512
    assert args == [1, 22, 23, 16, 1, 1, 128]
    # the baseline mapping is exactly that, run WS
    m = default_mapping(DEFAULT_HW, lay)
    assert m.flow == "WS" and [m.t(x) for x in ("N", "P", "Q", "K", "R", "S", "C")] == args


# -- grid search -------------------------------------------------------------------------------------------
def test_grid_search_walks_the_grid_within_budget() -> None:
    grid = S.hw_grid()
    assert len(grid) == len(set(grid)) > 100
    lay = [Layer.gemm("g", 256, 256, 256)]
    a, b = S.grid_search(lay, 200, seed=0), S.grid_search(lay, 200, seed=0)
    assert a.calls <= 200 and a.cost.edp == b.cost.edp  # deterministic per seed
    assert all(h in set(grid) for h in a.explored)
    # the default tiling at every visited point: the answer's mapping is gemmini.h's own
    assert a.mappings[0].tiles == default_mapping(a.hw, lay[0]).tiles
    full = S.grid_search(lay, len(grid) + 10, seed=3)
    assert len(full.explored) == len(grid)  # a budget that covers the grid visits all of it


def test_limits_restrict_the_dataflow() -> None:
    ws = replace(DEFAULT_HW, dataflow="WS")
    r = S.co_explore(LAYERS[:1], 400, seed=0, start_hw=ws, limits=S.Limits(dataflows=("WS",)))
    assert r.hw.dataflow == "WS" and all(m.flow == "WS" for m in r.mappings)


def test_the_kind_refuses_configs_gemmini_cannot_generate() -> None:
    from service.tuning.kinds import KINDS

    kind = KINDS.get("gemmini")
    good = {
        "format": "gemmini-cotune",
        "layer": "gemm M=64 N=64 K=64",
        "backend": "zigzag",
        "hw": DEFAULT_HW.to_dict(),
        "mapping": {"N": 64, "K": 64, "C": 64},
        "op": "gemm",
        "dataflow": "OS",
        "measured_cycles": 1000.0,
    }
    assert kind.check_config(good) is None
    for field, value, loc in (
        ("sp_kib", 3, ("hw", "sp_kib")),  # GemminiConfigs.scala L273
        ("acc_kib", 24, ("hw", "acc_kib")),  # LocalAddr.scala L48
        ("dim", 24, ("hw", "dim")),  # L277
        ("input_bits", 64, ("hw", "input_bits")),  # L285
        ("dataflow", "IS", ("hw", "dataflow")),
    ):
        problem = kind.check_config({**good, "hw": {**DEFAULT_HW.to_dict(), field: value}})
        assert problem is not None and problem.loc == loc, (field, problem)
    ws_only = {**good, "hw": {**DEFAULT_HW.to_dict(), "dataflow": "WS"}}
    problem = kind.check_config(ws_only)
    assert problem is not None and problem.loc == ("dataflow",)
    problem = kind.check_config({**good, "hw": {**DEFAULT_HW.to_dict(), "bogus": 1}})
    assert problem is not None and problem.loc == ("hw",)
