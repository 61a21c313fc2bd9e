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
from tests.helpers import TestClientTransport
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


def test_sdk_dispatcher_serves_from_its_cache_while_the_store_is_down(proxied_pg: TcpProxy, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    from kernelfleet import Client
    from service.models import WorkloadSpec
    from service.store import catalog
    from service.store import dispatch as dispatch_store
    from service.tuning.hardware import host_target
    from service.tuning.kinds.ukernel import artifacts_of
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner

    target = host_target()
    spec = WorkloadSpec.model_validate(DENSE)
    out = UKernelTuner().tune(
        # uKernels at every S (numpy would win all of them on this tiny layer): the test is about the cache
        RangeTask(spec, 12, [12], target, 2, tmp_path / "wd", min_repeat_ms=2, vendor_routes=False),
        QuietRangeSink(),
    )
    with session_scope() as s:
        wh = catalog.put_workload(s, spec).workload_hash
        catalog.put_target(s, target)
        arts = artifacts_of(out)
        dispatch_store.publish(
            s, workload_hash=wh, target_fingerprint=target.fingerprint, dim="M", table=out.table.to_dict(),
            artifacts=arts, predicted=out.predicted_s, measured=out.measured_s, validation={}, job_id=None,
        )  # fmt: skip
        headers = {"Authorization": f"Bearer {keys.create(s, 'r', [Scope.read]).key}"}
    with TestClient(create_app(run_migrations=False), headers=headers) as api:
        via_app = TestClientTransport(api)
        sdk = Client("http://testserver", transport=via_app, api_key=headers["Authorization"][7:], retries=0)
        cache = tmp_path / "cache"
        assert sdk.dispatcher(wh, target.fingerprint, cache_dir=cache).source == "service"
        proxied_pg.cut()
        t0 = time.monotonic()
        served = sdk.dispatcher(wh, target.fingerprint, cache_dir=cache)
        assert served.source == "cache" and time.monotonic() - t0 < 5
        x, w = np.ones((7, 32), np.float32), np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 2048
        np.testing.assert_allclose(served(x, w), x @ w.T, rtol=1e-5)
        proxied_pg.restore()
        assert sdk.dispatcher(wh, target.fingerprint, cache_dir=cache).source == "service"
