"""Compile batch_matmul uKernels: C[B,M,N] = A[B,M,K]·Bt[B,N,K]ᵀ, one binary per (mt, nt, kt) tile, shape-generic
in B and in whichever of M, N, K the workload leaves symbolic (the reduction dim K included).

The binary works in whole tiles only (kernelfleet.bmm_ukernel pads M, N, K with zeros on the host, which is
exact): its buffers are A[B, Mo, mt, Ko, kt], Btp[B, No, Ko, kt, nt] and C[B, Mo, mt, No, nt] with B, Mo, No,
Ko plain symbolic vars (or constants where the dim is static), so no loop needs a predicate and the mt×nt
accumulator is a constant-size register tile, as in the dense uKernels (kernel.py). (B × M-tile × N-tile)
tasks run in parallel; each reduces over K in kt steps with kt, the mt rows and the nt/vec vectors unrolled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kernelfleet.bmm_ukernel import BmmSpec, BmmUKernel
from kernelfleet.tvm_runtime import import_tvm


def _tiles(size: int, tile: int, name: str) -> Any:
    from tvm import te

    if not size:
        return te.var(name)
    if size % tile:
        raise ValueError(f"a static dim must be a multiple of its tile: {size} % {tile}")
    return size // tile


def bmm_tiled(spec: BmmSpec) -> Any:
    """The tiled compute as an IRModule; parameters (A, Btp, C)."""
    tvm = import_tvm()
    from tvm import te

    mt, nt, kt = spec.mt, spec.nt, spec.kt
    b = te.var("B")
    mo = _tiles(spec.M, mt, "Mo")
    no = _tiles(spec.N, nt, "No")
    ko = _tiles(spec.K, kt, "Ko")
    a = te.placeholder((b, mo, mt, ko, kt), name="A", dtype=spec.dtype)
    bp = te.placeholder((b, no, ko, kt, nt), name="Btp", dtype=spec.dtype)
    r1 = te.reduce_axis((0, ko), name="ko")
    r2 = te.reduce_axis((0, kt), name="ki")
    c = te.compute(
        (b, mo, mt, no, nt),
        lambda z, i, ii, j, jj: te.sum(a[z, i, ii, r1, r2] * bp[z, j, r1, r2, jj], axis=[r1, r2]),
        name="C",
    )
    return tvm.IRModule({"main": te.create_prim_func([a, bp, c])})


def schedule_bmm(spec: BmmSpec) -> Any:
    import_tvm()
    from tvm import s_tir

    if spec.nt % spec.vec:
        raise ValueError(f"vec must divide nt; got nt={spec.nt} vec={spec.vec}")
    sch = s_tir.Schedule(bmm_tiled(spec))
    blk = sch.get_sblock("C")
    ccopy = sch.cache_write(blk, 0, "local")
    z, i, ii, j, jj, k1, k2 = sch.get_loops(blk)
    sch.reorder(z, i, j, k1, k2, ii, jj)
    jv_o, jv = sch.split(jj, [None, spec.vec])
    sch.vectorize(jv)
    for loop in (ii, k2, jv_o):
        sch.unroll(loop)
    sch.reverse_compute_at(ccopy, j)
    sch.vectorize(sch.split(sch.get_loops(ccopy)[-1], [None, spec.vec])[1])
    sch.parallel(sch.fuse(z, i, j))
    sch.decompose_reduction(blk, k1)
    return sch.mod


def build_bmm_ukernel(
    mt: int,
    nt: int,
    kt: int,
    target: Mapping[str, Any],
    *,
    M: int = 0,
    N: int = 0,
    K: int = 0,
    vec: int | None = None,
    dtype: str = "float32",
) -> BmmUKernel:
    """Compile once; M, N, K left 0 are symbolic (B always is). `vec` defaults to gcd(nt, 16)."""
    spec = BmmSpec(mt=mt, nt=nt, kt=kt, vec=vec or math.gcd(nt, 16), target=dict(target), M=M, N=N, K=K, dtype=dtype)
    tvm = import_tvm()
    module = tvm.tirx.build(schedule_bmm(spec), target=tvm.target.Target(dict(target)))
    return BmmUKernel(module, spec)
