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
Each day this process serves a sample of requests as a PyTorch host does: each model, whole (`ModelHost`), put on
the fleet's tables by `kernelfleet.torch.accelerate` with its defaults (thread policy, PyTorch for every shape a
table routes to a vendor library, each layer's in-model check, the whole-forward check, the model's own forward
wherever the tables run no uKernel), one forward per request. Where a table serves, accelerate holds calls out for
the baseline (kernelfleet.holdout): one in `--holdout` per shape runs the layer's own PyTorch computation, what
hosts of these models run without KernelFleet. Served and held-out calls interleave in time, in this one process,
with default thread settings. Calls no table ran (no table, the shape past it, forwards run as the model's own) are
reported as misses and save nothing — so day 1, with no table, saves nothing by construction, but tells the fleet
what its hosts run. The day's telemetry (the SDK's own records: volume scaled to `--fleet-calls`, holdout sums as
sampled) goes to the real API; the saving is the service's measurement (GET /v1/fleet/savings: the volume tables
served × the difference of the sides' means, with a 95 % interval), not this script's. The daily run for
day d+1 then rolls back tables its telemetry shows slower, ranks, budgets and submits ordinary jobs to the real
worker (the Supervisor), and the next day's traffic uses what they published.

Tuning cost = the worker's wall seconds for the fleet's jobs (finished − started, from the store) plus the daily
runs' own wall time. Each day's saving is also split by what served each shape (uKernels, PyTorch, no table), from
the same samples. `--runs N` repeats the whole simulation on fresh stores with other traffic seeds and prints the
spread.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

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
MAX_EXTRA_FORWARDS = 60  # forwards a (batch, seq) gets to reach MIN_SIDE (the checks take about 34 first)
HOLDOUT_EVERY = 2  # the sample is small: one call in 2 is held out (production hosts: 1 in 100)
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
def build_model(model: str, n_layers: int) -> Any:
    """BERT-base or GPT-2 small with `n_layers` layers, random weights seeded alike on every call, eval mode."""
    import torch
    import transformers

    torch.manual_seed(0)
    module: Any
    if model == "bert":
        module = transformers.BertModel(transformers.BertConfig(num_hidden_layers=n_layers))
    else:
        module = transformers.GPT2Model(transformers.GPT2Config(n_layer=n_layers, use_cache=False))
    return module.train(False)


def _extract_child(n_layers: int) -> None:
    """In a child process: print each model's dense ops as JSON (workload body, M expression, occurrences)."""
    import torch
    from torch.export import Dim

    from kernelfleet.model_import import extract_torch

    out = {}
    for model in MODELS:
        module = build_model(model, n_layers)
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
    """One served workload: its body, hash, and which model ops (M expression, occurrences) use it."""

    key: str
    body: dict[str, Any]
    uses: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # model → [(M expression, occurrences)]
    workload_hash: str = ""

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
# why a request's forward ran as the model's own (ModelHost.__call__)
OWN_CHECKING = "in the whole-forward check"
OWN_CHOSEN = "the check chose it"
OWN_NEIGHBOURS = "its neighbours' checks chose it"
OWN_NO_UKERNEL = "no uKernel at its shapes"


class ModelHost:
    """A host serving one model as a PyTorch user runs it: the model built as `extract_dense` built it (the same
    config, layers and seeded random weights), put on the fleet's tables by `kernelfleet.torch.accelerate` with its
    defaults (thread policy, PyTorch for every vendor route, each layer's in-model check, the whole-forward check,
    the model's own forward wherever the tables run no uKernel) and its A/B holdout (one call in `holdout` per S a
    table serves runs the layer's own PyTorch computation). One request is one forward. Telemetry is read from the
    dispatchers of the served workloads (day_records), not sent by accelerate's reporter, so the sample can be
    scaled to the fleet's volume."""

    def __init__(
        self, model: str, n_layers: int, served: set[str], client: Client, target: str, holdout: int, cache_dir: Path
    ) -> None:
        import torch

        from kernelfleet.torch import AcceleratedLinear, accelerate

        self.torch = torch
        said = logging.getLogger("kernelfleet.torch")
        level = said.level
        said.setLevel(logging.ERROR)  # each layer without a table warns, every day: the day's line says how many
        try:
            self.fast = accelerate(
                build_model(model, n_layers),
                client,
                target=target,
                cache_dir=cache_dir,
                telemetry=True,
                telemetry_interval_s=1e9,  # never sends by itself: day_records reads the dispatchers
                print_summary=False,
                holdout=holdout,
                inplace=True,  # the model is the host's own: no second copy of its weights
            )
        finally:
            said.setLevel(level)
        self.layers: dict[str, list[AcceleratedLinear]] = {}  # served workload hash → the layers running it
        self.dispatchers: dict[str, Dispatcher] = {}  # one per workload in an accelerated model
        for layer in self.fast.layers.values():
            d = layer.dispatcher
            if isinstance(d, Dispatcher) and d.meta.get("workload_hash") in served:
                self.layers.setdefault(d.meta["workload_hash"], []).append(layer)
                self.dispatchers[d.meta["workload_hash"]] = d

    def __call__(self, batch: int, seq: int) -> str | None:
        """One forward at (batch, seq); when it ran as the model's own (every layer on PyTorch, no wrapper), why:
        OWN_CHECKING (one of the whole-forward check's blocks of the model's own forward), OWN_CHOSEN (the check
        chose the model's own forward here), OWN_NEIGHBOURS (it took the choice of the signatures around it) or
        OWN_NO_UKERNEL (the tables run no uKernel at these shapes)."""
        from kernelfleet.torch_forward import input_signature

        ids = self.torch.zeros((batch, seq), dtype=self.torch.long)
        signature = repr(input_signature((), {"input_ids": ids}))
        before = self.fast.forward_decisions().get(signature) or {}
        own = self._own_forwards()
        with self.torch.inference_mode():
            self.fast(input_ids=ids)
        if self._own_forwards() == own:
            return None
        if before.get("no_ukernels"):
            return OWN_NO_UKERNEL
        if before.get("decision") == "eager":
            return OWN_CHOSEN
        after = self.fast.forward_decisions().get(signature) or {}
        return OWN_NEIGHBOURS if after.get("between") else OWN_CHECKING

    def settled_own(self, batch: int, seq: int) -> bool:
        """Forwards at (batch, seq) run as the model's own from now on: the whole-forward check chose it, or they
        run no uKernel at all."""
        from kernelfleet.torch_forward import input_signature

        ids = self.torch.zeros((batch, seq), dtype=self.torch.long)
        if self.fast.forward_choice(input_ids=ids) == "eager":
            return True
        record = self.fast.forward_decisions().get(repr(input_signature((), {"input_ids": ids})))
        return bool(record and record["no_ukernels"])

    def _own_forwards(self) -> int:
        return sum(int(r["own_forwards"]) for r in self.fast.forward_decisions().values())

    def route(self, workload_hash: str, m: int) -> str:
        """What served M's calls through the layers of a workload: "no table", "torch" (every such layer's route:
        its PyTorch computation), "uKernels", or the library the table names (only where accelerate runs vendor
        routes on the table's library)."""
        d = self.dispatchers.get(workload_hash)
        if d is None or d.table is None:
            return "no table"
        if all(layer.route(m) == "pytorch" for layer in self.layers[workload_hash]):
            return "torch"
        return "uKernels" if d.vendor_route(m) is None else d.library(m)

    def close(self) -> None:
        assert self.fast.reporter is not None
        self.fast.reporter.close(flush=False)  # its usage went out through day_records
        self.fast.close()


@dataclass
class DayStats:
    """What the sample ran: per (model, workload, M) the calls the requests' forwards reported on the served
    workloads' dispatchers (those of forwards run as the model's own as misses); the served layers' calls in all
    (occurrences per forward pass counted); per model the requests and how many ran as its own forward."""

    volume: dict[tuple[str, str, int], int] = field(default_factory=dict)
    layer_calls: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    own_forwards: dict[str, int] = field(default_factory=dict)
    own_why: dict[str, int] = field(default_factory=dict)  # ModelHost.__call__'s reason → requests

    @property
    def own_share(self) -> float:
        return sum(self.own_forwards.values()) / max(1, sum(self.requests.values()))


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


def _layer_ms(layers: list[Layer], model: str, b: int, s: int) -> list[tuple[Layer, int, int]]:
    """(layer, M, occurrences per forward) of each served layer use of `model` at (batch, seq)."""
    return [(layer, _m_of(expr, b, s), occ) for layer in layers for expr, occ in layer.uses.get(model, [])]


def serve_day(layers: list[Layer], hosts: dict[str, ModelHost], requests: list[tuple[str, int, int]]) -> DayStats:
    """Serve the sample as hosts do, one forward per request; then each (batch, seq) is run again, up to
    MAX_EXTRA_FORWARDS times, until every (served workload, M) its forward runs through a table has MIN_SIDE samples
    on both sides of the holdout, or its forwards run as the model's own. Those extra forwards add samples, not
    volume: the volume is what the requests' own forwards called."""
    stats = DayStats()
    for model, b, s in requests:
        stats.requests[model] = stats.requests.get(model, 0) + 1
        stats.layer_calls += sum(occ for _, _, occ in _layer_ms(layers, model, b, s))
        why = hosts[model](b, s)
        if why is not None:
            stats.own_forwards[model] = stats.own_forwards.get(model, 0) + 1
            stats.own_why[why] = stats.own_why.get(why, 0) + 1
    for model, host in hosts.items():
        for wh, d in host.dispatchers.items():
            for m, use in d.usage().items():
                stats.volume[(model, wh, m)] = use.calls
    for model, b, s in dict.fromkeys(requests):
        host = hosts[model]
        for _ in range(MAX_EXTRA_FORWARDS):
            pending = False
            for layer, m, _ in _layer_ms(layers, model, b, s):
                held = host.dispatchers.get(layer.workload_hash)
                if held is None or held.holdout is None:
                    continue  # accelerate holds nothing out (no telemetry for this layer)
                if held.table is not None and all(x.route(m) is None for x in host.layers[layer.workload_hash]):
                    continue  # M is outside the table (PyTorch runs it as a fallback): nothing to hold out
                sample = held.holdout.samples().get(m)
                pending |= sample is None or min(sample.served_calls, sample.baseline_calls) < MIN_SIDE
            if not pending or host.settled_own(b, s):
                break  # enough samples, or forwards at (b, s) run as the model's own: no more samples come
            host(b, s)
    return stats


def day_records(
    hosts: dict[str, ModelHost], stats: DayStats, scale: float, day: dt.date
) -> list[tuple[dict[str, Any], str]]:
    """The day's telemetry as the SDK builds it (kernelfleet.telemetry.usage_records), with what served each
    record's shape (ModelHost.route): each record's calls and kernel seconds scaled to the production volume its
    requests' calls stand for; the holdout sums stay the sample's (they are timings, not volume). A shape whose
    calls all came from the extra forwards (no request called it) had no production volume: its record is
    dropped."""
    records = []
    for model, host in hosts.items():
        for wh, d in host.dispatchers.items():
            for record in usage_records(d, day):
                m, ran = record["shape"]["M"], record["calls"]
                volume = round(stats.volume.get((model, wh, m), 0) * scale)
                if volume <= 0:
                    continue
                record["kernel_seconds"] *= volume / ran
                record["fallbacks"] = round(record["fallbacks"] * volume / ran)
                record["calls"] = volume
                records.append((record, host.route(wh, m)))
    return records


def saving_by_route(records: list[tuple[dict[str, Any], str]], day: dt.date) -> dict[str, float]:
    """The day's saving (s/day) split by what served each (workload, M): the service's own measurement
    (service.workers.fleet.savings.measure) of the day's telemetry records, run once per route on the records of
    the shapes that route served. The service does not know routes; this says where its saving came from. Hosts
    of different models report the same (workload, M) when they share a layer: their records are summed, as the
    store sums a day's telemetry, so that each shape's volume is the fleet's."""
    # route → (usage by (workload, target, shape), holdout sums by (workload, target, shape, baseline))
    groups: dict[str, tuple[dict[tuple[str, ...], Usage], dict[tuple[str, ...], HoldoutSums]]] = {}
    for r, route in records:
        held = r.get("holdout")
        if held is None:
            continue
        wh, fp, key = r["workload_hash"], r["target_fingerprint"], shape_key(r["shape"])
        usage, sums = groups.setdefault(route, ({}, {}))
        use = Usage(wh, fp, key, r["calls"], r["kernel_seconds"], r["fallbacks"])
        usage[(wh, fp, key)] = _added(usage.get((wh, fp, key)), use, ("calls", "kernel_seconds", "fallbacks"))
        held_sums = HoldoutSums(wh, fp, "", key, held["baseline"], **{n: held[n] for n in HOLDOUT_SUMS})
        at = (wh, fp, key, held["baseline"])
        sums[at] = _added(sums.get(at), held_sums, HOLDOUT_SUMS)
    return {
        route: measure(usage.values(), sums.values(), day, day, 1).saved_s_per_day
        for route, (usage, sums) in sorted(groups.items())
    }


_Summed = TypeVar("_Summed", Usage, HoldoutSums)


def _added(total: _Summed | None, more: _Summed, fields: Iterable[str]) -> _Summed:
    """`more` with `total`'s `fields` added (`more` alone when there is no total yet)."""
    if total is None:
        return more
    return replace(more, **{f: getattr(total, f) + getattr(more, f) for f in fields})


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
    own_share: float = 0.0  # requests whose forward ran as the model's own (PyTorch: nothing saved, nothing measured)
    own_why: dict[str, int] = field(default_factory=dict)  # those requests by reason (ModelHost.__call__)

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
    results = []
    for run in range(runs):
        run_dir = Path(tempfile.mkdtemp(prefix="kernelfleet-fleet-sim-")) if data_dir is None or runs > 1 else data_dir
        rows = _simulate(served, n_layers, days, requests, fleet_calls, holdout, port, run_dir, run, console)
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
    n_layers: int,
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
            hashes = {layer.workload_hash for layer in served}
            cache = data_dir / "host-cache"
            hosts = {m: ModelHost(m, n_layers, hashes, client, fp, holdout, cache) for m in traffic(i)}
            try:
                stats = serve_day(served, hosts, _sample_requests(rng, i, requests))
                scale = fleet_calls / max(1, stats.layer_calls)
                records = day_records(hosts, stats, scale, day)
                by_route = saving_by_route(records, day)
                tables = len({wh for h in hosts.values() for wh, d in h.dispatchers.items() if d.table is not None})
            finally:
                for host in hosts.values():
                    host.close()
                del hosts  # two 12-layer models a day: freed before the next day's are built
                gc.collect()
            batch = [record for record, _ in records]
            client.send_telemetry({"batch_id": str(uuid.uuid4()), "host": "simulated", "records": batch})
            row = DayRow(
                day=day,
                requests={m: n * scale for m, n in stats.requests.items()},
                measured=client.fleet_savings(since=day.isoformat(), until=day.isoformat()),
                tables=tables,
                scale=scale,
                by_route=by_route,
                own_share=stats.own_share,
                own_why=dict(stats.own_why),
            )
            rows.append(row)
            console.print(
                f"day {i + 1} ({day}): models {', '.join(sorted(row.requests))}; {row.tables}/{len(served)} layers on "
                f"tables; saved {row.saved_s:,.0f} ± {row.ci95_s:,.0f} s/day (served {row.served_s:,.0f} vs "
                f"baseline {row.baseline_s:,.0f}: {row.measured['measured_share']:.0%} of the "
                f"{row.measured['fleet_s_per_day']:,.0f} s/day reported; "
                f"{row.own_share:.0%} of requests ran as the model's own forward, their calls misses"
                + "".join(f"; {n} {why}" for why, n in sorted(row.own_why.items()))
                + "); by route: "
                + ", ".join(f"{r} {v:,.0f}" for r, v in sorted(row.by_route.items()))
            )
            run_day = day + dt.timedelta(days=1)
            client.run_fleet(run_day.isoformat())
            report = _wait_report(client, run_day)
            row.rollbacks = report.get("rollbacks") or []
            row.modelled = report.get("modelled") or {}
            tuned_by = {job: f"the table tuned after {r.day}" for r in rows for job in r.jobs}
            for b in row.rollbacks:
                now = b["now_serving"]
                console.print(
                    f"  rolled back by the run for {run_day}: {b['label']} ({b['served_s'] / b['other_s']:.2f}× "
                    f"the {b['against']}; now serving {tuned_by.get(now, f'job {now}') if now else 'no table'})"
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
    for col in ("day", "models (req/day)", "tables", "own forwards", "served s/day", "baseline s/day", "speedup",
                "measured", "saved s/day (95 %)", "cum. saved", "cum. tuning s", "saved ÷ cost [95 %]"):  # fmt: skip
        table.add_column(col, justify="right")
    for row, (saved, ci, cost) in zip(result.rows, result.cumulative(), strict=True):
        speedup = row.measured.get("speedup")
        table.add_row(
            str(row.day),
            " ".join(f"{m} {n:,.0f}" for m, n in sorted(row.requests.items())),
            str(row.tables),
            f"{row.own_share:.0%}",
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
        f"(day 1: each call × {result.rows[0].scale:,.0f}); savings scale with it, the tuning cost does not. Forwards "
        "that ran as the model's own (day 1: no table) saved nothing and are measured as such; shapes a table routes "
        "to PyTorch hold out PyTorch against PyTorch: their saving is the noise floor."
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
