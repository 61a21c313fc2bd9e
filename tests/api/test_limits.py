"""Rate limits and bounds on what one key or one address may cost the service (issue 34, items 1 and 2): target
registrations, lookups counted in keys, failed authentications per address, /metrics behind a key, and the
token buckets' bounded memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.limits import TokenBucket, client_address
from service.models import WorkloadSpec
from service.models.auth import Scope
from service.store import catalog, keys
from service.store.db import session_scope
from tests.api.test_api import DENSE, TARGET, TOOLCHAIN, job_body

Limits = Callable[..., TestClient]


@pytest.fixture
def app_with(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Limits]:
    """`app_with(LOOKUP_RATE_PER_MINUTE=5, ...)`: a TestClient (no key of its own) under those settings, with every
    rate limit's buckets fresh, so no test sees another's spent tokens."""
    from service.api.auth import clear_cache
    from service.api.state import reset_limits
    from tests.conftest import _use_store

    clients: list[TestClient] = []
    stores = _use_store(sqlite_url, monkeypatch)
    next(stores)

    def make(**settings: str | int) -> TestClient:
        from service.settings import get_settings

        for name, value in settings.items():
            monkeypatch.setenv(f"KERNELFLEET_{name}", str(value))
        get_settings.cache_clear()
        reset_limits()
        client = TestClient(create_app(run_migrations=False))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)
    next(stores, None)
    reset_limits()
    clear_cache()


def _key(*scopes: Scope) -> dict[str, str]:
    with session_scope() as s:
        return {"Authorization": f"Bearer {keys.create(s, 'limits', list(scopes)).key}"}


def _workload() -> str:
    with session_scope() as s:
        return catalog.put_workload(s, WorkloadSpec.model_validate(DENSE)).workload_hash


def _lookup_key(workload: str, m: int) -> dict[str, Any]:
    return {"workload": workload, "target": "f" * 32, "shape": {"M": m}}


# -- the token bucket ---------------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_request_costs_its_weight_and_one_above_the_capacity_leaves_debt() -> None:
    clock = _Clock()
    bucket = TokenBucket(60, clock=clock)  # one token a second, 60 at most
    assert bucket.take("k", 50) == 0
    assert bucket.take("k", 20) == pytest.approx(10.0)  # refused, and nothing taken
    assert bucket.take("k", 10) == 0
    assert bucket.wait("k") == pytest.approx(1.0)
    clock.now += 60
    assert bucket.take("k", 150) == 0  # more than the bucket holds: admitted from a full one...
    assert bucket.wait("k") == pytest.approx(91.0)  # ...and paid back at the rate: 90 tokens of debt, then 1
    assert bucket.take("other") == 0  # per key


def test_wait_takes_nothing_and_records_no_unknown_key() -> None:
    bucket = TokenBucket(2)
    assert bucket.wait("never-seen") == 0 and len(bucket) == 0
    assert bucket.take("k") == bucket.take("k") == 0
    assert bucket.wait("k") > 0 and bucket.take("k") > 0


def test_the_bucket_forgets_full_idle_keys_first_and_never_tracks_more_than_its_bound() -> None:
    clock = _Clock()
    bucket = TokenBucket(60, max_keys=100, clock=clock)
    for i in range(10_000):  # e.g. bad keys from ever new addresses
        bucket.take(f"addr-{i}")
    assert len(bucket) == 100
    bucket.take("busy", 60)  # empty: it must stay tracked
    clock.now += 30  # the others are full again by now (they took 1 of 60 tokens, 30 s ago); "busy" holds 30
    bucket.take("newcomer")
    assert len(bucket) == 2  # the full ones went, the one still owed tokens stayed
    assert bucket.take("busy", 60) == pytest.approx(30.0)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("203.0.113.7", "203.0.113.7"),
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::9", "2001:db8:1:2::/64"),  # the same host walking through its /64
        ("::ffff:203.0.113.7", "203.0.113.7"),
        ("testclient", "testclient"),
        (None, "unknown"),
    ],
)
def test_client_address(host: str | None, address: str) -> None:
    assert client_address(host) == address


# -- item 1: registering targets --------------------------------------------------------------------------------


def test_registering_a_target_needs_the_submit_scope_and_is_rate_limited_per_key(app_with: Limits) -> None:
    api = app_with(TARGET_RATE_PER_MINUTE=2)
    target = {**TARGET, "toolchain": TOOLCHAIN}
    assert api.post("/v1/targets", json=target, headers=_key(Scope.read)).status_code == 403
    submitter = _key(Scope.submit)
    codes = [api.post("/v1/targets", json=target, headers=submitter).status_code for _ in range(3)]
    assert codes == [201, 201, 429]
    limited = api.post("/v1/targets", json=target, headers=submitter)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert "target registrations" in limited.json()["detail"]
    assert api.post("/v1/targets", json=target, headers=_key(Scope.submit)).status_code == 201  # per key


@pytest.mark.parametrize("field", ["details", "metadata"])
def test_a_targets_details_and_metadata_are_bounded_in_bytes(app_with: Limits, field: str) -> None:
    api = app_with(MAX_TARGET_DETAILS_BYTES=200, SUBMIT_RATE_PER_MINUTE=1000)
    admin = _key(Scope.admin)
    fits = {**TARGET, "toolchain": TOOLCHAIN, field: {"gpu": "x" * 150}}
    assert api.post("/v1/targets", json=fits, headers=admin).status_code == 201
    big = {**fits, field: {f"k{i}": "x" * 100 for i in range(8)}}  # 8 of the 32 entries allowed, ~900 bytes
    resp = api.post("/v1/targets", json=big, headers=admin)
    assert resp.status_code == 422, resp.text
    [error] = resp.json()["detail"]
    assert error["loc"] == ["body", field] and "at most 200" in error["msg"]
    # the same bound wherever a target is accepted, e.g. inline in a job
    job = api.post("/v1/jobs", json=job_body(target=big), headers=admin)
    assert job.status_code == 422 and job.json()["detail"][0]["loc"] == ["body", "target", field]


# -- item 2: lookups, failed authentications, /metrics ----------------------------------------------------------


def test_lookups_are_rate_limited_per_key_counted_in_keys_looked_up(app_with: Limits) -> None:
    api = app_with(LOOKUP_RATE_PER_MINUTE=10)
    workload, reader = _workload(), _key(Scope.read)
    batch = {"keys": [_lookup_key(workload, m) for m in range(1, 9)]}
    assert api.post("/v1/configs/best/batch", json=batch, headers=reader).status_code == 200  # 8 of 10 tokens
    single = {"workload": workload, "target": "f" * 32, "shape": "M=3"}
    assert api.get("/v1/configs/best", params=single, headers=reader).status_code == 404  # a miss: 9
    assert api.get("/v1/dispatch", params={"workload": "a", "target": "b"}, headers=reader).status_code == 404  # 10
    limited = api.get("/v1/configs/best", params=single, headers=reader)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert api.post("/v1/configs/best/batch", json=batch, headers=reader).status_code == 429
    assert api.get(f"/v1/artifacts/{'0' * 64}", headers=reader).status_code == 429
    other = _key(Scope.read)  # per key
    assert api.get("/v1/configs/best", params=single, headers=other).status_code == 404


def test_a_batch_larger_than_a_minutes_lookups_runs_once_then_waits_for_its_debt(app_with: Limits) -> None:
    api = app_with(LOOKUP_RATE_PER_MINUTE=6)
    workload, reader = _workload(), _key(Scope.read)
    batch = {"keys": [_lookup_key(workload, m) for m in range(1, 13)]}  # 12 keys: two minutes' worth
    assert api.post("/v1/configs/best/batch", json=batch, headers=reader).status_code == 200
    limited = api.get("/v1/configs/best", params={"workload": workload, "target": "f", "shape": "M=1"}, headers=reader)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 60  # 6 tokens owed, then 1


def test_an_export_costs_one_lookup_per_record_it_returns(app_with: Limits) -> None:
    from service.models.config import ConfigRecord
    from service.store import configs

    api = app_with(LOOKUP_RATE_PER_MINUTE=10)
    workload, reader = _workload(), _key(Scope.read)
    with session_scope() as s:
        for m in range(1, 9):
            record = ConfigRecord(workload_hash=workload, target_fingerprint="f" * 32, shape={"M": m},
                                  latency_s=1e-5, kind="sketch", config={"format": "x"}, job_id="j1")  # fmt: skip
            configs.upsert_best(s, record)
    exported = api.get("/v1/configs", params={"workload": workload}, headers=reader)
    assert exported.status_code == 200 and len(exported.json()) == 8  # 8 of 10 tokens
    assert api.get("/v1/configs", params={"workload": workload, "limit": 2}, headers=reader).status_code == 200
    assert api.get("/v1/configs", params={"workload": workload}, headers=reader).status_code == 429  # none left
    single = {"workload": workload, "target": "f" * 32, "shape": "M=1"}
    assert api.get("/v1/configs/best", params=single, headers=reader).status_code == 429  # the same bucket


def test_a_bucket_charged_after_the_work_runs_into_debt() -> None:
    clock = _Clock()
    bucket = TokenBucket(60, clock=clock)  # one token a second, 60 at most
    assert bucket.take("k") == 0
    bucket.charge("k", 100)  # 59 - 100: 41 owed
    assert bucket.take("k") == pytest.approx(42.0)
    clock.now += 42
    assert bucket.take("k") == 0
    bucket.charge("new", 10)  # an unseen key starts full
    assert bucket.take("new", 50) == 0


def test_failed_authentications_are_throttled_per_address(app_with: Limits) -> None:
    api = app_with(AUTH_FAILURES_PER_MINUTE=3)
    good = _key(Scope.read)
    assert api.get("/v1/jobs", headers=good).status_code == 200  # known good from now on (the 10 s key cache)
    waiting = _key(Scope.read)  # valid, but never used yet
    bad = [{"Authorization": f"Bearer kf_guess{i}"} for i in range(5)]
    assert [api.get("/v1/jobs", headers=h).status_code for h in bad[:3]] == [401, 401, 401]
    for headers in (bad[3], {"Authorization": "Basic abc"}, {"X-API-Key": "kf_guess9"}, waiting):
        throttled = api.get("/v1/jobs", headers=headers)  # the store is not asked, whatever the key
        assert throttled.status_code == 429, headers
        assert int(throttled.headers["retry-after"]) >= 1 and "failed authentications" in throttled.json()["detail"]
    assert api.get("/v1/jobs", headers=good).status_code == 200  # a key already known good still passes
    assert api.get("/v1/jobs").status_code == 401  # no key presented: nothing guessed, a plain 401
    with TestClient(api.app, client=("198.51.100.4", 40000)) as elsewhere:
        assert elsewhere.get("/v1/jobs", headers=bad[4]).status_code == 401  # per address
        assert elsewhere.get("/v1/jobs", headers=waiting).status_code == 200


def test_the_dashboard_sign_in_form_counts_against_the_same_address_limit(app_with: Limits) -> None:
    api = app_with(AUTH_FAILURES_PER_MINUTE=2)
    origin = {"Origin": "http://testserver"}

    def sign_in(key: str) -> Any:
        return api.post("/dashboard/login", data={"key": key, "next": "/dashboard"}, headers=origin)

    assert [sign_in(f"kf_guess{i}").status_code for i in range(2)] == [401, 401]
    throttled = sign_in("kf_guess9")  # the form is no way around the API's throttle
    assert throttled.status_code == 429 and "Too many failed sign-ins" in throttled.text
    assert int(throttled.headers["retry-after"]) >= 1
    assert api.get("/v1/jobs", headers={"Authorization": "Bearer kf_guess10"}).status_code == 429  # one count


def test_bad_keys_from_many_addresses_keep_a_bounded_number_of_buckets(app_with: Limits) -> None:
    from service.api.state import auth_failure_bucket

    api = app_with(AUTH_FAILURES_PER_MINUTE=1)
    auth_failure_bucket().max_keys = 20
    for i in range(60):
        with TestClient(api.app, client=(f"192.0.2.{i}", 40000)) as caller:
            assert caller.get("/v1/jobs", headers={"Authorization": "Bearer kf_bad"}).status_code == 401
    assert len(auth_failure_bucket()) == 20


def test_metrics_need_a_key_with_the_read_scope(app_with: Limits) -> None:
    api = app_with()
    assert api.get("/metrics").status_code == 401
    assert api.get("/metrics", headers=_key(Scope.telemetry)).status_code == 403
    resp = api.get("/metrics", headers=_key(Scope.read))
    assert resp.status_code == 200 and "kernelfleet_jobs" in resp.text
