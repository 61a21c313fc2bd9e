"""Work directories per fleet, worker node and job attempt, and their sweeping (issue 34 item 7)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from service.settings import Settings
from service.workers import scratch


@pytest.fixture
def system_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(scratch, "_SYSTEM_TEMP", tmp_path)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", tempfile.gettempdir()))  # restored after the test
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    return tmp_path


def _settings(store: str) -> Settings:
    return Settings(database_url=f"sqlite:///{store}")


def _made(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_an_attempt_works_in_its_own_directory_and_the_next_attempt_removes_it(system_temp: Path) -> None:
    fleet, other_fleet = _settings("/a.db"), _settings("/b.db")
    killed = _made(scratch.attempt_dir(fleet, "w0@host:100", "job-1", "lease-a"))
    (killed / "ms").mkdir()
    other_job = _made(scratch.attempt_dir(fleet, "w0@host:100", "job-2", "lease-b"))
    same_job_other_fleet = _made(scratch.attempt_dir(other_fleet, "w1@host:7", "job-1", "lease-c"))
    assert killed.parent.name == "w0@host" and killed.name == "job-1.lease-a"

    retry = _made(scratch.attempt_dir(fleet, "w1@host:200", "job-1", "lease-d"))  # another node on this host
    assert scratch.sweep_job(fleet, "job-1", keep=retry) == [killed]
    assert not killed.exists() and retry.is_dir() and other_job.is_dir() and same_job_other_fleet.is_dir()


def test_a_worker_starting_under_a_node_name_removes_what_that_name_left(system_temp: Path) -> None:
    fleet = _settings("/a.db")
    left = _made(scratch.attempt_dir(fleet, "w0@host:100", "job-1", "lease-a"))
    (scratch.node_root(fleet, "w0@host:100") / "tmp" / "tmpabc").mkdir(parents=True)  # TVM's builds, say
    alive = _made(scratch.attempt_dir(fleet, "w1@host:300", "job-2", "lease-b"))  # another live worker's

    temp = scratch.take_over_node(fleet, "w0@host:200")
    assert not left.exists() and alive.is_dir()
    assert temp == scratch.node_root(fleet, "w0@host:200") / "tmp" and list(temp.iterdir()) == []
    # this process's temporary files, and its children's (TVM's build processes), go under the node's root now
    assert os.environ["TMPDIR"] == str(temp) and Path(tempfile.mkdtemp()).parent == temp


def test_node_names_become_one_safe_path_component(system_temp: Path) -> None:
    fleet = _settings("/a.db")
    assert scratch.node_root(fleet, "../../etc@h/x:1").parent == scratch.fleet_root(fleet)
    assert scratch.node_of("worker0@host:123") == "worker0@host" and scratch.node_of("plain") == "plain"
