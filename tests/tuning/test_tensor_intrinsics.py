"""MetaSchedule's tensor intrinsics imported with a cheap `inspect.stack` (service/tuning/tuners/tensor_intrinsics)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

from service.tuning.tuners.tensor_intrinsics import frame_stack


def _both(context: int) -> tuple[list[inspect.FrameInfo], list[inspect.FrameInfo]]:
    def inner() -> tuple[list[inspect.FrameInfo], list[inspect.FrameInfo]]:
        return inspect.stack(context), frame_stack(context)  # one line: the same frames and line numbers

    return inner()


def _fields(info: inspect.FrameInfo) -> tuple[Any, ...]:
    return info.frame, info.filename, info.lineno, info.function


def test_frames_are_inspect_stacks_field_by_field() -> None:
    """What TVMScript's decorator reads: each frame, its file, line, function, and the code lines around it."""
    for context in (0, 1, 3):
        plain, fast = _both(context)
        assert [_fields(f) for f in fast] == [_fields(f) for f in plain]
        for p, f in zip(plain, fast, strict=True):
            if p.code_context is not None:  # inspect gives none where it cannot find the file's source
                assert (f.code_context, f.index) == (p.code_context, p.index), (context, p.filename)
        assert fast[0].function == "inner" and fast[1].function == "_both"
        assert context == 0 or "frame_stack(context)" in "".join(fast[0].code_context or [])


def test_load_registers_the_intrinsics_and_gives_inspect_stack_back() -> None:
    """In a fresh process (this one may have imported the package already): a registered intrinsic is there."""
    code = (
        "import inspect, sys, tvm\n"
        "plain = inspect.stack\n"
        "from service.tuning.tuners import tensor_intrinsics\n"
        "tensor_intrinsics.load()\n"
        "assert inspect.stack is plain and 'tvm.s_tir.tensor_intrin' in sys.modules\n"
        "from tvm.s_tir.tensor_intrin.x86 import VNNI_DOT_16x4_INTRIN\n"
        "intrin = tvm.s_tir.TensorIntrin.get(VNNI_DOT_16x4_INTRIN)\n"
        "print(type(intrin).__name__, len(tvm.ir.save_json(intrin.desc)) > 100)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.split() == ["TensorIntrin", "True"]
