"""`make demo`: the whole service on the embedded default, one real sketch-search job, a results table.

BERT-base QKV projection, Y = X·Wᵀ with K=768, N=2304 and the sequence length M drawn from a
distribution. The tuned kernel of each hot shape is compared with numpy on the same worker.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kernelfleet import Client
from service.launch import Supervisor
from service.settings import Settings

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


def main(trials: int = 256, port: int = 8765, data_dir: Path | None = None) -> None:
    console = Console()
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="kernelfleet-demo-"))
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
        target = {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}
        console.print(f"worker {worker['name']} tunes for {target}")
        job = client.submit(
            WORKLOAD, target, DISTRIBUTION, kind="sketch", budget={"trials": trials, "max_shapes": 4, "seed": 0}
        )
        console.print(f"submitted sketch job {job.id}: {trials} trials over the hot shapes of M")
        t0 = time.monotonic()
        job = client.wait(job.id, progress=True, poll_s=1.0)
        console.print(f"job {job.state} in {time.monotonic() - t0:.0f} s")

        table = Table(title="dense 768→2304 (BERT-base QKV), fp32, tuned by sketch search vs numpy")
        for col in ("M", "weight", "trials", "tuned (µs)", "numpy (µs)", "numpy / tuned"):
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

        # What an inference host does: fetch the stored config for a shape and run it.
        fingerprint = job.target_fingerprint
        assert fingerprint is not None
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
