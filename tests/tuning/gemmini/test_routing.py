"""A gemmini job goes to the `firesim` queue only, through the real API and store."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.workers import submission
from tests.api.test_api import api  # noqa: F401  (the fixture)

GEMM_LIST = {
    "kind": "gemmini",
    "workload": {"op": "dense", "symbolic": ["M", "N", "K"]},
    "target": {"kind": "gemmini", "arch": "default"},
    "distribution": {
        "kind": "explicit",
        "points": [
            {"shape": {"M": 128, "N": 768, "K": 768}, "weight": 12},
            {"shape": {"M": 1, "N": 1024, "K": 1024}, "weight": 1},
        ],
    },
    "budget": {"trials": 500},
}


def test_gemmini_job_is_routed_to_the_firesim_queue_only(api: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    sent: list[tuple[str, str]] = []
    monkeypatch.setattr(submission, "enqueue", lambda job_id, queue: sent.append((job_id, queue)))
    resp = api.post("/v1/jobs", json=GEMM_LIST)
    assert resp.status_code == 202, resp.text
    assert sent == [(resp.json()["id"], "firesim")]


def test_gemmini_job_problems_name_the_field(api: TestClient) -> None:  # noqa: F811
    bad: dict[str, Any] = {**GEMM_LIST, "target": {"kind": "llvm", "mcpu": "znver4"}}
    r = api.post("/v1/jobs", json=bad)
    assert r.status_code == 422 and "target" in str(r.json()["detail"])
    r = api.post("/v1/jobs", json={**GEMM_LIST, "budget": {"trials": 10}})
    assert r.status_code == 422 and "budget" in str(r.json()["detail"])
