"""Models in-process (FastAPI TestClient over SQLite and PostgreSQL): validation 422s naming the field, the budget
split ∝ FLOPs × weight × occurrences with a floor, skipped ops, progress aggregated over the jobs, cancel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.models import JobState
from service.models.model import split_budget
from service.store import jobs
from service.store.db import session_scope
from tests.api.test_api import _key

TARGET = {"kind": "llvm", "mcpu": "znver4", "num_cores": 2}
GPU = {"kind": "cuda", "arch": "sm_90"}


def _explicit(*points: tuple[int, float], dim: str = "M") -> dict[str, Any]:
    return {"kind": "explicit", "points": [{"shape": {dim: m}, "weight": w} for m, w in points]}


def _dense(n: int, k: int, **attrs: Any) -> dict[str, Any]:
    return {"op": "dense", "dims": {"N": n, "K": k}, "symbolic": ["M"], "attrs": attrs}


def _op(
    name: str, workload: dict[str, Any], occurrences: int = 1, dist: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "workload": workload,
        "occurrences": occurrences,
        "distribution": dist or _explicit((8, 1.0)),
        "dims": {"M": "batch*seq", **workload.get("dims", {})},
    }


def model_body(**overrides: Any) -> dict[str, Any]:
    body = {
        "name": "tiny-mlp",
        "target": TARGET,
        "ops": [
            _op("fc1", _dense(64, 32, bias=True, activation="gelu"), 1),
            _op("fc2", _dense(32, 64, bias=True), 1),
        ],
        "budget": {"trials": 40, "min_trials": 4},
    }
    return {**body, **overrides}


@pytest.fixture
def api(use_store: str) -> Iterator[TestClient]:
    with TestClient(create_app(run_migrations=False), headers=_key("admin")) as client:
        yield client


def _locs(resp: Any) -> list[list[Any]]:
    assert resp.status_code == 422, resp.text
    return [e["loc"] for e in resp.json()["detail"]]


def test_split_budget_gives_the_floor_then_the_rest_by_priority_exactly() -> None:
    assert split_budget([1.0, 3.0], 40, 4) == [12, 28]
    assert sum(split_budget([1.0, 2.0, 3.0], 100, 5)) == 100
    assert split_budget([1.0, 1e9], 10, 5) == [5, 5]
    with pytest.raises(ValueError):
        split_budget([1.0, 1.0], 9, 5)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        (model_body(ops=[]), ["body", "ops"]),
        (model_body(ops=[_op("a", _dense(8, 8)), _op("a", _dense(16, 8))]), ["body", "ops", 1, "name"]),
        (
            model_body(ops=[_op("a", {"op": "dense", "dims": {"N": 8}, "symbolic": ["M"]})]),
            ["body", "ops", 0, "workload"],
        ),
        (
            model_body(ops=[_op("a", _dense(8, 8, activation="swish"))]),
            ["body", "ops", 0, "workload", "attrs", "activation"],
        ),
        (
            model_body(ops=[_op("a", _dense(8, 8), dist=_explicit((4, 1.0), dim="T"))]),
            ["body", "ops", 0, "distribution"],
        ),
        (model_body(ops=[_op("a", _dense(8, 8), occurrences=0)]), ["body", "ops", 0, "occurrences"]),
        # each weight finite, their sum not: a NaN priority was stored as NULL (a 500) — issue 34 item 3
        (
            model_body(ops=[_op("a", _dense(8, 8), dist=_explicit((4, 1e308), (8, 1e308)))]),
            ["body", "ops", 0, "distribution"],
        ),
        (model_body(target={"kind": "llvm", "num_cores": 2}), ["body", "target"]),
        (model_body(kind="nope"), ["body", "kind"]),
        (model_body(budget={"trials": 7, "min_trials": 4}), ["body", "budget", "trials"]),
        (model_body(budget={"seconds": 60}), ["body", "budget", "seconds"]),
        # CUDA uKernels fuse no bias or activation: the attrs are named, the op is not skipped
        (model_body(kind="ukernel", target=GPU), ["body", "ops", 0, "workload", "attrs"]),
    ],
)
def test_bad_models_get_422_naming_the_field(api: TestClient, body: dict[str, Any], loc: list[Any]) -> None:
    locs = _locs(api.post("/v1/models", json=body))
    assert any(found[: len(loc)] == loc for found in locs), locs
    assert api.get("/v1/models").json()["total"] == 0  # nothing was stored


def test_a_model_starts_one_job_per_op_with_the_budget_split_by_flops_weight_and_occurrences(api: TestClient) -> None:
    # fc1 at M=8 or 24 (mean 16 under the weights) × 3 occurrences; fc2 at M=16 once: 2·M·N·K (+ M·N bias)
    body = model_body(
        ops=[
            _op("fc1", _dense(64, 32), 3, _explicit((8, 0.5), (24, 0.5))),
            _op("fc2", _dense(32, 64, bias=True), 1, _explicit((16, 1.0))),
        ],
        budget={"trials": 100, "min_trials": 10, "max_shapes": 2},
    )
    resp = api.post("/v1/models", json=body)
    assert resp.status_code == 202, resp.text
    model = resp.json()
    assert resp.headers["location"] == f"/v1/models/{model['id']}"
    p1, p2 = 3 * 2 * 16 * 64 * 32, 2 * 16 * 32 * 64 + 16 * 32
    fc1, fc2 = model["ops"]
    assert fc1["priority"] == pytest.approx(p1) and fc2["priority"] == pytest.approx(p2)
    assert fc1["share"] == pytest.approx(p1 / (p1 + p2))
    assert fc1["trials"] + fc2["trials"] == 100 and min(fc1["trials"], fc2["trials"]) >= 10
    assert fc1["trials"] == 10 + round(80 * p1 / (p1 + p2))
    split = model["budget_split"]
    assert split["total_trials"] == 100 and split["min_trials"] == 10 and "occurrences" in split["rule"]
    assert model["state"] == "queued" and model["jobs_total"] == 2 and model["jobs_done"] == 0
    assert model["states"] == {"queued": 2}
    for op in model["ops"]:
        job = api.get(f"/v1/jobs/{op['job_id']}").json()
        assert job["budget"]["trials"] == op["trials"] and job["budget"]["max_shapes"] == 2
        assert job["workload_hash"] == op["workload_hash"] and job["tags"]["model"] == "tiny-mlp"
    assert fc1["dims"]["M"] == "batch*seq" and fc1["op"] == "dense"
    listed = api.get("/v1/models").json()
    assert listed["total"] == 1 and listed["models"][0]["id"] == model["id"]
    assert api.get("/v1/models", params={"name": "other"}).json()["total"] == 0
    assert api.get("/v1/models/nope").status_code == 404


def test_an_op_the_kind_cannot_tune_on_the_target_is_listed_as_skipped(api: TestClient) -> None:
    conv = {  # ukernel jobs tune float32 conv2d layers only
        "op": "conv2d",
        "dtype": "float16",
        "dims": {"H": 8, "W": 8, "CI": 4, "CO": 8, "KH": 3, "KW": 3},
        "symbolic": ["N"],
    }
    ops = [_op("fc", _dense(64, 32)), _op("conv", conv, 2, _explicit((1, 1.0), dim="N"))]
    resp = api.post("/v1/models", json=model_body(kind="ukernel", ops=ops))
    assert resp.status_code == 202, resp.text
    fc, skipped = resp.json()["ops"]
    assert fc["job_id"] and fc["skipped"] is None and fc["trials"] == 40
    assert skipped["job_id"] is None and "ukernel jobs cannot tune this op" in skipped["skipped"]
    assert skipped["trials"] == 0 and resp.json()["jobs_total"] == 1
    only_conv = api.post("/v1/models", json=model_body(kind="ukernel", ops=ops[1:]))
    assert _locs(only_conv) == [["body", "ops"]] and "ops.0" in only_conv.json()["detail"][0]["msg"]


def test_progress_aggregates_over_the_jobs_and_cancel_stops_every_unfinished_one(api: TestClient) -> None:
    ops = [_op(f"fc{i}", _dense(16 * (i + 1), 32)) for i in range(3)]
    model = api.post("/v1/models", json=model_body(ops=ops, budget={"trials": 30, "min_trials": 10})).json()
    ids = [op["job_id"] for op in model["ops"]]
    with session_scope() as s:  # one job finished, one half way, one still queued
        done, running = jobs.get_row(s, ids[0]), jobs.get_row(s, ids[1])
        assert done is not None and running is not None
        done.state, done.trials_done = JobState.succeeded.value, done.trials_total
        running.state, running.trials_done = JobState.running.value, running.trials_total // 2
        half = running.trials_total // 2
    view = api.get(f"/v1/models/{model['id']}").json()
    assert view["state"] == "running" and view["jobs_done"] == 1 and view["jobs_total"] == 3
    assert view["states"] == {"succeeded": 1, "running": 1, "queued": 1}
    assert view["trials_total"] == sum(op["trials_total"] for op in view["ops"]) > 0
    assert view["trials_done"] == view["ops"][0]["trials_total"] + half
    assert view["progress"] == pytest.approx(view["trials_done"] / view["trials_total"])
    assert [op["state"] for op in view["ops"]] == ["succeeded", "running", "queued"]

    other = TestClient(api.app, headers=_key("submit", "read"))
    assert other.post(f"/v1/models/{model['id']}/cancel").status_code == 403
    assert api.post("/v1/models/nope/cancel").status_code == 404
    cancelled = api.post(f"/v1/models/{model['id']}/cancel")
    assert cancelled.status_code == 202, cancelled.text
    states = [op["state"] for op in cancelled.json()["ops"]]
    assert states == ["succeeded", "running", "cancelled"]  # running stops at its next heartbeat
    with session_scope() as s:
        row = jobs.get_row(s, ids[1])
        assert row is not None and row.cancel_requested
        jobs.confirm_cancelled(s, ids[1])
    final = api.get(f"/v1/models/{model['id']}").json()
    assert final["state"] == "cancelled" and final["jobs_done"] == 3


def test_the_dashboard_lists_models_and_shows_a_models_ops_jobs_and_progress(api: TestClient) -> None:
    from service.models.auth import Scope
    from service.store import keys

    conv = {  # ukernel jobs tune float32 conv2d layers only
        "op": "conv2d",
        "dtype": "float16",
        "dims": {"H": 8, "W": 8, "CI": 4, "CO": 8, "KH": 3, "KW": 3},
        "symbolic": ["N"],
    }
    ops = [_op("fc<1>", _dense(64, 32)), _op("conv", conv, 2, _explicit((1, 1.0), dim="N"))]
    model = api.post("/v1/models", json=model_body(kind="ukernel", ops=ops)).json()
    with session_scope() as s:
        secret = keys.create(s, "dash", [Scope.admin]).key
    origin = {"Origin": "http://testserver"}
    with TestClient(api.app, base_url="http://testserver", follow_redirects=False) as browser:
        signed = browser.post("/dashboard/login", data={"key": secret, "next": "/dashboard/models"}, headers=origin)
        assert signed.status_code == 303
        listing = browser.get("/dashboard/models")
        assert listing.status_code == 200 and f"/dashboard/models/{model['id']}" in listing.text
        assert 'href="/dashboard/models"' in listing.text  # in the navigation
        page = browser.get(f"/dashboard/models/{model['id']}")
        assert page.status_code == 200, page.text
        job_id = model["ops"][0]["job_id"]
        assert f"/dashboard/jobs/{job_id}" in page.text and "fc&lt;1&gt;" in page.text  # escaped
        assert "skipped: ukernel jobs cannot tune this op" in page.text and "M=batch*seq" in page.text
        assert 'id="cancel-form"' in page.text
        assert browser.get("/dashboard/models/nope").status_code == 404
        assert browser.post(f"/dashboard/models/{model['id']}/cancel").status_code == 403  # no Origin
        done = browser.post(f"/dashboard/models/{model['id']}/cancel", headers=origin)
        assert done.status_code == 303 and done.headers["location"] == f"/dashboard/models/{model['id']}"
        assert api.get(f"/v1/models/{model['id']}").json()["state"] == "cancelled"
        assert 'id="cancel-form"' not in browser.get(f"/dashboard/models/{model['id']}").text
