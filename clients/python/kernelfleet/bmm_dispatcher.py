"""Batch matmul on inference hosts: C[B,M,N] = A[B,M,K]·Bt[B,N,K]ᵀ (the operator's layout: Bt holds the right
operand transposed, e.g. K for QKᵀ, Vᵀ for A·V), any tuple of the workload's symbolic dims, no network per call.

A `BmmDispatcher` reads the tuple of symbolic dims off the arrays, looks it up in its TupleDispatchTable (one
bisect per dim) and runs the uKernel the table names, or the vendor library the table routes the tuple's class to
(numpy's `np.matmul(a, bt.transpose(0, 2, 1))` or PyTorch's bmm: kernelfleet.vendor). The route is the one for
the layout Bt comes in (`bt_layout`, read off its strides on every call): the libraries rank differently on a
contiguous Bt and on a transposed view, so the job routes each layout on its own timings. A tuple outside the
tuned box or in a hole runs numpy and is counted as a miss; with no table (nothing verified, or no TVM runtime)
every call is a fallback. Nothing in a document is loaded before its signature verifies.

The signed document is canonical JSON: {"format": "bmm-dispatch-v1", "workload_dims": the static dims,
"table": the tuple table, "artifacts": {uKernel id: {"sha256", "spec"}}}. The service signs it with the
same message as a dense dispatch document (kernelfleet.signing.document_message over workload, target and
the body's sha256); `load_bmm_dispatcher` verifies the signature and every library's sha256 before loading.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kernelfleet import vendor
from kernelfleet.bmm_ukernel import BMM_DIMS, BmmSpec, BmmUKernel
from kernelfleet.signing import verify_bytes, verify_document
from kernelfleet.tuple_dispatch import TupleDispatchTable

DOCUMENT_FORMAT = "bmm-dispatch-v1"
MEMO_SIZE = 4096  # (A shape, Bt shape) → program per layout, remembered per dispatcher; cleared when full

# How a host holds Bt[B,N,K]: contiguous ("BNK", e.g. K[B,T,d] in QKᵀ), or as the transposed view of a contiguous
# [B,K,N] ("BKN", e.g. V[B,T,d] in A·V). A table's `cells` are BNK's (the operator's own layout; any other strides
# run them too) and its `layouts[BKN]` BKN's where they differ; tables from before either had one route for both.
BNK, BKN = "BNK", "BKN"
BT_LAYOUTS = (BNK, BKN)


def bt_layout(bt: np.ndarray) -> str:
    """BKN where Bt's N axis is packed tighter than its K axis (the transposed view of a [B,K,N] array), else BNK."""
    strides = bt.strides
    return BKN if strides[1] < strides[2] else BNK


# The vendor path: numpy's batched matmul, as a host without uKernels computes it (one implementation, in vendor).
bmm_reference = vendor.numpy_bmm


class BmmDispatcher:
    def __init__(
        self,
        table: TupleDispatchTable | None,
        kernels: Mapping[str, BmmUKernel] | None = None,
        static: Mapping[str, int] | None = None,
        source: str = "fallback",
    ) -> None:
        self.table = table
        self.source = source  # where the table came from: "service", "cache", or "fallback" (no table: numpy)
        self.kernels = dict(kernels or {})
        self.static = dict(static or {})  # the workload's static dims: a call with other sizes is refused
        if table is not None:
            missing = table.ukernel_ids() - set(self.kernels)
            if missing:
                raise ValueError(f"the table names uKernels it was not given: {sorted(missing)}")
        self._static_at = tuple((BMM_DIMS.index(d), v) for d, v in self.static.items())
        dims = table.dims if table is not None else ()
        self._symbolic_at = tuple(BMM_DIMS.index(d) for d in dims)
        # the program for BNK and for BKN, indexed by `strides[1] < strides[2]` (bt_layout's test, inlined per call)
        self._memo: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[str | None, str | None]] = {}
        self.calls = 0
        # calls per uKernel id, vendor route, or None (a miss)
        routes = [vendor.route_of(lib) for lib in vendor.LIBRARIES]
        self.by_program: dict[str | None, int] = dict.fromkeys([*self.kernels, *routes, None], 0)
        # what runs each program, resolved once: a call adds a dict lookup, not a route parse (numpy's calls at
        # small T take 3 µs, so every µs of the dispatcher's own shows)
        self._libraries: dict[str | None, Callable[..., np.ndarray]] = {None: bmm_reference}
        for route in table.routes() if table is not None else ():
            lib = vendor.library_of(route)
            if lib is not None:  # PyTorch where the table routes to it and this host has it, else numpy
                on = vendor.runnable(lib)
                self._libraries[route] = bmm_reference if on == vendor.NUMPY else functools.partial(vendor.bmm, on)

    @property
    def fallback(self) -> bool:
        return self.table is None

    def _sizes(self, a: np.ndarray, bt: np.ndarray) -> tuple[int, int, int, int]:
        if a.ndim != 3 or bt.ndim != 3 or a.shape[0] != bt.shape[0] or a.shape[2] != bt.shape[2]:
            raise ValueError(f"need A[B,M,K] and Bt[B,N,K]; got {list(a.shape)} and {list(bt.shape)}")
        sizes = (a.shape[0], a.shape[1], bt.shape[1], a.shape[2])
        for i, size in self._static_at:
            if sizes[i] != size:
                raise ValueError(f"this workload has {BMM_DIMS[i]}={size}, got {sizes[i]}")
        return sizes

    def program(self, shape: Mapping[str, int], layout: str = BNK) -> str | None:
        """The uKernel id, a vendor route, or None (numpy as a miss) for a full shape {B, M, N, K} with Bt in
        `layout` (BT_LAYOUTS)."""
        return None if self.table is None else self.table.lookup_shape(shape, layout)

    def __call__(self, a: np.ndarray, bt: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        try:
            programs = self._memo[(a.shape, bt.shape)]  # shapes seen before: checked and looked up already
        except KeyError:
            programs = self._first_sight(a, bt)
        strides = bt.strides  # the layout, per call: the same shapes may come in either
        uid = programs[strides[1] < strides[2]]
        self.calls += 1
        self.by_program[uid] += 1
        library = self._libraries.get(uid)
        if library is not None:
            return library(a, bt, out)
        if a.dtype != np.float32 or bt.dtype != np.float32:
            return bmm_reference(a, bt, out)
        assert uid is not None  # a uKernel id: every other program is in _libraries
        return self.kernels[uid](a, bt, out)

    def _first_sight(self, a: np.ndarray, bt: np.ndarray) -> tuple[str | None, str | None]:
        sizes = self._sizes(a, bt)
        values = tuple(sizes[i] for i in self._symbolic_at)
        table = self.table
        programs = (None, None) if table is None else (table.lookup(values, BNK), table.lookup(values, BKN))
        if len(self._memo) >= MEMO_SIZE:
            self._memo.clear()
        self._memo[(a.shape, bt.shape)] = programs
        return programs

    @property
    def misses(self) -> int:
        """Calls out of the box, in a hole, or with no table at all: numpy, not the table's choice."""
        return self.by_program[None]

    @property
    def vendor_calls(self) -> int:
        """Calls the table routed to a vendor library (its choice, not a miss)."""
        return sum(self.by_program[vendor.route_of(lib)] for lib in vendor.LIBRARIES)


def bmm_document(
    table: TupleDispatchTable, artifacts: Mapping[str, tuple[str, BmmSpec]], static: Mapping[str, int]
) -> bytes:
    """The canonical bytes the service signs: `artifacts` maps each uKernel id to (sha256, spec)."""
    doc = {
        "format": DOCUMENT_FORMAT,
        "workload_dims": dict(sorted(static.items())),
        "table": table.to_dict(),
        "artifacts": {uid: {"sha256": sha, "spec": spec.to_dict()} for uid, (sha, spec) in sorted(artifacts.items())},
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def load_bmm_dispatcher(
    body: bytes | None,
    *,
    workload: str,
    target: str,
    signature: str | None,
    public_key: str,
    artifact_dir: Path,
    static: Mapping[str, int] | None = None,
) -> BmmDispatcher:
    """A dispatcher from a signed document and the libraries it names (`artifact_dir/<sha256>.so`), all
    local: nothing is fetched. No document gives the numpy fallback (`static` then checks the dims);
    a document that fails verification raises UntrustedArtifact and loads nothing; a host without TVM's
    runtime gets the fallback too."""
    if body is None:
        return BmmDispatcher(None, static=static)
    verify_document(body, workload, target, signature, public_key)
    doc: dict[str, Any] = json.loads(body)
    if doc.get("format") != DOCUMENT_FORMAT:
        raise ValueError(f"not a {DOCUMENT_FORMAT} document: {doc.get('format')!r}")
    table = TupleDispatchTable.from_dict(doc["table"])
    dims = {str(k): int(v) for k, v in doc["workload_dims"].items()}
    try:
        from kernelfleet.bmm_ukernel import load_bmm_ukernel
        from kernelfleet.tvm_runtime import import_tvm

        import_tvm()
    except ImportError:
        return BmmDispatcher(None, static=dims)
    kernels = {}
    for uid, entry in doc["artifacts"].items():
        path = artifact_dir / f"{entry['sha256']}.so"
        verify_bytes(path.read_bytes(), entry["sha256"])
        kernels[uid] = load_bmm_ukernel(path, BmmSpec.from_dict(entry["spec"]))
    return BmmDispatcher(table, kernels, dims)
