"""kernelfleet.torch.accelerate: a PyTorch module's Linear/Conv1D layers on dispatchers read from the signed cache.

uKernels are built locally (one per workload, a few seconds each) and published into a cache directory as the SDK
caches what the service serves: the signed document, its artifacts by sha256, the pinned key. A fake service
(httpx.MockTransport) serves the same documents for the client path and can go down; a client at an unreachable
URL reads the warm cache. Outputs are compared with PyTorch eager on the same module."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from torch import nn

from kernelfleet.client import Client
from kernelfleet.dispatch import DispatchTable, Interval, Shape
from kernelfleet.dispatch_cache import CachedDoc, DispatchCache
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import NO_EPILOGUE, Epilogue
from kernelfleet.in_model_check import IN_MODEL_CALLS
from kernelfleet.models import DispatchDoc, UKernelRef
from kernelfleet.signing import document_message
from kernelfleet.torch import AcceleratedLinear, accelerate, dense_workload, workload_hash
from service.models import WorkloadSpec
from service.tuning.hardware import host_target
from service.tuning.platforms import tvm_target
from service.tuning.tuners.ukernel.kernel import build_ukernel

TARGET = "ab" * 16  # a target fingerprint (the tables are built for this host)
H, INTER = 64, 256  # BERT hidden and intermediate sizes
S_MAX = 64
# (N, K, epilogue, vendor interval and its library): the workloads a 2-layer BERT(64, 256) and the MLPs below run
TABLES = [
    (H, H, Epilogue(True), (9, 16, "numpy")),  # Q, K, V, attention output, pooler; S 9..16 routed to numpy
    (INTER, H, Epilogue(True, "gelu"), None),  # intermediate dense + GELU, fused
    (H, INTER, Epilogue(True), (17, 24, "torch")),  # output dense; S 17..24 routed to PyTorch
    (INTER, H, Epilogue(True), None),  # the same layer unfused: for a ReLU that has no fused table
    (INTER, H, NO_EPILOGUE, None),  # a Llama MLP's gate and up projections (H → INTER/2 each), stacked
]
ATOL = 2e-4
# the fused GELU table's job timings (seconds per call): uKernels 3x faster than PyTorch at S=1, PyTorch routed at 64
TIMED = {
    "1": {"tuned": 1e-5, "vendor": 2e-5, "numpy": 2e-5, "torch": 3e-5, "route": "ukernel"},
    "64": {"tuned": 9e-5, "vendor": 6e-5, "numpy": 7e-5, "torch": 6e-5, "route": "torch"},
}


@dataclass
class Fleet:
    """Signed documents and artifacts as the service would serve them, and a warm cache holding them."""

    public_key: str
    cache: Path
    docs: dict[str, tuple[bytes, str]] = field(default_factory=dict)  # workload → (body, signature)
    artifacts: dict[str, bytes] = field(default_factory=dict)
    target: str = TARGET


def _sign(key: Ed25519PrivateKey, workload: str, body: bytes, target: str = TARGET) -> str:
    return base64.b64encode(key.sign(document_message(workload, target, body))).decode()


def _another_service(fleet: Fleet, target: str) -> Fleet:
    """Another service's tables for the same workloads on `target`: the same bodies and artifacts, signed with its
    own key (its cache is unused)."""
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    other = Fleet(public, fleet.cache, artifacts=fleet.artifacts, target=target)
    for wh, (body, _) in fleet.docs.items():
        doc = DispatchDoc.model_validate_json(body).model_copy(update={"target_fingerprint": target})
        signed = doc.model_dump_json().encode()
        other.docs[wh] = (signed, _sign(key, wh, signed, target))
    return other


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    root = tmp_path_factory.mktemp("fleet")
    out = Fleet(public, root / "cache")
    cache = DispatchCache(out.cache)
    target = tvm_target(host_target())
    for n, k, epilogue, vendor in TABLES:
        kernel = build_ukernel(n, k, 4, 32, 4, target, epilogue=epilogue)
        art = kernel.export(root / "artifacts")
        if vendor is None:
            intervals: tuple[Interval, ...] = (Interval(1, S_MAX, Shape((), "a")),)
        else:
            lo, hi, library = vendor
            intervals = (
                Interval(1, lo - 1, Shape((), "a")),
                Interval(lo, hi, None, library),
                Interval(hi + 1, S_MAX, Shape((), "a")),
            )
        table = DispatchTable(intervals, {"a": 4}, epilogue)
        wh = workload_hash(dense_workload(n, k, epilogue))
        doc = DispatchDoc(
            workload_hash=wh,
            target_fingerprint=TARGET,
            dim="M",
            s_max=S_MAX,
            table=table.to_dict(),
            ukernels=[
                UKernelRef(id="a", sha256=art.sha256, spec=art.spec.to_dict(), size_bytes=art.path.stat().st_size)
            ],
            predicted_latency_s=[1e-6] * S_MAX,
            measured_latency_s={},
            validation={"vendor_routes": {"timed_s": TIMED}} if epilogue.activation == "gelu" else {},
            created_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
        )
        body = doc.model_dump_json().encode()
        signature = _sign(key, wh, body)
        out.docs[wh] = (body, signature)
        out.artifacts[art.sha256] = art.path.read_bytes()
        cache.write_doc(wh, TARGET, CachedDoc(f'"{wh[:8]}"', body, signature))
        cache.put_artifact(art.sha256, out.artifacts[art.sha256])
    cache.pin_key("http://fleet.test", public)
    return out


def _bert(layers: int = 2) -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=100,
        hidden_size=H,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=INTER,
        max_position_embeddings=128,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return BertModel(config).eval()


def _mlp(act: nn.Module) -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(H, INTER), act, nn.Linear(INTER, H)).eval()


def test_the_sdk_hashes_dense_workloads_as_the_service_does() -> None:
    for epilogue in (NO_EPILOGUE, Epilogue(True), Epilogue(True, "gelu"), Epilogue(False, "silu")):
        spec = dense_workload(768, 3072, epilogue)
        assert workload_hash(spec) == WorkloadSpec.model_validate(spec).hash, epilogue


def test_bert_runs_on_the_dispatchers_and_matches_pytorch(fleet: Fleet) -> None:
    model = _bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fast = accelerate(model, fleet.cache)
    # inplace=False: the module given is untouched
    assert isinstance(model.encoder.layer[0].intermediate.dense, nn.Linear)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert set(fast.module.state_dict()) == set(before)  # the same keys: the wrappers hold the same parameters
    inter = fast.module.encoder.layer[0].intermediate
    assert isinstance(inter.dense, AcceleratedLinear) and isinstance(inter.intermediate_act_fn, nn.Identity)
    stats = fast.stats()
    assert len(stats) == 2 * 6 + 1 and all(s["source"] == "cache" for s in stats.values())
    assert stats["encoder.layer.0.intermediate.dense"]["fused"] == "+ bias, gelu"
    assert stats["encoder.layer.1.output.dense"]["fused"] == "+ bias"

    rng = np.random.default_rng(0)
    runs = [(1, 1), (1, 7), (2, 5), (3, 4), (1, 13), (4, 16), (2, 32)]  # S = batch·seq up to 64; 9..16 on numpy
    with torch.inference_mode():
        for batch, seq in runs:
            ids = torch.from_numpy(rng.integers(0, 100, (batch, seq)))
            expected = model(input_ids=ids).last_hidden_state
            got = fast(input_ids=ids).last_hidden_state
            torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-4, msg=f"batch={batch} seq={seq}")
    assert fast.fallbacks() == 0
    dense = fast.stats()["encoder.layer.0.attention.self.query"]
    assert dense["calls"] == len(runs) and dense["shapes"] == {1: 1, 7: 1, 10: 1, 12: 1, 13: 1, 64: 2}
    assert fast.stats()["pooler.dense"]["shapes"] == {1: 3, 2: 2, 3: 1, 4: 1}  # the [CLS] rows: S = batch

    # beyond the table's range (S = 2·40 > 64) and in float64: PyTorch runs them, counted per layer and reason
    with torch.inference_mode():
        ids = torch.from_numpy(rng.integers(0, 100, (2, 40)))
        torch.testing.assert_close(fast(input_ids=ids).last_hidden_state, model(input_ids=ids).last_hidden_state)
    q = fast.stats()["encoder.layer.0.attention.self.query"]
    assert q["fallbacks"] == 1 and q["reasons"] == {"range": 1} and q["fallback_shapes"] == {80: 1}
    assert fast.fallbacks() == 2 * 6  # the pooler's S = 2 is in range
    # the dispatcher heard of it too: telemetry reports S = 80 as a miss
    d = fast.layers["encoder.layer.0.attention.self.query"].dispatcher
    assert d is not None and d.usage()[80].fallbacks >= 1


def test_mlp_fuses_gelu_falls_back_to_the_unfused_table_for_relu_and_counts_fallbacks(fleet: Fleet) -> None:
    rng = np.random.default_rng(1)
    for act, fused in ((nn.GELU(), "+ bias, gelu"), (nn.ReLU(), "+ bias")):
        model = _mlp(act)
        fast = accelerate(model, fleet.cache, trusted_key=fleet.public_key)
        assert fast.stats()["0"]["fused"] == fused
        assert isinstance(fast.module[1], nn.Identity if fused.endswith("gelu") else nn.ReLU)
        with torch.no_grad():
            for lead in [(1,), (5,), (2, 3), (4, 4, 4)]:
                x = torch.from_numpy(rng.standard_normal((*lead, H), dtype=np.float32))
                torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
            assert fast.fallbacks() == 0
            x64 = torch.randn(3, H, dtype=torch.float64)
            torch.testing.assert_close(fast.double()(x64), model.double()(x64))
            fast.float()
            model.float()
        assert fast.stats()["0"]["reasons"] == {"dtype": 1} and fast.stats()["2"]["reasons"] == {"dtype": 1}
        # with grad enabled and parameters that require it, autograd must see the call: PyTorch runs it
        x = torch.randn(2, H)
        y = fast(x)
        assert y.grad_fn is not None and fast.stats()["0"]["reasons"]["autograd"] == 1
        torch.testing.assert_close(y, model(x))


def test_a_llama_mlp_runs_gate_and_up_as_one_call_of_the_stacked_table(fleet: Fleet) -> None:
    """Issue 33 item 2: gate and up projections as one dispatcher call of width 2·I (X read once); silu · up on its
    halves. The state dict keeps the original keys, and new weights loaded into them reach the stacked table."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaMLP

    torch.manual_seed(2)
    config = LlamaConfig(hidden_size=H, intermediate_size=INTER // 2, num_attention_heads=4, vocab_size=100)
    model = LlamaMLP(config).eval()
    fast = accelerate(model, fleet.cache, print_summary=False)
    on_tables = {s.name for s in fast.summary().layers if s.runs_on == "tables"}
    assert on_tables == {"gate_proj+up_proj"}  # down_proj (K = INTER/2) has no table here
    assert set(fast.module.state_dict()) == set(model.state_dict())
    x = torch.randn(3, 5, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(fast(x[0, :1]), model(x[0, :1]), atol=ATOL, rtol=1e-4)
    stacked = fast.stats()["gate_proj+up_proj"]
    assert stacked["calls"] == 2 and stacked["fallbacks"] == 0 and stacked["shapes"] == {15: 1, 1: 1}
    assert fast.stats()["down_proj"]["reasons"] == {"no_table": 2}

    fresh = LlamaMLP(config).eval()  # other weights, loaded by name into the accelerated module
    fast.module.load_state_dict(fresh.state_dict())
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), fresh(x), atol=ATOL, rtol=1e-4)
    assert fast.stats()["gate_proj+up_proj"]["fallbacks"] == 0
    torch.testing.assert_close(fast(x), fresh(x), atol=ATOL, rtol=1e-4)  # grad enabled: PyTorch, as for any layer
    assert fast.stats()["gate_proj+up_proj"]["reasons"] == {"autograd": 1}


def test_weights_changed_in_place_are_packed_again(fleet: Fleet) -> None:
    model = _mlp(nn.GELU())
    fast = accelerate(model, fleet.cache, inplace=True)
    assert fast.module is model and isinstance(model[0], AcceleratedLinear)
    x = torch.randn(6, H)
    with torch.no_grad():
        first = fast(x)
        model[0].weight.mul_(0.5)  # bumps the parameter's version
        reference = nn.functional.linear(nn.functional.gelu(nn.functional.linear(x, model[0].weight, model[0].bias)),
                                         model[2].weight, model[2].bias)  # fmt: skip
        torch.testing.assert_close(fast(x), reference, atol=ATOL, rtol=1e-4)
        assert not torch.allclose(first, reference, atol=1e-3)
        model[0].load_state_dict({"weight": torch.randn(INTER, H), "bias": torch.randn(INTER)})
        reference = nn.functional.linear(nn.functional.gelu(nn.functional.linear(x, model[0].weight, model[0].bias)),
                                         model[2].weight, model[2].bias)  # fmt: skip
        torch.testing.assert_close(fast(x), reference, atol=ATOL, rtol=1e-4)
    assert fast.fallbacks() == 0


def test_gpt2_conv1d_layers_run_transposed_weights_without_copies(fleet: Fleet) -> None:
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(2)

    class GPT2MLP(nn.Module):  # transformers' GPT2MLP shape: c_fc, act, c_proj (the fuse pattern matches by name)
        def __init__(self) -> None:
            super().__init__()
            self.c_fc, self.act, self.c_proj = Conv1D(INTER, H), nn.GELU(), Conv1D(H, INTER)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c_proj(self.act(self.c_fc(x)))

    model = GPT2MLP().eval()
    fast = accelerate(model, fleet.cache)
    assert fast.stats()["c_fc"]["fused"] == "+ bias, gelu" and isinstance(fast.module.act, nn.Identity)
    x = torch.randn(3, 5, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
    layer = fast.layers["c_fc"]
    assert np.shares_memory(layer._weight_view(layer.weight), layer.weight.detach().numpy())  # a view, packed once
    assert fast.fallbacks() == 0


class FakeService:
    """The service's dispatch endpoints over the fleet's signed documents; `down` makes every request fail."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.down = False
        self.batches: list[dict[str, Any]] = []
        self.requests = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/v1/dispatch":
            found = self.fleet.docs.get(request.url.params["workload"])
            if found is None or request.url.params["target"] != self.fleet.target:
                return httpx.Response(404, json={"detail": "no dispatch table"})
            body, signature = found
            return httpx.Response(200, content=body, headers={"ETag": '"1"', "X-KernelFleet-Signature": signature})
        if path.startswith("/v1/artifacts/"):
            return httpx.Response(200, content=self.fleet.artifacts[path.rsplit("/", 1)[1]])
        if path == "/v1/signing-key":
            return httpx.Response(200, json={"public_key": self.fleet.public_key})
        if path == "/v1/targets":
            return httpx.Response(200, json=[{"target_fingerprint": self.fleet.target, "kind": "llvm"}])
        if path == "/v1/telemetry":
            self.batches.append(json.loads(request.content))
            return httpx.Response(200, json={"accepted": True})
        return httpx.Response(404, json={"detail": "not found"})


@pytest.fixture
def service(fleet: Fleet) -> Iterator[FakeService]:
    yield FakeService(fleet)


def test_a_client_fetches_reports_shapes_and_keeps_running_when_the_service_goes_down(
    fleet: Fleet, service: FakeService, tmp_path: Path
) -> None:
    cache = tmp_path / "cold"
    client = Client("http://fleet.test", transport=httpx.MockTransport(service), retries=0, cache_dir=cache)
    model = _mlp(nn.GELU())
    fast = accelerate(model, client, telemetry_interval_s=3600)  # target: the service's one live target
    assert {s["source"] for s in fast.stats().values()} == {"service"}
    x = torch.randn(2, 3, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
        fast(torch.randn(70, H))  # past the table: PyTorch, reported as a miss
    assert fast.reporter is not None and fast.reporter.flush()
    records = [r for b in service.batches for r in b["records"]]
    shapes = {(r["workload_hash"], r["shape"]["M"]): (r["calls"], r["fallbacks"]) for r in records}
    fused = workload_hash(dense_workload(INTER, H, Epilogue(True, "gelu")))
    assert shapes[(fused, 6)] == (1, 0) and shapes[(fused, 70)] == (1, 1)
    fast.close()

    service.down = True  # the same client, the service unreachable: the warm cache serves verified tables
    again = accelerate(model, client, target=TARGET, telemetry=False)
    assert {s["source"] for s in again.stats().values()} == {"cache"}
    with torch.inference_mode():
        torch.testing.assert_close(again(x), model(x), atol=ATOL, rtol=1e-4)
    assert again.fallbacks() == 0


def test_an_unreachable_service_with_a_warm_cache_still_accelerates(fleet: Fleet) -> None:
    client = Client("http://127.0.0.1:9", retries=0, cache_dir=fleet.cache, trusted_key=fleet.public_key)
    model = _mlp(nn.GELU())
    fast = accelerate(model, client, telemetry=False)  # the target: the one the cache holds tables for
    assert {s["source"] for s in fast.stats().values()} == {"cache"}
    x = torch.randn(9, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
    assert fast.fallbacks() == 0


def test_layers_without_a_table_run_pytorch_and_count_every_call(tmp_path: Path) -> None:
    model = nn.Sequential(nn.Linear(24, 40), nn.SiLU(), nn.Linear(40, 8, bias=False)).eval()
    fast = accelerate(model, tmp_path, target=TARGET)  # an empty cache: nothing verified
    x = torch.randn(3, 24)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x))
    assert fast.stats()["0"]["reasons"] == {"no_table": 1} and fast.fallbacks() == 2
    assert isinstance(fast.module[1], nn.SiLU)  # nothing fused without a table


def test_workloads_name_a_layers_table_and_a_table_for_another_epilogue_is_not_used(fleet: Fleet) -> None:
    unfused = workload_hash(dense_workload(INTER, H, Epilogue(True)))
    output = workload_hash(dense_workload(H, INTER, Epilogue(True)))
    model = _mlp(nn.GELU())
    fast = accelerate(model, fleet.cache, workloads={"0": unfused})
    assert fast.stats()["0"]["fused"] == "+ bias" and isinstance(fast.module[1], nn.GELU)  # GELU stays in PyTorch
    # the last layer has no GELU after it: a fused table named for it computes another layer, so PyTorch runs it
    gelu = workload_hash(dense_workload(INTER, H, Epilogue(True, "gelu")))
    odd = accelerate(nn.Sequential(nn.Linear(H, INTER)).eval(), fleet.cache, workloads={"0": gelu})
    assert odd.stats()["0"]["fused"] == "none" and odd.layers["0"].dispatcher is None
    x = torch.randn(4, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(odd(x), nn.functional.linear(x, odd.module[0].weight, odd.module[0].bias))
    assert fast.fallbacks() == 0 and odd.stats()["0"]["reasons"] == {"no_table": 1}
    assert fast.stats()["2"]["workload"] == output


def test_rows_the_table_routes_to_pytorch_run_the_original_layer_on_the_callers_tensors(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The output layer's table sends S 17..24 to PyTorch: those calls run `linear` on the tensors themselves (no
    numpy views, no uKernel), count as the table's choice (not fallbacks), and give PyTorch's result."""
    model = _mlp(nn.GELU())
    fast = accelerate(model, fleet.cache, trusted_key=fleet.public_key)
    out_layer = fast.module[2]
    assert isinstance(out_layer, AcceleratedLinear)
    ran: list[int] = []
    real = nn.functional.linear
    monkeypatch.setattr(nn.functional, "linear", lambda *a, **k: ran.append(a[0].shape[0]) or real(*a, **k))
    with torch.no_grad():
        for S in (5, 17, 24, 25):
            x = torch.randn(S, H)
            torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
    # the reference model calls linear twice per input; ours once more, on its output layer, at S = 17 and 24 only
    assert [ran.count(S) for S in (5, 17, 24, 25)] == [2, 3, 3, 2]
    assert fast.fallbacks() == 0 and out_layer.stats.calls == 4
    usage = out_layer.dispatcher.usage()
    assert usage[17].calls == 1 and usage[17].fallbacks == 0


@pytest.mark.parametrize("vendor_routes", ["pytorch", "table"])
def test_numpy_routes_run_on_pytorch_unless_the_table_is_asked_for(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, vendor_routes: str
) -> None:
    """The H×H table sends S 9..16 to numpy. By default (vendor_routes="pytorch") a model's layer runs those S on
    PyTorch, like its PyTorch routes: one BLAS and one thread pool in the forward besides the uKernels; with
    "table" numpy runs them, as the table names."""
    model = nn.Sequential(nn.Linear(H, H)).eval()
    fast = accelerate(model, fleet.cache, trusted_key=fleet.public_key, vendor_routes=vendor_routes)
    layer = fast.layers["0"]
    ran: list[int] = []
    real = nn.functional.linear
    monkeypatch.setattr(nn.functional, "linear", lambda *a, **k: ran.append(a[0].shape[0]) or real(*a, **k))
    with torch.no_grad():
        for S in (4, 12):
            x = torch.randn(S, H)
            torch.testing.assert_close(fast(x), real(x, model[0].weight, model[0].bias), atol=ATOL, rtol=1e-4)
    assert ran == ([12] if vendor_routes == "pytorch" else [])  # S = 4 runs a uKernel either way
    assert fast.fallbacks() == 0 and layer.dispatcher.usage()[12].calls == 1
    with pytest.raises(ValueError, match="vendor_routes"):
        accelerate(model, fleet.cache, trusted_key=fleet.public_key, vendor_routes="numpy")


def _slow_one_side(monkeypatch: pytest.MonkeyPatch, slower: str, ukernel_method: str) -> dict[str, int]:
    """Calls counted per side of the in-model check — the uKernels (the Dispatcher method `ukernel_method`), PyTorch
    (the layer's own computation) —, the side named `slower` made 30 ms slower a call."""
    ran = {"ukernels": 0, "pytorch": 0}

    def slowed(side: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            ran[side] += 1
            if side == slower:
                time.sleep(0.03)  # far beyond what a loaded 2-core machine adds to either side
            return real(*args, **kwargs)

        return call

    real_ukernels = getattr(Dispatcher, ukernel_method)
    monkeypatch.setattr(Dispatcher, ukernel_method, slowed("ukernels", real_ukernels))
    monkeypatch.setattr(AcceleratedLinear, "_layer_in_torch", slowed("pytorch", AcceleratedLinear._layer_in_torch))
    return ran


@pytest.mark.parametrize("slower", ["ukernels", "pytorch"])
def test_each_ukernel_s_is_timed_against_pytorch_in_the_model_and_the_faster_kept(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, slower: str
) -> None:
    """S = 4 runs on the H×H table's uKernels. Inside the model its first calls alternate between the uKernels and
    the layer's PyTorch computation; the side made 30 ms slower here loses and later calls skip it."""
    model = nn.Sequential(nn.Linear(H, H)).eval()
    fast = accelerate(model, fleet.cache, trusted_key=fleet.public_key)
    fast._scope.check = False  # the layer's own check alone (the whole-forward one: test_torch_forward.py)
    ran = _slow_one_side(monkeypatch, slower, "__call__")
    x = torch.randn(4, H)
    with torch.inference_mode():
        for _ in range(1 + 2 * IN_MODEL_CALLS):  # the first call (checks, packing) is not a sample
            torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
        assert ran == {"ukernels": 1 + IN_MODEL_CALLS, "pytorch": IN_MODEL_CALLS}
        for _ in range(3):
            fast(x)
    kept = "pytorch" if slower == "ukernels" else "table"
    assert ran == ({"ukernels": 1 + IN_MODEL_CALLS, "pytorch": IN_MODEL_CALLS + 3} if kept == "pytorch"
                   else {"ukernels": 4 + IN_MODEL_CALLS, "pytorch": IN_MODEL_CALLS})  # fmt: skip
    checked = fast.stats()["0"]["in_model"][4]
    assert checked["runs"] == kept and fast.fallbacks() == 0
    assert (checked["ukernels_s"] > checked["pytorch_s"]) == (slower == "ukernels")
    unchecked = accelerate(model, fleet.cache, trusted_key=fleet.public_key, check_in_model=False)
    with torch.inference_mode():
        unchecked(x)
        unchecked(x)
    assert unchecked.stats()["0"]["in_model"] == {}


@pytest.mark.parametrize("slower", ["ukernels", "pytorch"])
def test_an_s_routed_to_a_library_is_timed_on_the_nearest_ukernels_in_the_model(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, slower: str
) -> None:
    """The H×H table sends S 9..16 to a library (numpy: PyTorch runs it in a model); its uKernel of 1..8 runs any S.
    Inside the model S = 12 is checked like a uKernel S, on that uKernel: where it wins, the dispatcher adopts S and
    later calls run it; where PyTorch wins, S stays where the table sent it."""
    model = nn.Sequential(nn.Linear(H, H)).eval()
    fast = accelerate(model, fleet.cache, trusted_key=fleet.public_key)
    fast._scope.check = False  # the layer's own check alone
    d = fast.layers["0"].dispatcher
    assert isinstance(d, Dispatcher) and d.vendor_route(12) == "numpy"
    ran = _slow_one_side(monkeypatch, slower, "_run_pieces")
    x = torch.randn(12, H)
    with torch.inference_mode():
        for _ in range(1 + 2 * IN_MODEL_CALLS + 3):  # the first call runs the table's route (not a sample)
            torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
    kept = "pytorch" if slower == "ukernels" else "table"
    assert ran == {
        "ukernels": IN_MODEL_CALLS + 3 * (kept == "table"),
        "pytorch": 1 + IN_MODEL_CALLS + 3 * (kept == "pytorch"),
    }
    assert fast.stats()["0"]["in_model"][12]["runs"] == kept and fast.fallbacks() == 0
    assert d.vendor_route(12) == (None if kept == "table" else "numpy")
    assert d.vendor_route(13) == "numpy"  # only the S checked moved


def test_layers_of_one_table_settle_each_s_together(fleet: Fleet) -> None:
    """Four H×H layers share the table's dispatcher and its in-model check: S = 4 settles within three forwards
    (each layer's first call, then two samples a side per forward), where one layer alone takes
    1 + 2 × IN_MODEL_CALLS calls; each layer runs the verdict from its next call on."""
    model = nn.Sequential(*(nn.Linear(H, H) for _ in range(4))).eval()
    fast = accelerate(model, fleet.cache, trusted_key=fleet.public_key)
    fast._scope.check = False  # the layers' checks alone
    x = torch.randn(4, H)
    layers = list(fast.layers.values())
    assert len(layers) == 4 and len({id(layer.in_model) for layer in layers}) == 1
    with torch.inference_mode():
        for _ in range(1 + 2 * IN_MODEL_CALLS // 4):
            torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
        assert layers[0].in_model.verdicts[4].ukernels_s is not None
        fast(x)
    verdicts = [fast.stats()[name]["in_model"].get(4) for name in fast.layers]
    assert all(v is not None and v["runs"] == verdicts[0]["runs"] for v in verdicts)  # type: ignore[index]


def _client(service: FakeService, cache: Path, url: str = "http://fleet.test", **kwargs: Any) -> Client:
    return Client(url, transport=httpx.MockTransport(service), retries=0, cache_dir=cache, **kwargs)


def test_accelerate_prints_and_returns_a_summary_and_names_each_layer_pytorch_runs(
    service: FakeService, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    model = nn.Sequential(nn.Linear(H, INTER), nn.GELU(), nn.Linear(INTER, H), nn.Linear(H, 8)).eval()  # no table: 3
    with caplog.at_level(logging.INFO):
        fast = accelerate(model, _client(service, tmp_path / "cache"), telemetry=False)
    summary = fast.summary()
    assert summary.target == TARGET and str(summary) in capsys.readouterr().err  # printed once, to stderr
    assert [layer.name for layer in summary.on_tables] == ["0", "2"]
    fc1, fc2, head = summary.layers
    assert (fc1.source, fc1.fused, fc2.fused) == ("service", "+ bias, gelu", "+ bias")
    # from the table's timings: 3x at S=1 (uKernels), 1x at S=64 (PyTorch routed); fc2's table has none
    assert fc1.speedup is not None and fc1.speedup.geomean == pytest.approx(math.sqrt(3)) and fc2.speedup is None
    assert head.runs_on == "pytorch" and head.reason is not None and "404: no dispatch table" in head.reason
    assert head.workload == workload_hash(dense_workload(8, H, Epilogue(True)))
    # the warning names the layer and PyTorch; nothing claims numpy runs a layer
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("layer 3 runs on PyTorch, not on a tuned table: workload")
    assert not [r for r in caplog.records if "numpy" in r.getMessage() and r.levelno >= logging.INFO]
    x = torch.randn(5, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x), atol=ATOL, rtol=1e-4)
    assert fast.stats()["3"]["reasons"] == {"no_table": 1}

    assert "PyTorch on 1 thread during a forward that runs uKernels" in str(summary)  # thread_policy="managed"

    quiet = accelerate(model, _client(service, tmp_path / "cache"), telemetry=False, print_summary=False)
    assert capsys.readouterr().err == "" and [layer.name for layer in quiet.summary().on_pytorch] == ["3"]
    host = accelerate(model, _client(service, tmp_path / "cache"), telemetry=False, thread_policy="host")
    # host threads: nothing narrowed, but the whole-forward check still runs (check_in_model)
    assert "as the caller set them" in str(host.summary()) and not host._scope.narrow_threads and host._scope.check
    unchecked = accelerate(
        model, _client(service, tmp_path / "cache"), telemetry=False, thread_policy="host", check_in_model=False
    )
    assert not unchecked._hooks and unchecked._scope is None
    with pytest.raises(ValueError, match="thread_policy"):
        accelerate(model, _client(service, tmp_path / "cache"), telemetry=False, thread_policy="mine")


def _targets(fast: Any) -> set[str]:
    return {layer.dispatcher.meta["target_fingerprint"] for layer in fast.layers.values()}


def test_a_shared_cache_holding_another_services_tables_neither_blocks_nor_serves_the_client(
    fleet: Fleet, service: FakeService, tmp_path: Path
) -> None:
    """Another service (another key) cached tables for the same workloads on its own target in the same directory:
    the client's live target wins, and with its service down it reads its own cached tables, not the other's."""
    other = FakeService(_another_service(fleet, "cd" * 16))
    shared = tmp_path / "shared"
    model = _mlp(nn.GELU())
    theirs = accelerate(model, _client(other, shared, "http://other.test"), telemetry=False)
    assert _targets(theirs) == {"cd" * 16} and theirs.fallbacks() == 0

    mine = _client(service, shared)
    fast = accelerate(model, mine, telemetry=False)
    assert _targets(fast) == {TARGET} and {s["source"] for s in fast.stats().values()} == {"service"}
    service.down = True  # both services' tables cached now: its own are the ones
    again = accelerate(model, mine, telemetry=False)
    assert _targets(again) == {TARGET} and {s["source"] for s in again.stats().values()} == {"cache"}
    x = torch.randn(6, H)
    with torch.inference_mode():
        torch.testing.assert_close(again(x), model(x), atol=ATOL, rtol=1e-4)
    assert again.fallbacks() == 0


def test_another_services_cached_tables_for_the_same_target_are_not_used_nor_an_error(
    fleet: Fleet, service: FakeService, tmp_path: Path
) -> None:
    """The same target fingerprint on another service (the same hardware, another fleet): its cached tables do not
    verify with this client's key. Keyed by service, they are not this client's to read: PyTorch runs the layers
    (the service being down), rather than accelerate failing on a signature it was never meant to check."""
    impostor = FakeService(_another_service(fleet, TARGET))
    shared = tmp_path / "shared"
    model = _mlp(nn.GELU())
    accelerate(model, _client(impostor, shared, "http://other.test"), telemetry=False)
    service.down = True
    fast = accelerate(model, _client(service, shared, trusted_key=fleet.public_key), target=TARGET, telemetry=False)
    assert {s["source"] for s in fast.stats().values()} == {"fallback"}  # no table: PyTorch runs both layers
    for layer in fast.layers.values():
        assert layer.dispatcher is not None and "no verified table cached" in layer.dispatcher.meta["reason"]
    x = torch.randn(3, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x))
    assert fast.stats()["0"]["reasons"] == {"no_table": 1}


def test_with_telemetry_one_call_in_holdout_runs_the_layers_pytorch_and_both_sides_are_reported(
    fleet: Fleet, service: FakeService, tmp_path: Path
) -> None:
    client = Client("http://fleet.test", transport=httpx.MockTransport(service), retries=0, cache_dir=tmp_path / "c")
    model = _mlp(nn.GELU())
    fast = accelerate(model, client, telemetry_interval_s=3600, holdout=3, check_in_model=False)
    x = torch.randn(6, H)
    with torch.inference_mode():
        want = model(x)
        for _ in range(10):  # the first call at S resolves its route; the next 9 take turns: every 3rd held out
            torch.testing.assert_close(fast(x), want, atol=ATOL, rtol=1e-4)  # either side computes the layer
    assert fast.reporter is not None and fast.reporter.flush()
    fused = workload_hash(dense_workload(INTER, H, Epilogue(True, "gelu")))
    record = next(r for b in service.batches for r in b["records"] if r["workload_hash"] == fused)
    held = record["holdout"]
    assert all("forward" in vars(layer) for layer in fast.layers.values())  # the held-out forward, per instance
    assert record["calls"] == 10 and held["baseline"] == "torch"
    assert held["baseline_calls"] == 3 and held["served_calls"] == 5  # (turns 2..10: 3, 6, 9 held out)
    assert held["baseline_s"] > 0 and held["served_s2"] > 0
    fast.close()

    plain = accelerate(model, client, telemetry_interval_s=3600, holdout=0)  # 0: no holdout, the hot path as is
    assert not any("forward" in vars(layer) for layer in plain.layers.values())
    plain.close()


def test_a_layer_without_a_table_holds_calls_out_too_so_the_fleet_learns_its_baseline(
    service: FakeService, tmp_path: Path
) -> None:
    """PyTorch on both sides: the fleet's noise floor, and the library the layer's hosts run before any table."""
    client = Client("http://fleet.test", transport=httpx.MockTransport(service), retries=0, cache_dir=tmp_path / "c")
    model = nn.Sequential(nn.Linear(24, 40)).eval()  # no table for this workload on the service
    fast = accelerate(model, client, target=TARGET, telemetry_interval_s=3600, holdout=3)
    x = torch.randn(5, 24)
    with torch.inference_mode():
        for _ in range(10):
            torch.testing.assert_close(fast(x), model(x))
    assert fast.reporter is not None and fast.reporter.flush()
    [record] = [r for b in service.batches for r in b["records"]]
    assert record["calls"] == 10 and record["fallbacks"] == 10  # every call a miss: nothing is tuned for it
    held = record["holdout"]
    assert held["baseline"] == "torch" and held["baseline_calls"] == 3 and held["served_calls"] == 6
    fast.close()


def test_a_table_of_another_operator_family_is_not_run_as_a_linear_layer(tmp_path: Path) -> None:
    from tests.clients.row_scale_table import RowScaleTable  # a test-only family (tests/clients/test_tables.py)

    key = Ed25519PrivateKey.generate()
    public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
    model = nn.Sequential(nn.Linear(H, H)).eval()
    wh = workload_hash(dense_workload(H, H, Epilogue(True)))
    doc = DispatchDoc(
        workload_hash=wh,
        target_fingerprint=TARGET,
        dim="M",
        s_max=4,
        table=RowScaleTable(4, 2.0).to_json(),
        ukernels=[],
        predicted_latency_s=[1e-6] * 4,
        measured_latency_s={},
        created_at=dt.datetime(2025, 1, 1, tzinfo=dt.UTC),
    )
    body = doc.model_dump_json().encode()
    cache = DispatchCache(tmp_path)
    cache.write_doc(wh, TARGET, CachedDoc('"e"', body, _sign(key, wh, body)))
    fast = accelerate(model, tmp_path, target=TARGET, trusted_key=public, workloads={"0": wh}, print_summary=False)
    (layer,) = fast.summary().layers
    assert (
        layer.runs_on == "pytorch" and layer.reason is not None and "a RowScale table, not a dense one" in layer.reason
    )
    x = torch.randn(3, H)
    with torch.inference_mode():
        torch.testing.assert_close(fast(x), model(x))
