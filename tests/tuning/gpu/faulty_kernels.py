"""Kernels that go wrong on purpose, for the isolation tests on a GPU (tests/tuning/gpu/test_on_gpu.py).

Module-level functions: the measuring child process imports them by name. `fault` writes 4 GiB past a
one-element buffer (an illegal address: a sticky error that poisons the CUDA context); `hang` spins on
clock64() for about 10 minutes (clock64 is volatile, so the loop is not optimised away).
"""

from __future__ import annotations

from typing import Any


def build(func: Any, arch: str | None = None) -> Any:
    import tvm

    arch = arch or "sm_" + tvm.cuda(0).compute_version.replace(".", "")
    return tvm.tirx.build(tvm.IRModule({"main": func}), target=tvm.target.Target({"kind": "cuda", "arch": arch}))


def faulting() -> Any:
    from tvm.script import tirx as T

    @T.prim_func
    def fault(a: T.handle, n: T.int32) -> None:
        A = T.match_buffer(a, (1,), "float32")
        for bx in T.thread_binding(1, thread="blockIdx.x"):
            for tx in T.thread_binding(1, thread="threadIdx.x"):
                A[n + bx + tx] = T.float32(1)

    return fault


def hanging() -> Any:
    from tvm.script import tirx as T

    @T.prim_func
    def hang(a: T.handle) -> None:
        A = T.match_buffer(a, (1,), "int64")
        for _bx in T.thread_binding(1, thread="blockIdx.x"):
            for _tx in T.thread_binding(1, thread="threadIdx.x"):
                A[0] = T.call_extern("int64", "clock64")
                while T.call_extern("int64", "clock64") - A[0] < T.int64(1000000000000):
                    T.evaluate(0)

    return hang


def run_faulting_kernel() -> None:
    import numpy as np
    import tvm

    dev = tvm.cuda(0)
    buf = tvm.runtime.tensor(np.zeros(1, "float32"), dev)
    build(faulting())["main"](buf, 1 << 30)
    dev.sync()  # the fault surfaces here


def run_hanging_kernel() -> None:
    import numpy as np
    import tvm

    dev = tvm.cuda(0)
    buf = tvm.runtime.tensor(np.zeros(1, "int64"), dev)
    build(hanging())["main"](buf)
    dev.sync()


def sum_on_gpu() -> float:
    import numpy as np
    import tvm

    return float(tvm.runtime.tensor(np.ones(4, "float32"), tvm.cuda(0)).numpy().sum())
