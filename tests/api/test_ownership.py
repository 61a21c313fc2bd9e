"""Jobs and models by id prefix (as the CLI's truncated tables show them) and read by the key that submitted them,
in-process over SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.store import jobs as job_store
from service.store import models as model_store
from tests.api.test_api import _key, job_body
from tests.api.test_models import model_body


@pytest.fixture
def api(use_store: str) -> Iterator[TestClient]:
    with TestClient(create_app(run_migrations=False)) as client:
        yield client


@contextlib.contextmanager
def _with_ids(store: ModuleType, *ids: str) -> Iterator[None]:
    """The rows `store` creates meanwhile get these ids, so that they share prefixes."""
    chosen = iter(uuid.UUID(i) for i in ids)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store, "uuid", SimpleNamespace(uuid4=lambda: next(chosen)))
        yield


def test_a_unique_prefix_names_the_job_an_ambiguous_one_is_a_409_naming_the_candidates(api: TestClient) -> None:
    admin = _key("admin")
    first, second = "abcd1111-0000-4000-8000-000000000001", "abcd2222-0000-4000-8000-000000000002"
    with _with_ids(job_store, first, second):
        assert [api.post("/v1/jobs", json=job_body(), headers=admin).json()["id"] for _ in range(2)] == [first, second]

    assert api.get("/v1/jobs/abcd1", headers=admin).json()["id"] == first
    assert api.get("/v1/jobs/abcd2222-0000", headers=admin).json()["id"] == second
    assert api.get(f"/v1/jobs/{first}", headers=admin).json()["id"] == first
    assert api.get("/v1/jobs/abcd2/candidates", headers=admin).json() == []
    ambiguous = api.get("/v1/jobs/abcd", headers=admin)
    assert ambiguous.status_code == 409 and first in ambiguous.json()["detail"] and second in ambiguous.json()["detail"]
    assert api.post("/v1/jobs/abcd/cancel", headers=admin).status_code == 409
    short = api.get("/v1/jobs/abc", headers=admin)  # below 4 characters a prefix is no id
    assert short.status_code == 404 and "4 characters" in short.json()["detail"]
    assert api.get("/v1/jobs/abcd3", headers=admin).status_code == 404
    assert api.get("/v1/jobs/abcd%25", headers=admin).status_code == 404  # '%' is no LIKE wildcard here
    assert api.get("/v1/jobs/abc_", headers=admin).status_code == 404  # nor is '_'
    cancelled = api.post("/v1/jobs/abcd2/cancel", headers=admin)
    assert cancelled.status_code == 202 and (cancelled.json()["id"], cancelled.json()["state"]) == (second, "cancelled")


def test_a_unique_prefix_names_the_model(api: TestClient) -> None:
    admin = _key("admin")
    ids = [f"feed{i}{i}{i}{i}-0000-4000-8000-00000000000{i}" for i in range(2)]
    with _with_ids(model_store, *ids):
        assert [api.post("/v1/models", json=model_body(), headers=admin).json()["id"] for _ in ids] == ids
    model = api.get("/v1/models/feed1", headers=admin).json()
    assert model["id"] == ids[1] and model["jobs_total"] == 2
    ambiguous = api.get("/v1/models/feed", headers=admin)
    assert ambiguous.status_code == 409 and all(i in ambiguous.json()["detail"] for i in ids)
    assert api.get("/v1/models/feed2", headers=admin).status_code == 404
    cancelled = api.post("/v1/models/feed0/cancel", headers=admin)
    assert cancelled.status_code == 202 and cancelled.json()["id"] == ids[0]
    assert cancelled.json()["states"] == {"cancelled": 2}


def test_a_submit_only_key_reads_its_own_jobs_and_models_and_nothing_else(api: TestClient) -> None:
    bot, other_bot, reader = _key("submit"), _key("submit"), _key("read")
    job = api.post("/v1/jobs", json=job_body(), headers=bot).json()
    model = api.post("/v1/models", json=model_body(), headers=bot).json()
    model_job = model["ops"][0]["job_id"]

    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id'][:8]}", f"/v1/jobs/{model_job}"):
        got = api.get(path, headers=bot)
        assert got.status_code == 200 and got.json()["state"] == "queued", (path, got.text)
    assert api.get(f"/v1/jobs/{job['id']}/candidates", headers=bot).json() == []
    assert api.get(f"/v1/models/{model['id']}", headers=bot).json()["jobs_total"] == 2
    assert api.get(f"/v1/models/{model['id'][:6]}", headers=bot).json()["id"] == model["id"]

    # another submit-only key: neither its rows nor whether they exist
    for path in (f"/v1/jobs/{job['id']}", f"/v1/jobs/{job['id']}/candidates", f"/v1/models/{model['id']}"):
        refused = api.get(path, headers=other_bot)
        assert refused.status_code == 403 and "'read' scope" in refused.json()["detail"], (path, refused.text)
    assert api.get(f"/v1/jobs/{uuid.uuid4()}", headers=other_bot).status_code == 403  # not a 404: no probing
    assert api.get("/v1/jobs", headers=bot).status_code == 403  # listing everyone's jobs still needs read
    assert api.post(f"/v1/jobs/{job['id']}/cancel", headers=other_bot).status_code == 403

    # a read key reads everything, as before
    assert api.get(f"/v1/jobs/{job['id']}", headers=reader).json()["id"] == job["id"]
    assert api.get(f"/v1/models/{model['id']}", headers=reader).json()["id"] == model["id"]
    assert api.post(f"/v1/jobs/{job['id']}/cancel", headers=bot).json()["state"] == "cancelled"
    assert api.post(f"/v1/models/{model['id'][:8]}/cancel", headers=bot).json()["states"] == {"cancelled": 2}
