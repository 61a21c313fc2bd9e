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
