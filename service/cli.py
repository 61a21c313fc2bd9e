"""Server commands of `kernelfleet`, added to the SDK's CLI through the `kernelfleet.cli` entry point.

The SDK (clients/python) owns the `kernelfleet` command and its client commands; installing this
service package adds what needs the service: running it (standalone, api, worker, beat, migrate, demo),
API keys, MetaSchedule import/export and the fleet simulation.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from kernelfleet.cli import UsageProblem, app, client_from_env, console, fleet_app

UrlOpt = Annotated[str | None, typer.Option("--url", envvar="KERNELFLEET_URL", help="API base URL")]


@contextlib.contextmanager
def refusal_in_one_line() -> Iterator[None]:
    """A supervisor that refused to start (data dir in use, port taken) is an error line and exit status 1."""
    from service.launch import StartRefused

    try:
        yield
    except StartRefused as exc:
        raise UsageProblem(str(exc)) from None


def standalone(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: Annotated[int, typer.Option(min=1, max=16)] = 1,
) -> None:
    """Run API + worker(s) + beat in one supervised command (embedded SQLite default, or KERNELFLEET_* URLs).
    One per data dir: a second on the same KERNELFLEET_DATA_DIR, or one whose port is taken, exits at once."""
    from service import launch
    from service.settings import get_settings

    launch.configure_logging()
    settings = get_settings()
    lock = launch.DataDirLock(settings.data_dir)
    with refusal_in_one_line():
        launch.claim(lock, host, port)  # at once: before the banner, and before the hardware is probed (seconds)
    console.print(
        f"store  {settings.resolved_database_url}\nbroker {settings.resolved_broker_url}\n"
        f"API    http://{host}:{port}  (logs in {settings.data_dir / 'logs'})"
    )
    launch.Supervisor(settings, host=host, port=port, workers=workers, lock=lock).run_forever()


def worker(name: str = "worker@%h") -> None:
    """Run one Celery worker for this host's hardware queue (plus `control`)."""
    from service import launch
    from service.settings import get_settings

    argv = launch.worker_argv(name, launch.worker_queues(get_settings()))
    os.execv(argv[0], argv)


def api(host: str = "0.0.0.0", port: int = 8000) -> None:
    """Run the API server."""
    from service import launch

    argv = launch.api_argv(host, port)
    os.execv(argv[0], argv)


def beat() -> None:
    """Run Celery beat (the stale-job reaper's and the daily fleet run's schedule)."""
    from service import launch
    from service.settings import get_settings

    argv = launch.beat_argv(get_settings())
    os.execv(argv[0], argv)


def migrate() -> None:
    """Create or upgrade the store's schema."""
    from service.launch import admin_key_path, bootstrap_admin_key
    from service.settings import get_settings
    from service.store.db import migrate as run

    run()
    console.print("schema is at the newest revision")
    key = bootstrap_admin_key(get_settings())
    if key:
        console.print(f"admin API key (shown once; also saved to {admin_key_path(get_settings())}): {key}")


def demo(
    kind: Annotated[
        str | None, typer.Option(help="job kind (default: the one that covers every shape in one job)")
    ] = None,
    trials: Annotated[int | None, typer.Option(help="default: the kind's own default budget")] = None,
    port: int = 8765,
    keep: Annotated[bool, typer.Option(help="keep the temporary store, broker and logs afterwards")] = False,
) -> None:
    """Start everything on the embedded default, tune a BERT-base dense layer, print the results, stop."""
    from service.demo import main

    with refusal_in_one_line():
        main(trials=trials, port=port, kind=kind, keep=keep)


IMPORT_DEADLINE_S = 120.0


def import_metaschedule(
    work_dir: Annotated[
        Path, typer.Argument(help="directory with database_workload.json and database_tuning_record.json")
    ],
    url: UrlOpt = None,
) -> None:
    """Bring an existing MetaSchedule JSON database into the store (workloads matched to the registry)."""
    from kernelfleet.client import local_toolchain
    from service.models import Toolchain, Workload
    from service.tuning.tuners.metaschedule_io import read_database

    # the service loads every trace in a TVM process before it answers (the first import also starts it)
    with client_from_env(url, deadline_s=IMPORT_DEADLINE_S) as client:
        workloads = [Workload(**w.model_dump()) for w in client.workloads()]
        records, skipped = read_database(work_dir, workloads, Toolchain(**local_toolchain()))
        result = client.import_configs(records) if records else {"imported": 0, "improved": 0}
    console.print(
        f"imported {result['imported']} records ({result['improved']} improved the store); skipped {len(skipped)}"
    )
    for reason in skipped[:20]:
        console.print(f"  skipped: {reason}")


def export_metaschedule(
    out_dir: Path,
    workload: Annotated[str | None, typer.Option(help="workload hash")] = None,
    target: Annotated[str | None, typer.Option(help="target fingerprint")] = None,
    url: UrlOpt = None,
) -> None:
    """Write the store's best configs as a MetaSchedule JSON database for offline use."""
    from service.tuning.tuners.metaschedule_io import write_database

    with client_from_env(url) as client:
        n = write_database(out_dir, client.configs(workload=workload, target=target))
    console.print(f"wrote {n} records to {out_dir}")


def fleet_simulate(
    days: Annotated[int, typer.Option(min=1, max=30)] = 3,
    requests: Annotated[int, typer.Option(min=10, help="sampled requests (forward passes) served per day")] = 200,
    fleet_calls: Annotated[
        int, typer.Option(min=1, help="production calls of the served layers per day the sample stands for")
    ] = 1_000_000,
    layers: Annotated[int, typer.Option(min=1, help="distinct dense layers served, the largest FLOP shares")] = 5,
    quick: Annotated[bool, typer.Option(help="40 requests/day, the top 2 layers, one tuning job per day")] = False,
    runs: Annotated[int, typer.Option(min=1, max=10, help="independent runs (fresh store, other traffic seed)")] = 1,
    holdout: Annotated[int, typer.Option(min=2, help="hosts run 1 call in this many on their baseline")] = 2,
    port: int = 8766,
) -> None:
    """Run the fleet loop for N simulated days on BERT-base and GPT-2 small's dense layers: savings measured by the
    hosts' A/B holdout with their interval, tables rolled back, tuning cost; with --runs, the spread across runs."""
    from service.fleet_sim import main as simulate

    with refusal_in_one_line():
        simulate(days=days, requests=requests, fleet_calls=fleet_calls, layers=layers, quick=quick, port=port,
                 runs=runs, holdout=holdout)  # fmt: skip


keys_app = typer.Typer(no_args_is_help=True, help="API keys (needs an admin key).")


@keys_app.command("create")
def keys_create(
    name: str,
    scope: Annotated[list[str], typer.Option(help="read, telemetry, submit or admin; repeat for several")],
    url: UrlOpt = None,
) -> None:
    """Create a key; its secret is printed once."""
    with client_from_env(url) as client:
        created = client.create_key(name, scope)
    console.print(f"id {created['id']}  scopes {','.join(created['scopes'])}")
    console.print(f"key {created['key']}   (shown once; store it now)")


@keys_app.command("list")
def keys_list(url: UrlOpt = None) -> None:
    """List keys (ids, names, prefixes, scopes; never secrets)."""
    from rich.table import Table

    with client_from_env(url) as client:
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
    with client_from_env(url) as client:
        revoked = client.revoke_key(key_id)
    console.print(f"revoked {revoked['id']} ({revoked['name']})")


_registered: set[int] = set()


def register(target: typer.Typer) -> None:
    """The `kernelfleet.cli` entry point: add the server commands to the SDK's app (once per app)."""
    if id(target) in _registered:
        return
    _registered.add(id(target))
    for command in (standalone, api, worker, beat, migrate, demo):
        target.command()(command)
    target.command("import-metaschedule")(import_metaschedule)
    target.command("export-metaschedule")(export_metaschedule)
    target.add_typer(keys_app, name="keys")
    fleet_app.command("simulate")(fleet_simulate)


register(app)  # `from service.cli import app`: the whole command line, client and server commands
