"""Best-config lookup load against the API over a PostgreSQL store holding 1,000,000 config records.

For each concurrency level, the same asyncio client drives (a) `GET /v1/configs/best` on random keys
(b) `POST /v1/configs/best/batch` with 16 keys, and (c) a plain Redis GET of a value of the same size
as the floor a cache would give. Reports throughput and p50/p99 latency, measured client-side.

    .venv/bin/python bench/lookup_load.py                     # defaults: 1M records, levels 1,4,16,64
    .venv/bin/python bench/lookup_load.py --records 100000 --seconds 5

The API runs as `uvicorn --workers 2` (one per core) in a child process; the client shares the machine,
so the numbers are what one 2-core box does end to end, not a server-only figure.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import redis.asyncio as aioredis
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from service.models import TargetSpec, WorkloadSpec, shape_key  # noqa: E402
from service.store.db import migrate  # noqa: E402

CONFIG = {"format": "metaschedule-trace", "trace": [[["GetSBlock", [], ["Y", "main"], ["b0"]]], []] * 20}


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


async def _drive(concurrency: int, seconds: float, call: Any) -> dict[str, float]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            ok = await call()
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


async def run_levels(
    api: str, key: str, redis_url: str, wh: list[str], fps: list[str], n_shapes: int, levels: list[int], seconds: float
) -> list[dict[str, Any]]:
    rng = random.Random(0)
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
    rows = []
    async with httpx.AsyncClient(base_url=api, headers=headers, limits=limits, timeout=30) as http:
        sample = (
            await http.get("/v1/configs/best", params={"workload": wh[0], "target": fps[0], "shape": "M=1"})
        ).content
        r = aioredis.Redis.from_url(redis_url)
        await r.set("kf-bench-config", sample)

        async def lookup() -> bool:
            resp = await http.get(
                "/v1/configs/best",
                params={
                    "workload": rng.choice(wh),
                    "target": rng.choice(fps),
                    "shape": f"M={rng.randint(1, n_shapes)}",
                },
            )
            return resp.status_code == 200

        async def batch() -> bool:
            keys = [
                {"workload": rng.choice(wh), "target": rng.choice(fps), "shape": {"M": rng.randint(1, n_shapes)}}
                for _ in range(16)
            ]
            resp = await http.post("/v1/configs/best/batch", json={"keys": keys})
            return resp.status_code == 200

        async def redis_get() -> bool:
            return await r.get("kf-bench-config") is not None

        for c in levels:
            for name, call in (
                ("redis GET (floor)", redis_get),
                ("GET /v1/configs/best", lookup),
                ("POST /v1/configs/best/batch ×16", batch),
            ):
                stats = await _drive(c, seconds, call)
                rows.append({"concurrency": c, "what": name, **stats})
                print(
                    f"c={c:3d} {name:32s} {stats['rps']:8.0f} req/s  p50 {stats['p50_ms']:7.2f} ms  "
                    f"p99 {stats['p99_ms']:7.2f} ms  errors {stats['errors']}",
                    flush=True,
                )
        await r.aclose()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/kf_load")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/14")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--levels", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "lookup_load.md"))
    args = ap.parse_args()

    admin = create_engine(args.pg.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        db = args.pg.rsplit("/", 1)[1]
        if not conn.execute(text("SELECT 1 FROM pg_database WHERE datname=:d"), {"d": db}).scalar():
            conn.execute(text(f'CREATE DATABASE "{db}"'))
    admin.dispose()
    wh, fps, n_shapes = populate(args.pg, args.records)

    from service.models.auth import Scope
    from service.store import keys
    from service.store.db import session_scope

    with session_scope(args.pg) as s:
        key = keys.create(s, "load-bench", [Scope.read]).key
    port = 18000 + os.getpid() % 1000
    env = {
        **os.environ,
        "KERNELFLEET_DATABASE_URL": args.pg,
        "KERNELFLEET_BROKER_URL": args.redis,
        "KERNELFLEET_DATA_DIR": "/tmp/kf-load",
    }
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
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        levels = [int(x) for x in args.levels.split(",")]
        rows = asyncio.run(run_levels(url, key, args.redis, wh, fps, n_shapes, levels, args.seconds))
    finally:
        api.terminate()
        api.wait(20)

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "?")
    out = io.StringIO()
    out.write(
        f"Lookup load, {args.records:,} config records in PostgreSQL; API `uvicorn --workers 2`; client: one "
        f"asyncio process on the same machine ({cpu}, {os.cpu_count()} cores, {platform.python_version()}); "
        f"{args.seconds:.0f} s per cell; `python bench/lookup_load.py`.\n\n"
    )
    out.write("| concurrency | what | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|\n")
    for r in rows:
        out.write(
            f"| {r['concurrency']} | {r['what']} | {r['rps']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
            f"{r['errors']} |\n"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(out.getvalue())
    print(out.getvalue())
    plain = [r["p50_ms"] for r in rows if r["what"].startswith("GET")]
    print(f"median p50 of plain lookups: {statistics.median(plain):.2f} ms")


if __name__ == "__main__":
    main()
