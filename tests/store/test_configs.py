"""Best-config store on real SQLite and PostgreSQL."""

from __future__ import annotations

import random
import threading

from service.models import ConfigRecord, TargetSpec, WorkloadSpec
from service.store import catalog, configs
from service.store.db import session_scope

W = WorkloadSpec(op="dense", dims={"N": 32, "K": 32}, symbolic=["M"])


def _target(tvm: str = "0.27.0.post1", mcpu: str = "znver4") -> TargetSpec:
    return TargetSpec.model_validate({"kind": "llvm", "mcpu": mcpu, "num_cores": 2, "toolchain": {"tvm": tvm}})


def _record(latency: float, fingerprint: str, m: int = 16, tag: str = "") -> ConfigRecord:
    return ConfigRecord(
        workload_hash=W.hash,
        target_fingerprint=fingerprint,
        shape={"M": m},
        latency_s=latency,
        kind="sketch",
        config={"format": "test", "tag": tag},
    )


def test_only_better_wins(use_store: str) -> None:
    fp = _target().fingerprint
    with session_scope() as s:
        catalog.put_workload(s, W)
        assert configs.upsert_best(s, _record(2e-3, fp, tag="first"))
        assert not configs.upsert_best(s, _record(3e-3, fp, tag="slower"))
        assert not configs.upsert_best(s, _record(2e-3, fp, tag="equal"))
        assert configs.upsert_best(s, _record(1e-3, fp, tag="faster"))
    with session_scope() as s:
        best = configs.get_best(s, W.hash, fp, {"M": 16})
    assert best is not None and best.latency_s == 1e-3 and best.config["tag"] == "faster"


def test_concurrent_writers_keep_the_fastest(use_store: str) -> None:
    fp = _target().fingerprint
    with session_scope() as s:
        catalog.put_workload(s, W)
    rng = random.Random(0)
    latencies = [[rng.uniform(1e-4, 1e-2) for _ in range(20)] for _ in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(latencies))

    def writer(values: list[float]) -> None:
        try:
            start.wait()
            for v in values:
                with session_scope() as s:
                    configs.upsert_best(s, _record(v, fp, tag=repr(v)))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(v,)) for v in latencies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    fastest = min(min(v) for v in latencies)
    with session_scope() as s:
        best = configs.get_best(s, W.hash, fp, {"M": 16})
    assert best is not None
    assert best.latency_s == fastest and best.config["tag"] == repr(fastest)


def test_lookup_never_crosses_target_or_toolchain(use_store: str) -> None:
    ours, other_cpu, other_tvm = _target(), _target(mcpu="skylake-avx512"), _target(tvm="0.28.0")
    with session_scope() as s:
        catalog.put_workload(s, W)
        configs.upsert_best(s, _record(1e-3, ours.fingerprint))
    with session_scope() as s:
        assert configs.get_best(s, W.hash, ours.fingerprint, {"M": 16}) is not None
        assert configs.get_best(s, W.hash, other_cpu.fingerprint, {"M": 16}) is None
        assert configs.get_best(s, W.hash, other_tvm.fingerprint, {"M": 16}) is None
        assert configs.get_best(s, W.hash, ours.fingerprint, {"M": 17}) is None


def test_records_for_old_toolchains_are_kept(use_store: str) -> None:
    old, new = _target(tvm="0.26.0"), _target()
    with session_scope() as s:
        catalog.put_workload(s, W)
        configs.upsert_best(s, _record(1e-3, old.fingerprint))
        configs.upsert_best(s, _record(2e-3, new.fingerprint))
    with session_scope() as s:
        assert {r.target_fingerprint for r in configs.list_best(s, W.hash)} == {old.fingerprint, new.fingerprint}
