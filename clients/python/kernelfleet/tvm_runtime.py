"""The TVM runtime helpers every kernel wrapper of the SDK shares: importing TVM with this host's thread
settings, and host buffers TVM can use in place (64-byte aligned, C-contiguous, writeable)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kernelfleet.runtime import configure_threads

ALIGN = 64  # bytes; TVM's default data alignment for buffers


def import_tvm() -> Any:
    # before TVM's thread pool starts: all cores, unpinned, short spin (see kernelfleet.runtime)
    configure_threads()
    try:
        import tvm
    except ImportError as exc:  # pragma: no cover - exercised only without TVM
        raise ImportError("building kernels needs TVM: pip install 'kernelfleet[tvm]'") from exc
    return tvm


def aligned_empty(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
    itemsize = np.dtype(dtype).itemsize
    count = math.prod(shape)
    buf = np.empty(count * itemsize + ALIGN, dtype=np.uint8)
    offset = -buf.ctypes.data % ALIGN
    out: np.ndarray = buf[offset : offset + count * itemsize].view(dtype).reshape(shape)
    return out


def as_aligned(a: np.ndarray) -> np.ndarray:
    """`a` itself when a kernel may use its memory in place, else one aligned, contiguous copy."""
    if is_aligned(a):
        return a
    out = aligned_empty(a.shape, a.dtype.name)
    out[...] = a
    return out


def is_aligned(a: np.ndarray) -> bool:
    """Whether the kernel may use `a`'s memory as is (numpy refuses DLPack export of read-only arrays)."""
    return bool(a.flags.c_contiguous and a.flags.writeable) and a.ctypes.data % ALIGN == 0
