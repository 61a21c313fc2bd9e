"""Model onboarding from ONNX (issue 25 §1): GEMM-like operators of graphs built with onnx.helper, as workloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

onnx = pytest.importorskip("onnx")
np = pytest.importorskip("numpy")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kernelfleet.model_import import ModelImportError, extract_onnx  # noqa: E402


def _init(name: str, *shape: int, dtype: Any = np.float32) -> Any:
    return numpy_helper.from_array(np.zeros(shape, dtype=dtype), name)


def _model(nodes: list[Any], inputs: list[Any], outputs: list[Any], inits: list[Any]) -> Any:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _encoder(layers: int = 2, elem: int = TensorProto.FLOAT) -> Any:
    """[batch, seq, 64] → per layer: MatMul+Add bias → Gelu (MLP up), MatMul+Add (down); QKᵀ over heads."""
    nodes: list[Any] = []
    inits = [numpy_helper.from_array(np.array([-1, 64], dtype=np.int64), "flat"),
             numpy_helper.from_array(np.array([0, 0, 4, 16], dtype=np.int64), "heads")]  # fmt: skip
    cur = "x"
    for i in range(layers):
        inits += [_init(f"w1_{i}", 64, 256), _init(f"b1_{i}", 256), _init(f"w2_{i}", 256, 64), _init(f"b2_{i}", 64)]
        nodes += [
            helper.make_node("MatMul", [cur, f"w1_{i}"], [f"h{i}"], name=f"up{i}"),
            helper.make_node("Add", [f"h{i}", f"b1_{i}"], [f"hb{i}"], name=f"up{i}_bias"),
            helper.make_node("Gelu", [f"hb{i}"], [f"g{i}"], name=f"gelu{i}"),
            helper.make_node("MatMul", [f"g{i}", f"w2_{i}"], [f"d{i}"], name=f"down{i}"),
            helper.make_node("Add", [f"d{i}", f"b2_{i}"], [f"y{i}"], name=f"down{i}_bias"),
            helper.make_node("Reshape", [f"y{i}", "heads"], [f"q{i}"], name=f"split{i}"),
            helper.make_node("Transpose", [f"q{i}"], [f"qt{i}"], perm=[0, 2, 1, 3], name=f"qt{i}"),
            helper.make_node("Transpose", [f"q{i}"], [f"kt{i}"], perm=[0, 2, 3, 1], name=f"kt{i}"),
            helper.make_node("MatMul", [f"qt{i}", f"kt{i}"], [f"s{i}"], name=f"scores{i}"),
            helper.make_node("Softmax", [f"s{i}"], [f"p{i}"], axis=-1, name=f"softmax{i}"),
        ]
        cur = f"y{i}"
    nodes += [
        helper.make_node("Reshape", [cur, "flat"], ["flat_out"], name="flatten"),
        helper.make_node("Gemm", ["flat_out", "wg"], ["logits"], transB=1, name="head"),
        helper.make_node("Relu", ["logits"], ["out"], name="head_relu"),
    ]
    inits.append(_init("wg", 10, 64))
    x = helper.make_tensor_value_info("x", elem, ["batch", "seq", 64])
    outs = [helper.make_tensor_value_info("out", elem, None)] + [
        helper.make_tensor_value_info(f"p{i}", elem, None) for i in range(layers)
    ]
    return _model(nodes, [x], outs, inits)


def test_an_encoder_gives_dense_with_bias_and_activation_deduplicated_with_counts(tmp_path: Path) -> None:
    path = tmp_path / "enc.onnx"
    onnx.save(_encoder(layers=3), str(path))
    g = extract_onnx(path)
    assert g.inputs == {"batch": "x[0]", "seq": "x[1]"}
    found = {(o.op, tuple(o.dims.items()), tuple(o.attrs.items())): o.occurrences for o in g.ops}
    assert found == {
        ("dense", (("M", "batch*seq"), ("N", 256), ("K", 64)), (("bias", True), ("activation", "gelu"))): 3,
        ("dense", (("M", "batch*seq"), ("N", 64), ("K", 256)), (("bias", True),)): 3,
        ("batch_matmul", (("B", "4*batch"), ("M", "seq"), ("N", "seq"), ("K", 16)), ()): 3,
        ("dense", (("M", "batch*seq"), ("N", 10), ("K", 64)), (("bias", False), ("activation", "relu"))): 1,
    }
    up = g.ops[0]
    assert up.sources == ["up0", "up1", "up2"] and up.symbolic == ["M"] and up.inputs == ["batch", "seq"]
    # the fused bias adds and activations are part of their workloads, everything else is counted
    assert "Gelu" not in g.other_ops and "Relu" not in g.other_ops
    assert g.other_ops == {"Reshape": 4, "Transpose": 6, "Softmax": 3}
    assert g.unsupported == []
    assert g.to_workloads()[0] == {
        "op": "dense",
        "dtype": "float32",
        "dims": {"N": 256, "K": 64},
        "symbolic": ["M"],
        "attrs": {"bias": True, "activation": "gelu"},
    }
    assert g.to_workloads()[2]["symbolic"] == ["B", "M", "N"]


def test_distributions_come_from_the_input_histogram_as_a_product_of_independent_inputs() -> None:
    g = extract_onnx(_encoder(layers=1))
    dense = g.ops[0]
    dist = g.distribution_for(dense, histogram={"batch": {1: 3, 2: 1}, "seq": {"8": 1, 16: 1}})
    assert dist == {
        "kind": "explicit",
        "points": [
            {"shape": {"M": 8}, "weight": 0.375},
            {"shape": {"M": 16}, "weight": 0.375 + 0.125},  # batch 1 × seq 16 and batch 2 × seq 8 land together
            {"shape": {"M": 32}, "weight": 0.125},
        ],
    }
    scores = g.distribution_for(2, histogram={"batch": {1: 1}}, ranges={"seq": (1, 3)})
    assert [p["shape"] for p in scores["points"]] == [{"B": 4, "M": s, "N": s} for s in (1, 2, 3)]
    assert sum(p["weight"] for p in scores["points"]) == pytest.approx(1)
    with pytest.raises(ModelImportError, match=r"depends on 'seq'.*seq \(x\[1\]\)"):
        g.distribution_for(dense, histogram={"batch": {1: 1}})
    with pytest.raises(ModelImportError, match="no positive weight"):
        g.distribution_for(dense, histogram={"batch": {1: 0}, "seq": {1: 1}})
    # bounded before the values are listed: 10^12 values once took the machine's memory (issue 34 item 11)
    with pytest.raises(ModelImportError, match="more than the 4096"):
        g.distribution_for(dense, histogram={"batch": {1: 1}}, ranges={"seq": (1, 10**12)})


def test_flops_shares_at_a_given_seq() -> None:
    g = extract_onnx(_encoder(layers=1))
    shares = g.flops_shares({"batch": 1, "seq": 128})
    assert sum(shares) == pytest.approx(1)
    up = 2 * 128 * 256 * 64 + 128 * 256
    assert g.ops[0].flops({"batch": 1, "seq": 128}) == up


def test_unsupported_gemm_like_ops_are_listed_by_name_and_count_never_dropped() -> None:
    nodes = [
        helper.make_node("Conv", ["img", "wc"], ["c1"], pads=[1, 1, 1, 1], strides=[2, 2], name="stem"),
        helper.make_node("Relu", ["c1"], ["r1"], name="stem_relu"),
        helper.make_node("Conv", ["r1", "wg"], ["c2"], group=2, pads=[1, 1, 1, 1], name="grouped"),
        helper.make_node("Conv", ["c2", "wd"], ["c3"], dilations=[2, 2], name="dilated"),
        helper.make_node("ConvTranspose", ["c3", "wt"], ["c4"], name="up"),
        helper.make_node("Einsum", ["c4", "c4"], ["e"], equation="nchw,nchw->nc", name="ein"),
        helper.make_node("MatMul", ["vec", "vec"], ["dot"], name="dot"),
    ]
    inits = [_init("wc", 8, 3, 3, 3), _init("wg", 8, 4, 3, 3), _init("wd", 8, 8, 3, 3), _init("wt", 8, 8, 2, 2)]
    inputs = [
        helper.make_tensor_value_info("img", TensorProto.FLOAT, ["n", 3, 32, 32]),
        helper.make_tensor_value_info("vec", TensorProto.FLOAT, [16]),
    ]
    g = extract_onnx(_model(nodes, inputs, [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)], inits))
    [conv] = g.ops
    assert (conv.op, conv.dims, conv.attrs) == (
        "conv2d",
        {"N": "n", "H": 32, "W": 32, "CI": 3, "CO": 8, "KH": 3, "KW": 3},
        {"stride": 2, "padding": 1, "activation": "relu"},
    )
    listed = {(u.name, u.reason.split(" (")[0], u.count) for u in g.unsupported}
    assert listed == {
        ("Conv", "grouped convolution", 1),
        ("Conv", "dilated convolution", 1),
        ("ConvTranspose", "no KernelFleet operator expresses it", 1),
        ("Einsum", "no KernelFleet operator expresses it", 1),
        ("MatMul", "matrix-vector product", 1),
    }


def test_silu_and_gemm_bias() -> None:
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
        helper.make_node("Sigmoid", ["h"], ["s"]),
        helper.make_node("Mul", ["h", "s"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["tokens", 32])
    m = _model(nodes, [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)],
               [_init("w", 32, 48, dtype=np.float16), _init("b", 48, dtype=np.float16)])  # fmt: skip
    [op] = extract_onnx(m).ops
    assert (op.dims, op.attrs, op.dtype) == ({"M": "tokens", "N": 48, "K": 32}, {"bias": True, "activation": "silu"},
                                             "float16")  # fmt: skip


def test_bad_inputs_fail_with_clear_errors(tmp_path: Path) -> None:
    static = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    with pytest.raises(ModelImportError, match=r"no dynamic dims.*dim_param"):
        extract_onnx(_model(nodes, [static], out, [_init("w", 64, 8)]))
    dyn = helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 64])
    with pytest.raises(ModelImportError, match="computes in float64; workloads are float32, float16, bfloat16"):
        extract_onnx(_model(nodes, [dyn], out, [_init("w", 64, 8, dtype=np.float64)]))
    with pytest.raises(ModelImportError, match="no ONNX file"):
        extract_onnx(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00not a protobuf at all\xff" * 3)
    with pytest.raises(ModelImportError, match="is not an ONNX model"):
        extract_onnx(tmp_path / "junk.onnx")
    with pytest.raises(ModelImportError, match=r"takes a path or an onnx\.ModelProto"):
        extract_onnx(42)  # type: ignore[arg-type]


def test_cli_model_inspect_prints_the_table_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from typer.testing import CliRunner

    from kernelfleet import cli
    from kernelfleet.cli import app

    monkeypatch.setattr(cli.console, "width", 200)  # one row per op, whatever the terminal

    path = tmp_path / "enc.onnx"
    onnx.save(_encoder(layers=2), str(path))
    runner = CliRunner()
    out = runner.invoke(app, ["model", "inspect", str(path), "--at", "seq=128"], terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "FLOPs share at batch=1, seq=128" in out.output and "M=batch*seq, N=256, K=64" in out.output
    assert "bias=True, activation=gelu" in out.output and "Softmax ×2" in out.output
    hist = tmp_path / "traffic.json"
    hist.write_text(json.dumps({"batch": {"1": 1}, "seq": {"64": 1, "128": 1}}))
    out = runner.invoke(app, ["model", "inspect", str(path), "--json", "--histogram", str(hist)], terminal_width=200)
    assert out.exit_code == 0, out.output
    body = json.loads(out.output)
    assert body["inputs"] == {"batch": "x[0]", "seq": "x[1]"}
    assert body["ops"][0]["occurrences"] == 2 and body["ops"][0]["workload"]["symbolic"] == ["M"]
    assert body["ops"][0]["distribution"]["points"] == [{"shape": {"M": 64}, "weight": 0.5},
                                                         {"shape": {"M": 128}, "weight": 0.5}]  # fmt: skip
    bad = runner.invoke(app, ["model", "inspect", str(path), "--at", "tokens=3"])
    assert bad.exit_code != 0 and "the model's inputs are batch, seq" in str(bad.exception)


def test_workloads_and_distributions_are_what_the_service_accepts() -> None:
    from pydantic import TypeAdapter

    from service.models.distribution import ShapeDistribution, dims_of
    from service.models.workload import WorkloadSpec

    g = extract_onnx(_encoder(layers=1))
    traffic = {"batch": {1: 5, 4: 1}, "seq": {16: 2, 128: 1, 512: 1}}
    for op, body in zip(g.ops, g.to_workloads(), strict=True):
        attrs = {k: v for k, v in body["attrs"].items() if k != "activation"}  # the service adds it separately
        spec = WorkloadSpec.model_validate({**body, "attrs": attrs})
        dist = TypeAdapter(ShapeDistribution).validate_python(g.distribution_for(op, histogram=traffic))
        assert dims_of(dist) == set(spec.symbolic)
        for shape, _ in dist.support():
            spec.bind(shape)


def test_the_sdk_and_its_cli_load_neither_torch_nor_onnx_until_an_extractor_runs() -> None:
    import subprocess
    import sys

    code = (
        "import sys, kernelfleet.cli, kernelfleet.model_import as m; "
        "assert not {'torch', 'onnx', 'transformers'} & set(sys.modules), sorted(sys.modules); "
        "assert callable(m.extract_onnx) and 'onnx' not in sys.modules"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
