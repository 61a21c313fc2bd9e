"""The TVM runtime helpers every kernel wrapper of the SDK shares: importing TVM with this host's thread
settings (and, on GPU hosts, the CUDA runtime it needs), and host buffers TVM can use in place (64-byte
aligned, C-contiguous, writeable)."""

from __future__ import annotations

import ctypes
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kernelfleet.runtime import configure_threads

ALIGN = 64  # bytes; TVM's default data alignment for buffers


def wheel_cuda_roots() -> list[Path]:
    """The CUDA trees of NVIDIA's PyPI wheels beside this Python (site-packages/nvidia/cu13, ...)."""
    roots = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            roots += sorted((p for p in base.glob("cu[0-9]*") if p.is_dir()), reverse=True)
    return roots


def preload_cuda_runtime() -> Path | None:
    """Load the CUDA runtime of the wheels (libcudart.so.13, which torch's CUDA build brings) into this
    process before TVM: TVM's CUDA plugin needs it and finds it only on the loader's path, where the wheel
    does not put it; once a library of that soname is loaded, the loader reuses it. Returns what was loaded
    (None when the wheels have none: a CPU host, or a system CUDA the loader already finds)."""
    for root in wheel_cuda_roots():
        for lib in sorted((root / "lib").glob("libcudart.so.*")):
            ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            return lib
    return None


def import_tvm() -> Any:
    # before TVM's thread pool starts: all cores, unpinned, short spin (see kernelfleet.runtime)
    configure_threads()
    if "tvm" not in sys.modules:
        preload_cuda_runtime()  # only helps before TVM's first import: its CUDA plugin loads once
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
