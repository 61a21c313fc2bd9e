"""One objective (issue 36 item 3): the model shortlists, the reporting backend picks. ZigZag runs for real."""

from __future__ import annotations

import pytest

from service.tuning.gemmini.backends import get_backend
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer
from service.tuning.tuners.gemmini.backend_pick import measure_shortlist, network_edp
from service.tuning.tuners.gemmini.best_flow import flow_options, measured_best
from service.tuning.tuners.gemmini.search import co_explore


def test_the_shortlist_is_the_models_best_explored_configs_with_their_mappings() -> None:
    layers = [Layer.gemm("qkv", 128, 2304, 768)]
    r = co_explore(layers, 400, seed=0)
    short = r.shortlist(layers, 4)
    assert 1 < len(short) <= 4 and short[0][0] == r.hw and short[0][1] == r.mappings  # the model's pick first
    model_edps = [r.explored[hw].edp for hw, _ in short]
    assert model_edps == sorted(model_edps)
    rest = [cost.edp for hw, cost in r.explored.items() if hw not in dict(short)]
    assert all(model_edps[-1] <= edp for edp in rest)  # nothing left out beats what was shortlisted
    # the search's start (the default) is kept even where the model ranks it lower: the backend may prefer it
    kept = r.shortlist(layers, 1, (DEFAULT_HW,))
    assert [hw for hw, _ in kept] == [r.hw, DEFAULT_HW] and DEFAULT_HW in r.explored


def test_the_winner_is_the_lowest_edp_zigzag_measures_among_the_shortlist() -> None:
    zz = get_backend("zigzag", timeout_s=300)
    why = zz.available()
    if why:
        pytest.skip(why)
    layers = [Layer.gemm("qkv", 128, 2304, 768), Layer.conv("c1x1", 56, 56, 64, 256, 1, 1, weight=3)]
    r = co_explore(layers, 600, seed=0)
    ranked = measure_shortlist(zz, layers, r.shortlist(layers, 4))
    measured = [m.measured_edp for m in ranked]
    assert None not in measured and measured == sorted(measured)  # type: ignore[type-var]
    own = next(m for m in ranked if m.hw == r.hw)  # the model's own pick is measured too
    assert ranked[0].measured_edp is not None and own.measured_edp is not None
    assert ranked[0].measured_edp <= own.measured_edp
    # each candidate ran every layer in its fastest dataflow, exactly as measured_best measures one config
    maps, direct = measured_best(zz, own.hw, layers, flow_options(own.hw, layers, r.mappings))
    assert own.mappings == maps and network_edp(layers, direct) == own.measured_edp


def test_the_grid_covers_every_legal_capacity_including_the_defaults() -> None:
    """Issue 36 item 4: the grid baseline is the full space (it skipped every other capacity, the default's too)."""
    from service.tuning.gemmini.area import default_budget
    from service.tuning.gemmini.space import legal_acc_kibs, legal_sp_kibs
    from service.tuning.tuners.gemmini.search import Limits, hw_grid

    equal_area = hw_grid(Limits(buses=(128,), accept=default_budget().fits))
    assert DEFAULT_HW in equal_area
    full = hw_grid(Limits(buses=(128,), dataflows=("WS",)))
    assert {(h.dim, h.sp_kib, h.acc_kib) for h in full if h.dim == 16} == {
        (16, sp, acc)
        for sp in legal_sp_kibs(16)
        for acc in legal_acc_kibs(16)
        if HwConfig(16, sp, acc, "WS").problem() is None
    }
