"""Checks that imported configs load the way the SDK loads them, in a Python process of their own.

A `metaschedule-trace` config carries its IRModule as TVM's JSON and a trace to replay on it. The SDK's
`client.kernel()` (`kernelfleet.tvm_kernel.build_kernel`) loads the module, compares its structural hash with
`module_hash`, replays the trace on it and compiles it for `target`: a config whose module TVM cannot load would
be stored, signed and served, and then fail on every inference host. So an import runs those loading steps on
each such config before it stores anything: the module loads, is the registered workload at the record's shape,
hashes to `module_hash`, the trace replays on it, and the target parses. Compiling is left out: it costs seconds
per config, and a module and trace that got this far fail to compile only where TVM itself is broken.

The checks run in a child (`python -m service.workers.config_check`): the API process never imports TVM, and a
module that crashes TVM (it parses untrusted JSON in C++) kills that child only. The child keeps TVM loaded
between imports (starting Python and importing TVM takes 2-10 s, a config milliseconds) and leaves on its own
once idle. It reads one JSON line per config and answers one line per config, so a crash names its config.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

from service.models.config import TraceConfig

# The format whose configs carry an IRModule (kernelfleet.tvm_kernel.CONFIG_FORMAT_TRACE)
TRACE_FORMAT: str = TraceConfig.model_fields["format"].default
START_TIMEOUT_S = 120.0  # Python and TVM's import, on a busy 2-core host
CONFIG_TIMEOUT_S = 30.0  # one config takes milliseconds: one that takes this long is not served either
IDLE_EXIT_S = 600.0  # the child frees TVM's memory (about 300 MB) after this long without an import
_READY = "config-check-ready"


@dataclass(frozen=True)
class ConfigToCheck:
    workload: Mapping[str, Any]  # the registered workload (service.models.Workload as a dict)
    shape: Mapping[str, int]
    target_kind: str  # the kind of the target the record was measured on
    config: Mapping[str, Any]


@dataclass(frozen=True)
class Rejection:
    index: int  # of the config among those checked
    loc: tuple[str | int, ...]  # under the config, e.g. ("module",)
    message: str
    about_record: bool = False  # the config loads, but is not what its record says (workload, shape, target kind)


class CheckUnavailable(RuntimeError):
    """The check could not run (the child could not start): no verdict on the configs."""


def needs_check(config: Mapping[str, Any]) -> bool:
    return config.get("format") == TRACE_FORMAT


def check_configs(items: Sequence[ConfigToCheck]) -> list[Rejection]:
    """Why each config that would not load in the SDK is refused; [] when all load. Raises CheckUnavailable."""
    if not items:
        return []
    with _CHECKER_LOCK:  # one child per process, one import at a time through it
        return _CHECKER.check(items)


class _Checker:
    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[bytes] | None = None  # the child's stderr: a pipe nobody drains would fill and block it

    def check(self, items: Sequence[ConfigToCheck]) -> list[Rejection]:
        rejections = []
        for i, item in enumerate(items):
            verdict = self._ask(json.dumps(_as_json(item)))
            if verdict is not None:
                rejections.append(Rejection(i, tuple(verdict["loc"]), verdict["msg"], verdict.get("record", False)))
        return rejections

    def _ask(self, line: str) -> dict[str, Any] | None:
        for _ in range(2):  # a child that left just now, idle, is started again once
            proc = self._running()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(line + "\n")
                proc.stdin.flush()
                verdict: dict[str, Any] | None = json.loads(_read_line(proc.stdout, CONFIG_TIMEOUT_S))
                return verdict
            except (BrokenPipeError, EOFError):
                ended = self._stop()
                if ended != "exit 0":
                    return {"loc": ["module"], "msg": f"TVM crashed loading it ({ended})"}
            except TimeoutError:
                self._stop()
                return {"loc": ["module"], "msg": f"TVM did not finish loading it in {CONFIG_TIMEOUT_S:g} s"}
        raise CheckUnavailable("the config check process exits as soon as it starts")

    def _running(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()  # one that left (idle) or died between imports: its log goes with it
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child, closed by _stop
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,  # the API's Ctrl-C is not the child's: it leaves when its stdin closes
        )
        assert proc.stdout is not None
        try:
            ready = _read_line(proc.stdout, START_TIMEOUT_S)
        except (EOFError, TimeoutError):
            ready = ""
        if ready != _READY:
            self._log.seek(0)
            why = self._log.read()[-2000:].decode(errors="replace")
            self._proc = proc
            self._stop()
            raise CheckUnavailable(f"the config check did not start: {_last_line(why)}")
        self._proc = proc
        return proc

    def _stop(self) -> str:
        """End the child (it crashed, hangs or left); says how it ended."""
        proc, self._proc = self._proc, None
        if self._log is not None:
            self._log.close()
            self._log = None
        if proc is None:
            return "gone"
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        return f"signal {-code}" if code < 0 else f"exit {code}"

    def close(self) -> None:
        self._stop()


_CHECKER = _Checker()
_CHECKER_LOCK = threading.Lock()
atexit.register(_CHECKER.close)


def _read_line(stream: IO[str], timeout_s: float) -> str:
    """One line from a child's pipe within `timeout_s` (EOFError when the child is gone)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        ready, _, _ = select.select([stream], [], [], left)
        if ready:
            line = stream.readline()
            if not line:
                raise EOFError
            return line.rstrip("\n")


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _as_json(item: ConfigToCheck) -> dict[str, Any]:
    return {
        "workload": dict(item.workload),
        "shape": dict(item.shape),
        "target_kind": item.target_kind,
        "config": dict(item.config),
    }


# -- the child ------------------------------------------------------------------------------------------------------


def _check(item: Mapping[str, Any]) -> dict[str, Any] | None:
    """The SDK's loading steps on one config (kernelfleet.tvm_kernel.build_kernel, up to compiling)."""
    import tvm
    import tvm_ffi
    from tvm import s_tir

    from service.models import Workload, shape_key
    from service.tuning.compute import prim_func

    config, shape = item["config"], item["shape"]

    def refuse(field: str, message: str) -> dict[str, Any]:
        return {"loc": [field], "msg": message}

    try:
        mod = tvm.ir.load_json(config["module"])
    except Exception as exc:  # TVM raises ValueError, JSONDecodeError, AttributeError, ... on what it cannot read
        return refuse("module", f"TVM cannot load it as an IRModule: {_first_line(exc)}")
    if not isinstance(mod, tvm.IRModule) or "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        return refuse("module", f"TVM loads it as {type(mod).__name__}, not an IRModule with a `main` function")
    actual = str(tvm_ffi.structural_hash(mod))
    if actual != config["module_hash"]:
        return refuse("module_hash", f"the module's structural hash is {actual}, not {config['module_hash']}")
    try:
        s_tir.Trace.apply_json_to_schedule(config["trace"], s_tir.Schedule(mod))
    except Exception as exc:  # TVM's own error types for a trace that does not replay
        return refuse("trace", f"does not replay on the module: {_first_line(exc)}")
    try:
        tvm.target.Target(dict(config["target"]))
    except Exception as exc:
        return refuse("target", f"not a TVM target: {_first_line(exc)}")
    # A config that loads, filed under a workload, shape or target kind it is not for: the record and its config
    # disagree, and which of them is wrong only the importer knows.
    target_kind = config["target"].get("kind")
    if target_kind != item["target_kind"]:
        return {"loc": [], "msg": f"a {target_kind} config for a {item['target_kind']} target", "record": True}
    workload = Workload(**item["workload"])
    if not tvm_ffi.structural_equal(mod, prim_func(workload, shape)):
        message = f"the config's module is not the workload {workload.workload_hash} at {shape_key(shape)}"
        return {"loc": [], "msg": message, "record": True}
    return None


def _first_line(exc: BaseException) -> str:
    """The message of a TVM error without its C++ backtrace."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip() and not line.startswith("  ")]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def main() -> None:
    # The protocol has stdout to itself: anything TVM prints goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    # Everything a check imports, before saying ready: a host without TVM fails the start, not a config, and
    # the first config's time limit is not spent importing.
    import tvm  # noqa: F401
    from tvm import s_tir  # noqa: F401

    import service.tuning.compute  # noqa: F401

    print(_READY, file=protocol, flush=True)
    while select.select([sys.stdin], [], [], IDLE_EXIT_S)[0]:
        line = sys.stdin.readline()
        if not line:
            break  # the API process is gone
        try:
            verdict = _check(json.loads(line))
        except Exception as exc:  # whatever else a config makes TVM raise is still a verdict on that config
            verdict = {"loc": [], "msg": f"TVM could not load it: {_first_line(exc)}"}
        print(json.dumps(verdict), file=protocol, flush=True)
    os._exit(0)  # TVM's thread pools make the interpreter's own exit slow


if __name__ == "__main__":
    main()
