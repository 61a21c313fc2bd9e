"""The vendor baseline a user would otherwise call: numpy on this worker, and which BLAS kernel it ran."""

from __future__ import annotations

import functools
from collections.abc import Mapping

import numpy as np

from kernelfleet.tvm_kernel import median_seconds
from service.models import WorkloadSpec
from service.tuning.compute import random_inputs, reference


@functools.cache
def vendor_label() -> str:
    from threadpoolctl import threadpool_info

    blas = next((i for i in threadpool_info() if i.get("user_api") == "blas"), None)
    if blas is None:
        return f"numpy {np.__version__}"
    return f"numpy {np.__version__} ({blas.get('internal_api')} {blas.get('version')} {blas.get('architecture')})"


def measure_vendor(workload: WorkloadSpec, shape: Mapping[str, int]) -> float:
    return float(median_seconds(reference(workload), *random_inputs(workload, shape)))
