"""The vendor library on NVIDIA GPUs: cuBLAS (dense, batch_matmul) and cuDNN (conv2d) through torch.

Two timings, both medians of repeats, both with the weights rotating through copies larger than the L2 (a
50 MB L2 would otherwise keep a 7–9 MB W hot, which no serving host sees between layers):
  - `graph`: kernel only. Many calls captured in one CUDA graph, events around each replay. A Python loop
    of `F.linear` costs 17–27 µs per call on an H100 at every M up to 128 (launch-bound) and would hide
    the kernels (gpu.md §4). Our kernels are timed the same way (`CudaDispatcher.time_graph`).
  - `called`: as a torch host calls it from Python, back to back, synchronised; the rival of a dispatcher
    call (`CudaDispatcher.time_called`) when deciding who serves a shape, since that is what a host pays.
Importable without torch, pydantic or a GPU; calling needs torch with CUDA.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kernelfleet.cuda_ukernel import graph_seconds, repeated_median, weight_copies

TORCH_DTYPES = ("float32", "float16", "bfloat16")
OPS = ("dense", "batch_matmul", "conv2d")


def torch_cuda() -> Any:
    """torch, when it is installed and sees a CUDA GPU; RuntimeError saying which is missing otherwise."""
    try:
        import torch
    except ImportError:
        raise RuntimeError("cuBLAS timing needs torch with CUDA (pip install torch)") from None
    if not torch.cuda.is_available():
        raise RuntimeError("torch sees no CUDA GPU on this host")
    return torch


def label(dtype: str = "float32", tf32: bool = False, graph: bool = True, op: str = "dense") -> str:
    torch = torch_cuda()
    mode = "TF32" if tf32 else dtype
    how = "CUDA graph" if graph else "called from Python, synchronised"
    library = "cuDNN" if op == "conv2d" else "cuBLAS"
    return f"{library} {mode} via {VENDOR_CALLS[op]} (torch {torch.__version__}, CUDA {torch.version.cuda}, {how})"


VENDOR_CALLS = {"dense": "F.linear", "batch_matmul": "torch.matmul", "conv2d": "F.conv2d channels_last"}


def vendor_call(
    op: str, sizes: Mapping[str, int], attrs: Mapping[str, Any], dtype: str = "float32", l2_bytes: int = 0
) -> Callable[[], Any]:
    """A function making the next vendor call for `op` at `sizes` (the workload's bound dims), each call on
    the next copy of the weight operand. Layouts are the workload's: dense act(X[M,K]·W[N,K]ᵀ (+ bias)),
    batch_matmul A[B,M,K]·Bt[B,N,K]ᵀ, conv2d NHWC input with a KH×KW×CI→CO filter (channels_last in torch,
    which is NHWC in memory)."""
    torch = torch_cuda()
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {TORCH_DTYPES}, not {dtype!r}")
    if op not in VENDOR_CALLS:
        raise ValueError(f"no vendor baseline for {op!r}: the GPU vendor covers {', '.join(OPS)}")
    s, tdtype, F = dict(sizes), getattr(torch, dtype), torch.nn.functional

    def randn(*shape: int) -> Any:
        return torch.randn(*shape, device="cuda", dtype=tdtype)

    if op == "dense":
        x, weight = randn(s["M"], s["K"]), randn(s["N"], s["K"])
        bias = randn(s["N"]) if attrs.get("bias") else None
        weights = _copies(weight, l2_bytes)
        activation = str(attrs.get("activation", "none"))  # the layer's fused activation, as torch runs it
        if activation == "none":
            return _cycling(weights, lambda w: F.linear(x, w, bias))
        act = {
            "relu": F.relu,
            "gelu": F.gelu,
            "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
            "silu": F.silu,
        }[activation]
        return _cycling(weights, lambda w: act(F.linear(x, w, bias)))
    if op == "batch_matmul":
        a, bt = randn(s["B"], s["M"], s["K"]), randn(s["B"], s["N"], s["K"])
        return _cycling(_copies(bt, l2_bytes), lambda b: torch.matmul(a, b.transpose(1, 2)))
    stride, padding = int(attrs.get("stride", 1)), int(attrs.get("padding", 0))
    inp = randn(s["N"], s["CI"], s["H"], s["W"]).to(memory_format=torch.channels_last)
    flt = randn(s["CO"], s["CI"], s["KH"], s["KW"]).to(memory_format=torch.channels_last)
    return _cycling(_copies(flt, l2_bytes), lambda f: F.conv2d(inp, f, stride=stride, padding=padding))


def _copies(weight: Any, l2_bytes: int) -> list[Any]:
    count = weight_copies(weight.numel() * weight.element_size(), l2_bytes)
    return [weight, *(weight.clone() for _ in range(count - 1))]


def _cycling(weights: list[Any], call: Callable[[Any], Any]) -> Callable[[], Any]:
    state = {"i": 0}

    def next_call() -> Any:
        w = weights[state["i"] % len(weights)]
        state["i"] += 1
        return call(w)

    return next_call


def time_graph(call: Callable[[], Any], calls: int = 50, repeats: int = 7) -> float:
    """Median seconds per `call()`, replayed from one CUDA graph holding `calls` of them."""
    return graph_seconds(torch_cuda(), call, calls, repeats)


def time_called(call: Callable[[], Any], calls: int = 50, repeats: int = 5) -> float:
    """Median seconds per `call()` made from Python back to back, device-synchronised."""
    torch = torch_cuda()
    call()
    torch.cuda.synchronize()

    def batch() -> list[float]:
        began = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        return [(time.perf_counter() - began) / calls]

    return repeated_median(batch, repeats, 0.0)


def time_op(
    op: str,
    sizes: Mapping[str, int],
    attrs: Mapping[str, Any] | None = None,
    dtype: str = "float32",
    *,
    graph: bool,
    l2_bytes: int = 0,
    tf32: bool = False,
) -> float:
    """Median seconds per vendor call for `op` at `sizes`: kernel only (`graph`) or as a host calls it."""
    torch = torch_cuda()
    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    try:
        call = vendor_call(op, sizes, attrs or {}, dtype, l2_bytes)
        return time_graph(call) if graph else time_called(call)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


def time_linear(
    m: int, n: int, k: int, dtype: str = "float32", tf32: bool = False, l2_bytes: int = 0
) -> float:
    """Median seconds per `F.linear(X[m,k], W[n,k])`, kernel only (CUDA graph)."""
    return time_op("dense", {"M": m, "N": n, "K": k}, {}, dtype, graph=True, l2_bytes=l2_bytes, tf32=tf32)


def time_linear_called(m: int, n: int, k: int, dtype: str = "float32", l2_bytes: int = 0) -> float:
    """Median seconds per `F.linear` as a host calls it from Python, back to back, synchronised."""
    return time_op("dense", {"M": m, "N": n, "K": k}, {}, dtype, graph=False, l2_bytes=l2_bytes)
