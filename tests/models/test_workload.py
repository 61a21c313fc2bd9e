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


def test_dense_workloads_from_before_activations_keep_their_hash() -> None:
    """Stored records are keyed by the hash: `activation` at its default is left out of it (values pinned
    from main before the attribute existed); any other activation makes another workload."""
    plain = WorkloadSpec(op="dense", dims={"N": 768, "K": 768}, symbolic=["M"])
    assert plain.hash == "2fe4d77ecde6f5a8df25d11c350c7220"
    assert WorkloadSpec(**{**plain.model_dump(), "attrs": {"activation": "none"}}).hash == plain.hash
    biased = WorkloadSpec(op="dense", dims={"N": 768, "K": 768}, symbolic=["M"], attrs={"bias": True})
    assert biased.hash == "0b50347e3504db25a0be6b331abd493b"
    assert "activation" not in biased.canonical()["attrs"]  # type: ignore[operator]
    assert biased.attrs["activation"] == "none"  # but the model has it
    dims = {"N": 768, "K": 768}
    hashes = {
        WorkloadSpec(op="dense", dims=dims, symbolic=["M"], attrs={"bias": True, "activation": act}).hash
        for act in ("none", "relu", "gelu", "gelu_tanh", "silu")
    }
    assert len(hashes) == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"op": "softmax_evil", "dims": {}}, "unknown operator"),
        ({"op": "dense", "dims": {"N": 8}, "symbolic": ["M"]}, "K"),
        ({"op": "dense", "dims": {"N": 8, "K": 8, "M": 4}, "symbolic": ["M"]}, "both static and symbolic"),
        (
            {"op": "dense", "dims": {"N": 8, "K": 0}, "symbolic": ["M"]},
            "dims.K\n  Input should be greater than or equal to 1",
        ),
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
        ({"op": "dense", "dims": {"N": 10**6, "K": 10**6}, "symbolic": ["M"]}, "elements"),
        ({"op": "conv2d", "dims": {"N": 1, "H": 4, "W": 4, "CI": 3, "CO": 8, "KH": 5, "KW": 3}}, "larger than H"),
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


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"op": "dense", "dims": {"N": 8}, "symbolic": ["M"]}, ("dims",)),
        ({"op": "dense", "dims": {"N": 8, "K": 8, "Q": 1}, "symbolic": ["M"]}, ("dims", "Q")),
        ({"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M", "M"]}, ("symbolic", 1)),
        ({"op": "dense", "dims": {"N": 8, "K": 8, "M": 4}, "symbolic": ["M"]}, ("symbolic", 0)),
        ({"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"], "attrs": {"bias": 3}}, ("attrs", "bias")),
        (
            {"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"], "attrs": {"activation": "tanh"}},
            ("attrs", "activation"),
        ),
        (
            {"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"], "attrs": {"activation": True}},
            ("attrs", "activation"),
        ),
        ({"op": "dense", "dims": {"N": 8, "K": 8}, "symbolic": ["M"], "attrs": {"stride": 1}}, ("attrs", "stride")),
        ({"op": "dense", "dims": {"N": 10**6, "K": 10**6}, "symbolic": ["M"]}, ("dims",)),
        ({"op": "conv2d", "dims": {"N": 1, "H": 4, "W": 4, "CI": 3, "CO": 8, "KH": 3, "KW": 9}}, ("dims", "KW")),
        ({"op": "conv2d", "dims": {"N": 1, "H": 8, "W": 8, "CI": 3, "CO": 8, "KH": 3, "KW": 3}, "attrs": {"stride": 0}},
         ("attrs", "stride")),
    ],
)  # fmt: skip
def test_invalid_workloads_name_the_field(body: dict[str, object], loc: tuple[object, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        WorkloadSpec.model_validate(body)
    assert [e["loc"] for e in info.value.errors()] == [loc]


def test_size_bounds_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import get_settings

    dense = {"op": "dense", "dims": {"N": 64, "K": 64}, "symbolic": ["M"]}
    monkeypatch.setenv("KERNELFLEET_MAX_TENSOR_ELEMENTS", "1000")
    get_settings.cache_clear()
    try:
        with pytest.raises(ValidationError, match="KERNELFLEET_MAX_TENSOR_ELEMENTS"):
            WorkloadSpec.model_validate(dense)
        monkeypatch.delenv("KERNELFLEET_MAX_TENSOR_ELEMENTS")
        monkeypatch.setenv("KERNELFLEET_MAX_SHAPE_FLOPS", "1e6")
        get_settings.cache_clear()
        spec = WorkloadSpec.model_validate(dense)  # 8192 FLOPs at M=1
        assert spec.flops({"M": 100}) == 2 * 100 * 64 * 64
        with pytest.raises(ValueError, match="FLOPs"):
            spec.bind({"M": 200})
    finally:
        get_settings.cache_clear()


def test_registered_workloads_load_whatever_the_bounds_are_today() -> None:
    from service.models import Workload

    huge = {"op": "dense", "dims": {"N": 10**6, "K": 10**6}, "symbolic": ["M"]}
    with pytest.raises(ValidationError):
        WorkloadSpec.model_validate(huge)
    stored = Workload.model_validate({**huge, "workload_hash": "h"})  # registered before the bound existed
    with pytest.raises(ValueError, match="elements"):
        stored.bind({"M": 1})  # but no job or lookup can use it at a size past the bound


def test_a_label_tells_layers_that_differ_only_in_their_epilogue_apart() -> None:
    """Issue 35 item 6: reports and the dashboard name workloads as people read them, epilogue included."""
    plain = WorkloadSpec(op="dense", dims={"N": 3072, "K": 768}, symbolic=["M"], attrs={"bias": True})
    fused = WorkloadSpec(op="dense", dims={"N": 3072, "K": 768}, symbolic=["M"],
                         attrs={"bias": True, "activation": "gelu"})  # fmt: skip
    assert plain.label() == "dense M=? N=3072 K=768 +bias"
    assert fused.label() == "dense M=? N=3072 K=768 +bias +gelu"
    conv = WorkloadSpec(op="conv2d", dims={"CI": 3, "CO": 8, "H": 8, "W": 8, "KH": 3, "KW": 3}, symbolic=["N"],
                        dtype="float16")  # fmt: skip
    label = conv.label()
    assert label.startswith("conv2d N=? H=8 W=8 CI=3 CO=8 KH=3 KW=3 ") and "stride=1" in label
    assert label.endswith("float16")
