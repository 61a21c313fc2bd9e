"""MetaSchedule's tensor intrinsics, imported in about 2 s instead of 20-60 s.

`TuneContext` imports `tvm.s_tir.tensor_intrin` on first use: 248 TVMScript functions, each parsed under a
decorator that calls `inspect.stack()`. That call resolves every frame's source file through
`inspect.getmodule`, which scans all of `sys.modules` for each frame whose file does not exist, such as the import
machinery's `<frozen importlib._bootstrap>` frames present during any import: some 27,000 scans of 2,000 modules,
23 s in a bare TVM process here and up to a minute in a worker, paid by every worker process's first sketch job
(and every test process that tunes). The decorator reads each frame's object, file, line, function name and code
line only: `load()` imports the package once with `inspect.stack` computing exactly those from the frames
(linecache for the lines), and then puts `inspect.stack` back. The intrinsics registered are the same: their IR
hashes equal a plain import's (measured with both imports in fresh processes, 118 intrinsics), and
tests/tuning/test_tensor_intrinsics.py checks the frames match `inspect.stack()`'s field by field.
"""

from __future__ import annotations

import inspect
import linecache
import sys
import threading
from types import FrameType

_LOCK = threading.Lock()


def frame_stack(context: int = 1, *, start: FrameType | None = None) -> list[inspect.FrameInfo]:
    """`inspect.stack(context)` from `start` (default: the caller's frame) outwards, without `inspect.getmodule`:
    the same frames, files, lines, function names, code lines and index (`positions` left out)."""
    frame: FrameType | None = start if start is not None else sys._getframe(1)
    out = []
    while frame is not None:
        filename, lineno = frame.f_code.co_filename, frame.f_lineno
        lines: list[str] | None = None
        index: int | None = None
        if context > 0:
            first = max(0, lineno - 1 - context // 2)
            source = linecache.getlines(filename, frame.f_globals)
            if source:
                first = max(0, min(first, len(source) - context))
                lines, index = source[first : first + context], lineno - 1 - first
        out.append(inspect.FrameInfo(frame, filename, lineno, frame.f_code.co_name, lines, index))
        frame = frame.f_back
    return out


def load() -> None:
    """Import `tvm.s_tir.tensor_intrin` (once per process) the fast way; call before anything builds a TuneContext."""
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return
    with _LOCK:
        if "tvm.s_tir.tensor_intrin" in sys.modules:
            return
        plain = inspect.stack
        inspect.stack = _stack_from_caller
        try:
            import tvm.s_tir.tensor_intrin  # noqa: F401
        finally:
            inspect.stack = plain


def _stack_from_caller(context: int = 1) -> list[inspect.FrameInfo]:
    return frame_stack(context, start=sys._getframe(1))
