"""KernelFleet Python SDK: submit tuning jobs, look up and run the best kernel per shape."""

# Before numpy loads (the imports below bring it): OpenBLAS reads its thread settings once, at load.
from kernelfleet.runtime import configure_threads

configure_threads()

from kernelfleet.client import Client, local_toolchain, shape_key  # noqa: E402
from kernelfleet.errors import (  # noqa: E402
    Forbidden,
    InvalidRequest,
    JobFailed,
    KernelFleetError,
    NotFound,
    RateLimited,
    ServiceUnavailable,
    Unauthorized,
)
from kernelfleet.models import BestConfig, Job, ShapeResult, Target, Workload  # noqa: E402

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
