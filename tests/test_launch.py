"""`kernelfleet standalone` supervises its parts: a second SIGINT/SIGTERM hastens the shutdown rather than
abandoning it, and the parts die with a supervisor that is killed outright (none is left answering on its port
or running a job unsupervised)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.helpers import free_port, wait_for


@dataclass
class Standalone:
    proc: subprocess.Popen[bytes]
    port: int
    descendants: list[psutil.Process]

    def alive_descendants(self) -> list[str]:
        out = []
        for p in self.descendants:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
            except psutil.NoSuchProcess:
                continue
        return out

    def answers(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    env["KERNELFLEET_DATA_DIR"] = str(tmp_path / "data")
    cli = Path(sys.executable).parent / "kernelfleet"
    proc = subprocess.Popen(
        [str(cli), "standalone", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own group: the test's signals reach the supervisor alone, as a kill(1) does
    )
    running = Standalone(proc, port, [])
    try:
        wait_for(running.answers, 120, "the API to listen")
        # the API, the worker and beat, and whatever they started (the worker's TVM process pool)
        wait_for(lambda: len(_descendants(proc.pid)) >= 3, 60, "the worker and beat to start")
        time.sleep(2)  # the worker's own children (its process pool) have started too
        running.descendants = _descendants(proc.pid)
        yield running
    finally:
        for p in [psutil.Process(proc.pid), *running.descendants] if proc.poll() is None else running.descendants:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        proc.wait(10)


def _gone(running: Standalone, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and (running.alive_descendants() or running.answers()):
        time.sleep(0.2)
    assert running.alive_descendants() == [], "left running after the supervisor"
    assert not running.answers(), f"port {running.port} still answers"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_hastens_the_shutdown_and_leaves_nothing_running(standalone: Standalone, signum: int) -> None:
    standalone.proc.send_signal(signum)
    time.sleep(0.1)  # the supervisor is stopping its parts one by one
    standalone.proc.send_signal(signum)
    standalone.proc.wait(20)
    _gone(standalone, 5)


def test_the_parts_die_with_a_killed_supervisor(standalone: Standalone) -> None:
    standalone.proc.kill()
    standalone.proc.wait(10)
    _gone(standalone, 10)
