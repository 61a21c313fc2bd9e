"""The `ukernel` kind on conv2d (NHWC, symbolic N/H/W): what it accepts (422 naming the field otherwise), one unit
run end to end through the dense machinery over M = N·OH·OW, and the published table loaded by the SDK from its
signed cache, offline, as a ConvDispatcher (`Client.conv2d_dispatcher`)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from pydantic import ValidationError

from kernelfleet import vendor
from kernelfleet.client import Client
from kernelfleet.conv_dispatcher import ConvDispatcher
from kernelfleet.dispatch import DispatchTable
from kernelfleet.dispatch_cache import CachedDoc, DispatchCache
from kernelfleet.signing import document_message
from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit, Independent, ShapePoint, Uniform
from service.tuning.admission import check_job
from service.tuning.tuners.ukernel.route_stats import PointTiming
from tests.tuning.ukernel.units import publication_doc, run_ukernel_unit

LLVM = TargetSpec(kind="llvm", mcpu="skylake-avx512", num_cores=2)
CI, CO = 4, 8
CONV = WorkloadSpec(
    op="conv2d", dims={"CI": CI, "CO": CO, "KH": 3, "KW": 3}, symbolic=["N", "H", "W"], attrs={"padding": 1}
)
DIST = Explicit(points=[ShapePoint(shape={"N": n, "H": h, "W": h}, weight=n) for n in (1, 2) for h in (4, 6, 9)])
WH, TARGET = "ab" * 16, "cd" * 16


def _problem_loc(workload: WorkloadSpec, dist: Any, target: TargetSpec = LLVM) -> tuple[str | int, ...] | None:
    problem = check_job("ukernel", workload, dist, target, Budget(trials=2))
    return None if problem is None else problem.loc


def test_what_the_kind_accepts_for_conv2d() -> None:
    assert _problem_loc(CONV, DIST) is None
    only_h = WorkloadSpec(op="conv2d", dims={"N": 1, "W": 16, "CI": 8, "CO": 8, "KH": 3, "KW": 3}, symbolic=["H"])
    assert _problem_loc(only_h, Uniform(dim="H", low=3, high=64)) is None
    only_n = WorkloadSpec(op="conv2d", dims={"H": 14, "W": 14, "CI": 8, "CO": 8, "KH": 1, "KW": 1}, symbolic=["N"])
    assert _problem_loc(only_n, Uniform(dim="N", low=1, high=16)) is None
    hw = WorkloadSpec(op="conv2d", dims={"N": 2, "CI": 8, "CO": 8, "KH": 3, "KW": 3}, symbolic=["H", "W"])
    grid = Independent(factors=[Uniform(dim="H", low=3, high=20), Uniform(dim="W", low=3, high=20)])
    assert _problem_loc(hw, grid) is None


def test_what_the_kind_refuses_names_the_field() -> None:
    assert _problem_loc(CONV, DIST, TargetSpec(kind="cuda", arch="sm_90")) == ("target", "kind")
    f16 = CONV.model_copy(update={"dtype": "float16"})
    assert _problem_loc(f16, DIST) == ("workload", "dtype")
    ci = WorkloadSpec(op="conv2d", dims={"N": 1, "H": 8, "W": 8, "CO": 8, "KH": 3, "KW": 3}, symbolic=["CI"])
    assert _problem_loc(ci, Uniform(dim="CI", low=1, high=8)) == ("workload", "symbolic")
    past_max_s = Explicit(points=[ShapePoint(shape={"N": 8, "H": 64, "W": 64})])  # M = 32768: tuned to MAX_S, extended
    assert _problem_loc(CONV, past_max_s) is None
    big = Explicit(points=[ShapePoint(shape={"N": 100, "H": 64, "W": 64})])  # M = 409600 > MAX_CONV_M
    assert _problem_loc(CONV, big) == ("distribution",)
    # the operator is NHWC/HWIO with no dilation or groups: a workload asking for them is no conv2d workload
    for attr, value in (("layout", "NCHW"), ("dilation", 2), ("groups", 2)):
        with pytest.raises(ValidationError) as err:
            WorkloadSpec(op="conv2d", dims=dict(CONV.dims), symbolic=["N", "H", "W"], attrs={attr: value})
        assert err.value.errors()[0]["loc"][-2:] == ("attrs", attr)


def _torch_conv(x: np.ndarray, f: np.ndarray, padding: int) -> np.ndarray:
    xt, ft = torch.from_numpy(x).permute(0, 3, 1, 2), torch.from_numpy(f).permute(3, 2, 0, 1)
    return F.conv2d(xt, ft, padding=padding).permute(0, 2, 3, 1).numpy()


def test_a_unit_publishes_a_table_the_sdk_runs_offline_from_its_signed_cache(tmp_path: Path) -> None:
    result, sink = run_ukernel_unit(CONV, DIST, tmp_path / "work")
    assert result.fatal is None and result.dispatch is not None and sink.candidates
    pub = result.dispatch
    assert pub.dim == "M" and len(pub.predicted) == 2 * 9 * 9  # the largest M = N·OH·OW
    assert pub.table.to_json()["conv2d"] == {"stride": 1, "padding": 1, "filter": [3, 3, CI, CO], "static": {}}
    assert [s.shape for s in result.shapes] == [{"N": 2, "H": 9, "W": 9}, {"N": 2, "H": 6, "W": 6}]
    assert all(s.latency_s and s.vendor for s in result.shapes)

    # signed and cached as the service serves it; the service is unreachable
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    doc = publication_doc(pub, WH, TARGET)
    body = doc.model_dump_json().encode()
    signature = base64.b64encode(key.sign(document_message(WH, TARGET, body))).decode()
    cache = DispatchCache(tmp_path / "cache")
    for a in pub.artifacts:
        cache.put_artifact(a.sha256, a.data)
    cache.write_doc(WH, TARGET, CachedDoc('"e"', body, signature))
    client = Client("http://127.0.0.1:9", retries=0, cache_dir=tmp_path / "cache", trusted_key=public)
    d = client.conv2d_dispatcher(WH, TARGET)
    assert isinstance(d, ConvDispatcher) and d.source == "cache" and not d.fallback
    rng = np.random.default_rng(0)
    f = rng.standard_normal((3, 3, CI, CO), dtype=np.float32)
    for n, h, w in [(1, 4, 4), (2, 9, 9), (2, 5, 7), (3, 11, 10)]:  # in the box, between its points, past it
        x = rng.standard_normal((n, h, w, CI), dtype=np.float32)
        assert d.program({"N": n, "H": h, "W": w})  # uKernels, not numpy
        np.testing.assert_allclose(d(x, f), _torch_conv(x, f, 1), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="stride=1"):
        client.conv2d_dispatcher(WH, TARGET, stride=2)

    # nothing cached: numpy, every call a miss, with the stride and padding the caller names
    bare = client.conv2d_dispatcher(WH, TARGET, padding=1, cache_dir=tmp_path / "empty")
    assert bare.fallback and bare.source == "fallback"
    x = rng.standard_normal((2, 5, 6, CI), dtype=np.float32)
    np.testing.assert_allclose(bare(x, f), _torch_conv(x, f, 1), rtol=1e-4, atol=1e-3)
    assert sum(u.fallbacks for u in bare.usage().values()) == 1


def test_a_table_routing_every_m_to_pytorch_is_published_and_runs_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PyTorch's conv2d timed fastest at every M (forced here: which library wins is the machine's business): the
    table has no uKernel left but beats numpy, so it is published, and the SDK runs PyTorch's conv from it."""
    from service.tuning.tuners.ukernel import conv

    timing = PointTiming((3.0,) * 5, {"numpy": (2.0,) * 5, "torch": (1.0,) * 5})
    monkeypatch.setattr(conv, "time_conv_routes", lambda *a, **k: timing)
    result, _ = run_ukernel_unit(CONV, DIST, tmp_path / "work", vendor_routes=True)
    assert result.fatal is None and result.dispatch is not None and result.dispatch.artifacts == []
    pub = result.dispatch
    wire = pub.table.to_json()
    assert wire["intervals"] == [[1, 2 * 9 * 9, "vendor:torch"]] and wire["mts"] == {}
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    body = publication_doc(pub, WH, TARGET).model_dump_json().encode()
    signature = base64.b64encode(key.sign(document_message(WH, TARGET, body))).decode()
    DispatchCache(tmp_path / "cache").write_doc(WH, TARGET, CachedDoc('"e"', body, signature))
    client = Client("http://127.0.0.1:9", retries=0, cache_dir=tmp_path / "cache", trusted_key=public)
    d = client.conv2d_dispatcher(WH, TARGET)
    assert d.source == "cache" and not d.fallback
    ran: list[int] = []
    real = vendor.torch_conv2d
    monkeypatch.setattr(vendor, "torch_conv2d", lambda *a: ran.append(1) or real(*a))
    rng = np.random.default_rng(1)
    f = rng.standard_normal((3, 3, CI, CO), dtype=np.float32)
    x = rng.standard_normal((2, 7, 5, CI), dtype=np.float32)
    np.testing.assert_allclose(d(x, f), _torch_conv(x, f, 1), rtol=1e-4, atol=1e-3)
    assert ran == [1] and all(u.fallbacks == 0 for u in d.usage().values())


def test_the_gemm_sweep_never_routes_a_conv_whose_ukernels_won_as_a_conv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: with vendor routes on, the conv's own timing (uKernels fastest at every route point, forced here)
    decides its routes; the dense GEMM sweep, which would send every M to numpy (also forced), must not run and
    overlay them, so every M of the published table runs on the uKernels."""
    from service.tuning.tuners.ukernel import conv, tuner

    timing = PointTiming((1.0,) * 5, {"numpy": (2.0,) * 5, "torch": (3.0,) * 5})
    monkeypatch.setattr(conv, "time_conv_routes", lambda *a, **k: timing)
    numpy_wins = PointTiming((2.0,) * 3, {"numpy": (1.0,) * 3, "torch": (3.0,) * 3})
    monkeypatch.setattr(tuner, "time_point", lambda *a, **k: numpy_wins)
    result, _ = run_ukernel_unit(CONV, DIST, tmp_path / "work", vendor_routes=True)
    assert result.fatal is None and result.dispatch is not None, result.not_published
    pub = result.dispatch
    table = DispatchTable.from_dict(pub.table.to_json())
    assert not any(iv.vendor for iv in table.intervals) and table.mts and pub.artifacts
    assert pub.validation["conv_routes"]["spans"] == [] and pub.validation["vendor_routes"]["vendor_S"] == 0


def test_a_conv_route_that_stands_alone_is_confirmed_before_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31: PyTorch's conv is faster at every M, but the first M timed reads as a clear uKernel win once (a
    burst of load on the libraries' rounds). That lone decision is re-timed, pooled with the first rounds, and
    goes to PyTorch like its neighbours: one bad timing does not publish a uKernel span."""
    from service.tuning.tuners.ukernel import conv

    calls: dict[int, int] = {}

    def timing(dispatcher: Any, workload: WorkloadSpec, shape: dict[str, int], rounds: int = 3) -> PointTiming:
        m = conv.rows(workload, shape)
        calls[m] = calls.get(m, 0) + 1
        if len(calls) == 1 and calls[m] == 1:
            return PointTiming((1.0,) * 5, {"numpy": (2.0,) * 5, "torch": (1.5,) * 5})
        return PointTiming((3.0,) * 3, {"numpy": (2.0,) * 3, "torch": (1.0,) * 3})

    monkeypatch.setattr(conv, "time_conv_routes", timing)
    result, _ = run_ukernel_unit(CONV, DIST, tmp_path / "work", vendor_routes=True)
    assert result.dispatch is not None
    routes = result.dispatch.validation["conv_routes"]
    first = next(iter(calls))
    assert calls[first] == 2 and first in routes["confirmed_M"]  # re-timed: 5 wins of 8 rounds is no win
    assert routes["timed_s"][str(first)]["route"] == "torch" and routes["timed_s"][str(first)]["rounds"] == 8
    assert result.dispatch.table.to_json()["intervals"] == [[1, 2 * 9 * 9, "vendor:torch"]]
