"""One `ukernel` unit run in-process, and its publication as the dispatch document the service would serve."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from kernelfleet.models import DispatchDoc, UKernelRef
from service.models import Budget, WorkloadSpec
from service.models.distribution import ShapeDistribution
from service.settings import Settings
from service.tuning.hardware import host_target
from service.tuning.kinds import KINDS
from service.tuning.kinds.base import DispatchPublication, UnitContext, UnitResult
from service.tuning.platforms import PLATFORMS
from tests.tuning.sinks import RecordingSink


def run_ukernel_unit(
    workload: WorkloadSpec, distribution: ShapeDistribution, work_dir: Path, *, vendor_routes: bool = False
) -> tuple[UnitResult, RecordingSink]:
    """The job's single unit (budget: 2 uKernels, 2 hot shapes) on this host, vendor routes off unless asked: at
    these tiny sizes numpy wins every shape, and most tests are about the uKernels."""
    kind = KINDS.get("ukernel")
    platform: Any = PLATFORMS.get("llvm")
    budget = Budget(trials=2, max_shapes=2)
    (unit,) = kind.plan(workload, distribution, budget).units
    sink = RecordingSink()
    ctx = UnitContext(
        job_id="j",
        worker="w",
        workload=workload,
        target=platform.resolve(host_target()),
        platform=platform,
        distribution=distribution,
        budget=budget,
        settings=Settings(ukernel_vendor_routes=vendor_routes),
        work_dir=work_dir,
        sink=sink,
    )
    return kind.run_unit(unit, ctx), sink


def publication_doc(pub: DispatchPublication, workload_hash: str, target_fingerprint: str) -> DispatchDoc:
    return DispatchDoc(
        workload_hash=workload_hash,
        target_fingerprint=target_fingerprint,
        dim=pub.dim,
        s_max=len(pub.predicted),
        table=pub.table.to_json(),
        ukernels=[
            UKernelRef(id=a.ukernel_id, sha256=a.sha256, spec=a.spec, size_bytes=len(a.data)) for a in pub.artifacts
        ],
        predicted_latency_s=pub.predicted,
        measured_latency_s={str(k): v for k, v in pub.measured.items()},
        created_at=dt.datetime.now(dt.UTC),
    )
