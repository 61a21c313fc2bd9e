"""One shape-generic TVM binary per uKernel: dense Y[M,N] = X[M,K]·W[N,K]ᵀ for every M, with a fixed tile.

The recipe is DietCode's padding (../shared/research/tvm.md §1.2), the only one that compiles in
TVM 0.27: `pad_einsum` pads M up to a multiple of mt inside the kernel (padded X rows are zeros, the
write-back to Y is predicated), so the mt×nt accumulator is a constant-size tile LLVM keeps in
registers. Splitting M with a predicate and caching the accumulator instead fails to compile
(CompactBufferAllocation sizes the cache 2^31-1). mt = 1 needs no padding: `pad_einsum` is then a
no-op that creates no blocks, so the accumulator gets an explicit local cache instead.

W is packed once, outside the kernel, to Wp[N/nt, K, nt] so the nt-wide slice a tile reads for one
k is contiguous; the caller pre-packs it with `pack_weight` and reuses it for every call.

Memory: TVM kernels assume 64-byte aligned buffers (their vector loads fault otherwise: handing an
unaligned numpy array to the kernel through `tvm_ffi.from_dlpack` segfaults). Calls here pass numpy
memory zero-copy only when it is aligned and contiguous, and copy otherwise.
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from service.workers.hardware import pin_tvm_threads

ALIGN = 64  # bytes; TVM's default data alignment for buffers
_SUPPORTED_DTYPES = ("float32",)


@dataclass(frozen=True)
class UKernelSpec:
    """Everything that identifies a compiled uKernel: stored next to its artifact."""

    N: int
    K: int
    mt: int
    nt: int
    kt: int
    vec: int
    target: dict[str, Any] = field(hash=False)
    dtype: str = "float32"

    @property
    def packed_weight_shape(self) -> tuple[int, int, int]:
        return (self.N // self.nt, self.K, self.nt)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UKernelSpec:
        return cls(**{**data, "target": dict(data["target"])})


@dataclass(frozen=True)
class UKernelArtifact:
    """A compiled uKernel on disk, named by the sha256 of its bytes (content-addressed)."""

    path: Path
    sha256: str
    spec: UKernelSpec


def aligned_empty(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    count = math.prod(shape)
    buf = np.empty(count * itemsize + ALIGN, dtype=np.uint8)
    offset = -buf.ctypes.data % ALIGN
    out: np.ndarray = buf[offset : offset + count * itemsize].view(dtype).reshape(shape)
    return out


def _is_aligned(a: np.ndarray) -> bool:
    """Whether the kernel may use `a`'s memory as is (numpy refuses DLPack export of read-only arrays)."""
    return bool(a.flags.c_contiguous and a.flags.writeable) and a.ctypes.data % ALIGN == 0


def _tvm() -> Any:
    pin_tvm_threads()  # before TVM's thread pool starts, or it uses half the cores
    import tvm

    return tvm


def dense_symbolic_m(N: int, K: int, dtype: str = "float32") -> Any:
    """Y = X·Wᵀ with M a symbolic var (same math and names as compute.py's dense, which needs an int M)."""
    tvm = _tvm()
    from tvm import te

    m = te.var("M")
    x = te.placeholder((m, K), name="X", dtype=dtype)
    w = te.placeholder((N, K), name="W", dtype=dtype)
    r = te.reduce_axis((0, K), name="k")
    y = te.compute((m, N), lambda i, j: te.sum(x[i, r] * w[j, r], axis=r), name="Y")
    return tvm.IRModule({"main": te.create_prim_func([x, w, y])})


def schedule_ukernel(N: int, K: int, mt: int, nt: int, kt: int, vec: int, dtype: str = "float32") -> Any:
    """The scheduled IRModule (tvm.md §1.2); separate from compilation so tests and tools can inspect it."""
    _check_tile(N, K, mt, nt, kt, vec, dtype)
    _tvm()
    from tvm import s_tir

    sch = s_tir.Schedule(dense_symbolic_m(N, K, dtype))
    blk = sch.get_sblock("Y")
    xpad: Any = None
    if mt > 1:
        sch.pad_einsum(blk, [mt, 1, 1])  # before transform_layout: it needs plain einsum indices
        xpad, ycopy = sch.get_producers(blk)[0], sch.get_consumers(blk)[0]
        sch.set_scope(blk, 0, "local")  # the padded Y tile becomes the register accumulator
    else:
        ycopy = sch.cache_write(blk, 0, "local")
    sch.transform_layout(blk, ("read", 1), lambda n, k: (n // nt, k, n % nt))
    i, j, k = sch.get_loops(blk)
    io, ii = sch.split(i, [None, mt])
    jo, ji = sch.split(j, [None, nt])
    ko, ki = sch.split(k, [None, kt])
    jv_o, jv = sch.split(ji, [None, vec])
    sch.reorder(io, jo, ko, ki, ii, jv_o, jv)
    sch.vectorize(jv)
    for loop in (ii, ki, jv_o):
        sch.unroll(loop)
    sch.reverse_compute_at(ycopy, jo)
    sch.vectorize(sch.split(sch.get_loops(ycopy)[-1], [None, vec])[1])
    tasks = sch.fuse(io, jo)
    sch.parallel(tasks)
    if xpad is not None:
        sch.compute_at(xpad, tasks)  # pad one mt×K X panel per task, not all of X up front
        sch.vectorize(sch.split(sch.get_loops(xpad)[-1], [None, vec])[1])
    sch.decompose_reduction(blk, ko)  # last: vectorize/parallel refuse the decomposed init block
    return sch.mod


def _check_tile(N: int, K: int, mt: int, nt: int, kt: int, vec: int, dtype: str) -> None:
    if dtype not in _SUPPORTED_DTYPES:
        raise ValueError(f"uKernels support {_SUPPORTED_DTYPES}, not {dtype!r}")
    if min(N, K, mt, nt, kt, vec) < 1:
        raise ValueError("sizes and tiles must be positive")
    if N % nt or K % kt or nt % vec:
        raise ValueError(f"need nt | N, kt | K and vec | nt; got N={N} nt={nt} K={K} kt={kt} vec={vec}")


class UKernel:
    """A compiled uKernel: call it on any M with a weight packed by `pack_weight`."""

    def __init__(self, module: Any, spec: UKernelSpec) -> None:
        tvm = _tvm()
        self._tvm = tvm
        self.module = module
        self.spec = spec
        self._fn = module["main"]
        self.device = tvm.cpu()

    def pack_weight(self, w: np.ndarray) -> np.ndarray:
        """W[N, K] → Wp[N/nt, K, nt] (Wp[b, k, c] = W[b·nt + c, k]), 64-byte aligned."""
        s = self.spec
        if w.shape != (s.N, s.K):
            raise ValueError(f"weight must be {(s.N, s.K)}, got {w.shape}")
        out = aligned_empty(s.packed_weight_shape, s.dtype)
        out[...] = w.astype(s.dtype, copy=False).reshape(s.N // s.nt, s.nt, s.K).transpose(0, 2, 1)
        return out

    def _tensor(self, a: np.ndarray) -> Any:
        if _is_aligned(a):
            return self._tvm.runtime.from_dlpack(a)  # zero-copy
        return self._tvm.runtime.tensor(np.ascontiguousarray(a), self.device)

    def __call__(self, x: np.ndarray, packed_w: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Y = X·Wᵀ for X[M, K] with any M ≥ 1. Writes into `out` (an [M, N] array) when given."""
        s = self.spec
        if x.ndim != 2 or x.shape[1] != s.K or x.shape[0] < 1 or x.dtype != np.dtype(s.dtype):
            raise ValueError(f"x must be {s.dtype}[M≥1, {s.K}], got {x.dtype}{list(x.shape)}")
        if packed_w.shape != s.packed_weight_shape or packed_w.dtype != np.dtype(s.dtype):
            raise ValueError(f"packed weight must be {s.dtype}{list(s.packed_weight_shape)}; use pack_weight")
        m = x.shape[0]
        if out is None:
            out = aligned_empty((m, s.N), s.dtype)
        elif out.shape != (m, s.N) or out.dtype != np.dtype(s.dtype):
            raise ValueError(f"out must be {s.dtype}[{m}, {s.N}]")
        if _is_aligned(out):
            self._fn(self._tensor(x), self._tensor(packed_w), self._tvm.runtime.from_dlpack(out))
            return out
        y = self._tvm.runtime.tensor(np.empty((m, s.N), s.dtype), self.device)
        self._fn(self._tensor(x), self._tensor(packed_w), y)
        out[...] = y.numpy()
        return out

    def time(self, M: int, repeat: int = 5, min_repeat_ms: int = 20, seed: int = 0) -> float:
        """Median seconds per call at M rows (TVM's time_evaluator; inputs preallocated, so kernel time only)."""
        s = self.spec
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((M, s.K), dtype=np.float32)
        w = self.pack_weight(rng.standard_normal((s.N, s.K), dtype=np.float32))
        args = [self._tvm.runtime.tensor(a, self.device) for a in (x, w, np.zeros((M, s.N), s.dtype))]
        evaluator = self.module.time_evaluator(
            "main", self.device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms
        )
        return float(np.median(evaluator(*args).results))

    def gflops(self, M: int, seconds: float) -> float:
        return 2.0 * M * self.spec.N * self.spec.K / seconds / 1e9

    def export(self, directory: Path) -> UKernelArtifact:
        """Write the shared library to `directory/<sha256>.so` and return its address."""
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            staging = Path(tmp) / "ukernel.so"
            self.module.export_library(str(staging))
            digest = _sha256(staging)
            final = directory / f"{digest}.so"
            if not final.exists():  # identical bytes already stored: keep the first copy
                shutil.move(str(staging), final)
        return UKernelArtifact(path=final, sha256=digest, spec=self.spec)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build_ukernel(
    N: int,
    K: int,
    mt: int,
    nt: int,
    kt: int,
    target: Mapping[str, Any],
    vec: int | None = None,
    dtype: str = "float32",
) -> UKernel:
    """Compile the uKernel once; the binary is correct for every M.

    `target` is a TVM target dict with `mcpu` (e.g. TargetSpec.tvm_target()). `vec` is the width of the
    innermost vector loop; it defaults to gcd(nt, 16): the AVX-512 fp32 lane count, which LLVM splits
    into two registers on AVX2.
    """
    vec = vec or math.gcd(nt, 16)
    tvm = _tvm()
    mod = schedule_ukernel(N, K, mt, nt, kt, vec, dtype)
    # tirx.build gives a runtime.Module, which exports to a .so (tvm.compile's Executable does not);
    # tvm.driver.build does the same but is deprecated in 0.27.
    module = tvm.tirx.build(mod, target=tvm.target.Target(dict(target)))
    return UKernel(module, UKernelSpec(N=N, K=K, mt=mt, nt=nt, kt=kt, vec=vec, target=dict(target), dtype=dtype))


def load_ukernel(path: Path, spec: UKernelSpec, sha256: str | None = None) -> UKernel:
    """Load an exported uKernel, refusing it when its bytes do not match the recorded sha256."""
    if sha256 is not None and _sha256(path) != sha256:
        raise ValueError(f"{path} does not match its sha256 {sha256}")
    return UKernel(_tvm().runtime.load_module(os.fspath(path)), spec)
