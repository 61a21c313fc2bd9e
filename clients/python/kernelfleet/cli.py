"""`kernelfleet` command line (typer + rich). Server commands need the kernelfleet-service package."""

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


def _service() -> Any:
    try:
        import service.launch as launch
    except ImportError:
        console.print("[red]server commands need the service package (pip install kernelfleet-service)[/]")
        raise typer.Exit(2) from None
    return launch


def _client(url: str | None) -> Client:
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
def standalone(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: Annotated[int, typer.Option(min=1, max=16)] = 1,
) -> None:
    """Run API + worker(s) + beat in one supervised command (embedded SQLite default, or KERNELFLEET_* URLs)."""
    launch = _service()
    from service.settings import get_settings

    launch.configure_logging()
    settings = get_settings()
    console.print(
        f"store  {settings.resolved_database_url}\nbroker {settings.resolved_broker_url}\n"
        f"API    http://{host}:{port}  (logs in {settings.data_dir / 'logs'})"
    )
    launch.Supervisor(settings, host=host, port=port, workers=workers).run_forever()


@app.command()
def worker(name: str = "worker@%h") -> None:
    """Run one Celery worker for this host's hardware queue (plus `control`)."""
    import os

    launch = _service()
    from service.settings import get_settings

    argv = launch.worker_argv(name, launch.worker_queues(get_settings()))
    os.execv(argv[0], argv)


@app.command()
def api(host: str = "0.0.0.0", port: int = 8000) -> None:
    """Run the API server."""
    import os

    argv = _service().api_argv(host, port)
    os.execv(argv[0], argv)


@app.command()
def beat() -> None:
    """Run Celery beat (the stale-job reaper's schedule)."""
    import os

    launch = _service()
    from service.settings import get_settings

    argv = launch.beat_argv(get_settings())
    os.execv(argv[0], argv)


@app.command()
def migrate() -> None:
    """Create or upgrade the store's schema."""
    _service()
    from service.launch import admin_key_path, bootstrap_admin_key
    from service.settings import get_settings
    from service.store.db import migrate as run

    run()
    console.print("schema is at the newest revision")
    key = bootstrap_admin_key(get_settings())
    if key:
        console.print(f"admin API key (shown once; also saved to {admin_key_path(get_settings())}): {key}")


@app.command()
def demo(
    kind: Annotated[str, typer.Option(help="ukernel (every M in one job) or sketch (per-shape search)")] = "ukernel",
    trials: Annotated[int | None, typer.Option(help="default: 8 uKernels, or 256 sketch trials")] = None,
    port: int = 8765,
) -> None:
    """Start everything on the embedded default, tune a BERT-base dense layer, print the results, stop."""
    _service()
    from service.demo import main

    main(trials=trials, port=port, kind=kind)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="JSON job spec (see POST /v1/jobs)")],
    url: UrlOpt = None,
    wait: bool = True,
) -> None:
    """Submit a tuning job from a JSON spec and (by default) wait for it with a progress bar."""
    body = json.loads(spec.read_text())
    with _client(url) as client:
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
    with _client(url) as client:
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
    with _client(url) as client:
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
    with _client(url) as client:
        _print_job(client.job(job_id))


@app.command()
def best(
    workload: Annotated[str, typer.Option(help="workload hash")],
    target: Annotated[str, typer.Option(help="target fingerprint")],
    shape: Annotated[str, typer.Option(help="e.g. M=61")],
    url: UrlOpt = None,
) -> None:
    """Look up the best config for one concrete shape."""
    with _client(url) as client:
        rec = client.best(workload, target, _parse_kv(shape))
    if rec is None:
        console.print("[yellow]miss[/]: no tuned config; run the default kernel and submit a job for this shape")
        raise typer.Exit(1)
    console.print(f"{rec.kind} config, {rec.latency_s * 1e6:.1f} µs, from job {rec.job_id} {rec.provenance}")


@app.command("import-metaschedule")
def import_metaschedule(
    work_dir: Annotated[
        Path, typer.Argument(help="directory with database_workload.json and database_tuning_record.json")
    ],
    url: UrlOpt = None,
) -> None:
    """Bring an existing MetaSchedule JSON database into the store (workloads matched to the registry)."""
    _service()
    from kernelfleet.client import local_toolchain
    from service.models import Toolchain, Workload
    from service.workers.tuners.metaschedule_io import read_database

    with _client(url) as client:
        workloads = [Workload(**w.model_dump()) for w in client.workloads()]
        records, skipped = read_database(work_dir, workloads, Toolchain(**local_toolchain()))
        result = client.import_configs(records) if records else {"imported": 0, "improved": 0}
    console.print(
        f"imported {result['imported']} records ({result['improved']} improved the store); skipped {len(skipped)}"
    )
    for reason in skipped[:20]:
        console.print(f"  skipped: {reason}")


@app.command("export-metaschedule")
def export_metaschedule(
    out_dir: Path,
    workload: Annotated[str | None, typer.Option(help="workload hash")] = None,
    target: Annotated[str | None, typer.Option(help="target fingerprint")] = None,
    url: UrlOpt = None,
) -> None:
    """Write the store's best configs as a MetaSchedule JSON database for offline use."""
    _service()
    from service.workers.tuners.metaschedule_io import write_database

    with _client(url) as client:
        n = write_database(out_dir, client.configs(workload=workload, target=target))
    console.print(f"wrote {n} records to {out_dir}")


@app.command()
def dispatch(
    workload: Annotated[str, typer.Option(help="workload hash")],
    target: Annotated[str, typer.Option(help="target fingerprint")],
    url: UrlOpt = None,
) -> None:
    """The dispatch table a ukernel job published: intervals, uKernels and how well its model ranked them."""
    fetched = _client(url).dispatch_doc(workload, target)
    assert fetched is not None
    doc = fetched[0]
    console.print(f"{doc.dim} = 1..{doc.s_max} (larger extend the last interval), from job {doc.job_id}")
    for u in doc.ukernels:
        console.print(f"  uKernel {u.id}: {u.size_bytes} B, sha256 {u.sha256[:16]}…, signed: {bool(u.signature)}")
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


fleet_app = typer.Typer(no_args_is_help=True, help="Fleet-wide daily tuning: usage, reports, runs, simulation.")
app.add_typer(fleet_app, name="fleet")


@fleet_app.command("usage")
def fleet_usage(days: int = 7, limit: int = 20, url: UrlOpt = None) -> None:
    """Where the fleet's kernel time went over the last days."""
    view = _client(url).fleet_usage(days=days, limit=limit)
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
    reports = _client(url).fleet_reports(limit=1)
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
    console.print(_client(url).run_fleet(day))


@fleet_app.command("simulate")
def fleet_simulate(
    days: Annotated[int, typer.Option(min=1, max=30)] = 3,
    calls: Annotated[int, typer.Option(min=10, help="timed calls per layer per simulated day")] = 200,
    port: int = 8766,
) -> None:
    """Run the fleet loop for N simulated days on the embedded default and show fleet time falling."""
    _service()
    from service.fleet_sim import main as simulate

    simulate(days=days, calls=calls, port=port)


keys_app = typer.Typer(no_args_is_help=True, help="API keys (needs an admin key).")
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    name: str,
    scope: Annotated[list[str], typer.Option(help="read, telemetry, submit or admin; repeat for several")],
    url: UrlOpt = None,
) -> None:
    """Create a key; its secret is printed once."""
    with _client(url) as client:
        created = client.create_key(name, scope)
    console.print(f"id {created['id']}  scopes {','.join(created['scopes'])}")
    console.print(f"key {created['key']}   (shown once; store it now)")


@keys_app.command("list")
def keys_list(url: UrlOpt = None) -> None:
    """List keys (ids, names, prefixes, scopes; never secrets)."""
    with _client(url) as client:
        table = Table("id", "name", "prefix", "scopes", "created", "revoked")
        for k in client.api_keys():
            table.add_row(
                k["id"],
                k["name"],
                k["prefix"],
                ",".join(k["scopes"]),
                k["created_at"][:19],
                (k["revoked_at"] or "")[:19],
            )
        console.print(table)


@keys_app.command("revoke")
def keys_revoke(key_id: str, url: UrlOpt = None) -> None:
    """Revoke a key (effective on every API process within seconds)."""
    with _client(url) as client:
        revoked = client.revoke_key(key_id)
    console.print(f"revoked {revoked['id']} ({revoked['name']})")


def main() -> None:
    try:
        app()
    except KernelFleetError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
