"""Process-wide API state built from settings on first use."""

from __future__ import annotations

import functools

from service.api.limits import TokenBucket
from service.settings import get_settings


@functools.cache
def submit_bucket() -> TokenBucket:
    return TokenBucket(get_settings().submit_rate_per_minute)


@functools.cache
def target_bucket() -> TokenBucket:
    return TokenBucket(get_settings().target_rate_per_minute)


@functools.cache
def telemetry_bucket() -> TokenBucket:
    return TokenBucket(get_settings().telemetry_rate_per_minute)


@functools.cache
def lookup_bucket() -> TokenBucket:
    """Counted in keys looked up, not requests: a batch lookup costs one token per key in it."""
    return TokenBucket(get_settings().lookup_rate_per_minute)


@functools.cache
def auth_failure_bucket() -> TokenBucket:
    """Per client address: one token per key that failed to authenticate."""
    return TokenBucket(get_settings().auth_failures_per_minute)


def reset_limits() -> None:
    """Forget every bucket (they are rebuilt from the settings on next use), e.g. after the settings changed."""
    for bucket in (submit_bucket, target_bucket, telemetry_bucket, lookup_bucket, auth_failure_bucket):
        bucket.cache_clear()
