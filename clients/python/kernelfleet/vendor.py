"""The vendor libraries a dispatch table routes shapes to, each run as a host without uKernels would call it.

A `ukernel` job times every vendor library its worker has (numpy, and PyTorch where it is installed) next to
the uKernels, as the SDK calls them, and routes a shape to a library only where that library was the fastest
of all. numpy and PyTorch trade places across shapes (MKL/oneDNN against OpenBLAS), so a table names the
library per route. On the wire a route is "vendor" (numpy: the one vendor before PyTorch was measured, so
older tables read as they were) or "vendor:torch".

PyTorch runs on the caller's numpy arrays without copies (`torch.from_numpy`, `.numpy()`), on PyTorch's own
thread pool, exactly as the job timed it. A host without PyTorch runs numpy for a torch route: the same
result, only slower there (logged once); the route still counts as the table's choice, not a miss.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from kernelfleet.epilogue import Epilogue, apply_epilogue

log = logging.getLogger(__name__)

NUMPY = "numpy"
TORCH = "torch"
LIBRARIES = (NUMPY, TORCH)
VENDOR = "vendor"  # the wire form of a route to numpy; a route to another library is "vendor:<library>"
# the job tag naming the library a workload's hosts run without KernelFleet (service.tuning.kinds.host_library)
HOST_LIBRARY_TAG = "host_library"


def route_of(library: str) -> str:
    """The wire form of a route to `library`."""
    if library not in LIBRARIES:
        raise ValueError(f"unknown vendor library {library!r}; known: {', '.join(LIBRARIES)}")
    return VENDOR if library == NUMPY else f"{VENDOR}:{library}"


def library_of(route: str | None) -> str | None:
    """The library a wire route names, or None when the route is not a vendor route (a uKernel id, a hole)."""
    if route is None or (route != VENDOR and not route.startswith(VENDOR + ":")):
        return None
    library = NUMPY if route == VENDOR else route[len(VENDOR) + 1 :]
    if library not in LIBRARIES:
        raise ValueError(f"unknown vendor route {route!r}; this SDK knows {', '.join(map(route_of, LIBRARIES))}")
    return library


def is_vendor(route: str | None) -> bool:
    return library_of(route) is not None


@functools.cache
def has_torch() -> bool:
    """Whether this process can run the PyTorch routes (imported on first need: it is an optional dependency)."""
    return importlib.util.find_spec("torch") is not None


def available() -> tuple[str, ...]:
    """The vendor libraries this process can run: numpy, and PyTorch where it is installed."""
    return tuple(lib for lib in LIBRARIES if lib != TORCH or has_torch())


def runnable(library: str) -> str:
    """The library a route to `library` runs on this host: itself, or numpy when PyTorch is absent."""
    if library == TORCH and not has_torch():
        _warn_no_torch()
        return NUMPY
    return library


@functools.cache
def _warn_no_torch() -> None:
    log.warning("a dispatch table routes some shapes to PyTorch, which this host lacks: numpy runs them instead")


@functools.cache
def _torch_activation(activation: str) -> Callable[[Any], Any]:
    import torch

    F = torch.nn.functional
    table: dict[str, Callable[[Any], Any]] = {
        "none": lambda y: y,
        "relu": lambda y: F.relu(y, inplace=True),
        "gelu": F.gelu,
        "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
        "silu": lambda y: F.silu(y, inplace=True),
    }
    return table[activation]


_VIEWS_KEPT = 256  # PyTorch views of long-lived arrays (weights, biases) kept per process


class _TorchViews:
    """PyTorch tensors over numpy arrays (`torch.from_numpy`: the same memory, so an array changed in place is
    seen), one per array while it lives, found by identity: weights and biases are reused across calls, and
    wrapping them anew costs a few µs per call at the small shapes PyTorch wins. No autograd: none of them
    requires a gradient, so PyTorch records nothing and no inference-mode guard is needed per call."""

    def __init__(self) -> None:
        self._views: dict[int, tuple[weakref.ref[np.ndarray], Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, a: np.ndarray) -> Any:
        entry = self._views.get(id(a))
        if entry is not None and entry[0]() is a:
            return entry[1]
        import torch

        view = torch.from_numpy(a)
        with self._lock:
            if len(self._views) >= _VIEWS_KEPT:
                self._views = {k: v for k, v in self._views.items() if v[0]() is not None}
                if len(self._views) >= _VIEWS_KEPT:
                    self._views.clear()
            self._views[id(a)] = (weakref.ref(a), view)
        return view


_torch_view = _TorchViews()


DenseCall = Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]  # (x, w, bias) → act(x·wᵀ + bias)


def dense_call(library: str, epilogue: Epilogue) -> DenseCall:
    """The call a route to `library` makes for a layer with `epilogue`, resolved once: which library runs (numpy
    where PyTorch is absent), which activation, no per-call branching. A dispatcher makes one per library and keeps
    it per routed S, so a vendor-routed call costs what calling the library directly costs plus a dict lookup
    (issue 31 item 2). Each call object remembers the last weight and bias it saw (so, one per layer: not shared)."""
    if runnable(library) == NUMPY:
        if epilogue.trivial:
            return _numpy_matmul

        def numpy_dense(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
            return apply_epilogue(x @ w.T, bias, epilogue)

        return numpy_dense
    import torch

    linear, from_numpy = torch.nn.functional.linear, torch.from_numpy
    activation = None if epilogue.activation == "none" else _torch_activation(epilogue.activation)
    views = _torch_view
    # the last (array, view) pairs, each swapped in whole (a concurrent caller sees an old pair or a new one, never a
    # mix): a layer's calls in a row skip the view lookup
    last: list[tuple[Any, Any]] = [(None, None), (None, None)]

    def torch_dense(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        wv, bv = last
        if wv[0] is not w:
            last[0] = wv = (w, views(w))
        if bv[0] is not bias:
            last[1] = bv = (bias, None if bias is None else views(bias))
        y = linear(from_numpy(x), wv[1], bv[1])
        out: np.ndarray = (y if activation is None else activation(y)).numpy()
        return out

    return torch_dense


def _numpy_matmul(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    y: np.ndarray = x @ w.T
    return y


def dense(library: str, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, epilogue: Epilogue) -> np.ndarray:
    """act(X·Wᵀ + bias) on `library`: numpy's `x @ w.T` then the epilogue, or PyTorch's `linear` and activation.
    Resolves the call each time: a caller that calls (or times) it repeatedly keeps `dense_call`'s call instead."""
    return dense_call(library, epilogue)(x, w, bias if epilogue.bias else None)


def numpy_bmm(a: np.ndarray, bt: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """C[B,M,N] = A[B,M,K]·Bt[B,N,K]ᵀ with numpy's batched matmul, as a host without uKernels computes it
    (`out=None` passed to numpy costs 0.35 µs of a 3 µs call at small T: left out when there is none)."""
    c: np.ndarray = np.matmul(a, bt.transpose(0, 2, 1)) if out is None else np.matmul(a, bt.transpose(0, 2, 1), out=out)
    return c


def bmm(library: str, a: np.ndarray, bt: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """C[B,M,N] = A[B,M,K]·Bt[B,N,K]ᵀ on `library` (the right operand as a transposed view, no copy), into
    `out` when given."""
    if runnable(library) == NUMPY:
        return numpy_bmm(a, bt, out)
    import torch

    c = torch.bmm(torch.from_numpy(a), torch.from_numpy(bt).transpose(1, 2))
    if out is None:
        y: np.ndarray = c.numpy()
        return y
    out[...] = c.numpy()
    return out


def torch_conv_weight(f: np.ndarray) -> Any:
    """An HWIO filter as PyTorch's OIHW weight in channels_last memory (how a channels_last model holds it)."""
    import torch

    return torch.from_numpy(f).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)


def torch_conv2d(x: np.ndarray, weight: Any, stride: int, padding: int) -> np.ndarray:
    """O[N,OH,OW,CO] for an NHWC input with PyTorch's conv2d on the channels_last view (oneDNN's direct conv)."""
    import torch

    y = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2), weight, stride=stride, padding=padding)
    out: np.ndarray = np.ascontiguousarray(y.permute(0, 2, 3, 1).numpy())
    return out
