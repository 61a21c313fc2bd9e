"""Pydantic domain models shared by the API, the workers, the store and the CLI."""

from service.models.config import ConfigMiss, ConfigRecord, Fallback, LookupKey
from service.models.distribution import ShapeDistribution, normalized_support
from service.models.job import Budget, JobKind, JobSpec, JobState, JobView, ShapeResult
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
    "JobKind",
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
