"""Starting real service processes for tests: the API under uvicorn and Celery workers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from kernelfleet import Client
from service.launch import api_argv, beat_argv, bootstrap_admin_key, worker_argv, worker_queues
from service.settings import Settings
from service.store.db import migrate

TINY_DENSE = {"op": "dense", "dims": {"N": 32, "K": 32}, "symbolic": ["M"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


class Fleet:
    """API, workers and beat as real subprocesses sharing one environment (store, broker, data dir)."""

    def __init__(self, data_dir: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, **env, "KERNELFLEET_DATA_DIR": str(data_dir)}
        self.settings = Settings(
            data_dir=data_dir,
            **{  # the same view of the env as the children
                k.removeprefix("KERNELFLEET_").lower(): v for k, v in env.items() if k.startswith("KERNELFLEET_")
            },
        )
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.port = free_port()
        self.api_key: str | None = None
        (data_dir / "logs").mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.data_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def start_api(self) -> None:
        migrate(self.settings.resolved_database_url)
        self.api_key = bootstrap_admin_key(self.settings) or self.api_key
        self._spawn("api", api_argv("127.0.0.1", self.port))
        wait_for(lambda: self._ready(), 60, "the API to become ready")

    def client(self, **kwargs: Any) -> Client:
        return Client(self.url, api_key=self.api_key, **kwargs)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, name: str) -> subprocess.Popen[bytes]:
        return self._spawn(name, worker_argv(f"{name}@%h", worker_queues(self.settings)))

    def start_beat(self) -> None:
        self._spawn("beat", beat_argv(self.settings))

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def log(self, name: str) -> str:
        return (self.data_dir / "logs" / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in list(self.procs.values()):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


class TestClientTransport(httpx.BaseTransport):
    """The SDK's httpx transport onto a Starlette TestClient: requests go through the in-process app. Starlette
    1.10 builds its TestClient on httpx2, whose transport httpx 0.28 (the SDK's) refuses, so each request is
    replayed through the TestClient's own interface and its answer rebuilt as an httpx response."""

    __test__ = False

    def __init__(self, api: Any) -> None:
        self.api = api

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        answer = self.api.request(
            request.method, str(request.url), headers=dict(request.headers), content=request.read()
        )
        # the body arrives decoded: drop the headers that describe its encoding on the wire
        headers = [(k, v) for k, v in answer.headers.items() if k.lower() not in ("content-encoding", "content-length")]
        return httpx.Response(answer.status_code, headers=headers, content=answer.content, request=request)


JsonPath = tuple[str | int, ...]  # keys and indices from a JSON document's root to one value


def replaced_at(value: Any, path: JsonPath, new: Any) -> Any:
    """A copy of the JSON document `value` with `new` at `path` (the rest shared, not copied)."""
    if not path:
        return new
    if isinstance(value, dict):
        return {**value, path[0]: replaced_at(value[path[0]], path[1:], new)}
    return [replaced_at(v, path[1:], new) if i == path[0] else v for i, v in enumerate(value)]
