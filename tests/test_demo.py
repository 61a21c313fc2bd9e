"""`make demo` leaves nothing behind (its temporary store, broker and logs go, even when the demo fails) and its table
says what each shape runs."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from rich.console import Console

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from service import demo
from service.demo import demo_data_dir


def test_the_demo_removes_its_temporary_directory_even_on_failure(tmp_path: Path) -> None:
    with demo_data_dir(None, keep=False) as made:
        (made / "kernelfleet.db").write_bytes(b"x")
        assert made.name.startswith("kernelfleet-demo-")
    assert not made.exists()
    with pytest.raises(RuntimeError), demo_data_dir(None, keep=False) as failed:
        raise RuntimeError("the demo failed")
    assert not failed.exists()
    with demo_data_dir(None, keep=True) as kept:
        pass
    assert kept.is_dir()
    kept.rmdir()
    with demo_data_dir(tmp_path, keep=False) as given:  # a directory the user named is theirs
        pass
    assert given == tmp_path and tmp_path.is_dir()


def test_the_demo_prints_one_table_with_the_library_each_shape_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A table routing small M to numpy and the rest to PyTorch: each row names its library, beside both
    libraries' times and the machine; a vendor route is called no win."""
    table = DispatchTable((Interval(1, 20, None), Interval(21, 300, None, vendor.TORCH)), {})

    class _Client:
        def dispatcher(self, workload: str, target: str, *, cache_dir: Path) -> Dispatcher:
            return Dispatcher(table, {}, N=None, K=None, source="service")

    monkeypatch.setitem(demo.WORKLOAD, "dims", {"N": 24, "K": 32})  # a small layer: the rows, not the speed, matter
    monkeypatch.setattr(demo, "compare", functools.partial(demo.compare, rounds=3, min_sample_s=0, pause_s=0))
    console = Console(record=True, width=80, file=io.StringIO())  # a pipe: the table still gets its width
    timing = demo._show_dispatcher(console, _Client(), "w", "t", tmp_path)  # type: ignore[arg-type]
    assert "numpy (µs)" not in console.export_text(clear=False)  # timed later, once the service is stopped
    timing()
    out = console.export_text()
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 3}
    assert set(rows) == set(map(str, demo.SHOWN_M)) and "numpy (µs)" in out and "PyTorch (µs)" in out
    for m in demo.SHOWN_M:
        assert ("numpy (vendor route)" if m <= 20 else "PyTorch (vendor route)") in rows[str(m)]
    assert out.count("machine: ") == 1 and "median over 3 interleaved rounds" in out and "not a KernelFleet win" in out


def test_the_demo_on_a_taken_port_says_so_and_sends_nothing_there(tmp_path: Path) -> None:
    """Another service on the demo's port would get the demo's fresh admin key (and answer 401): the demo refuses
    before it creates a key, a store or a temporary directory, and never connects there."""
    received: list[bytes] = []

    def serve(server: socket.socket) -> None:
        with contextlib.suppress(OSError):  # the test closes the socket when done
            while True:
                conn, _ = server.accept()
                with conn:
                    received.append(conn.recv(65536) or b"(connected)")

    with socket.create_server(("127.0.0.1", 0)) as other_service:
        port = other_service.getsockname()[1]
        threading.Thread(target=serve, args=(other_service,), daemon=True).start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
        cli = Path(sys.executable).parent / "kernelfleet"
        done = subprocess.run(
            [str(cli), "demo", "--port", str(port)],
            env={**env, "TMPDIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"port {port} is in use by another process; choose another with --port" in done.stderr
    assert "Traceback" not in done.stderr and "KernelFleet demo" not in done.stdout
    assert received == []
    assert not list(tmp_path.glob("kernelfleet-demo-*"))
