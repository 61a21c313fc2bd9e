"""Store outages: the API answers 503 quickly with a clear message, and recovers when the store returns."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.models.auth import Scope
from service.store import keys
from service.store.db import session_scope
from tests.tcp_proxy import TcpProxy

DENSE = {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]}


@pytest.fixture
def proxied_pg(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TcpProxy]:
    from tests.conftest import _use_store

    proxy = TcpProxy(("127.0.0.1", 5432))
    proxy.start()
    url = pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}")
    monkeypatch.setenv("KERNELFLEET_DB_POOL_TIMEOUT_S", "2")
    from service.settings import get_settings

    get_settings.cache_clear()
    yield from (proxy for _ in _use_store(url, monkeypatch))
    proxy.cut()


def test_lookups_and_submissions_fail_fast_with_503_then_recover(proxied_pg: TcpProxy) -> None:
    with session_scope() as s:
        headers = {"Authorization": f"Bearer {keys.create(s, 't', [Scope.admin]).key}"}
    with TestClient(create_app(run_migrations=False), headers=headers) as api:
        wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
        params = {"workload": wh, "target": "f" * 32, "shape": "M=8"}
        assert api.get("/v1/configs/best", params=params).status_code == 404  # a miss, store up

        proxied_pg.cut()
        for call in (
            lambda: api.get("/v1/configs/best", params=params),
            lambda: api.post("/v1/workloads", json=DENSE),
            lambda: api.get("/v1/jobs"),
        ):
            t0 = time.monotonic()
            resp = call()
            assert resp.status_code == 503, resp.text
            assert "store is unavailable" in resp.json()["detail"] and resp.headers["retry-after"]
            assert time.monotonic() - t0 < 5
        ready = api.get("/readyz")
        assert ready.status_code == 503 and ready.json()["store"].startswith("unavailable")

        proxied_pg.restore()
        assert api.get("/v1/configs/best", params=params).status_code == 404
        assert api.post("/v1/workloads", json=DENSE).status_code == 201
