"""Model onboarding from PyTorch (issue 25 §1): torch.export with Dims, GEMM-like ATen ops as workloads.

Models are built from configs with random weights (no hub download); two layers keep export around a second.
By default extract_torch lists what `accelerate` runs (issue 33 item 1: tests/clients/test_torch_fusion.py holds the
two to one answer); `only_accelerated=False` every GEMM-like operator, which the graph tests here read.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.export import Dim  # noqa: E402

from kernelfleet.model_import import ModelGraph, ModelImportError, extract_torch  # noqa: E402


def _found(g: ModelGraph) -> dict[tuple[Any, ...], int]:
    return {(o.op, tuple(o.dims.items()), tuple(o.attrs.items())): o.occurrences for o in g.ops}


class Block(torch.nn.Module):  # type: ignore[misc]
    """Linear+GELU (MLP), attention through SDPA, a bias-free projection, a conv with ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 256)
        self.down = torch.nn.Linear(256, 64, bias=False)
        self.up2 = torch.nn.Linear(64, 256)
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)

    def forward(self, x: Any, img: Any) -> Any:
        h = torch.nn.functional.gelu(self.up(x))
        q = x.view(x.shape[0], x.shape[1], 4, 16).transpose(1, 2)
        a = torch.nn.functional.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(x.shape)
        h2 = torch.nn.functional.gelu(self.up2(a), approximate="tanh")
        return self.down(h) + self.down(h2), torch.relu(self.conv(img))


def test_a_hand_built_block() -> None:
    batch, seq = Dim("batch"), Dim("seq", max=1024)
    g = extract_torch(
        Block(),
        (torch.randn(2, 16, 64), torch.randn(2, 3, 32, 32)),
        ({0: batch, 1: seq}, {0: batch}),
        only_accelerated=False,
    )
    assert g.inputs == {"batch": "x[0]", "seq": "x[1]"}
    assert g.host_library == "torch"  # its hosts run PyTorch: add_model tags the jobs so (test_client.py)
    assert _found(g) == {
        ("dense", (("M", "batch*seq"), ("N", 256), ("K", 64)), (("bias", True), ("activation", "gelu"))): 1,
        ("batch_matmul", (("B", "4*batch"), ("M", "seq"), ("N", "seq"), ("K", 16)), ()): 1,  # QKᵀ
        ("batch_matmul", (("B", "4*batch"), ("M", "seq"), ("N", 16), ("K", "seq")), ()): 1,  # A·V
        ("dense", (("M", "batch*seq"), ("N", 256), ("K", 64)), (("bias", True), ("activation", "gelu_tanh"))): 1,
        ("dense", (("M", "batch*seq"), ("N", 64), ("K", 256)), (("bias", False),)): 2,
        ("conv2d", (("N", "batch"), ("H", 32), ("W", 32), ("CI", 3), ("CO", 8), ("KH", 3), ("KW", 3)),
         (("stride", 2), ("padding", 1), ("activation", "relu"))): 1,
    }  # fmt: skip
    assert "gelu" not in g.other_ops and "relu" not in g.other_ops and g.unsupported == []
    sdpa = [o for o in g.ops if o.op == "batch_matmul"]
    assert [o.sources for o in sdpa] == [["scaled_dot_product_attention:QK^T"], ["scaled_dot_product_attention:AV"]]
    dist = g.distribution_for(sdpa[0], histogram={"batch": {1: 1, 2: 1}, "seq": {128: 3, 512: 1}})
    assert dist["points"][0] == {"shape": {"B": 4, "M": 128, "N": 128}, "weight": 0.375}
    assert g.to_workloads()[-1] == {
        "op": "conv2d",
        "dtype": "float32",
        "dims": {"H": 32, "W": 32, "CI": 3, "CO": 8, "KH": 3, "KW": 3},
        "symbolic": ["N"],
        "attrs": {"stride": 2, "padding": 1, "activation": "relu"},
    }


class Odd(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.grouped = torch.nn.Conv2d(4, 8, 3, groups=2)
        self.c1 = torch.nn.Conv1d(4, 4, 3)
        self.w = torch.nn.Parameter(torch.randn(32, 16))

    def forward(self, img: Any, seq: Any, x: Any) -> Any:
        # bmm over batch, mm with a weight plus a bias add and relu (fused), a matrix-vector product
        y = torch.relu(torch.mm(x, self.w) + torch.ones(16))
        z = torch.bmm(seq.transpose(1, 2), seq)
        return self.grouped(img), self.c1(seq), y, torch.matmul(x, torch.ones(32)), z


def test_bmm_mm_bias_fusion_and_unsupported_ops_listed() -> None:
    n = Dim("n")
    g = extract_torch(
        Odd(),
        (torch.randn(2, 4, 8, 8), torch.randn(2, 4, 10), torch.randn(3, 32)),
        {"img": {0: n}, "seq": {0: n}, "x": {0: Dim("rows")}},
        only_accelerated=False,
    )
    assert g.inputs == {"n": "img[0]", "rows": "x[0]"}
    assert _found(g) == {
        ("dense", (("M", "rows"), ("N", 16), ("K", 32)), (("bias", True), ("activation", "relu"))): 1,
        ("batch_matmul", (("B", "n"), ("M", 10), ("N", 10), ("K", 4)), ()): 1,
    }
    listed = {(u.name, u.reason.split(" (")[0], u.count) for u in g.unsupported}
    assert listed == {
        ("conv2d", "grouped convolution", 1),
        ("conv1d", "no KernelFleet operator expresses it", 1),
        ("matmul", "matrix-vector product", 1),
    }


def test_bad_inputs_fail_with_clear_errors() -> None:
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    with pytest.raises(ModelImportError, match="no dynamic dims: pass dynamic_shapes"):
        extract_torch(lin, (x,), None)
    with pytest.raises(ModelImportError, match="computes in float64; workloads are float32, float16, bfloat16"):
        extract_torch(torch.nn.Linear(8, 8).double(), (x.double(),), ({0: Dim("batch")},))
    with pytest.raises(ModelImportError, match=r"torch\.export failed"):  # the model fixes the dim it was told varies
        extract_torch(torch.nn.Linear(8, 8), (x,), ({1: Dim("features")},))
    with pytest.raises(ModelImportError, match=r"takes a torch\.nn\.Module"):
        extract_torch(lambda t: t, (x,), ({0: Dim("batch")},))
    half = extract_torch(torch.nn.Linear(8, 8).half(), (x.half(),), ({0: Dim("batch")},))
    assert [(o.dtype, o.dims) for o in half.ops] == [("float16", {"M": "batch", "N": 8, "K": 8})]
    brain = extract_torch(torch.nn.Linear(8, 8).bfloat16(), (x.bfloat16(),), ({0: Dim("batch")},))
    assert [o.dtype for o in brain.ops] == ["bfloat16"]  # a workload dtype (GPU ukernel jobs tune it)


def test_bert_base_from_its_config() -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.BertModel(transformers.BertConfig(num_hidden_layers=2)).eval()
    batch, seq = Dim("batch"), Dim("seq", max=512)
    ids = torch.randint(0, 100, (2, 16))
    g = extract_torch(
        model,
        {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
    )
    assert set(g.inputs) == {"batch", "seq"}
    assert _found(g) == {
        ("dense", (("M", "batch*seq"), ("N", 768), ("K", 768)), (("bias", True),)): 8,  # Q, K, V, out × 2 layers
        ("dense", (("M", "batch*seq"), ("N", 3072), ("K", 768)), (("bias", True), ("activation", "gelu"))): 2,
        ("dense", (("M", "batch*seq"), ("N", 768), ("K", 3072)), (("bias", True),)): 2,
        ("dense", (("M", "batch"), ("N", 768), ("K", 768)), (("bias", True),)): 1,  # the pooler (tanh not fused)
    }
    # attention's batch_matmuls: accelerate leaves SDPA to PyTorch, so they are listed as skipped, not tuned
    [sdpa] = g.unsupported
    assert (sdpa.name, sdpa.count) == ("scaled_dot_product_attention", 2) and "Linear/Conv1D layers only" in sdpa.reason
    shares = dict(zip((o.describe() for o in g.ops), g.flops_shares({"batch": 1, "seq": 128}), strict=True))
    assert sum(shares.values()) == pytest.approx(1)
    assert max(shares, key=lambda k: shares[k]).startswith("dense(M=batch*seq, N=768, K=768")


def test_gpt2_small_from_its_config() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=2, use_cache=False)
    model = transformers.GPT2LMHeadModel(config).eval()
    g = extract_torch(model, {"input_ids": torch.randint(0, 100, (2, 16))},
                      {"input_ids": {0: Dim("batch"), 1: Dim("seq", max=1024)}})  # fmt: skip
    found = _found(g)
    # HF's Conv1D is addmm with a bias; GPT-2's gelu_new is written out in elementwise ops inside its own module
    # (NewGELUActivation), which accelerate fuses into c_fc: listed fused, its elementwise ops not as others
    assert found[("dense", (("M", "batch*seq"), ("N", 2304), ("K", 768)), (("bias", True),))] == 2
    c_fc = ("dense", (("M", "batch*seq"), ("N", 3072), ("K", 768)), (("bias", True), ("activation", "gelu_tanh")))
    assert found[c_fc] == 2
    assert "tanh" not in g.other_ops
    assert found[("dense", (("M", "batch*seq"), ("N", 768), ("K", 3072)), (("bias", True),))] == 2
    assert found[("dense", (("M", "batch*seq"), ("N", 768), ("K", 768)), (("bias", True),))] == 2
    assert found[("dense", (("M", "batch*seq"), ("N", 50257), ("K", 768)), (("bias", False),))] == 1  # LM head
    assert sum(found.values()) == 2 * 4 + 1  # attention's matmuls are left to PyTorch (listed as skipped)
    everything = _found(extract_torch(model, {"input_ids": torch.randint(0, 100, (2, 16))},
                                      {"input_ids": {0: Dim("batch"), 1: Dim("seq", max=1024)}},
                                      only_accelerated=False))  # fmt: skip
    assert everything[("batch_matmul", (("B", "12*batch"), ("M", "seq"), ("N", "seq"), ("K", 64)), ())] == 2
    assert everything[("dense", (("M", "batch*seq"), ("N", 3072), ("K", 768)), (("bias", True),))] == 2


class Cnn(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.body = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x: Any) -> Any:
        return self.head(self.body(self.stem(x)).mean((2, 3)))


def test_a_cnn_with_dynamic_image_size_lists_the_conv_whose_size_is_no_product() -> None:
    dims = {0: Dim("batch"), 2: Dim("h", min=4, max=1024), 3: Dim("w", min=4, max=1024)}
    g = extract_torch(Cnn(), (torch.randn(2, 3, 32, 32),), (dims,), only_accelerated=False)
    assert g.inputs == {"batch": "x[0]", "h": "x[2]", "w": "x[3]"}
    assert [o.describe() for o in g.ops] == [
        "conv2d(N=batch, H=h, W=w, CI=3, CO=8, KH=3, KW=3; stride=2, padding=1)",
        "dense(M=batch, N=4, K=8; bias=True)",
    ]
    [body] = g.unsupported
    assert (body.name, body.count, body.sources) == ("conv2d", 1, ["conv2d_1"])
    assert body.reason.startswith("dim H = ") and "h" in body.reason and "not a product" in body.reason
    # unnamed dims: <input>_<axis>
    static = extract_torch(Cnn(), (torch.randn(2, 3, 32, 32),), ({0: Dim.AUTO},), only_accelerated=False)
    assert static.inputs == {"x_0": "x[0]"} and [o.dims["H"] for o in static.ops if o.op == "conv2d"] == [32, 16]
