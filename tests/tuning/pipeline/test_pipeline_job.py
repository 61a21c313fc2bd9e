"""`pipeline` jobs: what they accept (422s naming the field otherwise), where they are queued (gpu.<arch>), and
that a CPU worker never runs one. Real API, Celery worker, PostgreSQL and Redis; the job runner in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelfleet import InvalidRequest
from service.models import Budget, JobSpec, TargetSpec, WorkloadSpec
from service.models.distribution import Explicit, ShapePoint
from service.tuning.admission import check_job
from service.tuning.platforms import queue_for
from tests.helpers import Fleet, wait_for

DENSE = {"op": "dense", "dims": {"N": 1024, "K": 2048}, "symbolic": ["M"]}
QK = {"op": "batch_matmul", "dims": {"B": 12, "N": 128, "K": 64}, "symbolic": ["M"]}  # BERT-base attention QK
CONV = {"op": "conv2d", "dims": {"H": 14, "W": 14, "CI": 256, "CO": 256, "KH": 3, "KW": 3}, "symbolic": ["N"],
        "attrs": {"padding": 1}}  # fmt: skip
A100 = {"kind": "cuda", "arch": "sm_80"}
DIST = {"kind": "explicit", "points": [{"shape": {"M": 64}, "weight": 1.0}]}


Found = tuple[tuple[str | int, ...], str] | None


def _problem(workload: dict[str, Any], target: dict[str, Any], dim: str = "M") -> Found:
    dist = Explicit(points=[ShapePoint(shape={dim: 16})])
    found = check_job("pipeline", WorkloadSpec(**workload), dist, TargetSpec(**target), Budget())
    return (found.loc, found.message) if found else None


def test_pipeline_jobs_take_gemm_like_operators_on_ampere_and_newer() -> None:
    for workload, dim in ((DENSE, "M"), (QK, "M"), (CONV, "N")):
        for arch in ("sm_80", "sm_86", "sm_90"):
            assert _problem(workload, {"kind": "cuda", "arch": arch}, dim) is None
    loc, message = _problem(DENSE, {"kind": "cuda", "arch": "sm_75"}) or ((), "")
    assert loc == ("target", "arch") and "sm_80 or newer" in message
    loc, _ = _problem(DENSE, {"kind": "llvm", "mcpu": "znver4", "num_cores": 2}) or ((), "")
    assert loc == ("target", "kind")
    loc, _ = _problem({**DENSE, "attrs": {"bias": True}}, A100) or ((), "")
    assert loc == ("workload", "attrs", "bias")
    loc, _ = _problem({**CONV, "dims": {**CONV["dims"], "CI": 3}}, A100, "N") or ((), "")  # type: ignore[dict-item]
    assert loc == ("workload", "dims", "CI")


def test_a_pipeline_job_is_queued_on_its_gpu_arch() -> None:
    spec = JobSpec(kind="pipeline", workload=WorkloadSpec(**DENSE), target=TargetSpec(**A100), distribution=DIST)
    assert queue_for(spec.target) == "gpu.sm_80"


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Fleet]:
    fleet = Fleet(tmp_path / "fleet", {"KERNELFLEET_DATABASE_URL": pg_url, "KERNELFLEET_BROKER_URL": redis_url})
    yield fleet
    fleet.stop()


@pytest.mark.slow
def test_pipeline_job_goes_to_gpu_queue_and_no_cpu_worker_takes_it(
    fleet: Fleet, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    fleet.start_api()
    fleet.start_worker("cpu1")
    client = fleet.client()
    wait_for(lambda: client.workers(), 90, "the CPU worker to announce itself")

    with pytest.raises(InvalidRequest) as old_gpu:
        client.submit(DENSE, {"kind": "cuda", "arch": "sm_75"}, DIST, kind="pipeline")
    assert any(d["loc"][:3] == ["body", "target", "arch"] for d in old_gpu.value.detail)

    job = client.submit(DENSE, A100, DIST, kind="pipeline", budget={"trials": 8})
    assert job.state == "queued" and job.waiting_for_worker == "gpu.sm_80"
    broker = redis.Redis.from_url(redis_url)
    assert wait_for(lambda: broker.llen("gpu.sm_80"), 10, "the job's message on gpu.sm_80") == 1
    # the CPU worker consumes only its own queues: the message stays, the job stays queued
    wait_for(lambda: client.job(job.id).waiting_for_worker == "gpu.sm_80", 5, "the job view")
    assert broker.llen("gpu.sm_80") == 1
    assert client.job(job.id).state == "queued" and job.id not in fleet.log("cpu1")

    # even handed the job directly, this host's runner refuses: it has no CUDA GPU
    from service.settings import get_settings
    from service.store import db
    from service.workers.job_runner import run_job

    monkeypatch.setenv("KERNELFLEET_DATABASE_URL", fleet.settings.resolved_database_url)
    get_settings.cache_clear()
    db.get_engine.cache_clear()
    db._session_factory.cache_clear()
    try:
        assert run_job(job.id, "cpu-in-process", get_settings()) == "failed"
    finally:
        db.get_engine.cache_clear()
        db._session_factory.cache_clear()
        get_settings.cache_clear()
    failed = client.job(job.id)
    assert failed.state == "failed" and "no CUDA GPU" in (failed.error or "")


def test_the_model_is_calibrated_from_the_targets_measured_pipeline_kernels(use_store: str) -> None:
    """Candidates a pipeline job recorded (here from a *synthetic* GPU: the model with slower DRAM, no GPU on
    this host) calibrate the next job's model for that target fingerprint; too few leave the arch's table."""
    from service.models.config import MeasuredCandidate
    from service.models.target import Toolchain
    from service.store import catalog, configs, jobs
    from service.store.db import session_scope
    from service.tuning.kinds.pipeline import CONFIG_FORMAT, calibration_samples, candidate, gpu_constants
    from service.tuning.tuners.pipeline.model import GPUConstants, predict
    from service.tuning.tuners.pipeline.space import GemmShape, enumerate_space

    target = TargetSpec(**A100, toolchain=Toolchain(tvm="0.27.0"), details={"sm_count": 100, "l2_bytes": 40 << 20})
    table = GPUConstants.for_arch("sm_80")
    synthetic = table.replaced(sm_count=100, dram_bw=table.dram_bw / 2, lat_dram_s=table.lat_dram_s * 2)
    gemm = GemmShape(1, 64, 1024, 2048)
    measured = [(c, predict(gemm, c, synthetic).seconds) for c in enumerate_space(gemm)[::500]]
    spec = JobSpec(kind="pipeline", workload=WorkloadSpec(**DENSE), target=target, distribution=DIST)
    with session_scope() as s:
        workload = catalog.put_workload(s, WorkloadSpec(**DENSE))
        job = jobs.create_job(s, spec, workload.workload_hash, queue=queue_for(spec.target))
        records = [candidate(gemm, c, t, None) for c, t in measured]
        records.append(MeasuredCandidate(config={"format": "ms-trace"}, latency_s=1.0, status="ok"))  # not ours
        configs.record_candidates(s, job.id, workload.workload_hash, target.fingerprint, "M=64", records)
    with session_scope() as s:
        samples = calibration_samples(configs.target_candidates(s, target.fingerprint, CONFIG_FORMAT, 2000))
    assert len(samples) == len(measured) >= 16
    assert gpu_constants(target, samples[:3]).sm_count == 100  # the detected part, not the table's 108
    fitted = gpu_constants(target, samples)
    assert fitted.dram_bw < table.dram_bw
    with session_scope() as s:
        assert configs.target_candidates(s, "0" * 32, CONFIG_FORMAT, 2000) == []


def test_a_retried_unit_reads_back_what_its_killed_attempt_measured(use_store: str) -> None:
    """The store → tuner half of a pipeline retry (issue 34 item 7): the unit's candidates, as the store returns
    them for this job and target, become the search's earlier measurements in their order, failures as inf."""
    import math

    from service.models.target import Toolchain
    from service.store import catalog, configs, jobs
    from service.store.db import session_scope
    from service.tuning.kinds.pipeline import candidate, earlier_measurements
    from service.tuning.tuners.pipeline.space import GemmShape, enumerate_space

    target = TargetSpec(**A100, toolchain=Toolchain(tvm="0.27.0"))
    gemm = GemmShape(1, 64, 1024, 2048)
    chosen = enumerate_space(gemm)[:3]
    spec = JobSpec(kind="pipeline", workload=WorkloadSpec(**DENSE), target=target, distribution=DIST)
    with session_scope() as s:
        workload = catalog.put_workload(s, WorkloadSpec(**DENSE))
        job = jobs.create_job(s, spec, workload.workload_hash, queue=queue_for(spec.target))
        records = [
            candidate(gemm, chosen[0], 2e-5, None, 1e-5),
            candidate(gemm, chosen[1], math.inf, "ptxas: 300 regs"),
            candidate(gemm, chosen[2], 1e-5, None),
        ]
        configs.record_candidates(s, job.id, workload.workload_hash, target.fingerprint, "M=64", records)
    with session_scope() as s:
        earlier = earlier_measurements(configs.job_candidates(s, job.id, target.fingerprint, "M=64"))
        assert earlier_measurements(configs.job_candidates(s, job.id, target.fingerprint, "M=65")) == ()
    assert earlier == ((chosen[0], 2e-5), (chosen[1], math.inf), (chosen[2], 1e-5))


def test_dashboard_names_each_candidate_by_its_pipeline_and_the_kind_needs_no_compiler() -> None:
    import subprocess
    import sys

    from service.tuning.kinds import KINDS
    from service.tuning.kinds.pipeline import candidate
    from service.tuning.tuners.pipeline.space import GemmShape, PipelineConfig

    config = PipelineConfig(32, 32, 16, 2, 4, smem_stages=4, async_copy=True, reg_stages=2, fuse_inner=True)
    record = candidate(GemmShape(1, 64, 1024, 2048), config, 1e-5, None)
    assert KINDS.get("pipeline").describe_config(record.config) == "32x32x16/2x4/s4a/r2f" and record.status == "ok"
    failed = candidate(GemmShape(1, 64, 1024, 2048), config, float("inf"), "ptxas error")
    assert failed.status == "error" and failed.latency_s is None and failed.error == "ptxas error"
    code = (
        "import sys; from service.tuning.kinds import KINDS; KINDS.get('pipeline'); "
        "assert not [m for m in sys.modules if m == 'tvm' or m.startswith('tvm.')], 'imports TVM'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_unit_without_a_gpu_records_failed_measurements_and_publishes_nothing(
    use_store: str, tmp_path: Path
) -> None:
    """The unit runs for real up to the device: ALCOP's search builds its proposals with TVM; timing needs a GPU,
    this host has none, so every proposal is recorded as a failed candidate and nothing is published."""
    from service.models.config import MeasuredCandidate
    from service.models.target import Toolchain
    from service.settings import get_settings
    from service.store import catalog, jobs
    from service.store.db import session_scope
    from service.tuning.kinds import KINDS, UnitContext
    from service.tuning.platforms import platform_for

    target = TargetSpec(**A100, toolchain=Toolchain(tvm="0.27.0"))
    kind = KINDS.get("pipeline")
    spec = JobSpec(kind="pipeline", workload=WorkloadSpec(**DENSE), target=target, distribution=DIST,
                   budget=Budget(trials=3, max_shapes=1), tags={"pipeline_search": "analytical"})  # fmt: skip
    with session_scope() as s:
        workload = catalog.put_workload(s, WorkloadSpec(**DENSE))
        job_id = jobs.create_job(s, spec, workload.workload_hash, queue=queue_for(spec.target)).id
    plan = kind.plan(workload, spec.distribution, spec.budget)
    recorded: list[MeasuredCandidate] = []

    class Sink:
        def on_candidates(self, unit_key: str, candidates: list[MeasuredCandidate]) -> None:
            recorded.extend(candidates)

        def on_progress(self, shape_key: str | None, trials: int) -> None: ...

        def earlier_candidates(self, unit_key: str) -> list[MeasuredCandidate]:
            return []

        def target_candidates(self, config_format: str, limit: int) -> list[MeasuredCandidate]:
            return []

        def should_stop(self) -> bool:
            return False

    ctx = UnitContext(job_id, "cpu-test", workload, target, platform_for(target), spec.distribution, spec.budget,
                      get_settings(), tmp_path, Sink(), spec.tags)  # fmt: skip
    result = kind.run_unit(plan.units[0], ctx)
    (outcome,) = result.shapes
    assert outcome.config is None and outcome.latency_s is None
    assert outcome.error and outcome.error.startswith("all 3 candidates failed")
    assert "cuda is not enabled" in outcome.error  # built fine; TVM has no CUDA device API on this host
    assert len(recorded) == 3 and all(c.status == "error" and c.latency_s is None for c in recorded)
    assert all(c.config["format"] == "pipeline-gemm" and c.config["predicted_s"] > 0 for c in recorded)


def test_the_dashboard_shows_the_models_quality_per_shape() -> None:
    """Recomputed from the candidates alone (proposal order + predictions), so every job shows it, published or not."""
    import datetime as dt

    from kernelfleet.models import JobView
    from service.api.dashboard import job_pages
    from service.api.dashboard import panels as ui
    from service.tuning.kinds.pipeline import candidate
    from service.tuning.tuners.pipeline.space import GemmShape, enumerate_space

    gemm = GemmShape(1, 64, 1024, 2048)
    configs = enumerate_space(gemm)[:12]
    # proposals measured 12, 11, ..., 1 µs (the 12th proposal is the best) and predicted in the same order
    points = [
        ui.CandidatePoint(i, "M=64", candidate(gemm, c, (12 - i) * 1e-6, None, (12 - i) * 2e-6).config,
                          (12 - i) * 1e-6, "ok", None, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
        for i, c in enumerate(configs)
    ]  # fmt: skip
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    job = JobView(id="j", kind="pipeline", state="succeeded", workload_hash="w", target={}, target_fingerprint=None,
                  progress=1.0, trials_done=12, trials_total=12, error=None, attempts=1, created_at=t0,
                  started_at=t0, shapes=[])  # fmt: skip
    panels = job_pages.job_panels(ui.JobData(job, points, len(points)))
    (model,) = [p for p in panels if p.id == "model"]
    (row,) = model.rows
    assert row[:3] == ["M=64", 12, 12]
    assert row[3] == pytest.approx(1 / 3)  # best of the first 10 proposals: 3 µs, against 1 µs found
    assert row[4] == 1.0 and row[5] == 1.0
