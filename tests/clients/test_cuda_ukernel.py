"""The SDK's CUDA dispatcher on a host without a GPU: clear errors, the code path a GPU host takes.

Running kernels is covered by tests/tuning/gpu/test_on_gpu.py, which skips (saying why) without a GPU.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kernelfleet.cuda_ukernel import (
    CudaDispatcher,
    CudaUKernelSpec,
    NoCudaDevice,
    is_cuda_spec,
    require_cuda,
)
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.dispatch_cache import DispatchCache, dispatcher_from_doc
from kernelfleet.models import DispatchDoc, UKernelRef

ROOT = Path(__file__).resolve().parents[2]


def _has_gpu() -> bool:
    try:
        require_cuda()
    except NoCudaDevice:
        return False
    return True


no_gpu_only = pytest.mark.skipif(_has_gpu(), reason="this host has a GPU: the no-GPU error paths do not apply")
TABLE = DispatchTable((Interval(1, 64, Shape((), "u")),), {"u": 8})
SPEC = CudaUKernelSpec(
    N=64, K=32, mt=8, tile={"bm": 8, "bn": 32, "bk": 32, "tm": 1, "tn": 1, "stages": 3}, target={"kind": "cuda"}
)


@no_gpu_only
def test_no_gpu_is_a_clear_error() -> None:
    with pytest.raises(NoCudaDevice, match="no CUDA GPU"):
        require_cuda()
    with pytest.raises(NoCudaDevice, match="GPU inference host"):
        CudaDispatcher(TABLE, {}, N=64, K=32)


def test_no_table_falls_back_to_torch_or_says_what_is_missing() -> None:
    dispatcher = CudaDispatcher(None, {}, N=None, K=None, source="fallback")
    x, w = np.ones((3, 32), np.float32), np.ones((64, 32), np.float32)
    try:
        import torch
    except ImportError:
        with pytest.raises(RuntimeError, match="torch is not installed"):
            dispatcher(x, w)
        return
    y = dispatcher(torch.from_numpy(x), torch.from_numpy(w))  # cuBLAS on a GPU host, torch's CPU BLAS here
    assert tuple(y.shape) == (3, 64) and float(y[0, 0]) == 32.0


def test_spec_round_trip_and_detection() -> None:
    data = SPEC.to_dict()
    assert is_cuda_spec(data) and not is_cuda_spec({"N": 1, "mt": 1, "nt": 1})
    assert CudaUKernelSpec.from_dict(data) == SPEC


@no_gpu_only
def test_sdk_routes_a_cuda_table_to_the_cuda_dispatcher(tmp_path: Path) -> None:
    """A verified CUDA document goes to the CUDA loader, which refuses a host without a GPU by name."""
    doc = DispatchDoc(
        workload_hash="a" * 32,
        target_fingerprint="b" * 32,
        dim="M",
        s_max=64,
        table=TABLE.to_dict(),
        ukernels=[UKernelRef(id="u", sha256="c" * 64, spec=SPEC.to_dict(), size_bytes=1)],
        predicted_latency_s=[1e-6] * 64,
        measured_latency_s={},
        created_at=dt.datetime.now(dt.UTC),
    )
    with pytest.raises(NoCudaDevice, match="no CUDA GPU"):
        dispatcher_from_doc(doc, DispatchCache(tmp_path), "service")


def test_gpu_kernel_path_imports_without_pydantic() -> None:
    """GPU measurement hosts have no pydantic, fastapi, celery or httpx: the kernel path and the benchmark
    must import without them."""
    blocker = (
        "import sys, importlib.abc\n"
        "class B(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('pydantic', 'pydantic_core', 'fastapi', 'celery', 'sqlalchemy', 'httpx'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, B())\n"
        "import kernelfleet.cuda_ukernel, service.tuning.gpu, service.tuning.cublas\n"
        "import service.tuning.tuners.pipeline.schedule, service.tuning.tuners.ukernel.gpu_rules\n"
        "import service.tuning.tuners.ukernel.gpu_tuner\n"
        "sys.path.insert(0, 'bench'); import gpu_dynamic_bert, gpu_report\n"
        "print('ok')\n"
    )
    env_path = f"{ROOT}:{ROOT / 'clients' / 'python'}"
    done = subprocess.run(
        [sys.executable, "-c", blocker],
        cwd=ROOT,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


class FakeGPUKernel:
    """Stands in for a compiled CUDA uKernel on a host that has no GPU (the dispatcher's bookkeeping only)."""

    def __init__(self) -> None:
        self.launches = 0
        self.spec = CudaUKernelSpec(N=64, K=32, mt=8, tile={}, target={})  # float32, as the dispatcher reads it

    def launch(self, x: object, w: object, out: object) -> None:
        self.launches += 1


def test_an_empty_batch_gives_an_empty_result_of_the_input_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    """S = 0 (an empty batch) used to raise KeyError in the table lookup; F.linear returns [0, N]."""
    import kernelfleet.cuda_ukernel as cu

    monkeypatch.setattr(cu, "require_cuda", lambda: None)  # the fake kernel needs no GPU
    kernel = FakeGPUKernel()
    dispatcher = CudaDispatcher(TABLE, {"u": kernel}, N=64, K=32)  # type: ignore[dict-item]
    y = dispatcher(np.ones((0, 32), np.float32), np.ones((64, 32), np.float32))
    assert isinstance(y, np.ndarray) and y.shape == (0, 64) and y.dtype == np.float32
    assert kernel.launches == 0 and dispatcher.calls == {0: 1}


def test_timing_rounds_last_their_minimum_and_weights_outgrow_the_l2() -> None:
    from kernelfleet.cuda_ukernel import repeated_median, weight_copies

    rounds: list[int] = []

    def sample() -> list[float]:
        rounds.append(1)
        return [1.0] if len(rounds) % 2 else [3.0]

    # each round draws samples for at least 20 ms of wall time, not a fixed few launches
    assert repeated_median(sample, repeat=3, min_repeat_ms=20) in (1.0, 2.0, 3.0)
    assert len(rounds) > 3
    # a 7 MB W against a 50 MB L2: 15 copies, twice the L2 together; no L2 model: the one W
    assert weight_copies(2304 * 768 * 4, 50 * 2**20) == 15
    assert weight_copies(2304 * 768 * 4, 0) == 1 and weight_copies(10**9, 2**20) == 2


def test_vendor_calls_answer_in_the_callers_kind() -> None:
    """A vendor-routed call on numpy arrays returns numpy (it returned a torch tensor), into `out` when given."""
    pytest.importorskip("torch")
    dispatcher = CudaDispatcher(None, {}, N=None, K=None, source="fallback")
    x, w = np.ones((3, 32), np.float32), np.ones((64, 32), np.float32)
    y = dispatcher(x, w)
    assert isinstance(y, np.ndarray) and y.shape == (3, 64) and float(y[0, 0]) == 32.0
    out = np.zeros((3, 64), np.float32)
    assert dispatcher(x, w, out) is out and float(out[2, 63]) == 32.0


class FakeTorchCudaTensor:
    """Stands in for a torch CUDA tensor (no GPU here): shape, dtype, device and row views, nothing else."""

    __module__ = "torch"
    dtype = "torch.float32"  # as str(torch.float32) reads

    def __init__(self, rows: int, cols: int) -> None:
        self.shape = (rows, cols)
        self.device = type("Device", (), {"index": 0})()
        self.is_cuda = True

    def narrow(self, dim: int, start: int, length: int) -> FakeTorchCudaTensor:
        return FakeTorchCudaTensor(length, self.shape[1])

    def new_empty(self, shape: tuple[int, int]) -> FakeTorchCudaTensor:
        return FakeTorchCudaTensor(*shape)


class StreamRecordingKernel(FakeGPUKernel):
    def __init__(self) -> None:
        super().__init__()
        self.streams: list[int] = []

    def launch(self, x: object, w: object, out: object) -> None:
        import tvm_ffi

        super().launch(x, w, out)
        self.streams.append(int(tvm_ffi.get_raw_stream(tvm_ffi.device("cuda", 0))))


def test_kernels_launch_on_the_stream_torch_is_using(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every piece is launched with TVM's stream set to the caller's torch stream (they went to the null stream,
    racing a host under torch.cuda.stream(s) and breaking CUDA-graph capture). The GPU test checks it on a
    real non-default stream and under capture."""
    import kernelfleet.cuda_ukernel as cu

    monkeypatch.setattr(cu, "require_cuda", lambda: None)
    monkeypatch.setattr(cu, "_torch_stream", lambda x: 0xC0FFEE if isinstance(x, FakeTorchCudaTensor) else None)
    kernel = StreamRecordingKernel()
    table = DispatchTable((Interval(1, 64, Shape((("u", 1),), "u")),), {"u": 8})  # 8 rows + the rest
    dispatcher = CudaDispatcher(table, {"u": kernel}, N=64, K=32)  # type: ignore[dict-item]
    dispatcher(FakeTorchCudaTensor(12, 32), FakeTorchCudaTensor(64, 32))
    assert kernel.launches == len(dispatcher.program(12)) == 2
    assert kernel.streams == [0xC0FFEE] * kernel.launches


def test_a_half_precision_cuda_layer_asks_for_its_dtypes_table_and_runs_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`accelerate` looks a CUDA layer's table up as a workload in the layer's own float16 / bfloat16 (GPU ukernel
    jobs tune those); a CPU layer's stays float32 (CPU uKernels are). The layer takes calls in its table's dtype:
    a float16 call on a float16 table passes the dtype check (here it then falls back for the device only: no GPU),
    a float32 call falls back for its dtype."""
    import torch

    import kernelfleet.cuda_ukernel as cu
    from kernelfleet.torch import AcceleratedLinear, dense_workload, table_dtype, workload_hash
    from kernelfleet.torch_fusion import dense_layer

    half, brain = torch.nn.Linear(32, 64).half(), torch.nn.Linear(32, 64).bfloat16()
    assert table_dtype(half, "cuda") == "float16" and table_dtype(brain, "cuda") == "bfloat16"
    assert table_dtype(half, "llvm") == "float32" and table_dtype(torch.nn.Linear(32, 64), "cuda") == "float32"
    hashes = {workload_hash(dense_workload(64, 32, dtype=d)) for d in ("float32", "float16", "bfloat16")}
    assert len(hashes) == 3  # three workloads, three tables
    monkeypatch.setattr(cu, "require_cuda", lambda: None)
    kernel = FakeGPUKernel()
    kernel.spec = CudaUKernelSpec(N=64, K=32, mt=8, tile={}, target={}, dtype="float16")
    dispatcher = CudaDispatcher(TABLE, {"u": kernel}, N=64, K=32)  # type: ignore[dict-item]
    dense = dense_layer(half)
    assert dense is not None
    layer = AcceleratedLinear("l", half, dense, dispatcher, "w", fused_bias=False, activation=None, max_rows=64)
    with torch.inference_mode():
        layer(torch.randn(3, 32, dtype=torch.float16))
        layer.float()  # the layer now computes in float32: not its table's dtype
        layer(torch.randn(3, 32))
    assert dict(layer.stats.reasons) == {"device": 1, "dtype": 1}, layer.stats.as_dict()
