"""conv2d on inference hosts as an implicit GEMM: O[N,OH,OW,CO] = I[N,H,W,CI] ⊛ F[KH,KW,CI,CO] (NHWC input,
HWIO filter: the operator's layout), through the dense uKernels of a table over M = N·OH·OW.

A conv layer is the dense layer Y[M, CO] = X[M, K]·Wᵀ with M = N·OH·OW, K = KH·KW·CI: X is the input's im2col
matrix (row (n, oh, ow) holds the KH×KW×CI window under output pixel (oh, ow), zeros where it overlaps the
padding), W[CO, K] the filter read as a matrix, and Y is the NHWC output read as a matrix. A `ConvDispatcher`
reads (N, H, W) off the input, computes M in O(1), builds X (a free reshape for a 1×1, stride-1, unpadded
layer; otherwise one strided copy per filter tap) and calls the dense `Dispatcher` (kernelfleet.dispatcher),
which picks the program for M from its table exactly as for a dense layer, or numpy where the table routes M
to numpy or where there is no table (then every call counts as a miss). Where the table routes M to PyTorch,
the dispatcher runs PyTorch's own conv2d on the NHWC input (a channels_last view, no im2col: kernelfleet.vendor),
the library the job measured fastest there.

The service publishes a conv table as a `kernelfleet.tables.ConvTable` (the dense table and the geometry); it is
signed and cached like any other (kernelfleet.dispatch_cache).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernelfleet import vendor
from kernelfleet.dispatch import Piece
from kernelfleet.dispatcher import MAX_TRACKED_SHAPES, Dispatcher

_now = time.perf_counter
CONV_DIMS = ("N", "H", "W")  # the dims a conv table may leave symbolic: those that only change M


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    """An output extent: (size + 2·padding − kernel) // stride + 1 (≤ 0: the output is empty)."""
    return (size + 2 * padding - kernel) // stride + 1


@dataclass(frozen=True)
class ConvGeometry:
    """What turns a conv call into the dense one: the stride and padding (the same on both axes), the filter's
    sizes (KH, KW, CI, CO; None: any, read off the filter, as the numpy fallback does) and the static sizes of
    N, H and W (a call with other sizes is refused)."""

    stride: int = 1
    padding: int = 0
    filter: tuple[int, int, int, int] | None = None
    static: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.stride < 1 or self.padding < 0:
            raise ValueError(f"stride must be ≥ 1 and padding ≥ 0, got stride={self.stride}, padding={self.padding}")
        unknown = set(self.static) - set(CONV_DIMS)
        if unknown:
            raise ValueError(f"static conv dims are among {CONV_DIMS}, got {sorted(unknown)}")

    @property
    def K(self) -> int | None:
        """The GEMM's reduction depth KH·KW·CI (None while the filter is not fixed)."""
        return None if self.filter is None else self.filter[0] * self.filter[1] * self.filter[2]

    def output_hw(self, H: int, W: int, KH: int, KW: int) -> tuple[int, int]:
        return conv_out(H, KH, self.stride, self.padding), conv_out(W, KW, self.stride, self.padding)

    def rows(self, shape: Mapping[str, int]) -> int:
        """M = N·OH·OW for the full shape {N, H, W} (static ones may be left out), the filter fixed."""
        if self.filter is None:
            raise ValueError("rows() needs the geometry's filter sizes")
        full = {**self.static, **shape}
        oh, ow = self.output_hw(full["H"], full["W"], self.filter[0], self.filter[1])
        return full["N"] * max(0, oh) * max(0, ow)

    def check(self, x: np.ndarray, f: np.ndarray) -> tuple[int, int, int]:
        """(N, OH, OW) of a call, once the input and filter fit the layer."""
        if x.ndim != 4 or f.ndim != 4 or x.shape[3] != f.shape[2]:
            raise ValueError(
                f"need an NHWC input I[N,H,W,CI] and an HWIO filter F[KH,KW,CI,CO]; got {list(x.shape)} and "
                f"{list(f.shape)}"
            )
        if self.filter is not None and tuple(f.shape) != self.filter:
            raise ValueError(f"this layer's filter is [KH,KW,CI,CO] = {list(self.filter)}, got {list(f.shape)}")
        for dim, size in zip(CONV_DIMS, x.shape[:3], strict=False):
            if dim in self.static and size != self.static[dim]:
                raise ValueError(f"this workload has {dim}={self.static[dim]}, got {size}")
        oh, ow = self.output_hw(x.shape[1], x.shape[2], f.shape[0], f.shape[1])
        if oh < 1 or ow < 1 or x.shape[0] < 1:
            raise ValueError(f"the output of input {list(x.shape)} with filter {list(f.shape)} would be empty")
        return x.shape[0], oh, ow

    def columns(self, x: np.ndarray, KH: int, KW: int, oh: int, ow: int) -> np.ndarray:
        """The im2col matrix X[N·OH·OW, KH·KW·CI] (columns ordered kh, kw, ci like the filter's rows)."""
        n, _, _, ci = x.shape
        s, p = self.stride, self.padding
        if KH == KW == 1 and p == 0:  # 1×1: every output pixel reads one input pixel
            picked = x if s == 1 else x[:, : s * (oh - 1) + 1 : s, : s * (ow - 1) + 1 : s]
            return np.ascontiguousarray(picked).reshape(n * oh * ow, ci)
        if p:
            padded = np.zeros((n, x.shape[1] + 2 * p, x.shape[2] + 2 * p, ci), x.dtype)
            padded[:, p : p + x.shape[1], p : p + x.shape[2]] = x
        else:
            padded = x
        cols = np.empty((n, oh, ow, KH, KW, ci), x.dtype)
        for i in range(KH):
            for j in range(KW):
                cols[:, :, :, i, j] = padded[:, i : i + s * (oh - 1) + 1 : s, j : j + s * (ow - 1) + 1 : s]
        return cols.reshape(n * oh * ow, KH * KW * ci)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stride": self.stride,
            "padding": self.padding,
            "filter": None if self.filter is None else list(self.filter),
            "static": dict(sorted(self.static.items())),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConvGeometry:
        flt = data.get("filter")
        return cls(
            stride=int(data.get("stride", 1)),
            padding=int(data.get("padding", 0)),
            filter=None if flt is None else (int(flt[0]), int(flt[1]), int(flt[2]), int(flt[3])),
            static={str(d): int(v) for d, v in (data.get("static") or {}).items()},
        )


def filter_matrix(f: np.ndarray) -> np.ndarray:
    """The filter F[KH,KW,CI,CO] as the dense layer's W[CO, KH·KW·CI] (contiguous)."""
    return np.ascontiguousarray(f.reshape(-1, f.shape[3]).T)


class ConvDispatcher:
    """Runs an NHWC conv2d for any (N, H, W) with the dense program chosen for M = N·OH·OW."""

    def __init__(self, dense: Dispatcher, geometry: ConvGeometry) -> None:
        if dense.table is not None and dense.kernels and geometry.filter is None:
            raise ValueError("a conv dispatcher with uKernels needs the layer's filter sizes")
        if (
            geometry.filter is not None
            and dense.K is not None
            and (geometry.K, geometry.filter[3])
            != (
                dense.K,
                dense.N,
            )
        ):
            raise ValueError(f"the dense table is for N={dense.N}, K={dense.K}, not this conv layer's {geometry}")
        self.dense = dense
        self.geometry = geometry
        self._weights: dict[tuple[int, str], tuple[weakref.ref[np.ndarray], Any]] = {}
        self._lock = threading.Lock()
        self._plans: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[int, int, int, int, bool]] = {}
        self._last_torch_weight: tuple[Any, Any] = (None, None)  # (filter, its PyTorch weight)

    @property
    def fallback(self) -> bool:
        return self.dense.fallback

    @property
    def source(self) -> str:
        return self.dense.source

    def rows(self, shape: Mapping[str, int]) -> int:
        """M = N·OH·OW: the dense table's row count for a tuple of the conv's dims."""
        return self.geometry.rows(shape)

    def program(self, shape: Mapping[str, int]) -> tuple[Piece, ...]:
        """The dense pieces that run the tuple {N, H, W} (static ones may be left out); empty: numpy."""
        return self.dense.program(self.rows(shape))

    def weight(self, f: np.ndarray) -> np.ndarray:
        """F as W[CO, K], made once per filter (by identity, while F lives: filters are treated as immutable,
        like the dense dispatcher's weights), so the dense dispatcher finds its packed copies too."""
        w: np.ndarray = self._derived(f, "matrix", filter_matrix)
        return w

    def _derived(self, f: np.ndarray, kind: str, make: Callable[[np.ndarray], Any]) -> Any:
        """What `make` derives from filter F (its matrix, PyTorch's weight), once per filter and kind."""
        entry = self._weights.get((id(f), kind))
        if entry is not None and entry[0]() is f:
            return entry[1]
        derived = make(f)
        with self._lock:
            self._weights = {k: v for k, v in self._weights.items() if v[0]() is not None}
            self._weights[(id(f), kind)] = (weakref.ref(f), derived)
        return derived

    def __call__(self, x: np.ndarray, f: np.ndarray) -> np.ndarray:
        """O[N,OH,OW,CO] for I[N,H,W,CI] and F[KH,KW,CI,CO]."""
        plan = self._plans.get((x.shape, f.shape))
        if plan is None:
            plan = self._plan(x, f)
        n, oh, ow, M, on_torch = plan
        if on_torch:  # the table routes M to PyTorch: its own conv (oneDNN's direct convolution), not a GEMM on im2col
            start = _now()
            last = self._last_torch_weight
            if last[0] is not f:  # one layer's calls in a row skip the lookup; the pair is swapped in whole
                last = self._last_torch_weight = (f, self._derived(f, vendor.TORCH, vendor.torch_conv_weight))
            g = self.geometry
            y = vendor.torch_conv2d(x, last[1], g.stride, g.padding)
            self.dense.record_route(M, _now() - start)  # the table's choice, not a miss
            return y
        cols = self.geometry.columns(x, f.shape[0], f.shape[1], oh, ow)
        return self.dense(cols, self.weight(f)).reshape(n, oh, ow, f.shape[3])

    def _plan(self, x: np.ndarray, f: np.ndarray) -> tuple[int, int, int, int, bool]:
        """(N, OH, OW, M, whether PyTorch's conv runs it) for a call's shapes, checked once per pair of shapes."""
        n, oh, ow = self.geometry.check(x, f)
        M = n * oh * ow
        on_torch = self.dense.vendor_route(M) == vendor.TORCH and vendor.runnable(vendor.TORCH) == vendor.TORCH
        plan = (n, oh, ow, M, on_torch)
        if len(self._plans) < MAX_TRACKED_SHAPES:
            self._plans[(x.shape, f.shape)] = plan
        return plan

    def usage(self, reset: bool = False) -> dict[int, Any]:
        """The dense dispatcher's calls per M (kernelfleet.dispatcher.ShapeUsage)."""
        return dict(self.dense.usage(reset))
