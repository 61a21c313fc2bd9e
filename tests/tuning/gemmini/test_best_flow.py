"""Baselines and winners at their best dataflow as the reporting backend measures them (issue 36 item 1): ZigZag
runs for real; each layer of a BOTH array ends in the flow ZigZag times fastest, whatever the model preferred."""

from __future__ import annotations

import pytest

from service.tuning.gemmini.backends import get_backend
from service.tuning.gemmini.gemmini_h import default_point
from service.tuning.gemmini.space import DEFAULT_HW, HwConfig, Layer
from service.tuning.tuners.gemmini.best_flow import default_options, flow_options, measured_best


def test_the_default_runs_each_layer_in_the_flow_zigzag_measures_fastest() -> None:
    zz = get_backend("zigzag", timeout_s=300)
    why = zz.available()
    if why:
        pytest.skip(why)
    layers = [Layer.gemm("qkv", 128, 2304, 768), Layer.gemm("small", 64, 64, 64)]
    options = default_options(DEFAULT_HW, layers)  # gemmini.h's auto tiling per dataflow, where it fits
    assert all({m.flow for m in opts} <= {"WS", "OS"} and opts for opts in options)
    chosen_maps, chosen = measured_best(zz, DEFAULT_HW, layers, options)
    for i, opts in enumerate(options):
        each = [zz.measure(DEFAULT_HW, [layers[i]], [m])[0].cycles for m in opts]
        assert chosen[i].cycles == min(each) and chosen_maps[i] in opts  # the fastest of its own options
    model_pick, _ = default_point(layers)  # the analytical model's pick, which ZigZag may disagree with
    assert [zz.measure(DEFAULT_HW, [lay], [m])[0].cycles >= c.cycles for lay, m, c in
            zip(layers, model_pick, chosen, strict=True)] == [True, True]  # fmt: skip


def test_a_winner_on_one_dataflow_is_measured_once_in_it() -> None:
    zz = get_backend("zigzag", timeout_s=300)
    why = zz.available()
    if why:
        pytest.skip(why)
    layers = [Layer.gemm("small", 64, 64, 64)]
    ws = HwConfig(dataflow="WS")
    maps, _ = default_point(layers, ws)
    options = flow_options(ws, layers, maps)
    assert [[m.flow for m in opts] for opts in options] == [["WS"]]
    chosen_maps, chosen = measured_best(zz, ws, layers, options)
    assert chosen_maps[0].flow == "WS" and chosen[0].cycles > 0
