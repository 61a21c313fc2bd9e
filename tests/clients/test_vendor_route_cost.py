"""A vendor-routed call does no per-call work beyond the library's own call (issue 31 item 2).

Timing a microsecond on a shared CI machine would be flaky, so these tests read what a warm call executes instead
(`sys.setprofile`): no lock, no table lookup, no re-validation of a bias or shapes seen before, no numpy views
around the caller's torch tensors. `bench/vendor_route_cost.py` measures what that buys.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import numpy as np
import pytest
import torch

from kernelfleet import vendor
from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry
from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue

# work a routed call must not repeat once its shape and arrays were seen: lookups, checks, locks, conversions
FORBIDDEN = {"program", "library", "vendor_route", "lookup", "interval", "check_bias", "check", "_record", "acquire"}


def _executed(fn: Callable[[], object]) -> list[str]:
    """The Python functions and C functions `fn` calls, by name, in order."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            seen.append(frame.f_code.co_name)
        elif event == "c_call":
            seen.append(getattr(arg, "__name__", repr(arg)))

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen


@pytest.mark.parametrize("library", vendor.LIBRARIES)
@pytest.mark.parametrize("epilogue", [Epilogue(), Epilogue(True, "gelu")])
def test_a_dense_vendor_route_runs_the_library_and_a_count(library: str, epilogue: Epilogue) -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 6), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32) if epilogue.bias else None
    x = rng.standard_normal((3, 6), dtype=np.float32)
    d = Dispatcher(DispatchTable((Interval(1, 4, None, library),), {}, epilogue), {}, N=8, K=6)
    first = d(x, w, bias=b)  # the first call for S resolves its route and checks the bias
    ran = _executed(lambda: d(x, w, bias=b))
    assert not FORBIDDEN & set(ran), ran
    assert d.usage()[3].calls == 2 and d.usage()[3].fallbacks == 0
    np.testing.assert_allclose(d(x, w, bias=b), first, rtol=1e-6)
    if library == vendor.TORCH:  # the weight's and bias's views are reused, not looked up again
        assert "_TorchViews" not in str(ran) and ran.count("from_numpy") == 1


def test_a_new_bias_is_still_checked() -> None:
    d = Dispatcher(DispatchTable((Interval(1, 4, None),), {}, Epilogue(True)), {}, N=8, K=6)
    x, w = np.ones((2, 6), np.float32), np.ones((8, 6), np.float32)
    d(x, w, bias=np.ones(8, np.float32))
    with pytest.raises(ValueError, match="bias must be"):
        d(x, w, bias=np.ones(7, np.float32))
    with pytest.raises(ValueError, match="pass bias="):
        d(x, w)


def test_a_conv_route_checks_a_pair_of_shapes_once() -> None:
    geometry = ConvGeometry(stride=1, padding=1, filter=(3, 3, 4, 5))
    for library in vendor.LIBRARIES:
        d = ConvDispatcher(Dispatcher(DispatchTable((Interval(1, 512, None, library),), {}), {}, N=5, K=36), geometry)
        x = np.ones((1, 6, 6, 4), np.float32)
        f = np.ones((3, 3, 4, 5), np.float32)
        d(x, f)
        ran = _executed(lambda d=d, x=x, f=f: d(x, f))  # type: ignore[misc]
        assert not FORBIDDEN & set(ran), (library, ran)
        assert d.usage()[36].calls == 2


def test_accelerate_runs_a_pytorch_route_on_the_callers_tensors_with_nothing_in_between() -> None:
    from kernelfleet.torch import AcceleratedLinear
    from kernelfleet.torch_fusion import dense_layer

    linear = torch.nn.Linear(6, 8).eval()
    dense = dense_layer(linear)
    assert dense is not None
    d = Dispatcher(DispatchTable((Interval(1, 4, None, vendor.TORCH),), {}, Epilogue(True)), {}, N=8, K=6)
    layer = AcceleratedLinear("l", linear, dense, d, "w", fused_bias=True, activation=None, max_rows=4)
    x = torch.randn(3, 6)
    with torch.no_grad():
        layer(x)
        ran = _executed(lambda: layer(x))
        torch.testing.assert_close(layer(x), linear(x))
    assert not FORBIDDEN & set(ran), ran
    assert "numpy" not in ran and "from_numpy" not in ran  # no numpy views around the caller's tensors
    assert layer.stats.calls == 3 and layer.stats.fallbacks == 0 and d.usage()[3].calls == 3


def test_a_warm_table_call_runs_the_checks_that_can_change_and_the_dispatcher_nothing_else() -> None:
    """Issue 33 item 4: the wrapper around a dispatcher call (its own cost: `bench/accelerate_overhead.py`'s stub)
    makes no Python call of its own once S is known to run on the table: no route lookup, no re-packing test
    through helper methods, no fallback ladder; an in-place weight update still reaches the dispatcher packed anew."""
    from kernelfleet.torch import AcceleratedLinear
    from kernelfleet.torch_fusion import dense_layer

    linear = torch.nn.Linear(6, 8).eval()
    dense = dense_layer(linear)
    assert dense is not None
    d = Dispatcher(DispatchTable((Interval(1, 4, None, vendor.NUMPY),), {}, Epilogue()), {}, N=8, K=6)
    layer = AcceleratedLinear("l", linear, dense, d, "w", fused_bias=False, activation=None, max_rows=4)
    layer.prepare()
    x = torch.randn(1, 3, 6)
    with torch.inference_mode():
        layer(x)  # the first call for S takes every check and remembers S's route
        ran = _executed(lambda: layer(x))
        torch.testing.assert_close(layer(x), linear(x))
        python_calls = [name for name in ran if name in {"forward", "_checked", "_weight_view", "_key", "_count"}]
        assert python_calls == ["forward"], ran
        assert "__call__" in ran  # the dispatcher itself
    with torch.no_grad():
        linear.weight.mul_(2)  # in place: the packed copy is stale
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), linear(x))
    assert layer.stats.calls == 4 and layer.stats.fallbacks == 0
