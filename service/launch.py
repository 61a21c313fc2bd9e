"""Process launcher: API, workers and beat as supervised child processes (`kernelfleet standalone`).

No part outlives the supervisor, however it ends: a second stop signal hastens a graceful stop rather than
abandoning it, and a supervisor killed outright takes the parts, and what they started, along (see Supervisor).
One supervisor per data dir: a second one refuses to start (DataDirLock), as it does when the API's port is taken."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from service.settings import Settings

# The store and Celery are imported where they are used: a `kernelfleet standalone` that finds its data dir taken
# should say so at once, not after importing alembic and Celery (seconds on a busy host).

log = logging.getLogger(__name__)


def worker_queues(settings: Settings) -> list[str]:
    """The queues of the hardware this host is, plus housekeeping; overridable for special workers."""
    if settings.worker_queues:
        return [q.strip() for q in settings.worker_queues.split(",") if q.strip()]
    from service.tuning.platforms import host_platform
    from service.workers.celery_app import CONTROL_QUEUE

    platform, target = host_platform()
    return [platform.queue(target), CONTROL_QUEUE]


def worker_devices(settings: Settings, workers: int) -> list[dict[str, str]]:
    """The environment of each worker process to start. A CPU host runs `workers` of them. A GPU host runs one
    per visible GPU, each seeing only its own (CUDA_VISIBLE_DEVICES=<uuid>): two workers timing on one GPU
    would time each other, and a worker always tunes CUDA's device 0, which is then the GPU it was given."""
    from service.tuning.platforms import host_platform

    if settings.worker_queues or host_platform()[0].target_kind != "cuda":
        return [{} for _ in range(workers)]
    from service.tuning import gpu

    rows = gpu.visible_gpus()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    chosen = rows if visible is None else [r for r in (gpu.visible_row(rows, v) for v in visible.split(",")) if r]
    if workers != len(chosen):
        log.info("GPU host: one worker per visible GPU (%d), not %d", len(chosen), workers)
    return [{"CUDA_VISIBLE_DEVICES": row["uuid"]} for row in chosen]


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


class StartRefused(RuntimeError):
    """Why a supervisor would not start anything: its data dir is another's, or its API port is taken."""


class DataDirLock:
    """An exclusive flock on `<data dir>/standalone.lock`, which holds the holder's pid.

    Two supervisors on one data dir would run two beats on one schedule file and two sets of workers, and the
    second's API would crash-loop on the port the first holds. The kernel drops the lock when its holder dies,
    however it dies, so a lock is never stale; the file is never removed (a process could otherwise lock an
    unlinked file while a third created a new one). The descriptor is not inherited: the parts never hold it."""

    FILE_NAME = "standalone.lock"

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / self.FILE_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # no O_TRUNC: the holder's pid is read below
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StartRefused(
                f"the data dir {self.path.parent.resolve()} is in use by another kernelfleet supervisor (pid "
                f"{holder}; lock {self.path.name}): stop that one, or give this one another KERNELFLEET_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)  # no pid of a supervisor that is gone (a killed one leaves its pid: harmless)
            os.close(self._fd)  # closing the last descriptor of the file description drops the flock
            self._fd = None


def check_port_free(host: str, port: int) -> None:
    """StartRefused unless this process could listen on (host, port) as uvicorn does (SO_REUSEADDR, so a port
    whose last connections are in TIME_WAIT counts as free). Checked before anything starts: otherwise the API
    part crash-loops on the port while the rest runs, and a client meant for this service talks to another."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as exc:
        raise StartRefused(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise StartRefused(f"port {port} is in use by another process; choose another with --port") from None
            raise StartRefused(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def claim(lock: DataDirLock, host: str, port: int | None) -> None:
    """Take the data dir, then make sure the API's port (None: no API part) is free; StartRefused says why not,
    and leaves the lock as it was. Cheap: `kernelfleet standalone` claims before it looks at the host's hardware."""
    held_before = lock.held
    lock.acquire()
    try:
        if port is not None:
            check_port_free(host, port)
    except StartRefused:
        if not held_before:
            lock.release()
        raise


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _die_with_this_thread() -> Callable[[], None] | None:
    """What a part runs between fork and exec: ask the kernel for SIGKILL when the thread that forked it exits
    (Linux PR_SET_PDEATHSIG), and exit at once if the supervisor already died before that. The supervisor starts
    its parts from the main thread, so the signal comes when the supervisor exits, however it exits, SIGKILL
    included. libc is resolved here, in the parent, not in the forked child."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os._exit(127)  # a part that would not die with the supervisor must not start

    return preexec


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


# The guard: a process of its own session that outlives the supervisor by design. The supervisor tells it the
# process group of every part it starts ("+PGID") and stops ("-PGID"), one line per write, each write atomic;
# when its stdin ends, the supervisor is gone, and it SIGKILLs every group still listed: PR_SET_PDEATHSIG kills
# only the parts themselves, not what they started (a worker's TVM builder and runner processes), which would
# otherwise run on, unsupervised, until their current build or measurement ends, or forever if it hangs.
_GUARD = """
import os, signal, sys
for signum in (signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, signal.SIG_IGN)
groups = set()
for line in sys.stdin.buffer:
    if line.endswith(b"\\n"):
        (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Guard:
    """Kills the parts' process groups, their own children included, when the supervisor dies."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, groups: list[int]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _GUARD, "kernelfleet-standalone-guard"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            bufsize=0,  # one os.write per line: pipe writes this small are atomic, a dying writer leaves no half line
            start_new_session=True,  # neither a terminal's signals nor a kill of the supervisor's group reach it
        )
        for pgid in groups:
            self.add(pgid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _tell(self, line: str) -> None:
        if self.proc is not None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.write(line.encode())
            except OSError:  # it died; check() starts another one
                log.warning("the guard process (pid %d) is gone", self.proc.pid)
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()

    def add(self, pgid: int) -> None:
        self._tell(f"+{pgid}\n")

    def discard(self, pgid: int) -> None:
        self._tell(f"-{pgid}\n")

    def close(self) -> None:
        """After every group was discarded: the guard exits with nothing left to kill."""
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Child:
    """One part, in a session and process group of its own (its leader's pid is the group's id).

    It is reaped only by `reap`, after the SIGKILL of its whole group: until then an exited leader is a zombie whose
    pid cannot be reused, so signalling the group can never reach an unrelated process."""

    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # on top of the supervisor's environment
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, guard: Guard | None = None) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - stays open for the child's lifetime
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            # a session of its own: a terminal's Ctrl-C reaches the supervisor alone, which stops the parts in order
            start_new_session=True,
            preexec_fn=_die_with_this_thread(),
            env={**os.environ, **self.env} if self.env else None,
        )
        if guard is not None:
            guard.add(self.proc.pid)

    def running(self) -> bool:
        """Whether the part's leader is still running; never reaps it (see the class docstring)."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        try:
            return os.waitid(os.P_PID, self.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False

    def terminate(self) -> None:
        """SIGTERM to the leader alone: it stops its own children its own way (a worker finishes its job)."""
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the whole group: the leader and whatever it started."""
        if self.proc is not None and self.proc.returncode is None:
            _kill_group(self.proc.pid)

    def reap(self, guard: Guard | None = None) -> None:
        """Kill what is left of the group, collect the leader's exit status, close the log."""
        if self.proc is not None and self.proc.returncode is None:
            self.kill()
            self.proc.wait()
            if guard is not None:
                guard.discard(self.proc.pid)
        if self._log:
            self._log.close()
            self._log = None


class Supervisor:
    """Starts every part, restarts a part that dies, and stops them all on SIGINT/SIGTERM/SIGHUP.

    The first stop signal stops the parts one by one in reverse start order (beat, the workers, the API), each
    given `grace_s` to finish; any further one, or a signal that arrives while a stop begun otherwise runs, kills
    every part still running at once. Either way the supervisor returns only once all of them, and whatever they
    started in their process groups, are gone. Parts never outlive the supervisor:
    each gets SIGKILL from the kernel when it dies (PR_SET_PDEATHSIG), and the guard process kills their groups.
    Start and stop it from the main thread: PR_SET_PDEATHSIG fires when the thread that forked a part exits."""

    def __init__(
        self,
        settings: Settings,
        host: str = "127.0.0.1",
        port: int = 8000,
        workers: int = 1,
        lock: DataDirLock | None = None,
    ) -> None:
        """`lock`: the data dir's, when the caller claimed it already (see `claim`)."""
        self.settings = settings
        self.host, self.port = host, port
        self.lock = lock or DataDirLock(settings.data_dir)
        logs = settings.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        queues = worker_queues(settings)
        self.children = [Child("api", api_argv(host, port), logs / "api.log")]
        self.children += [
            Child(f"worker{i}", worker_argv(f"worker{i}@%h", queues), logs / f"worker{i}.log", env=env)
            for i, env in enumerate(worker_devices(settings, workers))
        ]
        self.children.append(Child("beat", beat_argv(settings), logs / "beat.log"))
        self.guard = Guard()
        self._stopping = False
        self._signals = 0  # stop signals received
        self._hurry_at = 2  # stop signals after which a stop kills what is left at once

    def claim(self) -> None:
        """Take the data dir and make sure the API's port is free, before anything is started or created (the
        store's first admin key included); StartRefused says why not."""
        claim(self.lock, self.host, self.port if any(child.name == "api" for child in self.children) else None)

    def start(self) -> str | None:
        """Start every part; returns the admin key when this start created the store's first one."""
        from service.store.db import migrate

        self.claim()
        migrate(self.settings.resolved_database_url)  # once, before any child touches the store
        admin_key = bootstrap_admin_key(self.settings)
        env_note = {"store": self.settings.resolved_database_url, "broker": self.settings.resolved_broker_url}
        log.info("starting %s with %s", [c.name for c in self.children], env_note)
        self.guard.start([])
        for child in self.children:
            if self._signals:
                break
            child.start(self.guard)
        return admin_key

    def check(self) -> None:
        if not self._stopping and not self.guard.alive():
            self.guard.start([c.proc.pid for c in self.children if c.proc is not None and c.proc.returncode is None])
        for child in self.children:
            if self._stopping or self._signals or child.running():
                continue
            if child.proc is not None:
                child.reap(self.guard)  # what it started goes with it
                log.warning(
                    "%s exited (code %s); restarting (restart #%d)",
                    child.name,
                    child.proc.returncode,
                    child.restarts + 1,
                )
            child.restarts += 1
            self._pause(min(5.0, 0.5 * child.restarts))
            if self._signals:
                return
            child.start(self.guard)

    def _pause(self, seconds: float) -> None:
        """Sleep, but return as soon as a stop signal arrives."""
        seen, deadline = self._signals, time.monotonic() + seconds
        while self._signals == seen and time.monotonic() < deadline:
            time.sleep(0.05)

    def _hurry(self) -> bool:
        return self._signals >= self._hurry_at

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._signals += 1  # all the handler does; the main loop and stop() act on it

    @contextlib.contextmanager
    def _signals_counted(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {signum: signal.signal(signum, self._on_signal) for signum in STOP_SIGNALS}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every part (see the class docstring): a stop signal that arrives meanwhile hastens it."""
        self._stopping = True
        # begun by a signal (run_forever): the next one hurries; begun otherwise (an exception, demo's end): any one
        self._hurry_at = 2 if self._signals else 1
        killed = False
        with self._signals_counted():
            for child in reversed(self.children):
                if not self._hurry():
                    child.terminate()
                    deadline = time.monotonic() + grace_s
                    while child.running() and time.monotonic() < deadline and not self._hurry():
                        time.sleep(0.05)
                if self._hurry() and not killed:
                    killed = True
                    log.warning("stop signal during the stop: killing the parts still running")
                    for other in self.children:
                        other.kill()
                child.reap(self.guard)  # SIGKILL to what is left of its group, after a graceful exit too
            self.guard.close()
        self.lock.release()  # only once every part is gone: another supervisor may take the data dir now

    def run_forever(self) -> None:
        # SIGINT explicitly too: a process started in the background by a non-interactive shell inherits
        # SIGINT ignored, and Ctrl-C (or a supervisor's SIGINT) must still stop every part cleanly. The handler
        # only counts: no exception is raised in the middle of starting or reaping a part.
        with self._signals_counted():
            try:
                admin_key = self.start()
                if admin_key:
                    where = admin_key_path(self.settings)
                    print(f"admin API key (shown once; also saved to {where}): {admin_key}", flush=True)
                while not self._signals:
                    self._pause(1.0)
                    self.check()
                log.info("stopping (a second SIGINT/SIGTERM kills the parts at once)")
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
