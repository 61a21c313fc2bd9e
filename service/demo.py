"""`make demo`: the whole service on the embedded default, one real tuning job, a results table.

BERT-base QKV projection, Y = X·Wᵀ with K=768, N=2304 and the sequence length M drawn from a
distribution. The job kind comes from the registry: by default the one the fleet loop would pick for
this workload on this host (a kind that covers every M in one job, whose dispatch table the SDK then
runs for shapes seen and unseen with no network per call); `--kind` names another. Each hot shape is
compared with the vendor library on the same worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kernelfleet import Client
from kernelfleet.dispatcher import Dispatcher
from service.launch import Supervisor
from service.models import TargetSpec, WorkloadSpec
from service.settings import Settings
from service.tuning.admission import fleet_kind
from service.tuning.kinds import KINDS, JobKind

WORKLOAD = {"op": "dense", "dtype": "float32", "dims": {"N": 2304, "K": 768}, "symbolic": ["M"]}
# Sequence lengths seen by a serving fleet (weights are the share of calls).
DISTRIBUTION = {
    "kind": "explicit",
    "points": [
        {"shape": {"M": 1}, "weight": 0.40},
        {"shape": {"M": 16}, "weight": 0.30},
        {"shape": {"M": 61}, "weight": 0.20},
        {"shape": {"M": 128}, "weight": 0.10},
    ],
}


def _wait_ready(client: Client, timeout_s: float = 120) -> dict[str, object]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if client.health():
            workers = client.workers()
            if workers:
                first: dict[str, object] = workers[0]
                return first
        time.sleep(0.5)
    raise TimeoutError("the service did not come up; see the logs under the data dir")


def _median_s(fn: object, *args: np.ndarray, repeat: int = 30) -> float:
    assert callable(fn)
    # No pause between libraries: the SDK's thread settings (kernelfleet.runtime, applied when the
    # `kernelfleet` command imports the SDK before numpy) keep TVM's and OpenBLAS's idle threads off the cores.
    fn(*args)
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


def _show_dispatcher(console: Console, client: Client, workload_hash: str, fingerprint: str, cache: Path) -> None:
    """What an inference host does: fetch the dispatch table once, then run any M locally."""
    t0 = time.perf_counter()
    dispatcher = client.dispatcher(workload_hash, fingerprint, cache_dir=cache)
    assert isinstance(dispatcher, Dispatcher), "the demo tunes an llvm target: its table is a CPU one"
    console.print(f"SDK dispatcher loaded from the {dispatcher.source} in {time.perf_counter() - t0:.2f} s")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((2304, 768)).astype("float32")
    dispatcher.prepare(w)
    worst = 0.0
    for m in [*range(1, 129), 131, 200, 257]:  # every tuned M, then shapes past the tuned range
        x = rng.standard_normal((m, 768)).astype("float32")
        worst = max(worst, float(np.abs(dispatcher(x, w) - x @ w.T).max()))
    console.print(f"every M in 1..128 plus 131, 200, 257 checked against numpy: max |error| = {worst:.2e}")
    table = Table(title="SDK dispatcher vs numpy on this machine (median of 30 calls)")
    for col in ("M", "program", "dispatcher (µs)", "numpy (µs)", "numpy / dispatcher"):
        table.add_column(col, justify="right")
    for m in (1, 16, 61, 97, 128, 200):
        x = rng.standard_normal((m, 768)).astype("float32")
        ours, theirs = _median_s(dispatcher, x, w), _median_s(lambda a, b: a @ b.T, x, w)
        program = " + ".join(f"{p.rows}@mt{dispatcher.kernels[p.ukernel_id].spec.mt}" for p in dispatcher.program(m))
        program = program or "numpy (vendor route)"  # the job measured numpy faster here, so the table routes M to it
        table.add_row(str(m), program, f"{ours * 1e6:.1f}", f"{theirs * 1e6:.1f}", f"{theirs / ours:.2f}×")
    console.print(table)


def _kind(name: str | None, target: dict[str, object]) -> JobKind:
    """The named kind, or the one the fleet loop would choose for the demo's workload on this host."""
    if name:
        return KINDS.get(name)
    chosen = fleet_kind(WorkloadSpec.model_validate(WORKLOAD), TargetSpec.model_validate(target))
    if chosen is None:
        raise SystemExit(f"no registered job kind tunes the demo's workload on {target}")
    return chosen


@contextlib.contextmanager
def demo_data_dir(given: Path | None, keep: bool) -> Iterator[Path]:
    """The demo's store, broker and logs: a fresh temporary directory, removed afterwards (even when the demo
    fails) unless `keep` or the caller named its own."""
    if given is not None:
        yield given
        return
    path = Path(tempfile.mkdtemp(prefix="kernelfleet-demo-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def main(
    trials: int | None = None,
    port: int = 8765,
    data_dir: Path | None = None,
    kind: str | None = None,
    keep: bool = False,
) -> None:
    with demo_data_dir(data_dir, keep) as path:
        _run(trials, port, path, kind)
        if keep:
            Console().print(f"kept the demo's store, broker and logs in {path}")


def _run(trials: int | None, port: int, data_dir: Path, kind: str | None) -> None:
    console = Console()
    os.environ["KERNELFLEET_DATA_DIR"] = str(data_dir)
    for var in ("KERNELFLEET_DATABASE_URL", "KERNELFLEET_BROKER_URL"):
        os.environ.pop(var, None)  # the demo always runs on the embedded default
    settings = Settings(data_dir=data_dir)
    supervisor = Supervisor(settings, port=port, workers=1)
    console.print(f"[bold]KernelFleet demo[/] — embedded store and broker in {data_dir}")
    admin_key = supervisor.start()
    try:
        client = Client(f"http://127.0.0.1:{port}", api_key=admin_key)
        worker = _wait_ready(client)
        hw = worker["target"]
        assert isinstance(hw, dict)
        target = {k: hw[k] for k in ("kind", "mcpu", "arch", "num_cores", "features") if hw.get(k) is not None}
        console.print(f"worker {worker['name']} tunes for {target}")
        job_kind = _kind(kind, target)
        trials = trials or job_kind.default_trials
        job = client.submit(
            WORKLOAD, target, DISTRIBUTION, kind=job_kind.name, budget={"trials": trials, "max_shapes": 4, "seed": 0}
        )
        console.print(f"submitted {job_kind.name} job {job.id} ({job_kind.summary}), budget {trials}")
        t0 = time.monotonic()
        job = client.wait(job.id, progress=True, poll_s=1.0)
        console.print(f"job {job.state} in {time.monotonic() - t0:.0f} s")

        table = Table(title=f"dense 768→2304 (BERT-base QKV), fp32, tuned by a {job_kind.name} job vs the vendor")
        # both timed as an inference host calls them (Python call included), in the worker, side by side
        for col in ("M", "weight", "trials", "tuned, as called (µs)", "vendor, as called (µs)", "vendor / tuned"):
            table.add_column(col, justify="right")
        for s in job.shapes:
            table.add_row(
                str(s.shape["M"]),
                f"{s.weight:.2f}",
                str(s.trials_done),
                f"{s.best_latency_s * 1e6:.1f}" if s.best_latency_s else "-",
                f"{s.baseline_latency_s * 1e6:.1f}" if s.baseline_latency_s else "-",
                f"{s.speedup:.2f}×" if s.speedup else "-",
            )
        console.print(table)
        if job.shapes and job.shapes[0].baseline:
            console.print(f"baseline: {job.shapes[0].baseline}")

        fingerprint = job.target_fingerprint
        assert fingerprint is not None
        if job_kind.publishes == "dispatch":
            _show_dispatcher(console, client, job.workload_hash, fingerprint, data_dir / "sdk-cache")
            return
        # What an inference host does: fetch the stored config for a shape and run it.
        shape = {"M": 61}
        kernel = client.kernel(job.workload_hash, fingerprint, shape)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((61, 768)).astype("float32")
        w = rng.standard_normal((2304, 768)).astype("float32")
        err = float(np.abs(kernel(x, w) - x @ w.T).max())
        console.print(f"SDK kernel for M=61 rebuilt from the stored trace: max |error| vs numpy = {err:.2e}")
    finally:
        console.print("shutting down …")
        supervisor.stop()
        console.print("done.")


if __name__ == "__main__":
    main()
