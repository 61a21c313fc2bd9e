"""Process launcher: API, workers and beat as supervised child processes (`kernelfleet standalone`).

Each part runs in a process group of its own, so a terminal's Ctrl-C reaches the supervisor alone and the
supervisor stops the parts in order. The parts never outlive it: each asks the kernel for SIGKILL when the
supervisor dies (Linux PR_SET_PDEATHSIG, so a SIGKILLed or crashed supervisor takes them along; a job it ran is
then reaped and re-run, since the store leases jobs), and stopping kills a part's whole group (a worker's TVM
process pool too). A second SIGINT/SIGTERM during the graceful stop hastens it: every part still running is
killed at once, and the supervisor still waits for each to be gone before it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from service.settings import Settings
from service.store.db import migrate
from service.workers.celery_app import CONTROL_QUEUE

log = logging.getLogger(__name__)


def worker_queues(settings: Settings) -> list[str]:
    """The queues of the hardware this host is, plus housekeeping; overridable for special workers."""
    if settings.worker_queues:
        return [q.strip() for q in settings.worker_queues.split(",") if q.strip()]
    from service.tuning.platforms import host_platform

    platform, target = host_platform()
    return [platform.queue(target), CONTROL_QUEUE]


def api_argv(host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "service.api.app:app",
        "--host",
        host,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def worker_argv(name: str, queues: list[str]) -> list[str]:
    # solo pool: one job per worker process; tuning already uses every core for builds and measurement
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "service.workers.celery_app",
        "worker",
        "--pool=solo",
        "-Q",
        ",".join(queues),
        "-n",
        name,
        "--loglevel=INFO",
        "--without-gossip",
        "--without-mingle",
    ]


def beat_argv(settings: Settings) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "service.workers.celery_app",
        "beat",
        "--loglevel=INFO",
        "-s",
        str((settings.data_dir / "celerybeat-schedule").resolve()),
    ]


_PR_SET_PDEATHSIG = 1


def _die_with_this_process() -> Callable[[], None]:
    """What a child runs before exec (libc resolved here, in the parent, not between fork and exec): SIGKILL when
    the supervisor's thread that forked it exits (always the main thread here), and exit at once when the
    supervisor is already gone (it died between the fork and this call)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)  # a part the kernel will not tie to the supervisor must not start
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - stays open for the child's lifetime
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: Ctrl-C on a terminal reaches the supervisor alone
            preexec_fn=_die_with_this_process(),  # the supervisor has no other threads to deadlock the fork
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float) -> None:
        """SIGTERM, up to `grace_s` to finish, then SIGKILL to the part's whole group (its own children too)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill()
        _kill_group(self.proc.pid)  # whatever the part left behind in its group
        self.proc.wait()
        if self._log:
            self._log.close()

    def kill(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc.pid)


class Supervisor:
    """Starts every part, restarts a part that dies, and stops them all cleanly on SIGINT/SIGTERM."""

    def __init__(self, settings: Settings, host: str = "127.0.0.1", port: int = 8000, workers: int = 1) -> None:
        self.settings = settings
        logs = settings.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        queues = worker_queues(settings)
        self.children = [Child("api", api_argv(host, port), logs / "api.log")]
        self.children += [
            Child(f"worker{i}", worker_argv(f"worker{i}@%h", queues), logs / f"worker{i}.log") for i in range(workers)
        ]
        self.children.append(Child("beat", beat_argv(settings), logs / "beat.log"))
        self._stopping = False

    def start(self) -> str | None:
        """Start every part; returns the admin key when this start created the store's first one."""
        migrate(self.settings.resolved_database_url)  # once, before any child touches the store
        admin_key = bootstrap_admin_key(self.settings)
        env_note = {"store": self.settings.resolved_database_url, "broker": self.settings.resolved_broker_url}
        log.info("starting %s with %s", [c.name for c in self.children], env_note)
        for child in self.children:
            child.start()
        return admin_key

    def check(self) -> None:
        for child in self.children:
            if not self._stopping and not child.alive():
                child.restarts += 1
                log.warning(
                    "%s exited (code %s); restarting (restart #%d)",
                    child.name,
                    child.proc.returncode if child.proc else None,
                    child.restarts,
                )
                time.sleep(min(5.0, 0.5 * child.restarts))
                child.start()

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the parts in reverse start order, each given `grace_s`; from the first SIGINT/SIGTERM that arrives
        meanwhile on, every part still running is killed at once (the stop goes on until all are gone)."""
        self._stopping = True

        def _hurry(signum: int, _frame: object) -> None:
            log.warning("signal %d during shutdown: killing the parts still running", signum)
            self.kill()

        signal.signal(signal.SIGTERM, _hurry)
        signal.signal(signal.SIGINT, _hurry)
        for child in reversed(self.children):
            child.stop(grace_s)

    def kill(self) -> None:
        for child in self.children:
            child.kill()

    def run_forever(self) -> None:
        def _terminate(signum: int, _frame: object) -> None:
            raise KeyboardInterrupt

        # SIGINT explicitly too: a process started in the background by a non-interactive shell inherits
        # SIGINT ignored, and Ctrl-C (or a supervisor's SIGINT) must still stop every part cleanly.
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, _terminate)
        try:
            admin_key = self.start()
            if admin_key:
                where = admin_key_path(self.settings)
                print(f"admin API key (shown once; also saved to {where}): {admin_key}", flush=True)
            while True:
                time.sleep(1)
                self.check()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()


def admin_key_path(settings: Settings) -> Path:
    return settings.data_dir / "admin.key"


def bootstrap_admin_key(settings: Settings) -> str | None:
    """Create the first admin key of an empty store, save it next to the embedded data (mode 0600)."""
    from service.store import keys
    from service.store.db import session_scope

    with session_scope(settings.resolved_database_url) as session:
        created = keys.bootstrap_admin(session)
    if created is None:
        return None
    path = admin_key_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(created.key + "\n")
    return created.key


def configure_logging() -> None:
    from service import logs

    logs.configure()
