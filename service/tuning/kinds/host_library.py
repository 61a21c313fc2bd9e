"""The `host_library` job tag: the vendor library the hosts that call a workload run without KernelFleet.

Hosts of a PyTorch model run PyTorch (the fleet's daily run reads that from their A/B holdout telemetry and tags
its jobs with it), and `kernelfleet.torch.accelerate` runs every shape a table routes to a vendor library on
PyTorch: for them a dense range job times its uKernels against PyTorch alone, and the table sends a shape to a
uKernel only where it beats PyTorch. numpy hosts (the SDK's array API; the default without the tag) can call
either library, so their jobs time both, as before. Either way a table that routes every shape to the hosts'
library changes nothing for them and is not published; the hosts' A/B then decides whether a published one stays
(service.workers.fleet.rollback).
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelfleet import vendor
from kernelfleet.vendor import HOST_LIBRARY_TAG
from service.tuning.kinds.base import Problem

__all__ = ["HOST_LIBRARY_TAG", "check_host_library", "host_library", "route_libraries"]


def check_host_library(tags: Mapping[str, str]) -> Problem | None:
    value = tags.get(HOST_LIBRARY_TAG, vendor.NUMPY)
    if value not in vendor.LIBRARIES:
        return Problem(
            ("tags", HOST_LIBRARY_TAG), f"{value!r} is not a vendor library; one of {', '.join(vendor.LIBRARIES)}"
        )
    return None


def host_library(tags: Mapping[str, str]) -> str:
    """The library the job's hosts run today (numpy when the job does not say); `check_host_library` first."""
    if problem := check_host_library(tags):
        raise ValueError(problem.message)
    return tags.get(HOST_LIBRARY_TAG, vendor.NUMPY)


def route_libraries(tags: Mapping[str, str]) -> tuple[str, ...] | None:
    """The vendor libraries a dense range job may route shapes to for the job's hosts: PyTorch alone for PyTorch
    hosts (when this worker has it), else every library the worker has (None)."""
    library = host_library(tags)
    return (library,) if library != vendor.NUMPY and library in vendor.available() else None
