import pytest
from pydantic import TypeAdapter, ValidationError

from service.models import ShapeDistribution, normalized_support

parse = TypeAdapter(ShapeDistribution).validate_python


def test_explicit_merges_duplicates_and_normalises() -> None:
    d = parse(
        {
            "kind": "explicit",
            "points": [
                {"shape": {"M": 1}, "weight": 1},
                {"shape": {"M": 1}, "weight": 1},
                {"shape": {"M": 8}, "weight": 2},
            ],
        }
    )
    assert sorted((s["M"], w) for s, w in normalized_support(d)) == [(1, 0.5), (8, 0.5)]


def test_zipf_favours_small_values() -> None:
    support = dict(
        (s["M"], w) for s, w in normalized_support(parse({"kind": "zipf", "dim": "M", "low": 1, "high": 128}))
    )
    assert len(support) == 128
    assert support[1] > support[2] > support[128]
    assert sum(support.values()) == pytest.approx(1.0)


def test_normal_is_truncated_to_its_range() -> None:
    support = normalized_support(parse({"kind": "normal", "dim": "M", "low": 10, "high": 20, "mean": 15, "std": 2}))
    values = [s["M"] for s, _ in support]
    assert min(values) >= 10 and max(values) <= 20
    assert max(support, key=lambda t: t[1])[0] == {"M": 15}


def test_histogram_and_independent_product() -> None:
    h = parse({"kind": "histogram", "dim": "M", "counts": {"4": 3, "8": 1, "9": 0}})
    assert [(s["M"], w) for s, w in normalized_support(h)] == [(4, 0.75), (8, 0.25)]
    d = parse(
        {
            "kind": "independent",
            "factors": [
                {"kind": "uniform", "dim": "B", "low": 1, "high": 2},
                {"kind": "uniform", "dim": "M", "low": 1, "high": 3},
            ],
        }
    )
    support = normalized_support(d)
    assert len(support) == 6 and all(w == pytest.approx(1 / 6) for _, w in support)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"kind": "uniform", "dim": "M", "low": 5, "high": 1}, "high"),
        ({"kind": "uniform", "dim": "M", "low": 1, "high": 100000}, "more than"),
        ({"kind": "uniform", "dim": "M", "low": 0, "high": 3}, "greater than or equal to 1"),
        ({"kind": "histogram", "dim": "M", "counts": {"3": 0}}, "all be zero"),
        ({"kind": "explicit", "points": []}, "at least 1"),
        ({"kind": "normal", "dim": "M", "low": 1, "high": 3, "mean": 2, "std": 0}, "greater than 0"),
        ({"kind": "lognormal", "dim": "M"}, "does not match any of the expected tags"),
        # finite weights whose sum is not (issue 34 item 3)
        ({"kind": "explicit", "points": [{"shape": {"M": 1}, "weight": 1e308}] * 2}, "more than a float"),
        ({"kind": "histogram", "dim": "M", "counts": {"1": 1e308, "2": 1e308}}, "more than a float"),
        (
            {"kind": "independent", "factors": [{"kind": "histogram", "dim": d, "counts": {"1": 1e200}} for d in "MN"]},
            "more than a float",
        ),
    ],
)
def test_bad_distributions_are_rejected(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse(body)
