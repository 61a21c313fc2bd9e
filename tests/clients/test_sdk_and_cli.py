"""The SDK and the CLI against a real API process (SQLite store), and MetaSchedule database exchange."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kernelfleet import Client, Forbidden, InvalidRequest, ServiceUnavailable, Unauthorized
from kernelfleet.tvm_kernel import build_kernel
from service.cli import app
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from tests.helpers import TINY_DENSE, Fleet, free_port


@pytest.fixture
def api_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    fleet = Fleet(tmp_path / "fleet", {})
    fleet.start_api()
    assert fleet.api_key
    monkeypatch.setenv("KERNELFLEET_API_KEY", fleet.api_key)  # the SDK and the CLI pick it up
    yield fleet.url
    fleet.stop()


def test_sdk_errors_are_typed(api_url: str) -> None:
    with pytest.raises(Unauthorized):
        Client(api_url, api_key="kf_not-a-key").jobs()
    client = Client(api_url)
    reader = client.create_key("reader", ["read"])
    with pytest.raises(Forbidden):
        Client(api_url, api_key=reader["key"]).register_workload(TINY_DENSE)
    assert Client(api_url, api_key=reader["key"]).jobs() == []
    with pytest.raises(InvalidRequest) as err:
        client.register_workload({"op": "dense", "dims": {"N": 8}, "symbolic": ["M"]})
    assert err.value.status == 422 and "K" in str(err.value.detail)
    down = Client(f"http://127.0.0.1:{free_port()}", retries=2, backoff_s=0.05)
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable):
        down.jobs()
    assert time.monotonic() - t0 < 5
    assert not down.health()


def test_keys_cli(api_url: str) -> None:
    runner = CliRunner()
    made = runner.invoke(app, ["keys", "create", "ci-bot", "--scope", "submit", "--scope", "read", "--url", api_url])
    assert made.exit_code == 0 and "key kf_" in made.output, made.output
    key_id = made.output.split()[1]
    listed = runner.invoke(app, ["keys", "list", "--url", api_url])
    assert "ci-bot" in listed.output and "kf_" in listed.output  # the prefix only
    secret = made.output.split("key ", 1)[1].split()[0]
    assert secret not in listed.output
    assert runner.invoke(app, ["keys", "revoke", key_id, "--url", api_url]).exit_code == 0
    with pytest.raises(Unauthorized):
        Client(api_url, api_key=secret, retries=0).jobs()


@pytest.mark.slow
def test_metaschedule_import_best_and_export(api_url: str, tmp_path: Path) -> None:
    import tvm
    from tvm import s_tir
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from service.tuning.compute import prim_func

    # an existing MetaSchedule JSON database, as a user would bring it: a schedule's trace and its measured time,
    # committed through MetaSchedule's own database API (what tune_tir writes, without minutes of search here)
    workload = WorkloadSpec.model_validate(TINY_DENSE)
    mod = prim_func(workload, {"M": 8})
    target = tvm.target.Target(tvm_target(host_target()))
    sch = s_tir.Schedule(mod)
    _, column, _ = sch.get_loops(sch.get_sblock("Y"))
    sch.vectorize(sch.split(column, [None, 8])[1])
    built = tvm.tirx.build(sch.mod, target=target)
    dev, args_info = tvm.cpu(), ArgInfo.from_prim_func(mod["main"])
    args = [tvm.runtime.tensor(np.zeros([int(d) for d in a.shape], a.dtype), dev) for a in args_info]
    seconds = float(np.median(built.time_evaluator("main", dev, number=20, repeat=3)(*args).results))
    ms_dir = tmp_path / "ms"
    ms_dir.mkdir()
    database = ms.database.JSONDatabase(work_dir=str(ms_dir))
    record = ms.database.TuningRecord(sch.trace, database.commit_workload(mod), [seconds], target, args_info)
    database.commit_tuning_record(record)
    assert (ms_dir / "database_tuning_record.json").exists()

    client = Client(api_url)
    wh = client.register_workload(TINY_DENSE).workload_hash
    runner = CliRunner()
    result = runner.invoke(app, ["import-metaschedule", str(ms_dir), "--url", api_url])
    assert result.exit_code == 0, result.output
    assert "imported" in result.output and "improved the store" in result.output

    fp = client.register_target(host_target().model_dump(exclude={"toolchain"})).target_fingerprint
    hit = runner.invoke(app, ["best", "--workload", wh, "--target", fp, "--shape", "M=8", "--url", api_url])
    assert hit.exit_code == 0 and "imported config" in hit.output, hit.output
    miss = runner.invoke(app, ["best", "--workload", wh, "--target", fp, "--shape", "M=9", "--url", api_url])
    assert miss.exit_code == 1 and "miss" in miss.output

    kernel = client.kernel(wh, fp, {"M": 8})
    x, w = np.ones((8, 32), "float32"), np.arange(32 * 32, dtype="float32").reshape(32, 32) / 1024
    np.testing.assert_allclose(kernel(x, w), x @ w.T, rtol=1e-5)
    # the config's IR is compiled only when the service signed exactly this answer with the trusted key
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from kernelfleet.signing import UntrustedArtifact

    stranger = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    with pytest.raises(UntrustedArtifact):
        Client(api_url, trusted_key=base64.b64encode(stranger).decode()).kernel(wh, fp, {"M": 8})

    out = tmp_path / "export"
    exported = runner.invoke(app, ["export-metaschedule", str(out), "--workload", wh, "--url", api_url])
    assert exported.exit_code == 0 and "wrote 1 records" in exported.output, exported.output
    db = ms.database.JSONDatabase(work_dir=str(out))
    record = db.query_tuning_record(mod, target, workload_name="main")
    assert record is not None
    stored = client.best(wh, fp, {"M": 8})
    assert stored is not None
    assert float(record.run_secs[0]) == pytest.approx(stored.latency_s)
    assert build_kernel(stored.config)(x, w).shape == (8, 32)
