"""accelerate's forward scope, threads (issue 33 item 3): once an accelerated forward runs a table's kernels, PyTorch
runs on one thread (its own ops and the layers routed to it), so no libgomp worker spins on the cores the uKernels
need; the first forward at an input signature narrows at its first table call, later ones at their start; a forward
whose layers all run on PyTorch changes nothing; after the forward (returned or raised) the caller's setting is as it
was, and nothing else changed."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from kernelfleet.torch import AcceleratedLinear
from kernelfleet.torch_forward import ForwardScope
from kernelfleet.torch_fusion import dense_layer


class Probe(nn.Module):  # type: ignore[misc]
    """Records PyTorch's thread count when the model's own ops run here; raises when told to."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []
        self.fail = False

    def forward(self, x: Any) -> Any:
        self.seen.append(torch.get_num_threads())
        if self.fail:
            raise RuntimeError("the model's own op failed")
        return torch.nn.functional.layer_norm(x, x.shape[-1:])


def _layer(library: str, scope: ForwardScope | None, k: int = 6) -> AcceleratedLinear:
    linear = nn.Linear(k, 8).eval()
    dense = dense_layer(linear)
    assert dense is not None
    d = Dispatcher(DispatchTable((Interval(1, 8, None, library),), {}, Epilogue()), {}, N=8, K=k)
    layer = AcceleratedLinear("l", linear, dense, d, "w", fused_bias=False, activation=None, max_rows=8)
    layer.forward_scope = scope
    return layer


def test_the_models_own_ops_run_on_one_thread_and_the_callers_count_is_back_after(two_threads: None) -> None:
    scope = ForwardScope(check=False)
    before, after = Probe(), Probe()
    model = nn.Sequential(before, _layer(vendor.NUMPY, scope), after).eval()
    hooks = scope.install(model)
    with torch.inference_mode():
        model(torch.randn(3, 6))
        model(torch.randn(3, 6))
    # the first forward narrowed at the table's call (the op before it ran on the caller's threads), the second at
    # its start: the signature is known to run the table
    assert before.seen == [2, 1] and after.seen == [1, 1] and torch.get_num_threads() == 2
    after.fail = True
    with pytest.raises(RuntimeError, match="own op failed"), torch.inference_mode():
        model(torch.randn(3, 6))
    assert torch.get_num_threads() == 2  # restored although the forward raised
    for hook in hooks:
        hook.remove()
    after.fail = False
    with torch.inference_mode():
        model(torch.randn(3, 6))
    assert after.seen[-1] == 2  # hooks removed: the caller's threads throughout


def test_a_layer_pytorch_computes_inside_a_narrowed_forward_runs_on_one_thread(
    two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    scope = ForwardScope(check=False)
    # the table routes every S to PyTorch; given the caller's threads back, its workers would spin on the uKernels'
    # cores for milliseconds after it (a FFN uKernel ran 10x slower behind 2-thread PyTorch ops)
    layer = _layer(vendor.TORCH, scope, k=8)
    seen: list[int] = []
    original = AcceleratedLinear._layer_in_torch

    def recording(self: AcceleratedLinear, x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.get_num_threads())
        return original(self, x)

    monkeypatch.setattr(AcceleratedLinear, "_layer_in_torch", recording)
    probe = Probe()
    model = nn.Sequential(_layer(vendor.NUMPY, scope), layer, probe).eval()  # the first layer's table narrows
    scope.install(model)
    x = torch.randn(3, 6)
    with torch.inference_mode():
        model(x)
        model(x)
    assert seen == [1, 1] and probe.seen == [1, 1] and torch.get_num_threads() == 2


def test_a_forward_whose_layers_all_run_on_pytorch_keeps_the_callers_threads(two_threads: None) -> None:
    scope = ForwardScope(check=False)
    probe = Probe()
    model = nn.Sequential(_layer(vendor.TORCH, scope), probe).eval()
    scope.install(model)
    with torch.inference_mode():
        model(torch.randn(3, 6))
    assert probe.seen == [2] and torch.get_num_threads() == 2


def test_a_nested_scope_keeps_the_outer_callers_count(two_threads: None) -> None:
    scope = ForwardScope(check=False)
    probe = Probe()
    inner = nn.Sequential(_layer(vendor.NUMPY, scope), probe)
    outer = nn.Sequential(inner)
    scope.install(outer)
    scope.install(inner)  # entered again inside the outer forward: the depth count keeps the caller's value
    with torch.inference_mode():
        outer(torch.randn(2, 6))
    assert probe.seen == [1] and torch.get_num_threads() == 2
