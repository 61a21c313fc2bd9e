"""`kernelfleet job` takes the id prefix its tables show and prints the keys `best` and `dispatch` need."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from kernelfleet import Client, cli
from service.api.app import create_app
from service.store import jobs
from service.store.db import session_scope
from tests.api.test_api import _key, job_body
from tests.helpers import TestClientTransport


@pytest.fixture
def api(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from tests.conftest import _use_store

    for _ in _use_store(sqlite_url, monkeypatch):
        with TestClient(create_app(run_migrations=False), headers=_key("admin")) as client:
            yield client


def test_job_by_prefix_shows_its_workload_hash_and_target_fingerprint(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = api.post("/v1/jobs", json=job_body()).json()
    via_app = TestClientTransport(api)
    monkeypatch.setattr(cli, "client_from_env", lambda url: Client("http://testserver", transport=via_app, retries=0))
    runner = CliRunner()

    queued = runner.invoke(cli.app, ["job", job["id"][:8]])
    assert queued.exit_code == 0, queued.output
    assert f"job {job['id']}" in queued.output
    assert f"workload hash       {job['workload_hash']}\ntarget fingerprint  - (known once" in queued.output

    with session_scope() as s:  # what a worker does when it takes the job
        jobs.resolve_target(s, job["id"], "fe" * 16)
    taken = runner.invoke(cli.app, ["job", job["id"][:8]])
    assert f"workload hash       {job['workload_hash']}\ntarget fingerprint  {'fe' * 16}\n" in taken.output
