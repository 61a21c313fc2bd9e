"""Property tests for the parsers users feed the most: shape distributions and workloads."""

from __future__ import annotations

import math
from typing import Any

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
