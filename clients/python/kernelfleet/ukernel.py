"""Run uKernels: shape-generic compiled dense kernels Y[M,N] = X[M,K]·W[N,K]ᵀ, correct for every M.

A uKernel is compiled once by a KernelFleet worker (service/tuning/tuners/ukernel/kernel.py) and
shipped as a shared library named by the sha256 of its bytes. This module loads and calls such
libraries; it needs TVM's runtime (`pip install 'kernelfleet[tvm]'`) but never compiles anything.

W is packed once, outside the kernel, to Wp[Np/nt, K, nt] so the nt-wide slice a tile reads for one
k is contiguous; `UKernel.pack_weight` does it and callers reuse the packed weight for every call.
Np is N rounded up to a multiple of nt: when no vector-aligned nt divides N (N = 1000 with 16-lane
vectors), the packed weight carries zero rows, the kernel computes Np columns into a scratch tile and
the first N are copied out (M is padded inside the kernel in the same spirit, see kernel.py).

A uKernel may carry an epilogue (kernelfleet.epilogue: + bias[N], then relu/gelu/gelu_tanh/silu) compiled
into its store of Y: its spec says which, and a kernel with a bias takes the bias as its third argument,
packed like the weight (`pack_bias`: Np long, zeros past N, 64-byte aligned).

Memory: TVM kernels assume 64-byte aligned buffers (their vector loads fault otherwise: handing an
unaligned numpy array to the kernel through `from_dlpack` segfaults). Calls pass numpy memory
zero-copy only when it is aligned and contiguous, and copy otherwise.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernelfleet.epilogue import NO_EPILOGUE, Epilogue, check_bias
from kernelfleet.tvm_runtime import aligned_empty, import_tvm, is_aligned

SUPPORTED_DTYPES = ("float32",)


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
    n_padded: int = 0  # the N the binary computes (a multiple of nt); 0: N itself (specs from before padding)
    bias: bool = False  # the binary adds bias[N] (its third argument) before the activation
    activation: str = "none"  # kernelfleet.epilogue.ACTIVATIONS, applied in the kernel's store

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue(self.bias, self.activation)

    @property
    def n_computed(self) -> int:
        """Columns the binary computes: N, or N padded up to a multiple of nt."""
        return self.n_padded or self.N

    @property
    def padded(self) -> bool:
        return self.n_computed != self.N

    @property
    def packed_weight_shape(self) -> tuple[int, int, int]:
        return (self.n_computed // self.nt, self.K, self.nt)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.epilogue == NO_EPILOGUE:  # specs without an epilogue read as they did before epilogues
            del data["bias"], data["activation"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UKernelSpec:
        return cls(**{**data, "target": dict(data["target"])})


@dataclass(frozen=True)
class UKernelArtifact:
    """A compiled uKernel on disk, named by the sha256 of its bytes (content-addressed)."""

    path: Path
    sha256: str
    spec: UKernelSpec


class UKernel:
    """A compiled uKernel: call it on any M with a weight packed by `pack_weight`."""

    def __init__(self, module: Any, spec: UKernelSpec) -> None:
        tvm = import_tvm()
        self._tvm = tvm
        self.module = module
        self.spec = spec
        self._fn = module["main"]
        self.device = tvm.cpu()

    def pack_weight(self, w: np.ndarray) -> np.ndarray:
        """W[N, K] → Wp[Np/nt, K, nt] (Wp[b, k, c] = W[b·nt + c, k], zero for rows ≥ N), 64-byte aligned."""
        s = self.spec
        if w.shape != (s.N, s.K):
            raise ValueError(f"weight must be {(s.N, s.K)}, got {w.shape}")
        out = aligned_empty(s.packed_weight_shape, s.dtype)
        rows = w.astype(s.dtype, copy=False)
        if s.padded:
            rows = np.concatenate([rows, np.zeros((s.n_computed - s.N, s.K), s.dtype)])
        out[...] = rows.reshape(s.n_computed // s.nt, s.nt, s.K).transpose(0, 2, 1)
        return out

    def pack_bias(self, bias: np.ndarray) -> np.ndarray:
        """bias[N] → the kernel's bias argument: Np long (zeros past N), 64-byte aligned."""
        s = self.spec
        check_bias(self.spec.epilogue, bias, s.N)
        out = aligned_empty((s.n_computed,), s.dtype)
        out[: s.N] = bias
        out[s.N :] = 0
        return out

    def _bias_args(self, bias: np.ndarray | None) -> list[Any]:
        if not self.spec.bias:
            check_bias(self.spec.epilogue, bias, self.spec.N)
            return []
        assert bias is not None
        if bias.shape == (self.spec.n_computed,) and bias.dtype == np.dtype(self.spec.dtype) and is_aligned(bias):
            return [self._tvm.runtime.from_dlpack(bias)]  # packed already (pack_bias)
        return [self._tvm.runtime.from_dlpack(self.pack_bias(bias))]

    def _tensor(self, a: np.ndarray) -> Any:
        if is_aligned(a):
            return self._tvm.runtime.from_dlpack(a)  # zero-copy
        return self._tvm.runtime.tensor(np.ascontiguousarray(a), self.device)

    def __call__(
        self, x: np.ndarray, packed_w: np.ndarray, out: np.ndarray | None = None, bias: np.ndarray | None = None
    ) -> np.ndarray:
        """Y = act(X·Wᵀ + bias) for X[M, K] with any M ≥ 1. Writes into `out` (an [M, N] array) when given.
        `bias` ([N], or packed by `pack_bias`) is required iff the spec's epilogue adds one."""
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
        b = self._bias_args(bias)
        if is_aligned(out) and not s.padded:
            self._fn(self._tensor(x), self._tensor(packed_w), *b, self._tvm.runtime.from_dlpack(out))
            return out
        y = aligned_empty((m, s.n_computed), s.dtype)
        self._fn(self._tensor(x), self._tensor(packed_w), *b, self._tvm.runtime.from_dlpack(y))
        out[...] = y[:, : s.N]
        return out

    def run_aligned(self, x: np.ndarray, packed_w: Any, out: np.ndarray, bias: Any = None) -> None:
        """The unchecked fast path for callers that validated shapes and alignment themselves (the
        dispatcher): `x` and `out` 64-byte aligned [M, K] / [M, N] views, `packed_w` a TVM tensor, `bias`
        (iff the epilogue adds one) a TVM tensor of a `pack_bias` array."""
        from_dlpack = self._tvm.runtime.from_dlpack
        b = () if bias is None else (bias,)
        if self.spec.padded:  # the binary writes Np columns: through a scratch tile
            y = aligned_empty((x.shape[0], self.spec.n_computed), self.spec.dtype)
            self._fn(from_dlpack(x), packed_w, *b, from_dlpack(y))
            out[...] = y[:, : self.spec.N]
            return
        self._fn(from_dlpack(x), packed_w, *b, from_dlpack(out))

    def device_weight(self, packed_w: np.ndarray) -> Any:
        """The packed weight as a TVM tensor sharing its memory, for `run_aligned`."""
        if not is_aligned(packed_w):
            raise ValueError("packed weights come from pack_weight, which aligns them")
        return self._tvm.runtime.from_dlpack(packed_w)

    def time(self, M: int, repeat: int = 5, min_repeat_ms: int = 20, seed: int = 0) -> float:
        """Median seconds per call at M rows (TVM's time_evaluator; inputs preallocated, so kernel time only)."""
        s = self.spec
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((M, s.K), dtype=np.float32)
        w = self.pack_weight(rng.standard_normal((s.N, s.K), dtype=np.float32))
        bias = [self.pack_bias(rng.standard_normal(s.N, dtype=np.float32))] if s.bias else []
        args = [self._tvm.runtime.tensor(a, self.device) for a in (x, w, *bias, np.zeros((M, s.n_computed), s.dtype))]
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
            digest = sha256_file(staging)
            final = directory / f"{digest}.so"
            if not final.exists():  # identical bytes already stored: keep the first copy
                shutil.move(str(staging), final)
        return UKernelArtifact(path=final, sha256=digest, spec=self.spec)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_ukernel(path: Path, spec: UKernelSpec, sha256: str | None = None) -> UKernel:
    """Load an exported uKernel, refusing it when its bytes do not match the recorded sha256."""
    if sha256 is not None and sha256_file(path) != sha256:
        raise ValueError(f"{path} does not match its sha256 {sha256}")
    return UKernel(import_tvm().runtime.load_module(os.fspath(path)), spec)
