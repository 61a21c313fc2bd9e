"""KernelFleet Python SDK: submit tuning jobs, look up and run the best kernel per shape."""

from kernelfleet.client import Client, local_toolchain, shape_key
from kernelfleet.errors import InvalidRequest, JobFailed, KernelFleetError, NotFound, ServiceUnavailable
from kernelfleet.models import BestConfig, Job, ShapeResult, Target, Workload

__version__ = "0.1.0"
__all__ = [
    "BestConfig",
    "Client",
    "InvalidRequest",
    "Job",
    "JobFailed",
    "KernelFleetError",
    "NotFound",
    "ServiceUnavailable",
    "ShapeResult",
    "Target",
    "Workload",
    "local_toolchain",
    "shape_key",
]
