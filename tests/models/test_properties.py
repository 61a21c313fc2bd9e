"""Property tests for the parsers users feed the most: shape distributions and workloads."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from service.models import ShapeDistribution, WorkloadSpec, normalized_support, parse_shape_key, shape_key
from service.models.distribution import MAX_SUPPORT

parse = TypeAdapter(ShapeDistribution).validate_python
dims = st.integers(min_value=1, max_value=2048)
json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True), st.text(max_size=8)
)
json_any = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4), max_leaves=12
)


@st.composite
def distributions(draw: st.DrawFn) -> dict[str, Any]:
    low = draw(dims)
    high = draw(st.integers(min_value=low, max_value=low + 300))
    kind = draw(st.sampled_from(["uniform", "normal", "zipf", "histogram", "explicit"]))
    if kind == "uniform":
        return {"kind": kind, "dim": "M", "low": low, "high": high}
    if kind == "normal":
        return {
            "kind": kind,
            "dim": "M",
            "low": low,
            "high": high,
            "mean": draw(st.floats(-1e4, 1e4)),
            "std": draw(st.floats(0.01, 1e4)),
        }
    if kind == "zipf":
        return {"kind": kind, "dim": "M", "low": low, "high": high, "s": draw(st.floats(0.01, 10))}
    values = draw(st.lists(dims, min_size=1, max_size=50))
    if kind == "histogram":
        return {"kind": kind, "dim": "M", "counts": {str(v): draw(st.floats(0.1, 1e6)) for v in values}}
    return {"kind": kind, "points": [{"shape": {"M": v}, "weight": draw(st.floats(0.001, 1e6))} for v in values]}


@given(distributions())
@settings(max_examples=200, deadline=None)
def test_valid_distributions_give_a_bounded_normalised_support(body: dict[str, Any]) -> None:
    support = normalized_support(parse(body))
    assert 1 <= len(support) <= MAX_SUPPORT
    assert math.isclose(sum(w for _, w in support), 1.0, rel_tol=1e-9)
    assert all(w >= 0 and set(s) == {"M"} and s["M"] >= 1 for s, w in support)


@given(json_any)
@settings(max_examples=300, deadline=None)
def test_arbitrary_json_is_either_a_distribution_or_a_validation_error(body: Any) -> None:
    try:
        dist = parse(body)
    except ValidationError:
        return
    assert len(dist.support()) <= MAX_SUPPORT


@given(json_any)
@settings(max_examples=300, deadline=None)
def test_arbitrary_json_is_either_a_workload_or_a_validation_error(body: Any) -> None:
    try:
        spec = WorkloadSpec.model_validate(body)
    except ValidationError:
        return
    assert len(spec.hash) == 32


@given(st.dictionaries(st.sampled_from(["M", "N", "B", "H", "W"]), dims, min_size=1))
def test_shape_keys_round_trip(shape: dict[str, int]) -> None:
    assert parse_shape_key(shape_key(shape)) == shape


@given(st.dictionaries(st.sampled_from(["N", "K"]), dims, min_size=2), st.permutations(["N", "K"]))
def test_workload_hash_ignores_key_order(d: dict[str, int], order: list[str]) -> None:
    a = WorkloadSpec(op="dense", dims=d, symbolic=["M"])
    b = WorkloadSpec(op="dense", dims={k: d[k] for k in order}, symbolic=["M"])
    assert a.hash == b.hash


# -- non-finite numbers (issue 10): every request model refuses them where they are, naming the field ----------

NON_FINITE = st.sampled_from([math.nan, math.inf, -math.inf, float("1e400"), -float("1e999")])
SENTINEL = "__non_finite__"


def _paths(value: Any, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    """Every position in a JSON value a number could be put: each leaf, each container element."""
    out = [path]
    if isinstance(value, dict):
        out += [p for k, v in value.items() for p in _paths(v, (*path, k))]
    elif isinstance(value, list):
        out += [p for i, v in enumerate(value) for p in _paths(v, (*path, i))]
    return out


def _put(value: Any, path: tuple[str | int, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _put(value[head], rest, new)}
    return [_put(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite(v) for v in value)
    return True


def _valid_bodies() -> dict[str, tuple[Any, dict[str, Any]]]:
    from service.models import JobSpec
    from service.models.config import BatchLookup, ImportRequest
    from service.models.fleet import TelemetryBatch

    dense = {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]}
    return {
        "workload": (WorkloadSpec, dense),
        "job": (
            JobSpec,
            {
                "kind": "sketch",
                "workload": dense,
                "target": {"kind": "llvm", "mcpu": "znver4", "num_cores": 2},
                "distribution": {"kind": "normal", "dim": "M", "low": 1, "high": 64, "mean": 8.5, "std": 4.0},
                "budget": {"trials": 8, "max_shapes": 2, "seed": 3},
                "tags": {"team": "nlp"},
            },
        ),
        "telemetry": (
            TelemetryBatch,
            {
                "batch_id": "0b5f3c1e-8f0e-4a59-9d7c-6a1f2b3c4d5e",
                "records": [
                    {
                        "workload_hash": "ab",
                        "target_fingerprint": "cd",
                        "shape": {"M": 3},
                        "calls": 4,
                        "kernel_seconds": 0.5,
                        "fallbacks": 1,
                    }
                ],
            },
        ),
        "import": (
            ImportRequest,
            {
                "records": [
                    {
                        "workload_hash": "ab",
                        "target": {"kind": "llvm", "mcpu": "znver4", "toolchain": {"tvm": "0.27.0"}},
                        "shape": {"M": 4},
                        "latency_s": 2e-5,
                        "config": {"format": "metaschedule-trace", "trace": [[["x", 1.5]], []], "target": {"n": 2.0}},
                        "source": "test",
                    }
                ]
            },
        ),
        "lookup": (BatchLookup, {"keys": [{"workload": "a", "target": "b", "shape": {"M": 8}}]}),
    }


@given(st.sampled_from(sorted(_valid_bodies())), st.data())
@settings(max_examples=400, deadline=None)
def test_a_non_finite_number_anywhere_in_a_request_is_refused_at_its_field(name: str, data: st.DataObject) -> None:
    model, body = _valid_bodies()[name]
    model.model_validate(body)  # the unmutated body is valid
    path = data.draw(st.sampled_from(_paths(body)[1:]), label="path")
    number = data.draw(NON_FINITE, label="number")
    try:
        accepted = model.model_validate(_put(body, path, number))
    except ValidationError as exc:
        locs = [tuple(e["loc"]) for e in exc.errors()]
        # the error is at the number, or at a field above it (e.g. a container the number replaced); the union
        # of a job's workload and a distribution's kinds add their label, nothing else does
        labels = {"explicit", "uniform", "normal", "zipf", "histogram", "independent"}
        assert any(tuple(p for p in loc if p not in labels) == path[: len(loc)] for loc in locs) or any(
            path[: len(loc)] == loc for loc in locs
        ), (path, locs)
        assert not any(str(p).startswith("function-") for loc in locs for p in loc), locs
        return
    raise AssertionError(f"{name}: {number} at {path} accepted as {accepted.model_dump()}")


@given(st.dictionaries(st.sampled_from(["N", "K", "M"]), st.one_of(dims, NON_FINITE), min_size=1))
@settings(max_examples=200, deadline=None)
def test_accepted_workloads_and_distributions_hold_only_finite_numbers(sizes: dict[str, Any]) -> None:
    for body in (
        {"op": "dense", "dims": sizes, "symbolic": [d for d in "NKM" if d not in sizes]},
        {"kind": "histogram", "dim": "M", "counts": {str(i + 1): v for i, v in enumerate(sizes.values())}},
        {"kind": "explicit", "points": [{"shape": {"M": 1}, "weight": v} for v in sizes.values()]},
    ):
        try:
            accepted = (WorkloadSpec.model_validate if "op" in body else parse)(body)
        except ValidationError:
            continue
        assert _finite(accepted.model_dump()), body


@given(json_any)
@settings(max_examples=300, deadline=None)
def test_the_422_body_is_strict_json_for_any_input(value: Any) -> None:
    import json

    from service.api.errors import validation_body

    errors = [{"type": "value_error", "loc": ("body", "function-after[x()]", "f"), "msg": "m", "input": value,
               "ctx": {"error": ValueError(value), "limit": value}}]  # fmt: skip
    detail = json.loads(validation_body(errors), parse_constant=lambda c: pytest.fail(f"{c} in a 422"))["detail"]
    assert detail[0]["loc"] == ["body", "f"]
