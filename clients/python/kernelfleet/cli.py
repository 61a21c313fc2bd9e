"""`kernelfleet` command line (typer + rich). Server commands need the kernelfleet-service package."""

from __future__ import annotations

import json
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
    from service.store.db import migrate as run

    run()
    console.print("schema is at the newest revision")


@app.command()
def demo(trials: int = 128, port: int = 8765) -> None:
    """Start everything on the embedded default, tune a BERT-base dense layer, print the results, stop."""
    _service()
    from service.demo import main

    main(trials=trials, port=port)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="JSON job spec (see POST /v1/jobs)")],
    url: UrlOpt = None,
    wait: bool = True,
) -> None:
    """Submit a tuning job from a JSON spec and (by default) wait for it with a progress bar."""
    body = json.loads(spec.read_text())
    with Client(url) as client:
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
    with Client(url) as client:
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
def job(job_id: str, url: UrlOpt = None) -> None:
    """Show one job with its per-shape results."""
    with Client(url) as client:
        _print_job(client.job(job_id))


@app.command()
def best(
    workload: Annotated[str, typer.Option(help="workload hash")],
    target: Annotated[str, typer.Option(help="target fingerprint")],
    shape: Annotated[str, typer.Option(help="e.g. M=61")],
    url: UrlOpt = None,
) -> None:
    """Look up the best config for one concrete shape."""
    with Client(url) as client:
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

    with Client(url) as client:
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

    with Client(url) as client:
        n = write_database(out_dir, client.configs(workload=workload, target=target))
    console.print(f"wrote {n} records to {out_dir}")


def main() -> None:
    try:
        app()
    except KernelFleetError as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
