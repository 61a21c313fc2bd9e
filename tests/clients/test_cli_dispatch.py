"""`kernelfleet dispatch` prints each kind of table the service publishes (dense, conv2d, batch_matmul) with the
ranges its table really covers, built as the service stores them (kernelfleet.dispatch_view)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from typer.testing import CliRunner

from kernelfleet import cli, vendor
from kernelfleet.conv_dispatcher import ConvGeometry
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.models import DispatchDoc, UKernelRef
from kernelfleet.tables import CONV_KEY
from kernelfleet.tuple_dispatch import TupleDispatchTable

UKERNEL = UKernelRef(id="u16", sha256="ab" * 32, spec={"mt": 16}, size_bytes=1234)


def _doc(table: dict[str, Any], dim: str, predicted: int, measured: dict[str, float] | None = None) -> DispatchDoc:
    return DispatchDoc(
        workload_hash="ab" * 8,
        target_fingerprint="cd" * 8,
        dim=dim,
        s_max=predicted,  # the store's s_max: how many predicted latencies the job sent
        table=table,
        ukernels=[UKERNEL],
        predicted_latency_s=[1e-6] * predicted,
        measured_latency_s=measured or {},
        job_id="job1",
        created_at=dt.datetime.now(dt.UTC),
    )


def _dispatch(monkeypatch: pytest.MonkeyPatch, doc: DispatchDoc) -> str:
    class _Client:
        def dispatch_doc(self, workload: str, target: str) -> tuple[DispatchDoc, str]:
            return doc, '"e"'

    monkeypatch.setattr(cli, "client_from_env", lambda url: _Client())
    result = CliRunner().invoke(cli.app, ["dispatch", "--workload", "ab" * 8, "--target", "cd" * 8])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return " ".join(result.output.split())


def test_a_dense_table_shows_its_range_and_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    table = DispatchTable(
        (Interval(1, 40, Shape((), "u16")), Interval(41, 90, None, vendor.TORCH), Interval(91, 128, Shape((), "u16"))),
        {"u16": 16},
    )
    out = _dispatch(monkeypatch, _doc(table.to_dict(), "M", 128, {"61": 2e-6}))
    assert "dense over M = 1..128" in out and "3 intervals" in out
    assert "routed to torch" in out and "M = 41..90" in out and "routed to numpy" not in out
    assert "uKernel u16: 1234 B" in out and "M=61: measured 2.0 µs, predicted 1.0 µs" in out


def test_a_conv_table_shows_the_range_its_intervals_cover(monkeypatch: pytest.MonkeyPatch) -> None:
    # the tuner predicts up to its limit (4096 here); the routes timed at the support's largest M (7840) extend
    # the intervals past it, and that M was measured
    table = DispatchTable(
        (Interval(1, 3000, Shape((), "u16")), Interval(3001, 7840, None, vendor.NUMPY)), {"u16": 16}
    ).to_dict()
    table[CONV_KEY] = ConvGeometry(stride=1, padding=1, filter=(3, 3, 64, 64), static={"H": 28, "W": 28}).to_dict()
    out = _dispatch(monkeypatch, _doc(table, "M", 4096, {"784": 3e-6, "7840": 9e-5}))
    assert "M = N·OH·OW = 1..7840" in out and "1..4096 (larger" not in out
    assert "predicted latencies cover M = 1..4096" in out
    assert "stride 1, padding 1, filter KH×KW×CI×CO 3×3×64×64, static dims: H=28, W=28" in out
    assert "routed to numpy" in out and "M = 3001..7840" in out
    assert "M=784: measured 3.0 µs, predicted 1.0 µs" in out and "M=7840: measured 90.0 µs" in out


def test_a_batch_matmul_table_shows_its_box_cells_and_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    # B in 1 | 2 | 3..4, M in 1..4 | 5..8 | 9..16; row-major cells, B outermost
    cells = ("u16", "vendor:torch", "u16", "vendor", "u16", None, "u16", "u16", "vendor:torch")
    tuple_table = TupleDispatchTable(("B", "M"), ((1, 2, 3), (1, 5, 9)), (4, 16), cells)
    out = _dispatch(monkeypatch, _doc({**tuple_table.to_dict(), "static": {"N": 64, "K": 32}}, "B,M", 0))
    assert "batch_matmul over B, M" in out and "static dims: K=32, N=64" in out
    assert "B = 1..4 (3 classes), M = 1..16 (3 classes)" in out
    assert "9 cells (3×3): 5 on uKernels, 2 routed to torch, 1 routed to numpy, 1 holes" in out
    assert "routed to torch" in out and "B=1..1 × M=5..8; B=3..4 × M=9..16" in out
    assert "routed to numpy" in out and "B=2..2 × M=1..4" in out
    assert "uKernel u16: 1234 B" in out


def test_a_batch_matmul_table_with_routes_per_layout_shows_each_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    cells = ("u16", "vendor:torch")
    tuple_table = TupleDispatchTable(("M",), ((1, 5),), (8,), cells, {"BKN": ("u16", "vendor")})
    out = _dispatch(monkeypatch, _doc({**tuple_table.to_dict(), "static": {"B": 2, "N": 64, "K": 32}}, "M", 0))
    assert "Bt contiguous (BNK): 2 cells (2): 1 on uKernels, 1 routed to torch" in out
    assert "Bt a transposed view (BKN): 2 cells (2): 1 on uKernels, 1 routed to numpy" in out
