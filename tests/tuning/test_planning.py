import pytest
from pydantic import TypeAdapter

from service.models import ShapeDistribution, WorkloadSpec
from service.tuning.planning import allocate, hot_shapes, plan

DENSE = WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"])
parse = TypeAdapter(ShapeDistribution).validate_python


def test_hot_shapes_rank_by_flops_times_weight() -> None:
    dist = parse(
        {
            "kind": "explicit",
            "points": [
                {"shape": {"M": 1}, "weight": 0.4},
                {"shape": {"M": 16}, "weight": 0.3},
                {"shape": {"M": 61}, "weight": 0.2},
                {"shape": {"M": 128}, "weight": 0.1},
            ],
        }
    )
    # priorities ∝ 0.4, 4.8, 12.2, 12.8
    assert [s["M"] for s, _, _ in hot_shapes(DENSE, dist, 4)] == [128, 61, 16, 1]
    assert [s["M"] for s, _, _ in hot_shapes(DENSE, dist, 2)] == [128, 61]


def test_allocate_is_exact_proportional_and_floored() -> None:
    shares = allocate([12.8, 12.2, 4.8, 0.4], 128, floor=8)
    assert sum(shares) == 128
    assert min(shares) >= 8
    assert shares[0] >= shares[1] >= shares[2] >= shares[3]
    assert allocate([1.0, 1.0, 1.0], 3) == [1, 1, 1]
    with pytest.raises(ValueError, match="cannot cover"):
        allocate([1.0, 1.0, 1.0], 2)
    assert allocate([], 10) == []


def test_plan_never_exceeds_the_budget() -> None:
    dist = parse({"kind": "zipf", "dim": "M", "low": 1, "high": 128})
    for trials in (1, 3, 7, 64, 1000):
        planned = plan(DENSE, dist, trials, 8)
        assert sum(p.trials for p in planned) == trials
        assert all(p.trials >= 1 for p in planned)
