"""KernelFleet Python SDK: submit tuning jobs, look up and run the best kernel per shape.

The public names load on first use (PEP 562), so the kernel runtimes (kernelfleet.cuda_ukernel,
kernelfleet.dispatch, ...) import on hosts without pydantic or httpx, e.g. GPU measurement machines.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Before numpy loads (any kernelfleet module may bring it): OpenBLAS reads its thread settings once, at load.
from kernelfleet.runtime import configure_threads

configure_threads()

if TYPE_CHECKING:
    from kernelfleet.client import Client, local_toolchain, shape_key
    from kernelfleet.epilogue import Epilogue
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

_MODULES = {
    "Client": "kernelfleet.client",
    "local_toolchain": "kernelfleet.client",
    "shape_key": "kernelfleet.client",
    "Epilogue": "kernelfleet.epilogue",
    "Forbidden": "kernelfleet.errors",
    "InvalidRequest": "kernelfleet.errors",
    "JobFailed": "kernelfleet.errors",
    "KernelFleetError": "kernelfleet.errors",
    "NotFound": "kernelfleet.errors",
    "RateLimited": "kernelfleet.errors",
    "ServiceUnavailable": "kernelfleet.errors",
    "Unauthorized": "kernelfleet.errors",
    "BestConfig": "kernelfleet.models",
    "Job": "kernelfleet.models",
    "ShapeResult": "kernelfleet.models",
    "Target": "kernelfleet.models",
    "Workload": "kernelfleet.models",
}

__version__ = "0.1.0"
__all__ = [
    "BestConfig",
    "Client",
    "Epilogue",
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


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelfleet' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value
