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
Each day this process serves a sample of requests as a PyTorch host does: every served layer is an `nn.Linear`
(+ its GELU) put on the fleet's tables by `kernelfleet.torch.accelerate` with its defaults (thread policy, PyTorch
for every shape a table routes to a vendor library, each uKernel shape checked against PyTorch inside the model),
and for every served workload of the request's model one call runs at its M. Where a table serves, accelerate holds
calls out for the baseline (kernelfleet.holdout): one in `--holdout` per shape runs the layer's own PyTorch
computation, what hosts of these models run without KernelFleet; without a table both sides are PyTorch. Served
and held-out calls interleave in time, in this one process, with default thread settings. The day's telemetry (the
SDK's own records: volume scaled to `--fleet-calls`, holdout sums as sampled) goes to the real API; the saving is
the service's measurement (GET /v1/fleet/savings: served volume × the difference of the sides' means, with a 95 %
interval), not this script's. The daily run for day d+1 then rolls back tables its telemetry shows slower, ranks,
budgets and submits ordinary jobs to the real worker (the Supervisor), and the next day's traffic uses what they
published.

Tuning cost = the worker's wall seconds for the fleet's jobs (finished − started, from the store) plus the daily
runs' own wall time. Day 1 has no tables, so both sides run PyTorch: its saving is the noise floor. Each day's
saving is also split by what served each shape (uKernels, PyTorch, no table), from the same samples. `--runs N`
repeats the whole simulation on fresh stores with other traffic seeds and prints the spread.
"""

from __future__ import annotations

import datetime as dt
import json
import math
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
from kernelfleet.telemetry import usage_records
from service.demo import _wait_ready
from service.launch import Supervisor
from service.models import shape_key
from service.settings import Settings
from service.store.fleet import HOLDOUT_SUMS, HoldoutSums, Usage
from service.workers.fleet.savings import measure

MODELS = ("bert", "gpt2")
FLEET_CALLS_PER_DAY = 1_000_000  # production calls of the served layers per day the sample stands for
MIN_SIDE = 4  # holdout samples per (layer, M), day and side at least
MAX_EXTRA_CALLS = 400  # calls a (layer, M) gets to reach MIN_SIDE (the in-model check takes some first)
HOLDOUT_EVERY = 2  # the sample is small: one call in 2 is held out (production hosts: 1 in 100)
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
_ACTIVATIONS = {"gelu": {}, "gelu_tanh": {"approximate": "tanh"}}  # the models' activations as nn.GELU arguments


class LayerHost:
    """A host's copy of one served layer, as a PyTorch user runs it: `nn.Linear` (+ its activation) in
    `WEIGHT_COPIES` copies, put on the fleet's tables by `kernelfleet.torch.accelerate` with its defaults (thread
    policy, PyTorch for every vendor route, the in-model check) and its A/B holdout (one call in `holdout` per S
    the table serves runs the layer's own PyTorch computation). Telemetry is read from the layer's dispatcher
    (day_records), not sent by accelerate's reporter, so the sample can be scaled to the fleet's volume."""

    def __init__(self, layer: Layer, client: Client, target: str, holdout: int, cache_dir: Path) -> None:
        import torch
        from torch import nn

        from kernelfleet.torch import accelerate

        n, k = layer.body["dims"]["N"], layer.body["dims"]["K"]
        activation = layer.epilogue.activation
        copies = nn.ModuleList()
        for w, b in layer.weights:
            linear = nn.Linear(k, n, bias=b is not None)
            with torch.no_grad():
                linear.weight.copy_(torch.from_numpy(w))
                if b is not None:
                    linear.bias.copy_(torch.from_numpy(b))
            parts: list[nn.Module] = [linear]
            if activation != "none":
                parts.append(nn.GELU(**_ACTIVATIONS[activation]))
            copies.append(nn.Sequential(*parts))

        class Copies(nn.Module):  # one model holding the copies: one dispatcher for the layer's workload
            def __init__(self) -> None:
                super().__init__()
                self.copies = copies

            def forward(self, x: torch.Tensor, i: int) -> torch.Tensor:
                return self.copies[i](x)  # type: ignore[no-any-return]

        self.fast = accelerate(
            Copies().eval(),
            client,
            workloads={f"copies.{i}.0": layer.workload_hash for i in range(len(copies))},
            target=target,
            cache_dir=cache_dir,
            telemetry=True,
            telemetry_interval_s=1e9,  # never sends by itself: day_records reads the dispatcher
            print_summary=False,
            holdout=holdout,
        )
        self.torch = torch
        self.layers = list(self.fast.layers.values())
        found = {id(a.dispatcher): a.dispatcher for a in self.layers if isinstance(a.dispatcher, Dispatcher)}
        assert len(found) <= 1, "the copies share one workload, so one dispatcher"
        self.dispatcher: Dispatcher | None = next(iter(found.values()), None)

    def __call__(self, x: np.ndarray, turn: int) -> None:
        with self.torch.inference_mode():
            self.fast(self.torch.from_numpy(x), turn % len(self.layers))

    def route(self, m: int) -> str:
        """What serves M: "no table", "torch" (the layer's PyTorch computation), "uKernels", or the library the
        table names (only where accelerate runs vendor routes on the table's library)."""
        d = self.dispatcher
        if d is None or d.table is None:
            return "no table"
        if self.layers[0].route(m) == "pytorch" or self.fast.forward_choice(self._probe(m), 0) == "eager":
            return "torch"  # the layer's route, or accelerate's whole-forward check, runs PyTorch at M
        return "uKernels" if d.vendor_route(m) is None else d.library(m)

    def _probe(self, m: int) -> Any:
        """An input of M rows, for asking what accelerate decided for forwards called with that shape."""
        return self.torch.empty(m, self.layers[0].K)

    def close(self) -> None:
        assert self.fast.reporter is not None
        self.fast.reporter.close(flush=False)  # its usage went out through day_records
        self.fast.close()


@dataclass
class DayStats:
    """What the sample ran: per (layer, M) the production calls it stands for (occurrences per forward pass
    included); per model the requests."""

    volume: dict[tuple[str, int], int] = field(default_factory=dict)
    requests: dict[str, int] = field(default_factory=dict)


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


def serve_day(layers: list[Layer], hosts: dict[str, LayerHost], requests: list[tuple[str, int, int]]) -> DayStats:
    """Serve the sample as a host does: one call per served layer use per request, on the layer's accelerated
    PyTorch copies, which hold calls out for the layer's PyTorch computation where a table serves; a (layer, M)
    with a table and fewer than MIN_SIDE samples on either side is called again until it has them. Weights rotate
    through copies, so calls do not all find one W hot in cache."""
    stats = DayStats()
    inputs: dict[tuple[int, int], np.ndarray] = {}
    calls: list[tuple[str, int]] = []  # (layer key, M), in the order the requests make them
    for model, b, s in requests:
        stats.requests[model] = stats.requests.get(model, 0) + 1
        for layer in layers:
            for expr, occ in layer.uses.get(model, []):
                m, k = _m_of(expr, b, s), layer.body["dims"]["K"]
                if (m, k) not in inputs:
                    inputs[(m, k)] = np.random.default_rng(m * 7919 + k).standard_normal((m, k), dtype=np.float32)
                calls.append((layer.key, m))
                stats.volume[(layer.key, m)] = stats.volume.get((layer.key, m), 0) + occ
    by_key = {layer.key: layer for layer in layers}
    turn = 0

    def run(key: str, m: int) -> None:
        nonlocal turn
        turn += 1
        hosts[key](inputs[(m, by_key[key].body["dims"]["K"])], turn)

    for key, m in calls:
        run(key, m)
    for key, m in dict.fromkeys(calls):
        d = hosts[key].dispatcher
        holdout = d.holdout if d is not None else None
        if holdout is None:
            continue  # accelerate holds nothing out (no telemetry for this layer)
        for _ in range(MAX_EXTRA_CALLS):
            if d is not None and d.table is not None and hosts[key].layers[0].route(m) is None:
                break  # M is outside the table (PyTorch runs it as a fallback): nothing to hold out
            sample = holdout.samples().get(m)
            if sample is not None and min(sample.served_calls, sample.baseline_calls) >= MIN_SIDE:
                break
            run(key, m)
    return stats


def saving_by_route(
    layers: list[Layer], hosts: dict[str, LayerHost], records: list[dict[str, Any]], day: dt.date
) -> dict[str, float]:
    """The day's saving (s/day) split by what served each (layer, M): the service's own measurement
    (service.workers.fleet.savings.measure) of the day's telemetry records, run once per route on the records of
    the shapes that route served. The service does not know routes; this says where its saving came from."""
    host_of = {layer.workload_hash: hosts[layer.key] for layer in layers}
    groups: dict[str, tuple[list[Usage], list[HoldoutSums]]] = {}
    for r in records:
        held = r.get("holdout")
        if held is None:
            continue
        wh, fp, key = r["workload_hash"], r["target_fingerprint"], shape_key(r["shape"])
        usage, sums = groups.setdefault(host_of[wh].route(r["shape"]["M"]), ([], []))
        usage.append(Usage(wh, fp, key, r["calls"], r["kernel_seconds"], r["fallbacks"]))
        sums.append(HoldoutSums(wh, fp, "", key, held["baseline"], **{n: held[n] for n in HOLDOUT_SUMS}))
    return {route: measure(u, h, day, day, 1).saved_s_per_day for route, (u, h) in sorted(groups.items())}


def day_records(
    layers: list[Layer], hosts: dict[str, LayerHost], stats: DayStats, scale: float, day: dt.date
) -> list[dict[str, Any]]:
    """The day's telemetry as the SDK builds it (kernelfleet.telemetry.usage_records), each record's calls and
    kernel seconds scaled to the production volume its sampled calls stand for; the holdout sums stay the
    sample's (they are timings, not volume)."""
    records = []
    for layer in layers:
        d = hosts[layer.key].dispatcher
        if d is None:
            continue  # accelerate found no dense dispatcher to report on (it logged why)
        for record in usage_records(d, day):
            ran = record["calls"]
            volume = max(ran, round(stats.volume.get((layer.key, record["shape"]["M"]), 0) * scale))
            record["kernel_seconds"] *= volume / ran
            record["fallbacks"] = round(record["fallbacks"] * volume / ran)
            record["calls"] = volume
            records.append(record)
    return records


# -- the loop -----------------------------------------------------------------------------------------------------
@dataclass
class DayRow:
    day: dt.date
    requests: dict[str, float]  # model → requests per day (scaled)
    measured: dict[str, Any]  # the service's MeasuredSaving for the day (GET /v1/fleet/savings)
    tables: int  # served layers with a published table
    scale: float  # production calls per sampled call that day
    cost_s: float = 0.0  # worker seconds the run after this day spent (its jobs + the run itself)
    jobs: list[str] = field(default_factory=list)
    rollbacks: list[dict[str, Any]] = field(default_factory=list)  # tables the run after this day rolled back
    modelled: dict[str, Any] = field(default_factory=dict)  # the run's modelled estimate, shown as such
    by_route: dict[str, float] = field(default_factory=dict)  # the day's saving by what served (saving_by_route)

    @property
    def served_s(self) -> float:
        return float(sum(t["served_s_per_day"] for t in self.measured["tasks"]))

    @property
    def baseline_s(self) -> float:
        return float(sum(t["baseline_s_per_day"] for t in self.measured["tasks"]))

    @property
    def saved_s(self) -> float:
        return float(self.measured["saved_s_per_day"])

    @property
    def ci95_s(self) -> float:
        return float(self.measured["ci95_s_per_day"])


@dataclass
class SimResult:
    rows: list[DayRow]
    layers: list[tuple[str, float, bool]]  # (description, time share, served)
    requests: int
    fleet_calls: int
    holdout: int
    machine: str = ""

    def cumulative(self) -> list[tuple[float, float, float]]:
        """(savings, their 95 % half-width, cost) summed up to each day: the cost of the runs whose jobs that day
        could use; days are independent samples, so variances add."""
        out, saved, var, cost = [], 0.0, 0.0, 0.0
        for i, row in enumerate(self.rows):
            saved += row.saved_s
            var += row.ci95_s**2
            cost += self.rows[i - 1].cost_s if i > 0 else 0.0
            out.append((saved, math.sqrt(var), cost))
        return out


def _job_seconds(client: Client, job_id: str) -> float:
    job = client.job(job_id)
    if job.started_at is None or job.finished_at is None:
        return 0.0
    return float((job.finished_at - job.started_at).total_seconds())


def _run_seconds(report: dict[str, Any]) -> float:
    if not report.get("finished_at"):
        return 0.0
    finished, created = (dt.datetime.fromisoformat(report[k]) for k in ("finished_at", "created_at"))
    return (finished - created).total_seconds()


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
    runs: int = 1,
    holdout: int = HOLDOUT_EVERY,
) -> list[SimResult]:
    """`runs` independent runs (each a fresh service and store, its own traffic seed), each printed, then their
    spread."""
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    if quick:
        requests, layers = min(requests, 40), min(layers, 2)
        os.environ.setdefault("KERNELFLEET_FLEET_DAILY_TRIALS", "16")  # one unit: one ukernel job per day
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
        f"[bold]fleet simulation[/]: {days} days, {runs} run(s) on {machine_name()}; BERT-base and GPT-2 small "
        f"({n_layers} layers, random weights) read in {time.monotonic() - t0:.0f} s; {requests} sampled requests "
        f"per day standing for {fleet_calls:,} calls/day of the served layers; hosts hold 1 call in {holdout} out "
        "for their baseline (PyTorch, what these models run without KernelFleet)"
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
    results = []
    for run in range(runs):
        run_dir = Path(tempfile.mkdtemp(prefix="kernelfleet-fleet-sim-")) if data_dir is None or runs > 1 else data_dir
        rows = _simulate(served, days, requests, fleet_calls, holdout, port, run_dir, run, console)
        result = SimResult(
            rows=rows,
            layers=[(all_layers[i].describe(), shares[i], all_layers[i] in served) for i in order],
            requests=requests,
            fleet_calls=fleet_calls,
            holdout=holdout,
            machine=machine_name(),
        )
        print_result(result, console, title=f"run {run + 1} of {runs}")
        results.append(result)
    if runs > 1:
        print_spread(results, console)
    return results


def _simulate(
    served: list[Layer],
    days: int,
    requests: int,
    fleet_calls: int,
    holdout: int,
    port: int,
    data_dir: Path,
    seed: int,
    console: Console,
) -> list[DayRow]:
    """One run: a fresh service on `data_dir`, `days` days of traffic (seeded by `seed`), the daily run after each
    day, and after the last day too (its rollbacks are the last day's; its jobs serve no simulated day)."""
    os.environ["KERNELFLEET_DATA_DIR"] = str(data_dir)
    rng = np.random.default_rng(1000 + seed)
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
            hosts = {layer.key: LayerHost(layer, client, fp, holdout, data_dir / "host-cache") for layer in served}
            try:
                stats = serve_day(served, hosts, _sample_requests(rng, i, requests))
                scale = fleet_calls / max(1, sum(stats.volume.values()))
                records = day_records(served, hosts, stats, scale, day)
                by_route = saving_by_route(served, hosts, records, day)
                tables = sum(1 for h in hosts.values() if h.dispatcher is not None and h.dispatcher.table is not None)
            finally:
                for host in hosts.values():
                    host.close()
            client.send_telemetry({"batch_id": str(uuid.uuid4()), "host": "simulated", "records": records})
            row = DayRow(
                day=day,
                requests={m: n * scale for m, n in stats.requests.items()},
                measured=client.fleet_savings(since=day.isoformat(), until=day.isoformat()),
                tables=tables,
                scale=scale,
                by_route=by_route,
            )
            rows.append(row)
            console.print(
                f"day {i + 1} ({day}): models {', '.join(sorted(row.requests))}; {row.tables}/{len(served)} layers on "
                f"tables; saved {row.saved_s:,.0f} ± {row.ci95_s:,.0f} s/day (served {row.served_s:,.0f} vs "
                f"baseline {row.baseline_s:,.0f}, {row.measured['measured_share']:.0%} of fleet time measured); "
                "by route: " + ", ".join(f"{r} {v:,.0f}" for r, v in sorted(row.by_route.items()))
            )
            run_day = day + dt.timedelta(days=1)
            client.run_fleet(run_day.isoformat())
            report = _wait_report(client, run_day)
            row.rollbacks = report.get("rollbacks") or []
            row.modelled = report.get("modelled") or {}
            for b in row.rollbacks:
                console.print(
                    f"  rolled back by the run for {run_day}: {b['label']} ({b['served_s'] / b['other_s']:.2f}× "
                    f"the {b['against']}; now serving {b['now_serving'] or 'no table'})"
                )
            if i == days - 1:
                break  # the last run's jobs would only tune for a day that is not simulated
            row.jobs = [c["job_id"] for c in report["candidates"] if c.get("job_id")]
            for job_id in row.jobs:
                client.wait(job_id, raise_on_failure=False, poll_s=1.0)
            row.cost_s = _run_seconds(report) + sum(_job_seconds(client, j) for j in row.jobs)
            states = [client.job(j).state for j in row.jobs]
            console.print(
                f"  run for {run_day}: {len(report['candidates'])} candidates, {len(row.jobs)} jobs "
                f"({', '.join(states) or 'none'}), tuning {row.cost_s:,.0f} s (jobs + the run)"
            )
    finally:
        supervisor.stop()
    return rows


def machine_name() -> str:
    """The CPU model and core count, from /proc/cpuinfo (trusted over LLVM's name for it)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "")
    return f"{model or 'unknown CPU'}, {os.cpu_count()} cores"


def _ratio(saved: float, ci: float, cost: float) -> str:
    return f"{saved / cost:,.1f}× [{(saved - ci) / cost:,.1f}, {(saved + ci) / cost:,.1f}]" if cost else "-"


def print_result(result: SimResult, console: Console, title: str = "") -> None:
    table = Table(
        title=f"Fleet kernel time per day, {title}: measured by the hosts' A/B holdout on {result.machine} (scaled)"
    )
    for col in ("day", "models (req/day)", "tables", "served s/day", "baseline s/day", "speedup", "measured",
                "saved s/day (95 %)", "cum. saved", "cum. tuning s", "saved ÷ cost [95 %]"):  # fmt: skip
        table.add_column(col, justify="right")
    for row, (saved, ci, cost) in zip(result.rows, result.cumulative(), strict=True):
        speedup = row.measured.get("speedup")
        table.add_row(
            str(row.day),
            " ".join(f"{m} {n:,.0f}" for m, n in sorted(row.requests.items())),
            str(row.tables),
            f"{row.served_s:,.0f}",
            f"{row.baseline_s:,.0f}",
            f"{speedup:.2f}×" if speedup else "-",
            f"{row.measured['measured_share']:.0%}",
            f"{row.saved_s:,.0f} ± {row.ci95_s:,.0f}",
            f"{saved:,.0f}",
            f"{cost:,.0f}",
            _ratio(saved, ci, cost),
        )
    console.print(table)
    console.print(
        f"scale: each day's sampled calls stand for {result.fleet_calls:,} production calls of the served layers "
        f"(day 1: each call × {result.rows[0].scale:,.0f}); savings scale with it, the tuning cost does not. Day 1 "
        "has no tables: PyTorch runs both sides, so its saving is the noise floor; so are shapes a table routes to "
        "PyTorch."
    )
    for row in result.rows:
        if row.modelled.get("jobs"):
            console.print(
                f"  (the run after {row.day} modelled {row.modelled.get('saved_s_per_day', 0):,.0f} s/day saved by "
                f"{row.modelled['jobs']} earlier jobs; a model, not the measurement above)"
            )


def print_spread(results: list[SimResult], console: Console) -> None:
    """Per day across runs: the median and the range of the measured saving and of cumulative saved ÷ cost."""
    table = Table(title=f"Across {len(results)} runs on {results[0].machine}: median [min, max]")
    for col in ("day", "saved s/day", "speedup", "cum. saved ÷ cost", "lower 95 % end of saved ÷ cost"):
        table.add_column(col, justify="right")

    def spread(values: list[float], fmt: str) -> str:
        return f"{np.median(values):{fmt}} [{min(values):{fmt}}, {max(values):{fmt}}]" if values else "-"

    for i in range(len(results[0].rows)):
        saved = [r.rows[i].saved_s for r in results]
        speed = [float(r.rows[i].measured["speedup"]) for r in results if r.rows[i].measured.get("speedup")]
        cum = [r.cumulative()[i] for r in results]
        ratio = [s / c for s, _, c in cum if c]
        low = [(s - ci) / c for s, ci, c in cum if c]
        table.add_row(f"day {i + 1}", spread(saved, ",.0f"), spread(speed, ".2f"), spread(ratio, ",.1f"),
                      spread(low, ",.1f"))  # fmt: skip
    console.print(table)


def _wait_report(client: Client, day: dt.date, timeout_s: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for r in client.fleet_reports(limit=5):
            if r["day"] == day.isoformat() and r["state"] != "running":
                found: dict[str, Any] = r
                return found
        time.sleep(1.0)
    raise TimeoutError(f"no fleet report for {day}")
