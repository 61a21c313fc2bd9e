"""Fused epilogues: uKernels that add the bias and activate in their store of Y, one pass, every M; the SDK
dispatcher over several pieces, vendor routes and the fallback; the range tuner on a bias + gelu layer.

torch is not installed in this venv: the references are numpy (kernelfleet.epilogue) checked against the
float64 definitions in tests/clients/test_epilogue.py."""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import ACTIVATIONS, NO_EPILOGUE, Epilogue, dense_reference
from kernelfleet.ukernel import UKernelSpec
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.kinds.ukernel import verify
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.kernel import UKernel, build_ukernel, schedule_ukernel
from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner

K = 32
SHAPES = (1, 5, 6, 7, 13, 48, 61)  # below, at and past the M-tile, not multiples of it


def _tol(k: int) -> float:
    return 1e-4 * math.sqrt(k) + 1e-4


@pytest.fixture(scope="module")
def target() -> dict[str, object]:
    return dict(tvm_target(host_target()))


def _check(kernel: UKernel, epilogue: Epilogue, n: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, K), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32) if epilogue.bias else None
    packed = kernel.pack_weight(w)
    for S in SHAPES:
        x = rng.standard_normal((S, K), dtype=np.float32)
        expected = dense_reference(x.astype(np.float64), w.astype(np.float64), b, epilogue)
        np.testing.assert_allclose(kernel(x, packed, bias=b), expected, atol=_tol(K), rtol=0, err_msg=f"S={S}")


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_with_a_bias_on_the_padded_m_tile(target: dict[str, object], activation: str) -> None:
    epilogue = Epilogue(True, activation)
    kernel = build_ukernel(64, K, 6, 32, 4, target, epilogue=epilogue)
    assert kernel.spec.epilogue == epilogue
    _check(kernel, epilogue, 64)


@pytest.mark.parametrize(
    ("n", "mt", "nt", "epilogue"),
    [
        (64, 1, 16, Epilogue(True, "gelu")),  # mt = 1: the local-cache path
        (40, 3, 16, Epilogue(True, "silu")),  # N padded to 48: zero bias past N, N columns copied out
        (64, 4, 32, Epilogue(False, "gelu_tanh")),  # an activation without a bias
    ],
)
def test_fused_epilogues_on_every_kernel_path(
    target: dict[str, object], n: int, mt: int, nt: int, epilogue: Epilogue
) -> None:
    _check(build_ukernel(n, K, mt, nt, 4, target, epilogue=epilogue), epilogue, n, seed=n + mt)


def test_the_epilogue_is_fused_into_the_store_of_y() -> None:
    """One pass: the block that copies the accumulator out writes the final values; no Y buffer remains."""
    script = schedule_ukernel(64, K, 6, 32, 4, 16, epilogue=Epilogue(True, "gelu"))["main"].script()
    assert "T.reinterpret" in script and "T.erf" not in script and "bias[v1]" in script
    assert 'sblock("Y_epilogue")' not in script and "Y = T.sblock_alloc_buffer" not in script
    assert script.count("Y_epilogue[v0, v1] =") == 1


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_activations_stay_within_float32_rounding_over_the_whole_range(activation: str) -> None:
    """te_exp/te_erf replace libm: checked against float64 definitions from -100 to 100 (both clamp ends)."""
    x = np.concatenate([np.linspace(-100, 100, 20001), np.random.default_rng(0).standard_normal(4000) * 4])
    got = _elementwise(activation, x.astype(np.float32))
    expected = dense_reference(x[:, None], np.ones((1, 1)), None, Epilogue(False, activation))[:, 0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=2e-6)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "silu"])
def test_fused_activations_call_no_scalar_libm(target: dict[str, object], activation: str) -> None:
    """erf, tanh and exp lowered through libm cost one scalar call per output lane (a 3072×768 layer at M = 32:
    2.2–4.1× slower with GELU than without on an Intel Xeon); the epilogue's machine code must call none."""
    kernel = build_ukernel(64, K, 6, 32, 4, target, epilogue=Epilogue(True, activation))
    asm = kernel.module.inspect_source("asm")
    called = {
        name
        for name in ("expf", "erff", "tanhf", "exp", "erf", "tanh")
        if f"call\t{name}" in asm or f"call {name}" in asm or f"{name}@PLT" in asm
    }
    assert not called, f"scalar libm calls in the {activation} epilogue: {sorted(called)}"


def _elementwise(activation: str, x: np.ndarray) -> np.ndarray:
    """te_activation over a vector, vectorised as the uKernel's store loop is."""
    import tvm
    from tvm import te

    from service.tuning.epilogue import te_activation

    n = x.shape[0]
    xs = te.placeholder((n,), name="X")
    ys = te.compute((n,), lambda i: te_activation(xs[i], activation), name="Y")
    sch = tvm.s_tir.Schedule(te.create_prim_func([xs, ys]))
    (loop,) = sch.get_loops(sch.get_sblock("Y"))
    sch.vectorize(sch.split(loop, [None, 16])[1])
    module = tvm.tirx.build(sch.mod, target=tvm.target.Target(dict(tvm_target(host_target()))))
    out = tvm.runtime.tensor(np.empty(n, np.float32))
    module(tvm.runtime.tensor(x), out)
    result: np.ndarray = out.numpy()
    return result


def test_specs_record_the_epilogue_and_read_as_before_without_one(target: dict[str, object]) -> None:
    spec = UKernelSpec(N=64, K=K, mt=6, nt=32, kt=4, vec=16, target=target, bias=True, activation="relu")
    assert UKernelSpec.from_dict(spec.to_dict()) == spec
    plain = UKernelSpec(N=64, K=K, mt=6, nt=32, kt=4, vec=16, target=target)
    assert "bias" not in plain.to_dict() and "activation" not in plain.to_dict()
    assert UKernelSpec.from_dict(plain.to_dict()).epilogue == NO_EPILOGUE


@pytest.mark.parametrize("n", [64, 40])  # aligned rows (the fast path) and N = 40 (padded, checked calls)
def test_the_dispatcher_runs_the_epilogue_on_every_route(target: dict[str, object], n: int) -> None:
    """Multi-piece programs (each piece's rows get the epilogue), a vendor interval and S past the table
    all give act(X·Wᵀ + bias); the bias is required exactly when the table adds one."""
    epilogue = Epilogue(True, "gelu")
    kernels = {
        "a": build_ukernel(n, K, 4, 16, 4, target, epilogue=epilogue),
        "b": build_ukernel(n, K, 3, 16, 4, target, epilogue=epilogue),
    }
    table = DispatchTable(
        (Interval(1, 8, Shape((), "b")), Interval(9, 20, Shape((("a", 2),), "b")), Interval(21, 30, None)),
        {"a": 4, "b": 3},
        epilogue,
    )
    d = Dispatcher(DispatchTable.from_dict(table.to_dict()), kernels, N=n, K=K)
    assert d.epilogue == epilogue
    rng = np.random.default_rng(7)
    w = rng.standard_normal((n, K), dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    for S in (1, 7, 9, 17, 20, 25, 31, 45):
        x = rng.standard_normal((S, K), dtype=np.float32)
        expected = dense_reference(x.astype(np.float64), w.astype(np.float64), b, epilogue)
        np.testing.assert_allclose(d(x, w, bias=b), expected, atol=_tol(K), rtol=0, err_msg=f"S={S}")
        out = np.empty((S, n), np.float32)
        assert d(x, w, out, bias=b) is out
        np.testing.assert_allclose(out, expected, atol=_tol(K), rtol=0)
    assert len(d.program(17)) == 2 and d.program(25) == ()
    with pytest.raises(ValueError, match="bias="):
        d(x, w)
    with pytest.raises(ValueError, match=rf"bias must be \[{n}\]"):
        d(x, w, bias=b[:-1])
    with pytest.raises(ValueError, match="another epilogue"):
        Dispatcher(DispatchTable(table.intervals, table.mts), kernels, N=n, K=K)
    with pytest.raises(ValueError, match="tuned with another bias or activation"):
        Dispatcher(table, kernels, N=n, K=K, epilogue=Epilogue(True, "relu"))


@pytest.mark.parametrize(("n", "nt"), [(64, 16), (80, 32)])  # N = 80 on nt = 32: 96 columns computed
def test_layers_sharing_a_dispatcher_each_get_their_own_bias_from_any_thread(
    target: dict[str, object], n: int, nt: int
) -> None:
    """One dispatcher serves every layer of its workload, each with its own bias, and copies the bias into a buffer
    its calling thread keeps: alternating biases, a bias changed in place, a padded width (zeros past N) and four
    threads calling at once all give each call its own bias."""
    epilogue = Epilogue(True, "none")
    kernel = build_ukernel(n, K, 2, nt, 4, target, epilogue=epilogue)
    assert kernel.spec.n_computed == -(-n // nt) * nt
    d = Dispatcher(DispatchTable((Interval(1, 64, Shape((), "a")),), {"a": 2}, epilogue), {"a": kernel}, N=n, K=K)
    rng = np.random.default_rng(n)
    w = rng.standard_normal((n, K), dtype=np.float32)
    biases = [rng.standard_normal(n, dtype=np.float32) for _ in range(2)]
    x = rng.standard_normal((5, K), dtype=np.float32)

    def check(b: np.ndarray) -> None:
        expected = dense_reference(x.astype(np.float64), w.astype(np.float64), b, epilogue)
        np.testing.assert_allclose(d(x, w, bias=b), expected, atol=_tol(K), rtol=0)

    for b in (*biases, *biases):
        check(b)
    biases[0] += 1.0  # in place, as fine-tuning does: the next call sees it
    check(biases[0])
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: [check(biases[(i + j) % 2]) for j in range(20)], range(4)))


def test_the_fallback_applies_the_epilogue_it_is_given() -> None:
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((5, K), (8, K), (8,)))
    fallback = Dispatcher(None, {}, N=None, K=None, source="fallback", epilogue=Epilogue(True, "silu"))
    np.testing.assert_allclose(fallback(x, w, bias=b), dense_reference(x, w, b, Epilogue(True, "silu")), rtol=1e-6)
    assert fallback.usage()[5].fallbacks == 1
    with pytest.raises(ValueError, match="tuned without a bias"):
        Dispatcher(None, {}, N=None, K=None)(x, w, bias=b)


class _Sink(QuietRangeSink):
    pass


def test_the_range_tuner_fuses_bias_and_gelu_and_times_the_vendor_with_them(tmp_path: Path) -> None:
    attrs: dict[str, int | bool | str] = {"bias": True, "activation": "gelu"}
    workload = WorkloadSpec(op="dense", dims={"N": 64, "K": K}, symbolic=["M"], attrs=attrs)
    task = RangeTask(
        workload=workload,
        s_max=48,
        validate=[48, 13],
        target=host_target(),
        max_ukernels=2,
        work_dir=tmp_path,
        min_repeat_ms=2,
        vendor_routes=False,  # keep every S on uKernels: this layer is small enough for numpy to win
    )
    out = UKernelTuner().tune(task, _Sink())
    assert out.table.epilogue == Epilogue(True, "gelu") and out.table.to_dict()["epilogue"]["activation"] == "gelu"
    assert all(k.spec.epilogue == out.table.epilogue for k in out.kernels.values())
    assert all(a.spec.bias and a.spec.activation == "gelu" for a in out.artifacts.values())
    assert verify(out, workload) is None  # every S ≤ 48 and primes past it, with the bias, against numpy
