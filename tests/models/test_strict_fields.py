"""Strict numbers, bounded strings, sane days and a strict shape parser in the request models (issue 34 items 4 and 5):
`true`, "64" and 64.0 are no integer, a bool or a string no float, every free string has a bound, a telemetry day
lies between 2020-01-01 and tomorrow, and a lookup shape is ASCII with each name once."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError

from service.models import Budget, JobSpec, TargetSpec, WorkloadSpec, parse_shape_key, shape_key
from service.models.config import (
    GemminiCotuneConfig,
    ImportedRecord,
    LookupKey,
    PipelineGemmConfig,
    TraceConfig,
    UKernelTileConfig,
)
from service.models.distribution import ShapeDistribution
from service.models.fleet import FleetRunRequest, TelemetryBatch, TelemetryRecord
from service.models.model import ModelBudget, ModelOp, ModelSpec, op_priority
from service.models.shape import MAX_DIM
from tests.helpers import replaced_at

Path = tuple[str | int, ...]
Validator = Any  # a model class or a TypeAdapter's validate_python

DENSE: dict[str, Any] = {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]}
CONV: dict[str, Any] = {
    "op": "conv2d",
    "dims": {"N": 1, "H": 8, "W": 8, "CI": 3, "CO": 8, "KH": 3, "KW": 3},
    "attrs": {"stride": 1, "padding": 1},
}
TARGET: dict[str, Any] = {"kind": "llvm", "mcpu": "znver4", "num_cores": 2, "toolchain": {"tvm": "0.27.0"}}
GPU_TARGET: dict[str, Any] = {"kind": "cuda", "arch": "sm_90", "details": {"name": "H100", "sm_count": 132}}
DIST = TypeAdapter(ShapeDistribution)
UNIFORM = {"kind": "uniform", "dim": "M", "low": 1, "high": 16}
RECORD = {"workload_hash": "ab", "target_fingerprint": "cd", "shape": {"M": 3}, "calls": 4, "kernel_seconds": 0.5}
OP = {"name": "fc1", "workload": DENSE, "distribution": UNIFORM, "occurrences": 2, "dims": {"M": "batch*seq", "N": 64}}
PIPELINE = {
    "arch": "sm_90",
    "gemm": {"batch": 1, "m": 64, "n": 64, "k": 64, "dtype": "float16"},
    "config": {"bm": 64, "bn": 64, "bk": 32, "tm": 4, "tn": 4, "async_copy": True},
}
GEMMINI = {"layer": "fc1", "backend": "zigzag", "hw": {"dim": 16}, "mapping": {"t": 2}, "measured_cycles": 1200}
IMPORTED = {
    "workload_hash": "ab",
    "target": TARGET,
    "shape": {"M": 4},
    "latency_s": 2e-5,
    "config": {"format": "metaschedule-trace"},
    "source": "test",
}
TRACE = {"trace": [[]], "module": "{}", "module_hash": "12", "target": {"kind": "llvm"}}


def _job(**overrides: Any) -> dict[str, Any]:
    return {"workload": DENSE, "target": TARGET, "distribution": UNIFORM, **overrides}


def _validate(validator: Validator, body: Any) -> Any:
    if isinstance(validator, type) and issubclass(validator, BaseModel):
        return validator.model_validate(body)
    return validator(body)


def _refused_at(validator: Validator, body: Any, path: Path) -> list[str]:
    """The messages of the errors at `path` (a union's label may come between or after its steps)."""
    with pytest.raises(ValidationError) as caught:
        _validate(validator, body)
    # a discriminated union's member, or a scalar union's (whose errors the API merges into one at the field)
    labels = {"uniform", "normal", "zipf", "histogram", "explicit", "independent", "int", "bool", "str"}
    found = [e for e in caught.value.errors() if tuple(p for p in e["loc"] if p not in labels) == path]
    assert found, f"no error at {path}: {[e['loc'] for e in caught.value.errors()]}"
    return [e["msg"] for e in found]


# every integer field of the request models, with a valid body holding it
INTEGERS: list[tuple[Validator, dict[str, Any], Path]] = [
    (WorkloadSpec, DENSE, ("dims", "N")),
    (Budget, {"trials": 8, "max_shapes": 2, "seed": 1}, ("trials",)),
    (Budget, {"trials": 8, "max_shapes": 2, "seed": 1}, ("max_shapes",)),
    (Budget, {"trials": 8, "max_shapes": 2, "seed": 1}, ("seed",)),
    (TargetSpec, TARGET, ("num_cores",)),
    (DIST.validate_python, UNIFORM, ("low",)),
    (DIST.validate_python, UNIFORM, ("high",)),
    (DIST.validate_python, {"kind": "explicit", "points": [{"shape": {"M": 4}}]}, ("points", 0, "shape", "M")),
    (TelemetryRecord, {**RECORD, "fallbacks": 1}, ("calls",)),
    (TelemetryRecord, {**RECORD, "fallbacks": 1}, ("fallbacks",)),
    (TelemetryRecord, RECORD, ("shape", "M")),
    (ModelOp, OP, ("occurrences",)),
    (ModelBudget, {"trials": 40, "min_trials": 4, "max_shapes": 2, "seed": 1}, ("trials",)),
    (ModelBudget, {"trials": 40, "min_trials": 4, "max_shapes": 2, "seed": 1}, ("min_trials",)),
    (ModelBudget, {"trials": 40, "min_trials": 4, "max_shapes": 2, "seed": 1}, ("max_shapes",)),
    (ModelBudget, {"trials": 40, "min_trials": 4, "max_shapes": 2, "seed": 1}, ("seed",)),
    (LookupKey, {"workload": "a", "target": "b", "shape": {"M": 8}}, ("shape", "M")),
    (ImportedRecord, IMPORTED, ("shape", "M")),
    (UKernelTileConfig, {"id": "t8", "tile": [8, 16, 64]}, ("tile", 1)),
    (PipelineGemmConfig, PIPELINE, ("gemm", "m")),
    (PipelineGemmConfig, PIPELINE, ("config", "bm")),
]


@pytest.mark.parametrize("lax", [True, "64", 64.0, "６４"], ids=["true", "numeric-string", "float", "full-width"])
@pytest.mark.parametrize(
    ("validator", "body", "path"), INTEGERS, ids=lambda x: "/".join(map(str, x)) if isinstance(x, tuple) else None
)
def test_an_integer_field_takes_only_a_json_integer(
    validator: Validator, body: dict[str, Any], path: Path, lax: object
) -> None:
    _validate(validator, body)
    _refused_at(validator, replaced_at(body, path, lax), path)


# integers that are one member of a union with str: a string is that member, a bool or a float is nothing
UNION_INTEGERS: list[tuple[Validator, dict[str, Any], Path]] = [
    (WorkloadSpec, CONV, ("attrs", "stride")),
    (TargetSpec, GPU_TARGET, ("details", "sm_count")),
    (ModelOp, OP, ("dims", "N")),
]


@pytest.mark.parametrize("lax", [True, 64.0], ids=["true", "float"])
@pytest.mark.parametrize(
    ("validator", "body", "path"), UNION_INTEGERS, ids=lambda x: "/".join(map(str, x)) if isinstance(x, tuple) else None
)
def test_an_integer_member_of_a_union_takes_no_bool_or_float(
    validator: Validator, body: dict[str, Any], path: Path, lax: object
) -> None:
    _validate(validator, body)
    _refused_at(validator, replaced_at(body, path, lax), path)


def test_strict_integers_still_take_integers_and_python_construction_keeps_working() -> None:
    assert Budget(trials=8).trials == 8
    assert WorkloadSpec.model_validate({**DENSE, "dims": {"N": 64, "K": 32}}).dims == {"N": 64, "K": 32}
    assert JobSpec.model_validate(_job(budget={"trials": 8})).budget.trials == 8


# every float field: an integer is a number, a bool or a string is not
FLOATS: list[tuple[Validator, dict[str, Any], Path]] = [
    (
        DIST.validate_python,
        {"kind": "explicit", "points": [{"shape": {"M": 4}, "weight": 0.5}]},
        ("points", 0, "weight"),
    ),
    (DIST.validate_python, {"kind": "zipf", "dim": "M", "low": 1, "high": 8, "s": 1.1}, ("s",)),
    (DIST.validate_python, {"kind": "normal", "dim": "M", "low": 1, "high": 8, "mean": 4.0, "std": 2.0}, ("mean",)),
    (DIST.validate_python, {"kind": "normal", "dim": "M", "low": 1, "high": 8, "mean": 4.0, "std": 2.0}, ("std",)),
    (DIST.validate_python, {"kind": "histogram", "dim": "M", "counts": {"3": 2.0}}, ("counts", "3")),
    (TelemetryRecord, RECORD, ("kernel_seconds",)),
    (ImportedRecord, IMPORTED, ("latency_s",)),
    (GemminiCotuneConfig, GEMMINI, ("measured_cycles",)),
]


@pytest.mark.parametrize(
    ("validator", "body", "path"), FLOATS, ids=lambda x: "/".join(map(str, x)) if isinstance(x, tuple) else None
)
def test_a_float_field_takes_a_number_and_refuses_bools_and_strings(
    validator: Validator, body: dict[str, Any], path: Path
) -> None:
    assert _validate(validator, replaced_at(body, path, 2)) is not None  # an integer is a number
    for lax in (True, "2.5"):
        _refused_at(validator, replaced_at(body, path, lax), path)


def test_pipeline_flags_take_only_json_booleans() -> None:
    PipelineGemmConfig.model_validate(PIPELINE)
    for lax in (1, "true", "yes"):
        _refused_at(PipelineGemmConfig, replaced_at(PIPELINE, ("config", "async_copy"), lax), ("config", "async_copy"))


@pytest.mark.parametrize("key", ["３", " 3", "+3", "3.0", "1_0", "0x3", ""])
def test_a_histogram_value_as_a_key_is_plain_ascii_digits(key: str) -> None:
    assert DIST.validate_python({"kind": "histogram", "dim": "M", "counts": {"3": 1.0}}).counts == {3: 1.0}  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="ASCII digits"):
        DIST.validate_python({"kind": "histogram", "dim": "M", "counts": {key: 1.0}})


# -- strings --------------------------------------------------------------------------------------------------------

LONG = "x" * 100_000
STRINGS: list[tuple[Validator, dict[str, Any], Path, object]] = [
    (JobSpec, _job(tags={"team": "nlp"}), ("tags", "team"), "x" * 257),
    (ModelSpec, {"name": "m", "target": TARGET, "ops": [OP], "tags": {"team": "nlp"}}, ("tags", "team"), LONG),
    (JobSpec, _job(), ("workload",), LONG),
    (JobSpec, _job(), ("workload",), "not-a-hash"),
    (JobSpec, _job(kind="sketch"), ("kind",), LONG),
    (WorkloadSpec, DENSE, ("op",), LONG),
    (WorkloadSpec, DENSE, ("symbolic", 0), LONG),
    (WorkloadSpec, {**DENSE, "attrs": {"activation": "gelu"}}, ("attrs", "activation"), "g" * 65),
    (TargetSpec, GPU_TARGET, ("details", "name"), "x" * 257),
    (TargetSpec, {**TARGET, "metadata": {"uuid": "GPU-1"}}, ("metadata", "uuid"), LONG),
    (TargetSpec, {**TARGET, "features": ["avx2"]}, ("features", 0), "a b"),
    (DIST.validate_python, UNIFORM, ("dim",), LONG),
    (ModelOp, OP, ("name",), "x" * 201),
    (ModelOp, OP, ("dims", "M"), "b" * 201),
    (ModelOp, {**OP, "sources": ["layer.0"]}, ("sources", 0), LONG),
    (TelemetryBatch, {"batch_id": "0b5f3c1e-8f0e-4a59-9d7c-6a1f2b3c4d5e", "records": [RECORD], "host": "h"},
     ("host",), "h" * 201),
    (TelemetryRecord, RECORD, ("workload_hash",), LONG),
    (ImportedRecord, IMPORTED, ("source",), LONG),
    (ImportedRecord, IMPORTED, ("workload_hash",), LONG),
    (GemminiCotuneConfig, GEMMINI, ("layer",), LONG),
    (TraceConfig, TRACE, ("module",), "m" * ((1 << 22) + 1)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("validator", "body", "path", "value"),
    STRINGS,
    ids=lambda x: "/".join(map(str, x)) if isinstance(x, tuple) else None,
)
def test_every_free_string_is_bounded_at_its_field(
    validator: Validator, body: dict[str, Any], path: Path, value: object
) -> None:
    _validate(validator, body)
    _refused_at(validator, replaced_at(body, path, value), path)


@pytest.mark.parametrize("key", ["k" * 65, "x" * 50_000, "a b", "naïve", ""])
def test_tag_keys_are_short_plain_names(key: str) -> None:
    for validator, body in ((JobSpec, _job()), (ModelSpec, {"name": "m", "target": TARGET, "ops": [OP]})):
        _refused_at(validator, {**body, "tags": {key: "v"}}, ("tags", key, "[key]"))
    assert JobSpec.model_validate(_job(tags={"k" * 64: "v" * 256, "fleet_run": "2026-11-27", "a/b.c:d-e": ""})).tags


def test_a_scalar_union_keeps_its_bounds_and_one_error_per_member() -> None:
    """An attribute is int | bool | str; its bounds are checked after the union, so a value of no member's type
    gets the members' errors under their plain labels (the API merges them into one at the field)."""
    with pytest.raises(ValidationError) as caught:
        WorkloadSpec.model_validate({**CONV, "attrs": {"stride": [1]}})
    assert {e["loc"][-1] for e in caught.value.errors()} == {"int", "bool", "str"}
    assert _refused_at(WorkloadSpec, {**CONV, "attrs": {"stride": 65}}, ("attrs", "stride")) == [
        "Integer should be in 0..64"
    ]


# -- days -----------------------------------------------------------------------------------------------------------


def test_telemetry_days_lie_between_2020_and_tomorrow() -> None:
    today = dt.datetime.now(dt.UTC).date()
    for day in (dt.date(2020, 1, 1), today, today + dt.timedelta(days=1)):
        assert TelemetryRecord.model_validate({**RECORD, "day": day.isoformat()}).day == day
    for bad in ("0001-01-01", "2019-12-31", (today + dt.timedelta(days=2)).isoformat()):
        assert "outside 2020-01-01" in _refused_at(TelemetryRecord, {**RECORD, "day": bad}, ("day",))[0]
    for lax in (0, 86_400.0, True, "2026-1-1", "20261127"):
        assert "YYYY-MM-DD" in _refused_at(TelemetryRecord, {**RECORD, "day": lax}, ("day",))[0]
    _refused_at(FleetRunRequest, {"day": "0001-01-01"}, ("day",))


# -- numbers a float holds but arithmetic on them does not ------------------------------------------------------------


def test_a_far_mean_or_a_huge_weight_gives_finite_weights_and_priorities() -> None:
    far = DIST.validate_python({"kind": "normal", "dim": "M", "low": 1, "high": 8, "mean": -1e308, "std": 1e-300})
    assert far.support() == [({"M": 1}, 1.0)]  # nearest to the mean: z·z is inf, never an OverflowError
    huge = {"kind": "explicit", "points": [{"shape": {"M": 4}, "weight": 1e308}, {"shape": {"M": 8}, "weight": 1.0}]}
    priority = op_priority(ModelOp.model_validate({**OP, "distribution": huge}))
    assert math.isfinite(priority) and priority > 0


# -- the lookup's shape parser ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("M=１２", "ASCII"),
        ("M=²", "ASCII"),
        ("Ｍ=12", "ASCII"),
        ("M=1,M=2", "given twice"),
        ("M=-1", "ASCII"),
        ("M=0", "out of range"),
        (f"M={MAX_DIM + 1}", "out of range"),
        ("M=12345678901", "ASCII"),
        (",".join(f"D{i}=1" for i in range(9)), "at most 8"),
        ("M=1,", "ASCII"),
        ("M:1", "ASCII"),
    ],
)
def test_the_shape_parser_takes_ascii_names_and_digits_each_name_once(key: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_shape_key(key)


def test_what_the_shape_parser_returns_is_a_valid_lookup_shape() -> None:
    for key in ("M=61", " B = 2 ,M=61", f"M={MAX_DIM}", ",".join(f"D{i}=1" for i in range(8))):
        shape = parse_shape_key(key)
        assert LookupKey(workload="a", target="b", shape=shape).shape == shape
        assert parse_shape_key(shape_key(shape)) == shape
