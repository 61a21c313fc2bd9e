"""Per-shape dispatch at inference time: Y = X·Wᵀ for whatever number of rows X has, no network.

A layer tuned with an epilogue (kernelfleet.epilogue: bias, activation) computes act(X·Wᵀ + bias): the
table says which, `d(x, w, bias=b)` passes the bias (required iff the table adds one), the uKernels fuse
it and every S that runs on a vendor library (vendor routes; numpy with no table) applies it there, so each S
gives the same.

A `Dispatcher` holds a dispatch table (which uKernels run which rows for each S) and the loaded
uKernels. Calling it picks the program for S = X.shape[0] from a per-S memo (a dict lookup after the
first call for that S), finds W's packed copies by identity, and runs the pieces. Shapes the fleet
never tuned still get a program: the table extends past its last interval (see DispatchTable.lookup).

Exact-shape kernels (from `sketch` jobs, measured faster than the table's program for that S) take precedence for
their S. Where the table routes S to a vendor library (the job measured numpy or PyTorch faster there:
kernelfleet.vendor) the dispatcher calls that library, as the table chose: not a fallback. Such an S can still run
on uKernels (they are shape-generic): `run_ukernels` runs it on the nearest interval's program, and `adopt(S)` keeps
it there, for a caller that found them faster where it runs them (kernelfleet.torch's in-model check). With no
table at all (service unreachable and nothing cached) the dispatcher runs numpy and counts every call as a fallback,
so the fleet can see what it missed.

`usage()` returns what ran per S (calls, kernel seconds, fallbacks): the raw material for telemetry.
`hold_out(every, baseline)` runs one call in `every` per S on the baseline library (kernelfleet.holdout), so the
fleet measures what the table saves against what the host would run without it.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelfleet import vendor
from kernelfleet.dispatch import DispatchTable, Piece
from kernelfleet.epilogue import NO_EPILOGUE, Epilogue, check_bias
from kernelfleet.holdout import Holdout
from kernelfleet.tvm_runtime import ALIGN, aligned_empty, as_aligned, is_aligned
from kernelfleet.ukernel import UKernel

log = logging.getLogger(__name__)
ExactKernel = Callable[..., np.ndarray]  # (x, w) or (x, w, bias): the workload's own signature
_FALLBACK: tuple[Piece, ...] = ()  # memo value for "no program: numpy"
_UNRESOLVED: Any = object()  # memo miss (None is a value there: "no vendor call, a program runs S")
_now = time.perf_counter
MAX_TRACKED_SHAPES = 4096  # usage memory bound: S values beyond it are counted under S = -1


@dataclass
class ShapeUsage:
    calls: int = 0
    seconds: float = 0.0
    fallbacks: int = 0


class _Packed:
    """W packed once per distinct nt (as TVM tensors sharing the packed memory), kept while W lives:
    weights are long-lived in inference, and packing costs far more than a call."""

    def __init__(self, w: np.ndarray, kernels: Mapping[str, UKernel]) -> None:
        self.ref = weakref.ref(w)
        by_nt: dict[int, np.ndarray] = {}
        self.by_kernel: dict[str, Any] = {}
        for uid, k in kernels.items():
            if k.spec.nt not in by_nt:
                by_nt[k.spec.nt] = k.pack_weight(w)
            self.by_kernel[uid] = k.device_weight(by_nt[k.spec.nt])
        self.arrays = list(by_nt.values())  # keeps the memory the TVM tensors point at alive


class Dispatcher:
    """Runs dense Y = X·Wᵀ (X[S, K], W[N, K]) for any S with the program chosen for S."""

    def __init__(
        self,
        table: DispatchTable | None,
        kernels: Mapping[str, UKernel],
        *,
        N: int | None,
        K: int | None,
        exact: Mapping[int, ExactKernel] | None = None,
        source: str = "local",
        meta: Mapping[str, Any] | None = None,
        epilogue: Epilogue | None = None,
    ) -> None:
        """`epilogue`: what the layer computes after X·Wᵀ when there is no table to say it (the numpy fallback);
        with a table, the table's, and an epilogue given that differs from it is an error."""
        if table is not None and table.mts and (N is None or K is None):  # (a table of vendor routes only: numpy)
            raise ValueError("a dispatcher with a table that runs uKernels needs N and K")
        if table is not None:
            missing = set(table.mts) - set(kernels)
            if missing:
                raise ValueError(f"the dispatch table uses uKernels that were not loaded: {sorted(missing)}")
        if table is not None and epilogue is not None and epilogue != table.epilogue:
            raise ValueError(
                f"the dispatch table's epilogue is {table.epilogue.describe()}, not {epilogue.describe()}: "
                "the layer was tuned with another bias or activation"
            )
        self.epilogue = table.epilogue if table is not None else (epilogue or NO_EPILOGUE)
        wrong = {uid: k.spec.epilogue for uid, k in kernels.items() if k.spec.epilogue != self.epilogue}
        if wrong:
            raise ValueError(f"uKernels {sorted(wrong)} compute another epilogue than the table's ({self.epilogue})")
        self.table = table
        self.kernels = dict(kernels)
        self.N, self.K = N, K
        self.exact = dict(exact or {})
        self.source = source  # "service", "cache", "fallback" or "local": where the table came from
        self.meta = dict(meta or {})
        self._programs: dict[int, tuple[Piece, ...]] = {}
        self._adopted: dict[int, tuple[Piece, ...]] = {}  # vendor-routed S a caller moved to uKernels (adopt)
        self._libraries: dict[int, str] = {}
        self._vendor_calls: dict[int, vendor.DenseCall | None] = {}
        self._library_calls: dict[str, vendor.DenseCall] = {}
        self._takes_bias = self.epilogue.bias
        self._bias_checked: Any = _UNRESOLVED  # the bias last checked (by identity); never None once set
        self._packed: dict[int, _Packed] = {}
        self._usage: dict[int, ShapeUsage] = {}
        self._lock = threading.Lock()
        self.baseline = vendor.NUMPY  # what the host runs without KernelFleet: calls with no table, held-out calls
        self.holdout: Holdout | None = None
        self.dtype = np.dtype(next(iter(self.kernels.values())).spec.dtype if self.kernels else "float32")
        self._dtype_name = self.dtype.name  # (numpy computes `dtype.name` in Python: 6 µs a call on AMD EPYC Zen 1)
        self._bias_buffers = threading.local()  # per calling thread: {padded width: (aligned buffer, TVM tensor)}
        row_bytes = [(d or 0) * self.dtype.itemsize for d in (K, N)]
        self._rows_aligned = all(b % ALIGN == 0 for b in row_bytes)

    def __deepcopy__(self, memo: dict[int, Any]) -> Dispatcher:
        """The dispatcher itself: it is the workload's, shared by every layer that runs it (a copy of an accelerated
        model too); its table and uKernels are read-only and it packs each weight it is given by identity."""
        return self

    @property
    def fallback(self) -> bool:
        return self.table is None

    def program(self, S: int) -> tuple[Piece, ...]:
        """The pieces that run S rows; empty when S runs on an exact kernel or numpy (the vendor)."""
        pieces = self._programs.get(S)
        if pieces is None:
            if self.table is None or S in self.exact:
                pieces = _FALLBACK
            else:
                pieces = self._adopted.get(S) or self.table.lookup(S)
            if len(self._programs) < MAX_TRACKED_SHAPES:  # memo bounded like usage: rare S re-derive it
                self._programs[S] = pieces
        return pieces

    def ukernel_program(self, S: int) -> tuple[Piece, ...]:
        """The uKernel program for S: the one that runs it where uKernels do, else (a vendor-routed S) the nearest
        interval's that can run S rows (DispatchTable.nearest_shape); empty with no table, at an exact-kernel S, or
        where no interval's uKernels can run S."""
        if self.table is None or S in self.exact:
            return ()
        pieces = self.program(S)
        if not pieces:
            shape = self.table.nearest_shape(S)
            pieces = shape.expand(S, self.table.mts) if shape is not None else ()
        return pieces

    def adopt(self, S: int) -> None:
        """Run S on `ukernel_program(S)` from now on instead of the vendor library the table routes it to: the caller
        timed both where it runs them and the uKernels won (the job timed them in isolation)."""
        pieces = self.ukernel_program(S)
        if not pieces:
            raise ValueError(f"no uKernel program can run S={S}")
        with self._lock:
            self._adopted[S] = pieces
            self._programs.pop(S, None)  # both memos derive S again, now from the adopted program
            self._vendor_calls.pop(S, None)

    def _vendor_call_for(self, S: int) -> vendor.DenseCall | None:
        """The library call that runs S where no uKernel program or exact kernel does (the table's route, numpy
        without a table), memoized per S: the vendor-routed call then costs the library's own call plus a lookup."""
        call = self._vendor_calls.get(S, _UNRESOLVED)
        if call is _UNRESOLVED:
            call = None if self.program(S) or S in self.exact else self._library_call(self.library(S))
            if len(self._vendor_calls) < MAX_TRACKED_SHAPES:
                self._vendor_calls[S] = call
        return call  # type: ignore[no-any-return]

    def _library_call(self, library: str) -> vendor.DenseCall:
        call = self._library_calls.get(library)
        if call is None:
            call = self._library_calls.setdefault(library, vendor.dense_call(library, self.epilogue))
        return call

    def library(self, S: int) -> str:
        """The vendor library that runs S when no uKernel does: the table's choice; the baseline without a table."""
        library = self._libraries.get(S)
        if library is None:
            library = (self.table.vendor_library(S) if self.table is not None else self.baseline) or vendor.NUMPY
            if len(self._libraries) < MAX_TRACKED_SHAPES:
                self._libraries[S] = library
        return library

    def hold_out(self, every: int, baseline: str | None = None) -> Dispatcher:
        """From now on one call in `every` per S runs `baseline` (a vendor library: numpy, torch; default the
        current `self.baseline`), timed against the served calls (kernelfleet.holdout); telemetry reports both.
        Calls with no table run the baseline too. Returns self."""
        library = self.baseline if baseline is None else baseline
        if library not in vendor.LIBRARIES:
            raise ValueError(f"baseline must be one of {', '.join(vendor.LIBRARIES)}, got {library!r}")
        with self._lock:
            self.baseline = library
            self.holdout = Holdout(every, library)
            self._libraries.clear()  # a table-less S resolved to the old baseline resolves again
            self._vendor_calls.clear()
        # the class changes instead of a test on every call: a dispatcher that holds nothing out keeps its hot path
        self.__class__ = _HeldOutDispatcher
        return self

    def vendor_route(self, S: int) -> str | None:
        """The vendor library the table routes S to; None where a uKernel program or an exact kernel runs S, or
        there is no table. A caller holding PyTorch tensors runs a PyTorch route itself (kernelfleet.torch)."""
        if self.table is None or S in self.exact or self.program(S):
            return None
        return self.library(S)

    def prepare(self, w: np.ndarray, *, refresh: bool = False) -> None:
        """Pack W for every uKernel now instead of on the first call that uses it.

        Packed copies are found by W's identity, so weights are treated as immutable: after changing W
        in place, call `prepare(w, refresh=True)` (or pass a new array), or calls keep the old values.
        """
        if not self.kernels:
            return  # numpy fallback: nothing to pack
        if refresh:
            with self._lock:
                self._packed.pop(id(w), None)
        self._packed_for(w)

    def _packed_for(self, w: np.ndarray) -> _Packed:
        entry = self._packed.get(id(w))
        if entry is not None and entry.ref() is w:
            return entry
        if self.N is not None and w.shape != (self.N, self.K):
            raise ValueError(f"W must be [{self.N}, {self.K}], got {list(w.shape)}")
        entry = _Packed(w, self.kernels)
        with self._lock:
            self._packed = {k: v for k, v in self._packed.items() if v.ref() is not None}  # drop dead weights
            self._packed[id(w)] = entry
        return entry

    def _raw_packed(self, w: np.ndarray, uid: str) -> np.ndarray:
        entry = self._packed_for(w)
        nt = self.kernels[uid].spec.nt
        return next(a for a in entry.arrays if a.shape[2] == nt)

    def __call__(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None, *, bias: np.ndarray | None = None
    ) -> np.ndarray:
        """act(X·Wᵀ + bias) for X[S, K]; `bias` [N] is required iff the layer's epilogue adds one."""
        shape = x.shape
        if len(shape) != 2 or shape[0] < 1 or (self.K is not None and shape[1] != self.K):
            raise ValueError(f"X must be [S≥1, {self.K or 'K'}], got {list(shape)}")
        if (bias is not None or self._takes_bias) and bias is not self._bias_checked:
            self._check_bias(bias, w)
        S = shape[0]
        call = self._vendor_calls.get(S, _UNRESOLVED)
        if call is _UNRESOLVED:
            call = self._vendor_call_for(S)
        if call is not None:  # the hot path of a vendor route: the library's call, the output, the count, inlined
            start = _now()
            y = call(x, w, bias)
            out = y if out is None else _copy_into(out, y)
            seconds = _now() - start
            usage = self._usage.get(S)
            if usage is None:
                self._record(S, seconds, self.table is None)
            else:  # lock-free: see _count
                usage.calls += 1
                usage.seconds += seconds
                if self.table is None:  # no table: numpy ran as a fallback; with one, S ran where the table chose
                    usage.fallbacks += 1
            return out
        pieces = self.program(S)
        start = time.perf_counter()
        if pieces:
            out = self._run_pieces(pieces, x, w, out, bias)
        else:  # an exact-shape kernel, built from the workload's own compute (with a bias iff the layer has one)
            try:
                y = self.exact[S](x, w) if bias is None else self.exact[S](x, w, bias)
            except Exception:  # e.g. no compiler on this host: drop the override, use the table from now on
                log.exception("exact-shape kernel for S=%d failed; using the dispatch table instead", S)
                self.exact.pop(S, None)
                self._programs.pop(S, None)
                self._vendor_calls.pop(S, None)
                return self(x, w, out, bias=bias)
            out = y if out is None else _copy_into(out, y)
        self._count(S, time.perf_counter() - start, False)
        return out

    def run_ukernels(self, x: np.ndarray, w: np.ndarray, *, bias: np.ndarray | None = None) -> np.ndarray:
        """act(X·Wᵀ + bias) on `ukernel_program(S)` whatever the table routes S to: a trial of the uKernels at a
        vendor-routed S (kernelfleet.torch times it against PyTorch in the model); counted as a served call."""
        shape = x.shape
        if len(shape) != 2 or shape[0] < 1 or (self.K is not None and shape[1] != self.K):
            raise ValueError(f"X must be [S≥1, {self.K or 'K'}], got {list(shape)}")
        if (bias is not None or self._takes_bias) and bias is not self._bias_checked:
            self._check_bias(bias, w)
        pieces = self.ukernel_program(shape[0])
        if not pieces:
            raise ValueError(f"no uKernel program can run S={shape[0]}")
        start = _now()
        y = self._run_pieces(pieces, x, w, None, bias)
        self._count(shape[0], _now() - start, False)
        return y

    def _run_pieces(
        self, pieces: tuple[Piece, ...], x: np.ndarray, w: np.ndarray, out: np.ndarray | None, bias: np.ndarray | None
    ) -> np.ndarray:
        """Each piece of a program on its rows of X, into `out` (or a new aligned array)."""
        S = x.shape[0]
        if x.dtype != self.dtype:
            raise ValueError(f"X must be {self.dtype}, got {x.dtype}")
        packed = self._packed_for(w).by_kernel
        x = as_aligned(x)  # one copy here rather than one per piece inside the kernels
        if out is not None and (out.shape != (S, w.shape[0]) or out.dtype != self.dtype):
            raise ValueError(f"out must be {self.dtype}[{S}, {w.shape[0]}], got {out.dtype}{list(out.shape)}")
        y = out if out is not None and is_aligned(out) else aligned_empty((S, w.shape[0]), self._dtype_name)
        biases = self._device_biases(bias) if bias is not None else {}
        row = 0
        for p in pieces:
            # every piece starts on a 64-byte boundary when K and N rows are multiples of 64 bytes;
            # otherwise the checked call copies the slice. Each piece runs the epilogue on its own rows.
            end = row + p.rows
            kernel = self.kernels[p.ukernel_id]
            if self._rows_aligned:
                b = biases.get(kernel.spec.n_computed)
                kernel.run_aligned(x[row:end], packed[p.ukernel_id], y[row:end], b)
            else:
                kernel(x[row:end], self._raw_packed(w, p.ukernel_id), y[row:end], bias=bias)
            row = end
        if out is None:
            return y
        return out if y is out else _copy_into(out, y)

    def _check_bias(self, bias: np.ndarray | None, w: np.ndarray) -> None:
        """Whether `bias` fits the layer's epilogue (raises if not); biases are long-lived, so a bias that passed is
        remembered by identity and callers test `bias is not self._bias_checked` before calling this."""
        check_bias(self.epilogue, bias, self.N if self.N is not None else w.shape[0])
        self._bias_checked = bias

    def _device_biases(self, bias: np.ndarray) -> dict[int, Any]:
        """The bias (checked by the caller) as each distinct padded width the uKernels compute, as TVM tensors.
        Copied per call, not cached by identity: biases change in place (fine-tuning, quantization scales) more
        often than weights. The copy goes into an aligned buffer this thread keeps per width, zero past N, with its
        TVM tensor made once: packing a fresh one per call (allocation, alignment, DLPack) cost 32 µs a call on
        AMD EPYC Zen 1, as much as the 768×768 uKernel at M = 1; the copy costs about 1 µs. Per thread, because one
        dispatcher serves every layer of its workload, each with its own bias, from any thread."""
        buffers: dict[int, tuple[np.ndarray, Any]] | None = getattr(self._bias_buffers, "by_width", None)
        if buffers is None:
            buffers = self._bias_buffers.by_width = {}
        out: dict[int, Any] = {}
        n_bias = bias.shape[0]
        for k in self.kernels.values():
            n = k.spec.n_computed
            if n in out:
                continue
            held = buffers.get(n)
            if held is None:
                buffer = aligned_empty((n,), self._dtype_name)
                buffer[:] = 0  # the padded columns' bias, never written again
                held = buffers[n] = (buffer, k.device_weight(buffer))
            held[0][:n_bias] = bias
            out[n] = held[1]
        return out

    def _count(self, S: int, seconds: float, fell_back: bool) -> None:
        """`_record` without the lock once S has its entry: three attribute updates, none of which CPython can
        interrupt between read and write (no Python code runs inside them), so concurrent callers lose no count;
        a `usage(reset=True)` racing a call may miss that one call. The lock costs ~0.3 µs a call (issue 31)."""
        usage = self._usage.get(S)
        if usage is None:
            self._record(S, seconds, fell_back)
        else:
            usage.calls += 1
            usage.seconds += seconds
            usage.fallbacks += fell_back

    def _record(self, S: int, seconds: float, fell_back: bool, calls: int = 1) -> None:
        with self._lock:  # against a concurrent usage(reset=True) and other calling threads
            usage = self._usage.get(S)
            if usage is None:
                key = S if len(self._usage) < MAX_TRACKED_SHAPES else -1
                usage = self._usage.setdefault(key, ShapeUsage())
            usage.calls += calls
            usage.seconds += seconds
            usage.fallbacks += calls if fell_back else 0

    def record_route(self, S: int, seconds: float) -> None:
        """Count a call for S that the caller ran on the vendor library the table routes S to (e.g. the conv
        dispatcher runs PyTorch's conv2d itself): the table's choice, not a miss."""
        self._count(S, seconds, False)

    def record_fallback(self, S: int, seconds: float = 0.0) -> None:
        """Count a call for S that the caller ran elsewhere (e.g. kernelfleet.torch runs PyTorch for an S past the
        table, or with no table): telemetry then reports it as a miss, like the numpy fallback's calls."""
        self._record(S, seconds, True)

    def record_elsewhere(self, S: int, calls: int, seconds: float) -> None:
        """Count `calls` misses for S at once, run elsewhere in `seconds` together: kernelfleet.torch counts the
        layers' calls of forwards that ran as the model's own this way."""
        self._record(S, seconds, True, calls)

    def usage(self, reset: bool = False) -> dict[int, ShapeUsage]:
        """Calls, kernel seconds and fallbacks per S since the last reset."""
        with self._lock:
            snapshot = {s: ShapeUsage(u.calls, u.seconds, u.fallbacks) for s, u in self._usage.items()}
            if reset:
                self._usage = {}
        return snapshot


class _HeldOutDispatcher(Dispatcher):
    """A Dispatcher after `hold_out`: each call goes through its Holdout, which serves it or runs the baseline."""

    holdout: Holdout

    def __call__(
        self, x: np.ndarray, w: np.ndarray, out: np.ndarray | None = None, *, bias: np.ndarray | None = None
    ) -> np.ndarray:
        serve = super().__call__
        if x.ndim != 2 or x.shape[0] < 1:
            return serve(x, w, out, bias=bias)  # refused as the dispatcher refuses it
        S = x.shape[0]
        return self.holdout.run(
            S, lambda: serve(x, w, out, bias=bias), lambda: self._baseline_call(S, x, w, out, bias), _now
        )

    def _baseline_call(
        self, S: int, x: np.ndarray, w: np.ndarray, out: np.ndarray | None, bias: np.ndarray | None
    ) -> np.ndarray:
        if (bias is not None or self._takes_bias) and bias is not self._bias_checked:
            self._check_bias(bias, w)
        start = _now()
        y = self._library_call(self.baseline)(x, w, bias)
        y = y if out is None else _copy_into(out, y)
        self._count(S, _now() - start, self.table is None)  # a call the host ran: fleet time, as every other
        return y


def _copy_into(out: np.ndarray, y: np.ndarray) -> np.ndarray:
    out[...] = y
    return out


def dispatch_overhead_s(dispatcher: Dispatcher, S: int, w: np.ndarray, calls: int = 20000, rounds: int = 5) -> float:
    """Median seconds per call of what a call adds before its kernels run: choosing the program for S,
    finding W's packed copies and the usage bookkeeping (warm: after the first call for S and W)."""
    dispatcher.program(S)
    if dispatcher.kernels:
        dispatcher.prepare(w)
    real_usage = dispatcher._usage  # the probe's own calls must not reach telemetry
    dispatcher._usage = {}
    per_call = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                pieces = dispatcher.program(S)
                if pieces:
                    dispatcher._packed_for(w)
                dispatcher._count(S, 0.0, False)
            per_call.append((time.perf_counter() - start) / calls)
    finally:
        dispatcher._usage = real_usage
    return sorted(per_call)[len(per_call) // 2]
