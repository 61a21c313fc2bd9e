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
except ImportError:  # pragma: no cover
    sys.exit("the CLI needs its extras: pip install 'kernelfleet[cli]'")

from kernelfleet.client import Client
from kernelfleet.errors import KernelFleetError

app = typer.Typer(no_args_is_help=True, help="KernelFleet: tune kernels for shape distributions, serve the best.")
console = Console()
UrlOpt = Annotated[str | None, typer.Option("--url", envvar="KERNELFLEET_URL", help="API base URL")]


def client_from_env(url: str | None) -> Client:
    """A client with KERNELFLEET_API_KEY, or else the admin key a local standalone saved in its data dir."""
    key = os.environ.get("KERNELFLEET_API_KEY")
    if not key:
        saved = Path(os.environ.get("KERNELFLEET_DATA_DIR", ".kernelfleet")) / "admin.key"
        if saved.is_file():
            key = saved.read_text().strip()
    return Client(url, api_key=key)


def _parse_kv(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, text.split(",")):
        name, _, value = part.partition("=")
        out[name.strip()] = int(value)
    return out


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="JSON job spec (see POST /v1/jobs)")],
    url: UrlOpt = None,
    wait: bool = True,
) -> None:
    """Submit a tuning job from a JSON spec and (by default) wait for it with a progress bar."""
    body = json.loads(spec.read_text())
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


def _print_job(job: Any) -> None:
    console.print(
        f"job {job.id} [bold]{job.state}[/] {job.trials_done}/{job.trials_total} trials"
        + (f" — {job.error}" if job.error else "")
    )
    table = Table()
    for col in ("shape", "state", "trials", "best (µs)", "baseline (µs)", "speedup"):
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
    table = Table("worker", "queues", "last seen")
    for w in st["workers"]:
        table.add_row(w["name"], ",".join(w["queues"]), w["last_seen"][:19])
    console.print(table)


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
        console.print("[yellow]miss[/]: no tuned config; run the default kernel and submit a job for this shape")
        raise typer.Exit(1)
    console.print(f"{rec.kind} config, {rec.latency_s * 1e6:.1f} µs, from job {rec.job_id} {rec.provenance}")


@app.command()
def dispatch(
    workload: Annotated[str, typer.Option(help="workload hash")],
    target: Annotated[str, typer.Option(help="target fingerprint")],
    url: UrlOpt = None,
) -> None:
    """The dispatch table a ukernel job published: intervals, uKernels and how well its model ranked them."""
    fetched = client_from_env(url).dispatch_doc(workload, target)
    assert fetched is not None
    doc = fetched[0]
    console.print(f"{doc.dim} = 1..{doc.s_max} (larger extend the last interval), from job {doc.job_id}")
    for u in doc.ukernels:
        # the service signs the document, which names each artifact by its sha256
        console.print(f"  uKernel {u.id}: {u.size_bytes} B, sha256 {u.sha256[:16]}… (named by the signed document)")
    intervals = doc.table["intervals"]
    console.print(f"{len(intervals)} intervals; first: {intervals[:3]}")
    v = doc.validation
    for key in ("tuning_seconds", "padding_ratio", "rho_dietcode_mean", "rho_sia_mean"):
        if v.get(key) is not None:
            console.print(f"  {key}: {v[key]:.3g}")
    for S, t in sorted(doc.measured_latency_s.items(), key=lambda kv: int(kv[0])):
        console.print(
            f"  {doc.dim}={S}: measured {t * 1e6:.1f} µs, predicted {doc.predicted_latency_s[int(S) - 1] * 1e6:.1f} µs"
        )
    for o in doc.overrides:
        console.print(f"  exact config wins at {doc.dim}={o.S}: {o.latency_s * 1e6:.1f} µs")


fleet_app = typer.Typer(no_args_is_help=True, help="Fleet-wide daily tuning: usage, reports, runs.")
app.add_typer(fleet_app, name="fleet")


@fleet_app.command("usage")
def fleet_usage(days: int = 7, limit: int = 20, url: UrlOpt = None) -> None:
    """Where the fleet's kernel time went over the last days."""
    view = client_from_env(url).fleet_usage(days=days, limit=limit)
    table = Table(title=f"fleet kernel time {view['since']}..{view['until']}: {view['total_seconds']:,.1f} s")
    for col in ("workload", "target", "shape", "calls", "seconds", "share", "fallbacks"):
        table.add_column(col)
    for r in view["rows"]:
        table.add_row(
            r["workload_hash"][:12],
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
    console.print(f"[bold]fleet run {r['day']}[/]: {r['state']} {r.get('error') or ''}")
    console.print(f"fleet kernel time {r['fleet_seconds_per_day']:,.1f} s/day over {r['window_days']} days")
    table = Table(title="candidates, best first")
    for col in ("workload", "kind", "reasons", "observed s/day", "gain", "saving s/day", "trials", "job"):
        table.add_column(col)
    for c in r["candidates"]:
        table.add_row(
            c["workload_hash"][:12],
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
        f"budget {r['budget']}, spent {r['spent']}; expected saving {r['expected_saving_s_per_day']:,.1f} s/day"
    )
    realized = r["realized"]
    if realized.get("jobs"):
        merit = realized.get("savings_per_tuning_s")
        console.print(
            f"earlier runs: {realized['jobs']} jobs saved {realized['saved_s_per_day']:,.1f} s/day for "
            f"{realized['tuning_s']:,.0f} s of tuning (savings ÷ cost = {merit:.3g} per day)"
            if merit is not None
            else f"earlier runs: {realized['jobs']} jobs, no measured saving yet"
        )
    console.print(f"re-measured {r['remeasured']} configs; regressions: {len(r['regressions'])}")
    for g in r["regressions"]:
        console.print(
            f"  [red]{g['workload_hash'][:12]} {g['shape']}: {g['stored_s']:.3g} s → {g['measured_s']:.3g} s[/]"
        )


@fleet_app.command("run")
def fleet_run(
    day: Annotated[str | None, typer.Option(help="ISO date (UTC); default today")] = None, url: UrlOpt = None
) -> None:
    """Queue the daily run now (admin); a day that already ran does nothing."""
    console.print(client_from_env(url).run_fleet(day))


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
    except KernelFleetError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
