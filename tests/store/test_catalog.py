"""Registering workloads and targets on real SQLite and PostgreSQL: content-addressed rows, idempotent under races."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from service.models import TargetSpec, WorkloadSpec
from service.store import catalog
from service.store.db import get_engine
from service.store.tables import TargetRow, WorkloadRow

TARGET = TargetSpec.model_validate({"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0"}})
WORKLOAD = WorkloadSpec(op="dense", dims={"N": 32, "K": 32}, symbolic=["M"])


@pytest.mark.parametrize(
    ("put", "table"),
    [(lambda s: catalog.put_target(s, TARGET), TargetRow), (lambda s: catalog.put_workload(s, WORKLOAD), WorkloadRow)],
    ids=["target", "workload"],
)
def test_two_requests_registering_the_same_spec_at_once_both_succeed(
    use_store: str, put: Callable[[Any], Any], table: type[TargetRow] | type[WorkloadRow]
) -> None:
    """The second request looks before the first has committed (it sees no row), inserts, and waits for the first's
    lock: it then finds the row there and succeeds (CI saw this as a 500 when a client retried a slow POST)."""
    from sqlalchemy.orm import Session

    engine = get_engine(use_store)
    first = Session(engine)
    put(first)  # inserted, not committed
    errors: list[BaseException] = []

    def second() -> None:
        with Session(engine) as session:
            try:
                put(session)
                session.commit()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

    racer = threading.Thread(target=second)
    racer.start()
    racer.join(1.0)  # it blocks on the first's uncommitted row (PostgreSQL) or write lock (SQLite)
    first.commit()
    first.close()
    racer.join(30)
    assert not racer.is_alive() and errors == []
    with Session(engine) as session:
        assert session.scalar(select(func.count()).select_from(table)) == 1


def _op(workload_hash: str, name: str, occurrences: int) -> dict[str, Any]:
    return {"name": name, "workload_hash": workload_hash, "job_id": None, "occurrences": occurrences,
            "distribution": {}, "dims": {}, "sources": [], "priority": 1.0}  # fmt: skip


def test_a_workload_label_names_the_models_that_run_it(use_store: str) -> None:
    """Reports name layers by model, op, dims and epilogue (issue 35 item 6): calls per forward added over a model's
    ops, a model onboarded twice counted once; a workload no model runs keeps its plain label."""
    from sqlalchemy.orm import Session

    from service.store import models

    with Session(get_engine(use_store)) as session:
        wh = catalog.put_workload(session, WORKLOAD).workload_hash
        other = catalog.put_workload(session, WORKLOAD.model_copy(update={"dims": {"N": 64, "K": 32}})).workload_hash
        bert_ops = [_op(wh, "encoder.layer.*.output.dense", 12), _op(wh, "pooler.dense", 1)]
        for name, ops in [("bert", bert_ops), ("bert", bert_ops), ("gpt2", [_op(wh, "h.*.mlp.c_proj", 12)])]:
            models.create_model(session, name=name, kind="ukernel", target={}, budget={}, split={}, tags={},
                                owner_key_id=None, ops=ops)  # fmt: skip
        assert catalog.workload_label(session, wh) == "dense M=? N=32 K=32 (bert 13×, gpt2 12×)"
        assert catalog.workload_label(session, other) == "dense M=? N=64 K=32"
        assert catalog.workload_label(session, "0" * 64) == ""
