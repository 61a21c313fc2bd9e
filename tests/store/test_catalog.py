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
