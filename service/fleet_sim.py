"""`kernelfleet fleet simulate`: the fleet loop for N simulated days on real models' dense layers.

The simulated fleet serves BERT-base and GPT-2 small, built from `transformers.BertConfig()` and
`GPT2Config()` with random weights (never a hub download) and read with `kernelfleet.model_import.extract_torch`
in a child process (torch's thread pools stay out of the serving process). Their distinct dense workloads (with
bias and activation as the model has them) are registered on the real API; each carries its occurrences per
forward pass. Traffic is a histogram of (batch, seq) per model and day, M = batch*seq:
  day 1  BERT only, sequences skewed short (8..128 tokens);
  day 2  GPT-2 is added (40 % of requests: decode M = 1..8, some prefill up to 128), BERT's sequences shift
         longer (16..256), past the range day 1 tuned;
  day 3+ GPT-2 takes 60 % of requests.
Each day this process serves a sample of requests: for every served workload of the request's model one call
really runs at its M (the SDK dispatcher: the published uKernel table, or numpy with the same bias/activation
when there is none) and is timed; one call stands for (occurrences × scale) production calls. Telemetry for
day d goes to the real API; the daily run for day d+1 ranks, budgets and submits ordinary jobs to the real
worker (the Supervisor), and the next day's traffic uses what they published.

Savings are measured, not modelled: every day the same sample also runs on an untuned host (numpy with the
same epilogue, as a block of its own, the way an untuned host runs back to back), so saving = (untuned −
served) seconds per call × calls × scale. Tuning cost = the workers' wall seconds for the fleet's jobs
(finished − started, from the store) plus the daily runs' own wall time. scale = the fleet's production calls of
the served layers per day (default 10^6) ÷ the day's sampled calls; savings ÷ cost grows with it, so the table
prints the break-even traffic too.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kernelfleet import Client
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from service.demo import _wait_ready
from service.launch import Supervisor
from service.settings import Settings

MODELS = ("bert", "gpt2")
FLEET_CALLS_PER_DAY = 1_000_000  # production calls of the served layers per day the sample stands for
MIN_TIMINGS = 5  # paired timings per (layer, M) and day at least
WEIGHT_COPIES = 3  # weights rotate through copies, so calls do not all find one W hot in cache
BERT_SHORT = {(1, 8): 0.30, (1, 16): 0.25, (1, 32): 0.20, (1, 64): 0.15, (1, 128): 0.10}
BERT_LONG = {(1, 16): 0.15, (1, 32): 0.20, (1, 64): 0.25, (1, 128): 0.25, (1, 256): 0.15}
GPT2_MIX = {(1, 1): 0.36, (2, 1): 0.18, (4, 1): 0.18, (8, 1): 0.18, (1, 32): 0.04, (1, 64): 0.03, (1, 128): 0.03}


def traffic(day: int) -> dict[str, tuple[float, dict[tuple[int, int], float]]]:
    """model → (share of the day's requests, {(batch, seq): weight}) on day `day` (0 = the first)."""
    if day == 0:
        return {"bert": (1.0, BERT_SHORT)}
    if day == 1:
        return {"bert": (0.6, BERT_LONG), "gpt2": (0.4, GPT2_MIX)}
    return {"bert": (0.4, BERT_LONG), "gpt2": (0.6, GPT2_MIX)}


# -- the models' dense layers ------------------------------------------------------------------------------------
def _extract_child(n_layers: int) -> None:
    """In a child process: print each model's dense ops as JSON (workload body, M expression, occurrences)."""
    import torch
    import transformers
    from torch.export import Dim

    from kernelfleet.model_import import extract_torch

    torch.manual_seed(0)
    out = {}
    for model in MODELS:
        module: Any
        if model == "bert":
            module = transformers.BertModel(transformers.BertConfig(num_hidden_layers=n_layers))
        else:
            module = transformers.GPT2Model(transformers.GPT2Config(n_layer=n_layers, use_cache=False))
        module.train(False)
        ids = torch.randint(0, 100, (2, 16))
        seq = Dim("seq", max=512 if model == "bert" else 1024)  # the models' position tables
        graph = extract_torch(module, {"input_ids": ids}, {"input_ids": {0: Dim("batch"), 1: seq}})
        out[model] = {
            "ops": [
                {"workload": op.to_workload(), "M": op.dims["M"], "occurrences": op.occurrences}
                for op in graph.ops
                if op.op == "dense" and op.symbolic == ["M"]
            ],
            "other": [op.describe() for op in graph.ops if op.op != "dense"],
        }
    print(json.dumps(out))


def extract_dense(n_layers: int = 12) -> dict[str, dict[str, Any]]:
    """BERT-base's and GPT-2 small's dense ops (with `n_layers` layers each: 12 is the real models)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = f"from service.fleet_sim import _extract_child; _extract_child({int(n_layers)})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"extracting the models failed:\n{done.stderr[-3000:]}")
    result: dict[str, dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _m_of(expr: str, batch: int, seq: int) -> int:
    from kernelfleet.model_import import Mono

    return int(Mono.parse(expr).evaluate({"batch": batch, "seq": seq}))


@dataclass
class Layer:
    """One served workload: its body, hash, weights, and which model ops (M expression, occurrences) use it."""

    key: str
    body: dict[str, Any]
    uses: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # model → [(M expression, occurrences)]
    workload_hash: str = ""
    weights: list[tuple[np.ndarray, np.ndarray | None]] = field(default_factory=list)

    @property
    def epilogue(self) -> Epilogue:
        return Epilogue.of_attrs(self.body.get("attrs", {}))

    def describe(self) -> str:
        d, ep = self.body["dims"], self.epilogue
        return f"dense N={d['N']} K={d['K']}" + (f" ({ep.describe()})" if not ep.trivial else "")


def collect_layers(extracted: dict[str, dict[str, Any]]) -> list[Layer]:
    layers: dict[str, Layer] = {}
    for model, found in extracted.items():
        for op in found["ops"]:
            key = json.dumps(op["workload"], sort_keys=True)
            layer = layers.setdefault(key, Layer(key, op["workload"]))
            layer.uses.setdefault(model, []).append((op["M"], int(op["occurrences"])))
    return list(layers.values())


def time_shares(layers: list[Layer], days: int) -> list[float]:
    """Each layer's share of the run's dense FLOPs (occurrences, traffic and model mix included): what ranks them."""
    flops = []
    for layer in layers:
        n, k, total = layer.body["dims"]["N"], layer.body["dims"]["K"], 0.0
        for day in range(days):
            for model, (share, hist) in traffic(day).items():
                for expr, occ in layer.uses.get(model, []):
                    total += share * sum(w * 2 * _m_of(expr, b, s) * n * k * occ for (b, s), w in hist.items())
        flops.append(total)
    whole = sum(flops) or 1.0
    return [f / whole for f in flops]


# -- serving ------------------------------------------------------------------------------------------------------
@dataclass
class DayStats:
    """Per (layer, M): calls run, served seconds, untuned seconds, fallbacks; per model: the same sums."""

    shapes: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    models: dict[str, list[float]] = field(default_factory=dict)  # model → [requests, served s, untuned s]


def _sample_requests(rng: np.random.Generator, day: int, n: int) -> list[tuple[str, int, int]]:
    mix = traffic(day)
    names = list(mix)
    picks = rng.choice(len(names), size=n, p=[mix[m][0] for m in names])
    out = []
    for i in picks:
        hist = mix[names[i]][1]
        points = list(hist)
        b, s = points[rng.choice(len(points), p=list(hist.values()))]
        out.append((names[i], int(b), int(s)))
    return out


def serve_day(
    layers: list[Layer], dispatchers: dict[str, Dispatcher], requests: list[tuple[str, int, int]]
) -> DayStats:
    """Run the sample as served (the dispatchers) and as an untuned host (numpy with the same epilogue), paired.

    Every sampled call runs on both paths back to back, which path first alternating, on like operands; a
    (layer, M) timed fewer than MIN_TIMINGS times is run again until it has that many. A shape's seconds per
    call on each path is the median of its timings (the machine is shared: a mean would count the neighbours'
    bursts), times its calls (occurrences per forward pass included)."""
    stats = DayStats()
    untuned = {layer.key: Dispatcher(None, {}, N=None, K=None, epilogue=layer.epilogue) for layer in layers}
    by_key = {layer.key: layer for layer in layers}
    inputs: dict[tuple[int, int], list[np.ndarray]] = {}  # one X per path, so neither finds the other's hot
    calls: list[tuple[str, str, int, int]] = []  # (model, layer key, M, occurrences)
    for model, b, s in requests:
        for layer in layers:
            for expr, occ in layer.uses.get(model, []):
                m, k = _m_of(expr, b, s), layer.body["dims"]["K"]
                if (m, k) not in inputs:
                    gen = np.random.default_rng(m * 7919 + k)
                    inputs[(m, k)] = [gen.standard_normal((m, k), dtype=np.float32) for _ in range(2)]
                calls.append((model, layer.key, m, occ))
    for layer in layers:  # pack weights and touch the program once, off the clock
        for w, bias in layer.weights:
            dispatchers[layer.key].prepare(w)
            dispatchers[layer.key](np.ones((1, w.shape[1]), np.float32), w, bias=bias)
    timings: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
    turn = [0]

    def run(key: str, m: int) -> None:
        # which path runs first alternates per (layer, M); each path takes its own X and the next weight copy,
        # so the second never finds the first's operands hot in cache (the uKernels read packed copies anyway)
        served, base = timings.setdefault((key, m), ([], []))
        order = (0, 1) if len(served) % 2 == 0 else (1, 0)
        for path in order:
            turn[0] += 1
            w, bias = by_key[key].weights[turn[0] % WEIGHT_COPIES]
            x = inputs[(m, w.shape[1])][path]
            d, into = (dispatchers[key], served) if path == 0 else (untuned[key], base)
            t0 = time.perf_counter()
            d(x, w, bias=bias)
            into.append(time.perf_counter() - t0)

    for _, key, m, _ in calls:
        run(key, m)
    for (key, m), (served, _) in list(timings.items()):
        for _ in range(len(served), MIN_TIMINGS):
            run(key, m)
    per_call = {shape: (float(np.median(a)), float(np.median(b))) for shape, (a, b) in timings.items()}
    for model, key, m, occ in calls:
        served_s, untuned_s = per_call[(key, m)]
        acc = stats.shapes.setdefault((key, m), [0, 0.0, 0.0, 0])
        acc[0] += occ
        acc[1] += served_s * occ
        acc[2] += untuned_s * occ
        acc[3] += occ if dispatchers[key].table is None else 0
        per_model = stats.models.setdefault(model, [0, 0.0, 0.0])
        per_model[1] += served_s * occ
        per_model[2] += untuned_s * occ
    for model, _, _ in requests:
        stats.models.setdefault(model, [0, 0.0, 0.0])[0] += 1
    for d in dispatchers.values():
        d.usage(reset=True)  # telemetry is built from the medians above, one record per (layer, M)
    return stats


# -- the loop -----------------------------------------------------------------------------------------------------
@dataclass
class DayRow:
    day: dt.date
    models: dict[str, list[float]]
    served_s: float  # fleet kernel seconds per day (scaled)
    untuned_s: float  # the same traffic on an untuned host (scaled)
    fallbacks: float
    tables: int
    scale: float  # production calls per sampled call that day  # served layers with a published table
    cost_s: float = 0.0  # tuning wall seconds spent by the run after this day (jobs + the run itself)
    jobs: list[str] = field(default_factory=list)
    run_estimate: dict[str, Any] = field(default_factory=dict)  # the daily run's own `realized` (modelled)


@dataclass
class SimResult:
    rows: list[DayRow]
    layers: list[tuple[str, float, bool]]  # (description, time share, served)
    requests: int
    fleet_calls: int

    def cumulative(self) -> list[tuple[float, float]]:
        """(savings, cost) summed up to each day: the cost of the runs whose jobs that day could use."""
        out, saved, cost = [], 0.0, 0.0
        for i, row in enumerate(self.rows):
            saved += row.untuned_s - row.served_s
            cost += self.rows[i - 1].cost_s if i > 0 else 0.0
            out.append((saved, cost))
        return out


def _job_seconds(client: Client, job_id: str) -> float:
    job = client.job(job_id)
    if job.started_at is None or job.finished_at is None:
        return 0.0
    return float((job.finished_at - job.started_at).total_seconds())


def main(
    days: int = 3,
    requests: int = 200,
    fleet_calls: int = FLEET_CALLS_PER_DAY,
    layers: int = 5,
    quick: bool = False,
    n_layers: int = 12,
    port: int = 8766,
    data_dir: Path | None = None,
    console: Console | None = None,
) -> SimResult:
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    if quick:
        requests, layers = min(requests, 40), min(layers, 2)
        os.environ.setdefault("KERNELFLEET_FLEET_DAILY_TRIALS", "16")  # one unit: one ukernel job per day
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="kernelfleet-fleet-sim-"))
    os.environ["KERNELFLEET_DATA_DIR"] = str(data_dir)
    for var in ("KERNELFLEET_DATABASE_URL", "KERNELFLEET_BROKER_URL"):
        os.environ.pop(var, None)  # always the embedded default
    os.environ.setdefault("KERNELFLEET_FLEET_DAILY_TRIALS", "64")
    os.environ.setdefault("KERNELFLEET_FLEET_UNIT_TRIALS", "16")

    t0 = time.monotonic()
    extracted = extract_dense(n_layers)
    all_layers = collect_layers(extracted)
    shares = time_shares(all_layers, days)
    order = sorted(range(len(all_layers)), key=lambda i: -shares[i])
    served = [all_layers[i] for i in order[:layers]]
    console.print(
        f"[bold]fleet simulation[/]: {days} days; BERT-base and GPT-2 small ({n_layers} layers, random weights) "
        f"read in {time.monotonic() - t0:.0f} s; {requests} sampled requests per day standing for "
        f"{fleet_calls:,} calls/day of the served layers"
    )
    for i in order:
        layer = all_layers[i]
        used = ", ".join(f"{m} {occ}× M={e}" for m, uses in layer.uses.items() for e, occ in uses)
        mark = "served" if layer in served else "not served (sample)"
        console.print(escape(f"  {layer.describe():<34} {shares[i]:6.1%} of dense FLOPs  [{used}]  {mark}"))
    rng = np.random.default_rng(0)
    for layer in served:
        n, k = layer.body["dims"]["N"], layer.body["dims"]["K"]
        layer.weights = [
            (
                rng.standard_normal((n, k), dtype=np.float32) * np.float32(k**-0.5),
                rng.standard_normal(n, dtype=np.float32) if layer.epilogue.bias else None,
            )
            for _ in range(WEIGHT_COPIES)
        ]

    supervisor = Supervisor(Settings(data_dir=data_dir), port=port, workers=1)
    admin_key = supervisor.start()
    rows: list[DayRow] = []
    try:
        client = Client(f"http://127.0.0.1:{port}", api_key=admin_key)
        hw = _wait_ready(client)["target"]
        assert isinstance(hw, dict)
        fp = client.register_target({k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}).target_fingerprint
        for layer in served:
            layer.workload_hash = client.register_workload(layer.body).workload_hash
        first = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=days)
        for i in range(days):
            day = first + dt.timedelta(days=i)
            dispatchers = {}
            for layer in served:
                d = client.dispatcher(
                    layer.workload_hash, fp, cache_dir=data_dir / "host-cache", epilogue=layer.epilogue
                )
                assert isinstance(d, Dispatcher), "the simulated fleet serves an llvm target"
                dispatchers[layer.key] = d
            sample = _sample_requests(rng, i, requests)
            stats = serve_day(served, dispatchers, sample)
            calls = sum(v[0] for v in stats.shapes.values())
            scale = fleet_calls / max(1, calls)
            hashes = {layer.key: layer.workload_hash for layer in served}
            records: list[dict[str, Any]] = [
                {
                    "workload_hash": hashes[key],
                    "target_fingerprint": fp,
                    "shape": {"M": m},
                    "calls": round(c * scale),
                    "kernel_seconds": s * scale,
                    "fallbacks": round(f * scale),
                    "day": day.isoformat(),
                }
                for (key, m), (c, s, _, f) in stats.shapes.items()
            ]
            client.send_telemetry({"batch_id": str(uuid.uuid4()), "host": "simulated", "records": records})
            row = DayRow(
                day=day,
                models={m: [v[0] * scale, v[1] * scale, v[2] * scale] for m, v in stats.models.items()},
                served_s=sum(v[1] for v in stats.shapes.values()) * scale,
                untuned_s=sum(v[2] for v in stats.shapes.values()) * scale,
                fallbacks=sum(v[3] for v in stats.shapes.values()) / max(1, calls),
                tables=sum(1 for d in dispatchers.values() if d.table is not None),
                scale=scale,
            )
            rows.append(row)
            console.print(
                f"day {i + 1} ({day}): models {', '.join(sorted(row.models))}; fleet time {row.served_s:,.0f} s/day "
                f"served vs {row.untuned_s:,.0f} untuned; {row.tables}/{len(served)} layers on uKernel tables"
            )
            if i == days - 1:
                break  # the run after the last day would only tune for a day that is not simulated
            run_day = day + dt.timedelta(days=1)
            client.run_fleet(run_day.isoformat())
            report = _wait_report(client, run_day)
            row.jobs = [c["job_id"] for c in report["candidates"] if c.get("job_id")]
            for job_id in row.jobs:
                client.wait(job_id, raise_on_failure=False, poll_s=1.0)
            run_s = 0.0
            if report.get("finished_at"):
                run_s = (dt.datetime.fromisoformat(report["finished_at"]) - dt.datetime.fromisoformat(
                    report["created_at"])).total_seconds()  # fmt: skip
            row.cost_s = run_s + sum(_job_seconds(client, j) for j in row.jobs)
            row.run_estimate = report.get("realized") or {}
            states = [client.job(j).state for j in row.jobs]
            console.print(
                f"  run for {run_day}: {len(report['candidates'])} candidates, {len(row.jobs)} jobs "
                f"({', '.join(states) or 'none'}), tuning {row.cost_s:,.0f} s (jobs + the run)"
            )
    finally:
        supervisor.stop()
    result = SimResult(
        rows=rows,
        layers=[(all_layers[i].describe(), shares[i], all_layers[i] in served) for i in order],
        requests=requests,
        fleet_calls=fleet_calls,
    )
    print_result(result, console)
    return result


def print_result(result: SimResult, console: Console) -> None:
    table = Table(title="Fleet kernel time per day (measured on this machine, scaled; real models' dense layers)")
    for col in ("day", "models (req/day)", "fleet time s/day", "untuned s/day", "vs untuned same day",
                "vs day-1 untuned",
                "fallbacks", "saved s/day", "cum. saved", "cum. tuning s", "saved ÷ cost"):  # fmt: skip
        table.add_column(col, justify="right")
    day1 = result.rows[0].untuned_s if result.rows else 1.0
    for row, (saved, cost) in zip(result.rows, result.cumulative(), strict=True):
        table.add_row(
            str(row.day),
            " ".join(f"{m} {v[0]:,.0f}" for m, v in sorted(row.models.items())),
            f"{row.served_s:,.0f}",
            f"{row.untuned_s:,.0f}",
            f"{row.served_s / row.untuned_s:.2f}×" if row.untuned_s else "-",
            f"{row.served_s / day1:.2f}×",
            f"{row.fallbacks:.0%}",
            f"{row.untuned_s - row.served_s:,.0f}",
            f"{saved:,.0f}",
            f"{cost:,.0f}",
            f"{saved / cost:,.1f}×" if cost else "-",
        )
    console.print(table)
    saved, cost = result.cumulative()[-1] if result.rows else (0.0, 0.0)
    console.print(
        f"scale: each day's sampled calls stand for {result.fleet_calls:,} production calls of the served layers "
        f"(e.g. day 1: each call × {result.rows[0].scale:,.0f}); savings scale with it, the tuning cost does not."
    )
    if saved > 0 and cost > 0:
        per_call = saved / result.fleet_calls  # seconds saved per daily production call, over the run
        console.print(
            f"cumulative savings ÷ tuning cost by day {len(result.rows)}: {saved / cost:,.1f}× at "
            f"{result.fleet_calls:,} calls/day; break-even at {cost / per_call:,.0f} calls/day, "
            f"10× at {10 * cost / per_call:,.0f} calls/day"
        )
    else:
        console.print(f"cumulative savings {saved:,.0f} s, tuning cost {cost:,.0f} s: no break-even to report")
    for row in result.rows:
        if row.run_estimate.get("jobs"):
            console.print(
                f"  (the daily run's own modelled estimate on {row.day}: "
                f"{row.run_estimate.get('saved_s_per_day', 0):,.0f} s/day saved by "
                f"{row.run_estimate['jobs']} earlier jobs; the table above is measured)"
            )


def _wait_report(client: Client, day: dt.date, timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in client.fleet_reports(limit=5):
            if r["day"] == day.isoformat() and r["state"] != "running":
                found: dict[str, Any] = r
                return found
        time.sleep(1.0)
    raise TimeoutError(f"no fleet report for {day}")
