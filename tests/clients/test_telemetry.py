"""The SDK's background telemetry against the real API (embedded store): batched, idempotent, bounded."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelfleet import Client
from kernelfleet.dispatcher import Dispatcher
from tests.helpers import Fleet, free_port

META = {"workload_hash": "ab" * 16, "target_fingerprint": "cd" * 16, "dim": "M"}


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Client]:
    fleet = Fleet(tmp_path / "fleet", {})
    fleet.start_api()
    client = fleet.client()
    key = client.create_key("host", ["telemetry", "read"])["key"]
    yield Client(fleet.url, api_key=key)
    fleet.stop()


def _serve(d: Dispatcher, shapes: list[int]) -> None:
    w = np.ones((8, 4), np.float32)
    for s in shapes:
        d(np.ones((s, 4), np.float32), w)


def test_usage_reaches_the_fleet_view_once(api: Client) -> None:
    d = Dispatcher(None, {}, N=None, K=None, source="fallback", meta=META)
    reporter = api.telemetry_reporter(interval_s=0.2, host="test").start()
    reporter.watch(d)
    _serve(d, [3, 3, 5])
    deadline = time.monotonic() + 10
    while reporter.sent == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    _serve(d, [3])
    reporter.close()  # flushes the rest
    rows = {r["shape"]["M"]: r for r in api.fleet_usage(days=1)["rows"]}
    assert rows[3]["calls"] == 3 and rows[3]["fallbacks"] == 3 and rows[5]["calls"] == 1
    assert rows[3]["kernel_seconds"] > 0 and reporter.pending == 0 and reporter.dropped == 0


def test_an_unreachable_service_costs_inference_nothing_and_memory_stays_bounded() -> None:
    down = Client(f"http://127.0.0.1:{free_port()}", retries=0, timeout=0.5)
    reporter = down.telemetry_reporter(interval_s=3600, max_batches=3)
    d = reporter.watch(Dispatcher(None, {}, N=None, K=None, source="fallback", meta=META))
    for i in range(5):
        _serve(d, [i + 1])
        t0 = time.monotonic()
        assert reporter.flush() is False  # never raises
        assert time.monotonic() - t0 < 5
    assert reporter.pending == 3 and reporter.dropped == 2  # oldest dropped first
    with pytest.raises(ValueError, match="meta"):
        reporter.watch(Dispatcher(None, {}, N=None, K=None))
