"""Compile uKernels: one shape-generic TVM binary per tile for dense Y[M,N] = X[M,K]·W[N,K]ᵀ, every M.

The recipe is DietCode's padding (../shared/research/tvm.md §1.2), the only one that compiles in
TVM 0.27: `pad_einsum` pads M up to a multiple of mt inside the kernel (padded X rows are zeros, the
write-back to Y is predicated), so the mt×nt accumulator is a constant-size tile LLVM keeps in
registers. Splitting M with a predicate and caching the accumulator instead fails to compile
(CompactBufferAllocation sizes the cache 2^31-1). mt = 1 needs no padding: `pad_einsum` is then a
no-op that creates no blocks, so the accumulator gets an explicit local cache instead.

The weight is read pre-packed as Wp[N/nt, K, nt] (see kernelfleet.ukernel, which loads and runs
the compiled binaries on inference hosts without compiling).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kernelfleet.epilogue import NO_EPILOGUE, Epilogue
from kernelfleet.tvm_runtime import ALIGN, aligned_empty, import_tvm
from kernelfleet.ukernel import (
    SUPPORTED_DTYPES,
    UKernel,
    UKernelArtifact,
    UKernelSpec,
    load_ukernel,
    sha256_file,
)
from service.tuning.epilogue import te_epilogue

__all__ = [
    "ALIGN",
    "UKernel",
    "UKernelArtifact",
    "UKernelSpec",
    "aligned_empty",
    "build_ukernel",
    "dense_symbolic_m",
    "load_ukernel",
    "schedule_ukernel",
    "sha256_file",
]


def dense_symbolic_m(N: int, K: int, dtype: str = "float32", epilogue: Epilogue = NO_EPILOGUE) -> Any:
    """Y = act(X·Wᵀ + bias) with M a symbolic var (same math and names as compute.py's dense, which needs an
    int M); the parameters are (X, W, Y), or (X, W, bias, Y) when the epilogue adds a bias."""
    tvm = import_tvm()
    from tvm import te

    m = te.var("M")
    x = te.placeholder((m, K), name="X", dtype=dtype)
    w = te.placeholder((N, K), name="W", dtype=dtype)
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((m, N), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="Y")
    out, bias = te_epilogue(y, N, epilogue, dtype, EPILOGUE_BLOCK)
    return tvm.IRModule({"main": te.create_prim_func([x, w, out] if bias is None else [x, w, bias, out])})


EPILOGUE_BLOCK = "Y_epilogue"


def schedule_ukernel(
    N: int, K: int, mt: int, nt: int, kt: int, vec: int, dtype: str = "float32", epilogue: Epilogue = NO_EPILOGUE
) -> Any:
    """The scheduled IRModule (tvm.md §1.2); separate from compilation so tests and tools can inspect it.

    An epilogue (bias, activation) is inlined into the block that copies the accumulator tile out to Y, so
    each output element is written once, already final: no second pass over Y.
    """
    _check_tile(N, K, mt, nt, kt, vec, dtype)
    import_tvm()
    from tvm import s_tir

    sch = s_tir.Schedule(dense_symbolic_m(N, K, dtype, epilogue))
    blk = sch.get_sblock("Y")
    xpad: Any = None
    if mt > 1:
        sch.pad_einsum(blk, [mt, 1, 1])  # before transform_layout: it needs plain einsum indices
        xpad, ycopy = sch.get_producers(blk)[0], sch.get_consumers(blk)[0]
        sch.set_scope(blk, 0, "local")  # the padded Y tile becomes the register accumulator
    else:
        ycopy = sch.cache_write(blk, 0, "local")
    if not epilogue.trivial:
        # ycopy writes the intermediate Y; the epilogue stage reads it once per element: fold it into ycopy
        sch.reverse_compute_inline(sch.get_sblock(EPILOGUE_BLOCK))
    sch.transform_layout(blk, ("read", 1), lambda n, k: (n // nt, k, n % nt))
    i, j, k = sch.get_loops(blk)
    io, ii = sch.split(i, [None, mt])
    jo, ji = sch.split(j, [None, nt])
    ko, ki = sch.split(k, [None, kt])
    jv_o, jv = sch.split(ji, [None, vec])
    sch.reorder(jo, io, ko, ki, ii, jv_o, jv)
    sch.vectorize(jv)
    for loop in (ii, ki, jv_o):
        sch.unroll(loop)
    sch.reverse_compute_at(ycopy, io)
    sch.vectorize(sch.split(sch.get_loops(ycopy)[-1], [None, vec])[1])
    tasks = sch.fuse(jo, io)
    sch.parallel(tasks)
    if xpad is not None:
        # X is padded once, whole, before the tiles run, its rows split over the cores. Padding inside each task
        # (compute_at) redid it for every N-tile, into the one shared padded buffer (N/nt copies of X): 3-6 % of
        # a BERT FFN GEMM at M = 8..64 on one thread (AMD EPYC Zen 4; docs/results.md "Issue 33, round 6").
        rows, cols = sch.get_loops(xpad)
        sch.vectorize(sch.split(cols, [None, vec])[1])
        sch.parallel(rows)
    sch.decompose_reduction(blk, ko)  # last: vectorize/parallel refuse the decomposed init block
    return sch.mod


def _check_tile(N: int, K: int, mt: int, nt: int, kt: int, vec: int, dtype: str) -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"uKernels support {SUPPORTED_DTYPES}, not {dtype!r}")
    if min(N, K, mt, nt, kt, vec) < 1:
        raise ValueError("sizes and tiles must be positive")
    if N % nt or K % kt or nt % vec:
        raise ValueError(f"need nt | N, kt | K and vec | nt; got N={N} nt={nt} K={K} kt={kt} vec={vec}")


def build_ukernel(
    N: int,
    K: int,
    mt: int,
    nt: int,
    kt: int,
    target: Mapping[str, Any],
    vec: int | None = None,
    dtype: str = "float32",
    epilogue: Epilogue = NO_EPILOGUE,
) -> UKernel:
    """Compile the uKernel once; the binary is correct for every M (and any N: see n_padded).

    `target` is a TVM target dict with `mcpu` (e.g. `service.tuning.platforms.tvm_target(target)`). `vec` is
    the width of the innermost vector loop; it defaults to gcd(nt, 16): the AVX-512 fp32 lane count, which LLVM splits
    into two registers on AVX2.
    """
    vec = vec or math.gcd(nt, 16)
    tvm = import_tvm()
    # N that nt does not divide is padded, like M: the binary computes n_padded columns over a packed
    # weight with zero rows past N (kernelfleet.ukernel packs it and copies the N real columns out)
    n_padded = -(-N // nt) * nt
    mod = schedule_ukernel(n_padded, K, mt, nt, kt, vec, dtype, epilogue)
    # tirx.build gives a runtime.Module, which exports to a .so (tvm.compile's Executable does not);
    # tvm.driver.build does the same but is deprecated in 0.27.
    module = tvm.tirx.build(mod, target=tvm.target.Target(dict(target)))
    spec = UKernelSpec(
        N=N,
        K=K,
        mt=mt,
        nt=nt,
        kt=kt,
        vec=vec,
        target=dict(target),
        dtype=dtype,
        n_padded=0 if n_padded == N else n_padded,
        bias=epilogue.bias,
        activation=epilogue.activation,
    )
    return UKernel(module, spec)
