"""CUDA uKernels and their dispatcher on a GPU inference host: device tensors in, a device tensor out.

A CUDA uKernel is a pipelined tiled GEMM Y[M,N] = X[M,K]·W[N,K]ᵀ compiled once over a symbolic M by a
KernelFleet GPU worker (service/tuning/tuners/pipeline/schedule.py) and shipped as a shared library
with its device code (fatbin), named by the sha256 of its bytes. W is used as the host holds it (no
packing). `CudaDispatcher` runs the dispatch table's program for S = X.shape[0]: each piece is a row
view of X and of the output (DLPack views, no copies), so torch CUDA tensors or anything exporting
DLPack go in and a tensor of the same kind comes out.

Needs TVM's runtime with CUDA enabled and a GPU; without one every entry point raises `NoCudaDevice`
saying why. Importable without pydantic, httpx or torch (GPU measurement hosts lack pydantic).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kernelfleet.dispatch import DispatchTable, Piece

PLATFORM = "cuda"


class NoCudaDevice(RuntimeError):
    """This host cannot run CUDA uKernels (no TVM CUDA runtime, no driver, or no GPU)."""


_cuda_tvm: Any = None  # TVM once it was found able to run kernels here: launches must not re-check each time


def require_cuda() -> Any:
    """TVM, when it can run kernels on GPU 0 here; NoCudaDevice naming what is missing otherwise."""
    global _cuda_tvm
    if _cuda_tvm is not None:
        return _cuda_tvm
    from kernelfleet.tvm_runtime import import_tvm

    try:
        tvm = import_tvm()  # with the wheels' CUDA runtime loaded first, which TVM's CUDA plugin needs
    except ImportError:
        raise NoCudaDevice("CUDA uKernels need TVM's runtime: pip install 'kernelfleet[tvm]'") from None
    if not tvm.runtime.enabled("cuda"):
        raise NoCudaDevice(
            "this host has no CUDA GPU: TVM's CUDA runtime is disabled (no NVIDIA driver, libcuda.so.1 not "
            "found); run CUDA dispatchers on the GPU inference host"
        )
    if not tvm.cuda(0).exist:
        raise NoCudaDevice("the NVIDIA driver is present but reports no CUDA GPU (check CUDA_VISIBLE_DEVICES)")
    _cuda_tvm = tvm
    return tvm


@dataclass(frozen=True)
class CudaUKernelSpec:
    """Everything that identifies a compiled CUDA uKernel; stored next to its artifact."""

    N: int
    K: int
    mt: int  # rows per thread block (the block tile bm): the dispatch table's M-tile
    tile: dict[str, Any] = field(hash=False)  # bm, bn, bk, tm, tn, stages, async_copy, split_k
    target: dict[str, Any] = field(hash=False)
    dtype: str = "float32"
    fatbin_sha256: str = ""  # the device code nvcc produced, stored as its own artifact too
    platform: str = PLATFORM

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CudaUKernelSpec:
        return cls(**{**data, "tile": dict(data["tile"]), "target": dict(data["target"])})


def is_cuda_spec(spec: Mapping[str, Any]) -> bool:
    return spec.get("platform") == PLATFORM


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
DTYPES = tuple(_ITEMSIZE)  # what CUDA uKernels take: X, W and Y in one of these (fp32 sums)
_L2_FLUSH = "kernelfleet.flush_gpu_l2"
_flush_buffers: dict[int, tuple[Any, ...]] = {}


def dtype_name(dtype: Any) -> str:
    """'float16' for torch.float16, numpy's float16 or TVM's 'float16' alike."""
    return str(dtype).removeprefix("torch.")


def numpy_dtype(dtype: str) -> Any:
    """numpy's dtype for a uKernel dtype; bfloat16 is ml_dtypes' (numpy has none; TVM depends on ml_dtypes)."""
    import numpy as np

    if dtype == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def _normal(rng: Any, shape: tuple[int, ...], dtype: str) -> Any:
    import numpy as np

    return rng.standard_normal(shape, dtype=np.float32).astype(numpy_dtype(dtype))


def repeated_median(sample: Callable[[], list[float]], repeat: int, min_repeat_ms: float) -> float:
    """The median over `repeat` rounds of each round's median sample; a round draws batches from `sample()`
    until it has run for `min_repeat_ms` of wall time (noise averaged over time, not over a few launches)."""
    medians = []
    for _ in range(max(1, repeat)):
        samples: list[float] = []
        began = time.perf_counter()
        while not samples or (time.perf_counter() - began) * 1e3 < min_repeat_ms:
            samples.extend(sample())
        medians.append(statistics.median(samples))
    return float(statistics.median(medians))


def weight_copies(weight_bytes: int, l2_bytes: int) -> int:
    """How many copies of W to rotate through so that they never fit in an L2 of `l2_bytes` (twice its size,
    at least 2 copies, at most 64); 1 when the L2 is not modelled."""
    if l2_bytes <= 0 or weight_bytes <= 0:
        return 1
    return min(64, max(2, -(-2 * l2_bytes // weight_bytes)))


def flush_l2_hook(dev: Any, l2_bytes: int) -> str:
    """The name of a registered function that evicts the L2 of `dev` (a device-to-device copy of twice its
    size), for time_evaluator's f_preproc: it runs before each timed repeat, outside the timed region."""
    import tvm_ffi

    tvm = require_cuda()
    size = 2 * l2_bytes // 4
    held = _flush_buffers.get(dev.index)
    if held is None or int(held[0].shape[0]) < size:
        _flush_buffers[dev.index] = tuple(tvm.runtime.empty((size,), "float32", dev) for _ in range(2))

    def flush(*_: Any) -> None:
        src, dst = _flush_buffers[dev.index]
        src.copyto(dst)

    tvm_ffi.register_global_func(_L2_FLUSH, flush, override=True)
    return _L2_FLUSH


@contextlib.contextmanager
def caller_stream(x: Any) -> Iterator[None]:
    """Launch TVM kernels on the stream the caller's framework is using for `x`: torch's current stream for a
    torch CUDA tensor (under `torch.cuda.stream(s)` or CUDA-graph capture that is `s` or the capture stream);
    for anything else TVM's current stream is left as it is."""
    stream = _torch_stream(x)
    if stream is None:
        yield
        return
    import tvm_ffi

    with tvm_ffi.use_raw_stream(tvm_ffi.device("cuda", x.device.index or 0), stream):
        yield


def _torch_stream(x: Any) -> int | None:
    if type(x).__module__.split(".")[0] != "torch" or not getattr(x, "is_cuda", False):
        return None
    import torch

    return int(torch.cuda.current_stream(x.device).cuda_stream)


def _rows(t: Any, start: int, rows: int) -> Any:
    """Rows start..start+rows of a 2-D tensor as a view (no copy): torch `narrow`, TVM `_create_view`."""
    if hasattr(t, "narrow"):
        return t.narrow(0, start, rows)
    cols = int(t.shape[1])
    return t._create_view((rows, cols), relative_byte_offset=start * cols * _ITEMSIZE[str(t.dtype)])


def _from_dlpack(a: Any) -> Any:
    """A zero-copy TVM view of a DLPack tensor. The kernels' widest access is a 16-byte cp.async / float4,
    so 16-byte alignment is what they need; TVM's own from_dlpack insists on 64, which the row views of
    later pieces (start·K·4 bytes in) need not meet. K and N are multiples of 4 for every uKernel
    (bk | K, bn | N with bk, bn multiples of the 16-byte vector), so every row view is 16-byte aligned."""
    import tvm_ffi

    return tvm_ffi.from_dlpack(a, require_alignment=16, require_contiguous=True)


class CudaUKernel:
    """A compiled CUDA uKernel: `kernel(x, w, out)` on device tensors, any M ≥ 1."""

    def __init__(self, module: Any, spec: CudaUKernelSpec) -> None:
        self.module = module
        self.spec = spec
        self._fn = module["main"]

    def __call__(self, x: Any, w: Any, out: Any) -> Any:
        """Launch on the caller's stream: torch's current stream for torch tensors (so a host under
        `torch.cuda.stream(s)` does not race and CUDA-graph capture records the launch), else TVM's."""
        with caller_stream(x):
            self.launch(x, w, out)
        return out

    def launch(self, x: Any, w: Any, out: Any) -> None:
        """Launch on TVM's current stream for this device (callers set it: `caller_stream`)."""
        tvm = require_cuda()
        self._fn(*(a if isinstance(a, tvm.runtime.Tensor) else _from_dlpack(a) for a in (x, w, out)))

    def time(self, M: int, repeat: int = 5, min_repeat_ms: float = 50.0, l2_bytes: int = 0, seed: int = 0) -> float:
        """Median seconds per launch at M rows, kernel only (TVM's time_evaluator: device events, one launch per
        sample). Samples are taken in `repeat` rounds of at least `min_repeat_ms` each; the result is the median
        of the rounds' medians. With `l2_bytes` (the GPU's L2) the L2 is flushed before every timed launch, so W
        comes from memory as on a serving host between layers, not from an L2 kept hot by the previous launch
        (which favours tiles that re-read W)."""
        import numpy as np

        tvm = require_cuda()
        dev = tvm.cuda(0)
        rng = np.random.default_rng(seed)
        s = self.spec
        args = [tvm.runtime.tensor(_normal(rng, shape, s.dtype), dev) for shape in ((M, s.K), (s.N, s.K), (M, s.N))]
        preproc = flush_l2_hook(dev, l2_bytes) if l2_bytes else ""
        # number=1: one launch per sample, with the flush before it (time_evaluator runs f_preproc per repeat)
        evaluator = self.module.time_evaluator("main", dev, number=1, repeat=16, f_preproc=preproc)
        return repeated_median(lambda: list(evaluator(*args).results), repeat, min_repeat_ms)

    def export(self, directory: Path) -> tuple[Path, str]:
        """Write the library (host code + embedded device code) to `directory/<sha256>.so`; (path, sha256)."""
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            staging = Path(tmp) / "ukernel.so"
            self.module.export_library(str(staging))
            digest = sha256_bytes(staging.read_bytes())
            final = directory / f"{digest}.so"
            if not final.exists():
                shutil.move(str(staging), final)
        return final, digest


def load_cuda_ukernel(path: Path, spec: CudaUKernelSpec, sha256: str | None = None) -> CudaUKernel:
    """Load an exported CUDA uKernel, refusing bytes that do not match the recorded sha256."""
    if sha256 is not None and sha256_bytes(path.read_bytes()) != sha256:
        raise ValueError(f"{path} does not match its sha256 {sha256}")
    tvm = require_cuda()
    return CudaUKernel(tvm.runtime.load_module(os.fspath(path)), spec)


class CudaDispatcher:
    """Y = X·Wᵀ for any number of rows S on the GPU, with the program the dispatch table chose for S.

    `x` [S, K] and `w` [N, K] are device tensors (torch CUDA tensors, TVM tensors, or anything with
    DLPack); the result is a new device tensor of the same kind (or `out`, when given). Host numpy
    arrays are accepted for convenience and copied to the GPU once per call. With no table, and for the
    S the table routes to the vendor (the tuner measured cuBLAS faster there), the call goes to cuBLAS
    through torch; without torch those calls raise saying so.

    `dtype` is the uKernels' (their specs say it: float32, float16 or bfloat16): X, W and the result are in it,
    the sums in fp32, as `F.linear` computes half-precision inputs; a uKernel call in another dtype is refused.
    """

    def __init__(
        self,
        table: DispatchTable | None,
        kernels: Mapping[str, CudaUKernel],
        *,
        N: int | None,
        K: int | None,
        source: str = "local",
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        if table is not None and not table.epilogue.trivial:  # the service refuses such jobs on CUDA targets
            raise ValueError(
                f"CUDA uKernels do not fuse epilogues yet; this table's is {table.epilogue.describe()}"
            )
        if table is not None:
            require_cuda()
            missing = set(table.mts) - set(kernels)
            if missing:
                raise ValueError(f"the dispatch table uses uKernels that were not loaded: {sorted(missing)}")
        dtypes = {kernel.spec.dtype for kernel in kernels.values()}
        if len(dtypes) > 1:
            raise ValueError(f"the dispatch table's uKernels mix dtypes {sorted(dtypes)}")
        self.dtype = dtypes.pop() if dtypes else "float32"
        self.table = table
        self.kernels = dict(kernels)
        self.N, self.K = N, K
        self.source = source
        self.meta = dict(meta or {})
        self._programs: dict[int, tuple[Piece, ...]] = {}
        self.calls: dict[int, int] = {}

    def routes_to_vendor(self, S: int) -> bool:
        """Whether S goes to cuBLAS: no table, or the table's vendor interval (the tuner measured it faster)."""
        return self.table is None or self.table.vendor_at(S)

    def program(self, S: int) -> tuple[Piece, ...]:
        if self.table is None:
            return ()
        found = self._programs.get(S)
        if found is None:
            found = self._programs[S] = self.table.lookup(S)
        return found

    def __call__(self, x: Any, w: Any, out: Any = None) -> Any:
        S = int(x.shape[0])
        self.calls[S] = self.calls.get(S, 0) + 1
        if S == 0:  # an empty batch: an empty result of the input's kind, as F.linear gives
            return out if out is not None else _empty_result(x, (0, int(self.N if self.N is not None else w.shape[0])))
        if self.routes_to_vendor(S):
            return _vendor(x, w, out)
        host = _is_numpy(x)
        x, w = _on_device(x), _on_device(w)
        if tuple(int(d) for d in x.shape[1:]) != (self.K,) or tuple(int(d) for d in w.shape) != (self.N, self.K):
            raise ValueError(f"expected x[S, {self.K}] and w[{self.N}, {self.K}], got {x.shape} and {w.shape}")
        if dtype_name(x.dtype) != self.dtype or dtype_name(w.dtype) != self.dtype:
            raise ValueError(f"these uKernels take {self.dtype} x and w, got {x.dtype} and {w.dtype}")
        given = out
        if out is None or _is_numpy(out):
            out = _empty_result(x, (S, int(self.N or 0)))
        start = 0
        with caller_stream(x):  # every piece on the caller's stream, in order
            for piece in self.program(S):
                self.kernels[piece.ukernel_id].launch(_rows(x, start, piece.rows), w, _rows(out, start, piece.rows))
                start += piece.rows
        if not host:
            return out
        return _to_host(out.numpy(), given)

    def time_called(self, S: int, calls: int = 50, repeat: int = 5, l2_bytes: int = 0) -> float:
        """Median seconds per call at S rows as a GPU host calls it, back to back, device-synchronised: torch
        CUDA tensors in and a fresh output out when torch is here (what a torch host pays, like
        `cublas.time_linear_called`), TVM tensors otherwise. W rotates through copies larger than the L2."""
        x, weights = _call_inputs(S, self.N or 1, self.K or 1, l2_bytes, self.dtype)
        self(x, weights[0])
        _synchronize(x)

        def batch() -> list[float]:
            began = time.perf_counter()
            for i in range(calls):
                self(x, weights[i % len(weights)])
            _synchronize(x)
            return [(time.perf_counter() - began) / calls]

        return repeated_median(batch, repeat, 0.0)

    def time_graph(self, S: int, calls: int = 20, repeat: int = 7, l2_bytes: int = 0) -> float:
        """Median seconds per call at S rows, kernel only: `calls` calls captured in one CUDA graph (W rotating
        through copies larger than the L2) and replayed, events around each replay. Exactly how
        `cublas.time_linear` times cuBLAS, so the two compare like for like. Needs torch with CUDA."""
        import torch

        x, weights = _call_inputs(S, self.N or 1, self.K or 1, l2_bytes, self.dtype, require_torch=True)
        out = x.new_empty((S, int(self.N or 1)))
        step = iter(range(1 << 62))
        return graph_seconds(torch, lambda: self(x, weights[next(step) % len(weights)], out), calls, repeat)

    def overhead(self, S: int = 1, repeat: int = 200) -> float:
        """Seconds a call costs beyond its kernels: table lookup, DLPack views, launches (device-synchronised)."""
        kernels = sum(self.kernels[p.ukernel_id].time(p.rows, repeat=3, min_repeat_ms=10) for p in self.program(S))
        return max(0.0, self.time_called(S, repeat) - kernels)


def graph_seconds(torch: Any, call: Callable[[], Any], calls: int, repeat: int) -> float:
    """Median seconds per `call()` replayed from one CUDA graph holding `calls` of them (events around each
    replay). Warmed up on a side stream first, off the capture: libraries pick kernels and workspaces there."""
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
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / calls)
    return float(statistics.median(times))


def _call_inputs(
    S: int, n: int, k: int, l2_bytes: int, dtype: str = "float32", require_torch: bool = False
) -> tuple[Any, list[Any]]:
    """X[S, k] and the W[n, k] copies to rotate through, in `dtype`, as torch CUDA tensors when torch is here."""
    import numpy as np

    rng = np.random.default_rng(0)
    copies = weight_copies(n * k * _ITEMSIZE[dtype], l2_bytes)
    try:
        import torch
    except ImportError:
        if require_torch:
            raise RuntimeError("CUDA-graph timing needs torch with CUDA (pip install torch)") from None
        tvm = require_cuda()
        dev = tvm.cuda(0)
        host_w = _normal(rng, (n, k), dtype)
        x = tvm.runtime.tensor(_normal(rng, (S, k), dtype), dev)
        return x, [tvm.runtime.tensor(host_w, dev) for _ in range(copies)]
    w = torch.randn(n, k, device="cuda", dtype=getattr(torch, dtype))
    return torch.randn(S, k, device="cuda", dtype=w.dtype), [w, *(w.clone() for _ in range(copies - 1))]


def _synchronize(x: Any) -> None:
    if hasattr(x, "new_empty"):
        import torch

        torch.cuda.synchronize(x.device)
    else:
        x.device.sync()


def _is_numpy(a: Any) -> bool:
    return type(a).__module__ == "numpy"


def _is_torch(a: Any) -> bool:
    return type(a).__module__.split(".")[0] == "torch"


def _on_device(a: Any) -> Any:
    if not _is_numpy(a):
        return a
    tvm = require_cuda()
    return tvm.runtime.tensor(a, tvm.cuda(0))


def _empty_result(x: Any, shape: tuple[int, int]) -> Any:
    """A new output of x's kind and device: torch through its caching allocator; numpy on the host; a TVM
    tensor backed by torch's caching allocator when torch is here (TVM's own `empty` is a cudaMalloc and a
    cudaFree per call), else TVM's."""
    if hasattr(x, "new_empty"):
        return x.new_empty(shape)
    if _is_numpy(x):
        import numpy as np

        return np.empty(shape, dtype=x.dtype)
    try:
        import torch
    except ImportError:
        tvm = require_cuda()
        return tvm.runtime.empty(shape, str(x.dtype), x.device)
    import tvm_ffi

    return tvm_ffi.from_dlpack(torch.empty(shape, dtype=getattr(torch, str(x.dtype)), device=f"cuda:{x.device.index}"))


def _vendor(x: Any, w: Any, out: Any) -> Any:
    """cuBLAS through torch, answering in the caller's kind: a torch tensor for torch, numpy for numpy, a TVM
    tensor (a zero-copy DLPack view of torch's result) for TVM tensors; `out` when given."""
    try:
        import torch
    except ImportError:
        raise RuntimeError(
            "this call goes to cuBLAS (no dispatch table, or the table routes this S to the vendor) and torch "
            "is not installed: pip install torch"
        ) from None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tx, tw = (_as_torch(torch, a, device) for a in (x, w))
    y = torch.nn.functional.linear(tx, tw)
    if _is_numpy(x) or _is_numpy(out):
        return _to_host(_torch_to_numpy(y), out)
    if out is not None:
        _as_torch(torch, out, device).copy_(y)
        return out
    if _is_torch(x):
        return y
    import tvm_ffi

    return tvm_ffi.from_dlpack(y)


def _to_host(y: Any, out: Any) -> Any:
    """A host result, written into the caller's numpy `out` when one was given."""
    if out is None:
        return y
    out[...] = y
    return out


def _as_torch(torch: Any, a: Any, device: str) -> Any:
    if isinstance(a, torch.Tensor):
        return a
    if _is_numpy(a):
        if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16: torch reads its bits
            return torch.from_numpy(a.view("uint16")).view(torch.bfloat16).to(device)
        return torch.from_numpy(a).to(device)
    return torch.from_dlpack(a)


def _torch_to_numpy(y: Any) -> Any:
    """A torch result on the host as numpy; a bfloat16 one as ml_dtypes' bfloat16 (torch's .numpy() refuses it)."""
    import torch

    y = y.cpu()
    if y.dtype == torch.bfloat16:
        return y.view(torch.int16).numpy().view(numpy_dtype("bfloat16"))
    return y.numpy()
