"""The dashboard in-process (FastAPI TestClient, real SQLite and PostgreSQL stores): signing in with a key kept
in an HttpOnly SameSite=Strict cookie, scopes, the cross-site check on forms, clear 4xx, and pages built from
real store rows. The browser tests (test_dashboard_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

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


def _shown_secret(page: str) -> str | None:
    if 'id="created-secret"' not in page:
        return None
    return page.split('id="created-secret" class="secret">')[1].split("<")[0]


def _create_key(client: TestClient, name: str, scopes: list[str]) -> str:
    """Create a key with the keys page's form, as a browser does: the POST, then the page it redirects to."""
    created = client.post("/dashboard/keys", data={"name": name, "scopes": scopes}, headers=ORIGIN)
    assert created.status_code == 303 and created.headers["location"] == "/dashboard/keys", created.text
    secret = _shown_secret(client.get("/dashboard/keys").text)
    assert secret is not None
    return secret


def _workload(url: str | None = None) -> str:
    """A dense workload registered in the store at `url` (default: this process's store)."""
    from service.models import WorkloadSpec
    from service.store import catalog

    with session_scope(url) as s:
        return catalog.put_workload(s, WorkloadSpec(op="dense", dims={"N": 64, "K": 64}, symbolic=["M"])).workload_hash


def _job_row(workload_hash: str, url: str | None = None, **columns: Any) -> str:
    """A job written straight to the store at `url` (as the API and a worker would leave it), `columns` set."""
    from service.store.tables import JobRow, utcnow

    values: dict[str, Any] = {
        "kind": "sketch",
        "state": "queued",
        "queue": "cpu",
        "distribution": {},
        "target": {"kind": "llvm", "mcpu": "znver4"},
        "budget": {},
        "tags": {},
        "created_at": utcnow(),
        **columns,
    }
    job_id = str(uuid.uuid4())
    with session_scope(url) as s:
        s.add(JobRow(id=job_id, workload_hash=workload_hash, **values))
    return job_id


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
    new_key = _create_key(browser, "ci bot", ["read", "submit"])
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
    from service.models import ConfigRecord
    from service.models.config import MeasuredCandidate
    from service.store import configs

    wh = _workload()
    target = {"kind": "gemmini", "arch": "default"}
    job_id = _job_row(wh, kind="gemmini", state="succeeded", queue="firesim", target=target)
    with session_scope() as s:
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


def _embedded(page: str, element_id: str) -> Any:
    """The JSON a page embeds for its scripts (<script type="application/json" id=...>)."""
    return json.loads(page.split(f'id="{element_id}">')[1].split("</script>")[0])


def _link(page: str, element_id: str) -> tuple[str, bool] | None:
    """A link's href and whether it is hidden, or None when the page has no such link."""
    found = re.search(rf'<a id="{element_id}" href="([^"]*)"\s*(hidden)?>', page)
    return (unescape(found[1]), bool(found[2])) if found else None


def test_creating_a_key_redirects_and_shows_its_secret_once(browser: TestClient) -> None:
    _sign_in(browser, _secret("admin"))
    created = browser.post("/dashboard/keys", data={"name": "deploy bot", "scopes": ["read"]}, headers=ORIGIN)
    # POST, then redirect, then GET: reloading the page the browser lands on creates no second key
    assert created.status_code == 303 and created.headers["location"] == "/dashboard/keys"
    handed = next(c for c in created.headers.get_list("set-cookie") if c.startswith("kf_new_key="))
    secret = handed.split(";")[0].removeprefix("kf_new_key=")
    assert secret.startswith("kf_") and secret not in created.headers["location"]
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/dashboard/keys", "Max-Age=60"):
        assert attribute.lower() in handed.lower(), handed

    shown = browser.get("/dashboard/keys")
    assert shown.status_code == 200 and _shown_secret(shown.text) == secret
    assert "<strong>deploy bot</strong> created with scopes read." in shown.text
    assert 'kf_new_key=""' in shown.headers["set-cookie"]  # the page that showed it drops it
    assert browser.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    reloaded = browser.get("/dashboard/keys")
    assert reloaded.status_code == 200 and _shown_secret(reloaded.text) is None
    assert reloaded.text.count("deploy bot") == 1  # listed once: the reload created nothing

    browser.cookies.set("kf_new_key", "kf_forged", path="/dashboard/keys")
    assert _shown_secret(browser.get("/dashboard/keys").text) is None  # only a real key's secret is shown


def test_a_job_page_says_whether_it_published_its_tags_and_that_ok_candidates_are_no_errors(
    browser: TestClient,
) -> None:
    from service.models.config import MeasuredCandidate
    from service.store import configs

    wh = _workload()
    reason = "M=8: the vendor was faster as the SDK calls both"
    tags = {"team": "search", "model": "bert-tiny"}
    job_id = _job_row(wh, state="succeeded", published=False, publish_reason=reason, tags=tags)
    with session_scope() as s:
        ok = [MeasuredCandidate({"tile": t}, 1e-5 * t, "ok") for t in (1, 2, 3)]
        configs.record_candidates(s, job_id, wh, "f" * 32, "M=8", ok)
    others = {
        _job_row(wh, state="running"): "not yet: a job publishes when it ends",
        _job_row(wh, state="failed"): "no: the job failed",
        _job_row(wh, state="succeeded", published=True, publish_reason="M=1: slower"): "yes; held back: M=1: slower",
    }
    _sign_in(browser, _secret("read"))

    page = unescape(browser.get(f"/dashboard/jobs/{job_id}").text)
    assert f'id="job-published">no: {reason}<' in page
    assert "bert-tiny" in page and "model=bert-tiny" in page and "team=search" in page
    errors = next(p for p in _embedded(page, "panels-data") if p["id"] == "errors")
    assert not errors["has_data"] and errors["empty"] == "no errors: all 3 candidates were measured ok"
    feed = browser.get(f"/dashboard/api/jobs/{job_id}").json()
    assert feed["job"]["publication"] == f"no: {reason}" and feed["job"]["tags"] == tags  # what the page polls
    for other, says in others.items():
        assert browser.get(f"/dashboard/api/jobs/{other}").json()["job"]["publication"] == says


def test_best_configs_list_shapes_in_numeric_order(browser: TestClient) -> None:
    from service.models import ConfigRecord
    from service.store import configs

    wh = _workload()
    with session_scope() as s:
        for m in (1, 10, 100, 2, 9):
            record = ConfigRecord(workload_hash=wh, target_fingerprint="f" * 32, shape={"M": m}, latency_s=1e-6 * m,
                                  kind="sketch", config={})  # fmt: skip
            configs.upsert_best(s, record)
    admin = _secret("admin")
    listed = browser.get("/v1/configs", params={"workload": wh}, headers={"Authorization": f"Bearer {admin}"})
    assert [r["shape"]["M"] for r in listed.json()] == [1, 2, 9, 10, 100]
    first = browser.get("/v1/configs", params={"limit": 3}, headers={"Authorization": f"Bearer {admin}"})
    assert [r["shape"]["M"] for r in first.json()] == [1, 2, 9]  # a limit keeps the smallest shapes
    _sign_in(browser, admin)
    page = browser.get("/dashboard/configs", params={"workload": wh}).text
    assert re.findall(r"<td>(M=\d+)</td>", page) == ["M=1", "M=2", "M=9", "M=10", "M=100"]


def test_job_and_model_lists_page_through_every_item(browser: TestClient) -> None:
    from service.store import models

    wh = _workload()
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ids = [_job_row(wh, state="succeeded", created_at=start + dt.timedelta(minutes=i)) for i in range(103)]
    newest_first = ids[::-1]
    _sign_in(browser, _secret("read"))

    first = browser.get("/dashboard/jobs", params={"state": "succeeded"}).text
    listing = _embedded(first, "jobs-data")
    assert [j["id"] for j in listing["jobs"]] == newest_first[:100]
    assert "jobs 1–100 of 103, newest first" in first
    assert _link(first, "jobs-pager-older") == ("/dashboard/jobs?state=succeeded&offset=100", False)  # filters kept
    assert _link(first, "jobs-pager-newer") is None
    second = browser.get("/dashboard/jobs", params={"state": "succeeded", "offset": 100}).text
    assert [j["id"] for j in _embedded(second, "jobs-data")["jobs"]] == newest_first[100:]
    assert "jobs 101–103 of 103" in second
    assert _link(second, "jobs-pager-newer") == ("/dashboard/jobs?state=succeeded", False)
    assert _link(second, "jobs-pager-older") == ("/dashboard/jobs?state=succeeded&offset=200", True)  # none (yet)
    feed = browser.get("/dashboard/api/jobs", params={"offset": 100}).json()  # what the live page polls
    assert [j["id"] for j in feed["jobs"]] == newest_first[100:] and not feed["more"]
    for bad in ("-1", "1000001", "x"):
        resp = browser.get("/dashboard/jobs", params={"offset": bad})
        assert resp.status_code == 422 and "offset" in resp.text, bad
    assert browser.get("/dashboard/api/jobs", params={"offset": -1}).status_code == 422

    with session_scope() as s:
        for i in range(101):
            models.create_model(s, name=f"m{i:03}", kind="sketch", target={}, budget={}, split={}, tags={},
                                owner_key_id=None, ops=[])  # fmt: skip
    page = browser.get("/dashboard/models").text
    assert "models 1–100 of 101" in page
    assert _link(page, "models-pager-older") == ("/dashboard/models?offset=100", False)
    last = browser.get("/dashboard/models", params={"offset": 100}).text
    assert "models 101–101 of 101" in last and _link(last, "models-pager-newer") == ("/dashboard/models", False)
    assert len(re.findall(r'<a href="/dashboard/models/', last)) == 1


def test_a_model_page_shows_its_tags_and_where_each_op_occurs(browser: TestClient) -> None:
    from service.store import models

    wh = _workload()
    sources = ["encoder.layer.0.attention.self.query", "encoder.layer.1.attention.self.query"]
    op = {"name": "dense(M=batch*seq)", "workload_hash": wh, "job_id": None, "occurrences": 2, "distribution": {},
          "dims": {"M": "batch*seq"}, "sources": sources, "priority": 1.0, "trials": 0,
          "skipped": "no sketch here"}  # fmt: skip
    with session_scope() as s:
        model = models.create_model(s, name="bert-tiny", kind="sketch", target={"kind": "llvm"}, budget={},
                                    split={}, tags={"owner": "nlp"}, owner_key_id=None, ops=[op])  # fmt: skip
        model_id = model.id
    _sign_in(browser, _secret("read"))
    page = browser.get(f"/dashboard/models/{model_id}").text
    assert re.search(r'id="model-tags"><code class="tag">owner=nlp</code>', page)
    assert all(f"<code>{src}</code>" in page for src in sources)


def test_docs_are_served_from_this_service_under_its_own_content_security_policy(browser: TestClient) -> None:
    docs = browser.get("/docs")
    assert docs.status_code == 200
    policy = docs.headers["content-security-policy"]
    (nonce,) = re.findall(r"script-src 'self' 'nonce-([^']+)'", policy)
    assert "default-src 'self'" in policy and "style-src 'self';" in policy
    scripts = re.findall(r"<script([^>]*)>", docs.text)
    # Swagger UI from this service, and its inline start-up script allowed by this response's nonce only
    assert scripts == [' src="/docs/assets/swagger-ui-bundle.js"', f' nonce="{nonce}"']
    assert re.findall(r'href="([^"]+)"', docs.text) == ["/docs/assets/swagger-ui.css", "/dashboard/static/favicon.svg"]
    assert nonce not in browser.get("/docs").headers["content-security-policy"]  # a new nonce per response
    for asset, media_type in (("swagger-ui-bundle.js", "text/javascript"), ("swagger-ui.css", "text/css")):
        got = browser.get(f"/docs/assets/{asset}")
        assert got.status_code == 200 and got.headers["content-type"].startswith(media_type)
        again = browser.get(f"/docs/assets/{asset}", headers={"If-None-Match": got.headers["etag"]})
        assert again.status_code == 304 and not again.content  # revalidated, not sent again
    assert browser.get("/docs/assets/redoc.standalone.js").status_code == 404  # only what /docs loads
    assert browser.get("/redoc").status_code == 404
    assert browser.get("/openapi.json").json()["openapi"].startswith("3.1")  # why Swagger UI 5
