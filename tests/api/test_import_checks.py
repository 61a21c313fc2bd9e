"""Imported configs are stored only if the SDK can load them (issue 34 item 6).

`POST /v1/configs/import` used to take any string as a trace config's `module`: the record was signed and served,
and `client.kernel()` then raised TVM's ValueError on every inference host. Now the import replays the SDK's
loading steps on each trace config in a child process (service.workers.config_check) and refuses the request,
naming each config that does not load, before it stores anything."""

from __future__ import annotations

import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from kernelfleet.tvm_kernel import build_kernel
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.workers import config_check
from tests.api.test_api import DENSE
from tests.api.test_validation import _imported, _locs, _trace_config, api  # noqa: F401 - the fixture

MODULE_LOC: list[str | int] = ["body", "records", 0, "config", "module"]


def _import(api: TestClient, *records: dict[str, Any]) -> Any:  # noqa: F811 - `api` is the fixture
    return api.post("/v1/configs/import", json={"records": list(records)})


def _errors(resp: Any) -> dict[tuple[str | int, ...], str]:
    locs = _locs(resp)
    return {tuple(loc): e["msg"] for loc, e in zip(locs, resp.json()["detail"], strict=True)}


def test_a_config_the_sdk_cannot_load_is_refused_and_never_served(api: TestClient) -> None:  # noqa: F811
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    good = _imported(wh, config=_trace_config(target=tvm_target(host_target())))  # runs here, below
    bogus = _imported(wh, config=_trace_config(module="x"))
    errors = _errors(_import(api, bogus, good))
    assert list(errors) == [tuple(MODULE_LOC)], errors  # the bogus one, and only it
    assert "TVM cannot load it as an IRModule" in errors[tuple(MODULE_LOC)]
    # nothing of a refused request is stored: the good record did not come in alone either
    assert api.get("/v1/configs", params={"workload": wh}).json() == []

    not_a_module = _trace_config(module='{"root_index": 0, "nodes": [{"type": "ffi.String", "data": "hi"}]}')
    other_shape = _trace_config(m=8)  # a loadable module, of the workload at M=8, filed under M=4
    cases: dict[str, tuple[dict[str, Any], list[str | int], str]] = {
        "not_a_module": (not_a_module, MODULE_LOC, "not an IRModule"),
        "other_shape": (other_shape, ["body", "records", 0], "is not the workload"),
        "hash": (_trace_config(module_hash="42"), ["body", "records", 0, "config", "module_hash"], "structural"),
        "trace": (
            _trace_config(trace=[[["Split", ["b0"], [4], []]], []]),
            ["body", "records", 0, "config", "trace"],
            "does not replay",
        ),
        "target": (_trace_config(target={"kind": "cuda"}), ["body", "records", 0], "a cuda config for a llvm target"),
    }
    for name, (config, loc, why) in cases.items():
        errors = _errors(_import(api, _imported(wh, config=config)))
        assert list(errors) == [tuple(loc)] and why in errors[tuple(loc)], (name, errors)
    assert api.get("/v1/configs", params={"workload": wh}).json() == []

    assert _import(api, good).json() == {"imported": 1, "improved": 1}
    served = api.get("/v1/configs/best", params={"workload": wh, "target": _fingerprint(api), "shape": "M=4"})
    assert served.status_code == 200, served.text
    kernel = build_kernel(served.json()["config"])  # what client.kernel() builds from the signed answer
    x, w = np.ones((4, 32), "float32"), np.arange(64 * 32, dtype="float32").reshape(64, 32) / 1024
    np.testing.assert_allclose(kernel(x, w), x @ w.T, rtol=1e-5)


def _fingerprint(api: TestClient) -> str:  # noqa: F811
    (record,) = api.get("/v1/configs").json()
    fingerprint: str = record["target_fingerprint"]
    return fingerprint


@pytest.fixture
def fake_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh checker whose child is the shell script written to the yielded path instead of Python."""
    script = tmp_path / "child.sh"
    monkeypatch.setattr(sys, "executable", str(script))
    checker = config_check._Checker()
    monkeypatch.setattr(config_check, "_CHECKER", checker)
    yield script
    checker.close()


def _write(script: Path, body: str) -> None:
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_a_config_that_crashes_tvm_is_refused_and_the_rest_are_still_checked(fake_child: Path) -> None:
    # a child that answers the first config, dies of SIGSEGV on the second, and (started again) passes the third
    _write(fake_child, "echo config-check-ready\nread a\necho null\nread b\nkill -SEGV $$\n")
    item = config_check.ConfigToCheck({}, {"M": 4}, "llvm", {})
    rejections = config_check.check_configs([item, item, item])
    assert rejections == [config_check.Rejection(1, ("module",), "TVM crashed loading it (signal 11)")]


def test_an_import_that_cannot_be_checked_is_a_503_and_stores_nothing(api: TestClient, fake_child: Path) -> None:  # noqa: F811
    _write(fake_child, "echo 'ModuleNotFoundError: No module named tvm' >&2\nexit 1\n")
    wh = api.post("/v1/workloads", json=DENSE).json()["workload_hash"]
    resp = _import(api, _imported(wh))
    assert resp.status_code == 503 and resp.headers["Retry-After"], resp.text
    assert "No module named tvm" in resp.text
    assert api.get("/v1/configs", params={"workload": wh}).json() == []
