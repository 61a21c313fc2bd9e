"""Reporting what the inference host ran, in the background, without ever slowing or failing a call.

A `TelemetryReporter` watches dispatchers. Every `interval_s` its thread takes each dispatcher's usage
since the last report (calls, kernel seconds, fallbacks per S) and queues one batch with a fresh id.
Batches are sent oldest first; a batch that fails for a transient reason (unreachable, 5xx, 429) stays
queued and is resent with the same id (the service counts a batch id once); one the service refuses
(another 4xx) is dropped and counted, so it cannot block the queue. The queue is bounded: under
pressure (service down for long) the oldest batches are dropped and counted in `dropped`. Inference
calls never touch the network.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import Any, Protocol

from kernelfleet.dispatcher import Dispatcher
from kernelfleet.errors import KernelFleetError

log = logging.getLogger(__name__)
# ~200 bytes a record: 2,000 records stay far below the service's 1 MiB body limit
MAX_RECORDS_PER_BATCH = 2_000


def usage_records(dispatcher: Dispatcher, day: dt.date | None = None) -> list[dict[str, Any]]:
    """The dispatcher's usage since the last call as telemetry records (its counts are reset): per S, calls, kernel
    seconds and fallbacks; the table served (`table_job_id`: the job that published it); and where the dispatcher
    holds calls out (kernelfleet.holdout), both sides' sums (`holdout`)."""
    holdout = getattr(dispatcher, "holdout", None)  # (a conv or batch_matmul dispatcher holds nothing out)
    held = holdout.samples(reset=True) if holdout is not None else {}
    table_job = dispatcher.meta.get("job_id") if getattr(dispatcher, "table", None) is not None else None
    records = []
    for S, use in dispatcher.usage(reset=True).items():
        if S < 1 or use.calls == 0:
            continue  # S = -1 lumps shapes beyond the dispatcher's memory bound: no single shape to tune
        record: dict[str, Any] = {
            "workload_hash": dispatcher.meta["workload_hash"],
            "target_fingerprint": dispatcher.meta["target_fingerprint"],
            "shape": {dispatcher.meta.get("dim", "M"): S},
            "calls": use.calls,
            "kernel_seconds": use.seconds,
            "fallbacks": use.fallbacks,
        }
        if table_job:
            record["table_job_id"] = str(table_job)
        sample = held.get(S)
        if sample is not None and sample.served_calls + sample.baseline_calls <= use.calls:
            record["holdout"] = {"baseline": holdout.baseline, **sample.to_json()}  # type: ignore[union-attr]
        if day is not None:
            record["day"] = day.isoformat()
        records.append(record)
    return records


class TelemetrySink(Protocol):
    """Where a reporter sends its batches (kernelfleet.client.Client is one): the reporter is used by the
    client, never the reverse."""

    def send_telemetry(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """POST one batch; resending the same `batch_id` changes nothing."""


class TelemetryReporter:
    def __init__(
        self,
        client: TelemetrySink,
        *,
        interval_s: float = 60.0,
        max_batches: int = 100,
        host: str = "",
        day: dt.date | None = None,
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.host = host
        self.day = day  # None: the service stamps the day it receives; set it to replay past days
        self._dispatchers: weakref.WeakSet[Dispatcher] = weakref.WeakSet()
        self._pending: collections.deque[dict[str, Any]] = collections.deque(maxlen=max_batches)
        self._lock = threading.Lock()
        # One sender at a time: a close() that flushes while the background thread's send is still in flight
        # waits for it, so everything is on the service when close() returns (not merely sent twice).
        self._send_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.dropped = 0

    def watch(self, dispatcher: Dispatcher) -> Dispatcher:
        """Report this dispatcher's usage (it must know its workload and target: one from `client.dispatcher`)."""
        if not {"workload_hash", "target_fingerprint"} <= set(dispatcher.meta):
            raise ValueError("the dispatcher does not say which workload and target it serves (meta)")
        self._dispatchers.add(dispatcher)
        return dispatcher

    def collect(self) -> int:
        """Move the watched dispatchers' usage into a queued batch; returns the records queued."""
        records = []
        for d in list(self._dispatchers):
            records += usage_records(d, self.day)
        for start in range(0, len(records), MAX_RECORDS_PER_BATCH):
            batch = {
                "batch_id": str(uuid.uuid4()),
                "host": self.host,
                "records": records[start : start + MAX_RECORDS_PER_BATCH],
            }
            with self._lock:
                if len(self._pending) == self._pending.maxlen:
                    self.dropped += 1  # the deque drops the oldest batch as this one goes in
                self._pending.append(batch)
        return len(records)

    def flush(self) -> bool:
        """Collect, then send every queued batch; False when the service could not take them all (they stay)."""
        with self._send_lock:
            return self._send_pending()

    def _send_pending(self) -> bool:
        self.collect()
        while True:
            with self._lock:
                if not self._pending:
                    return True
                batch = self._pending[0]
            try:
                self.client.send_telemetry(batch)
            except (KernelFleetError, OSError) as exc:
                status = getattr(exc, "status", None)
                if status is None or status in (408, 429) or status >= 500:
                    log.warning("telemetry not sent (%s); %d batches kept for later", exc, len(self._pending))
                    return False
                log.error("telemetry batch refused (%s): dropped", exc)  # resending cannot help a 4xx
                with self._lock:
                    if self._pending and self._pending[0] is batch:
                        self._pending.popleft()
                        self.dropped += 1
                continue
            with self._lock:
                if self._pending and self._pending[0] is batch:
                    self._pending.popleft()
            self.sent += 1

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # the reporter must outlive any surprise; inference never sees it
                log.exception("telemetry flush failed")

    def start(self) -> TelemetryReporter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kernelfleet-telemetry", daemon=True)
            self._thread.start()
        return self

    def close(self, flush: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if flush:
            self.flush()

    def __enter__(self) -> TelemetryReporter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
