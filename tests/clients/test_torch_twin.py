"""kernelfleet.torch_twin: a forward `accelerate` runs as the model's own runs the original module tree (a twin
sharing every parameter and buffer with the accelerated model), not the wrappers on PyTorch (issue 33 round 2).

The tables here are vendor routes only, built in process (no uKernel to compile): numpy at S = 7..8 (with
vendor_routes="table" a dispatcher call, which the forward scope counts as a uKernel's), PyTorch at every other S.
So a forward at 5 rows runs no uKernel, one at 7 rows runs the dispatcher."""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import kernelfleet.torch as kf_torch
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.torch import AcceleratedLinear, AcceleratedModule, _candidates, _sites, accelerate, dense_workload
from kernelfleet.torch import workload_hash as hash_of

H, INTER = 16, 32
TARGET = "cd" * 16
PYTORCH_ROWS, TABLE_ROWS = 5, 7  # S routed to PyTorch, S the dispatcher runs


class Block(nn.Module):  # type: ignore[misc]
    """Above replaced layers: a float buffer, a forward that reads `training`, a fused GELU."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(H, INTER), nn.GELU(), nn.Linear(INTER, H)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.act(self.fc1(x))) * self.scale
        return y + 1.0 if self.training else y


class GatedMLP(nn.Module):  # type: ignore[misc]
    """A Llama MLP: gate and up are stacked by accelerate, its forward rewritten by torch.fx."""

    def __init__(self) -> None:
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(H, INTER, bias=False), nn.Linear(H, INTER, bias=False)
        self.down_proj, self.act_fn = nn.Linear(INTER, H, bias=False), nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Net(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.block, self.norm, self.mlp = Block(), nn.LayerNorm(H), GatedMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(self.block(x)))


def _net() -> Net:
    torch.manual_seed(0)
    return Net().eval()


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every workload a layer asks for first has a table: numpy at S 7..8, PyTorch elsewhere up to S 64."""
    real_sites = _sites

    def sites(root: nn.Module) -> Any:
        found = real_sites(root)
        for site in found:
            for epilogue in _candidates(site):
                specs[hash_of(dense_workload(site.dense.N, site.dense.K, epilogue))] = (site.dense, epilogue)
        return found

    specs: dict[str, Any] = {}

    def load(_loader: Any, h: str, *_: Any, **__: Any) -> Dispatcher:
        dense, epilogue = specs[h]
        intervals = (Interval(1, 6, None, "torch"), Interval(7, 8, None, "numpy"), Interval(9, 64, None, "torch"))
        return Dispatcher(DispatchTable(intervals, {}, epilogue), {}, N=dense.N, K=dense.K, source="cache")

    monkeypatch.setattr(kf_torch, "_sites", sites)
    monkeypatch.setattr(kf_torch, "load_dispatcher", load)


def _accelerate(model: nn.Module, tmp_path: Path, **kwargs: Any) -> AcceleratedModule:
    return accelerate(model, tmp_path, target=TARGET, print_summary=False, vendor_routes="table", **kwargs)


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Calls of AcceleratedLinear.forward and of nn.Linear.forward (the original layers')."""
    calls = {"accelerated": 0, "linear": 0}
    real_acc, real_linear = AcceleratedLinear.forward, nn.Linear.forward

    def acc(self: AcceleratedLinear, x: torch.Tensor) -> torch.Tensor:
        calls["accelerated"] += 1
        return real_acc(self, x)

    def linear(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        calls["linear"] += 1
        return real_linear(self, x)

    monkeypatch.setattr(AcceleratedLinear, "forward", acc)
    monkeypatch.setattr(nn.Linear, "forward", linear)
    return calls


def _own(fast: AcceleratedModule) -> nn.Module:
    own = fast._own
    assert own is not None
    return own.twin.root  # type: ignore[no-any-return]


def test_a_forward_that_runs_no_ukernel_runs_the_original_modules_bit_for_bit(
    tables: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _net()
    fast = _accelerate(model, tmp_path)
    assert isinstance(fast.module.block.fc1, AcceleratedLinear) and isinstance(fast.module.block.act, nn.Identity)
    x = torch.randn(PYTORCH_ROWS, H)
    with torch.inference_mode():
        expected = model(x)
        fast(x)  # the first forward at these shapes learns that no layer runs a uKernel
        calls = _count_calls(monkeypatch)
        for _ in range(3):
            assert torch.equal(fast(x), expected)  # the user's computation exactly, not merely close
    # 5 Linear calls per forward (fc1, fc2, gate, up, down), all of the original layers; no wrapper in between
    assert calls == {"accelerated": 0, "linear": 3 * 5}
    (decision,) = fast.forward_decisions().values()
    assert decision["no_ukernels"] and decision["own_forwards"] == 3 and decision["decision"] is None
    assert fast.stats()["block.fc1"]["calls"] == 1  # the layers count the first forward only (see stats())


def test_the_twins_forwards_report_the_calls_the_wrappers_would_have_made(tables: None, tmp_path: Path) -> None:
    """One call per wrapper per forward (gate and up stacked: one call), misses after the first forward (which ran
    the tables' PyTorch routes through the wrappers), each at most at that first call's time."""
    fast = _accelerate(_net(), tmp_path)
    x = torch.randn(PYTORCH_ROWS, H)
    with torch.inference_mode():
        for _ in range(4):
            fast(x)
    by_dispatcher = {id(layer.dispatcher): layer for layer in fast.layers.values()}
    assert len(by_dispatcher) == 4  # fc1 (+ GELU), fc2, gate+up stacked, down: four workloads
    for layer in by_dispatcher.values():
        assert isinstance(layer.dispatcher, Dispatcher)
        use = layer.dispatcher.usage()[PYTORCH_ROWS]
        assert use.calls == 4 and use.fallbacks == 3
        first = layer._torch_s[PYTORCH_ROWS]  # the first forward's call, timed in full
        assert first < use.seconds <= 4 * first + 1e-12  # own calls at most at it (less where the twin took less)


def test_a_forward_that_runs_the_dispatcher_keeps_the_tables(
    tables: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _net()
    fast = _accelerate(model, tmp_path)
    x = torch.randn(TABLE_ROWS, H)
    with torch.inference_mode():
        fast(x)
        calls = _count_calls(monkeypatch)
        for _ in range(3):
            torch.testing.assert_close(fast(x), model(x), atol=1e-5, rtol=1e-5)
    assert calls["accelerated"] == 3 * 4  # fc1, fc2, the stacked gate+up, down: the accelerated forward
    (decision,) = fast.forward_decisions().values()
    assert decision["runs_ukernels"] and not decision["no_ukernels"] and decision["own_forwards"] == 0


def test_a_forward_whose_layers_fell_back_for_the_call_teaches_nothing(
    tables: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under autograd every layer falls back to PyTorch; the same shapes in inference mode run the dispatcher."""
    model = _net()
    fast = _accelerate(model, tmp_path)
    x = torch.randn(TABLE_ROWS, H)
    fast(x)  # grad enabled, parameters requiring grad
    (decision,) = fast.forward_decisions().values()
    assert not decision["no_ukernels"]
    calls = _count_calls(monkeypatch)
    with torch.inference_mode():
        fast(x)
    assert calls["accelerated"] == 4 and fast.forward_decisions()[next(iter(fast.forward_decisions()))]["runs_ukernels"]


def test_the_twin_shares_every_tensor_and_is_no_part_of_the_model(tables: None, tmp_path: Path) -> None:
    model = _net()
    n_params = sum(p.numel() for p in model.parameters())
    fast = _accelerate(model, tmp_path)
    own = _own(fast)
    assert set(fast.module.state_dict()) == set(model.state_dict())
    assert sum(p.numel() for p in fast.parameters()) == n_params  # no weight memory added (the stacked one: views)
    accelerated_modules = {id(m) for m in fast.modules()}
    assert id(own) not in accelerated_modules and id(own.block) not in accelerated_modules
    assert all(name.startswith("module") for name, _ in fast.named_modules() if name)
    accelerated = {id(t) for t in (*fast.parameters(), *fast.buffers())}
    pointers = {t.data_ptr() for t in (*fast.parameters(), *fast.buffers())}
    twin_tensors = [*own.parameters(), *own.buffers()]
    assert len(twin_tensors) == len(list(model.parameters())) + len(list(model.buffers()))
    assert all(id(t) in accelerated and t.data_ptr() in pointers for t in twin_tensors)
    # the twin is the original tree: its classes, its activation module, its gated parent's own forward
    assert type(own.block.fc1) is nn.Linear and type(own.block.act) is nn.GELU and type(own.mlp) is GatedMLP
    assert own.norm is fast.module.norm  # a subtree accelerate left alone is the accelerated model's module


def test_gate_and_up_stay_views_of_the_stacked_weight_and_edits_reach_the_twin(tables: None, tmp_path: Path) -> None:
    model = _net()
    fast = _accelerate(model, tmp_path)
    own = _own(fast)
    stacked = fast.layers["mlp.gate_proj+up_proj"].weight
    for name in ("gate_proj", "up_proj"):
        weight = getattr(own.mlp, name).weight
        assert weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    x = torch.randn(PYTORCH_ROWS, H)
    fresh = Net().eval()  # other weights, loaded by name into the accelerated model
    with torch.inference_mode():
        fast(x)
        fast.module.load_state_dict(fresh.state_dict())
        assert torch.equal(fast(x), fresh(x))
        assert fast.forward_decisions()[next(iter(fast.forward_decisions()))]["own_forwards"] == 1
    with torch.no_grad():
        fast.module.mlp.up_proj.weight.mul_(0.5)  # in place on the accelerated model: the stacked weight's storage
        fresh.mlp.up_proj.weight.mul_(0.5)
        assert torch.equal(fast(x), fresh(x))
        assert torch.equal(stacked[INTER:], fresh.mlp.up_proj.weight)


def test_dtype_conversion_and_train_eval_reach_the_twin(tables: None, tmp_path: Path) -> None:
    model = _net()
    fast = _accelerate(model, tmp_path)
    own = _own(fast)
    x = torch.randn(PYTORCH_ROWS, H)
    with torch.inference_mode():
        fast(x)
    fast.double()  # Module._apply: parameters converted in place, the buffer reassigned in its module's dict
    model.double()
    assert own.block.scale is fast.module.block.scale and own.block.scale.dtype is torch.float64
    with torch.inference_mode():
        assert torch.equal(fast(x.double()), model(x.double()))
    fast.float()
    model.float()
    fast.train()  # the twin's copy of `block` reads `training` in its forward
    model.train()
    with torch.inference_mode():
        assert torch.equal(fast(x), model(x))
    fast.module.block.eval()  # a submodule alone
    model.block.eval()
    with torch.inference_mode():
        assert torch.equal(fast(x), model(x))
    (decision,) = fast.forward_decisions().values()
    assert decision["own_forwards"] == 3


def test_inplace_the_users_module_selects_the_twin_and_hooks_run_on_both_paths(tables: None, tmp_path: Path) -> None:
    model = _net()
    reference = copy.deepcopy(model)
    seen: list[str] = []
    model.block.fc1.register_forward_hook(lambda m, i, o: seen.append("before"))  # on the original layer
    fast = _accelerate(model, tmp_path, inplace=True)
    assert fast.module is model and isinstance(model.block.fc1, AcceleratedLinear)
    handle = model.block.fc1.register_forward_hook(lambda m, i, o: seen.append("after"))  # on the wrapper
    with torch.inference_mode():
        for rows in (TABLE_ROWS, PYTORCH_ROWS, PYTORCH_ROWS):  # tables; learning; the model's own
            x = torch.randn(rows, H)
            torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-5)  # the user's module, called
    assert seen == ["before", "after"] * 3
    handle.remove()
    with torch.inference_mode():
        model(torch.randn(PYTORCH_ROWS, H))
    assert seen[-1] == "before"
    assert [d["own_forwards"] for d in fast.forward_decisions().values()] == [0, 2]


def test_a_deep_copy_has_its_own_twin_sharing_the_copys_tensors(tables: None, tmp_path: Path) -> None:
    model = _net()
    fast = _accelerate(model, tmp_path)
    x = torch.randn(PYTORCH_ROWS, H)
    with torch.inference_mode():
        fast(x)
    twin = copy.deepcopy(fast)
    own = _own(twin)
    assert own is not _own(fast) and own.block.fc1.weight is twin.module.block.fc1.weight
    stacked = twin.layers["mlp.gate_proj+up_proj"].weight  # the copy's gate and up: views of the copy's stacked weight
    assert stacked is not fast.layers["mlp.gate_proj+up_proj"].weight
    for name in ("gate_proj", "up_proj"):
        weight = getattr(own.mlp, name).weight
        assert weight is getattr(twin.module.mlp, name).weight
        assert weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    assert torch.equal(stacked[INTER:], own.mlp.up_proj.weight)
    assert twin.module.block.train.twin is twin._own.twin  # the copy's train/eval reach the copy's twin
    inner = copy.deepcopy(fast.module)  # the accelerated module alone: its pair is rejoined too
    stacked = inner.mlp.gate_proj_up_proj.stacked.weight
    assert inner.mlp.up_proj.weight.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr()
    with torch.no_grad():
        twin.module.block.fc1.weight.zero_()
    with torch.inference_mode():
        assert torch.equal(fast(x), model(x)) and not torch.equal(twin(x), model(x))
    assert next(iter(twin.forward_decisions().values()))["own_forwards"] == 1


def test_without_the_twin_forwards_run_through_the_wrappers(
    tables: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kernelfleet import torch_twin

    monkeypatch.setattr(torch_twin, "BUILD_TWIN", False)
    fast = _accelerate(_net(), tmp_path)
    assert fast._own is None and "forward" not in fast.module.__dict__
    calls = _count_calls(monkeypatch)
    with torch.inference_mode():
        for _ in range(2):
            fast(torch.randn(PYTORCH_ROWS, H))
    assert calls["accelerated"] == 2 * 4 and next(iter(fast.forward_decisions().values()))["own_forwards"] == 0


def test_the_checks_eager_side_and_choice_run_the_twin(
    tables: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 7 rows the dispatcher runs; made 4 ms slower, the whole-forward check times the tables against the model's
    own forward — the twin — and keeps the twin: from then on no wrapper is called at these shapes."""
    from kernelfleet.torch_forward import EAGER

    real = Dispatcher.__call__

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.004)
        return real(*args, **kwargs)

    monkeypatch.setattr(Dispatcher, "__call__", slow)
    model = _net()
    fast = _accelerate(model, tmp_path)
    x = torch.randn(TABLE_ROWS, H)
    calls = _count_calls(monkeypatch)
    with torch.inference_mode():
        for _ in range(2000):  # until the check has chosen: its blocks keep forwards only after MODEL_SWITCH_S
            if fast.forward_choice(x) is not None:
                break
            fast(x)
        assert fast.forward_choice(x) == EAGER
        own_before, wrapped = calls["linear"], calls["accelerated"]
        assert own_before > 0  # the check's EAGER blocks ran the original layers
        for _ in range(3):
            assert torch.equal(fast(x), model(x))
    assert calls["accelerated"] == wrapped and calls["linear"] == own_before + 3 * 5 + 3 * 5  # (model(x) too)
