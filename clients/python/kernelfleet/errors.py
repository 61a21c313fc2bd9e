"""Typed errors raised by the SDK."""

from __future__ import annotations

from typing import Any


class KernelFleetError(Exception):
    """Base class; `status` and `detail` come from the service when it answered."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.status, self.detail = status, detail


class InvalidRequest(KernelFleetError):
    """422: the service named the offending field in `detail`."""


class NotFound(KernelFleetError):
    pass


class ServiceUnavailable(KernelFleetError):
    """The service could not be reached, or answered 503, after all retries."""


class JobFailed(KernelFleetError):
    pass


class Unauthorized(KernelFleetError):
    """401: no API key, or an invalid or revoked one (set KERNELFLEET_API_KEY)."""


class Forbidden(KernelFleetError):
    """403: the API key lacks the scope this call needs."""


class RateLimited(KernelFleetError):
    """429 after all retries."""
