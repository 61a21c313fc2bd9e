"""conv2d NHWC uKernels as an implicit GEMM (issue 22 item 3): the dense uKernels over M = N·OH·OW, run by the SDK's
ConvDispatcher, against PyTorch's conv2d for 3×3 (pad 1), 3×3 stride 2 and 1×1 layers at random (N, H, W) in and
past the tuned box; the im2col mapping and the numpy fallback alone."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelfleet import vendor
from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry, filter_matrix
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.dispatcher import Dispatcher
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.tuners.ukernel.bounds import MAX_S
from service.tuning.tuners.ukernel.conv import (
    check_tuples,
    gemm_workload,
    route_conv,
    rows,
    rows_support,
    tune_conv_range,
    verify_conv,
)
from service.tuning.tuners.ukernel.route_stats import PointTiming
from service.tuning.tuners.ukernel.tuner import RangeOutcome

CI, CO = 3, 8
LAYERS = {  # name → (KH, KW, stride, padding)
    "3x3_pad1": (3, 3, 1, 1),
    "3x3_stride2": (3, 3, 2, 0),
    "1x1": (1, 1, 1, 0),
}
BOX = {"N": (1, 2), "H": (3, 8), "W": (3, 8)}  # the planned box: every corner tuple, and sizes in between


def _workload(name: str) -> WorkloadSpec:
    kh, kw, stride, padding = LAYERS[name]
    return WorkloadSpec(
        op="conv2d",
        dims={"CI": CI, "CO": CO, "KH": kh, "KW": kw},
        symbolic=["N", "H", "W"],
        attrs={"stride": stride, "padding": padding},
    )


def _torch_conv(x: np.ndarray, f: np.ndarray, stride: int, padding: int) -> np.ndarray:
    """PyTorch's NCHW conv2d on the NHWC input and HWIO filter, back to NHWC, in float64."""
    xt = torch.from_numpy(x.astype(np.float64)).permute(0, 3, 1, 2)
    ft = torch.from_numpy(f.astype(np.float64)).permute(3, 2, 0, 1)
    return F.conv2d(xt, ft, stride=stride, padding=padding).permute(0, 2, 3, 1).numpy()


def _check(d: ConvDispatcher, name: str, n: int, h: int, w: int) -> None:
    kh, kw, stride, padding = LAYERS[name]
    rng = np.random.default_rng(n * 10000 + h * 100 + w)
    x = rng.standard_normal((n, h, w, CI), dtype=np.float32)
    f = rng.standard_normal((kh, kw, CI, CO), dtype=np.float32)
    want = _torch_conv(x, f, stride, padding)
    got = d(x, f)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(kh * kw * CI))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ConvDispatcher]:
    """One tuning per layer over the box, every M forced onto uKernels (tiny sizes: numpy would win)."""
    out = {}
    for name in LAYERS:
        support = [
            ({"N": n, "H": h, "W": w}, 1.0)
            for n in range(BOX["N"][0], BOX["N"][1] + 1)
            for h in range(BOX["H"][0], BOX["H"][1] + 1)
            for w in (BOX["W"][0], BOX["W"][1])
        ]
        outcome = tune_conv_range(
            _workload(name),
            support,
            host_target(),
            tmp_path_factory.mktemp(name),
            max_ukernels=2,
            validate=[{"N": 2, "H": 8, "W": 8}],
            vendor_routes=False,
        )
        out[name] = outcome.dispatcher()
    return out


def _tuples(beyond: int) -> st.SearchStrategy[tuple[str, int, int, int]]:
    lo_n, hi_n = BOX["N"]
    lo, hi = BOX["H"]
    return st.tuples(
        st.sampled_from(sorted(LAYERS)),
        st.integers(lo_n, hi_n + beyond),
        st.integers(lo, hi + 3 * beyond),
        st.integers(lo, hi + 3 * beyond),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_tuples(beyond=0))
def test_in_the_box_the_ukernels_compute_the_conv(
    tuned: dict[str, ConvDispatcher], t: tuple[str, int, int, int]
) -> None:
    name, n, h, w = t
    d = tuned[name]
    assert d.program({"N": n, "H": h, "W": w})  # a uKernel program, not numpy
    _check(d, name, n, h, w)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_tuples(beyond=4))
def test_past_the_box_the_table_extends(tuned: dict[str, ConvDispatcher], t: tuple[str, int, int, int]) -> None:
    name, n, h, w = t
    _check(tuned[name], name, n, h, w)  # M past s_max runs the table's extended last interval


def test_the_dense_table_is_used_and_counts_by_m(tuned: dict[str, ConvDispatcher]) -> None:
    d = tuned["3x3_stride2"]
    assert not d.fallback and d.rows({"N": 2, "H": 8, "W": 7}) == 2 * 3 * 3
    d.usage(reset=True)
    _check(d, "3x3_stride2", 2, 8, 7)
    _check(d, "3x3_stride2", 2, 7, 8)  # the same M: the same program
    usage = d.usage()
    assert list(usage) == [18] and usage[18].calls == 2 and usage[18].fallbacks == 0
    with pytest.raises(ValueError, match="filter"):
        d(np.zeros((1, 8, 8, CI), np.float32), np.zeros((5, 5, CI, CO), np.float32))
    with pytest.raises(ValueError, match="NHWC"):
        d(np.zeros((1, CI, 8, 8), np.float32), np.zeros((3, 3, CI, CO), np.float32))
    with pytest.raises(ValueError, match="empty"):
        d(np.zeros((1, 2, 8, CI), np.float32), np.zeros((3, 3, CI, CO), np.float32))


def test_the_induced_distribution_over_m() -> None:
    wl = _workload("3x3_stride2")  # OH = (H - 3) // 2 + 1
    support = [({"N": 1, "H": 7, "W": 7}, 1.0), ({"N": 1, "H": 8, "W": 8}, 2.0), ({"N": 2, "H": 5, "W": 5}, 0.5)]
    assert rows_support(wl, support) == [({"M": 8}, 0.5), ({"M": 9}, 3.0)]  # 7 and 8 give the same OH
    assert gemm_workload(wl).dims == {"N": CO, "K": 3 * 3 * CI} and gemm_workload(wl).symbolic == ["M"]
    static_n = WorkloadSpec(op="conv2d", dims={"N": 4, "H": 9, "CI": 2, "CO": 2, "KH": 1, "KW": 1}, symbolic=["W"])
    assert rows(static_n, {"W": 5}) == 4 * 9 * 5
    tuples = check_tuples(wl, support)
    assert {"N": 1, "H": 5, "W": 8} in tuples and {"N": 2, "H": 8, "W": 8} in tuples  # the box's corners
    assert {"N": 2, "H": 13, "W": 8} in tuples  # and past it


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("kernel", [(1, 1), (3, 3), (2, 3)])
def test_the_numpy_fallback_is_the_conv(stride: int, padding: int, kernel: tuple[int, int]) -> None:
    """No table: im2col and numpy, read off the filter, every call a miss."""
    d = ConvDispatcher(Dispatcher(None, {}, N=None, K=None), ConvGeometry(stride=stride, padding=padding))
    rng = np.random.default_rng(stride * 7 + padding)
    x = rng.standard_normal((2, 7, 6, CI), dtype=np.float32)
    f = rng.standard_normal((*kernel, CI, CO), dtype=np.float32)
    np.testing.assert_allclose(d(x, f), _torch_conv(x, f, stride, padding), rtol=1e-4, atol=1e-4)
    assert d.fallback and sum(u.fallbacks for u in d.usage().values()) == 1
    assert filter_matrix(f).shape == (CO, kernel[0] * kernel[1] * CI)


def test_geometry_wire_form_and_static_dims() -> None:
    g = ConvGeometry(stride=2, padding=1, filter=(3, 3, CI, CO), static={"N": 1})
    assert ConvGeometry.from_dict(g.to_dict()) == g and g.K == 9 * CI
    d = ConvDispatcher(Dispatcher(None, {}, N=None, K=None), g)
    with pytest.raises(ValueError, match="N=1"):
        d(np.zeros((2, 8, 8, CI), np.float32), np.zeros((3, 3, CI, CO), np.float32))
    with pytest.raises(ValueError, match="static"):
        ConvGeometry(static={"CI": 3})


def test_a_wrong_conv_fails_verification(tuned: dict[str, ConvDispatcher]) -> None:
    wl = _workload("3x3_pad1")
    wrong = ConvDispatcher(tuned["3x3_pad1"].dense, ConvGeometry(stride=1, padding=0, filter=(3, 3, CI, CO)))
    padded_tuple: Mapping[str, int] = {"N": 1, "H": 5, "W": 5}
    assert verify_conv(tuned["3x3_pad1"], wl, [padded_tuple]) is None
    assert verify_conv(wrong, wl, [padded_tuple]) is not None  # the output's shape differs: caught


def test_tune_conv_range_writes_its_libraries(tmp_path: Path) -> None:
    wl = WorkloadSpec(op="conv2d", dims={"N": 1, "CI": 2, "CO": 4, "KH": 1, "KW": 1}, symbolic=["H", "W"])
    support = [({"H": h, "W": w}, 1.0) for h in (1, 4) for w in (2, 6)]
    out = tune_conv_range(wl, support, host_target(), tmp_path, max_ukernels=1, vendor_routes=False)
    assert out.dense.table.s_max == 24 and all(a.path.exists() for a in out.dense.artifacts.values())
    d = out.dispatcher()
    x = np.random.default_rng(0).standard_normal((1, 5, 9, 2), dtype=np.float32)
    f = np.random.default_rng(1).standard_normal((1, 1, 2, 4), dtype=np.float32)
    np.testing.assert_allclose(d(x, f), _torch_conv(x, f, 1, 0), rtol=1e-4, atol=1e-4)


def test_routes_send_each_m_to_the_fastest_conv_past_max_s_too(tmp_path: Path) -> None:
    """M = N·1024 reaches 8192, past MAX_S: the dense programs are tuned to MAX_S and extend; each M the routes
    were timed at goes to whichever was fastest there (the uKernels, numpy's im2col GEMM or PyTorch's conv2d),
    and the conv is right on every route."""
    wl = WorkloadSpec(op="conv2d", dims={"H": 32, "W": 32, "CI": 16, "CO": 16, "KH": 3, "KW": 3}, symbolic=["N"])
    wl = wl.model_copy(update={"attrs": {"stride": 1, "padding": 1}})
    support = [({"N": n}, 1.0) for n in range(1, 9)]
    out = tune_conv_range(wl, support, host_target(), tmp_path, max_ukernels=2, vendor_routes=True)
    assert out.dense.validation["conv_routes"]["spans"] is not None and len(out.dense.predicted_s) == MAX_S
    timed = {int(m): t for m, t in out.dense.validation["conv_routes"]["timed_s"].items()}
    assert sorted(timed) == [1024 * n for n in range(1, 9)] and all(
        set(t["samples_s"]) == {"ukernel", "numpy", "torch"} and t["rounds"] >= 3 for t in timed.values()
    )
    d = out.dispatcher()
    for m, t in timed.items():  # each timed M runs what its published paired rounds decide (route_stats)
        samples = t["samples_s"]
        rounds = PointTiming(tuple(samples["ukernel"]), {lib: tuple(samples[lib]) for lib in ("numpy", "torch")})
        assert t["route"] == rounds.route and t["rounds"] == rounds.rounds
        assert (d.dense.table.vendor_library(m) or "ukernel") == t["route"]
    rng = np.random.default_rng(3)
    f = rng.standard_normal((3, 3, 16, 16), dtype=np.float32)
    for n in (1, 3, 8, 13):  # 13: past the support
        x = rng.standard_normal((n, 32, 32, 16), dtype=np.float32)
        np.testing.assert_allclose(d(x, f), _torch_conv(x, f, 1, 1), rtol=1e-4, atol=2e-3)
    assert set(d.dense.kernels) == set(d.dense.table.mts)  # only the uKernels some M still runs are shipped


def test_conv_routes_refuse_a_table_a_gemm_sweep_routed() -> None:
    """Issue 31: a conv's routes are decided as convs; on a table a GEMM sweep already routed, the spans where the
    conv's uKernels won would keep the GEMM's vendor routes (their programs are gone), so it is refused."""
    table = DispatchTable((Interval(1, 4, Shape((), "u4")), Interval(5, 9, None, vendor.NUMPY)), {"u4": 4})
    outcome = RangeOutcome(table, {}, {}, [], {}, {}, [], 0, 0.0)
    with pytest.raises(ValueError, match="vendor_routes=False"):
        route_conv(outcome, _workload("1x1"), [({"N": 1, "H": 3, "W": 3}, 1.0)])
