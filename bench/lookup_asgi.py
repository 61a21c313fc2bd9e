"""Per-request Python cost of the lookup route on the ASGI app alone: no HTTP server, no network client.

`bench/lookup_load.py` measures what a host sees end to end, but on a 2-core machine shared by the client, two API
workers and PostgreSQL its tails mostly measure CPU scheduling. This calls the FastAPI app in-process, one request
at a time (auth, validation, the store query in the thread pool, signing, serialisation), on the store that
`lookup_load.py` seeded, and reports microseconds per request, median of `--rounds`.

    .venv/bin/python bench/lookup_asgi.py                       # this checkout
    (cd /tmp/wt-before && /work/main/.venv/bin/python /work/main/bench/lookup_asgi.py)   # another checkout's service
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path[:0] = [os.getcwd(), os.path.join(os.getcwd(), "clients", "python"), str(Path(__file__).parent)]


async def _call(app: object, key: str, path: str, query: str) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {key}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    status = {}

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.start":
            status["code"] = message["status"]

    await app(scope, receive, send)  # type: ignore[operator]
    return int(status["code"])


async def _per_request_us(app: object, key: str, make: object, n: int) -> tuple[float, dict[int, int]]:
    for _ in range(200):
        await _call(app, key, *make())  # type: ignore[operator]
    codes: dict[int, int] = {}
    t0 = time.perf_counter()
    for _ in range(n):
        code = await _call(app, key, *make())  # type: ignore[operator]
        codes[code] = codes.get(code, 0) + 1
    return (time.perf_counter() - t0) / n * 1e6, codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/kf_load")
    ap.add_argument("--data-dir", default="/tmp/kf-load")
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ["KERNELFLEET_DATABASE_URL"] = args.pg
    os.environ["KERNELFLEET_DATA_DIR"] = args.data_dir
    os.environ["KERNELFLEET_LOOKUP_RATE_PER_MINUTE"] = "1e9"  # thousands of lookups with one key: no per-key limit

    from service.api import app as app_module
    from service.api.app import create_app
    from service.models.auth import Scope
    from service.store import keys
    from service.store.db import session_scope

    # the workloads and targets lookup_load.py seeded; imported after the service, since lookup_load puts this
    # checkout first on sys.path and the service measured must be the working directory's
    _keys = importlib.import_module("lookup_load")._keys

    app = create_app(run_migrations=False)
    workloads, fps = _keys(100, 10)
    hashes = [w.hash for w in workloads]
    with session_scope() as s:
        key = keys.create(s, "lookup-asgi-bench", [Scope.read]).key
    rng = random.Random(0)

    def best(lo: int, hi: int) -> object:
        return lambda: (
            "/v1/configs/best",
            f"workload={rng.choice(hashes)}&target={rng.choice(fps)}&shape=M={rng.randint(lo, hi)}",
        )

    cases = {
        "GET /healthz": lambda: ("/healthz", ""),
        "best config, hit": best(1, 1000),
        "best config, miss": best(2000, 3000),
    }
    print(f"service from {Path(app_module.__file__).parents[2]}; {args.requests} requests x {args.rounds} rounds")
    for name, make in cases.items():
        runs = [asyncio.run(_per_request_us(app, key, make, args.requests)) for _ in range(args.rounds)]
        print(f"{name:20s} {statistics.median(us for us, _ in runs):7.0f} us/request  {runs[-1][1]}")


if __name__ == "__main__":
    main()
