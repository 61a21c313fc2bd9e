"""Dispatch tables in the store: appended not replaced, artifacts content-addressed, overrides and ETags."""

from __future__ import annotations

import hashlib

from service.api.documents import dispatch_document
from service.models import ConfigRecord, TargetSpec, WorkloadSpec
from service.store import catalog, configs
from service.store import dispatch as dispatch_store
from service.store.db import session_scope

TARGET = TargetSpec(kind="llvm", mcpu="znver4", num_cores=2, toolchain={"tvm": "0.27.0.post1"})
TABLE = {"mts": {"u": 4}, "intervals": [[1, 8, [[], "u"]]]}


def _artifact(payload: bytes) -> dispatch_store.Artifact:
    sha = hashlib.sha256(payload).hexdigest()
    return dispatch_store.Artifact("u", sha, {"N": 8, "K": 8, "mt": 4}, payload)


def _publish(s, wh: str, payload: bytes, predicted: list[float]):  # type: ignore[no-untyped-def]
    return dispatch_store.publish(
        s, workload_hash=wh, target_fingerprint=TARGET.fingerprint, dim="M", table=TABLE,
        artifacts=[_artifact(payload)], predicted=predicted, measured={8: predicted[-1]}, validation={}, job_id=None,
    )  # fmt: skip


def test_newest_table_wins_and_faster_exact_configs_change_the_etag(use_store: str) -> None:
    with session_scope() as s:
        wh = catalog.put_workload(s, WorkloadSpec(op="dense", dims={"N": 8, "K": 8}, symbolic=["M"])).workload_hash
        catalog.put_target(s, TARGET)
        first = _publish(s, wh, b"lib-1", [1.0] * 8)
        second = _publish(s, wh, b"lib-2", [2.0] * 8)
        _publish(s, wh, b"lib-2", [2.0] * 8)  # same bytes: stored once
    with session_scope() as s:
        row = dispatch_store.latest(s, wh, TARGET.fingerprint)
        assert row is not None and row.id > second.id > first.id
        assert dispatch_store.get_artifact(s, hashlib.sha256(b"lib-1").hexdigest()) is not None  # nothing deleted
        before = dispatch_store.etag(row, dispatch_store.override_keys(s, row))
        doc = dispatch_document(s, row)
        assert doc.overrides == [] and doc.ukernels[0].size_bytes == len(b"lib-2")
        for m, latency in ((3, 5.0), (5, 0.5)):  # slower than the table at M=3, faster at M=5
            configs.upsert_best(
                s, ConfigRecord(workload_hash=wh, target_fingerprint=TARGET.fingerprint, shape={"M": m},
                                latency_s=latency, kind="sketch", config={"format": "x"}, provenance={}),
            )  # fmt: skip
    with session_scope() as s:
        row = dispatch_store.latest(s, wh, TARGET.fingerprint)
        assert row is not None
        keys = dispatch_store.override_keys(s, row)
        assert [k[1] for k in keys] == [5] and dispatch_store.etag(row, keys) != before
        (override,) = dispatch_document(s, row).overrides
        assert override.S == 5 and override.table_latency_s == 2.0 and override.config == {"format": "x"}
        assert dispatch_store.latest(s, wh, "0" * 32) is None
