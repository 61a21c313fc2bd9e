"""`kernelfleet` command line (typer + rich): the client commands, which need only this SDK.

Server commands (standalone, api, worker, beat, migrate, demo, keys, MetaSchedule import/export, fleet
simulate) come from the service package: it registers them on this app through the `kernelfleet.cli`
entry-point group, so an SDK-only install lists only commands that work.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

try:
    import typer
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text
except ImportError:  # pragma: no cover
    sys.exit("the CLI needs its extras: pip install 'kernelfleet[cli]'")

from kernelfleet.client import Client
from kernelfleet.dispatch_view import describe
from kernelfleet.errors import InvalidRequest, KernelFleetError, ServiceUnavailable, Unauthorized

app = typer.Typer(
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="KernelFleet: tune kernels for shape distributions, serve the best.",
)
# Markup off: every string from the service (job errors, op and model names, tags) prints as it is, so a name
# like "[/x]" cannot raise rich's MarkupError; the CLI's own styling goes through Text spans (`_styled`).
console = Console(markup=False)
errors = Console(stderr=True, markup=False)
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="KERNELFLEET_URL", help="API base URL")]
_REQUIRED_SPEC_FIELDS = {
    "workload": '{"op": "dense", "dims": {"N": 768, "K": 768}, "symbolic": ["M"]}',
    "target": '{"kind": "llvm", "mcpu": "host"}',
    "distribution": '{"kind": "uniform", "dim": "M", "low": 1, "high": 128}',
}


class UsageProblem(Exception):
    """Input the user can fix; `main` prints it as one line, with the fix, and no traceback."""


def saved_key_path() -> Path:
    return Path(os.environ.get("KERNELFLEET_DATA_DIR", ".kernelfleet")) / "admin.key"


# An interactive command gives up on a service that does not answer within this (every attempt and pause of one
# request together; the SDK's own default has no such bound), and says what it is waiting for once a request has
# waited SLOW_NOTICE_S.
CLI_DEADLINE_S = 12.0
SLOW_NOTICE_S = 2.0


def _say_waiting(url: str) -> None:
    errors.print(f"waiting for {url} ...", highlight=False)


def client_from_env(url: str | None, deadline_s: float = CLI_DEADLINE_S) -> Client:
    """A client with KERNELFLEET_API_KEY, or else the admin key a local standalone saved in its data dir.
    `deadline_s` is longer for a command whose request makes the service work before it answers (an import)."""
    key = os.environ.get("KERNELFLEET_API_KEY")
    if not key and saved_key_path().is_file():
        key = saved_key_path().read_text().strip()
    return Client(
        url,
        api_key=key,
        timeout=max(10.0, deadline_s),
        deadline_s=deadline_s,
        on_slow=_say_waiting,
        slow_after_s=SLOW_NOTICE_S,
    )


def _parse_kv(text: str, option: str = "--shape") -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        try:
            out[name.strip()] = int(value)
        except ValueError:
            raise UsageProblem(f"{option} {text!r}: expected NAME=INT[,NAME=INT...], e.g. {option} M=61") from None
    if not out:
        raise UsageProblem(f"{option} is empty: expected NAME=INT[,NAME=INT...], e.g. {option} M=61")
    return out


def _read_spec(path: Path) -> dict[str, Any]:
    try:
        body = json.loads(path.read_text())
    except OSError as exc:
        raise UsageProblem(f"cannot read the job spec {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageProblem(f"{path} is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise UsageProblem(f"{path} must hold a JSON object with {', '.join(_REQUIRED_SPEC_FIELDS)}")
    for name, example in _REQUIRED_SPEC_FIELDS.items():
        if name not in body:
            raise UsageProblem(f'{path} has no {name!r}; add one, e.g. "{name}": {example}')
    return body


def error_line(exc: Exception) -> str:
    """One line that says what went wrong and how to fix it."""
    if isinstance(exc, UsageProblem):
        return str(exc)
    if isinstance(exc, Unauthorized):
        source = (
            "KERNELFLEET_API_KEY"
            if os.environ.get("KERNELFLEET_API_KEY")
            else f"{saved_key_path().resolve()} (KERNELFLEET_DATA_DIR/admin.key)"
            if saved_key_path().is_file()
            else f"KERNELFLEET_API_KEY (unset) or {saved_key_path().resolve()} (missing)"
        )
        return (
            f"the service refused the API key (401) from {source}: set KERNELFLEET_API_KEY to a key "
            "(`kernelfleet keys create` on the server makes one)"
        )
    if isinstance(exc, InvalidRequest) and isinstance(exc.detail, list):
        return "invalid request: " + "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg', e)}" if isinstance(e, dict) else str(e)
            for e in exc.detail
        )
    if isinstance(exc, ServiceUnavailable):
        return f"{exc} (start it with `kernelfleet standalone`, or point --url / KERNELFLEET_URL at it)"
    return str(exc).replace("\n", " ")


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="JSON job spec (see POST /v1/jobs)")],
    url: UrlOpt = None,
    wait: bool = True,
) -> None:
    """Submit a tuning job from a JSON spec and (by default) wait for it with a progress bar."""
    body = _read_spec(spec)
    with client_from_env(url) as client:
        job = client.submit(
            body["workload"],
            body["target"],
            body["distribution"],
            kind=body.get("kind", "sketch"),
            budget=body.get("budget"),
            tags=body.get("tags"),
        )
        console.print(f"job {job.id} {job.state}")
        if wait:
            _print_job(client.wait(job.id, progress=True, raise_on_failure=False))


def _styled(*parts: str | tuple[str, str]) -> Text:
    """A line with styled spans and no markup parsing: service strings may contain '[' (see `console`)."""
    return Text.assemble(*parts)


def _print_job(job: Any) -> None:
    console.print(
        _styled(
            f"job {job.id} ",
            (job.state, "bold"),
            f" {job.trials_done}/{job.trials_total} trials" + (f" — {job.error}" if job.error else ""),
        )
    )
    # the keys `kernelfleet best` and `kernelfleet dispatch` take, one a line: a wrapped line would break a copy
    console.print(f"workload hash       {job.workload_hash}", soft_wrap=True)
    console.print(
        f"target fingerprint  {job.target_fingerprint or '- (known once a worker takes the job)'}", soft_wrap=True
    )
    if job.waiting_for_worker:
        console.print(
            _styled(
                ("waiting for a worker", "yellow"),
                f": no live worker consumes queue {job.waiting_for_worker}; "
                "`kernelfleet targets` lists what the fleet serves",
            )
        )
    published = getattr(job, "published", None)
    if published is False:
        console.print(_styled(("published: false", "yellow"), f" — {job.publish_reason}"))
    elif published:
        held_back = f" (not published: {job.publish_reason})" if job.publish_reason else ""
        console.print(f"published: true{held_back}")
    table = Table()
    # both columns time a call as an inference host makes it (Python call included), side by side
    for col in ("shape", "state", "trials", "tuned, as called (µs)", "vendor, as called (µs)", "speedup"):
        table.add_column(col, justify="right")
    for s in job.shapes:
        table.add_row(
            json.dumps(s.shape),
            s.state,
            f"{s.trials_done}/{s.trials}",
            f"{s.best_latency_s * 1e6:.1f}" if s.best_latency_s else "-",
            f"{s.baseline_latency_s * 1e6:.1f}" if s.baseline_latency_s else "-",
            f"{s.speedup:.2f}×" if s.speedup else "-",
        )
    console.print(table)


@app.command()
def jobs(url: UrlOpt = None, state: str | None = None, limit: int = 20) -> None:
    """List recent jobs."""
    with client_from_env(url) as client:
        table = Table("id", "kind", "state", "progress", "created", "error")
        for j in client.jobs(state=state, limit=limit):
            table.add_row(
                j.id,
                j.kind,
                j.state,
                f"{j.progress:.0%}",
                j.created_at.isoformat(timespec="seconds"),
                (j.error or "")[:60],
            )
        console.print(table)


@app.command()
def status(url: UrlOpt = None) -> None:
    """Summarise the fleet: jobs by state, queue depths, throughput and workers."""
    with client_from_env(url) as client:
        st = client.status()
    console.print("jobs   " + "  ".join(f"{k} {v}" for k, v in st["jobs"].items()))
    console.print("queues " + "  ".join(f"{k} {'?' if v is None else v}" for k, v in st["queues"].items()))
    console.print(f"trials/s (5 min) {st['trials_per_second']:.2f}")
    table = Table("worker", "queues", "last seen", "state")
    for w in st["workers"]:
        table.add_row(w["name"], ",".join(w["queues"]), w["last_seen"][:19], "online" if w["online"] else "offline")
    console.print(table)


@app.command()
def targets(url: UrlOpt = None) -> None:
    """The targets live workers serve, as JSON to copy into a job spec (or use mcpu "host")."""
    with client_from_env(url) as client:
        served = client.targets()
    if not served:
        errors.print("no live worker: start one (`kernelfleet worker`), then jobs can target its hardware")
        raise typer.Exit(1)
    for t in served:
        console.print_json(json.dumps(t.model_dump(exclude={"target_fingerprint", "toolchain"}, exclude_defaults=True)))


@app.command()
def job(job_id: str, url: UrlOpt = None) -> None:
    """Show one job with its per-shape results."""
    with client_from_env(url) as client:
        _print_job(client.job(job_id))


@app.command()
def best(
    workload: Annotated[str, typer.Option(help="workload hash")],
    target: Annotated[str, typer.Option(help="target fingerprint")],
    shape: Annotated[str, typer.Option(help="e.g. M=61")],
    url: UrlOpt = None,
) -> None:
    """Look up the best config for one concrete shape."""
    with client_from_env(url) as client:
        rec = client.best(workload, target, _parse_kv(shape))
    if rec is None:
        console.print(
            _styled(("miss", "yellow"), ": no tuned config; run the default kernel and submit a job for this shape")
        )
        raise typer.Exit(1)
    console.print(
        f"{rec.kind} config, {rec.latency_s * 1e6:.1f} µs (the tuner's own timing loop; `kernelfleet job "
        f"{rec.job_id}` shows it as called), from job {rec.job_id} {rec.provenance}"
    )


@app.command()
def dispatch(
    workload: Annotated[str, typer.Option(help="workload hash")],
    target: Annotated[str, typer.Option(help="target fingerprint")],
    url: UrlOpt = None,
) -> None:
    """The dispatch table a ukernel job published (dense, batch_matmul or conv2d): its ranges, routes and uKernels,
    and how well its model ranked them."""
    fetched = client_from_env(url).dispatch_doc(workload, target)
    if fetched is None:
        raise UsageProblem(f"no dispatch table for workload {workload} on target {target}: run a ukernel job first")
    for line in describe(fetched[0]):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


fleet_app = typer.Typer(no_args_is_help=True, help="Fleet-wide daily tuning: usage, reports, runs.")
app.add_typer(fleet_app, name="fleet")


def _workload_name(row: dict[str, Any]) -> str:
    """'dense M=? N=3072 K=768 +bias +gelu (1a2b3c4d5e6f)': the label a service sends, with the hash to look up."""
    label = row.get("label") or ""
    return f"{label} ({row['workload_hash'][:12]})" if label else row["workload_hash"][:12]


@fleet_app.command("usage")
def fleet_usage(days: int = 7, limit: int = 20, url: UrlOpt = None) -> None:
    """Where the fleet's kernel time went over the last days."""
    view = client_from_env(url).fleet_usage(days=days, limit=limit)
    table = Table(title=f"fleet kernel time {view['since']}..{view['until']}: {view['total_seconds']:,.1f} s")
    for col in ("workload", "target", "shape", "calls", "seconds", "share", "fallbacks"):
        table.add_column(col)
    for r in view["rows"]:
        table.add_row(
            _workload_name(r),
            r["target_fingerprint"][:12],
            ",".join(f"{k}={v}" for k, v in r["shape"].items()),
            f"{r['calls']:,}",
            f"{r['kernel_seconds']:,.2f}",
            f"{r['share']:.1%}",
            f"{r['fallbacks']:,}",
        )
    console.print(table)


@fleet_app.command("report")
def fleet_report(url: UrlOpt = None) -> None:
    """The latest daily run: what it tuned, expected savings vs tuning cost, regressions."""
    reports = client_from_env(url).fleet_reports(limit=1)
    if not reports:
        console.print("no fleet run yet")
        raise typer.Exit(1)
    r = reports[0]
    console.print(_styled((f"fleet run {r['day']}", "bold"), f": {r['state']} {r.get('error') or ''}"))
    observed = r.get("observed_days") or r["window_days"]
    console.print(
        f"fleet kernel time {r['fleet_seconds_per_day']:,.1f} s/day over {observed} observed days "
        f"(window {r['window_days']} days)"
    )
    table = Table(title="candidates, best first")
    for col in ("workload", "kind", "reasons", "observed s/day", "gain", "saving s/day", "trials", "job"):
        table.add_column(col)
    for c in r["candidates"]:
        table.add_row(
            _workload_name(c) + "".join(f"\n  {layer}" for layer in c.get("layers", [])),
            c["kind"],
            ",".join(c["reasons"]) + (" (stalled)" if c["stalled"] else ""),
            f"{c['observed_s_per_day']:,.1f}",
            f"{c['predicted_gain']:.0%}",
            f"{c['expected_saving_s_per_day']:,.1f}",
            str(c["trials"]),
            (c["job_id"] or "-")[:8],
        )
    console.print(table)
    console.print(
        f"budget {r['budget']} trials, spent {r['spent']}; expected saving {r['expected_saving_s_per_day']:,.1f} s/day"
    )
    for queue, seconds in (r.get("budget_s") or {}).items():
        console.print(
            f"  {queue}: {seconds:,.0f} worker s/day at {r['unit_s'].get(queue, 0):,.0f} s a unit (from earlier "
            f"fleet jobs); planned {r['planned_s'].get(queue, 0):,.0f} s"
        )
    measured, cost = r.get("measured"), r.get("cost") or {}
    if measured:
        console.print(
            f"measured by the hosts' holdout ({measured['since']}..{measured['until']}, {measured['days']} days): "
            f"{measured['saved_s_per_day']:,.1f} ± {measured['ci95_s_per_day']:,.1f} s/day saved (95 %) over "
            f"{measured['measured_share']:.0%} of the fleet's time; {measured['holdout_calls']:,} calls held out"
        )
    merit = r.get("savings_per_tuning_s")
    if cost.get("tuning_s"):
        said = f"; saved ÷ cost {merit[1]:.3g} per day [{merit[0]:.3g}, {merit[2]:.3g}]" if merit else ""
        console.print(f"tuning cost of earlier runs' jobs: {cost['tuning_s']:,.0f} worker seconds{said}")
    for b in r.get("rollbacks", []):
        back = f"now serving job {b['now_serving'][:8]}'s table" if b["now_serving"] else "no table now (baseline)"
        console.print(
            f"rolled back {_workload_name(b)} (job {b['table_job_id'][:8]}): {b['served_s']:.3g} s a call vs "
            f"{b['other_s']:.3g} for the {b['against']} over {b['shapes']} shapes; {back}",
            style="red",
        )
    for t in r.get("silent", []):
        served = "its tables stay served" if t["published"] else "nothing published"
        since = f"silent {t['days_silent']} days (last telemetry {t['last_seen']})"
        console.print(f"{since}: {_workload_name(t)}; not tuned, {served}")
    console.print(f"re-measured {r['remeasured']} configs; regressions: {len(r['regressions'])}")
    for g in r["regressions"]:
        console.print(
            f"  {_workload_name(g)} {g['shape']}: {g['stored_s']:.3g} s → {g['measured_s']:.3g} s", style="red"
        )


@fleet_app.command("run")
def fleet_run(
    day: Annotated[str | None, typer.Option(help="ISO date (UTC); default today")] = None, url: UrlOpt = None
) -> None:
    """Queue the daily run now (admin); a day that already ran does nothing."""
    console.print(client_from_env(url).run_fleet(day))


model_app = typer.Typer(no_args_is_help=True, help="Onboard a model: its GEMM-like operators as workloads.")
app.add_typer(model_app, name="model")


@model_app.command("inspect")
def model_inspect(
    path: Annotated[Path, typer.Argument(help="an ONNX file (dynamic axes as dim_params)")],
    at: Annotated[
        str | None, typer.Option(help="input sizes for the FLOPs share, e.g. seq=128,batch=1 (others: 1)")
    ] = None,
    histogram: Annotated[
        Path | None,
        typer.Option(help='JSON traffic histogram per input, e.g. {"seq": {"128": 70, "512": 30}}: adds distributions'),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print workloads (and distributions) as JSON")] = False,
) -> None:
    """List the model's workloads: op, dims, occurrences, FLOPs share; and what could not be expressed."""
    from kernelfleet.model_import import ModelImportError, extract_onnx

    try:
        graph = extract_onnx(path)
        values = {**dict.fromkeys(graph.inputs, 1), **(_parse_kv(at, "--at") if at else {})}
        unknown = sorted(set(values) - set(graph.inputs))
        if unknown:
            raise UsageProblem(f"--at names {', '.join(unknown)}; the model's inputs are {', '.join(graph.inputs)}")
        shares = graph.flops_shares(values)
        traffic = None
        if histogram is not None:
            try:
                traffic = json.loads(histogram.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise UsageProblem(f"cannot read the histogram {histogram}: {exc}") from None
            if not isinstance(traffic, dict):
                raise UsageProblem(f'{histogram} must hold a JSON object such as {{"seq": {{"128": 1}}}}')
        if as_json:
            rows = []
            for op, share in zip(graph.ops, shares, strict=True):
                row: dict[str, Any] = {"workload": op.to_workload(), "dims": op.dims, "occurrences": op.occurrences,
                                       "flops_share": share, "sources": op.sources}  # fmt: skip
                if traffic is not None and op.inputs:
                    row["distribution"] = graph.distribution_for(op, histogram=traffic)
                rows.append(row)
            unsupported = [{"op": u.name, "reason": u.reason, "count": u.count} for u in graph.unsupported]
            console.print_json(json.dumps({"inputs": graph.inputs, "ops": rows, "unsupported": unsupported}))
            return
    except ModelImportError as exc:
        raise UsageProblem(str(exc)) from None
    where = ", ".join(f"{k}={v}" for k, v in values.items())
    table = Table(title=f"{graph.source}: inputs {', '.join(f'{k} ({v})' for k, v in graph.inputs.items())}")
    for col in ("op", "dims", "attrs", "dtype", "occurrences", f"FLOPs share at {where}"):
        table.add_column(col)
    for op, share in sorted(zip(graph.ops, shares, strict=True), key=lambda r: -r[1]):
        table.add_row(
            op.op,
            ", ".join(f"{k}={v}" for k, v in op.dims.items()),
            ", ".join(f"{k}={v}" for k, v in op.attrs.items()),
            op.dtype,
            str(op.occurrences),
            f"{share:.1%}",
        )
    console.print(table)
    for u in graph.unsupported:
        console.print(
            _styled(("unsupported", "yellow"), f" {u.name} ×{u.count}: {u.reason} ({', '.join(u.sources[:3])})")
        )
    if graph.other_ops:
        console.print("other operators: " + ", ".join(f"{k} ×{v}" for k, v in sorted(graph.other_ops.items())))


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UsageProblem(f"cannot read the {what} {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageProblem(f"{path} ({what}) is not JSON: {exc}") from None


def _target_option(text: str) -> dict[str, Any]:
    """A target as JSON text, or a file holding it."""
    candidate = Path(text)
    try:
        body = _read_json(candidate, "target") if candidate.is_file() else json.loads(text)
    except json.JSONDecodeError:
        body = None
    if not isinstance(body, dict):
        raise UsageProblem(
            f'--target {text!r}: expected a JSON object (or a file), e.g. {{"kind": "llvm", "mcpu": "host"}}'
        )
    return body


def _print_model(model: Any) -> None:
    console.print(
        _styled(
            f"model {model.id} ",
            (model.name, "bold"),
            f" {model.state}: {model.jobs_done}/{model.jobs_total} jobs done, "
            f"{model.trials_done}/{model.trials_total} trials ({model.progress:.0%}); "
            + ", ".join(f"{k} {v}" for k, v in sorted(model.states.items())),
        )
    )
    table = Table()
    for col in ("op", "occurrences", "share", "trials", "job", "state", "progress"):
        table.add_column(col)
    for op in model.ops:
        table.add_row(
            op.name,
            str(op.occurrences),
            f"{op.share:.1%}",
            str(op.trials),
            op.job_id or "-",
            op.state or ("skipped" if op.skipped else "-"),
            f"{op.progress:.0%}" if op.job_id else "-",
        )
    console.print(table)
    for op in model.skipped:
        console.print(_styled(("skipped", "yellow"), f" {op.name}: {op.skipped}"))
    for op in model.ops:
        if op.error:
            console.print(_styled((op.name, "red"), f": {op.error}"))


@model_app.command("add")
def model_add(
    path: Annotated[Path, typer.Argument(help="an ONNX file (dynamic axes as dim_params)")],
    target: Annotated[
        str, typer.Option(help='the target as JSON or a JSON file, e.g. {"kind": "llvm", "mcpu": "host"}')
    ] = '{"kind": "llvm", "mcpu": "host"}',
    histogram: Annotated[
        Path | None, typer.Option(help='JSON traffic histogram per input, e.g. {"seq": {"128": 70, "512": 30}}')
    ] = None,
    ranges: Annotated[
        str | None, typer.Option(help="inputs without a histogram, every value equally likely: seq=1..512,batch=1..4")
    ] = None,
    trials: Annotated[int, typer.Option(help="the model's total trial budget, split between its jobs")] = 256,
    min_trials: Annotated[int, typer.Option(help="the floor every tunable op's job gets")] = 8,
    max_shapes: Annotated[int, typer.Option(help="hot shapes each job tunes")] = 4,
    kind: Annotated[str, typer.Option(help="the job kind (GET /v1/kinds)")] = "sketch",
    name: Annotated[str | None, typer.Option(help="the model's name (default: the file's)")] = None,
    wait: Annotated[bool, typer.Option(help="wait until every job ended")] = False,
    url: UrlOpt = None,
) -> None:
    """Onboard a model: parse it here, send its ops, start one job per tunable op with the budget split by FLOPs."""
    from kernelfleet.model_import import ModelImportError, extract_onnx

    traffic = _read_json(histogram, "histogram") if histogram is not None else None
    if traffic is not None and not isinstance(traffic, dict):
        raise UsageProblem(f'{histogram} must hold a JSON object such as {{"seq": {{"128": 1}}}}')
    declared: dict[str, tuple[int, int]] = {}
    for part in filter(None, (ranges or "").split(",")):
        key, _, span = part.partition("=")
        low, _, high = span.partition("..")
        if not (low.isdigit() and high.isdigit()):
            raise UsageProblem(f"--ranges {ranges!r}: expected NAME=LOW..HIGH[,...], e.g. seq=1..512")
        declared[key.strip()] = (int(low), int(high))
    body = _target_option(target)
    try:
        graph = extract_onnx(path)
        with client_from_env(url) as client:
            model = client.add_model(
                graph, body, histogram=traffic, ranges=declared or None,
                budget={"trials": trials, "min_trials": min_trials, "max_shapes": max_shapes}, name=name, kind=kind,
            )  # fmt: skip
            if wait:
                model = client.wait_model(model.id, poll_s=1.0, raise_on_failure=False)  # printed below
    except ModelImportError as exc:
        raise UsageProblem(str(exc)) from None
    _print_model(model)
    split = model.budget_split
    console.print(f"budget: {split.get('total_trials')} trials; {split.get('rule', '')}")


@model_app.command("status")
def model_status(model_id: str, url: UrlOpt = None) -> None:
    """A model's progress: its jobs' states, done/total, and each op's job."""
    with client_from_env(url) as client:
        _print_model(client.model(model_id))


@model_app.command("cancel")
def model_cancel(model_id: str, url: UrlOpt = None) -> None:
    """Cancel every unfinished job of a model."""
    with client_from_env(url) as client:
        _print_model(client.cancel_model(model_id))


@model_app.command("list")
def model_list(url: UrlOpt = None, limit: int = 20) -> None:
    """Models, newest first."""
    with client_from_env(url) as client:
        for m in client.models(limit=limit):
            console.print(f"{m.id} {m.name} {m.state} {m.jobs_done}/{m.jobs_total} jobs ({m.progress:.0%})")


EXTENSION_GROUP = "kernelfleet.cli"


def load_extensions(target: typer.Typer = app) -> list[str]:
    """Let installed packages add their commands (the service adds its server commands); returns their names.
    A package that cannot be imported here adds nothing rather than breaking the client commands."""
    from importlib.metadata import entry_points

    loaded = []
    for ep in entry_points(group=EXTENSION_GROUP):
        try:
            register = ep.load()
        except ImportError:
            continue
        register(target)
        loaded.append(ep.name)
    return loaded


def main() -> None:
    load_extensions()
    try:
        app()
    except (KernelFleetError, UsageProblem) as exc:
        errors.print(_styled(("error:", "red"), f" {error_line(exc)}"), soft_wrap=True, highlight=False)
        sys.exit(1)


if __name__ == "__main__":
    main()
