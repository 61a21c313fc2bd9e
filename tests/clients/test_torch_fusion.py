"""One fusion vocabulary for import and runtime (issue 33 item 1): what `extract_torch` lists is exactly the set of
workloads `accelerate` asks for first, fused the same way, on models neither was written against (DistilBERT from
its config, a Llama MLP stack), and nothing else (attention's matmuls are not tuned)."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.export import Dim  # noqa: E402

from kernelfleet.model_import import extract_torch  # noqa: E402
from kernelfleet.torch import _candidates, _sites, dense_workload, workload_hash  # noqa: E402
from kernelfleet.torch_fusion import fused_activations, gated_pairs  # noqa: E402


class LlamaMLP(nn.Module):  # type: ignore[misc]
    """transformers' LlamaMLP: down(act(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden: int = 64, inner: int = 176) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x: Any) -> Any:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Stack(nn.Module):  # type: ignore[misc]
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: Any) -> Any:
        for block in self.blocks:
            x = x + block(x)
        return x


class Functional(nn.Module):  # type: ignore[misc]
    """GELU as a function in the parent's forward: accelerate cannot take it out, so neither side fuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 128)
        self.out = nn.Linear(128, 64)

    def forward(self, x: Any) -> Any:
        return self.out(nn.functional.gelu(self.fc(x)))


class SharedActivation(nn.Module):  # type: ignore[misc]
    """One GELU module applied to two layers' outputs: replacing it by Identity would unfuse the other call."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.act = nn.Linear(64, 64), nn.Linear(64, 64), nn.GELU()

    def forward(self, x: Any) -> Any:
        return self.act(self.a(x)) + self.act(self.b(x))


class OutputUsedTwice(nn.Module):  # type: ignore[misc]
    """The layer's output also feeds a residual: the activation cannot be fused into the layer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(64, 64), nn.ReLU()

    def forward(self, x: Any) -> Any:
        y = self.fc(x)
        return self.act(y) + y


def _imported(model: nn.Module, inputs: Any, dynamic: Any) -> set[str]:
    graph = extract_torch(model, inputs, dynamic)
    assert all(op.op == "dense" for op in graph.ops)
    out = set()
    for op in graph.ops:
        attrs = {"bias": False, "activation": "none", **op.attrs}
        body = dense_workload(int(op.dims["N"]), int(op.dims["K"]))
        body["attrs"] = {"bias": attrs["bias"], "activation": attrs["activation"]}
        out.add(workload_hash(body))
    return out


def _asked_first(model: nn.Module) -> set[str]:
    return {workload_hash(dense_workload(s.dense.N, s.dense.K, _candidates(s)[0])) for s in _sites(model)}


def _distilbert() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.DistilBertConfig(n_layers=2, dim=64, hidden_dim=176, n_heads=4, vocab_size=100)
    return transformers.DistilBertModel(config).eval()


def test_distilbert_ffn_is_fused_on_both_sides_and_attention_is_not_tuned() -> None:
    model = _distilbert()
    fusions = fused_activations(model)
    assert {name: f.activation for name, f in fusions.items()} == {
        "transformer.layer.0.ffn.lin1": "gelu",
        "transformer.layer.1.ffn.lin1": "gelu",
    }  # the class-name patterns accelerate used before knew BERT and GPT-2 only: lin1 ran on PyTorch
    ids = torch.randint(0, 100, (2, 16))
    dynamic = {"input_ids": {0: Dim("batch"), 1: Dim("seq", max=512)}}
    assert _imported(model, {"input_ids": ids}, dynamic) == _asked_first(model)
    graph = extract_torch(model, {"input_ids": ids}, dynamic)
    assert [(u.name, u.count) for u in graph.unsupported] == [("scaled_dot_product_attention", 2)]


def test_llama_mlp_gate_and_up_are_one_stacked_layer_on_both_sides() -> None:
    """Issue 33 item 2: SwiGLU's gate and up projections as one dense layer of twice the width (X read once, one
    call); its act · product run after it, so no silu table is tuned."""
    model = Stack([LlamaMLP(), LlamaMLP()]).eval()
    assert fused_activations(model) == {}  # the gate's SiLU runs in its pair, not in a table's epilogue
    pairs = gated_pairs(model)
    assert {(p.gate, p.up, p.activation_module, p.activation, p.dense.N, p.dense.K) for p in pairs.values()} == {
        ("blocks.0.gate_proj", "blocks.0.up_proj", "blocks.0.act_fn", "silu", 352, 64),
        ("blocks.1.gate_proj", "blocks.1.up_proj", "blocks.1.act_fn", "silu", 352, 64),
    }
    assert [s.name for s in _sites(model)] == ["blocks.0.gate_proj+up_proj", "blocks.0.down_proj",
                                               "blocks.1.gate_proj+up_proj", "blocks.1.down_proj"]  # fmt: skip
    imported = _imported(model, (torch.randn(2, 64),), ({0: Dim("rows")},))
    assert imported == _asked_first(model)
    assert imported == {workload_hash(dense_workload(352, 64)), workload_hash(dense_workload(64, 176))}


def test_with_stacking_off_the_gate_fuses_its_activation_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    """The switch bench/accelerate_ab.py --compare stacking compares with: import and runtime still agree."""
    from kernelfleet import torch_fusion

    monkeypatch.setattr(torch_fusion, "STACK_GATED_PAIRS", False)
    model = Stack([LlamaMLP()]).eval()
    assert gated_pairs(model) == {} and set(fused_activations(model)) == {"blocks.0.gate_proj"}
    imported = _imported(model, (torch.randn(2, 64),), ({0: Dim("rows")},))
    assert imported == _asked_first(model) and len(imported) == 3  # gate+silu, up, down


def test_transformers_llama_mlp_from_its_config() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176, num_attention_heads=4, vocab_size=100)
    from transformers.models.llama.modeling_llama import LlamaMLP as HFLlamaMLP

    model = Stack([HFLlamaMLP(config)]).eval()
    assert {p.activation for p in gated_pairs(model).values()} == {"silu"}
    assert _imported(model, (torch.randn(2, 64),), ({0: Dim("rows")},)) == _asked_first(model)


class NotAPair(nn.Module):  # type: ignore[misc]
    """Gate and up on different inputs, and a product whose up side is used twice: nothing to stack."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.up, self.act = nn.Linear(64, 64), nn.Linear(64, 64), nn.SiLU()
        self.gate2, self.up2, self.act2 = nn.Linear(64, 64), nn.Linear(64, 64), nn.SiLU()

    def forward(self, x: Any) -> Any:
        a = self.act(self.gate(x)) * self.up(x * 2)
        u = self.up2(x)
        return a + self.act2(self.gate2(x)) * u + u


def test_gate_and_up_on_different_inputs_or_an_up_used_elsewhere_are_not_stacked() -> None:
    model = NotAPair()
    assert gated_pairs(model) == {}
    assert set(fused_activations(model)) == {"gate", "gate2"}
    assert _imported(model, (torch.randn(2, 64),), ({0: Dim("rows")},)) == _asked_first(model)


@pytest.mark.parametrize("model", [Functional(), SharedActivation(), OutputUsedTwice()], ids=type)
def test_what_accelerate_cannot_take_out_of_the_forward_is_fused_on_neither_side(model: nn.Module) -> None:
    assert fused_activations(model) == {}
    assert all(s.activation == "none" for s in _sites(model))
    assert _imported(model, (torch.randn(2, 64),), ({0: Dim("rows")},)) == _asked_first(model)


def test_a_parent_whose_forward_cannot_be_traced_fuses_nothing() -> None:
    class Branchy(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.act = nn.Linear(64, 64), nn.ReLU()

        def forward(self, x: Any) -> Any:
            if x.sum() > 0:  # data-dependent control flow: fx cannot trace it
                return self.act(self.fc(x))
            return self.fc(x)

    assert fused_activations(Branchy()) == {}
