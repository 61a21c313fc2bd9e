"""A model onboarded end to end: a tiny ONNX MLP (2 dense layers) parsed by the CLI on the client, sent to the real
API, tuned by a real Celery worker (PostgreSQL, Redis), followed and inspected through the SDK.

The jobs are of the test suite's `exhaustive` kind (4 fixed schedules per hot shape, loaded as a plugin): a `sketch`
search on two layers took about 4 minutes on the shared 2-core machine, and the model machinery under test is the
same whatever the kind."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kernelfleet.cli import app
from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow
onnx = pytest.importorskip("onnx")


def _mlp(path: Path) -> Path:
    """x[batch, 32] → Gemm(64) → Gemm(16): two dense layers (no bias: the exhaustive kind takes none)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("w1", (64, 32)), ("w2", (16, 64)))
    ]
    nodes = [
        helper.make_node("Gemm", ["x", "w1"], ["h"], transB=1, name="fc1"),
        helper.make_node("Gemm", ["h", "w2"], ["y"], transB=1, name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])],
        initializer=inits,
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), path)
    return path


def test_a_tiny_model_is_added_by_the_cli_tuned_by_a_worker_and_followed_by_the_sdk(
    exhaustive_fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exhaustive_fleet.start_api()
    exhaustive_fleet.start_worker("w1")
    client = exhaustive_fleet.client()
    hw = wait_for(lambda: client.workers(), 90, "a worker to announce itself")[0]["target"]
    target = {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}
    traffic = tmp_path / "traffic.json"
    traffic.write_text(json.dumps({"batch": {"4": 3, "8": 1}}))
    assert exhaustive_fleet.api_key
    monkeypatch.setenv("KERNELFLEET_API_KEY", exhaustive_fleet.api_key)

    t0 = time.monotonic()
    args = ["model", "add", str(_mlp(tmp_path / "mlp.onnx")), "--target", json.dumps(target), "--histogram"]
    args += [str(traffic), "--trials", "8", "--min-trials", "2", "--max-shapes", "1", "--kind", "exhaustive"]
    added = CliRunner().invoke(app, [*args, "--url", exhaustive_fleet.url])
    assert added.exit_code == 0, added.output
    model_id = re.search(r"model ([0-9a-f-]{36})", added.output)
    assert model_id, added.output
    model = client.model(model_id.group(1))
    assert model.name == "mlp" and model.jobs_total == 2 and not model.skipped
    fc1, fc2 = model.ops
    assert fc1.occurrences == fc2.occurrences == 1 and fc1.dims["M"] == "batch"
    # FLOPs at E[batch] = 5: fc1 2·5·64·32 = 20480, fc2 2·5·16·64 = 10240 → 2 trials each, and the other 4 by
    # share: 2.67 and 1.33, rounded by the largest remainder to 3 and 1
    assert fc1.share == pytest.approx(2 / 3) and (fc1.trials, fc2.trials) == (5, 3)

    seen: list[str] = []
    done = client.wait_model(model.id, timeout_s=120, poll_s=0.5, on_update=lambda m: seen.append(m.state))
    assert done.state == "succeeded", [(op.name, op.state, op.error) for op in done.ops]
    assert done.jobs_done == done.jobs_total == 2 and done.progress == 1.0 and done.states == {"succeeded": 2}
    for op in done.ops:
        assert op.job_id is not None
        job = client.job(op.job_id)
        assert job.state == "succeeded" and job.budget["trials"] == op.trials and job.tags["model"] == "mlp"
        assert [s.shape["M"] for s in job.shapes] == [4]  # the hot shape: 3 of 4 calls
        assert job.kind == "exhaustive" and job.trials_done == job.trials_total == 4
    status = CliRunner().invoke(app, ["model", "status", model.id, "--url", exhaustive_fleet.url])
    assert status.exit_code == 0 and "succeeded" in status.output and "2/2 jobs done" in status.output
    cancelled = CliRunner().invoke(app, ["model", "cancel", model.id, "--url", exhaustive_fleet.url])
    assert cancelled.exit_code == 0 and client.model(model.id).state == "succeeded"  # nothing left to cancel
    print(f"model tuned end to end in {time.monotonic() - t0:.1f} s; states seen: {sorted(set(seen))}")
