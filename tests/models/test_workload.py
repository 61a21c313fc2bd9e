import pytest
from pydantic import ValidationError

from service.models import OPERATORS, WorkloadSpec


def test_hash_is_canonical_and_stable() -> None:
    a = WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"])
    b = WorkloadSpec.model_validate(
        {"symbolic": ["M"], "dims": {"K": 768, "N": 2304}, "op": "dense", "attrs": {"bias": False}}
    )
    assert a.hash == b.hash
    assert len(a.hash) == 32
    assert a.hash != WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"], attrs={"bias": True}).hash
    assert a.hash != WorkloadSpec(op="dense", dims={"N": 768, "K": 768}, symbolic=["M"]).hash


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"op": "softmax_evil", "dims": {}}, "unknown operator"),
        ({"op": "dense", "dims": {"N": 8}, "symbolic": ["M"]}, "K"),
        ({"op": "dense", "dims": {"N": 8, "K": 8, "M": 4}, "symbolic": ["M"]}, "both static and symbolic"),
        ({"op": "dense", "dims": {"N": 8, "K": 0}, "symbolic": ["M"]}, "out of range"),
        ({"op": "dense", "dims": {"N": 8, "K": 8, "Q": 1}, "symbolic": ["M"]}, "no dimension 'Q'"),
        ({"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"], "attrs": {"bias": 3}}, "must be bool"),
        (
            {
                "op": "conv2d",
                "dims": {"N": 1, "H": 8, "W": 8, "CI": 4, "CO": 4, "KH": 3, "KW": 3},
                "attrs": {"stride": 0},
            },
            "stride",
        ),
        ({"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"], "code": "import os"}, "Extra inputs"),
    ],
)
def test_invalid_workloads_are_rejected_with_a_reason(body: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WorkloadSpec.model_validate(body)


def test_bind_and_flops() -> None:
    w = WorkloadSpec(op="dense", dims={"N": 2304, "K": 768}, symbolic=["M"])
    assert w.bind({"M": 61}) == {"N": 2304, "K": 768, "M": 61}
    assert w.flops({"M": 61}) == 2 * 61 * 2304 * 768
    with pytest.raises(ValueError, match="missing"):
        w.bind({})
    with pytest.raises(ValueError, match="unexpected"):
        w.bind({"M": 3, "B": 2})
    conv = WorkloadSpec(
        op="conv2d",
        dims={"N": 1, "CI": 8, "CO": 16, "KH": 3, "KW": 3},
        symbolic=["H", "W"],
        attrs={"stride": 2, "padding": 1},
    )
    # output 4x4 for an 8x8 input with stride 2, padding 1
    assert conv.flops({"H": 8, "W": 8}) == 2 * 1 * 4 * 4 * 16 * 8 * 3 * 3
    with pytest.raises(ValueError, match="empty"):
        WorkloadSpec(op="conv2d", dims={"N": 1, "CI": 8, "CO": 16, "KH": 5, "KW": 5}, symbolic=["H", "W"]).bind(
            {"H": 2, "W": 2}
        )


def test_registry_has_the_required_operators() -> None:
    assert {"dense", "batch_matmul", "conv2d"} <= set(OPERATORS)
