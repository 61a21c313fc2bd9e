"""The `ukernel` kind on batch_matmul: what it accepts (422 naming the field otherwise), one unit run end to end
(tuple table over T in M and K, A·V), and the published document loaded by the SDK as a BmmDispatcher."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelfleet.bmm_dispatcher import BmmDispatcher
from kernelfleet.dispatch_cache import DispatchCache, dispatcher_from_doc
from service.models import Budget, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit, Independent, ShapePoint, Uniform
from service.tuning.admission import check_job
from service.tuning.tuners.ukernel.bmm_tuner import random_pair
from tests.tuning.ukernel.units import publication_doc, run_ukernel_unit

LLVM = TargetSpec(kind="llvm", mcpu="skylake-avx512", num_cores=2)
AV = WorkloadSpec(op="batch_matmul", dims={"B": 2, "N": 64}, symbolic=["M", "K"])
AV_T = Explicit(points=[ShapePoint(shape={"M": t, "K": t}) for t in range(1, 25)])  # joint: T in M and K


def test_what_the_kind_accepts_for_batch_matmul() -> None:
    assert check_job("ukernel", AV, AV_T, LLVM, Budget(trials=2)) is None
    grid = Independent(factors=[Uniform(dim="M", low=1, high=64), Uniform(dim="K", low=1, high=64)])
    assert check_job("ukernel", AV, grid, LLVM, Budget(trials=2)) is None  # a product: every class planned
    three = WorkloadSpec(op="batch_matmul", dims={"N": 64}, symbolic=["B", "M", "K"])
    dist3 = Explicit(points=[ShapePoint(shape={"B": 12, "M": t, "K": t}) for t in (1, 7, 64)])
    assert check_job("ukernel", three, dist3, LLVM, Budget(trials=2)) is None
    four = WorkloadSpec(op="batch_matmul", dims={}, symbolic=["B", "M", "N", "K"])
    dist4 = Explicit(points=[ShapePoint(shape={"B": 1, "M": 2, "N": 3, "K": 4})])
    problem = check_job("ukernel", four, dist4, LLVM, Budget(trials=2))
    assert problem is not None and problem.loc == ("workload", "symbolic")
    cuda = TargetSpec(kind="cuda", arch="sm_90")
    problem = check_job("ukernel", AV, AV_T, cuda, Budget(trials=2))
    assert problem is not None and problem.loc[0] == "target"
    reps = (1, 2, 3, 5, 9, 17, 33, 65, 129, 257)  # one tuple per geometric class: 10 × 10 × 4 classes
    wide = Explicit(points=[ShapePoint(shape={"B": b, "M": m, "K": k}) for b in reps for m in reps for k in reps[:4]])
    problem = check_job("ukernel", three, wide, LLVM, Budget(trials=2))
    assert problem is not None and problem.loc == ("distribution",) and "classes" in problem.message


def test_a_unit_publishes_a_tuple_table_the_sdk_runs(tmp_path: Path) -> None:
    result, _ = run_ukernel_unit(AV, AV_T, tmp_path / "work")
    assert result.fatal is None and result.dispatch is not None
    pub = result.dispatch
    assert pub.dim == "M,K" and pub.table.static == {"B": 2, "N": 64} and len(result.shapes) == 2
    cache = DispatchCache(tmp_path / "cache")
    for a in pub.artifacts:
        cache.put_artifact(a.sha256, a.data)
    doc = publication_doc(pub, "w", "t")
    d = dispatcher_from_doc(doc, cache, "service")
    assert isinstance(d, BmmDispatcher)
    for t in (1, 5, 24, 25, 40):
        a, bt = random_pair({"B": 2, "M": t, "N": 64, "K": t}, seed=t)
        np.testing.assert_allclose(d(a, bt), a @ bt.transpose(0, 2, 1), rtol=1e-4, atol=1e-3)
    assert d.misses == 2  # 25 and 40 are past the tuned box
    with pytest.raises(ValueError, match="N=64"):
        d(*random_pair({"B": 2, "M": 3, "N": 32, "K": 3}))
