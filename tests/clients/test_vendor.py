"""Vendor routes name their library (numpy or PyTorch: kernelfleet.vendor), and the dense, batch_matmul and conv
dispatchers run the library the table names, with the same result as numpy; a host without PyTorch runs numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernelfleet import vendor
from kernelfleet.bmm_dispatcher import BKN, BNK, BmmDispatcher, bt_layout
from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import ACTIVATIONS, Epilogue, dense_reference
from kernelfleet.tuple_dispatch import TupleDispatchTable
from tests.clients.vendor_calls import record_library_calls


def test_routes_on_the_wire() -> None:
    assert vendor.route_of(vendor.NUMPY) == "vendor"  # the form tables had before PyTorch was timed
    assert vendor.route_of(vendor.TORCH) == "vendor:torch"
    for lib in vendor.LIBRARIES:
        assert vendor.library_of(vendor.route_of(lib)) == lib
    assert vendor.library_of("mt8_nt48_kt4") is None and vendor.library_of(None) is None
    with pytest.raises(ValueError, match="unknown vendor route"):
        vendor.library_of("vendor:mkl")
    with pytest.raises(ValueError, match="unknown vendor library"):
        vendor.route_of("mkl")
    table = DispatchTable((Interval(1, 4, None), Interval(5, 9, None, vendor.TORCH)), {})
    wire = table.to_dict()
    assert wire["intervals"] == [[1, 4, "vendor"], [5, 9, "vendor:torch"]]
    again = DispatchTable.from_dict(wire)
    assert again == table and again.vendor_library(3) == vendor.NUMPY and again.vendor_library(100) == vendor.TORCH
    with pytest.raises(ValueError, match="unknown vendor route"):
        DispatchTable.from_dict({"mts": {}, "intervals": [[1, 4, "vendor:mkl"]]})
    with pytest.raises(ValueError, match="unknown vendor route"):
        TupleDispatchTable(("M",), ((1, 3),), (8,), ("vendor", "vendor:mkl"))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("bias", [False, True])
def test_torch_computes_the_dense_layer_numpy_does(activation: str, bias: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal((13, 40), dtype=np.float32)
    w = rng.standard_normal((24, 40), dtype=np.float32)
    b = rng.standard_normal(24, dtype=np.float32) if bias else None
    epilogue = Epilogue(bias, activation)
    got = vendor.dense(vendor.TORCH, x, w, b, epilogue)
    assert got.dtype == np.float32 and got.shape == (13, 24)
    np.testing.assert_allclose(got, dense_reference(x, w, b, epilogue), rtol=1e-5, atol=1e-4)


def test_the_dispatcher_runs_the_library_each_interval_names(monkeypatch: pytest.MonkeyPatch) -> None:
    table = DispatchTable((Interval(1, 4, None), Interval(5, 9, None, vendor.TORCH)), {}, Epilogue(True, "relu"))
    d = Dispatcher(table, {}, N=None, K=None)
    ran: list[str] = []
    record_library_calls(monkeypatch, ran)
    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((6, 5), dtype=np.float32), rng.standard_normal(6, dtype=np.float32)
    for S in (2, 7, 30, 2):  # 30: past the table, its last interval (PyTorch) extends
        x = rng.standard_normal((S, 5), dtype=np.float32)
        np.testing.assert_allclose(d(x, w, bias=b), np.maximum(x @ w.T + b, 0), rtol=1e-5, atol=1e-5)
    assert ran == [vendor.NUMPY, vendor.TORCH, vendor.TORCH, vendor.NUMPY]
    assert all(u.fallbacks == 0 for u in d.usage().values())  # the table's choice, not a miss


def test_a_host_without_torch_runs_numpy_for_its_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vendor, "has_torch", lambda: False)
    assert vendor.available() == (vendor.NUMPY,) and vendor.runnable(vendor.TORCH) == vendor.NUMPY
    monkeypatch.setattr(torch.nn.functional, "linear", _must_not_run)
    table = DispatchTable((Interval(1, 9, None, vendor.TORCH),), {})
    x, w = np.ones((3, 4), np.float32), np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(Dispatcher(table, {}, N=None, K=None)(x, w), x @ w.T)


def _must_not_run(*args: object, **kwargs: object) -> None:
    raise AssertionError("PyTorch ran on a host that has no PyTorch")


def test_bmm_cells_run_their_library() -> None:
    table = TupleDispatchTable(("M",), ((1, 5),), (9,), ("vendor", "vendor:torch"))
    d = BmmDispatcher(table, {}, {"B": 2, "N": 3, "K": 4}, source="local")
    rng = np.random.default_rng(1)
    bt = rng.standard_normal((2, 3, 4), dtype=np.float32)
    for m in (2, 6):
        a = rng.standard_normal((2, m, 4), dtype=np.float32)
        want = np.matmul(a, bt.transpose(0, 2, 1))
        np.testing.assert_allclose(d(a, bt), want, rtol=1e-5, atol=1e-5)
        out = np.empty_like(want)
        assert d(a, bt, out) is out
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert d.by_program["vendor"] == 2 and d.by_program["vendor:torch"] == 2 and d.vendor_calls == 4 and not d.misses


def test_bmm_runs_the_route_of_the_layout_bt_comes_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: a cell routed per layout runs PyTorch for a contiguous Bt and numpy for the transposed view of a
    [B,K,N] array (A·V's V), the same shapes in either order; a table from before runs its one route for both."""
    ran: list[str] = []
    real = vendor.bmm
    monkeypatch.setattr(vendor, "bmm", lambda lib, *a: ran.append(lib) or real(lib, *a))
    per_layout = TupleDispatchTable(("M",), ((1, 5),), (9,), ("vendor:torch", "vendor"), {BKN: ("vendor", "vendor")})
    d = BmmDispatcher(per_layout, {}, {"B": 2, "N": 3, "K": 4})
    old = BmmDispatcher(TupleDispatchTable(("M",), ((1, 5),), (9,), ("vendor:torch", "vendor")), {}, d.static)
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 3, 4), dtype=np.float32)
    contiguous = rng.standard_normal((2, 3, 4), dtype=np.float32)
    transposed = rng.standard_normal((2, 4, 3), dtype=np.float32).transpose(0, 2, 1)  # Bt = Vᵀ, a view
    assert (bt_layout(contiguous), bt_layout(transposed)) == (BNK, BKN)
    for bt in (contiguous, transposed, contiguous, transposed):
        np.testing.assert_allclose(d(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
    assert d.by_program["vendor:torch"] == 2 and d.by_program["vendor"] == 2 and d.misses == 0
    assert ran == [vendor.TORCH, vendor.TORCH]  # numpy's calls go straight to numpy
    assert (d.program({"M": 3}, BNK), d.program({"M": 3}, BKN)) == ("vendor:torch", "vendor")
    ran.clear()
    for bt in (contiguous, transposed):
        old(a, bt)
    assert ran == [vendor.TORCH, vendor.TORCH] and old.by_program["vendor:torch"] == 2


@pytest.mark.parametrize(("kh", "stride", "padding"), [(3, 1, 1), (3, 2, 0), (1, 1, 0), (1, 2, 0)])
def test_a_conv_routed_to_torch_runs_torchs_conv(
    monkeypatch: pytest.MonkeyPatch, kh: int, stride: int, padding: int
) -> None:
    ci, co = 5, 7
    geometry = ConvGeometry(stride=stride, padding=padding, filter=(kh, kh, ci, co))
    table = DispatchTable((Interval(1, 40, None), Interval(41, 10_000, None, vendor.TORCH)), {})
    d = ConvDispatcher(Dispatcher(table, {}, N=co, K=kh * kh * ci), geometry)
    calls: list[int] = []
    real = vendor.torch_conv2d
    monkeypatch.setattr(vendor, "torch_conv2d", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(kh * 10 + stride)
    f = rng.standard_normal((kh, kh, ci, co), dtype=np.float32)
    ft = torch.from_numpy(f.astype(np.float64)).permute(3, 2, 0, 1)
    for n, h in ((1, 5), (3, 11)):  # M ≤ 40: numpy's im2col GEMM; M > 40: PyTorch's conv2d
        x = rng.standard_normal((n, h, h, ci), dtype=np.float32)
        xt = torch.from_numpy(x.astype(np.float64)).permute(0, 3, 1, 2)
        want = torch.nn.functional.conv2d(xt, ft, stride=stride, padding=padding).permute(0, 2, 3, 1).numpy()
        got = d(x, f)
        assert got.shape == want.shape and got.dtype == np.float32 and got.flags.c_contiguous
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(calls) == 1
    usage = d.usage()
    assert sum(u.calls for u in usage.values()) == 2 and all(u.fallbacks == 0 for u in usage.values())


def test_the_dispatch_command_names_each_routes_library(monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    from typer.testing import CliRunner

    from kernelfleet import cli
    from kernelfleet.models import DispatchDoc

    table = DispatchTable((Interval(1, 4, None), Interval(5, 9, None, vendor.TORCH), Interval(10, 12, None)), {})
    doc = DispatchDoc(
        workload_hash="ab" * 8,
        target_fingerprint="cd" * 8,
        dim="M",
        s_max=12,
        table=table.to_dict(),
        ukernels=[],
        predicted_latency_s=[1e-6] * 12,
        measured_latency_s={},
        created_at=dt.datetime.now(dt.UTC),
    )

    class _Client:
        def dispatch_doc(self, workload: str, target: str) -> tuple[DispatchDoc, str]:
            return doc, '"e"'

    monkeypatch.setattr(cli, "client_from_env", lambda url: _Client())
    result = CliRunner().invoke(cli.app, ["dispatch", "--workload", "ab" * 8, "--target", "cd" * 8])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "routed to numpy" in out and "M = 1..4, 10..12" in out and "routed to torch" in out and "M = 5..9" in out
