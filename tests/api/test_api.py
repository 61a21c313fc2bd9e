"""The REST API in-process (FastAPI TestClient) over real SQLite and PostgreSQL stores."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.models import ConfigRecord, TargetSpec, WorkloadSpec
from service.store import configs
from service.store.db import session_scope

DENSE = {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]}
TARGET = {"kind": "llvm", "mcpu": "znver4", "num_cores": 2}
TOOLCHAIN = {"tvm": "0.27.0.post1", "tuner_abi": "1"}


@pytest.fixture
def api(use_store: str) -> Iterator[TestClient]:
    with TestClient(create_app(run_migrations=False), headers=_key("admin")) as client:
        yield client


def job_body(**overrides: Any) -> dict[str, Any]:
    body = {
        "kind": "sketch",
        "workload": DENSE,
        "target": TARGET,
        "distribution": {"kind": "uniform", "dim": "M", "low": 1, "high": 16},
        "budget": {"trials": 8},
    }
    return {**body, **overrides}


def _loc(resp: Any) -> list[list[Any]]:
    assert resp.status_code == 422, resp.text
    return [e["loc"] for e in resp.json()["detail"]]


def test_health_and_openapi(api: TestClient) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200 and ready.json()["store"] == "ok"
    schema = api.get("/openapi.json").json()
    assert "/v1/jobs" in schema["paths"] and "/v1/configs/best" in schema["paths"]
    assert schema["components"]["schemas"]["JobSpec"]["examples"]


def test_workloads_are_idempotent(api: TestClient) -> None:
    a = api.post("/v1/workloads", json=DENSE)
    b = api.post("/v1/workloads", json={**DENSE, "attrs": {"bias": False}})
    assert a.status_code == b.status_code == 201
    assert a.json()["workload_hash"] == b.json()["workload_hash"]
    assert api.get(f"/v1/workloads/{a.json()['workload_hash']}").json()["op"] == "dense"
    assert api.get("/v1/workloads/nope").status_code == 404
    assert {o["name"] for o in api.get("/v1/operators").json()} >= {"dense", "batch_matmul", "conv2d"}


def test_submit_get_list_cancel(api: TestClient) -> None:
    resp = api.post("/v1/jobs", json=job_body())
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["state"] == "queued" and resp.headers["location"] == f"/v1/jobs/{job['id']}"
    assert api.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    listed = api.get("/v1/jobs", params={"state": "queued"}).json()
    assert listed["total"] >= 1 and job["id"] in [j["id"] for j in listed["jobs"]]
    cancelled = api.post(f"/v1/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "cancelled"
    assert api.get("/v1/jobs/does-not-exist").status_code == 404
    # a job by registered workload hash
    wh = job["workload_hash"]
    assert api.post("/v1/jobs", json=job_body(workload=wh)).status_code == 202


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (job_body(workload={"op": "dense", "dims": {"N": 8}, "symbolic": ["M"]}), ["body", "workload"]),
        (job_body(workload="0" * 32), ["body", "workload"]),
        (job_body(target={"kind": "llvm", "num_cores": 2}), ["body", "target"]),
        (job_body(target={"kind": "gemmini", "arch": "default"}), ["body", "target", "kind"]),
        (job_body(distribution={"kind": "uniform", "dim": "T", "low": 1, "high": 4}), ["body", "distribution"]),
        (job_body(distribution={"kind": "uniform", "dim": "M", "low": 1, "high": 10**6}), ["body", "distribution"]),
        (job_body(budget={"trials": 0}), ["body", "budget", "trials"]),
        (job_body(budget={"trials": 10**9}), ["body", "budget", "trials"]),
        (job_body(kind="rm -rf /"), ["body", "kind"]),
        (job_body(extra="field"), ["body", "extra"]),
    ],
)
def test_bad_jobs_get_422_naming_the_field(api: TestClient, body: dict[str, Any], loc: list[str]) -> None:
    locs = _loc(api.post("/v1/jobs", json=body))
    assert any(tuple(found[: len(loc)]) == tuple(loc) for found in locs), locs


def test_dense_activations_are_attributes_with_listed_choices(api: TestClient) -> None:
    """/v1/operators lists the activations; a bad one is a 422 naming attrs.activation and the choices; CPU
    ukernel jobs take a bias and an activation, CUDA ones refuse them at workload.attrs, pipeline jobs too."""
    dense = next(o for o in api.get("/v1/operators").json() if o["name"] == "dense")
    choices = ["none", "relu", "gelu", "gelu_tanh", "silu"]
    assert dense["attrs"] == {"bias": False, "activation": "none"} and dense["choices"] == {"activation": choices}
    resp = api.post("/v1/workloads", json={**DENSE, "attrs": {"activation": "swish"}})
    assert resp.status_code == 422, resp.text
    error = resp.json()["detail"][0]
    assert error["loc"][-2:] == ["attrs", "activation"] and all(c in error["msg"] for c in choices), error
    layer = {**DENSE, "attrs": {"bias": True, "activation": "gelu"}}
    assert api.post("/v1/jobs", json=job_body(kind="ukernel", workload=layer)).status_code == 202
    gpu = {"kind": "cuda", "arch": "sm_90"}
    cuda = api.post("/v1/jobs", json=job_body(kind="ukernel", workload=layer, target=gpu))
    assert _loc(cuda) == [["body", "workload", "attrs"]]
    assert "CUDA uKernels do not yet" in cuda.json()["detail"][0]["msg"]
    relu = {**DENSE, "attrs": {"activation": "relu"}}
    piped = api.post("/v1/jobs", json=job_body(kind="pipeline", workload=relu, target=gpu))
    assert _loc(piped) == [["body", "workload", "attrs", "activation"]]


@pytest.mark.parametrize("kind", ["sketch", "ukernel"])
def test_cuda_jobs_queue_for_gpu_workers_only(api: TestClient, kind: str) -> None:
    """A cuda job goes to `gpu.<arch>` (never a CPU queue) and says so while no GPU worker is live."""
    resp = api.post("/v1/jobs", json=job_body(kind=kind, target={"kind": "cuda", "arch": "sm_90"}))
    assert resp.status_code == 202, resp.text
    assert resp.json()["waiting_for_worker"] == "gpu.sm_90"
    cpu = api.post("/v1/jobs", json=job_body(kind=kind))
    assert cpu.status_code == 202 and cpu.json()["waiting_for_worker"] == "cpu.znver4"


def test_a_workload_registered_after_a_lookup_named_it_is_then_known(api: TestClient) -> None:
    """The lookup keeps the workloads it has seen (a hash names its spec forever), never the unknown ones."""
    spec = {**DENSE, "dims": {"N": 72, "K": 40}}
    wh = WorkloadSpec.model_validate(spec).hash
    query = {"workload": wh, "target": "f" * 32, "shape": "M=3"}
    assert ["query", "workload"] in _loc(api.get("/v1/configs/best", params=query))
    assert api.post("/v1/workloads", json=spec).json()["workload_hash"] == wh
    assert api.get("/v1/configs/best", params=query).status_code == 404  # a miss now, with its fallback
    assert ["query", "shape"] in _loc(api.get("/v1/configs/best", params={**query, "shape": "N=3"}))


def test_best_config_lookup_hit_miss_and_batch(api: TestClient) -> None:
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    target = api.post("/v1/targets", json={**TARGET, "toolchain": TOOLCHAIN})
    assert target.status_code == 201
    fp = target.json()["target_fingerprint"]
    assert fp == TargetSpec.model_validate({**TARGET, "toolchain": TOOLCHAIN}).fingerprint
    with session_scope() as s:
        configs.upsert_best(
            s,
            ConfigRecord(
                workload_hash=wh,
                target_fingerprint=fp,
                shape={"M": 8},
                latency_s=1e-5,
                kind="sketch",
                config={"format": "x"},
                job_id="j1",
            ),
        )
    hit = api.get("/v1/configs/best", params={"workload": wh, "target": fp, "shape": "M=8"})
    assert hit.status_code == 200 and hit.json()["latency_s"] == 1e-5 and hit.json()["job_id"] == "j1"
    miss = api.get("/v1/configs/best", params={"workload": wh, "target": fp, "shape": "M=9"})
    assert miss.status_code == 404
    assert miss.json()["fallback"]["kind"] == "default" and "vendor" in miss.json()["fallback"]["advice"]
    other = TargetSpec.model_validate({**TARGET, "toolchain": {"tvm": "0.28.0"}}).fingerprint
    assert api.get("/v1/configs/best", params={"workload": wh, "target": other, "shape": "M=8"}).status_code == 404
    assert ["query", "shape"] in _loc(
        api.get("/v1/configs/best", params={"workload": wh, "target": fp, "shape": "Q=8"})
    )
    assert ["query", "shape"] in _loc(
        api.get("/v1/configs/best", params={"workload": wh, "target": fp, "shape": "M8x"})
    )
    batch = api.post(
        "/v1/configs/best/batch",
        json={
            "keys": [
                {"workload": wh, "target": fp, "shape": {"M": 8}},
                {"workload": wh, "target": fp, "shape": {"M": 3}},
            ]
        },
    )
    results = batch.json()["results"]
    assert results[0]["latency_s"] == 1e-5 and "fallback" in results[1]
    assert len(api.get("/v1/configs", params={"workload": wh}).json()) == 1


def test_target_registration_needs_a_toolchain(api: TestClient) -> None:
    assert ["body", "toolchain"] in _loc(api.post("/v1/targets", json=TARGET))


def test_import_keeps_only_better(api: TestClient) -> None:
    from tests.api.test_validation import _trace_config

    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    rec = {
        "workload_hash": wh,
        "target": {**TARGET, "toolchain": TOOLCHAIN},
        "shape": {"M": 4},
        "latency_s": 2e-5,
        "config": _trace_config(),  # one the SDK can load: imports refuse any other
        "source": "test",
    }
    assert api.post("/v1/configs/import", json={"records": [rec]}).json() == {"imported": 1, "improved": 1}
    slower = {**rec, "latency_s": 3e-5}
    assert api.post("/v1/configs/import", json={"records": [slower]}).json() == {"imported": 1, "improved": 0}
    bad = {**rec, "shape": {"X": 1}}
    assert ["body", "records", 0, "shape"] in _loc(api.post("/v1/configs/import", json={"records": [bad]}))


def _key(*scopes: str) -> dict[str, str]:
    from service.models.auth import Scope
    from service.store import keys

    with session_scope() as s:
        created = keys.create(s, "test", [Scope(x) for x in scopes])
    return {"Authorization": f"Bearer {created.key}"}


def test_every_v1_route_needs_a_key(use_store: str) -> None:
    with TestClient(create_app(run_migrations=False)) as anon:
        schema = anon.get("/openapi.json").json()
        for path, methods in schema["paths"].items():
            if not path.startswith("/v1"):
                continue
            for method in methods:
                url = path.replace("{workload_hash}", "x").replace("{job_id}", "x").replace("{fingerprint}", "x")
                url = url.replace("{key_id}", "x")
                assert anon.request(method.upper(), url).status_code == 401, (method, path)
        assert anon.get("/v1/jobs", headers={"Authorization": "Bearer kf_wrong"}).status_code == 401
        assert anon.get("/v1/jobs", headers={"Authorization": "Basic abc"}).status_code == 401
        assert anon.get("/healthz").status_code == 200


def test_scopes_and_ownership(use_store: str) -> None:
    reader, submitter, other, admin = _key("read"), _key("submit", "read"), _key("submit"), _key("admin")
    with TestClient(create_app(run_migrations=False)) as c:
        assert c.get("/v1/jobs", headers=reader).status_code == 200
        assert c.post("/v1/jobs", json=job_body(), headers=reader).status_code == 403
        job = c.post("/v1/jobs", json=job_body(), headers=submitter).json()
        assert c.post(f"/v1/jobs/{job['id']}/cancel", headers=other).status_code == 403
        assert c.post(f"/v1/jobs/{job['id']}/cancel", headers=admin).json()["state"] == "cancelled"
        assert c.get("/v1/keys", headers=submitter).status_code == 403
        made = c.post("/v1/keys", json={"name": "bot", "scopes": ["read"]}, headers=admin)
        assert made.status_code == 201
        bot = {"Authorization": f"Bearer {made.json()['key']}"}
        assert c.get("/v1/jobs", headers=bot).status_code == 200
        assert made.json()["key"] not in c.get("/v1/keys", headers=admin).text
        assert c.post(f"/v1/keys/{made.json()['id']}/revoke", headers=admin).json()["revoked_at"]
        assert c.get("/v1/jobs", headers=bot).status_code == 401
        assert ["body", "scopes", 0] in _loc(c.post("/v1/keys", json={"name": "x", "scopes": ["root"]}, headers=admin))


def test_submit_rate_limit_and_body_size(use_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from service.api.state import submit_bucket
    from service.settings import get_settings

    monkeypatch.setenv("KERNELFLEET_SUBMIT_RATE_PER_MINUTE", "3")
    monkeypatch.setenv("KERNELFLEET_MAX_BODY_BYTES", "4096")
    get_settings.cache_clear()
    submit_bucket.cache_clear()
    try:
        headers = _key("submit")
        with TestClient(create_app(run_migrations=False)) as c:
            codes = [c.post("/v1/workloads", json=DENSE, headers=headers).status_code for _ in range(5)]
            assert codes[:3] == [201, 201, 201] and codes[3] == 429
            limited = c.post("/v1/workloads", json=DENSE, headers=headers)
            assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
            assert c.post("/v1/workloads", json=DENSE, headers=_key("submit")).status_code == 201  # per key
            huge = {"kind": "explicit", "points": [{"shape": {"M": i}, "weight": 1} for i in range(1, 400)]}
            assert c.post("/v1/jobs", json=job_body(distribution=huge), headers=headers).status_code == 413
    finally:
        get_settings.cache_clear()
        submit_bucket.cache_clear()


def test_metrics_and_status(api: TestClient) -> None:
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    api.post("/v1/jobs", json=job_body())
    api.get("/v1/configs/best", params={"workload": wh, "target": "f" * 32, "shape": "M=8"})
    text = api.get("/metrics").text
    for name in (
        'kernelfleet_jobs{state="queued"}',
        "kernelfleet_queue_depth",
        "kernelfleet_lookup_seconds_bucket",
        'kernelfleet_lookups_total{outcome="miss"}',
        "kernelfleet_trials_per_second",
    ):
        assert name in text, name
    status = api.get("/v1/status").json()
    assert status["jobs"]["queued"] >= 1 and "cpu.znver4" in status["queues"]


def test_json_logs_carry_the_job_id() -> None:
    import json
    import logging

    from service.logs import JsonFormatter, for_job

    record: list[str] = []

    class Capture(logging.Handler):
        def emit(self, r: logging.LogRecord) -> None:
            record.append(JsonFormatter().format(r))

    logger = logging.getLogger("kf-test-json")
    logger.addHandler(Capture())
    for_job(logger, "job-123").warning("shape %s failed", "M=8")
    doc = json.loads(record[0])
    assert doc["job_id"] == "job-123" and doc["msg"] == "shape M=8 failed" and doc["level"] == "WARNING"


def test_telemetry_is_idempotent_and_validated(api: TestClient) -> None:
    import datetime as dt
    import uuid

    record = {"workload_hash": "ab" * 16, "target_fingerprint": "cd" * 16, "shape": {"M": 3}, "calls": 10,
              "kernel_seconds": 0.5, "fallbacks": 10}  # fmt: skip
    batch = {"batch_id": str(uuid.uuid4()), "records": [record, {**record, "calls": 5, "kernel_seconds": 0.25}]}
    assert api.post("/v1/telemetry", json=batch).json()["accepted"] == 2
    assert api.post("/v1/telemetry", json=batch).json() == {"batch_id": batch["batch_id"], "accepted": 0,
                                                            "duplicate": True}  # fmt: skip
    (row,) = api.get("/v1/fleet/usage", params={"days": 1}).json()["rows"]
    assert row["calls"] == 15 and row["kernel_seconds"] == 0.75 and row["share"] == 1.0
    tomorrow = (dt.datetime.now(dt.UTC).date() + dt.timedelta(days=2)).isoformat()
    bad = {"batch_id": str(uuid.uuid4()), "records": [{**record, "day": tomorrow}]}
    assert _loc(api.post("/v1/telemetry", json=bad)) == [["body", "records", 0, "day"]]
    bad = {"batch_id": str(uuid.uuid4()), "records": [{**record, "shape": {"M": 0}}]}
    assert api.post("/v1/telemetry", json=bad).status_code == 422
    assert api.get("/v1/fleet/reports").json() == []


def test_a_hosts_holdout_is_measured_with_its_interval_and_nothing_else_is(api: TestClient) -> None:
    import uuid

    def side(times: list[float]) -> tuple[int, float, float]:
        return len(times), sum(times), sum(t * t for t in times)

    n_s, s_s, s2_s = side([1e-5, 1.2e-5, 0.8e-5, 1e-5])
    n_b, s_b, s2_b = side([2e-5, 2.2e-5, 1.8e-5])
    held = {"baseline": "torch", "served_calls": n_s, "served_s": s_s, "served_s2": s2_s, "baseline_calls": n_b,
            "baseline_s": s_b, "baseline_s2": s2_b}  # fmt: skip
    record = {"workload_hash": "ef" * 16, "target_fingerprint": "cd" * 16, "shape": {"M": 4}, "calls": 1003,
              "kernel_seconds": 0.01, "fallbacks": 0, "table_job_id": "job-1", "holdout": held}  # fmt: skip
    other = {**record, "shape": {"M": 5}, "holdout": None}  # no A/B at M = 5: counted unmeasured, saving nothing
    assert api.post("/v1/telemetry", json={"batch_id": str(uuid.uuid4()), "records": [record, other]}).is_success
    m = api.get("/v1/fleet/savings", params={"days": 1}).json()
    assert m["days"] == 1 and m["holdout_calls"] == 3 and m["served_calls"] == 1000
    assert abs(m["saved_s_per_day"] - 1000 * (2e-5 - 1e-5)) < 1e-9 and 0 < m["ci95_s_per_day"] < m["saved_s_per_day"]
    assert 0 < m["measured_share"] < 1 and [t["shapes"] for t in m["tasks"]] == [1]
    too_many = {**record, "calls": 5}  # more calls on the two sides than the record ran
    response = api.post("/v1/telemetry", json={"batch_id": str(uuid.uuid4()), "records": [too_many]})
    assert response.status_code == 422 and "holdout" in response.text
    response = api.get("/v1/fleet/savings", params={"since": "2026-11-20", "until": "2026-11-19"})
    assert _loc(response) == [["query", "since"]]


def test_a_write_commits_before_its_response_is_sent(use_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The route's transaction commits before the response starts (SessionDep's scope="function"): a client is never
    told 200 for a write whose commit then fails, and a read right after an acknowledged write sees it."""
    import uuid

    from sqlalchemy.orm import Session

    events: list[str] = []
    commit = Session.commit

    def recorded_commit(self: Session) -> None:
        commit(self)
        events.append("commit")

    monkeypatch.setattr(Session, "commit", recorded_commit)
    app = create_app(run_migrations=False)

    async def watched(scope: Any, receive: Any, send: Any) -> None:
        async def send_and_note(message: Any) -> None:
            if message["type"] == "http.response.start":
                events.append("response")
            await send(message)

        await app(scope, receive, send_and_note)

    record = {"workload_hash": "ab" * 16, "target_fingerprint": "cd" * 16, "shape": {"M": 3}, "calls": 1,
              "kernel_seconds": 0.5}  # fmt: skip
    with TestClient(watched, headers=_key("admin")) as client:  # type: ignore[arg-type]
        events.clear()
        assert client.post("/v1/telemetry", json={"batch_id": str(uuid.uuid4()), "records": [record]}).is_success
    # the route's commit is the last one (authentication commits its own lookup first)
    last_commit = max(i for i, event in enumerate(events) if event == "commit")
    assert last_commit < events.index("response"), events
