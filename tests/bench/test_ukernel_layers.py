"""bench/ukernel_layers.py without tuning or timing anything: its options, the M it measures, the batch_matmul
jobs it would submit, its contenders at a T (no uKernels: a table that routes to numpy), the summary and the
markdown table it renders from synthetic results."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.bench.modules import load

layers = load("ukernel_layers")


def test_defaults_cover_every_layer_at_full_range() -> None:
    args = layers.parse_args([])
    assert args.layers == list(layers.ALL_LAYERS)
    assert (args.s_max, args.rounds, args.stride, args.settle, args.max_ukernels) == (None, 5, 1, True, 8)
    assert layers.layer_s_max(layers.DENSE["ffn-up"], args) == 512
    assert layers.layer_s_max(layers.DENSE["gpt-fc"], args) == 8


def test_quick_and_explicit_options() -> None:
    quick = layers.parse_args(["--quick"])
    assert (quick.s_max, quick.rounds, quick.min_sample_ms) == (32, 3, 2.0)
    assert layers.layer_s_max(layers.DENSE["ffn-up"], quick) == 32
    assert layers.layer_s_max(layers.DENSE["gpt-lmhead"], quick) == 8  # a cap, not a scale
    explicit = layers.parse_args(["--quick", "--rounds", "7", "--layers", "odd,attn-qk", "--s-max-scale", "0.5"])
    assert explicit.rounds == 7 and explicit.layers == ["odd", "attn-qk"]
    assert layers.layer_s_max(layers.DENSE["odd"], explicit) == 32
    assert layers.layer_s_max(layers.DENSE["odd"], layers.parse_args(["--s-max-scale", "0.5"])) == 100


@pytest.mark.parametrize("argv", [["--layers", "nope"], ["--rounds", "0"], ["--stride", "0"], ["--s-max", "0"]])
def test_bad_options_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        layers.parse_args(argv)


def test_measured_shapes_and_hot_shapes() -> None:
    assert layers.measured_shapes(8, 64, 1) == list(range(1, 9))
    assert layers.measured_shapes(100, 4, 32) == [1, 2, 3, 4, 36, 68, 100]
    assert layers.measured_shapes(512, 64, 1) == list(range(1, 513))
    assert layers.hot_shapes(512) == [512, 511, 510, 509]
    assert layers.hot_shapes(2) == [2, 1]


def _row(S: int, ours: float, numpy_: float, torch_: float, route: str = "uKernel") -> dict[str, Any]:
    vendor = min(numpy_, torch_)
    return {"S": S, "ours_s": ours, "numpy_s": numpy_, "torch_s": torch_, "vendor_s": vendor,
            "faster_vendor": "numpy" if numpy_ <= torch_ else "torch", "ratio": vendor / ours,
            "ratio_numpy": numpy_ / ours, "ratio_torch": torch_ / ours, "route": route, "program": [],
            "retimed": 0, "rounds": 5, "max_abs_err_vs_torch": 1e-5 * S, "numpy_max_abs_err_vs_torch": 2e-5,
            "max_abs_expected": 30.0}  # fmt: skip


def _results() -> dict[str, Any]:
    rows = [_row(1, 2.0, 1.0, 3.0, "numpy"), _row(2, 1.0, 2.0, 4.0), _row(3, 1.0, 4.0, 2.0)]
    summary = layers.summarize(rows, tuning_s=12.5)
    dense = {"name": "odd", "what": "dims not multiples of 8, + bias", "N": 1000, "K": 777, "s_max": 3,
             "bias": True, "activation": "none", "rows": rows, "summary": summary,
             "dim": "M", "shape": layers.DENSE["odd"].shape_text(3),
             "tuning": {"ukernels": ["mt4_nt96_kt3"], "vendor_intervals": [[1, 1]], "job_seconds": 12.0},
             "overhead": {"1": {"overhead_s": 2e-6, "selection_ns": 300.0},
                          "3": {"overhead_s": 5e-6, "selection_ns": 250.0}}}  # fmt: skip
    bmm_rows = [_row(1, 2.0, 1.0, 3.0, "numpy"), _row(2, 1.0, 1.5, 1.2)]
    qk = layers.BMM["attn-qk"]
    bmm = {**dataclasses.asdict(qk), "dim": "T", "shape": qk.shape_text(2), "s_max": 2,
           "rows": bmm_rows, "summary": layers.summarize(bmm_rows, tuning_s=50.0),
           "tuning": {"ukernels": ["bmm4x32x4"], "vendor_intervals": [[1, 1]], "job_seconds": 49.0},
           "overhead": {"1": {"overhead_s": 1e-6, "selection_ns": 400.0},
                        "2": {"overhead_s": 3e-6, "selection_ns": 410.0}}}  # fmt: skip
    conv_rows = [_row(1, 1.0, 2.0, 1.1), _row(2, 2.0, 4.0, 1.9)]
    c1 = layers.CONV["conv1x1"]
    conv = {**dataclasses.asdict(c1), "dim": "N", "shape": c1.shape_text(2), "s_max": 2,
            "rows": conv_rows, "summary": layers.summarize(conv_rows, tuning_s=20.0),
            "tuning": {"ukernels": ["mt6_nt64_kt4"], "vendor_intervals": [], "job_seconds": 19.0},
            "overhead": {"1": {"overhead_s": 9e-6, "selection_ns": 350.0},
                         "2": {"overhead_s": 1.4e-4, "selection_ns": 360.0}}}  # fmt: skip
    machine = {"cpu_model": "Synthetic CPU", "cores": 2, "loadavg_start": [0.1, 0.2, 0.3],
               "loadavg_end": [0.4, 0.2, 0.3], "other_load": 0.01, "tvm_threads": 2,
               "blas": "openblas 0.3 (Haswell kernel, 2 threads)", "torch": "2.13.0+cpu (mkl)", "tvm": "0.27",
               "stripped_env": {"OPENBLAS_CORETYPE": "Haswell"}}  # fmt: skip
    return {"command": "python bench/ukernel_layers.py --quick", "rounds": 5, "layers": [dense, bmm, conv],
            "machine": machine}  # fmt: skip


def test_summary_takes_the_faster_vendor_at_each_shape() -> None:
    s = _results()["layers"][0]["summary"]
    # ratios vs the faster vendor: 1/2, 2/1, 2/1
    assert s["geomean"] == pytest.approx((0.5 * 2 * 2) ** (1 / 3))
    assert (s["worst"], s["worst_S"], s["worst_route"]) == (0.5, 1, "numpy")
    assert s["below_0_95"] == [1] and s["torch_faster_S"] == 1 and s["vendor_routed_S"] == 1
    assert s["torch_routed_S"] == 0
    assert s["max_abs_err_vs_torch"] == pytest.approx(3e-5)
    assert s["goals"] == {"geomean": False, "worst": False, "tuning_s": True}


def test_markdown_table() -> None:
    md = layers.markdown(_results())
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| layer |"))
    columns = lines[header].count("|")
    table = lines[header : header + 5]
    assert all(line.count("|") == columns for line in table)  # header, rule, dense, batch_matmul, conv
    assert "| odd |" in table[2] and "**1.26×**" in table[2] and "0.50× (M=1, numpy)" in table[2]
    assert "N=1000 K=777, M=1..3" in table[2] and "2.0–5.0 (300)" in table[2] and "✗ ✗ ✓" in table[2]
    assert "| attn-qk |" in table[3] and "B=12 K=64, T in M,N, T=1..2" in table[3] and "| 1,2 |" in table[3]
    assert "0.50× (T=1, numpy)" in table[3] and "1.0–3.0 (410)" in table[3] and "✗ ✗ ✗" in table[3]
    assert "| conv1x1 |" in table[4] and "H=W=56, N=1..2 (M up to 6272)" in table[4]
    assert "0.95× (N=2, uKernel)" in table[4] and "9.0–140.0 (360)" in table[4]
    assert "- `attn-qk`: uKernels bmm4x32x4; 1 of 2 measured T routed to a vendor library by the table, 0 of" in md
    assert "Synthetic CPU, 2 cores" in md and "OPENBLAS_CORETYPE=Haswell" in md and "busy machine" not in md


def test_the_layer_sets() -> None:
    assert set(layers.BMM) == {"attn-qk", "attn-av"} and set(layers.CONV) == {"conv3x3", "conv1x1"}
    assert list(layers.COVERED) == [*layers.DENSE, *layers.BMM, *layers.CONV]
    assert layers.BMM["attn-qk"].full_shape(7) == {"B": 12, "M": 7, "N": 7, "K": 64}
    assert layers.BMM["attn-av"].full_shape(7) == {"B": 12, "M": 7, "N": 64, "K": 7}
    assert layers.intervals([5, 1, 2, 3, 7, 8]) == [[1, 3], [5, 5], [7, 8]] and layers.intervals([]) == []


@pytest.mark.parametrize("name", ["attn-qk", "attn-av"])
def test_the_bmm_jobs_are_what_the_service_admits_and_plans(name: str) -> None:
    from service.models import Budget
    from service.tuning.admission import check_job
    from service.tuning.hardware import host_target
    from service.tuning.kinds import KINDS

    layer = layers.BMM[name]
    workload, distribution = layers.bmm_workload(layer, 512)
    support = distribution.support()
    assert len(support) == 512 and all(len(set(shape.values())) == 1 for shape, _ in support)  # T in both dims
    assert sorted(workload.symbolic) == sorted(layer.follows_t) and workload.dims["B"] == 12
    budget = Budget(trials=layers.BUDGET_UKERNELS)
    assert check_job("ukernel", workload, distribution, host_target(), budget) is None
    (unit,) = KINDS.get("ukernel").plan(workload, distribution, budget).units
    assert unit.trials == layers.BUDGET_UKERNELS


def _vendor_dispatcher(layer: Any, s_max: int) -> Any:
    """A BmmDispatcher whose table routes every T = 1..s_max to numpy (no uKernels, so no TVM needed)."""
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.dispatch import VENDOR
    from service.tuning.tuners.ukernel.bmm_tuner import plan_cells

    workload, distribution = layers.bmm_workload(layer, s_max)
    empty, groups = plan_cells(layer.follows_t, distribution.support())
    cells = [VENDOR if i in groups else None for i in range(len(empty.cells))]
    table = type(empty)(empty.dims, empty.starts, empty.his, tuple(cells))
    return BmmDispatcher(table, {}, {d: int(v) for d, v in workload.dims.items()})


@pytest.mark.parametrize("name", ["attn-qk", "attn-av"])
def test_bmm_contenders_compute_the_same_product(name: str) -> None:
    import numpy as np

    torch = pytest.importorskip("torch")
    layer = layers.BMM[name]
    d = _vendor_dispatcher(layer, 9)
    bench = layer.bench(torch, d)
    for t in (1, 5, 9):
        calls = bench.at(t)
        want = calls.torch().numpy()
        assert want.shape == (12, t, t if name == "attn-qk" else 64)
        np.testing.assert_allclose(calls.ours(), want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(calls.numpy(), want, rtol=1e-5, atol=1e-4)
        assert (calls.route, calls.program) == ("numpy", [])
    assert bench.at(10).route == "miss"  # past the tuned box
    probe = bench.probe(5)
    assert probe.pieces == 0 and probe.inner == "numpy's own call"
    assert 0 < layers.bmm_selection_s(d, *layers.bmm_operands(torch, layer, 5, 0)[:2], calls=50, rounds=1) < 1e-3


def test_the_conv_jobs_are_what_the_service_admits_and_plans() -> None:
    """N = 1..32 at 56×56 reaches M = 100,352 > MAX_S: admitted (the dense programs are tuned to MAX_S and extend,
    the routes are timed at the support's own M), up to MAX_CONV_M."""
    from service.models import Budget
    from service.tuning.admission import check_job
    from service.tuning.hardware import host_target
    from service.tuning.kinds import KINDS

    budget = Budget(trials=layers.BUDGET_UKERNELS, max_shapes=layers.BUDGET_HOT_SHAPES)
    for name, (k, ci, pad) in {"conv3x3": (3, 64, 1), "conv1x1": (1, 256, 0)}.items():
        layer = layers.CONV[name]
        workload = layer.workload()
        assert workload.dims == {"H": 56, "W": 56, "CI": ci, "CO": 64, "KH": k, "KW": k}
        assert workload.symbolic == ["N"] and workload.attrs == {"stride": 1, "padding": pad}
        assert layer.out_hw == 56 and layer.rows(32) == 32 * 3136 and layer.s_max == 32
        assert check_job("ukernel", workload, layer.distribution(32), host_target(), budget) is None
        too_big = check_job("ukernel", workload, layer.distribution(84), host_target(), budget)  # M = 263424
        assert too_big is not None and "M=263424" in too_big.message and too_big.loc == ("distribution",)
        plan = KINDS.get("ukernel").plan(workload, layer.distribution(32), budget)
        (unit,) = plan.units
        assert unit.trials == layers.BUDGET_UKERNELS and len(plan.shapes) == layers.BUDGET_HOT_SHAPES
        assert "N=1..32 (M up to 100352)" in layer.shape_text(32)


@pytest.mark.parametrize("name", ["conv3x3", "conv1x1"])
def test_conv_contenders_compute_the_same_conv(name: str) -> None:
    """A ConvDispatcher whose table routes every M to numpy (no uKernels, so no TVM), numpy's conv (the SDK
    fallback) and PyTorch's on the channels_last view, all against a float64 conv."""
    import numpy as np

    torch = pytest.importorskip("torch")
    from kernelfleet.conv_dispatcher import ConvDispatcher
    from kernelfleet.dispatch import DispatchTable, Interval
    from kernelfleet.dispatcher import Dispatcher
    from service.tuning.tuners.ukernel.conv import geometry

    layer = layers.CONV[name]
    table = DispatchTable((Interval(1, layer.rows(1), None),), {})
    g = geometry(layer.workload())
    d = ConvDispatcher(Dispatcher(table, {}, N=layer.CO, K=g.K), g)
    with torch.inference_mode():
        bench = layer.bench(torch, d)
        calls = bench.at(1)
        want = calls.torch().numpy()
        assert want.shape == (1, 56, 56, 64)
        x, xt = layers.conv_operands(torch, layer, 1, seed=1)  # what at(1) ran on: the same arrays
        assert xt.is_contiguous(memory_format=torch.channels_last) and xt.shape == (1, layer.CI, 56, 56)
        f = np.random.default_rng(0).standard_normal((layer.k, layer.k, layer.CI, layer.CO), dtype=np.float32)
        exact = layers.conv_numpy(layer)(x.astype(np.float64), f.astype(np.float64))
        for got in (calls.ours(), calls.numpy(), want):
            np.testing.assert_allclose(got, exact, rtol=1e-4, atol=1e-3)
        assert (calls.route, calls.program) == ("numpy", [])
        probe = bench.probe(1)
        assert probe.pieces == 0 and probe.inner.startswith("numpy's GEMM")
        assert probe.call().shape == (1, 56, 56, 64) and 0 < probe.selection_s() < 1e-3
