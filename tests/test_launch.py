"""The standalone supervisor never leaves a part behind: a second SIGINT/SIGTERM hastens the shutdown instead of
abandoning it, the parts and what they started die with a supervisor killed outright, and a part that dies is
restarted without leaving its own children behind.

Two kinds of test, all on real processes. The first run the real supervisor (service.launch.Supervisor) over
stand-in parts whose behaviour the test picks: a part that ignores SIGTERM (a worker finishing a long job), with a
child of its own that ignores SIGTERM and never notices its parent die (a busy measuring process). They take
seconds. The slow ones run `kernelfleet standalone` itself: uvicorn, a Celery worker, beat, and, mid-job, the
worker's TVM builder and runner processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from kernelfleet import Client
from tests.helpers import TINY_DENSE, free_port, wait_for

# A stand-in part: starts a child that ignores SIGTERM and never watches its parent, notes "<own pid> <child pid>"
# and then either exits at once ("crash"), exits on SIGTERM ("polite") or ignores SIGTERM ("stubborn").
PART = """
import os, signal, subprocess, sys, time
mode, pids = sys.argv[1], sys.argv[2]
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with open(pids, "a") as fh:
    fh.write(f"{os.getpid()} {child.pid}\\n")
if mode == "crash":
    sys.exit(3)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else lambda *_: sys.exit(0))
time.sleep(600)
"""

# The real supervisor (its signal handling, its stop and restart logic) over one stand-in part.
DRIVER = """
import sys
from pathlib import Path
from service.launch import Child, Supervisor
from service.settings import Settings

data, mode, part = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
supervisor = Supervisor(Settings(data_dir=data, worker_queues="control"))
supervisor.children = [Child("part", [sys.executable, "-c", part, mode, str(data / "pids")], data / "part.log")]
supervisor.run_forever()
"""


def _alive(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _ours(data_dir: Path) -> list[psutil.Process]:
    """Every live process started for this data dir: all of a supervisor's descendants inherit its environment,
    including those started after any snapshot of its tree, and those orphaned by a dead parent."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("KERNELFLEET_DATA_DIR") == str(data_dir) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            out.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:150]}")
    return out


class Launched:
    """A supervisor run as its own process group and session, as a shell's background job or a service is."""

    def __init__(self, argv: list[str], data_dir: Path, port: int | None = None) -> None:
        self.data_dir, self.port = data_dir, port
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
        env["KERNELFLEET_DATA_DIR"] = str(data_dir)
        self.out = open(data_dir / "supervisor.out", "wb")  # noqa: SIM115 - closed in cleanup()
        self.proc = subprocess.Popen(argv, env=env, stdout=self.out, stderr=subprocess.STDOUT, start_new_session=True)

    def descendants(self) -> list[int]:
        try:
            return [p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def answers(self) -> bool:
        assert self.port is not None
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def output(self) -> str:
        return (self.data_dir / "supervisor.out").read_text(errors="replace")[-3000:]

    def signal_twice(self, signum: int, gap_s: float = 0.3) -> None:
        self.proc.send_signal(signum)
        time.sleep(gap_s)
        self.proc.send_signal(signum)

    def assert_all_gone(self, pids: list[int], within_s: float) -> None:
        """The supervisor, every process in `pids` and anything else started for its data dir are gone (and its
        port is closed) within `within_s`."""
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            # a killed server's listening socket is torn down as it exits, which a poll can catch half done
            gone = self.proc.poll() is not None and not any(map(_alive, pids)) and not _ours(self.data_dir)
            if gone and (self.port is None or not self.answers()):
                break
            time.sleep(0.1)
        assert self.proc.poll() is not None, f"the supervisor is still running after {within_s} s"
        left = [pid for pid in pids if _alive(pid)] + [p.pid for p in _ours(self.data_dir) if p.pid not in pids]
        assert not left, f"left running after the supervisor: {_describe(left)}\n{self.output()}"
        if self.port is not None:
            assert not self.answers(), f"port {self.port} still answers"

    def cleanup(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in _ours(self.data_dir):
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        self.out.close()


@pytest.fixture
def launch() -> Iterator[Callable[..., Launched]]:
    launched: list[Launched] = []

    def start(argv: list[str], data_dir: Path, port: int | None = None) -> Launched:
        launched.append(Launched(argv, data_dir, port))
        return launched[-1]

    yield start
    for one in launched:
        one.cleanup()


# ---- the supervisor over stand-in parts ----


def _supervise(launch: Callable[..., Launched], tmp_path: Path, mode: str) -> tuple[Launched, list[int]]:
    data = tmp_path / "data"
    sup = launch([sys.executable, "-c", DRIVER, str(data), mode, PART], data)
    pids_file = data / "pids"
    wait_for(lambda: pids_file.exists() and pids_file.read_text().endswith("\n"), 60, "the part to start its child")
    part, child = map(int, pids_file.read_text().split("\n")[0].split())
    assert _alive(child)
    return sup, [part, child]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_one_signal_stops_the_part_and_kills_what_it_left_in_its_group(launch, tmp_path: Path, signum: int) -> None:  # type: ignore[no-untyped-def]
    sup, pids = _supervise(launch, tmp_path, "polite")
    sup.proc.send_signal(signum)
    sup.assert_all_gone(pids, within_s=10)
    assert sup.proc.returncode == 0, sup.output()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_kills_a_part_that_takes_its_time_at_once(launch, tmp_path: Path, signum: int) -> None:  # type: ignore[no-untyped-def]
    sup, pids = _supervise(launch, tmp_path, "stubborn")
    started = time.monotonic()
    sup.signal_twice(signum)
    sup.assert_all_gone(pids, within_s=5)  # well inside the 15 s a part is given to stop on its own
    assert time.monotonic() - started < 10
    assert sup.proc.returncode == 0, sup.output()


def test_the_part_and_its_child_die_with_a_killed_supervisor(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sup, pids = _supervise(launch, tmp_path, "stubborn")
    sup.proc.kill()
    sup.assert_all_gone(pids, within_s=5)


def test_a_part_that_dies_is_restarted_and_its_child_killed(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sup, (_, child) = _supervise(launch, tmp_path, "crash")
    wait_for(lambda: len((tmp_path / "data" / "pids").read_text().splitlines()) >= 2, 30, "the part's restart")
    wait_for(lambda: not _alive(child), 10, "the dead part's child to be killed")
    assert sup.proc.poll() is None
    sup.proc.send_signal(signal.SIGTERM)
    pids = [int(p) for p in (tmp_path / "data" / "pids").read_text().split()]
    sup.assert_all_gone(pids, within_s=10)


# ---- `kernelfleet standalone` itself ----


def _standalone(launch: Callable[..., Launched], tmp_path: Path) -> tuple[Launched, Client]:
    port = free_port()
    data = tmp_path / "data"
    cli = Path(sys.executable).parent / "kernelfleet"
    sup = launch([str(cli), "standalone", "--port", str(port)], data, port)
    key_file = data / "admin.key"
    wait_for(key_file.exists, 90, "standalone to create the first admin key")
    client = Client(f"http://127.0.0.1:{port}", retries=6, api_key=key_file.read_text().strip())
    wait_for(client.health, 90, "standalone to become ready")
    wait_for(lambda: len(client.workers()) >= 1, 90, "the worker to announce itself")
    wait_for(lambda: (data / "celerybeat-schedule").exists() or list(data.glob("celerybeat-schedule*")), 30, "beat")
    return sup, client


def _mid_job(sup: Launched, client: Client) -> list[int]:
    """Submit a job and wait for the worker to be running it in processes of its own; the whole tree then."""
    hw = client.workers()[0]["target"]
    target = {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}
    client.submit(TINY_DENSE, target, {"kind": "uniform", "dim": "M", "low": 4, "high": 64}, budget={"trials": 256})

    def grandchildren() -> list[int]:
        children = {p.pid for p in psutil.Process(sup.proc.pid).children()}
        return [pid for pid in sup.descendants() if pid not in children]

    wait_for(grandchildren, 120, "the worker to start its builder/runner processes", poll_s=0.1)
    return sup.descendants()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_standalone_stops_everything_on_a_second_signal(launch, tmp_path: Path, signum: int) -> None:  # type: ignore[no-untyped-def]
    sup, _ = _standalone(launch, tmp_path)
    pids = sup.descendants()
    sup.signal_twice(signum)
    sup.assert_all_gone(pids, within_s=20)


@pytest.mark.slow
def test_standalone_parts_die_with_a_killed_supervisor(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sup, _ = _standalone(launch, tmp_path)
    pids = sup.descendants()
    sup.proc.kill()
    sup.assert_all_gone(pids, within_s=5)


@pytest.mark.slow
def test_standalone_mid_job_a_second_sigterm_stops_the_worker_and_its_processes(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sup, client = _standalone(launch, tmp_path)
    pids = _mid_job(sup, client)
    sup.signal_twice(signal.SIGTERM, gap_s=1.0)  # the worker would finish its job (256 trials) on the first alone
    sup.assert_all_gone(pids, within_s=10)


@pytest.mark.slow
def test_standalone_killed_mid_job_takes_the_worker_processes_along(launch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sup, client = _standalone(launch, tmp_path)
    pids = _mid_job(sup, client)
    sup.proc.kill()
    sup.assert_all_gone(pids, within_s=5)


# ---- one supervisor per data dir, and a free API port, before anything starts ----

HOLD_LOCK = """
import sys, time
from pathlib import Path
from service.launch import DataDirLock
DataDirLock(Path(sys.argv[1])).acquire()
time.sleep(600)
"""


def _lock_holder(data: Path) -> str:
    lock = data / "standalone.lock"
    return lock.read_text().strip() if lock.exists() else ""


def _kernelfleet(args: list[str], data: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run the CLI to its end, as a user would on `data`; also how long it took, interpreter start included."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
    env["KERNELFLEET_DATA_DIR"] = str(data)
    cli = Path(sys.executable).parent / "kernelfleet"
    started = time.monotonic()
    done = subprocess.run([str(cli), *args], env=env, capture_output=True, text=True, timeout=60)
    return done, time.monotonic() - started


def test_the_data_dir_lock_names_its_holder_and_goes_with_it(tmp_path: Path) -> None:
    from service.launch import DataDirLock, StartRefused

    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path)])
    try:
        wait_for(lambda: _lock_holder(tmp_path), 30, "the other process to take the lock")
        with pytest.raises(StartRefused, match=rf"data dir {tmp_path.resolve()} is in use .*pid {holder.pid}\b"):
            DataDirLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: nothing of its own runs to release the lock
        holder.wait()
    mine = DataDirLock(tmp_path)
    mine.acquire()  # the kernel released the dead holder's lock: never a stale one
    assert _lock_holder(tmp_path) == str(os.getpid())
    with pytest.raises(StartRefused):
        DataDirLock(tmp_path).acquire()  # a second claim in the same process is refused too
    mine.release()
    DataDirLock(tmp_path).acquire()


def test_a_second_standalone_on_the_same_data_dir_exits_at_once_naming_the_first(  # type: ignore[no-untyped-def]
    launch, tmp_path: Path
) -> None:
    port, data = free_port(), tmp_path / "data"
    cli = Path(sys.executable).parent / "kernelfleet"
    first = launch([str(cli), "standalone", "--port", str(port)], data, port)
    wait_for(lambda: _lock_holder(data), 60, "the first standalone to take the data dir")
    second, took = _kernelfleet(["standalone", "--port", str(port)], data)
    assert second.returncode == 1, second.stdout + second.stderr
    assert f"data dir {data.resolve()} is in use" in second.stderr and f"pid {first.proc.pid}" in second.stderr
    assert "store " not in second.stdout  # it started nothing: not even its banner
    assert took < 15, f"the second standalone took {took:.1f} s to give up"
    assert first.proc.poll() is None, first.output()


def test_standalone_on_a_taken_port_exits_before_creating_anything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done, _ = _kernelfleet(["standalone", "--port", str(port)], data)
    assert done.returncode == 1 and f"port {port} is in use by another process" in done.stderr, done.stderr
    assert not (data / "admin.key").exists() and not (data / "kernelfleet.db").exists()
    assert not list((data / "logs").glob("*.log"))  # no part was started
    assert _lock_holder(data) == ""  # released when it refused, and its process is gone anyway
