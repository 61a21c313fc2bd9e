"""cuBLAS through torch, timed as gpu.md §4 says: many calls captured in one CUDA graph, events around replays.

A Python loop of `F.linear` costs 17–27 µs per call on an H100 at every M up to 128 (launch-bound) and
would hide the kernels, so the vendor time is the graph replay time divided by the calls it holds.
Importable without torch, pydantic or a GPU; calling needs torch with CUDA.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

TORCH_DTYPES = ("float32", "float16", "bfloat16")


def torch_cuda() -> Any:
    """torch, when it is installed and sees a CUDA GPU; RuntimeError saying which is missing otherwise."""
    try:
        import torch
    except ImportError:
        raise RuntimeError("cuBLAS timing needs torch with CUDA (pip install torch)") from None
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA GPU on this host")
    return torch


def label(dtype: str = "float32", tf32: bool = False, graph: bool = True) -> str:
    torch = torch_cuda()
    mode = "TF32" if tf32 else dtype
    how = "CUDA graph" if graph else "called from Python, synchronised"
    return f"cuBLAS {mode} (torch {torch.__version__}, CUDA {torch.version.cuda}, {how})"


def time_graph(call: Callable[[], Any], calls: int = 50, repeats: int = 7) -> float:
    """Median seconds per `call()`, replayed from one CUDA graph holding `calls` of them (events around each
    replay). Warmed up on a side stream first, off the capture: cuBLAS picks its kernel and workspace there."""
    torch = torch_cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return float(statistics.median(times))


def time_linear(
    m: int, n: int, k: int, dtype: str = "float32", tf32: bool = False, calls: int = 50, repeats: int = 7
) -> float:
    """Median seconds per `F.linear(X[m,k], W[n,k])` call, replayed from a CUDA graph of `calls` calls."""
    torch = torch_cuda()
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {TORCH_DTYPES}, not {dtype!r}")
    tdtype = getattr(torch, dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        x = torch.randn(m, k, device="cuda", dtype=tdtype)
        w = torch.randn(n, k, device="cuda", dtype=tdtype)
        return time_graph(lambda: torch.nn.functional.linear(x, w), calls, repeats)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def time_linear_called(m: int, n: int, k: int, dtype: str = "float32", calls: int = 50, repeats: int = 5) -> float:
    """Median seconds per `F.linear` as a host calls it from Python, back to back, synchronised: the like-
    for-like rival of a dispatcher call (launch and Python included) when deciding who serves a shape."""
    torch = torch_cuda()
    x = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
    w = torch.randn(n, k, device="cuda", dtype=getattr(torch, dtype))
    torch.nn.functional.linear(x, w)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            torch.nn.functional.linear(x, w)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls)
    return float(statistics.median(times))
