"""KernelFleet Python SDK: submit tuning jobs, look up and run the best kernel per shape."""

from kernelfleet.client import Client, local_toolchain, shape_key
from kernelfleet.errors import (
    Forbidden,
    InvalidRequest,
    JobFailed,
    KernelFleetError,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
)
from kernelfleet.models import BestConfig, Job, ShapeResult, Target, Workload

__version__ = "0.1.0"
__all__ = [
    "BestConfig",
    "Client",
    "Forbidden",
    "InvalidRequest",
    "Job",
    "JobFailed",
    "KernelFleetError",
    "NotFound",
    "RateLimited",
    "ServiceUnavailable",
    "ShapeResult",
    "Target",
    "Unauthorized",
    "Workload",
    "local_toolchain",
    "shape_key",
]
