"""A service that accepts connections and never answers: the CLI says what it waits for and gives up within its
deadline; the SDK's retry policy (timeout, retries, deadline) stays the caller's."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelfleet import Client
from kernelfleet.cli import CLI_DEADLINE_S
from kernelfleet.errors import ServiceUnavailable


class SilentService:
    """Listens on a free port, accepts every connection, reads nothing and answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.connections.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentService]:
    service = SilentService()
    yield service
    service.close()


def test_the_cli_says_what_it_waits_for_and_gives_up_within_its_deadline(silent: SilentService, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "COLUMNS": "200", "KERNELFLEET_URL": silent.url, "KERNELFLEET_API_KEY": "kf_x"}
    process = subprocess.Popen(
        [sys.executable, "-c", "from kernelfleet.cli import main; main()", "jobs"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stderr is not None
    first = process.stderr.readline()  # printed 2 s into the first request: the clock starts there, so the
    waited = time.monotonic()  # interpreter's start (slow on a loaded CI machine) is not counted
    rest = process.stderr.read()
    returncode = process.wait(timeout=60)
    took = time.monotonic() - waited + 2.0
    stderr = first + rest
    assert returncode == 1 and "Traceback" not in stderr
    assert CLI_DEADLINE_S - 1 < took < CLI_DEADLINE_S + 4, f"gave up {took:.1f} s into the request"
    result = subprocess.CompletedProcess(process.args, returncode, "", stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0] == f"waiting for {silent.url}/v1/jobs ...", result.stderr
    assert len(lines) == 2 and f"no answer from {silent.url}" in lines[1], result.stderr


def test_the_sdk_retries_as_configured_and_stops_at_its_deadline(silent: SilentService) -> None:
    said: list[str] = []
    with Client(silent.url, timeout=0.3, retries=2, backoff_s=0.01, on_slow=said.append, slow_after_s=0.1) as client:
        with pytest.raises(ServiceUnavailable, match="no answer from"):
            client.workers()
        assert len(silent.connections) == 3  # every attempt the policy allows, each on a new connection
        with pytest.raises(ServiceUnavailable):
            client.status()
    assert said == [f"{silent.url}/v1/workers"]  # once per client

    with Client(silent.url, timeout=10, retries=5, deadline_s=1.0) as bounded:
        started = time.monotonic()
        with pytest.raises(ServiceUnavailable, match="no answer from"):
            bounded.workers()
        assert time.monotonic() - started < 1.5  # not one 10 s attempt, let alone six
