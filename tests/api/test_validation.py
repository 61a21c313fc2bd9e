"""Bad input gets a clear 4xx naming the field, never a 500: non-finite numbers, implausible imports,
oversized workloads, wrong content types and bodies that are not UTF-8 (issue 10, items 1 and 5)."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.errors import validation_body
from tests.api.test_api import DENSE, TARGET, TOOLCHAIN, job_body

X = "__NON_FINITE__"  # replaced by a literal in the raw body
NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.fixture
def api(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    from service.api.state import submit_bucket
    from service.models.auth import Scope
    from service.store import keys
    from service.store.db import session_scope
    from tests.conftest import _use_store

    monkeypatch.setenv("KERNELFLEET_SUBMIT_RATE_PER_MINUTE", "100000")
    submit_bucket.cache_clear()
    for _ in _use_store(sqlite_url, monkeypatch):
        with session_scope() as s:
            admin = keys.create(s, "validation", [Scope.admin]).key
        with TestClient(create_app(run_migrations=False), headers={"Authorization": f"Bearer {admin}"}) as client:
            yield client
    submit_bucket.cache_clear()


def _trace_config(
    dims: tuple[tuple[str, int], ...] = (("N", 64), ("K", 32)), m: int = 4, **overrides: Any
) -> dict[str, Any]:
    """A config the SDK can load (imports check that, in a child process): the dense workload with `dims` at M=`m`,
    the output's column loop split by 4 and vectorised."""
    return {**_loadable_trace_config(dims, m), **overrides}


@functools.cache
def _loadable_trace_config(dims: tuple[tuple[str, int], ...], m: int) -> dict[str, Any]:
    import tvm
    import tvm_ffi
    from tvm import s_tir

    from service.models import WorkloadSpec
    from service.tuning.compute import prim_func
    from service.tuning.tuners.trace_json import to_py

    mod = prim_func(WorkloadSpec(op="dense", dims=dict(dims), symbolic=["M"]), {"M": m})
    sch = s_tir.Schedule(mod)
    _, column, _ = sch.get_loops(sch.get_sblock("Y"))
    sch.vectorize(sch.split(column, [None, 4])[1])
    return {
        "format": "metaschedule-trace",
        "trace": to_py(sch.trace.as_json()),
        "module": tvm.ir.save_json(mod),
        "module_hash": str(tvm_ffi.structural_hash(mod)),
        "target": {"kind": "llvm", "mcpu": "znver4"},
    }


def _imported(workload_hash: str, **overrides: Any) -> dict[str, Any]:
    rec = {
        "workload_hash": workload_hash,
        "target": {**TARGET, "toolchain": TOOLCHAIN},
        "shape": {"M": 4},
        "latency_s": 2e-5,
        "config": _trace_config(),
        "source": "test",
    }
    return {**rec, **overrides}


def _strict_json(text: str) -> Any:
    def refuse(literal: str) -> Any:
        raise AssertionError(f"response carries {literal}, which is not JSON")

    return json.loads(text, parse_constant=refuse)


def _post_raw(api: TestClient, path: str, body: Any, literal: str) -> Any:
    raw = json.dumps(body).replace(f'"{X}"', literal)
    assert literal in raw
    return api.post(path, content=raw.encode(), headers={"Content-Type": "application/json"})


def _locs(resp: Any) -> list[list[Any]]:
    assert resp.status_code == 422, resp.text
    return [e["loc"] for e in _strict_json(resp.text)["detail"]]


def _names(resp: Any, loc: list[Any]) -> bool:
    locs = _locs(resp)
    return any(found == loc for found in locs) or pytest.fail(f"no error at {loc}: {locs}")


NON_FINITE_CASES = [
    ("/v1/workloads", {**DENSE, "dims": {"N": X, "K": 32}}, ["body", "dims", "N"]),
    ("/v1/jobs", job_body(distribution={"kind": "zipf", "dim": "M", "low": 1, "high": 16, "s": X}),
     ["body", "distribution", "zipf", "s"]),
    ("/v1/jobs", job_body(distribution={"kind": "explicit", "points": [{"shape": {"M": 1}, "weight": X}]}),
     ["body", "distribution", "explicit", "points", 0, "weight"]),
    ("/v1/jobs", job_body(distribution={"kind": "normal", "dim": "M", "low": 1, "high": 16, "mean": X, "std": 2}),
     ["body", "distribution", "normal", "mean"]),
    ("/v1/jobs", job_body(distribution={"kind": "histogram", "dim": "M", "counts": {"3": X}}),
     ["body", "distribution", "histogram", "counts", "3"]),
    ("/v1/jobs", job_body(workload={**DENSE, "dims": {"N": 64, "K": X}}), ["body", "workload", "dims", "K"]),
    ("/v1/jobs", job_body(budget={"trials": X}), ["body", "budget", "trials"]),
    ("/v1/jobs", job_body(target={**TARGET, "num_cores": X}), ["body", "target", "num_cores"]),
    ("/v1/telemetry", {"batch_id": str(uuid.UUID(int=7)), "records": [{"workload_hash": "ab",
     "target_fingerprint": "cd", "shape": {"M": 3}, "calls": 1, "kernel_seconds": X}]},
     ["body", "records", 0, "kernel_seconds"]),
    ("/v1/configs/best/batch", {"keys": [{"workload": "a", "target": "b", "shape": {"M": X}}]},
     ["body", "keys", 0, "shape", "M"]),
]  # fmt: skip


@pytest.mark.parametrize("literal", NON_FINITE)
@pytest.mark.parametrize(("path", "body", "loc"), NON_FINITE_CASES)
def test_non_finite_numbers_get_422_naming_the_field(
    api: TestClient, path: str, body: dict[str, Any], loc: list[Any], literal: str
) -> None:
    assert _names(_post_raw(api, path, body, literal), loc)


@pytest.mark.parametrize("literal", NON_FINITE)
def test_imports_refuse_non_finite_numbers_anywhere(api: TestClient, literal: str) -> None:
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    latency = _imported(wh, latency_s=X)
    assert _names(_post_raw(api, "/v1/configs/import", {"records": [latency]}, literal),
                  ["body", "records", 0, "latency_s"])  # fmt: skip
    nested = _imported(wh, config=_trace_config(extra={"x": [1, X]}))
    assert _names(_post_raw(api, "/v1/configs/import", {"records": [nested]}, literal),
                  ["body", "records", 0, "config", "extra", "x", 1])  # fmt: skip
    assert api.get("/v1/configs", params={"workload": wh}).json() == []


def test_imports_are_checked_against_the_kinds_config_schema(api: TestClient) -> None:
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]

    def import_(**overrides: Any) -> Any:
        return api.post("/v1/configs/import", json={"records": [_imported(wh, **overrides)]})

    where = ["body", "records", 0]
    assert _names(import_(config={"x": 1}), [*where, "config", "format"])
    assert _names(import_(config={"format": "x"}), [*where, "config", "format"])
    tile = {"format": "ukernel-tile", "id": "mt8_nt16_kt64", "tile": [8, 16, 64]}
    resp = import_(config=tile)
    assert _names(resp, [*where, "config", "format"]) and "not served per shape" in resp.text
    assert _names(import_(config=_trace_config(trace=[])), [*where, "config", "trace"])
    assert _names(import_(config=_trace_config(module_hash="abc")), [*where, "config", "module_hash"])
    assert _names(import_(config={k: v for k, v in _trace_config().items() if k != "module"}),
                  [*where, "config", "module"])  # fmt: skip
    implausible = import_(latency_s=1e-9)
    assert _names(implausible, [*where, "latency_s"]) and "implausible" in implausible.text
    assert _names(import_(target={**TARGET, "mcpu": "host", "toolchain": TOOLCHAIN}), [*where, "target", "mcpu"])
    assert _names(import_(target=TARGET), [*where, "target", "toolchain"])
    assert api.get("/v1/configs", params={"workload": wh}).json() == []
    assert import_().json() == {"imported": 1, "improved": 1}
    big = api.post("/v1/workloads", json={**DENSE, "dims": {"N": 4096, "K": 4096}}).json()["workload_hash"]
    too_fast = _imported(big, shape={"M": 4096}, latency_s=1e-5)  # 1.4e11 FLOPs in 10 us: 14 PFLOP/s
    assert _names(api.post("/v1/configs/import", json={"records": [too_fast]}), [*where, "latency_s"])
    big_config = _trace_config((("N", 4096), ("K", 4096)), 4096)
    plausible = _imported(big, shape={"M": 4096}, latency_s=5e-3, config=big_config)
    assert api.post("/v1/configs/import", json={"records": [plausible]}).json()["improved"] == 1


def test_the_422_body_is_strict_json_whatever_the_errors_hold() -> None:
    class Opaque:
        def __str__(self) -> str:
            raise RuntimeError("cannot print")

    errors: list[dict[str, Any]] = [
        {"type": "finite_number", "loc": ("body", "x", "function-after[_complete(), WorkloadSpec]"),
         "msg": "m", "input": float("nan"), "ctx": {"error": ValueError("big"), "limit": float("-inf")}},
        {"type": "value_error", "loc": ("body", 0), "msg": "m", "input": {1: [float("inf"), b"\xff", {1, 2}]}},
        {"type": "value_error", "loc": ("body",), "msg": "m", "input": Opaque()},
    ]  # fmt: skip
    detail = _strict_json(validation_body(errors).decode())["detail"]
    assert [e["loc"] for e in detail] == [["body", "x"], ["body", 0], ["body"]]
    full = _strict_json(validation_body(errors[:2]).decode())["detail"]
    assert full[0]["input"] == "NaN" and full[0]["ctx"] == {"error": "big", "limit": "-Infinity"}
    assert full[1]["input"] == {"1": ["Infinity", "\ufffd", [1, 2]]}


def test_wrong_content_type_gets_415_and_non_utf8_gets_400(api: TestClient) -> None:
    raw = json.dumps(DENSE).encode()
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/xml"):
        resp = api.post("/v1/workloads", content=raw, headers={"Content-Type": content_type})
        assert resp.status_code == 415 and "application/json" in resp.json()["detail"], resp.text
    assert api.post("/v1/workloads", content=raw, headers={"Content-Type": ""}).status_code == 415
    latin1 = api.post("/v1/workloads", content=raw, headers={"Content-Type": "application/json; charset=latin-1"})
    assert latin1.status_code == 415
    bad = b'{"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M\xff"]}'
    resp = api.post("/v1/workloads", content=bad, headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and "UTF-8" in resp.json()["detail"], resp.text
    utf16 = api.post(
        "/v1/workloads", content=json.dumps(DENSE).encode("utf-16"), headers={"Content-Type": "application/json"}
    )
    assert utf16.status_code == 400
    for content_type in ("application/json", "application/json; charset=utf-8", "application/merge-patch+json"):
        assert api.post("/v1/workloads", content=raw, headers={"Content-Type": content_type}).status_code == 201
    job = api.post("/v1/jobs", json=job_body()).json()
    assert api.post(f"/v1/jobs/{job['id']}/cancel").status_code == 202  # no body, no content type: fine
    # the dashboard's HTML forms are urlencoded, outside /v1
    form = api.post("/dashboard/login", data={"key": "kf_wrong"}, headers={"Origin": str(api.base_url)})
    assert form.status_code not in (400, 415), form.text


CONV_DIMS = {"H": 4, "W": 4, "CI": 3, "CO": 8, "KH": 3, "KW": 3}
CONV: dict[str, Any] = {"op": "conv2d", "dims": CONV_DIMS, "symbolic": ["N"]}


def test_oversized_workloads_get_422_naming_the_field(api: TestClient) -> None:
    huge = {**DENSE, "dims": {"N": 10**6, "K": 10**6}}  # W alone: 10^12 elements
    resp = api.post("/v1/workloads", json=huge)
    assert _names(resp, ["body", "dims"]) and "elements" in resp.text and "W" in resp.text
    assert _names(api.post("/v1/jobs", json=job_body(workload=huge)), ["body", "workload", "dims"])
    # each tensor fits, but a call at M=4096 is 1.3e13 FLOPs: refused for the distribution that asks for it
    wide = {**DENSE, "dims": {"N": 40_000, "K": 40_000}}
    wide_hash = api.post("/v1/workloads", json=wide).json()["workload_hash"]
    far = {"kind": "uniform", "dim": "M", "low": 4000, "high": 4096}
    for workload in (wide, wide_hash):
        resp = api.post("/v1/jobs", json=job_body(workload=workload, distribution=far))
        assert _names(resp, ["body", "distribution"]) and "FLOPs" in resp.text
    near = {"kind": "uniform", "dim": "M", "low": 1, "high": 16}
    assert api.post("/v1/jobs", json=job_body(workload=wide_hash, distribution=near)).status_code == 202


def test_conv2d_kernels_larger_than_the_padded_input_get_422(api: TestClient) -> None:
    tall = {**CONV, "dims": {**CONV_DIMS, "KH": 7}}
    resp = api.post("/v1/workloads", json=tall)
    assert _names(resp, ["body", "dims", "KH"]) and "larger than H" in resp.text
    wide = {**CONV, "dims": {**CONV_DIMS, "KW": 7}, "attrs": {"padding": 1}}  # 4 + 2*1 < 7
    assert _names(api.post("/v1/workloads", json=wide), ["body", "dims", "KW"])
    job = job_body(workload=tall, distribution={"kind": "uniform", "dim": "N", "low": 1, "high": 4})
    assert _names(api.post("/v1/jobs", json=job), ["body", "workload", "dims", "KH"])
    padded = {**wide, "attrs": {"padding": 2}}  # 4 + 2*2 >= 7
    assert api.post("/v1/workloads", json=padded).status_code == 201


def test_422_locations_are_the_fields_a_user_wrote(api: TestClient) -> None:
    detail = api.post("/v1/jobs", json=job_body(workload={"op": "dense", "dims": {"N": 10}, "symbolic": ["M"]})).json()
    assert [e["loc"] for e in detail["detail"]] == [["body", "workload", "dims"]]  # one error, no union labels
    detail = api.post("/v1/jobs", json=job_body(workload={**DENSE, "dims": {"N": 8, "K": "x"}})).json()
    assert [e["loc"] for e in detail["detail"]] == [["body", "workload", "dims", "K"]]
    detail = api.post("/v1/jobs", json=job_body(workload={**DENSE, "symbolic": ["M", "Q"]})).json()
    assert [e["loc"] for e in detail["detail"]] == [["body", "workload", "symbolic", 1]]
    detail = api.post("/v1/jobs", json=job_body(workload=5)).json()
    assert [e["loc"] for e in detail["detail"]] == [["body", "workload"]] and "hash" in detail["detail"][0]["msg"]
    assert api.post("/v1/jobs", json=job_body(workload="0" * 32)).status_code == 422  # unknown hash: still named
    for body in (job_body(workload={"op": "nope"}), job_body(workload={**DENSE, "attrs": {"bias": 3}})):
        for error in api.post("/v1/jobs", json=body).json()["detail"]:
            assert error["loc"][:2] == ["body", "workload"] and error["loc"][2:3] != ["str"], error
            assert not any(str(part).startswith("function-") for part in error["loc"]), error


def test_a_scalar_union_gets_one_error_at_the_field(api: TestClient) -> None:
    conv = {**CONV, "attrs": {"stride": [1]}}  # attrs are int | bool | str: one error, not one per member
    detail = api.post("/v1/workloads", json=conv).json()["detail"]
    assert [e["loc"] for e in detail] == [["body", "attrs", "stride"]], detail
    assert all(t in detail[0]["msg"] for t in ("integer", "boolean", "string")), detail
    detail = api.post("/v1/workloads", json={**CONV, "attrs": {"stride": "x"}}).json()["detail"]  # a str, not int
    assert [e["loc"] for e in detail] == [["body", "attrs", "stride"]] and "int" in detail[0]["msg"], detail
    target = {**TARGET, "details": {"gpu": [1]}, "toolchain": TOOLCHAIN}  # details are str | int
    detail = api.post("/v1/targets", json=target).json()["detail"]
    assert [e["loc"] for e in detail] == [["body", "details", "gpu"]], detail


# -- issue 34 items 4 and 5: lax numbers, unbounded strings, far days, lax lookup shapes ------------------------------


@pytest.mark.parametrize("lax", [True, "64", 64.0], ids=["true", "numeric-string", "float"])
def test_integers_take_only_json_integers_on_jobs_and_models(api: TestClient, lax: object) -> None:
    from tests.api.test_models import model_body

    dense = {**DENSE, "dims": {"N": lax, "K": 32}}
    assert _names(api.post("/v1/jobs", json=job_body(workload=dense)), ["body", "workload", "dims", "N"])
    assert _names(api.post("/v1/jobs", json=job_body(budget={"trials": lax})), ["body", "budget", "trials"])
    uniform = {"kind": "uniform", "dim": "M", "low": 1, "high": lax}
    assert _names(
        api.post("/v1/jobs", json=job_body(distribution=uniform)), ["body", "distribution", "uniform", "high"]
    )
    model = model_body()
    model["ops"][0]["workload"] = {**model["ops"][0]["workload"], "dims": {"N": lax, "K": 32}}
    assert _names(api.post("/v1/models", json=model), ["body", "ops", 0, "workload", "dims", "N"])
    assert _names(api.post("/v1/models", json=model_body(budget={"trials": lax})), ["body", "budget", "trials"])
    assert api.get("/v1/jobs").json()["total"] == 0


def test_tags_are_bounded_and_nothing_is_stored(api: TestClient) -> None:
    from tests.api.test_models import model_body

    key, value = "k" * 50_000, "v" * 100_000
    for path, body in (("/v1/jobs", job_body()), ("/v1/models", model_body())):
        locs = _locs(api.post(path, json={**body, "tags": {key: "v"}}))
        assert locs[0][:3] == ["body", "tags", key], locs
        assert _names(api.post(path, json={**body, "tags": {"team": value}}), ["body", "tags", "team"])
        assert api.post(path, json={**body, "tags": {"k" * 64: "v" * 256}}).status_code == 202
    assert _names(api.post("/v1/jobs", json=job_body(workload={**DENSE, "symbolic": ["M" * 100_000]})),
                  ["body", "workload", "symbolic", 0])  # fmt: skip
    assert _names(api.post("/v1/jobs", json=job_body(workload="x" * 100_000)), ["body", "workload"])


def test_tags_a_kind_reads_as_options_get_422_naming_the_tag(api: TestClient) -> None:
    """ukernel's host_library and pipeline's pipeline_search are options: a value the kind cannot run is refused
    at submission (jobs and models), never a job that fails on its worker."""
    from tests.api.test_models import model_body

    ukernel = job_body(kind="ukernel", tags={"host_library": "jax"})
    assert _names(api.post("/v1/jobs", json=ukernel), ["body", "tags", "host_library"])
    assert _names(api.post("/v1/models", json=model_body(kind="ukernel", tags={"host_library": "jax"})),
                  ["body", "tags", "host_library"])  # fmt: skip
    pipeline = job_body(kind="pipeline", target={"kind": "cuda", "arch": "sm_90"}, tags={"pipeline_search": "grid"})
    assert _names(api.post("/v1/jobs", json=pipeline), ["body", "tags", "pipeline_search"])
    assert api.post("/v1/jobs", json={**ukernel, "tags": {"host_library": "torch"}}).status_code == 202
    assert api.post("/v1/jobs", json=job_body(tags={"host_library": "anything"})).status_code == 202  # sketch: free


def test_telemetry_days_lie_between_2020_and_tomorrow(api: TestClient) -> None:
    import datetime as dt

    record = {"workload_hash": "ab" * 16, "target_fingerprint": "cd" * 16, "shape": {"M": 3}, "calls": 1,
              "kernel_seconds": 0.5}  # fmt: skip

    def post(day: str) -> Any:
        return api.post("/v1/telemetry", json={"batch_id": str(uuid.uuid4()), "records": [{**record, "day": day}]})

    for far in ("0001-01-01", "2019-12-31"):
        resp = post(far)
        assert _names(resp, ["body", "records", 0, "day"]) and "2020-01-01" in resp.text
    tomorrow = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=1)
    assert post(tomorrow.isoformat()).json()["accepted"] == 1  # a host's clock a little ahead at midnight
    assert api.get("/v1/fleet/reports").json() == []


@pytest.mark.parametrize(
    "shape", ["M=１２", "M=1,M=2", "M=0", "M=-3", ",".join(f"D{i}=1" for i in range(9)), "M=99999999999"]
)
def test_lookup_shapes_are_ascii_digits_each_name_once(api: TestClient, shape: str) -> None:
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    resp = api.get("/v1/configs/best", params={"workload": wh, "target": "f" * 32, "shape": shape})
    assert _names(resp, ["query", "shape"])
