"""Per-key rate limits and request-size bounds."""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Buckets are kept per API key or client address; addresses are unbounded in number (anyone can send a bad key
# from many of them), so each TokenBucket tracks at most this many and forgets the longest idle first.
MAX_TRACKED_KEYS = 10_000


class TokenBucket:
    """`rate_per_minute` tokens per key, with bursts up to one minute's worth.

    Kept per API process: with N API replicas a key gets up to N times the rate, which bounds abuse
    without a shared counter on every request. A request may cost more than one token (a batch lookup costs
    one per key it looks up); one costing more than the bucket holds is admitted from a full bucket and leaves
    it in debt, so the rate over time is still `rate_per_minute`.
    """

    def __init__(
        self, rate_per_minute: float, max_keys: int = MAX_TRACKED_KEYS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate_per_minute / 60.0
        self.capacity = max(1.0, rate_per_minute)
        self.max_keys = max_keys
        self._clock = clock
        # key -> (tokens, monotonic time they were counted), least recently used first
        self._state: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: str, cost: float = 1.0) -> float:
        """Take `cost` tokens: 0 when admitted, else the seconds until they are there (nothing is taken)."""
        return self._settle(key, cost, "take")

    def charge(self, key: str, cost: float) -> None:
        """Take `cost` tokens whatever is left, into debt if need be: for work whose cost is known only once it
        is done (an export's rows), after a `take` admitted the request."""
        self._settle(key, cost, "charge")

    def wait(self, key: str, cost: float = 1.0) -> float:
        """The seconds until `cost` tokens are there (0: now), taking none."""
        return self._settle(key, cost, "wait")

    def __len__(self) -> int:
        return len(self._state)

    def _settle(self, key: str, cost: float, mode: Literal["take", "charge", "wait"]) -> float:
        now = self._clock()
        needed = min(cost, self.capacity)
        with self._lock:
            state = self._state.get(key)
            if state is None:
                if mode == "wait":  # an unknown key holds a full bucket, enough for any request: nothing to record
                    return 0.0
                self._make_room(now)
                tokens = self.capacity
            else:
                tokens = self._refilled(state, now)
            if tokens >= needed or mode == "charge":
                if mode != "wait":
                    self._state[key] = (tokens - cost, now)
                    self._state.move_to_end(key)
                return 0.0
            if state is not None:
                self._state[key] = (tokens, now)
                self._state.move_to_end(key)
            return (needed - tokens) / self.rate

    def _refilled(self, state: tuple[float, float], now: float) -> float:
        tokens, counted_at = state
        return min(self.capacity, tokens + (now - counted_at) * self.rate)

    def _make_room(self, now: float) -> None:
        """Before a new key is tracked: drop the longest idle buckets that are full again (they behave as if never
        seen); at the bound with none of them full, drop the least recently used one anyway. Memory stays bounded,
        and a dropped key gets no more than any new key would."""
        while self._state:
            oldest, state = next(iter(self._state.items()))
            if self._refilled(state, now) < self.capacity:
                break
            del self._state[oldest]
        while len(self._state) >= self.max_keys:
            self._state.popitem(last=False)


def enforce(bucket: TokenBucket, key: str, what: str, cost: float = 1.0) -> None:
    """429 with Retry-After when `key` has not `cost` tokens left in `bucket`."""
    wait = bucket.take(key, cost)
    if wait:
        raise too_many(f"rate limit for {what} exceeded; retry in {wait:.1f} s", wait)


def too_many(detail: str, wait_s: float) -> HTTPException:
    return HTTPException(429, detail, {"Retry-After": str(max(1, math.ceil(wait_s)))})


def client_address(host: str | None) -> str:
    """The address a client is throttled by: its IPv4 address, or the /64 of an IPv6 one (one host's usual
    allocation, so walking through its own addresses gains nothing)."""
    if not host:
        return "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # e.g. Starlette's TestClient calls itself "testclient"
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class BodySizeLimit:
    """Rejects request bodies over `max_bytes` with 413, whether or not Content-Length is sent."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _too_large(send, self.max_bytes)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _BodyTooLarge:
            await _too_large(send, self.max_bytes)


class _BodyTooLarge(Exception):
    pass


async def _too_large(send: Any, limit: int) -> None:
    body = f'{{"detail":"request body larger than {limit} bytes"}}'.encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
