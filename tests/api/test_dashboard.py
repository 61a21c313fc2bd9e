"""The dashboard in-process (FastAPI TestClient, real SQLite and PostgreSQL stores): signing in with a key kept
in an HttpOnly SameSite=Strict cookie, scopes, the cross-site check on forms, clear 4xx, and pages built from
real store rows. The browser tests (test_dashboard_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html import unescape

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.models.auth import Scope
from service.store import keys
from service.store.db import session_scope

BASE = "http://testserver"
ORIGIN = {"Origin": BASE}
JOB = {
    "kind": "sketch",
    "workload": {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]},
    "target": {"kind": "llvm", "mcpu": "znver4", "num_cores": 2},
    "distribution": {"kind": "uniform", "dim": "M", "low": 1, "high": 16},
    "budget": {"trials": 8},
}


def _secret(*scopes: str) -> str:
    with session_scope() as s:
        return keys.create(s, "dash", [Scope(x) for x in scopes]).key


@pytest.fixture
def browser(use_store: str) -> Iterator[TestClient]:
    with TestClient(create_app(run_migrations=False), base_url=BASE, follow_redirects=False) as client:
        yield client


def _sign_in(client: TestClient, secret: str) -> None:
    resp = client.post("/dashboard/login", data={"key": secret, "next": "/dashboard/jobs"}, headers=ORIGIN)
    assert resp.status_code == 303 and resp.headers["location"] == "/dashboard/jobs", resp.text


def test_pages_need_a_signed_in_key_kept_in_a_strict_httponly_cookie(browser: TestClient) -> None:
    resp = browser.get("/dashboard/jobs?state=running")
    assert (
        resp.status_code == 303
        and resp.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Fjobs%3Fstate%3Drunning"
    )
    assert browser.get("/dashboard/api/jobs").status_code == 401  # feeds answer JSON, not a redirect
    lapsed = browser.post("/dashboard/jobs/x/cancel", headers=ORIGIN)
    assert lapsed.status_code == 303 and lapsed.headers["location"] == "/dashboard/login?next=%2Fdashboard%2Fjobs"
    login = browser.get("/dashboard/login")
    assert login.status_code == 200 and 'type="password"' in login.text
    assert "default-src 'self'" in login.headers["content-security-policy"]

    bad = browser.post("/dashboard/login", data={"key": "kf_not-a-key"}, headers=ORIGIN)
    assert bad.status_code == 401 and "not valid" in bad.text and "set-cookie" not in bad.headers
    telemetry_only = browser.post("/dashboard/login", data={"key": _secret("telemetry")}, headers=ORIGIN)
    assert telemetry_only.status_code == 403 and "read" in telemetry_only.text

    secret = _secret("read")
    resp = browser.post("/dashboard/login", data={"key": secret, "next": "https://evil.example/x"}, headers=ORIGIN)
    assert resp.status_code == 303 and resp.headers["location"] == "/dashboard/jobs"  # never off-site
    cookie = resp.headers["set-cookie"]
    assert secret not in resp.headers["location"]
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/dashboard"):
        assert attribute.lower() in cookie.lower(), cookie
    assert browser.get("/dashboard/jobs").status_code == 200

    out = browser.post("/dashboard/logout", headers=ORIGIN)
    assert out.status_code == 303 and 'kf_dashboard_key=""' in out.headers["set-cookie"]
    assert browser.get("/dashboard/jobs").status_code == 303


def test_forms_refuse_cross_site_posts(browser: TestClient) -> None:
    secret = _secret("admin")
    for headers in ({}, {"Origin": "https://evil.example"}, {"Origin": "null"}, {"Referer": "https://evil.example/"}):
        resp = browser.post("/dashboard/login", data={"key": secret}, headers=headers)
        assert resp.status_code == 403 and "cross-site" in resp.text, headers
    # a same-origin Referer is accepted where a browser sends no Origin
    resp = browser.post("/dashboard/login", data={"key": secret}, headers={"Referer": f"{BASE}/dashboard/login"})
    assert resp.status_code == 303
    assert browser.post("/dashboard/keys", data={"name": "x", "scopes": "read"}).status_code == 403


def test_scopes_read_sees_submit_cancels_admin_manages_keys(browser: TestClient) -> None:
    admin = {"Authorization": f"Bearer {_secret('admin')}"}
    submitter = _secret("submit", "read")
    job = browser.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {submitter}"}).json()

    _sign_in(browser, _secret("read"))
    page = browser.get(f"/dashboard/jobs/{job['id']}")
    assert page.status_code == 200 and job["id"] in page.text and "cancel-button" not in page.text
    refused = browser.post(f"/dashboard/jobs/{job['id']}/cancel", headers=ORIGIN)
    assert refused.status_code == 403 and "'submit' scope" in unescape(refused.text)
    keys_page = browser.get("/dashboard/keys")
    assert keys_page.status_code == 403 and "'admin' scope" in unescape(keys_page.text)
    for path in ("/dashboard/configs", "/dashboard/fleet", "/dashboard/gemmini", "/dashboard/api/jobs"):
        assert browser.get(path).status_code == 200, path
    assert 'id="gemmini-empty"' in browser.get("/dashboard/gemmini").text  # no Gemmini job: the empty state

    _sign_in(browser, submitter)  # the key that submitted the job may cancel it
    assert "cancel-button" in browser.get(f"/dashboard/jobs/{job['id']}").text
    done = browser.post(f"/dashboard/jobs/{job['id']}/cancel", headers=ORIGIN)
    assert done.status_code == 303
    assert browser.get(f"/v1/jobs/{job['id']}", headers=admin).json()["state"] == "cancelled"
    other = browser.post("/v1/jobs", json=JOB, headers=admin).json()
    assert browser.post(f"/dashboard/jobs/{other['id']}/cancel", headers=ORIGIN).status_code == 403  # not its own

    _sign_in(browser, _secret("admin"))
    created = browser.post("/dashboard/keys", data={"name": "ci bot", "scopes": ["read", "submit"]}, headers=ORIGIN)
    assert created.status_code == 201 and 'id="created-secret"' in created.text
    new_key = created.text.split('id="created-secret" class="secret">')[1].split("<")[0]
    assert browser.get("/v1/jobs", headers={"Authorization": f"Bearer {new_key}"}).status_code == 200
    bad = browser.post("/dashboard/keys", data={"name": "x", "scopes": "root"}, headers=ORIGIN)
    assert bad.status_code == 422 and "root" in bad.text
    key_id = next(k["id"] for k in browser.get("/v1/keys", headers=admin).json() if k["name"] == "ci bot")
    assert browser.post(f"/dashboard/keys/{key_id}/revoke", headers=ORIGIN).status_code == 303
    from service.api.auth import clear_cache

    clear_cache()
    assert browser.get("/v1/jobs", headers={"Authorization": f"Bearer {new_key}"}).status_code == 401


def test_bad_input_is_a_4xx_naming_the_field(browser: TestClient) -> None:
    _sign_in(browser, _secret("read"))
    resp = browser.get("/dashboard/jobs?state=exploded")
    assert resp.status_code == 422 and "state" in resp.text
    assert browser.get("/dashboard/api/jobs?state=exploded").json()["detail"].startswith("field 'state'")
    assert browser.get("/dashboard/jobs?kind=nope").status_code == 422
    assert browser.get("/dashboard/configs?workload=ZZ").status_code == 422
    assert browser.get("/dashboard/fleet?days=0").status_code == 422
    assert browser.get("/dashboard/jobs/nope").status_code == 404
    assert browser.get("/dashboard/api/jobs/nope").status_code == 404
    assert browser.get(f"/dashboard/gemmini?job={'0' * 36}").status_code == 404
    assert browser.get("/dashboard/static/..%2Fpages.py").status_code == 404
    assert browser.get("/dashboard/static/charts.js").headers["content-type"].startswith("text/javascript")


def test_a_queued_job_page_and_feed(browser: TestClient) -> None:
    admin = _secret("admin")
    job = browser.post("/v1/jobs", json=JOB, headers={"Authorization": f"Bearer {admin}"}).json()
    _sign_in(browser, admin)
    listing = browser.get("/dashboard/api/jobs", params={"kind": "sketch", "state": "queued"}).json()
    assert [j["id"] for j in listing["jobs"]] == [job["id"]] and listing["jobs"][0]["progress"] == 0.0
    assert browser.get("/dashboard/api/jobs", params={"state": "running"}).json()["total"] == 0
    feed = browser.get(f"/dashboard/api/jobs/{job['id']}").json()
    assert feed["job"]["state"] == "queued" and feed["candidates_total"] == 0
    ids = [p["id"] for p in feed["panels"]]
    assert {"curve-trials", "curve-time", "shapes", "candidates", "errors"} <= set(ids)
    shapes = next(p for p in feed["panels"] if p["id"] == "shapes")
    assert len(shapes["rows"]) == len(job["shapes"])  # the planned shapes, none measured yet
    assert not next(p for p in feed["panels"] if p["id"] == "curve-trials")["has_data"]  # nothing measured yet
    again = browser.get(f"/dashboard/api/jobs/{job['id']}", params={"known": feed["version"]}).json()
    assert again["panels"] is None and again["version"] == feed["version"]  # unchanged: no panels rebuilt


def test_gemmini_page_plots_candidates_that_carry_latency_and_energy(browser: TestClient) -> None:
    """Rendering only. The rows below are shaped like a Gemmini co-tuning job's (the kind lands separately and its
    real jobs are tested with it); they are written through the store as a worker writes them, not measured."""
    import uuid

    from service.models import ConfigRecord, WorkloadSpec
    from service.models.config import MeasuredCandidate
    from service.store import catalog, configs
    from service.store.tables import JobRow, utcnow

    with session_scope() as s:
        wh = catalog.put_workload(s, WorkloadSpec(op="dense", dims={"N": 64, "K": 64}, symbolic=["M"])).workload_hash
        job_id = str(uuid.uuid4())
        s.add(
            JobRow(id=job_id, kind="gemmini", state="succeeded", workload_hash=wh, queue="firesim", distribution={},
                   target={"kind": "gemmini", "arch": "default"}, budget={}, tags={}, created_at=utcnow())
        )  # fmt: skip
        s.flush()
        explored = [
            MeasuredCandidate({"hw": {"dim": d}, "measured_energy_pj": e, "role": r}, latency, "ok")
            for d, latency, e, r in [(8, 4e-3, 9e8, ""), (16, 2e-3, 6e8, "chosen"), (16, 3e-3, 8e8, "default")]
        ]
        configs.record_candidates(s, job_id, wh, "f" * 32, "network", explored)
        edp = {"tuned": 1.2e-3, "default": 2.4e-3, "backend": "zigzag"}
        record = ConfigRecord(workload_hash=wh, target_fingerprint="f" * 32, shape={"M": 64}, latency_s=2e-3,
                              kind="gemmini", config={}, job_id=job_id, provenance={"network_edp": edp})  # fmt: skip
        configs.upsert_best(s, record)
    _sign_in(browser, _secret("read"))
    for path in ("/dashboard/gemmini", f"/dashboard/gemmini?job={job_id}"):
        page = browser.get(path)
        assert page.status_code == 200 and 'id="gemmini-summary"' in page.text
        assert "EDP gain" in page.text and "default / co-tuned = 2.00×" in page.text and "zigzag" in page.text
        panels = page.text.split('id="panels-data">')[1].split("</script>")[0]
        scatter = json.loads(panels)[0]
        assert scatter["has_data"] and {s["name"]: len(s["points"]) for s in scatter["series"]} == {
            "measured": 1,
            "default config": 1,
            "chosen": 1,
        }
    assert "panel" in browser.get(f"/dashboard/jobs/{job_id}").text  # its job page: the default panels + scatter
    feed = browser.get(f"/dashboard/api/jobs/{job_id}").json()
    assert feed["panels"][0]["id"] == "energy" and feed["panels"][0]["has_data"]
