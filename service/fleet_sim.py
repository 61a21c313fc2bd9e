"""`kernelfleet fleet simulate`: the fleet loop for N simulated days on the embedded default.

Each simulated day an inference "host" (this process) serves two layers and reports what it ran:
  - a BERT attention-output dense layer (768→768) with a dynamic sequence length, served through the
    SDK dispatcher (numpy until a `ukernel` job has published a table);
  - a small dense layer with bias (256→256) at a few batch sizes, served with the best stored config per
    shape (`sketch` jobs tune those), numpy on a miss.
Every call really runs here and is timed; each call stands for `scale` production calls. The telemetry
for day d goes to the real API; then the daily run for day d+1 ranks, budgets and submits ordinary
jobs to the real worker, and the next day's traffic uses what they published. The table printed at
the end is the fleet's kernel time per day, falling as the budget is spent where the time goes.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from kernelfleet import Client
from kernelfleet.dispatcher import Dispatcher
from service.demo import _wait_ready
from service.launch import Supervisor
from service.settings import Settings

ATTENTION_OUT = {"op": "dense", "dims": {"N": 768, "K": 768}, "symbolic": ["M"]}
SMALL_BIAS = {"op": "dense", "dims": {"N": 256, "K": 256}, "symbolic": ["M"], "attrs": {"bias": True}}
SMALL_SHAPES = {8: 0.4, 16: 0.3, 32: 0.2, 64: 0.1}


class _ExactHost:
    """Serves SMALL_BIAS with the stored best config per shape (built once), numpy on a miss."""

    def __init__(self, client: Client, workload: str, target: str) -> None:
        self.client, self.workload, self.target = client, workload, target
        self.kernels: dict[int, Any] = {}

    def refresh(self) -> None:
        for m in SMALL_SHAPES:
            if m not in self.kernels and self.client.best(self.workload, self.target, {"M": m}) is not None:
                self.kernels[m] = self.client.kernel(self.workload, self.target, {"M": m})

    def __call__(self, x: np.ndarray, w: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, bool]:
        kernel = self.kernels.get(x.shape[0])
        if kernel is None:
            return x @ w.T + b, True
        return kernel(x, w, b), False


def _serve_day(
    rng: np.random.Generator, dispatcher: Dispatcher, host: _ExactHost, calls: int
) -> dict[tuple[str, int], list[float]]:
    """Run a day's sample of calls; returns (layer, M) → [calls, seconds, fallbacks]."""
    w1 = rng.standard_normal((768, 768)).astype("float32")
    w2, b2 = rng.standard_normal((256, 256)).astype("float32"), rng.standard_normal(256).astype("float32")
    lengths = np.minimum(128, np.maximum(1, rng.zipf(1.3, size=calls)))
    stats: dict[tuple[str, int], list[float]] = {}
    for m in lengths:
        x = rng.standard_normal((int(m), 768)).astype("float32")
        dispatcher(x, w1)
    for m in rng.choice(list(SMALL_SHAPES), size=calls, p=list(SMALL_SHAPES.values())):
        x = rng.standard_normal((int(m), 256)).astype("float32")
        t0 = time.perf_counter()
        _, missed = host(x, w2, b2)
        acc = stats.setdefault(("small", int(m)), [0, 0.0, 0])
        acc[0] += 1
        acc[1] += time.perf_counter() - t0
        acc[2] += missed
    for m, use in dispatcher.usage(reset=True).items():
        stats[("attn", m)] = [use.calls, use.seconds, use.fallbacks]
    return stats


def main(days: int = 3, calls: int = 200, scale: int = 10_000, port: int = 8766, data_dir: Path | None = None) -> None:
    console = Console()
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="kernelfleet-fleet-sim-"))
    os.environ["KERNELFLEET_DATA_DIR"] = str(data_dir)
    for var in ("KERNELFLEET_DATABASE_URL", "KERNELFLEET_BROKER_URL"):
        os.environ.pop(var, None)  # always the embedded default
    os.environ.setdefault("KERNELFLEET_FLEET_DAILY_TRIALS", "64")
    os.environ.setdefault("KERNELFLEET_FLEET_UNIT_TRIALS", "16")
    supervisor = Supervisor(Settings(data_dir=data_dir), port=port, workers=1)
    console.print(f"[bold]fleet simulation[/]: {days} days, {calls} timed calls per layer per day × {scale}")
    admin_key = supervisor.start()
    rows: list[tuple[dt.date, float, float, dict[str, Any], str]] = []
    try:
        client = Client(f"http://127.0.0.1:{port}", api_key=admin_key)
        hw = _wait_ready(client)["target"]
        assert isinstance(hw, dict)
        fp = client.register_target({k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}).target_fingerprint
        attn = client.register_workload(ATTENTION_OUT).workload_hash
        small = client.register_workload(SMALL_BIAS).workload_hash
        host = _ExactHost(client, small, fp)
        rng = np.random.default_rng(0)
        first = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=days)
        for i in range(days):
            day = first + dt.timedelta(days=i)
            dispatcher = client.dispatcher(attn, fp, cache_dir=data_dir / "host-cache")
            assert isinstance(dispatcher, Dispatcher), "the simulated fleet serves an llvm target"
            host.refresh()
            stats = _serve_day(rng, dispatcher, host, calls)
            records: list[dict[str, Any]] = [
                {
                    "workload_hash": attn if layer == "attn" else small,
                    "target_fingerprint": fp,
                    "shape": {"M": m},
                    "calls": int(c) * scale,
                    "kernel_seconds": s * scale,
                    "fallbacks": int(f) * scale,
                    "day": day.isoformat(),
                }
                for (layer, m), (c, s, f) in stats.items()
            ]
            client.send_telemetry({"batch_id": str(uuid.uuid4()), "host": "simulated", "records": records})
            fleet_s = float(sum(r["kernel_seconds"] for r in records))
            missed = sum(r["fallbacks"] for r in records) / max(1, sum(r["calls"] for r in records))
            run_day = day + dt.timedelta(days=1)
            client.run_fleet(run_day.isoformat())
            report = _wait_report(client, run_day)
            submitted = [c["job_id"] for c in report["candidates"] if c.get("job_id")]
            for job_id in submitted:
                client.wait(job_id, raise_on_failure=False, poll_s=1.0)
            rows.append((day, fleet_s, missed, report, dispatcher.source))
            console.print(
                f"day {i + 1} ({day}): fleet time {fleet_s:,.0f} s/day, misses {missed:.0%}; "
                f"run for {run_day}: {len(report['candidates'])} candidates, {len(submitted)} jobs"
            )
    finally:
        supervisor.stop()
    table = Table(title="Fleet kernel time per day (this machine, simulated traffic, real kernels)")
    for col in ("day", "fleet time (s/day)", "vs day 1", "misses", "attn layer served by", "jobs next run",
                "expected saving (s/day)"):  # fmt: skip
        table.add_column(col, justify="right")
    base = rows[0][1] if rows else 1.0
    for day, fleet_s, missed, report, source in rows:
        jobs = sum(1 for c in report["candidates"] if c.get("job_id"))
        table.add_row(
            str(day),
            f"{fleet_s:,.0f}",
            f"{fleet_s / base:.2f}×",
            f"{missed:.0%}",
            "uKernel table" if source != "fallback" else "numpy (no table yet)",
            str(jobs),
            f"{report['expected_saving_s_per_day']:,.0f}",
        )
    console.print(table)


def _wait_report(client: Client, day: dt.date, timeout_s: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in client.fleet_reports(limit=5):
            if r["day"] == day.isoformat() and r["state"] != "running":
                return r
        time.sleep(1.0)
    raise TimeoutError(f"no fleet report for {day}")
