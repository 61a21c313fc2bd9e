"""Pydantic domain models shared by the API, the workers, the store and the CLI.

Request models (workloads, distributions, targets, job specs) are defined here and validated by the
service. Response bodies come from the SDK's wire schema (kernelfleet.models), re-exported here, so
the service and the SDK share one definition of what goes over the wire.
"""

from kernelfleet.models import ConfigRecord, JobList, JobView, ShapeResult
from service.models.config import ConfigMiss, Fallback, LookupKey
from service.models.distribution import ShapeDistribution, normalized_support
from service.models.job import Budget, JobSpec, JobState
from service.models.operators import OPERATORS, OperatorDef
from service.models.shape import parse_shape_key, shape_key
from service.models.target import TUNER_ABI, Target, TargetSpec, Toolchain
from service.models.workload import Workload, WorkloadSpec

__all__ = [
    "OPERATORS",
    "TUNER_ABI",
    "Budget",
    "ConfigMiss",
    "ConfigRecord",
    "Fallback",
    "JobList",
    "JobSpec",
    "JobState",
    "JobView",
    "LookupKey",
    "OperatorDef",
    "ShapeDistribution",
    "ShapeResult",
    "Target",
    "TargetSpec",
    "Toolchain",
    "Workload",
    "WorkloadSpec",
    "normalized_support",
    "parse_shape_key",
    "shape_key",
]
