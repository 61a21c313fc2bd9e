"""A `ukernel` job through the real fleet (API, Celery worker, PostgreSQL, Redis), then the SDK dispatcher:
fetched with ETag revalidation, verified, run on every shape including unseen ones, and kept running from
its cache or numpy when the service is gone."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from typer.testing import CliRunner

from kernelfleet import Client, vendor
from kernelfleet.cli import app
from kernelfleet.dispatch import DispatchTable
from kernelfleet.epilogue import NO_EPILOGUE, Epilogue, dense_reference
from kernelfleet.errors import NotFound
from kernelfleet.signing import UntrustedArtifact
from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow

N, K, S_MAX = 64, 48, 40
DENSE = {"op": "dense", "dims": {"N": N, "K": K}, "symbolic": ["M"]}
GELU = Epilogue(bias=True, activation="gelu")
LAYER = {**DENSE, "attrs": GELU.to_dict()}  # a transformer MLP's first layer: bias and gelu fused in the uKernels
DIST = {"kind": "uniform", "dim": "M", "low": 1, "high": S_MAX}
UNSEEN = [S_MAX + 1, 53, 97, 131]  # beyond the tuned range: the table's last interval extends


# These tests check the table's mechanics on a layer so small that numpy wins at every S (the job would
# then publish no table: test_a_ukernel_job_slower_than_the_vendor_publishes_nothing_and_says_so), so they
# keep every S on uKernels.
UKERNELS_ONLY = {"KERNELFLEET_UKERNEL_VENDOR_ROUTES": "false"}


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Fleet]:
    env = {"KERNELFLEET_DATABASE_URL": pg_url, "KERNELFLEET_BROKER_URL": redis_url, **UKERNELS_ONLY}
    fleet = Fleet(tmp_path / "fleet", env)
    yield fleet
    fleet.stop()


def _target(client: Client) -> dict[str, object]:
    hw = wait_for(lambda: client.workers(), 90, "a worker to announce itself")[0]["target"]
    return {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}


def _check_all_shapes(dispatcher, shapes: list[int], epilogue: Epilogue = NO_EPILOGUE) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    w = rng.standard_normal((N, K)).astype("float32")
    b = rng.standard_normal(N).astype("float32") if epilogue.bias else None
    for s in shapes:
        x = rng.standard_normal((s, K)).astype("float32")
        got = dispatcher(x, w) if b is None else dispatcher(x, w, bias=b)
        expected = dense_reference(x, w, b, epilogue)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"S={s}")


def test_ukernel_job_publishes_a_table_the_sdk_serves_every_shape_from(fleet: Fleet, tmp_path: Path) -> None:
    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    job = client.submit(LAYER, _target(client), DIST, kind="ukernel", budget={"trials": 3, "max_shapes": 2})
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.trials_done == done.trials_total > 0
    assert done.published is True and done.publish_reason is None
    for s in done.shapes:  # the validated hot shapes carry measured program latency and the vendor baseline
        assert s.state == "succeeded" and s.best_latency_s and s.baseline_latency_s
    assert done.target_fingerprint is not None
    workload, target = done.workload_hash, done.target_fingerprint

    doc_and_etag = client.dispatch_doc(workload, target)
    assert doc_and_etag is not None
    doc, etag = doc_and_etag
    assert doc.s_max == S_MAX and doc.job_id == job.id and len(doc.predicted_latency_s) == S_MAX
    assert doc.table["epilogue"] == GELU.to_dict() and all(u.spec["activation"] == "gelu" for u in doc.ukernels)
    assert doc.table["kind"] == "dense"  # served as stored: tagged with its family (kernelfleet.tables)
    assert (
        doc.ukernels
        and client._http.get("/v1/dispatch", params={"workload": workload, "target": target}).headers[
            "X-KernelFleet-Signature"
        ]
    )
    assert {"rho_dietcode_mean", "tuning_seconds", "padding_ratio"} <= set(doc.validation)
    assert client.dispatch_doc(workload, target, etag=etag) is None  # unchanged: 304

    cache = tmp_path / "cache"
    dispatcher = client.dispatcher(workload, target, cache_dir=cache)
    assert dispatcher.source == "service" and not dispatcher.fallback and dispatcher.epilogue == GELU
    _check_all_shapes(dispatcher, [*range(1, S_MAX + 1), *UNSEEN], GELU)
    assert sum(u.fallbacks for u in dispatcher.usage().values()) == 0

    # a tampered artifact or document in the cache is refused, and so is a key other than the pinned one
    # (replaced, never rewritten in place: this process has the library mapped, and so would any host)
    library = cache / "artifacts" / f"{doc.ukernels[0].sha256}.so"
    good = library.read_bytes()
    library.unlink()
    library.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(UntrustedArtifact):
        client.dispatcher(workload, target, cache_dir=cache)
    library.unlink()
    library.write_bytes(good)
    cached_doc = next((cache / "dispatch").glob("*.json"))
    original = cached_doc.read_text()
    record = json.loads(original)
    record["body"] = record["body"].replace(f'"s_max":{S_MAX}', f'"s_max":{S_MAX + 1}')
    cached_doc.write_text(json.dumps(record))
    with pytest.raises(UntrustedArtifact):  # revalidation answers 304, so the altered cached body is used
        client.dispatcher(workload, target, cache_dir=cache)
    cached_doc.write_text(original)
    stranger = base64.b64encode(
        Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    ).decode()
    with pytest.raises(UntrustedArtifact):
        client.dispatcher(workload, target, cache_dir=tmp_path / "other-cache", trusted_key=stranger)

    # the service goes away: the cached table keeps serving; with no cache, numpy and counted misses
    fleet.kill("api")
    offline = fleet.client(retries=0, timeout=2)
    cached = offline.dispatcher(workload, target, cache_dir=cache)
    assert cached.source == "cache" and not cached.fallback
    _check_all_shapes(cached, [1, 17, S_MAX, *UNSEEN], GELU)
    bare = offline.dispatcher(workload, target, cache_dir=tmp_path / "empty-cache", epilogue=GELU)
    assert bare.source == "fallback" and bare.fallback
    _check_all_shapes(bare, [5, 61], GELU)  # numpy, with the layer's bias and gelu
    usage = bare.usage()
    assert usage[5].fallbacks == usage[5].calls == 1 and usage[61].fallbacks == 1


def test_ukernel_jobs_reject_workloads_they_cannot_tune(fleet: Fleet) -> None:
    fleet.start_api()
    client = fleet.client()
    target = {"kind": "llvm", "mcpu": "znver4", "num_cores": 2}
    for workload, loc in [
        ({"op": "dense", "dtype": "float16", "dims": {"N": 64, "K": 64}, "symbolic": ["M"]}, ["workload", "dtype"]),
        ({"op": "dense", "dtype": "bfloat16", "dims": {"N": 64, "K": 64}, "symbolic": ["M"]}, ["workload", "dtype"]),
    ]:
        resp = client._http.post(
            "/v1/jobs", json={"kind": "ukernel", "workload": workload, "target": target, "distribution": DIST}
        )
        assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", *loc], resp.text
    far = {"kind": "explicit", "points": [{"shape": {"M": 5000}}]}
    resp = client._http.post(
        "/v1/jobs", json={"kind": "ukernel", "workload": DENSE, "target": target, "distribution": far}
    )
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["body", "distribution"], resp.text
    missing = client._http.get("/v1/dispatch", params={"workload": "ab" * 16, "target": "cd" * 16})
    assert missing.status_code == 404 and "ukernel job" in missing.json()["detail"]
    assert client._http.get("/v1/artifacts/../../etc/passwd").status_code == 404
    assert client._http.get("/v1/artifacts/" + "z" * 64).status_code == 422


def test_a_retried_ukernel_job_resumes_from_its_measured_ukernels(tmp_path: Path, pg_url: str, redis_url: str) -> None:
    env = {
        "KERNELFLEET_DATABASE_URL": pg_url,
        "KERNELFLEET_BROKER_URL": redis_url,
        "KERNELFLEET_BROKER_VISIBILITY_TIMEOUT_S": "8",
        "KERNELFLEET_BROKER_UNACKED_RESTORE_INTERVAL_S": "1",
        "KERNELFLEET_HEARTBEAT_INTERVAL_S": "1",
        "KERNELFLEET_STALE_AFTER_S": "4",
        **UKERNELS_ONLY,
    }
    fleet = Fleet(tmp_path / "fleet", env)
    try:
        fleet.start_api()
        fleet.start_worker("victim")
        client = fleet.client()
        job = client.submit(DENSE, _target(client), DIST, kind="ukernel", budget={"trials": 4})

        def _candidates() -> list[dict[str, object]]:
            found: list[dict[str, object]] = client._request("GET", f"/v1/jobs/{job.id}/candidates").json()
            return found

        before = wait_for(lambda: _candidates() or None, 240, "a first measured uKernel", poll_s=0.1)
        fleet.kill("victim")  # mid-job: some uKernels measured, the table not yet published
        fleet.start_worker("rescuer")
        done = client.wait(job.id, timeout_s=300, poll_s=0.5)
        assert done.state == "succeeded" and done.attempts == 2
        assert done.trials_done == done.trials_total  # progress counts the resumed uKernels once
        assert done.trials_total == job.trials_total  # and means the same from submission to the end
        after = _candidates()
        assert all(c["shape_key"] == f"M=1..{S_MAX}" for c in after)
        ids = [c["config"]["id"] for c in after]
        assert len(ids) == len(set(ids)), ids  # the rescuer measured only what the victim had not
        resumed = re.search(r"resuming from (\d+) measured uKernels", fleet.log("rescuer"))
        assert resumed and int(resumed.group(1)) >= len(before)
        published = client.dispatch_doc(done.workload_hash, done.target_fingerprint)
        assert published is not None  # and the table it published covers the range
        assert published[0].s_max == S_MAX
    finally:
        fleet.stop()


def test_a_ukernel_job_slower_than_the_vendor_publishes_nothing_and_says_so(
    tmp_path: Path, pg_url: str, redis_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """16×16 weights: numpy answers in about a microsecond, below what any call into TVM costs, so every S
    goes to the vendor, no table is published, and the view, `wait()` and `kernelfleet job` say so. For hosts that
    run PyTorch (the job's host_library tag) the table chooses between uKernels and PyTorch only."""
    fleet = Fleet(tmp_path / "fleet", {"KERNELFLEET_DATABASE_URL": pg_url, "KERNELFLEET_BROKER_URL": redis_url})
    try:
        fleet.start_api()
        fleet.start_worker("w1")
        client = fleet.client()
        tiny = {"op": "dense", "dims": {"N": 16, "K": 16}, "symbolic": ["M"]}
        dist = {"kind": "uniform", "dim": "M", "low": 1, "high": 8}
        job = client.submit(tiny, _target(client), dist, kind="ukernel", budget={"trials": 2, "max_shapes": 2})
        with caplog.at_level(logging.WARNING, logger="kernelfleet"):
            done = client.wait(job.id, timeout_s=300, poll_s=0.5)
        assert done.state == "succeeded" and done.published is False
        assert done.publish_reason and "hosts' library (numpy) is faster" in done.publish_reason, done.publish_reason
        assert any("published nothing" in r.getMessage() for r in caplog.records)
        assert done.target_fingerprint is not None
        with pytest.raises(NotFound, match="no dispatch table"):
            client.dispatch_doc(done.workload_hash, done.target_fingerprint)
        assert fleet.api_key is not None
        monkeypatch.setenv("KERNELFLEET_API_KEY", fleet.api_key)
        shown = CliRunner().invoke(app, ["job", job.id, "--url", fleet.url], terminal_width=400)
        assert shown.exit_code == 0, shown.output
        assert "published: false" in shown.output and "hosts' library (numpy) is faster" in shown.output, shown.output
        # the same layer for hosts that run PyTorch (accelerate runs every vendor route on PyTorch): the job times
        # its uKernels against PyTorch alone, so its table routes no M to numpy, and says so if PyTorch wins them all
        for_torch = client.submit(tiny, _target(client), dist, kind="ukernel", budget={"trials": 2, "max_shapes": 2},
                                  tags={"host_library": "torch"})  # fmt: skip
        done = client.wait(for_torch.id, timeout_s=300, poll_s=0.5)
        assert done.state == "succeeded"
        if done.published:
            published = client.dispatch_doc(done.workload_hash, done.target_fingerprint)
            assert published is not None and published[0].job_id == for_torch.id
            routes = DispatchTable.from_dict(published[0].table).intervals
            assert any(not iv.vendor for iv in routes), routes  # a uKernel somewhere: it beat PyTorch there
            assert all(iv.library == vendor.TORCH for iv in routes if iv.vendor), routes
        else:
            assert done.publish_reason and "hosts' library (torch) is faster" in done.publish_reason
    finally:
        fleet.stop()


CONV = {
    "op": "conv2d",
    "dims": {"CI": 4, "CO": 16, "KH": 3, "KW": 3},
    "symbolic": ["N", "H", "W"],
    "attrs": {"padding": 1},
}
CONV_DIST = {
    "kind": "independent",
    "factors": [
        {"kind": "uniform", "dim": "N", "low": 1, "high": 2},
        {"kind": "uniform", "dim": "H", "low": 2, "high": 6},
        {"kind": "uniform", "dim": "W", "low": 2, "high": 6},
    ],
}


def test_a_conv2d_ukernel_job_publishes_an_implicit_gemm_table_the_sdk_runs(fleet: Fleet, tmp_path: Path) -> None:
    from service.models import WorkloadSpec
    from service.tuning.compute import reference

    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    target = _target(client)
    with_ci = {**CONV, "symbolic": ["N", "H", "CI"], "dims": {"W": 8, "CO": 16, "KH": 3, "KW": 3}}
    ci_dist = {
        **CONV_DIST,
        "factors": [*CONV_DIST["factors"][:2], {"kind": "uniform", "dim": "CI", "low": 1, "high": 4}],
    }
    for workload, dist, loc in [  # what the kind cannot tune: 422 naming the field
        (with_ci, ci_dist, ["workload", "symbolic"]),
        ({**CONV, "attrs": {"padding": 1, "layout": "NCHW"}}, CONV_DIST, ["attrs", "layout"]),
        ({**CONV, "attrs": {"padding": 1, "dilation": 2}}, CONV_DIST, ["attrs", "dilation"]),
    ]:
        resp = client._http.post(
            "/v1/jobs", json={"kind": "ukernel", "workload": workload, "target": target, "distribution": dist}
        )
        assert resp.status_code == 422 and resp.json()["detail"][0]["loc"][-2:] == loc, resp.text

    job = client.submit(CONV, target, CONV_DIST, kind="ukernel", budget={"trials": 2, "max_shapes": 2})
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.published is True, done
    assert all(s.best_latency_s and s.baseline_latency_s for s in done.shapes)
    d = client.conv2d_dispatcher(done.workload_hash, done.target_fingerprint or "", cache_dir=tmp_path / "cache")
    assert d.source == "service" and not d.fallback and d.geometry.filter == (3, 3, 4, 16)
    conv = reference(WorkloadSpec.model_validate(CONV))
    rng = np.random.default_rng(5)
    f = rng.standard_normal((3, 3, 4, 16)).astype("float32")
    for n, h, w in [(1, 2, 2), (2, 6, 6), (2, 3, 5), (3, 9, 7)]:  # the box's corners, inside, past it
        x = rng.standard_normal((n, h, w, 4)).astype("float32")
        np.testing.assert_allclose(d(x, f), conv(x, f), rtol=1e-4, atol=1e-3, err_msg=f"{(n, h, w)}")
    assert sum(u.fallbacks for u in d.usage().values()) == 0


BMM = {"op": "batch_matmul", "dims": {"N": 16}, "symbolic": ["B", "M", "K"]}
BMM_DIST = {  # three dynamic dims, the reduction K among them
    "kind": "independent",
    "factors": [
        {"kind": "uniform", "dim": "B", "low": 1, "high": 3},
        {"kind": "uniform", "dim": "M", "low": 1, "high": 12},
        {"kind": "uniform", "dim": "K", "low": 1, "high": 20},
    ],
}


def test_a_batch_matmul_job_over_three_dynamic_dims_runs_through_the_fleet_and_the_sdk(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.start_api()
    fleet.start_worker("w1")
    client = fleet.client()
    job = client.submit(BMM, _target(client), BMM_DIST, kind="ukernel", budget={"trials": 2, "max_shapes": 2})
    done = client.wait(job.id, timeout_s=300, poll_s=0.5)
    assert done.state == "succeeded" and done.published is True, done
    assert all(set(s.shape) == {"B", "M", "K"} for s in done.shapes)
    d = client.bmm_dispatcher(done.workload_hash, done.target_fingerprint or "", cache_dir=tmp_path / "cache")
    assert d.source == "service" and not d.fallback
    rng = np.random.default_rng(11)
    inside = [(1, 1, 1), (3, 12, 20), (2, 7, 13), (1, 12, 1)]  # the box's corners and inside
    past = [(4, 5, 5), (2, 13, 21)]  # beyond it: numpy, counted as misses
    for b, m, k in inside + past:
        a = rng.standard_normal((b, m, k), dtype=np.float32)
        bt = rng.standard_normal((b, 16, k), dtype=np.float32)
        np.testing.assert_allclose(d(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3, err_msg=f"{(b, m, k)}")
    assert d.misses == len(past)
    fleet.kill("api")  # the service gone: the signed cache keeps serving the table
    offline = fleet.client(retries=0, timeout=2).bmm_dispatcher(
        done.workload_hash, done.target_fingerprint or "", cache_dir=tmp_path / "cache"
    )
    assert offline.source == "cache" and not offline.fallback
    a, bt = rng.standard_normal((2, 7, 13), dtype=np.float32), rng.standard_normal((2, 16, 13), dtype=np.float32)
    np.testing.assert_allclose(offline(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
