"""The `host_library` job tag: the vendor library the hosts that call a workload run without KernelFleet.

A dispatch table that routes every shape to that library changes nothing for those hosts, so it is not
published; one that routes shapes to a faster library, or to uKernels, is. Hosts of a PyTorch model run PyTorch
(the fleet's daily run reads that from their A/B holdout telemetry and tags its jobs with it), so a table that
sends their shapes to numpy where numpy was timed faster is worth publishing to them; the hosts' A/B then
decides whether it stays (service.workers.fleet.rollback). Without the tag a job tunes for numpy hosts, as before.
"""

from __future__ import annotations

from collections.abc import Mapping

from kernelfleet import vendor
from service.tuning.kinds.base import Problem

HOST_LIBRARY_TAG = "host_library"


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
