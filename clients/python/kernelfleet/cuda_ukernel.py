"""CUDA uKernels and their dispatcher on a GPU inference host: device tensors in, a device tensor out.

A CUDA uKernel is a pipelined tiled GEMM Y[M,N] = X[M,K]·W[N,K]ᵀ compiled once over a symbolic M by a
KernelFleet GPU worker (service/tuning/tuners/pipeline/schedule.py) and shipped as a shared library
with its device code (fatbin), named by the sha256 of its bytes. W is used as the host holds it (no
packing). `CudaDispatcher` runs the dispatch table's program for S = X.shape[0]: each piece is a row
view of X and of the output (DLPack views, no copies), so torch CUDA tensors or anything exporting
DLPack go in and a tensor of the same kind comes out.

Needs TVM's runtime with CUDA enabled and a GPU; without one every entry point raises `NoCudaDevice`
saying why. Importable without pydantic, httpx or torch (GPU measurement hosts lack pydantic).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.dispatch import DispatchTable, Piece

PLATFORM = "cuda"


class NoCudaDevice(RuntimeError):
    """This host cannot run CUDA uKernels (no TVM CUDA runtime, no driver, or no GPU)."""


def require_cuda() -> Any:
    """TVM, when it can run kernels on GPU 0 here; NoCudaDevice naming what is missing otherwise."""
    try:
        import tvm
    except ImportError:
        raise NoCudaDevice("CUDA uKernels need TVM's runtime: pip install 'kernelfleet[tvm]'") from None
    if not tvm.runtime.enabled("cuda"):
        raise NoCudaDevice(
            "this host has no CUDA GPU: TVM's CUDA runtime is disabled (no NVIDIA driver, libcuda.so.1 not "
            "found); run CUDA dispatchers on the GPU inference host"
        )
    if not tvm.cuda(0).exist:
        raise NoCudaDevice("the NVIDIA driver is present but reports no CUDA GPU (check CUDA_VISIBLE_DEVICES)")
    return tvm


@dataclass(frozen=True)
class CudaUKernelSpec:
    """Everything that identifies a compiled CUDA uKernel; stored next to its artifact."""

    N: int
    K: int
    mt: int  # rows per thread block (the block tile bm): the dispatch table's M-tile
    tile: dict[str, Any] = field(hash=False)  # bm, bn, bk, tm, tn, stages, async_copy, split_k
    target: dict[str, Any] = field(hash=False)
    dtype: str = "float32"
    fatbin_sha256: str = ""  # the device code nvcc produced, stored as its own artifact too
    platform: str = PLATFORM

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CudaUKernelSpec:
        return cls(**{**data, "tile": dict(data["tile"]), "target": dict(data["target"])})


def is_cuda_spec(spec: Mapping[str, Any]) -> bool:
    return spec.get("platform") == PLATFORM


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _rows(t: Any, start: int, rows: int) -> Any:
    """Rows start..start+rows of a 2-D tensor as a view (no copy): torch `narrow`, TVM `_create_view`."""
    if hasattr(t, "narrow"):
        return t.narrow(0, start, rows)
    cols = int(t.shape[1])
    itemsize = {"float32": 4, "float16": 2}[str(t.dtype)]
    return t._create_view((rows, cols), relative_byte_offset=start * cols * itemsize)


def _from_dlpack(a: Any) -> Any:
    """A zero-copy TVM view of a DLPack tensor. The kernels' widest access is a 16-byte cp.async / float4,
    so 16-byte alignment is what they need; TVM's own from_dlpack insists on 64, which the row views of
    later pieces (start·K·4 bytes in) need not meet. K and N are multiples of 4 for every uKernel
    (bk | K, bn | N with bk, bn multiples of the 16-byte vector), so every row view is 16-byte aligned."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(a, require_alignment=16, require_contiguous=True)


class CudaUKernel:
    """A compiled CUDA uKernel: `kernel(x, w, out)` on device tensors, any M ≥ 1."""

    def __init__(self, module: Any, spec: CudaUKernelSpec) -> None:
        self.module = module
        self.spec = spec
        self._fn = module["main"]

    def __call__(self, x: Any, w: Any, out: Any) -> Any:
        tvm = require_cuda()
        self._fn(*(a if isinstance(a, tvm.runtime.Tensor) else _from_dlpack(a) for a in (x, w, out)))
        return out

    def time(self, M: int, repeat: int = 5, number: int = 50, seed: int = 0) -> float:
        """Median seconds per launch at M rows (TVM's time_evaluator: a C++ loop, device-synchronised)."""
        import numpy as np

        tvm = require_cuda()
        dev = tvm.cuda(0)
        rng = np.random.default_rng(seed)
        s = self.spec
        args = [
            tvm.runtime.tensor(rng.standard_normal(shape, dtype=np.float32).astype(s.dtype), dev)
            for shape in ((M, s.K), (s.N, s.K), (M, s.N))
        ]
        evaluator = self.module.time_evaluator("main", dev, number=number, repeat=repeat)
        return float(np.median(evaluator(*args).results))

    def export(self, directory: Path) -> tuple[Path, str]:
        """Write the library (host code + embedded device code) to `directory/<sha256>.so`; (path, sha256)."""
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            staging = Path(tmp) / "ukernel.so"
            self.module.export_library(str(staging))
            digest = sha256_bytes(staging.read_bytes())
            final = directory / f"{digest}.so"
            if not final.exists():
                shutil.move(str(staging), final)
        return final, digest


def load_cuda_ukernel(path: Path, spec: CudaUKernelSpec, sha256: str | None = None) -> CudaUKernel:
    """Load an exported CUDA uKernel, refusing bytes that do not match the recorded sha256."""
    if sha256 is not None and sha256_bytes(path.read_bytes()) != sha256:
        raise ValueError(f"{path} does not match its sha256 {sha256}")
    tvm = require_cuda()
    return CudaUKernel(tvm.runtime.load_module(os.fspath(path)), spec)


class CudaDispatcher:
    """Y = X·Wᵀ for any number of rows S on the GPU, with the program the dispatch table chose for S.

    `x` [S, K] and `w` [N, K] are device tensors (torch CUDA tensors, TVM tensors, or anything with
    DLPack); the result is a new device tensor of the same kind (or `out`, when given). Host numpy
    arrays are accepted for convenience and copied to the GPU once per call. With no table, and for the
    S the table routes to the vendor (the tuner measured cuBLAS faster there), the call goes to cuBLAS
    through torch; without torch those calls raise saying so.
    """

    def __init__(
        self,
        table: DispatchTable | None,
        kernels: Mapping[str, CudaUKernel],
        *,
        N: int | None,
        K: int | None,
        source: str = "local",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if table is not None:
            require_cuda()
            missing = set(table.mts) - set(kernels)
            if missing:
                raise ValueError(f"the dispatch table uses uKernels that were not loaded: {sorted(missing)}")
        self.table = table
        self.kernels = dict(kernels)
        self.N, self.K = N, K
        self.source = source
        self.meta = dict(meta or {})
        self._programs: dict[int, tuple[Piece, ...]] = {}
        self.calls: dict[int, int] = {}

    def routes_to_vendor(self, S: int) -> bool:
        """Whether S goes to cuBLAS: no table, or the table's vendor interval (the tuner measured it faster)."""
        return self.table is None or self.table.vendor_at(S)

    def program(self, S: int) -> tuple[Piece, ...]:
        if self.table is None:
            return ()
        found = self._programs.get(S)
        if found is None:
            found = self._programs[S] = self.table.lookup(S)
        return found

    def __call__(self, x: Any, w: Any, out: Any = None) -> Any:
        S = int(x.shape[0])
        self.calls[S] = self.calls.get(S, 0) + 1
        if self.routes_to_vendor(S):
            return _vendor(x, w, out)
        x, w, host = _on_device(x), _on_device(w), _is_numpy(x)
        if tuple(int(d) for d in x.shape[1:]) != (self.K,) or tuple(int(d) for d in w.shape) != (self.N, self.K):
            raise ValueError(f"expected x[S, {self.K}] and w[{self.N}, {self.K}], got {x.shape} and {w.shape}")
        if out is None:
            out = _empty_like(x, (S, int(self.N or 0)))
        start = 0
        for piece in self.program(S):
            self.kernels[piece.ukernel_id](_rows(x, start, piece.rows), w, _rows(out, start, piece.rows))
            start += piece.rows
        return out.numpy() if host else out

    def time_called(self, S: int, calls: int = 50) -> float:
        """Median seconds per call at S rows as a GPU host calls it: device tensors, back to back, synchronised."""
        tvm = require_cuda()
        dev = tvm.cuda(0)
        import numpy as np

        rng = np.random.default_rng(0)
        n, k = self.N or 1, self.K or 1
        x = tvm.runtime.tensor(rng.standard_normal((S, k), dtype=np.float32), dev)
        w = tvm.runtime.tensor(rng.standard_normal((n, k), dtype=np.float32), dev)
        out = tvm.runtime.empty((S, n), "float32", dev)
        self(x, w, out)
        dev.sync()
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                self(x, w, out)
            dev.sync()
            samples.append((time.perf_counter() - start) / calls)
        return statistics.median(samples)

    def overhead(self, S: int = 1, repeat: int = 200) -> float:
        """Seconds a call costs beyond its kernels: table lookup, DLPack views, launches (device-synchronised)."""
        kernels = sum(self.kernels[p.ukernel_id].time(p.rows, repeat=3, number=20) for p in self.program(S))
        return max(0.0, self.time_called(S, repeat) - kernels)


def _is_numpy(a: Any) -> bool:
    return type(a).__module__ == "numpy"


def _on_device(a: Any) -> Any:
    if not _is_numpy(a):
        return a
    tvm = require_cuda()
    return tvm.runtime.tensor(a, tvm.cuda(0))


def _empty_like(x: Any, shape: tuple[int, int]) -> Any:
    if hasattr(x, "new_empty"):  # torch: same device and dtype, caching allocator
        return x.new_empty(shape)
    tvm = require_cuda()
    return tvm.runtime.empty(shape, str(x.dtype), x.device)


def _vendor(x: Any, w: Any, out: Any) -> Any:
    """No table: cuBLAS through torch when torch is here, else a clear error."""
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "this call goes to cuBLAS (no dispatch table, or the table routes this S to the vendor) and torch "
            "is not installed: pip install torch"
        ) from None
    tx = x if isinstance(x, torch.Tensor) else torch.from_dlpack(x)
    tw = w if isinstance(w, torch.Tensor) else torch.from_dlpack(w)
    y = torch.nn.functional.linear(tx, tw)
    if out is not None:
        (out if isinstance(out, torch.Tensor) else torch.from_dlpack(out)).copy_(y)
        return out
    return y
