"""Run GPU measurements in a child process the worker can kill: MetaSchedule's popen-runner pattern.

A tuning job times candidate kernels it has just generated. On a GPU one of them can hang (a kernel that
never finishes keeps the job alive forever while the heartbeat thread goes on beating) or fault (an
illegal address is a sticky CUDA error: every later CUDA call in that process fails, so every later job
on the worker would too). So candidates are built and timed in a child process (TVM's `PopenWorker`,
the one MetaSchedule's runner uses): a child that does not answer within `timeout_s` is killed, a child
that dies or whose measured function raises anything at all is replaced, and the candidate is recorded as
failed with the reason while the search goes on. The long-lived worker process never touches the faulting
context.

The deadline is kept by the parent: the child's own timer thread cannot fire while a C call that holds
the GIL (a device synchronise) is stuck. Functions sent to the child must be importable module-level
functions (they are pickled by reference) taking and returning picklable values.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from typing import Any


class MeasureTimeout(RuntimeError):
    """The child did not answer in time; it was killed (a hung kernel, or a build that never ends)."""


class MeasureCrashed(RuntimeError):
    """The child died while measuring (a segfault, an abort in the driver, or killed from outside)."""


# How long a fresh child may take to start (interpreter, cloudpickle, TVM's popen worker) before it counts
# as dead. Kept apart from the measurement deadline: on a busy worker start-up alone can take longer than
# a candidate is allowed, and a slow start is not a hung kernel.
STARTUP_TIMEOUT_S = 120.0


def _ready() -> int:
    return os.getpid()


class IsolatedRunner:
    """Calls `fn(*args)` in a child process with a deadline; one child, reused until it fails.

    `run` raises MeasureTimeout / MeasureCrashed, or re-raises the child's exception (its type and message);
    after a timeout, a crash or any exception the child is gone and the next call starts a fresh one (2.4-3.2 s
    to start Python and import TVM on two busy EPYC cores, plus a new CUDA context on a GPU), so one bad
    candidate costs its own measurement and a restart, and nothing after it. A fresh child first answers a
    ping under `startup_timeout_s`; `timeout_s` covers the measurement alone."""

    def __init__(self, timeout_s: float, startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._child: _Child | None = None
        self.restarts = 0  # children replaced after a timeout, a crash or an exception

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._child is None:
            self._child = _Child()
            self._call(_ready, (), self.startup_timeout_s)
        return self._call(fn, args, self.timeout_s)

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> Any:
        from tvm.support.popen_pool import StatusKind

        assert self._child is not None
        child, name = self._child, getattr(fn, "__name__", repr(fn))
        try:
            child.send(fn, args)
            status, value = child.recv(timeout_s)
        except TimeoutError:
            self._drop()
            raise MeasureTimeout(f"{name} gave no answer in {timeout_s:g} s: its process was killed") from None
        except (EOFError, OSError):
            self._drop()
            raise MeasureCrashed(f"the measuring process died running {name} (exit {child.exit_code()})") from None
        if status == StatusKind.COMPLETE:
            return value
        # Any exception retires the child, whatever it says. Telling a poisoned CUDA context from a healthy one
        # by the error text needs a list of error strings, and a list always misses one (error 717,
        # cudaErrorInvalidAddressSpace, slipped through on an H100). Asking the child instead is no better:
        # CUDA errors are asynchronous, so a plain Python error (a failed check, a bad tile) can be raised while
        # a kernel launched just before it is still running or about to fault; a probe would have to
        # synchronise, which blocks on that kernel and turns the real error into a timeout; TVM, torch and the
        # driver each keep their own error state; and CUDA is not the only state a half-run measurement can
        # leave behind (device memory held by the traceback, half-loaded modules). Nor can "CUDA never
        # initialised" save the child: after its first measurement it always is. A fresh process is the one
        # state known to be clean, and only failing candidates pay for it.
        self._drop()
        raise _without_traceback(value)

    def _drop(self) -> None:
        if self._child is not None:
            self._child.kill()
        self._child = None
        self.restarts += 1

    def close(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child = None

    def __enter__(self) -> IsolatedRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _without_traceback(error: BaseException) -> BaseException:
    """The child's exception with its message only: TVM's popen worker sends the whole traceback as the message,
    which would push the actual error out of every truncated record."""
    lines = str(error).rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  ")]
    message = "\n".join(lines[frames[-1] + 1 :] if frames else lines).strip() or str(error)
    try:
        return type(error)(message)
    except Exception:  # an exception type that cannot be built from one message
        return RuntimeError(message)


class _Child:
    """TVM's popen worker (`python -m tvm.exec.popen_worker`, MetaSchedule's measuring process) in a session of
    its own, spoken to over two pipes in its protocol (length-prefixed cloudpickle). Unlike TVM's PopenWorker
    the parent waits with `select`, so a child stuck in C code is killed on time instead of being waited on."""

    def __init__(self) -> None:
        child_read, parent_write = os.pipe()
        parent_read, child_write = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.popen_worker", str(child_read), str(child_write)],
            pass_fds=(child_read, child_write),
            start_new_session=True,  # its process group goes with it, compilers included
        )
        os.close(child_read)
        os.close(child_write)
        self.reader = os.fdopen(parent_read, "rb")
        self.writer = os.fdopen(parent_write, "wb")

    def send(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        import cloudpickle

        data = cloudpickle.dumps((fn, args, {}, None), protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(struct.pack("<i", len(data)) + data)
        self.writer.flush()

    def recv(self, timeout_s: float) -> tuple[int, Any]:
        import cloudpickle

        ready, _, _ = select.select([self.reader], [], [], timeout_s)
        if not ready:
            raise TimeoutError
        header = self.reader.read(4)
        if len(header) < 4:
            raise EOFError("the child closed its pipe")
        (size,) = struct.unpack("<i", header)
        status, value = cloudpickle.loads(self.reader.read(size))
        return int(status), value

    def exit_code(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(timeout=1)
        return None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pipe in (self.reader, self.writer):
            with contextlib.suppress(OSError):
                pipe.close()
