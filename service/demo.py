"""`make demo`: the whole service on the embedded default, one real tuning job, a results table.

BERT-base QKV projection, Y = X·Wᵀ with K=768, N=2304 and the sequence length M drawn from a
distribution. The job kind comes from the registry: by default the one the fleet loop would pick for
this workload on this host (a kind that covers every M in one job, whose dispatch table the SDK then
runs for shapes seen and unseen with no network per call); `--kind` names another. Then one table, timed
here as an inference host calls them: per shape, what the SDK runs (uKernels, or the library a vendor route
calls) against the faster of numpy and PyTorch, interleaved (service.demo_compare).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from kernelfleet import Client
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import NO_EPILOGUE
from kernelfleet.errors import NotFound
from service.demo_compare import WIDTH, Route, Row, compare, dispatcher_route, machine, notes, results_table
from service.launch import Supervisor, check_port_free
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


SHOWN_M = (1, 16, 61, 97, 128, 200)  # the distribution's shapes, one between them and one past the tuned range


def _weights() -> dict[int, float]:
    points = DISTRIBUTION["points"]
    assert isinstance(points, list)
    return {p["shape"]["M"]: p["weight"] for p in points}


def _weight(rng: np.random.Generator) -> np.ndarray:
    dims = WORKLOAD["dims"]
    assert isinstance(dims, dict)
    return rng.standard_normal((dims["N"], dims["K"])).astype("float32")


def _rows(rng: np.random.Generator, m: int, w: np.ndarray) -> np.ndarray:
    return rng.standard_normal((m, w.shape[1])).astype("float32")


def _print_rows(console: Console, rows: list[Row], title: str) -> None:
    if not console.is_terminal:  # a file or a pipe: rich would squeeze the table into 80 columns
        console.width = max(console.width, WIDTH)
    console.print(f"machine: {machine()}")
    console.print(results_table(rows, title))
    for line in notes(rows):
        console.print(f"  {line}")


def _show_dispatcher(
    console: Console, client: Client, workload_hash: str, fingerprint: str, cache: Path
) -> Callable[[], None]:
    """What an inference host does: fetch the dispatch table once, then run any M locally. Returns the timing step,
    which needs no service (the dispatcher runs with no network)."""
    t0 = time.perf_counter()
    dispatcher = client.dispatcher(workload_hash, fingerprint, cache_dir=cache)
    assert isinstance(dispatcher, Dispatcher), "the demo tunes an llvm target: its table is a CPU one"
    console.print(f"SDK dispatcher loaded from the {dispatcher.source} in {time.perf_counter() - t0:.2f} s")
    rng = np.random.default_rng(0)
    w = _weight(rng)
    dispatcher.prepare(w)
    worst = 0.0
    for m in [*range(1, 129), 131, 200, 257]:  # every tuned M, then shapes past the tuned range
        x = _rows(rng, m, w)
        worst = max(worst, float(np.abs(dispatcher(x, w) - x @ w.T).max()))
    console.print(f"every M in 1..128 plus 131, 200, 257 checked against numpy: max |error| = {worst:.2e}")

    def timing() -> None:
        rows = []
        for m in SHOWN_M:
            x = _rows(rng, m, w)
            result = compare(dispatcher, x, w, dispatcher.epilogue)
            rows.append(Row(m, _weights().get(m), dispatcher_route(dispatcher, m), result))
        _print_rows(console, rows, "SDK dispatcher vs the faster of numpy and PyTorch, side by side on this machine")

    return timing


def _show_configs(console: Console, client: Client, job: Any, fingerprint: str) -> Callable[[], None]:
    """What an inference host does with a per-shape job: fetch the stored config for a shape and run it. Returns
    the timing step, which needs no service."""
    rng = np.random.default_rng(0)
    w = _weight(rng)
    fetched = []
    for s in job.shapes:
        m = int(s.shape["M"])
        try:
            kernel = client.kernel(job.workload_hash, fingerprint, s.shape)
        except NotFound:
            console.print(f"M={m}: the job stored no config (its state: {s.state})")
            continue
        x = _rows(rng, m, w)
        err = float(np.abs(kernel(x, w) - x @ w.T).max())
        console.print(f"SDK kernel for M={m} rebuilt from the stored trace: max |error| vs numpy = {err:.2e}")
        fetched.append((m, kernel, x))

    def timing() -> None:
        route = Route("sketch config (TVM, this shape)", None)
        rows = [Row(m, _weights().get(m), route, compare(kernel, x, w, NO_EPILOGUE)) for m, kernel, x in fetched]
        _print_rows(console, rows, "SDK kernels vs the faster of numpy and PyTorch, side by side on this machine")

    return timing


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
    """Raises service.launch.StartRefused, before anything is created, when `port` is taken: the demo's client
    would otherwise send the fresh admin key to whatever listens there."""
    check_port_free("127.0.0.1", port)
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

        # the worker's own per-shape timings stay with the job: the one table below is timed here, side by side
        console.print(f"the worker's own per-shape timings: `kernelfleet job {job.id}`")
        fingerprint = job.target_fingerprint
        assert fingerprint is not None
        if job_kind.publishes == "dispatch":
            timing = _show_dispatcher(console, client, job.workload_hash, fingerprint, data_dir / "sdk-cache")
        else:
            timing = _show_configs(console, client, job, fingerprint)
    finally:
        console.print("shutting down the service …")
        supervisor.stop()
    # timed with the service stopped: its API, worker and broker processes would otherwise share the cores with the
    # calls being compared (a host running the SDK does not run the service)
    timing()
    console.print("done.")


if __name__ == "__main__":
    main()
