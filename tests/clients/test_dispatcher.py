"""The SDK dispatcher on locally built uKernels: programs per S, exact overrides, numpy fallback, overhead."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.dispatch_cache import DispatchCache
from kernelfleet.dispatcher import Dispatcher, dispatch_overhead_s
from kernelfleet.signing import UntrustedArtifact, document_message, verify_bytes, verify_document
from kernelfleet.ukernel import UKernel
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.kernel import build_ukernel

N, K = 64, 32


@pytest.fixture(scope="module")
def kernels() -> dict[str, UKernel]:
    target = tvm_target(host_target())
    return {"a": build_ukernel(N, K, 4, 32, 4, target), "b": build_ukernel(N, K, 3, 16, 4, target)}


@pytest.fixture
def table() -> DispatchTable:
    # 1..3 on b; 4..8 on a; 9..20 as 8 rows on a plus the rest on b (and beyond 20 the same shape extends)
    return DispatchTable(
        (Interval(1, 3, Shape((), "b")), Interval(4, 8, Shape((), "a")), Interval(9, 20, Shape((("a", 2),), "b"))),
        {"a": 4, "b": 3},
    )


def test_every_shape_runs_its_program_including_unseen_ones(kernels: dict[str, UKernel], table: DispatchTable) -> None:
    d = Dispatcher(table, kernels, N=N, K=K)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((N, K)).astype("float32")
    for s in [*range(1, 21), 23, 64, 131]:
        x = rng.standard_normal((s, K)).astype("float32")[:, :]  # numpy's own (usually unaligned) memory
        np.testing.assert_allclose(d(x, w), x @ w.T, rtol=1e-4, atol=1e-4, err_msg=f"S={s}")
        out = np.empty((s, N), np.float32)  # a caller's output buffer, aligned or not
        assert d(x, w, out) is out
        np.testing.assert_allclose(out, x @ w.T, rtol=1e-4, atol=1e-4)
    assert [p.ukernel_id for p in d.program(131)] == ["a", "b"] and sum(p.rows for p in d.program(131)) == 131
    usage = d.usage(reset=True)
    assert usage[131].calls == 2 and usage[131].fallbacks == 0 and usage[131].seconds > 0
    assert d.usage() == {}
    with pytest.raises(ValueError, match="X must be"):
        d(np.zeros((3, K + 1), np.float32), w)


def test_exact_kernels_win_their_shape_and_no_table_means_numpy(
    kernels: dict[str, UKernel], table: DispatchTable
) -> None:
    calls: list[int] = []

    def exact(x: np.ndarray, w: np.ndarray) -> np.ndarray:
        calls.append(x.shape[0])
        return x @ w.T

    d = Dispatcher(table, kernels, N=N, K=K, exact={7: exact})
    x, w = np.ones((7, K), np.float32), np.ones((N, K), np.float32)
    np.testing.assert_allclose(d(x, w), x @ w.T)
    assert calls == [7] and d.program(7) == ()

    fallback = Dispatcher(None, {}, N=None, K=None, source="fallback")
    np.testing.assert_allclose(fallback(x, w), x @ w.T)
    assert fallback.fallback and fallback.usage()[7].fallbacks == 1
    with pytest.raises(ValueError, match="not loaded"):
        Dispatcher(table, {"a": kernels["a"]}, N=N, K=K)


def test_a_vendor_routed_s_runs_on_the_nearest_intervals_ukernels_when_adopted(kernels: dict[str, UKernel]) -> None:
    """S 4..8 and past 30 go to numpy; 1..3 run on b alone, 9..30 as 8 rows on a plus the rest on b. A vendor S runs on
    the program of the interval nearest it that can take its rows (the lower one on a tie); adopted, it stays there."""
    table = DispatchTable(
        (
            Interval(1, 3, Shape((), "b")),
            Interval(4, 8, None),
            Interval(9, 30, Shape((("a", 2),), "b")),
            Interval(31, 40, None),
        ),
        {"a": 4, "b": 3},
    )
    assert table.nearest_shape(2) == Shape((), "b")  # its own
    assert [table.nearest_shape(S) for S in (5, 6)] == [Shape((), "b")] * 2  # 9..30 needs S > 8 rows
    assert table.nearest_shape(9) == Shape((("a", 2),), "b")
    assert table.nearest_shape(40) == table.nearest_shape(100) == Shape((("a", 2),), "b")
    assert DispatchTable((Interval(1, 8, None),), {}).nearest_shape(4) is None
    d = Dispatcher(table, kernels, N=N, K=K)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((N, K)).astype("float32")
    x = rng.standard_normal((33, K)).astype("float32")
    assert d.vendor_route(33) == "numpy" and [p.rows for p in d.ukernel_program(33)] == [8, 25]
    np.testing.assert_allclose(d.run_ukernels(x, w), x @ w.T, rtol=1e-4, atol=1e-4)
    assert d.vendor_route(33) == "numpy"  # a trial: the table's route stands
    d(x, w)
    d.adopt(33)
    assert d.vendor_route(33) is None and d.program(33) == d.ukernel_program(33)
    np.testing.assert_allclose(d(x, w), x @ w.T, rtol=1e-4, atol=1e-4)
    assert d.usage()[33].calls == 3 and d.usage()[33].fallbacks == 0
    assert d.vendor_route(34) == "numpy"  # only the adopted S moved
    with pytest.raises(ValueError, match="no uKernel program"):
        Dispatcher(DispatchTable((Interval(1, 8, None),), {}), {}, N=N, K=K).adopt(4)


def test_dispatch_overhead_is_a_few_microseconds(kernels: dict[str, UKernel], table: DispatchTable) -> None:
    d = Dispatcher(table, kernels, N=N, K=K)
    w = np.ones((N, K), np.float32)
    overhead = dispatch_overhead_s(d, 61, w, calls=5000)
    assert overhead < 5e-6, f"{overhead * 1e6:.2f} µs per call"


def test_documents_verify_by_signature_and_artifacts_by_hash() -> None:
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    body = b'{"table": "pretend"}'
    signature = base64.b64encode(key.sign(document_message("ab", "cd", body))).decode()
    verify_document(body, "ab", "cd", signature, public)
    stranger = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    for bad in [
        (body + b" ", "ab", "cd", signature, public),  # other bytes
        (body, "ab", "ce", signature, public),  # signed for another target
        (body, "aa", "cd", signature, public),  # signed for another workload
        (body, "ab", "cd", "", public),  # unsigned
        (body, "ab", "cd", base64.b64encode(b"\0" * 64).decode(), public),  # forged
        (body, "ab", "cd", signature, base64.b64encode(stranger).decode()),  # another key
    ]:
        with pytest.raises(UntrustedArtifact):
            verify_document(*bad)
    data = b"\x7fELF pretend library"
    verify_bytes(data, hashlib.sha256(data).hexdigest())
    with pytest.raises(UntrustedArtifact):
        verify_bytes(data + b"x", hashlib.sha256(data).hexdigest())


def test_cache_names_cannot_leave_the_cache_directory(tmp_path: Path) -> None:
    cache = DispatchCache(tmp_path)
    for bad in ["../../etc/passwd", "ABC", "a/b", "x" * 65, ""]:
        with pytest.raises(ValueError):
            cache.artifact_path(bad)
        with pytest.raises(ValueError):
            cache.read_doc(bad, "ab")
    assert cache.read_doc("ab", "cd") is None
