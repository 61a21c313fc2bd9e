"""Run batch_matmul uKernels: C[B,M,N] = A[B,M,K]·Bt[B,N,K]ᵀ, one compiled binary per tile for every tuple of
its symbolic dims (B always; any of M, N, K).

The binary (built by service/tuning/tuners/ukernel/bmm_kernel.py) sees only whole tiles: it reads
A as [B, M/mt, mt, K/kt, kt], Bt packed as [B, N/nt, K/kt, kt, nt] and writes C as [B, M/mt, mt, N/nt, nt],
so its loops carry no predicate. This module pads on the host: M, N and K are rounded up to multiples of
mt, nt, kt with zeros (exact: zero rows and columns add nothing to the dot products, and the padded
rows and columns of C are dropped). Bt is packed on every call anyway (in attention it changes per call),
so padding N and K costs nothing extra; A is used in place when M and K need no padding and it is
64-byte aligned and C-contiguous, and copied otherwise; C is written in place under the same condition.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernelfleet.tvm_runtime import aligned_empty, import_tvm, is_aligned
from kernelfleet.ukernel import sha256_file

BMM_DIMS = ("B", "M", "N", "K")


def round_up(n: int, tile: int) -> int:
    return -(-n // tile) * tile


@dataclass(frozen=True)
class BmmSpec:
    """What identifies a compiled batch_matmul uKernel. M, N, K: the workload's static sizes; 0 where the
    dim is symbolic (B is always symbolic: one binary serves every batch)."""

    mt: int
    nt: int
    kt: int
    vec: int
    target: dict[str, Any] = field(hash=False)
    M: int = 0
    N: int = 0
    K: int = 0
    dtype: str = "float32"

    def static(self) -> dict[str, int]:
        return {d: v for d, v in (("M", self.M), ("N", self.N), ("K", self.K)) if v}

    def to_dict(self) -> dict[str, Any]:
        return {"op": "batch_matmul", **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BmmSpec:
        return cls(**{k: v for k, v in data.items() if k != "op"} | {"target": dict(data["target"])})


@dataclass(frozen=True)
class BmmArtifact:
    path: Path
    sha256: str
    spec: BmmSpec


class BmmUKernel:
    """A compiled batch_matmul uKernel: call it on any (B, M, N, K) that matches its static dims."""

    def __init__(self, module: Any, spec: BmmSpec) -> None:
        tvm = import_tvm()
        self._from_dlpack = tvm.runtime.from_dlpack
        self.module = module
        self.spec = spec
        self._fn = module["main"]

    def check(self, a: np.ndarray, bt: np.ndarray) -> tuple[int, int, int, int]:
        s = self.spec
        if a.ndim != 3 or bt.ndim != 3 or a.shape[0] != bt.shape[0] or a.shape[2] != bt.shape[2]:
            raise ValueError(f"need A[B,M,K] and Bt[B,N,K]; got {list(a.shape)} and {list(bt.shape)}")
        if a.dtype != np.dtype(s.dtype) or bt.dtype != np.dtype(s.dtype):
            raise ValueError(f"need {s.dtype} inputs, got {a.dtype} and {bt.dtype}")
        (B, M, K), N = a.shape, bt.shape[1]
        if min(B, M, N, K) < 1:
            raise ValueError("every dim must be ≥ 1")
        for dim, size in (("M", M), ("N", N), ("K", K)):
            static = getattr(s, dim)
            if static and static != size:
                raise ValueError(f"this uKernel was compiled for {dim}={static}, got {size}")
        return B, M, N, K

    def pack_a(self, a: np.ndarray, Mp: int, Kp: int) -> np.ndarray:
        B, M, K = a.shape
        if Mp == M and Kp == K and is_aligned(a):
            return a
        out = aligned_empty((B, Mp, Kp), self.spec.dtype)
        out[:, :M, :K] = a
        out[:, M:, :] = 0
        out[:, :M, K:] = 0
        return out

    def pack_bt(self, bt: np.ndarray, Np: int, Kp: int) -> np.ndarray:
        """Bt[B, N, K] → [B, Np/nt, Kp/kt, kt, nt] (zeros past N and K), 64-byte aligned."""
        B, N, K = bt.shape
        nt = self.spec.nt
        out = aligned_empty((B, Np // nt, Kp // self.spec.kt, self.spec.kt, nt), self.spec.dtype)
        view = out.reshape(B, Np // nt, Kp, nt).transpose(0, 1, 3, 2)  # [B, No, nt, Kp]
        src = bt
        if Np != N:
            src = np.zeros((B, Np, K), self.spec.dtype)
            src[:, :N] = bt
        view[..., :K] = src.reshape(B, Np // nt, nt, K)
        if Kp != K:
            view[..., K:] = 0
        return out

    def __call__(self, a: np.ndarray, bt: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """C = A·Btᵀ per batch; writes into `out` ([B, M, N]) when given."""
        B, M, N, K = self.check(a, bt)
        s = self.spec
        Mp, Np, Kp = round_up(M, s.mt), round_up(N, s.nt), round_up(K, s.kt)
        if out is None:
            out = aligned_empty((B, M, N), s.dtype)
        elif out.shape != (B, M, N) or out.dtype != np.dtype(s.dtype):
            raise ValueError(f"out must be {s.dtype}[{B}, {M}, {N}]")
        direct = Mp == M and Np == N and is_aligned(out)
        c = out if direct else aligned_empty((B, Mp, Np), s.dtype)
        ap = self.pack_a(a, Mp, Kp).reshape(B, Mp // s.mt, s.mt, Kp // s.kt, s.kt)
        bp = self.pack_bt(bt, Np, Kp)
        cv = c.reshape(B, Mp // s.mt, s.mt, Np // s.nt, s.nt)
        self._fn(self._from_dlpack(ap), self._from_dlpack(bp), self._from_dlpack(cv))
        if not direct:
            out[...] = c[:, :M, :N]
        return out

    def export(self, directory: Path) -> BmmArtifact:
        """Write the shared library to `directory/<sha256>.so` (content-addressed, like dense uKernels)."""
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            staging = Path(tmp) / "ukernel.so"
            self.module.export_library(str(staging))
            digest = sha256_file(staging)
            final = directory / f"{digest}.so"
            if not final.exists():
                shutil.move(str(staging), final)
        return BmmArtifact(path=final, sha256=digest, spec=self.spec)


def load_bmm_ukernel(path: Path, spec: BmmSpec, sha256: str | None = None) -> BmmUKernel:
    """Load an exported bmm uKernel, refusing it when its bytes do not match the recorded sha256."""
    if sha256 is not None and sha256_file(path) != sha256:
        raise ValueError(f"{path} does not match its sha256 {sha256}")
    return BmmUKernel(import_tvm().runtime.load_module(os.fspath(path)), spec)
