"""A PyTorch module whose GEMM-like layers run on KernelFleet dispatchers: `accelerate(module, source)`.

`accelerate` walks the module and replaces every `nn.Linear` (and transformers' GPT-2 `Conv1D`, which computes
x·W + b with W stored [in, out]) with an `AcceleratedLinear` that runs the layer's dense workload
(N = out, K = in, its bias, and the activation that follows it where that is fused) on the dispatcher the
fleet tuned for it. A call flattens the leading dims to S rows (x.reshape(-1, K), contiguous fp32), hands numpy
views of the torch tensors to the dispatcher (no copy: `Tensor.numpy()` shares the memory) and wraps the result
with `torch.from_numpy` (no copy either). On a CUDA target the `CudaDispatcher` takes the torch CUDA tensors
themselves (DLPack).

Fused activations: where a layer's output goes to an activation module alone (kernelfleet.torch_fusion reads it
from the parent's traced forward: DistilBERT's `lin1` → `activation`, a Llama MLP's `gate_proj` → `act_fn`, BERT's
intermediate, GPT-2's `c_fc` → `act`, an `nn.Sequential`), the fused workload's table is asked for first; only when
it exists does the layer compute the activation in its uKernels' epilogue (the activation module is then replaced
by `nn.Identity`). Otherwise the unfused workload (bias only), then the bare one (the bias added in torch).
`extract_torch` lists exactly these fused workloads, so an onboarding tunes the tables this module asks for.

Gated MLPs (SwiGLU, GeGLU: `down(act(gate(x)) * up(x))`, Llama's and Mistral's): gate and up run as one dense layer
of width 2·I on the stacked weight [W_gate; W_up] (one table or PyTorch call that reads x once), named
`gate_proj+up_proj`, and a `GatedLinearUnit` computes act · product on its halves; the parent's forward is rewritten
with torch.fx to call it (a GraphModule of the parent's class name that keeps every child, so the state dict keeps
its keys; the pair's parameters become views of the stacked weight).

Everything a table does not cover runs the original PyTorch computation (the same parameters) and is counted
per layer with its reason: another dtype than the table's (float32; on CUDA, the layer's float16 or bfloat16
finds that dtype's table), another device than the dispatcher's, a call that
autograd must record (grad enabled and anything requiring grad: run under `torch.inference_mode()` or
`torch.no_grad()`), S beyond the table's last tuned S (unless `extend_range=True`: the table's last interval
then extends, as `Dispatcher` does), no table at all. `stats()` reports calls, fallbacks and the shapes run per
layer; fallbacks for a shape the table lacks (past its range, no table) are also recorded on the dispatcher, so
telemetry reports them as misses.

`source` is a `kernelfleet.Client` (dispatchers fetched and verified through the signed disk cache, which serves
them when the service is down: `kernelfleet.dispatch_cache.load_dispatcher`; the cache is keyed by service, so a
client reads only its own service's tables) or a cache directory (offline: only the documents cached there that
verify with the trusted key, whichever service cached them). This module imports torch: it is the SDK's only
module that does at import time (kernelfleet.model_import imports it when an extractor runs).

Forwards that run every layer on PyTorch anyway (the whole-forward check's EAGER side and choice, an input signature
whose layers run no uKernel) run the model's own forward: a twin of the module tree as it was before these
replacements, sharing every parameter and buffer (kernelfleet.torch_twin).

`accelerate` prints a summary to stderr (`print_summary=False`: none) and keeps it: `fast.summary()`
(kernelfleet.accelerate_summary) says per layer whether a table or PyTorch runs it, why PyTorch, and the speedup the
table is expected to give from the job's timings. Each layer left on PyTorch is also a WARNING naming the layer.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch  # absolute: the real torch, never this module
from torch import nn

# torch_twin.BUILD_TWIN: read per call (bench/own_forward.py)
from kernelfleet import in_model_check, torch_twin, vendor
from kernelfleet.accelerate_summary import AccelerationSummary, LayerSummary, expected_speedup
from kernelfleet.dispatch_cache import DispatchCache, DispatchSource, default_cache_dir, load_dispatcher, service_id
from kernelfleet.dispatcher import MAX_TRACKED_SHAPES, Dispatcher
from kernelfleet.epilogue import NO_EPILOGUE, Epilogue
from kernelfleet.errors import KernelFleetError, ServiceUnavailable
from kernelfleet.holdout import Holdout
from kernelfleet.in_model_check import InModelCheck, Verdict
from kernelfleet.torch_forward import ForwardScope
from kernelfleet.torch_fusion import (
    DenseLayer,
    GatedPair,
    dense_layers,
    fusions,
    rewrite_gated_pairs,
    stacked_linear,
)
from kernelfleet.torch_twin import OwnForward, Snapshot, build_twin

if TYPE_CHECKING:
    from kernelfleet.cuda_ukernel import CudaDispatcher
    from kernelfleet.telemetry import TelemetryReporter

log = logging.getLogger(__name__)

_F32 = torch.float32
_TABLE, _PYTORCH = "table", "pytorch"  # where a layer's calls for one S go (AcceleratedLinear._routes)
_TRIAL = "trial"  # S whose uKernels are checked against PyTorch inside the model before one is kept
_now = time.perf_counter
FALLBACK_REASONS = ("dtype", "device", "autograd", "range", "no_table", "empty")
_CALL_REASONS = frozenset(("dtype", "device", "autograd"))  # fallbacks for the call itself, not for its shapes


# -- workloads ------------------------------------------------------------------------------------------------------
def dense_workload(N: int, K: int, epilogue: Epilogue = NO_EPILOGUE, dtype: str = "float32") -> dict[str, Any]:
    """The dense workload body (POST /v1/workloads) of a layer X[M, K] → [M, N] with this epilogue, in `dtype`."""
    return {
        "op": "dense",
        "dtype": dtype,
        "dims": {"N": int(N), "K": int(K)},
        "symbolic": ["M"],
        "attrs": {"bias": epilogue.bias, "activation": epilogue.activation},
    }


def workload_hash(spec: Mapping[str, Any]) -> str:
    """The service's hash of a dense workload (its canonical form: defaults filled in, `activation` left out while
    "none" so workloads registered before activations keep theirs). Dense only; tests hold it to the service's."""
    if spec.get("op") != "dense":
        raise ValueError(f"only dense workloads are hashed here, got {spec.get('op')!r}")
    attrs: dict[str, Any] = {"bias": False, "activation": "none", **dict(spec.get("attrs") or {})}
    if attrs["activation"] == "none":
        del attrs["activation"]
    canonical = {
        "op": "dense",
        "dtype": spec.get("dtype", "float32"),
        "dims": dict(sorted(dict(spec["dims"]).items())),
        "symbolic": sorted(spec.get("symbolic") or []),
        "attrs": dict(sorted(attrs.items())),
    }
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# -- the layer ------------------------------------------------------------------------------------------------------
@dataclass
class LayerStats:
    calls: int = 0
    fallbacks: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    shapes: Counter[int] = field(default_factory=Counter)  # S → calls the dispatcher ran
    fallback_shapes: Counter[int] = field(default_factory=Counter)  # S → calls PyTorch ran
    # S → the in-model check (kernelfleet.in_model_check): median seconds of the uKernels and of PyTorch (None where
    # taken from the S around it), and which the layer kept
    in_model: dict[int, tuple[float | None, float | None, str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "fallbacks": self.fallbacks,
            "reasons": dict(self.reasons),
            "shapes": dict(sorted(self.shapes.items())),
            "fallback_shapes": dict(sorted(self.fallback_shapes.items())),
            "in_model": {
                S: {"ukernels_s": t, "pytorch_s": p, "runs": r} for S, (t, p, r) in sorted(self.in_model.items())
            },
        }


class AcceleratedLinear(nn.Module):
    """A Linear (or Conv1D) whose calls run on a KernelFleet dispatcher, and on PyTorch where it does not cover.

    It holds the original layer's parameters themselves (`weight`, `bias`: same names, so state dicts keep their
    keys) and packs the weight for the dispatcher once, again only when the parameter's storage or version
    changes (an in-place update under no_grad, `load_state_dict`)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    activation: nn.Module | None
    _holdout: Holdout  # set by hold_out

    def __init__(
        self,
        name: str,
        layer: nn.Module,
        dense: DenseLayer,
        dispatcher: Dispatcher | CudaDispatcher | None,
        workload: str,
        *,
        fused_bias: bool,
        activation: nn.Module | None,
        max_rows: int,
    ) -> None:
        super().__init__()
        self.name = name
        weight, bias = layer.weight, layer.bias if dense.bias else None
        assert isinstance(weight, nn.Parameter) and (bias is None or isinstance(bias, nn.Parameter))
        self.weight = weight
        self.register_parameter("bias", bias)  # None too: forward reads both from _parameters
        self.N, self.K, self.transposed = dense.N, dense.K, dense.transposed
        for attr in ("in_features", "out_features", "nf", "nx"):  # code that reads them keeps working
            if hasattr(layer, attr):
                setattr(self, attr, getattr(layer, attr))
        self.activation = activation  # fused: the dispatcher computes it; PyTorch fallbacks apply this module
        self.dispatcher = dispatcher
        self.workload = workload
        self.fused_bias = fused_bias  # the table adds the bias; else torch adds it after the dispatcher
        self.max_rows = max_rows  # largest S dispatched (0: none)
        table = getattr(dispatcher, "table", None)
        from kernelfleet.cuda_ukernel import CudaDispatcher  # no GPU needed to import it

        self._cuda = isinstance(dispatcher, CudaDispatcher)
        # the dtype its table computes in: float32 on CPUs; a CUDA table's own (half precision on sm_80+)
        self._dtype = getattr(torch, dispatcher.dtype) if isinstance(dispatcher, CudaDispatcher) else _F32
        self._cpu_dispatcher = dispatcher if isinstance(dispatcher, Dispatcher) else None
        self._on = dispatcher is not None and table is not None
        self._device = "cuda" if self._cuda else "cpu"
        self._w_key: tuple[int, int] | None = None
        self._w: Any = None
        self._b_key: tuple[int, int] | None = None
        self._b: Any = None
        self._lock = threading.Lock()
        self.stats = LayerStats()
        self._routes: dict[int, str] = {}  # S → _TABLE, _PYTORCH or _TRIAL, once a call has seen which runs it
        self.forward_scope: ForwardScope | None = None  # set by accelerate: threads and the whole-forward check
        # accelerate(vendor_routes="pytorch"): the S the table gives to numpy run on PyTorch too
        self.numpy_routes_on_pytorch = False
        self.check_in_model = False  # accelerate(check_in_model=True): uKernel S checked against PyTorch in place
        # the in-model check of its S; accelerate gives every layer that runs the same dispatcher the same one
        self.in_model = InModelCheck(table)
        # S → seconds of this layer's latest PyTorch call at S (a fallback, a PyTorch route, an in-model check's or
        # the holdout's baseline): what a call of the model's own forward at S is counted at (own_call)
        self._torch_s: dict[int, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        """A copy (deepcopy) gets a lock of its own and packs its own weight on its first call; the dispatcher is
        shared (`Dispatcher.__deepcopy__`)."""
        state = dict(self.__dict__)
        del state["_lock"]
        state.update(_w=None, _w_key=None, _b=None, _b_key=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()

    def extra_repr(self) -> str:
        act = f", activation={type(self.activation).__name__} (fused)" if self.activation is not None else ""
        route = "dispatcher" if self._on else "pytorch"
        return f"N={self.N}, K={self.K}, bias={self.bias is not None}{act}, runs_on={route}, max_rows={self.max_rows}"

    # the PyTorch computation of the original layer (plus the fused activation), on PyTorch's current threads: inside
    # a forward that runs uKernels that is one thread too, since given back the caller's threads PyTorch leaves libgomp
    # workers spinning on the cores the next uKernel needs (kernelfleet.torch_forward)
    def _layer_in_torch(self, x: torch.Tensor) -> torch.Tensor:
        params = self._parameters  # not self.weight: Module.__getattr__ costs ~0.3 µs a parameter per call
        w, b = params["weight"], params["bias"]
        assert w is not None
        if self.transposed:
            size = (*x.shape[:-1], self.N)
            flat = x.reshape(-1, x.shape[-1])
            y = torch.mm(flat, w) if b is None else torch.addmm(b, flat, w)
            y = y.view(size)
        else:
            y = nn.functional.linear(x, w, b)
        activation = self.activation
        return activation(y) if activation is not None else y

    def _fallback(self, x: torch.Tensor, reason: str, S: int) -> torch.Tensor:
        if reason in _CALL_REASONS and self.forward_scope is not None:
            self.forward_scope.call_fallback = True  # the same shapes in inference mode may run uKernels
        start = time.perf_counter()
        y = self._layer_in_torch(x)
        seconds = time.perf_counter() - start
        st = self.stats
        st.calls += 1
        st.fallbacks += 1
        st.reasons[reason] += 1
        if S > 0 and (S in st.fallback_shapes or len(st.fallback_shapes) < MAX_TRACKED_SHAPES):
            st.fallback_shapes[S] += 1
        if reason in ("range", "no_table") and isinstance(self.dispatcher, Dispatcher):
            self.dispatcher.record_fallback(S, seconds)  # a shape the fleet has not tuned
            self._note_torch(S, seconds)
        return y

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[int, int]:
        try:
            return t.data_ptr(), t._version
        except RuntimeError:  # an inference tensor has no version counter (and cannot change in place)
            return t.data_ptr(), -1

    def _weight_view(self, weight: torch.Tensor) -> Any:
        """W[N, K] as the dispatcher takes it: a numpy view of the parameter (CPU), the CUDA tensor itself; packed
        (CPU) once per storage and version of the parameter."""
        key = self._key(weight)
        if key != self._w_key:
            with self._lock:
                w = weight.detach()
                if self._cuda:
                    view: Any = w.t().contiguous() if self.transposed else w.contiguous()
                else:
                    view = w.numpy().T if self.transposed else w.numpy()
                    assert isinstance(self.dispatcher, Dispatcher)
                    self.dispatcher.prepare(view)  # a new array object: packed anew, the old copy freed with it
                self._w, self._w_key = view, key
        return self._w

    def _bias_view(self, bias: torch.Tensor | None) -> np.ndarray:
        assert bias is not None
        key = self._key(bias)
        if key != self._b_key:
            self._b, self._b_key = bias.detach().numpy(), key
        return self._b  # type: ignore[no-any-return]

    def prepare(self) -> None:
        """Pack the weight now (accelerate does) rather than on the first call."""
        if self._on and self.weight.device.type == self._device and self.weight.dtype is self._dtype:
            self._weight_view(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scope = self.forward_scope
        if scope is not None and scope.bypass:  # the whole-forward check runs (or chose) the model's own forward
            start = _now()
            y = self._layer_in_torch(x)
            self._note_torch(x.numel() // self.K, _now() - start)  # what its call is counted at (torch_seconds)
            return y
        K = self.K
        shape = x.shape
        S = x.numel() // K if shape and shape[-1] == K else 0
        if scope is not None and scope.learning is not None:
            scope.learning.append((self, S))  # the signature's first forward: what its own forwards will call
        route = self._routes.get(S)
        if route is _PYTORCH:  # the table routes S to PyTorch: the original layer on the caller's tensors,
            start = _now()  # nothing in between (issue 31 item 2); any dtype, device or grad mode runs as it would
            y = self._layer_in_torch(x)
            self._routed(S, _now() - start)
            return y
        if route is _TRIAL:
            return self._in_model_check(x, S)
        if route is _TABLE:  # the hot path (issue 33 item 4): S was checked once; what can change per call is here
            params = self._parameters  # not self.weight: Module.__getattr__ costs ~0.3 µs a parameter per call
            w, bias = params["weight"], params["bias"]
            assert w is not None
            try:
                w_key = (w.data_ptr(), w._version)  # the packed weight is this one: float32, on the CPU, unchanged
            except RuntimeError:  # an inference tensor has no version counter (and cannot change in place)
                w_key = (w.data_ptr(), -1)
            if w_key == self._w_key and x.dtype is _F32 and x.is_cpu and not _tracks_grad(x, w, bias):
                x2 = x if len(shape) == 2 else x.reshape(S, K)
                if not x2.is_contiguous():
                    x2 = x2.contiguous()
                xa = (x2.detach() if x2.requires_grad else x2).numpy()
                d = self._cpu_dispatcher  # _TABLE routes are CPU dispatchers' only
                assert d is not None
                self._narrow_threads()
                if self.fused_bias:
                    y = torch.from_numpy(d(xa, self._w, bias=self._bias_view(bias)))
                else:
                    y = torch.from_numpy(d(xa, self._w))
                    if bias is not None:
                        y += bias  # not under autograd (checked above): no detach needed
                st = self.stats
                st.calls += 1
                if S in st.shapes or len(st.shapes) < MAX_TRACKED_SHAPES:
                    st.shapes[S] += 1
                return y if len(shape) == 2 else y.view((*shape[:-1], self.N))
        return self._checked(x, S)

    def _checked(self, x: torch.Tensor, S: int, trial: bool = False) -> torch.Tensor:
        """A call with every check in order (the first for each S, or one the hot path's tests turned away): its
        fallback reason, or the dispatcher; S's route is remembered once the table is known to cover it. `trial`: the
        in-model check's uKernel side, which runs a vendor-routed S on uKernels (Dispatcher.run_ukernels)."""
        K, shape = self.K, x.shape
        y: torch.Tensor
        params = self._parameters
        w, bias = params["weight"], params["bias"]
        assert w is not None
        if x.dtype is not self._dtype or w.dtype is not self._dtype:
            return self._fallback(x, "dtype", S)
        if not ((x.is_cuda and w.is_cuda) if self._cuda else (x.is_cpu and w.is_cpu)):
            return self._fallback(x, "device", S)
        if _tracks_grad(x, w, bias):
            return self._fallback(x, "autograd", S)
        if S == 0:  # empty, or not [..., K]: PyTorch gives the empty result or the error
            return self._fallback(x, "empty", S)
        if not self._on:
            return self._fallback(x, "no_table", S)
        if self.max_rows < S:
            return self._fallback(x, "range", S)
        x2 = x if len(shape) == 2 else x.reshape(S, K)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        d = self.dispatcher
        remember = len(self._routes) < MAX_TRACKED_SHAPES
        library = d.vendor_route(S) if isinstance(d, Dispatcher) else None
        on_pytorch = library == vendor.TORCH or (library is not None and self.numpy_routes_on_pytorch)
        if on_pytorch and not trial:
            # the job timed PyTorch fastest at S (or a vendor library, and the model's own runs it): from now on
            # the first test in forward sends S there; with check_in_model, first the check if uKernels can run S
            # (the job timed them in isolation against all of PyTorch's threads; in a forward PyTorch runs on one)
            if remember:
                assert isinstance(d, Dispatcher)
                trial_next = self.check_in_model and bool(d.ukernel_program(S))
                self._routes[S] = _TRIAL if trial_next else _PYTORCH
                if trial_next and self.forward_scope is not None:
                    self.forward_scope.trial_call = True  # S is undecided: this forward says nothing of its shapes
            start = _now()
            y = self._layer_in_torch(x)
            self._routed(S, _now() - start)
            return y
        if isinstance(d, Dispatcher):
            self._narrow_threads()
            xa = (x2.detach() if x2.requires_grad else x2).numpy()
            fused = self.fused_bias
            run = d.run_ukernels if on_pytorch else d  # (a trial's: uKernels where S is otherwise PyTorch's)
            y = torch.from_numpy(run(xa, self._weight_view(w), bias=self._bias_view(bias) if fused else None))
            if bias is not None and not fused:
                y += bias.detach()
            if remember and S not in self._routes:
                # checked against PyTorch inside the model first (check_in_model), else kept as the table says
                self._routes[S] = _TRIAL if self.check_in_model else _TABLE
        else:  # the CudaDispatcher: torch CUDA tensors in and out (DLPack), no epilogue fused
            assert d is not None
            if self.forward_scope is not None:
                self.forward_scope.call_fallback = True  # a table ran: not a forward of PyTorch alone
            y = d(x2.detach(), self._weight_view(w))
            if bias is not None:
                y += bias.detach()
        self._count(S)
        return y if len(shape) == 2 else y.view((*shape[:-1], self.N))

    def _routed(self, S: int, seconds: float) -> None:
        """Count a call the table routed to PyTorch in the dispatcher's usage (the table's choice, not a miss)."""
        self.dispatcher.record_route(S, seconds)  # type: ignore[union-attr]  # only Dispatchers have PyTorch routes
        self._count(S)
        self._note_torch(S, seconds)

    def _note_torch(self, S: int, seconds: float) -> None:
        if S in self._torch_s or len(self._torch_s) < MAX_TRACKED_SHAPES:
            self._torch_s[S] = seconds

    def own_call(self, S: int) -> Dispatcher | None:
        """Where a call at S that the model's own forward ran (no wrapper: kernelfleet.torch_forward counts it) is
        counted: the layer's CPU dispatcher (None without one)."""
        return self._cpu_dispatcher if S > 0 else None

    def torch_seconds(self, S: int) -> float:
        """This layer's latest PyTorch call at S in seconds, 0 where none ran: what an own forward's call costs."""
        return self._torch_s.get(S, 0.0)

    def _narrow_threads(self) -> None:
        """A uKernel is about to run: the forward scope notes it and (thread_policy="managed") narrows PyTorch."""
        scope = self.forward_scope
        if scope is not None:
            scope.ran_table = True
            if not scope.runs_ukernels:
                scope.narrow()

    def _in_model_check(self, x: torch.Tensor, S: int) -> torch.Tensor:
        """The table runs S on uKernels, timed against the job's libraries in isolation; inside a model the other
        libraries' thread pools (and PyTorch's between layers) change that, so S is checked where it runs, once for
        every layer of this table (kernelfleet.in_model_check): while unsettled, this call is one sample, on the
        side the check asks for; once settled (by these samples, the other layers', or the S around it), the
        call runs the kept route. The medians and the choice are in `stats.in_model`."""
        w, bias = self._parameters["weight"], self._parameters["bias"]
        assert w is not None
        if x.dtype is not _F32 or not x.is_cpu or _tracks_grad(x, w, bias):
            return self._checked(x, S)  # a call the table would not run (its fallback), not a sample
        check = self.in_model
        verdict = check.verdict(S)
        if verdict is None:
            if self.forward_scope is not None:
                self.forward_scope.trial_call = True  # this forward is no sample of what the tables will run
            side = check.next_side(S)
            start = _now()
            if side == in_model_check.TABLE:
                y = self._checked(x, S, trial=True)
                seconds = _now() - start
            else:
                y = self._layer_in_torch(x)
                seconds = _now() - start
                self._routed(S, seconds)
            verdict = check.add(S, side, seconds)
            if verdict is not None:
                self._keep(S, verdict)
            return y
        self._keep(S, verdict)
        if verdict.route == in_model_check.TABLE:
            return self._checked(x, S)
        start = _now()
        y = self._layer_in_torch(x)
        self._routed(S, _now() - start)
        return y

    def _keep(self, S: int, verdict: Verdict) -> None:
        """Run S where the table's in-model check settled it, from this call on (and say so in `stats.in_model`); a
        vendor-routed S the uKernels won moves to them in the dispatcher (Dispatcher.adopt), shared by its layers."""
        d = self._cpu_dispatcher
        on_table = verdict.route == in_model_check.TABLE
        if on_table and d is not None and d.vendor_route(S) is not None:
            d.adopt(S)
        self._routes[S] = _TABLE if on_table else _PYTORCH
        self.stats.in_model[S] = (verdict.ukernels_s, verdict.pytorch_s, self._routes[S])

    def route(self, S: int) -> str | None:
        """Where this layer's calls at S go now: "table" (the dispatcher), "pytorch", "trial" (the in-model check
        is still timing both), or None (no call at S has been routed yet)."""
        return self._routes.get(S)

    def hold_out(self, holdout: Holdout) -> None:
        """From now on one call in `holdout.every` per S that the table serves (on uKernels or routed to PyTorch)
        runs the layer's PyTorch computation instead, both sides timed whole (kernelfleet.holdout)."""
        self._holdout = holdout
        # an instance attribute nn.Module.__call__ finds first: a layer that holds nothing out keeps its hot path
        self.forward = self._held_out_forward  # type: ignore[method-assign]

    def _held_out_forward(self, x: torch.Tensor) -> torch.Tensor:
        K, shape = self.K, x.shape
        S = x.numel() // K if shape and shape[-1] == K else 0
        route = self._routes.get(S)
        serve = type(self).forward
        if not self._on and S > 0:  # no table: both sides are the layer's PyTorch computation, so the fleet learns
            return self._holdout.run(S, lambda: serve(self, x), lambda: serve(self, x), _now)  # its noise floor
        if route is not _TABLE and route is not _PYTORCH:  # a fallback, a first call or an in-model check: not a sample
            return serve(self, x)
        return self._holdout.run(S, lambda: serve(self, x), lambda: self._baseline(x, S), _now)

    def _baseline(self, x: torch.Tensor, S: int) -> torch.Tensor:
        scope = self.forward_scope
        if scope is not None and scope.learning is not None:
            scope.learning.append((self, S))  # (held out: forward is not called)
        start = _now()
        y = self._layer_in_torch(x)
        self._routed(S, _now() - start)  # a call the host ran: the fleet's time, not a miss
        return y

    def _count(self, S: int) -> None:
        st = self.stats
        st.calls += 1
        if S in st.shapes or len(st.shapes) < MAX_TRACKED_SHAPES:
            st.shapes[S] += 1


class GatedLinearUnit(nn.Module):
    """act(x·W_gateᵀ) · (x·W_upᵀ) from one stacked dense layer (kernelfleet.torch_fusion.GatedPair): one dispatcher
    (or PyTorch) call of width 2·N reads x once; the activation and the product follow on its two halves.

    The stacked `AcceleratedLinear` is held, not registered: its weight is the storage of the pair's own parameters,
    which the rewritten parent keeps under their original names (`pair`: the gate and up modules, held too). A copy
    (deepcopy, unpickling) makes them views of the copy's stacked weight again (`__setstate__`): a Parameter's own
    deepcopy clones it, and the pair would come apart from its stacked table (and the twin, kernelfleet.torch_twin,
    from the tables' forward)."""

    stacked: AcceleratedLinear
    act: nn.Module
    pair: tuple[nn.Module, nn.Module] | None

    def __init__(
        self, stacked: AcceleratedLinear, act: nn.Module, width: int, pair: tuple[nn.Module, nn.Module] | None = None
    ) -> None:
        super().__init__()
        object.__setattr__(self, "stacked", stacked)
        object.__setattr__(self, "act", act)
        object.__setattr__(self, "pair", pair)
        self.width = width

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]
        if self.pair is None:
            return
        for name in ("weight", "bias"):
            whole = self.stacked._parameters.get(name)
            if whole is None:
                continue
            halves = (slice(0, self.width), slice(self.width, None))
            for module, half in zip(self.pair, halves, strict=True):
                old = module._parameters.get(name)
                if old is not None and old.untyped_storage().data_ptr() != whole.untyped_storage().data_ptr():
                    module._parameters[name] = nn.Parameter(whole.detach()[half], requires_grad=old.requires_grad)

    def extra_repr(self) -> str:
        return f"width={self.width}, act={type(self.act).__name__}, stacked={self.stacked.name}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.stacked(x)
        gated: torch.Tensor = self.act(y[..., : self.width])
        up = y[..., self.width :]
        if torch.is_grad_enabled() and (gated.requires_grad or up.requires_grad):
            return gated * up  # autograd may have saved the activation's output: no in-place product
        return gated.mul_(up)  # the activation's output is a fresh tensor


# -- accelerate -----------------------------------------------------------------------------------------------------
class _Offline:
    """A DispatchSource that never answers: load_dispatcher then serves only what the cache holds, verified."""

    def __init__(self, root: Path) -> None:
        self.base_url = f"offline:{root}"

    def dispatch_raw(self, workload: str, target: str, etag: str | None = None) -> tuple[bytes, str | None, str] | None:
        raise ServiceUnavailable("offline: reading the dispatch cache only")

    def artifact(self, sha256: str) -> bytes:
        raise ServiceUnavailable("offline: reading the dispatch cache only")

    def signing_key(self) -> str:
        raise ServiceUnavailable("offline: reading the dispatch cache only")


def _offline_key(cache: DispatchCache, explicit: str | None) -> str | None:
    """The key cached documents must verify with offline: the explicit one, $KERNELFLEET_TRUSTED_KEY, or the one
    key pinned in the cache (several pinned services: ambiguous, pass trusted_key)."""
    key = explicit or os.environ.get("KERNELFLEET_TRUSTED_KEY")
    if key:
        return key
    pinned = {p.read_text().strip() for p in (cache.root / "keys").glob("*.pub")} - {""}
    if len(pinned) > 1:
        raise ValueError(f"{cache.root} pins the keys of {len(pinned)} services: pass trusted_key= to say which")
    return pinned.pop() if pinned else None


def _cached_targets(cache: DispatchCache, hashes: set[str], service: str | None) -> set[str]:
    """Targets with a table cached for one of `hashes`: this service's (`service_id`; only where it has none, those
    of the unkeyed layout written before the cache was keyed by service), or every service's offline (None)."""
    entries = [e for e in cache.entries() if e.workload in hashes]
    if service is None:
        return {e.target for e in entries}
    return {e.target for e in entries if e.service == service} or {e.target for e in entries if e.service is None}


def _live_targets(client: Any, kind: str) -> set[str] | None:
    """The service's live targets of this kind; None offline or when it does not answer."""
    if client is None or not hasattr(client, "targets"):
        return None
    try:
        return {str(t.target_fingerprint) for t in client.targets() if t.kind == kind}
    except (KernelFleetError, OSError) as exc:
        log.warning("cannot list the service's targets (%s): choosing among the cached tables' targets", exc)
        return None


def _resolve_target(target: str | None, cache: DispatchCache, hashes: set[str], client: Any, kind: str) -> str:
    """`target`, else the service's one live target of the parameters' kind (the client names the fleet to serve
    from: its live target wins over what the cache holds, which may be another service's or a retired target's;
    of several live ones, the one with cached tables), else the one target with cached tables (the service
    down, or offline)."""
    if target:
        return target
    live = _live_targets(client, kind)
    cached = _cached_targets(cache, hashes, None if client is None else service_id(client.base_url))
    candidates = cached if not live else live if len(live) == 1 else (live & cached) or live
    if len(candidates) == 1:
        return next(iter(candidates))
    raise ValueError(
        f"cannot tell which target's tables to use ({len(candidates)} candidates: {sorted(candidates)[:4]}): pass "
        "target= (a target fingerprint, `kernelfleet targets`)"
    )


def _why_pytorch(tried: list[tuple[str, str]]) -> str:
    """Why no table runs a layer, from (workload, why) of each workload tried; workloads with one cause together."""
    by_why: dict[str, list[str]] = {}
    for h, why in tried:
        by_why.setdefault(why, []).append(h[:12])
    return "; ".join(f"workload {', '.join(hs)}: {why}" for why, hs in by_why.items())


@dataclass
class _Site:
    name: str
    parent: nn.Module | None
    attr: str
    layer: nn.Module
    dense: DenseLayer
    act_attr: str | None = None  # the parent's attribute holding the activation that follows the layer
    act: nn.Module | None = None
    activation: str = "none"  # fused into the table's epilogue
    pair: GatedPair | None = None  # a gated pair: `layer` is its gate, `dense` the stacked layer's


def _sites(root: nn.Module) -> list[_Site]:
    """The layers accelerate replaces, each with the activation it fuses, and the gated pairs it stacks
    (kernelfleet.torch_fusion decides all three, for extract_torch too)."""
    layers = dense_layers(root)
    if "" in layers:
        return [_Site("", None, "", root, layers[""])]
    activations, pairs = fusions(root)
    stacked = {p.up for p in pairs.values()}
    sites = []
    for name, dense in layers.items():
        if name in stacked:
            continue  # runs in its gate's pair
        parent_name, _, attr = name.rpartition(".")
        parent = root.get_submodule(parent_name)
        pair = pairs.get(name)
        if pair is not None:
            sites.append(_Site(pair.name, parent, attr, parent.get_submodule(attr), pair.dense, pair=pair))
            continue
        site = _Site(name, parent, attr, root.get_submodule(name), dense)
        fusion = activations.get(name)
        if fusion is not None:
            site.act_attr = fusion.activation_module.rpartition(".")[2]
            site.act, site.activation = getattr(parent, site.act_attr), fusion.activation
        sites.append(site)
    return sites


def table_dtype(layer: nn.Module, device_kind: str) -> str:
    """The dtype of the workload whose table runs `layer`: a CUDA layer's own half precision (GPU ukernel jobs tune
    float16 and bfloat16 on sm_80+), else float32 (CPU uKernels are float32: a half-precision CPU layer stays on
    PyTorch, its calls counted as dtype fallbacks)."""
    dtype = str(getattr(layer, "weight", torch.empty(0)).dtype).removeprefix("torch.")
    return dtype if device_kind == "cuda" and dtype in ("float16", "bfloat16") else "float32"


def _candidates(site: _Site) -> list[Epilogue]:
    d = site.dense
    out = [Epilogue(d.bias, site.activation), Epilogue(d.bias, "none"), Epilogue(False, "none")]
    return list(dict.fromkeys(out))


def _fits(table_epilogue: Epilogue, site: _Site) -> bool:
    """Whether a table's epilogue computes this layer: its bias only if the layer has one, its activation only if it
    is the one that follows the layer (and then after the layer's own bias)."""
    if table_epilogue.bias and not site.dense.bias:
        return False
    if table_epilogue.activation == "none":
        return True
    return table_epilogue.activation == site.activation and table_epilogue.bias == site.dense.bias


def _tracks_grad(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Autograd must see this call (PyTorch runs it): grad mode is on and an operand requires grad."""
    return torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (bias is not None and bias.requires_grad))


class AcceleratedModule(nn.Module):
    """The module with its GEMM-like layers accelerated (`.module`); calls go to it, attributes it lacks are read
    from it. `summary()` says what runs each layer, `stats()` what ran; `close()` stops the telemetry reporter
    (flushing what it holds).

    A forward run as the model's own (`forward_decisions()`: the check's EAGER side and choice, a signature known
    to run no uKernel) runs the twin of the original module tree (kernelfleet.torch_twin), held by `.module`'s
    `forward` attribute, not registered: it shares every parameter and buffer and is in no state dict."""

    def __init__(
        self,
        module: nn.Module,
        layers: dict[str, AcceleratedLinear],
        reporter: TelemetryReporter | None,
        summary: AccelerationSummary | None = None,
        hooks: list[Any] | None = None,
        scope: ForwardScope | None = None,
        own: OwnForward | None = None,
    ) -> None:
        super().__init__()
        self.module = module
        object.__setattr__(self, "_scope", scope)
        object.__setattr__(self, "_own", own)  # not registered: the twin is no part of the model's state
        object.__setattr__(self, "_layers", layers)  # not registered twice: they live inside `module`
        object.__setattr__(self, "reporter", reporter)
        object.__setattr__(self, "_hooks", hooks or [])
        object.__setattr__(self, "_summary", summary or AccelerationSummary(None, ()))

    @property
    def layers(self) -> dict[str, AcceleratedLinear]:
        return self._layers  # type: ignore[no-any-return]

    def summary(self) -> AccelerationSummary:
        """Per layer, as `accelerate` left it: on a table (where from, what it fuses, the speedup expected from the
        job's timings, or unknown) or on PyTorch and why."""
        return self._summary  # type: ignore[no-any-return]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__("module"), name)

    def stats(self, reset: bool = False) -> dict[str, dict[str, Any]]:
        """Per layer: workload, where its table came from, the epilogue it fuses, calls, fallbacks by reason and the
        shapes (S) run on the dispatcher and on PyTorch.

        Counted are the calls that reached the layers. A forward run as the model's own calls the original layers
        (kernelfleet.torch_twin), not these, and is counted per input signature instead
        (`forward_decisions()[...]["own_forwards"]`): a signature known to run no uKernel counts its first forward
        here (its fallbacks, by reason, and its PyTorch routes) and none after it; the dispatchers' usage, which
        telemetry reports, likewise (a miss past a table's range: once per signature)."""
        out = {}
        for name, layer in self.layers.items():
            d = layer.dispatcher
            out[name] = {
                "workload": layer.workload,
                "source": getattr(d, "source", "none"),
                "fused": getattr(d, "epilogue", NO_EPILOGUE).describe() if layer._on else "none",
                "max_rows": layer.max_rows,
                **layer.stats.as_dict(),
            }
            if reset:
                layer.stats = LayerStats()
        return out

    def forward_decisions(self) -> dict[str, dict[str, Any]]:
        """Per input signature (the shapes a forward was called with): whether its forwards run uKernels (or are
        known to run none: `no_ukernels`), what the whole-forward check chose ("accelerated" or "eager") on which
        medians, and how many forwards ran as the model's own (`own_forwards`); empty without the check."""
        scope = self._scope
        return scope.decisions() if scope is not None else {}

    def forward_choice(self, *args: Any, **kwargs: Any) -> str | None:
        """The whole-forward check's choice for a forward called like this ("accelerated", "eager": the model's own
        forward, every layer on PyTorch), or None while undecided or without the check."""
        scope = self._scope
        return scope.decision(args, kwargs) if scope is not None else None

    def fallbacks(self) -> int:
        return sum(layer.stats.fallbacks for layer in self.layers.values())

    def close(self) -> None:
        """Stop the telemetry reporter and remove the thread scope's hooks from the module."""
        if self.reporter is not None:
            self.reporter.close()
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


def accelerate(
    module: nn.Module,
    source: DispatchSource | str | os.PathLike[str],
    *,
    workloads: Mapping[str, str] | None = None,
    target: str | None = None,
    inplace: bool = False,
    trusted_key: str | None = None,
    cache_dir: Path | None = None,
    extend_range: bool = False,
    telemetry: bool = True,
    telemetry_interval_s: float = 60.0,
    print_summary: bool = True,
    thread_policy: str = "managed",
    vendor_routes: str = "pytorch",
    check_in_model: bool = True,
    holdout: int = 100,
) -> AcceleratedModule:
    """`module` with its nn.Linear / Conv1D layers running on the fleet's dispatchers (see the module docstring).

    `source`: a `kernelfleet.Client` (tables fetched once, verified, cached; served from the cache when the service
    is down) or a cache directory (offline: verified cached documents only; the key is `trusted_key`,
    $KERNELFLEET_TRUSTED_KEY, or the one key pinned in that cache). `workloads` maps a layer's qualified name to
    the workload hash to use for it (default: the hash of its dense workload, computed here). `target` is the
    target fingerprint (default: the client's one live target of the parameters' device kind, else the one target
    the cache holds tables for: this service's, or any offline). `inplace=False` leaves `module` untouched (a deep
    copy is accelerated). With a client and `telemetry`, a background reporter sends the shapes run every
    `telemetry_interval_s`. `print_summary`: print `summary()` to stderr once (what runs each layer, why PyTorch
    where it does, the speedup expected). `thread_policy`: "managed" runs PyTorch on one thread during a forward
    that runs uKernels (`kernelfleet.torch_forward`); "host" leaves PyTorch's threads as the caller set them.
    `vendor_routes`: "pytorch" runs every S a table gives to a vendor library on PyTorch (the layer's own
    computation), so a forward uses one BLAS and its thread pool besides the uKernels; "table" runs
    the library the table names (numpy where it timed numpy faster in isolation). `check_in_model`: each S a CPU
    table runs on uKernels, or routes to PyTorch where uKernels can run it too (the nearest interval's), is first
    timed against the layer's PyTorch computation inside the model (a few alternating calls) and kept on the
    uKernels only where they are faster there (`stats()[layer]["in_model"]`);
    then, per input shape, the whole forward on the tables is timed against the model's own and the tables keep
    only the shapes where the forward is faster (`forward_decisions()`).
    `holdout`: with telemetry, one call in `holdout` per shape a table serves runs the layer's PyTorch computation
    instead, both timed, so the fleet measures what the tables save against what this host runs without them
    (kernelfleet.holdout; 0: none). A layer without a table holds calls out too (PyTorch on both sides): the
    fleet learns what its hosts run before any table exists, and the measurement's noise floor."""
    if thread_policy not in ("managed", "host"):
        raise ValueError(f"thread_policy must be 'managed' or 'host', got {thread_policy!r}")
    if vendor_routes not in ("pytorch", "table"):
        raise ValueError(f"vendor_routes must be 'pytorch' or 'table', got {vendor_routes!r}")
    root = module if inplace else copy.deepcopy(module)
    snapshot = Snapshot(root) if torch_twin.BUILD_TWIN else None  # the tree as it is, before anything is replaced
    offline = isinstance(source, str | os.PathLike)
    client: Any = None if offline else source
    if offline:
        cache_root = Path(os.fspath(source))  # type: ignore[arg-type]
    else:
        cache_root = cache_dir or getattr(client, "cache_dir", None) or default_cache_dir()
    cache = DispatchCache(cache_root)
    key = _offline_key(cache, trusted_key) if offline else (trusted_key or getattr(client, "trusted_key", None))
    loader: DispatchSource = _Offline(cache_root) if offline else client

    sites = _sites(root)
    explicit = dict(workloads or {})
    device_kind = "cuda" if any(p.is_cuda for p in root.parameters()) else "llvm"
    plans = {
        s.name: [explicit[s.name]]
        if s.name in explicit
        else [
            workload_hash(dense_workload(s.dense.N, s.dense.K, e, table_dtype(s.layer, device_kind)))
            for e in _candidates(s)
        ]
        for s in sites
    }
    if not sites:
        return _finish(AcceleratedModule(root, {}, None), print_summary)
    fingerprint = _resolve_target(target, cache, {h for hs in plans.values() for h in hs}, client, device_kind)

    loaded: dict[str, Dispatcher | CudaDispatcher | None] = {}
    why_not: dict[str, str] = {}  # workload → why its table cannot run a Linear layer

    def dispatcher_for(h: str) -> Dispatcher | CudaDispatcher | None:
        if h not in loaded:
            from kernelfleet.cuda_ukernel import CudaDispatcher, NoCudaDevice

            loaded[h] = None
            try:
                # quiet: no "running numpy" per workload tried (PyTorch runs the layer; said once per layer below)
                d = load_dispatcher(loader, h, fingerprint, cache_root, key, any_service=offline, quiet_fallback=True)
            except NoCudaDevice as exc:  # a CUDA table on a host without a GPU: PyTorch runs the layer
                why_not[h] = str(exc)
                return None
            if not isinstance(d, Dispatcher | CudaDispatcher):  # Linear layers run dense tables only
                why_not[h] = f"its table is a {type(d).__name__.removesuffix('Dispatcher')} table, not a dense one"
            else:
                loaded[h] = d
                if d.table is None:
                    why_not[h] = str(d.meta.get("reason") or "no table")
        return loaded[h]

    layers: dict[str, AcceleratedLinear] = {}
    summaries: list[LayerSummary] = []
    rewrites: dict[str, list[tuple[GatedPair, nn.Module]]] = {}  # parent → its gated pairs' units
    checks: dict[int, InModelCheck] = {}  # id(dispatcher) → the in-model check its layers share
    for site in sites:
        chosen: tuple[str, Dispatcher | CudaDispatcher | None] | None = None
        tried: list[tuple[str, str]] = []  # (workload, why its table does not run this layer)
        for h in plans[site.name]:
            d = dispatcher_for(h)
            if d is None or d.table is None:
                tried.append((h, why_not[h]))
                continue
            table_epilogue = getattr(d, "epilogue", NO_EPILOGUE)
            if not _fits(table_epilogue, site):
                tried.append((h, f"its table computes {table_epilogue.describe()}, which this layer does not"))
                continue
            chosen = (h, d)
            break
        on = chosen is not None
        if chosen is None:  # PyTorch runs it; misses are reported on the most specific workload's table-less dispatcher
            h = plans[site.name][0]
            first = dispatcher_for(h)
            chosen = (
                h,
                first if first is not None and first.table is None else None,
            )  # (not a table for another layer)
        h, d = chosen
        epilogue = getattr(d, "epilogue", NO_EPILOGUE) if on else NO_EPILOGUE
        fused_act = epilogue.activation != "none"  # (CUDA tables fuse nothing: their activation stays in place)
        table = d.table if on and d is not None else None
        max_rows = (1 << 62 if extend_range else table.s_max) if table is not None else 0
        pair = site.pair
        layer = site.layer
        if pair is not None:
            layer = stacked_linear(site.layer, root.get_submodule(pair.up))
        wrapper = AcceleratedLinear(
            site.name,
            layer,
            site.dense,
            d,
            h,
            fused_bias=epilogue.bias,
            activation=site.act if fused_act else None,
            max_rows=max_rows,
        )
        wrapper.numpy_routes_on_pytorch = vendor_routes == "pytorch"
        wrapper.check_in_model = check_in_model
        if isinstance(d, Dispatcher):  # one in-model check per table, pooled over the layers that run it
            wrapper.in_model = checks.setdefault(id(d), wrapper.in_model)
        wrapper.prepare()
        if pair is not None:
            halves = (root.get_submodule(pair.gate), root.get_submodule(pair.up))
            unit = GatedLinearUnit(wrapper, root.get_submodule(pair.activation_module), site.dense.N // 2, halves)
            rewrites.setdefault(pair.gate.rpartition(".")[0], []).append((pair, unit))
        elif fused_act and site.parent is not None and site.act_attr is not None:
            setattr(site.parent, site.act_attr, nn.Identity())
        if site.parent is None:
            root = wrapper
        elif pair is None:
            setattr(site.parent, site.attr, wrapper)
        layers[site.name] = wrapper
        if on:
            assert d is not None
            speedup = expected_speedup(d.meta.get("timed_s"), vendor_on_pytorch=vendor_routes == "pytorch")
            summaries.append(LayerSummary(site.name, h, "tables", d.source, epilogue.describe(), None, speedup))
            log.info("layer %s: the table of workload %s runs it (%s)", site.name, h, d.source)
        else:
            why = _why_pytorch(tried)
            summaries.append(LayerSummary(site.name, h, "pytorch", "none", "none", why))
            log.warning("layer %s runs on PyTorch, not on a tuned table: %s", site.name or "(the module)", why)

    for parent_name in sorted(rewrites, key=lambda n: -n.count(".") - bool(n)):  # the deepest first
        rewritten = rewrite_gated_pairs(root.get_submodule(parent_name), rewrites[parent_name])
        if parent_name:
            owner, _, attr = parent_name.rpartition(".")
            setattr(root.get_submodule(owner), attr, rewritten)
        else:
            root = rewritten

    reporter = None
    if client is not None and telemetry and hasattr(client, "telemetry_reporter"):
        watched = {id(d): d for d in loaded.values() if isinstance(d, Dispatcher)}
        if watched:
            reporter = client.telemetry_reporter(interval_s=telemetry_interval_s)
            for d in watched.values():
                reporter.watch(d)
                if holdout:  # the layers run the baseline themselves: the dispatcher's class stays
                    d.holdout = Holdout(holdout, vendor.TORCH)
            for layer in layers.values():
                if isinstance(layer.dispatcher, Dispatcher) and layer.dispatcher.holdout is not None:
                    layer.hold_out(layer.dispatcher.holdout)
            reporter.start()
    hooks: list[Any] = []
    threads = ""
    on_cpu_tables = any(layer._on and not layer._cuda for layer in layers.values())
    scope: ForwardScope | None = None
    managed = thread_policy == "managed"
    own: OwnForward | None = None
    if on_cpu_tables and (managed or check_in_model) and not isinstance(root, AcceleratedLinear):
        scope = ForwardScope(narrow_threads=managed, check=check_in_model, own_if_no_ukernels=snapshot is not None)
        if snapshot is not None:  # forwards run as the model's own run the original tree (kernelfleet.torch_twin)
            own = torch_twin.install(root, build_twin(snapshot, root), scope)
        hooks = scope.install(root)
        for layer in layers.values():
            layer.forward_scope = scope
    if on_cpu_tables and managed:
        threads = (
            "PyTorch on 1 thread during a forward that runs uKernels, uKernels on the cores (thread_policy='host': off)"
        )
    elif on_cpu_tables:
        threads = f"PyTorch's ops on {torch.get_num_threads()} threads as the caller set them (thread_policy='host')"
    summary = AccelerationSummary(fingerprint, tuple(summaries), threads)
    return _finish(AcceleratedModule(root, layers, reporter, summary, hooks, scope, own), print_summary)


def _finish(fast: AcceleratedModule, print_summary: bool) -> AcceleratedModule:
    if print_summary:  # stderr: stdout may carry the program's own output
        print(fast.summary(), file=sys.stderr)
    return fast
