"""batch_matmul uKernels: one binary per tile for every tuple of B and the symbolic ones of M, N, K (attention's
QKᵀ with T in M and N, A·V with T in M and K), the tuner's tuple table, and the signed SDK dispatcher."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelfleet import vendor
from kernelfleet.bmm_dispatcher import BKN, BNK, BmmDispatcher, bmm_document, load_bmm_dispatcher
from kernelfleet.bmm_ukernel import BmmUKernel
from kernelfleet.dispatch import VENDOR
from kernelfleet.signing import UntrustedArtifact, document_message
from kernelfleet.tuple_dispatch import TupleDispatchTable
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.bmm_kernel import build_bmm_ukernel
from service.tuning.tuners.ukernel.bmm_tuner import (
    VENDOR_MARGIN,
    BmmRangeOutcome,
    BmmRangeTask,
    BmmUKernelTuner,
    random_pair,
    verify_bmm,
)
from service.tuning.tuners.ukernel.tuner import QuietRangeSink

HEADS, D = 2, 64
QK = {"B": HEADS, "K": D}  # QKᵀ: T in M and N
AV = {"B": HEADS, "N": D}  # A·V (Bt = Vᵀ): T in M and K


@pytest.fixture(scope="module")
def kernels() -> dict[str, BmmUKernel]:
    target = tvm_target(host_target())
    return {
        "qk": build_bmm_ukernel(4, 32, 4, target, K=D),
        "av": build_bmm_ukernel(3, 32, 8, target, N=D),
        "all": build_bmm_ukernel(2, 16, 4, target),  # M, N and K symbolic
    }


def _check(uk: BmmUKernel, B: int, M: int, N: int, K: int) -> None:
    a, bt = random_pair({"B": B, "M": M, "N": N, "K": K}, seed=B * 1000 + M + N + K)
    want = np.matmul(a.astype(np.float64), bt.astype(np.float64).transpose(0, 2, 1))
    got = uk(a, bt)
    assert got.shape == (B, M, N)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(K))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 3), st.integers(1, 70), st.integers(1, 70))
def test_qk_and_av_binaries_are_exact_for_any_tuple(kernels: dict[str, BmmUKernel], B: int, t: int, s: int) -> None:
    _check(kernels["qk"], B, t, s, D)
    _check(kernels["av"], B, t, D, s)
    _check(kernels["all"], B, t, s, (t + s) % 37 + 1)


def test_edges_strided_inputs_and_static_dims(kernels: dict[str, BmmUKernel]) -> None:
    for T in (1, 4, 5, 31, 32, 33, 64):
        _check(kernels["qk"], HEADS, T, T, D)
        _check(kernels["av"], HEADS, T, D, T)
    q, k = random_pair({"B": 2, "M": 9, "N": 9, "K": D})
    out = np.full((2, 9, 9), np.nan, np.float32)
    kernels["qk"](q[:, :, :], k[:, ::-1, :], out)  # a negative-stride view is packed like any other
    np.testing.assert_allclose(out, q @ k[:, ::-1].transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
    p, vt = random_pair({"B": 2, "M": 13, "N": D, "K": 13}, bt_layout="BKN")  # Bt = Vᵀ, a transposed view
    np.testing.assert_allclose(kernels["av"](p, vt), p @ vt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="K=64"):
        kernels["qk"](*random_pair({"B": 1, "M": 2, "N": 2, "K": 63}))


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> BmmRangeOutcome:
    """T in M and N (joint: the diagonal), every class forced onto uKernels so the programs run."""
    support = [({"M": t, "N": t}, 1.0) for t in range(1, 41)]
    task = BmmRangeTask(
        static=QK,
        support=support,
        target=tvm_target(host_target()),
        work_dir=tmp_path_factory.mktemp("bmm"),
        max_ukernels=2,
        vendor_routes=False,
        min_seconds=0.0005,
        rounds=1,
    )
    return BmmUKernelTuner().tune(task, QuietRangeSink())


def test_tuner_plans_the_diagonal_and_verifies(tuned: BmmRangeOutcome) -> None:
    table = tuned.table
    assert table.dims == ("M", "N") and table.his == (40, 40)
    n = len(table.starts[0])
    for i in range(n):
        for j in range(n):
            cell = table.cells[i * n + j]
            assert (cell is not None) == (i == j)  # only the classes the joint distribution has mass in
            assert cell != VENDOR
    assert tuned.serves_ukernels and set(tuned.artifacts) == table.ukernel_ids()
    assert verify_bmm(tuned.dispatcher(QK), QK) is None


def test_dispatcher_misses_run_numpy(tuned: BmmRangeOutcome) -> None:
    d = tuned.dispatcher(QK)
    for M, N in [(7, 7), (40, 40), (41, 41), (3, 30), (100, 1)]:  # in, edge, past the box, a hole, outside
        a, bt = random_pair({"B": HEADS, "M": M, "N": N, "K": D})
        np.testing.assert_allclose(d(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
    assert d.calls == 5 and d.misses == 3
    with pytest.raises(ValueError, match="B=2"):
        d(*random_pair({"B": 3, "M": 2, "N": 2, "K": D}))


def test_signed_document_round_trip(tuned: BmmRangeOutcome, tmp_path: Path) -> None:
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    arts = {uid: (a.sha256, a.spec) for uid, a in tuned.artifacts.items()}
    body = bmm_document(tuned.table, arts, QK)
    sig = base64.b64encode(key.sign(document_message("wl", "tg", body))).decode()
    for a in tuned.artifacts.values():
        shutil.copy(a.path, tmp_path / f"{a.sha256}.so")
    common = {"workload": "wl", "target": "tg", "public_key": public, "artifact_dir": tmp_path}
    d = load_bmm_dispatcher(body, signature=sig, **common)
    a, bt = random_pair({"B": HEADS, "M": 17, "N": 17, "K": D})
    np.testing.assert_allclose(d(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
    assert d.misses == 0 and not d.fallback
    tampered = json.loads(body)
    tampered["table"]["cells"][0] = VENDOR
    with pytest.raises(UntrustedArtifact):
        load_bmm_dispatcher(json.dumps(tampered).encode(), signature=sig, **common)
    victim = next(iter(tuned.artifacts.values())).sha256
    (tmp_path / f"{victim}.so").write_bytes(b"not the library")
    with pytest.raises(UntrustedArtifact):
        load_bmm_dispatcher(body, signature=sig, **common)
    offline = load_bmm_dispatcher(None, signature=None, static=QK, **common)  # nothing cached: numpy
    assert offline.fallback and isinstance(offline, BmmDispatcher)
    np.testing.assert_allclose(offline(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-5)
    assert offline.misses == 1


def test_with_vendor_routes_each_class_runs_what_was_fastest_over_its_tuples(tmp_path: Path) -> None:
    """Every class's tuples are timed on the uKernels, numpy and PyTorch, with Bt in each layout: per layout, a
    class keeps a uKernel only where it beat that layout's fastest library at each tuple, else it goes to the
    library with the least total time in that layout."""
    support = [({"M": t, "N": t}, 1.0) for t in (1, 2, 6, 24, 96)]
    task = BmmRangeTask(
        static=QK,
        support=support,
        target=tvm_target(host_target()),
        work_dir=tmp_path,
        max_ukernels=2,
        min_seconds=0.0005,
        rounds=1,
    )
    out = BmmUKernelTuner().tune(task, QuietRangeSink())
    table = out.table
    by_class: dict[tuple[int, ...], list[dict[str, float]]] = {}
    for key, times in out.measured.items():
        assert {f"{r}@{lay}" for r in ("vendor", "vendor:torch") for lay in (BNK, BKN)} <= set(times)
        classes = table.class_of([int(part.split("=")[1]) for part in key.split(",")])
        assert classes is not None
        by_class.setdefault(classes, []).append(times)
    routes = ("vendor", "vendor:torch")
    for classes, timed in by_class.items():
        for layout in (BNK, BKN):
            cell = table.cells_of(layout)[table.cell_index(classes)]
            assert cell is not None
            if vendor.is_vendor(cell):  # the library fastest over the class's tuples in this layout
                assert cell == min(routes, key=lambda r: sum(t[f"{r}@{layout}"] for t in timed))
            else:
                fastest = [min(t[f"{r}@{layout}"] for r in routes) for t in timed]
                assert all(t[f"{cell}@{layout}"] * (1 + VENDOR_MARGIN) < f for t, f in zip(timed, fastest, strict=True))
    assert verify_bmm(out.dispatcher(QK), QK) is None


# seconds per call (uKernel, numpy, PyTorch) by (Bt layout, T ≤ 8), made up (which library wins is the machine's
# business): at T ≤ 8 numpy and PyTorch each win one layout, PyTorch on the sum of both; at T > 8 the uKernel wins
# with Bt as a transposed view only
LAYOUT_TIMES = {
    ("BNK", True): (20.0, 10.0, 1.0),
    ("BKN", True): (20.0, 2.0, 3.0),
    ("BNK", False): (5.0, 2.0, 3.0),
    ("BKN", False): (1.0, 4.0, 4.0),
}


def _made_up_times(
    kernels: dict[str, BmmUKernel], shape: dict[str, int], min_seconds: float, rounds: int, layout: str
) -> dict[str, float]:
    """In place of bmm_tuner.time_layout."""
    ours, numpy_s, torch_s = LAYOUT_TIMES[(layout, shape["M"] <= 8)]
    return {**dict.fromkeys(kernels, ours), "vendor": numpy_s, "vendor:torch": torch_s}


def test_each_bt_layout_is_routed_on_its_own_timings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: a class goes, per layout, to the library fastest in that layout (not on the sum of both, where
    A·V's transposed V went to PyTorch though numpy won every tuple in it), and keeps a uKernel in the layout where
    it beat that layout's libraries; the dispatcher runs the route of the layout each call's Bt comes in."""
    from service.tuning.tuners.ukernel import bmm_tuner

    monkeypatch.setattr(bmm_tuner, "time_layout", _made_up_times)
    task = BmmRangeTask(
        static=QK,
        support=[({"M": t, "N": t}, 1.0) for t in (2, 24)],
        target=tvm_target(host_target()),
        work_dir=tmp_path,
        max_ukernels=1,
    )
    out = BmmUKernelTuner().tune(task, QuietRangeSink())
    (uid,) = out.kernels
    small, large = ({**QK, "M": t, "N": t} for t in (2, 24))
    d = out.dispatcher(QK)
    assert (d.program(small, BNK), d.program(small, BKN)) == ("vendor:torch", "vendor")
    assert (d.program(large, BNK), d.program(large, BKN)) == ("vendor", uid)
    assert TupleDispatchTable.from_dict(out.table.to_dict()) == out.table and out.changes_for(vendor.NUMPY)
    for shape in (small, large):
        for layout in (BNK, BKN):
            a, bt = random_pair(shape, bt_layout=layout)
            np.testing.assert_allclose(d(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
    assert d.by_program == {uid: 1, "vendor": 2, "vendor:torch": 1, None: 0}
    assert verify_bmm(d, QK) is None
