"""kernelfleet.client.Client against a fake service (httpx.MockTransport): adding and waiting on models."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kernelfleet import Client, JobFailed, vendor
from kernelfleet.errors import InvalidRequest
from kernelfleet.model_import import ExtractedOp, ModelGraph
from kernelfleet.vendor import HOST_LIBRARY_TAG


def _model(state: str, ops: list[tuple[str, str, str | None]]) -> dict[str, Any]:
    """GET /v1/models/m1 as the service answers it, with (name, job state, error) per op."""
    done = sum(s in ("succeeded", "failed", "cancelled") for _, s, _ in ops)
    return {
        "id": "m1",
        "name": "mlp",
        "kind": "ukernel",
        "target": {"kind": "llvm"},
        "state": state,
        "progress": 1.0 if state != "running" else 0.5,
        "jobs_total": len(ops),
        "jobs_done": done,
        "states": {s: sum(o[1] == s for o in ops) for _, s, _ in ops},
        "trials_done": 0,
        "trials_total": 8,
        "ops": [
            dict(
                name=name,
                op="dense",
                workload_hash="ab",
                occurrences=1,
                priority=1.0,
                share=0.5,
                trials=4,
                job_id=f"job-{name}",
                state=s,
                error=error,
            )
            for name, s, error in ops
        ],
        "created_at": "2026-01-01T00:00:00Z",
    }


def _client(*answers: dict[str, Any]) -> Client:
    """A client whose GET /v1/models/m1 answers each of `answers` in turn, then the last one again."""
    queue = list(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models/m1"
        return httpx.Response(200, json=queue.pop(0) if len(queue) > 1 else queue[0])

    return Client("http://fleet.test", transport=httpx.MockTransport(handler), retries=0)


def test_wait_model_raises_when_the_model_failed_or_was_cancelled_naming_the_ops() -> None:
    running = _model("running", [("fc1", "running", None), ("fc2", "queued", None)])
    failed = _model("failed", [("fc1", "succeeded", None), ("fc2", "failed", "no worker consumed queue llvm")])
    with pytest.raises(JobFailed, match=r"model m1 failed: fc2 failed: no worker consumed queue llvm") as err:
        _client(running, failed).wait_model("m1", poll_s=0)
    assert err.value.detail == [
        {"op": "fc2", "job_id": "job-fc2", "state": "failed", "error": "no worker consumed queue llvm"}
    ]
    cancelled = _model("cancelled", [("fc1", "cancelled", None), ("fc2", "cancelled", None)])
    with pytest.raises(JobFailed, match="model m1 cancelled: fc1 cancelled; fc2 cancelled"):
        _client(cancelled).wait_model("m1", poll_s=0)
    # asked not to raise, it returns the model as it ended (the CLI prints it)
    assert _client(failed).wait_model("m1", poll_s=0, raise_on_failure=False).state == "failed"


def test_wait_model_returns_a_model_whose_jobs_all_succeeded() -> None:
    succeeded = _model("succeeded", [("fc1", "succeeded", None), ("fc2", "succeeded", None)])
    seen: list[str] = []
    model = _client(_model("queued", [("fc1", "queued", None)]), succeeded).wait_model(
        "m1", poll_s=0, on_update=lambda m: seen.append(m.state)
    )
    assert model.state == "succeeded" and seen == ["queued", "succeeded"]


def _recording_client(bodies: list[dict[str, Any]]) -> Client:
    """A client whose POST /v1/models records the request body and answers a queued model."""

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("POST", "/v1/models")
        bodies.append(json.loads(request.content))
        return httpx.Response(201, json=_model("queued", [("fc1", "queued", None)]))

    return Client("http://fleet.test", transport=httpx.MockTransport(handler), retries=0)


def test_submit_without_tags_sends_an_empty_mapping() -> None:
    """The service's JobSpec takes a mapping, not null (a submit with tags=None was once answered 422)."""
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(422, json={"detail": "recorded"})

    client = Client("http://fleet.test", transport=httpx.MockTransport(handler), retries=0)
    with pytest.raises(InvalidRequest, match="recorded"):
        client.submit("abc", {"kind": "llvm"}, {"kind": "uniform", "dims": {"M": [1, 8]}})
    assert bodies[0]["tags"] == {}


def _graph(host_library: str | None) -> ModelGraph:
    graph = ModelGraph(source="MLP", inputs={"batch": "input[0]"}, host_library=host_library)
    graph.add(ExtractedOp(op="dense", dims={"M": "batch", "N": 64, "K": 32}, sources=["fc1"]))
    return graph


def test_add_model_tags_the_jobs_with_the_library_the_graph_s_hosts_run() -> None:
    bodies: list[dict[str, Any]] = []
    client = _recording_client(bodies)
    target = {"kind": "llvm", "mcpu": "host"}
    # a graph from extract_torch: its hosts run PyTorch, so its ukernel jobs time uKernels against PyTorch alone
    client.add_model(_graph(vendor.TORCH), target, ranges={"batch": (1, 8)}, kind="ukernel")
    # the caller's own tag wins; a graph that cannot tell its hosts' library adds none
    client.add_model(_graph(vendor.TORCH), target, ranges={"batch": (1, 8)}, tags={HOST_LIBRARY_TAG: vendor.NUMPY})
    client.add_model(_graph(None), target, ranges={"batch": (1, 8)}, tags={"team": "search"})
    assert [b["tags"] for b in bodies] == [
        {HOST_LIBRARY_TAG: vendor.TORCH},
        {HOST_LIBRARY_TAG: vendor.NUMPY},
        {"team": "search"},
    ]
