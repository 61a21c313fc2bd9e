"""Process-wide API state built from settings on first use."""

from __future__ import annotations

import functools

from service.api.limits import TokenBucket
from service.settings import get_settings


@functools.cache
def submit_bucket() -> TokenBucket:
    return TokenBucket(get_settings().submit_rate_per_minute)


@functools.cache
def telemetry_bucket() -> TokenBucket:
    return TokenBucket(get_settings().telemetry_rate_per_minute)
