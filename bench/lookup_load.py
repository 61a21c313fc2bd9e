"""Lookup load against the API over a PostgreSQL store: best configs (1,000,000 records) and dispatch tables.

For each concurrency level, the same asyncio client drives, one after the other:
  (a) a plain Redis GET of a value the size of a best-config answer: the floor a cache would give;
  (b) `GET /v1/configs/best` on random keys;
  (c) `POST /v1/configs/best/batch` with 16 keys;
  (d) `GET /v1/dispatch?workload=&target=` on random tables: the full document (200);
  (e) the same request with `If-None-Match: <ETag of a first fetch>`: the revalidation an SDK does (304).
Reports throughput and p50/p99 latency, measured client-side.

The dispatch tables (`--tables`, default 300) reuse ONE real artifact set: a `UKernelTuner.tune` run
on dense N=64, K=32, S=1..128 with at most 3 uKernels for this host's target, signed with the service's key
and published through `service.store.dispatch.publish` under distinct dense workloads (N = 64, then other
multiples of 8; K=32). The tuning runs once, only when some table is missing from the store. Finally the SDK
loads a `Dispatcher` from the N=64 table through the API and `kernelfleet.dispatcher.dispatch_overhead_s`
measures what a cached dispatch costs per call (selection and bookkeeping, no network; goal <= 5 us).

    .venv/bin/python bench/lookup_load.py                     # defaults: 1M records, 300 tables, levels 1,4,16,64
    .venv/bin/python bench/lookup_load.py --records 100000 --seconds 5
    .venv/bin/python bench/lookup_load.py --pg postgresql+psycopg://postgres@127.0.0.1:5432/kf_load_smoke \\
        --data-dir /tmp/kf-load-smoke --records 1000 --tables 20 --levels 1,4 --seconds 1 --out /tmp/ll.md  # smoke

The API runs as `uvicorn --workers 2` (one per core) in a child process; the client shares the machine,
so the numbers are what one 2-core box does end to end, not a server-only figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import redis.asyncio as aioredis
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.models import TargetSpec, WorkloadSpec, shape_key  # noqa: E402
from service.store.db import migrate  # noqa: E402

CONFIG = {"format": "metaschedule-trace", "trace": [[["GetSBlock", [], ["Y", "main"], ["b0"]]], []] * 20}

# The one real uKernel job every seeded dispatch table reuses.
DISPATCH_N, DISPATCH_K, S_MAX, MAX_UKERNELS = 64, 32, 128, 3
VALIDATE = [128, 97, 61, 16, 1]  # measured shapes, heaviest first
SDK_SHAPES = [1, 16, 61, 128, 200]  # 200 lies past s_max: the table's extension

FLOOR = "redis GET (floor)"
CONFIG_GET = "GET /v1/configs/best"
CONFIG_BATCH = "POST /v1/configs/best/batch ×16"
DISPATCH_GET = "GET /v1/dispatch (200, full)"
DISPATCH_304 = "GET /v1/dispatch If-None-Match (304)"


def _keys(n_workloads: int, n_targets: int) -> tuple[list[WorkloadSpec], list[str]]:
    workloads = [
        WorkloadSpec(op="dense", dims={"N": 64 * (i + 1), "K": 768}, symbolic=["M"]) for i in range(n_workloads)
    ]
    targets = [
        TargetSpec.model_validate(
            {"kind": "llvm", "mcpu": "znver4", "num_cores": c + 1, "toolchain": {"tvm": "0.27.0.post1"}}
        )
        for c in range(n_targets)
    ]
    return workloads, [t.fingerprint for t in targets]


def populate(url: str, records: int) -> tuple[list[str], list[str], int]:
    """Fill best_configs with `records` rows (100 workloads × 10 targets × shapes) unless already there."""
    n_shapes = max(1, records // 1000)
    workloads, fps = _keys(100, 10)
    wh = [w.hash for w in workloads]
    migrate(url)
    engine = create_engine(url)
    with engine.begin() as conn:
        have = conn.execute(text("SELECT count(*) FROM best_configs")).scalar_one()
    if have < records:
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE best_configs"))
            for w in workloads:
                conn.execute(
                    text(
                        "INSERT INTO workloads (workload_hash, op, spec, created_at) VALUES "
                        "(:h, 'dense', :s, now()) ON CONFLICT DO NOTHING"
                    ),
                    {"h": w.hash, "s": json.dumps(w.canonical())},
                )
        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            blob = json.dumps(CONFIG)
            with cur.copy(
                "COPY best_configs (workload_hash, target_fingerprint, shape_key, shape, latency_s, kind, "
                "config, provenance, job_id, created_at, updated_at) FROM STDIN"
            ) as copy:
                for h in wh:
                    for fp in fps:
                        for m in range(1, n_shapes + 1):
                            copy.write_row(
                                (
                                    h,
                                    fp,
                                    shape_key({"M": m}),
                                    json.dumps({"M": m}),
                                    1e-4 + m * 1e-7,
                                    "sketch",
                                    blob,
                                    "{}",
                                    None,
                                    "2026-01-01",
                                    "2026-01-01",
                                )
                            )
            raw.commit()
        finally:
            raw.close()
        with engine.begin() as conn:
            conn.execute(text("ANALYZE best_configs"))
        print(f"loaded {records} records in {time.perf_counter() - t0:.1f} s")
    engine.dispose()
    return wh, fps, n_shapes


def _dispatch_workloads(n: int) -> list[WorkloadSpec]:
    """N=64 first (the workload the artifacts were tuned for), then other multiples of 8."""
    ns = [DISPATCH_N] + [8 * i for i in range(1, n + 1) if 8 * i != DISPATCH_N]
    return [WorkloadSpec(op="dense", dims={"N": N, "K": DISPATCH_K}, symbolic=["M"]) for N in ns[:n]]


def _tune_once(target: TargetSpec, work_dir: Path) -> Any:
    from service.tuning.tuners.ukernel.tuner import QuietRangeSink, RangeTask, UKernelTuner

    spec = WorkloadSpec(op="dense", dims={"N": DISPATCH_N, "K": DISPATCH_K}, symbolic=["M"])
    task = RangeTask(spec, S_MAX, VALIDATE, target, MAX_UKERNELS, work_dir)
    return UKernelTuner().tune(task, QuietRangeSink())


def populate_dispatch(url: str, n_tables: int, data_dir: Path) -> tuple[list[str], str]:
    """Publish `n_tables` dispatch tables (one per workload) for this host's target unless already there."""
    from sqlalchemy import select

    from service.store import catalog
    from service.store import dispatch as dispatch_store
    from service.store.db import session_scope
    from service.store.tables import DispatchTableRow
    from service.tuning.hardware import host_target
    from service.tuning.kinds.ukernel import artifacts_of, validation_record

    target = host_target()
    fp = target.fingerprint
    workloads = _dispatch_workloads(n_tables)
    with session_scope(url) as s:
        catalog.put_target(s, target)
        have = set(s.scalars(select(DispatchTableRow.workload_hash).where(DispatchTableRow.target_fingerprint == fp)))
    missing = [w for w in workloads if w.hash not in have]
    if missing:
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="kf-load-ukernels-") as tmp:
            out = _tune_once(target, Path(tmp))
            arts = artifacts_of(out)
        tuned = time.perf_counter() - t0
        validation = validation_record(out, "lookup-load bench")
        with session_scope(url) as s:
            for w in missing:
                dispatch_store.publish(
                    s,
                    workload_hash=catalog.put_workload(s, w).workload_hash,
                    target_fingerprint=fp,
                    dim="M",
                    table=out.table.to_dict(),
                    artifacts=arts,
                    predicted=out.predicted_s,
                    measured=out.measured_s,
                    validation=validation,
                    job_id=None,
                )
        print(
            f"tuned {len(arts)} uKernels in {tuned:.1f} s; published {len(missing)} dispatch tables "
            f"in {time.perf_counter() - t0 - tuned:.1f} s",
            flush=True,
        )
    return [w.hash for w in workloads], fp


class RawHTTP:
    """A minimal HTTP/1.1 keep-alive client (one connection per concurrent caller), so the load generator spends
    ~50 µs per request instead of httpx's ~1 ms: with httpx the single client process saturates its core at
    concurrency 16 and its own queue becomes most of the latency measured. Answers with Content-Length only
    (all the API sends here)."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        host, _, port = base_url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port or 80)
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, **headers}.items())
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def request(self, method: str, path: str, body: bytes = b"", headers: str = "") -> tuple[int, bytes]:
        extra = f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n" if body else ""
        message = f"{method} {path} HTTP/1.1\r\n{self.fixed}{extra}{headers}\r\n".encode() + body
        while self.idle:  # the server closes keep-alive connections idle past its timeout: take a live one
            conn = self.idle.pop()
            try:
                return await self._exchange(conn, message)
            except (asyncio.IncompleteReadError, ConnectionError):
                conn[1].close()
        return await self._exchange(await asyncio.open_connection(self.host, self.port), message)

    async def _exchange(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], message: bytes
    ) -> tuple[int, bytes]:
        reader, writer = conn
        writer.write(message)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        payload = await reader.readexactly(length) if length else b""
        self.idle.append(conn)
        return status, payload

    async def close(self) -> None:
        for _, writer in self.idle:
            writer.close()


async def _drive(concurrency: int, seconds: float, call: Any) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                ok = await call()
            except (httpx.TransportError, OSError, asyncio.IncompleteReadError):
                ok = False  # counted as an error (a connection the server closed mid-run), not a crash
            latencies.append(time.perf_counter() - t0)
            errors += not ok

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3  # noqa: E731
    return {
        "rps": len(latencies) / elapsed,
        "p50_ms": pick(0.50),
        "p99_ms": pick(0.99),
        "errors": errors,
        "n": len(latencies),
    }


CELLS = {
    "floor": FLOOR,
    "best": CONFIG_GET,
    "batch": CONFIG_BATCH,
    "dispatch": DISPATCH_GET,
    "revalidate": DISPATCH_304,
}


async def run_levels(
    apis: dict[str, str],
    key: str,
    redis_url: str,
    wh: list[str],
    fps: list[str],
    n_shapes: int,
    dispatch_wh: list[str],
    dispatch_fp: str,
    levels: list[int],
    seconds: float,
    clients: list[str],
    cells: list[str],
    rounds: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every cell (client, concurrency, request) is driven `rounds` times against each API in turn, interleaved, so
    a load that comes and goes on the machine hits every API alike; each row holds the medians over the rounds."""
    rng = random.Random(0)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
    async with contextlib.AsyncExitStack() as stack:
        https = {
            label: await stack.enter_async_context(
                httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30)
            )
            for label, url in apis.items()
        }
        raws = {label: RawHTTP(url, headers) for label, url in apis.items()}
        http0 = next(iter(https.values()))
        sample = (
            await http0.get("/v1/configs/best", params={"workload": wh[0], "target": fps[0], "shape": "M=1"})
        ).content
        r = aioredis.Redis.from_url(redis_url)
        await r.set("kf-bench-config", sample)
        etags: dict[str, str] = {}  # the first fetch of every table, as an SDK's cache would hold
        sizes = []
        for h in dispatch_wh:
            resp = await http0.get("/v1/dispatch", params={"workload": h, "target": dispatch_fp})
            resp.raise_for_status()
            etags[h] = resp.headers["ETag"]
            sizes.append(len(resp.content))
        doc_info = {
            "tables": len(dispatch_wh),
            "config_bytes": len(sample),
            "doc_bytes": statistics.median(sizes),
            "target": dispatch_fp,
        }

        def calls(label: str, client: str) -> dict[str, Any]:
            http, raw = https[label], (raws[label] if client == "raw" else None)

            async def get(path: str, params: dict[str, str], extra: dict[str, str] | None = None) -> tuple[int, int]:
                if raw is not None:
                    lines = "".join(f"{k}: {v}\r\n" for k, v in (extra or {}).items())
                    status, body = await raw.request("GET", f"{path}?{urlencode(params)}", headers=lines)
                    return status, len(body)
                resp = await http.get(path, params=params, headers=extra or {})
                return resp.status_code, len(resp.content)

            async def post(path: str, payload: Any) -> int:
                if raw is not None:
                    return (await raw.request("POST", path, json.dumps(payload).encode()))[0]
                return (await http.post(path, json=payload)).status_code

            async def lookup() -> bool:
                shape = f"M={rng.randint(1, n_shapes)}"
                params = {"workload": rng.choice(wh), "target": rng.choice(fps), "shape": shape}
                return (await get("/v1/configs/best", params))[0] == 200

            async def batch() -> bool:
                keys = [
                    {"workload": rng.choice(wh), "target": rng.choice(fps), "shape": {"M": rng.randint(1, n_shapes)}}
                    for _ in range(16)
                ]
                return await post("/v1/configs/best/batch", {"keys": keys}) == 200

            async def redis_get() -> bool:
                return await r.get("kf-bench-config") is not None

            async def dispatch_full() -> bool:
                status, size = await get("/v1/dispatch", {"workload": rng.choice(dispatch_wh), "target": dispatch_fp})
                return status == 200 and size > 0

            async def dispatch_revalidate() -> bool:
                h = rng.choice(dispatch_wh)
                status, _ = await get(
                    "/v1/dispatch", {"workload": h, "target": dispatch_fp}, {"If-None-Match": etags[h]}
                )
                return status == 304

            return {
                FLOOR: redis_get,
                CONFIG_GET: lookup,
                CONFIG_BATCH: batch,
                DISPATCH_GET: dispatch_full,
                DISPATCH_304: dispatch_revalidate,
            }

        results: dict[tuple[str, str, int, str], list[dict[str, float]]] = {}
        for client in clients:
            for c in levels:
                for name in (CELLS[cell] for cell in cells):
                    for _ in range(rounds):
                        for label in apis:
                            stats = await _drive(c, seconds, calls(label, client)[name])
                            results.setdefault((label, client, c, name), []).append(stats)
                            print(
                                f"{label:8s} {client:5s} c={c:3d} {name:38s} {stats['rps']:8.0f} req/s  "
                                f"p50 {stats['p50_ms']:7.2f} ms  p99 {stats['p99_ms']:7.2f} ms  "
                                f"errors {stats['errors']}",
                                flush=True,
                            )
        await r.aclose()
        for raw in raws.values():
            await raw.close()
    rows = [
        {
            "api": label,
            "client": client,
            "concurrency": c,
            "what": name,
            **{m: statistics.median(s[m] for s in runs) for m in ("rps", "p50_ms", "p99_ms")},
            "errors": sum(s["errors"] for s in runs),
        }
        for (label, client, c, name), runs in results.items()
    ]
    return rows, doc_info


def sdk_overhead(api: str, key: str, workload: str, target: str) -> dict[str, Any]:
    """Load a Dispatcher through the SDK (fetch, verify, load), then time its cached per-call dispatch."""
    import numpy as np

    from kernelfleet import Client
    from kernelfleet.dispatcher import dispatch_overhead_s

    with tempfile.TemporaryDirectory(prefix="kf-load-sdk-") as cache, Client(api, api_key=key, retries=0) as client:
        t0 = time.perf_counter()
        d = client.dispatcher(workload, target, cache_dir=Path(cache))
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        client.dispatcher(workload, target, cache_dir=Path(cache))  # 304 and the artifacts from disk
        warm = time.perf_counter() - t0
        w = np.ones((d.N or DISPATCH_N, d.K or DISPATCH_K), dtype=d.dtype)
        per_s = {S: dispatch_overhead_s(d, S, w) for S in SDK_SHAPES}
        programs = {S: " + ".join(f"{p.rows}@{p.ukernel_id}" for p in d.program(S)) or "-" for S in SDK_SHAPES}
    return {
        "source": d.source,
        "ukernels": sorted(d.kernels),
        "cold_load_s": cold,
        "revalidated_load_s": warm,
        "per_s": per_s,
        "programs": programs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/kf_load")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--tables", type=int, default=300, help="dispatch tables (distinct workloads) to publish")
    ap.add_argument("--data-dir", default="/tmp/kf-load", help="the API's data dir (holds the signing key)")
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lookup_load.md"))
    ap.add_argument("--clients", default="raw,httpx", help="load generators, each run at every level: raw, httpx")
    ap.add_argument("--cells", default=",".join(CELLS), help=f"requests to drive, of {', '.join(CELLS)}")
    ap.add_argument("--rounds", type=int, default=1, help="repeats of every cell (rows hold the medians)")
    ap.add_argument(
        "--api-trees",
        default="",
        help="LABEL=DIR,... : run the API from each checkout in turn (e.g. before=/tmp/wt-before,after=.)",
    )
    args = ap.parse_args()

    admin = create_engine(args.pg.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        db = args.pg.rsplit("/", 1)[1]
        if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname=:d"), {"d": db}).scalar():
            conn.execute(text(f'CREATE DATABASE "{db}"'))
    admin.dispose()
    wh, fps, n_shapes = populate(args.pg, args.records)
    dispatch_wh, dispatch_fp = populate_dispatch(args.pg, args.tables, Path(args.data_dir))

    from service.models.auth import Scope
    from service.store import keys
    from service.store.db import session_scope

    with session_scope(args.pg) as s:
        key = keys.create(s, "load-bench", [Scope.read]).key
    levels = [int(x) for x in args.levels.split(",")]
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    trees = [t.partition("=") for t in args.api_trees.split(",")] if args.api_trees else [("this tree", "", "")]
    started = [(label, *start_api(args, tree, i)) for i, (label, _, tree) in enumerate(trees)]
    try:
        rows, doc = asyncio.run(
            run_levels(
                {label: url for label, url, _ in started},
                key,
                args.redis,
                wh,
                fps,
                n_shapes,
                dispatch_wh,
                dispatch_fp,
                levels,
                args.seconds,
                clients,
                cells,
                args.rounds,
            )
        )
        sdk = sdk_overhead(started[-1][1], key, dispatch_wh[0], dispatch_fp)
    finally:
        for _, _, api in started:
            api.terminate()
            api.wait(20)

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    out = io.StringIO()
    out.write(
        f"Lookup load, {args.records:,} config records and {doc['tables']} dispatch tables in PostgreSQL; API "
        f"`uvicorn --workers 2`; client: one asyncio process on the same machine ({cpu}, {os.cpu_count()} cores, "
        f"{platform.python_version()}); {args.seconds:g} s per cell, each cell {args.rounds}× per API, interleaved, "
        "medians; "
        f"`python bench/lookup_load.py "
        f"{' '.join(sys.argv[1:])}`.\n\n"
        f"Dispatch tables: one real `ukernel` result (dense N={DISPATCH_N}, K={DISPATCH_K}, S=1..{S_MAX}, "
        f"{len(sdk['ukernels'])} uKernels: {', '.join(sdk['ukernels'])}) published under {doc['tables']} distinct "
        f"workloads for target `{doc['target'][:16]}…`; a full document is {doc['doc_bytes']:,.0f} bytes "
        f"(a best config {doc['config_bytes']:,} bytes, also the Redis value). The 304 cells send the ETag of a "
        f"first fetch of the same table, as the SDK does.\n\n"
    )
    out.write(
        "Clients: `raw` is a minimal HTTP/1.1 keep-alive client (about 50 µs of client CPU a request), `httpx` the "
        "SDK's HTTP library (about 1 ms: at concurrency 16 the one client process saturates its core and its own "
        "queue becomes most of what is measured).\n\n"
    )
    out.write(
        "| API | client | concurrency | what | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|---|---|\n"
    )
    for r in rows:
        out.write(
            f"| {r['api']} | {r['client']} | {r['concurrency']} | {r['what']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['errors']} |\n"
        )
    worst = max(sdk["per_s"].values())
    out.write(
        f"\nSDK cached dispatch (`kernelfleet.dispatcher.dispatch_overhead_s`: program selection, packed-W "
        f"lookup and usage bookkeeping per call, no network, no kernel), Dispatcher loaded through the API from "
        f"the N={DISPATCH_N} table (source `{sdk['source']}`; first load {sdk['cold_load_s'] * 1e3:.0f} ms, "
        f"revalidated load {sdk['revalidated_load_s'] * 1e3:.0f} ms):\n\n"
        "| S | µs per call | program |\n|---|---|---|\n"
    )
    for S, t in sdk["per_s"].items():
        out.write(f"| {S} | {t * 1e6:.2f} | {sdk['programs'][S]} |\n")
    out.write(f"\nGoal ≤ 5 µs per call: {'met' if worst <= 5e-6 else 'NOT met'} (worst {worst * 1e6:.2f} µs).\n")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(out.getvalue())
    print(out.getvalue())
    for what in (CONFIG_GET, DISPATCH_GET, DISPATCH_304):
        p50 = [r["p50_ms"] for r in rows if r["what"] == what]
        if p50:
            print(f"median p50 of {what}: {statistics.median(p50):.2f} ms")


def start_api(args: argparse.Namespace, tree: str, index: int = 0) -> tuple[str, subprocess.Popen[bytes]]:
    """`uvicorn --workers 2` on this checkout's service, or on the one in `tree` (e.g. a worktree of an older
    commit, for a before/after comparison in one run against the same store)."""
    port = 18000 + (os.getpid() + 7 * index) % 1000
    env = {
        **os.environ,
        "KERNELFLEET_DATABASE_URL": args.pg,
        "KERNELFLEET_BROKER_URL": args.redis,
        "KERNELFLEET_DATA_DIR": args.data_dir,
        "KERNELFLEET_LOOKUP_RATE_PER_MINUTE": "1e9",  # the bench measures throughput: one key, no per-key limit
    }
    if tree:
        root = Path(tree).resolve()
        env["PYTHONPATH"] = f"{root}:{root / 'clients' / 'python'}"
    api = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "service.api.app:app",
            "--port",
            str(port),
            "--workers",
            "2",
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    return url, api


if __name__ == "__main__":
    main()
