"""Fetching a dispatcher from the service, with a disk cache that keeps inference running without it.

`load_dispatcher` revalidates the cached dispatch document with its ETag (a 304 costs no body),
verifies the document's signature (bound to the workload and target asked for) and the sha256 of
every artifact it names, and downloads only artifacts it lacks. When the service cannot answer
(down, store outage, revoked key, rate limit) it uses the cached document, verified again; with
nothing verified cached (or no table published yet, or no TVM on this host) it returns a numpy
fallback dispatcher that counts every call as a miss. A document or artifact that fails verification
raises `UntrustedArtifact`: it is an attack or a misconfiguration, and must not pass silently.

Layout under the cache directory (default `$KERNELFLEET_CACHE_DIR` or `~/.cache/kernelfleet`):
  dispatch/<workload>-<target>.json   {"etag", "signature", "body"}: the document exactly as signed
  artifacts/<sha256>.so               libraries, named by content
  keys/<sha256 of service URL>.pub    the pinned signing key of each service
Every name is checked against a hex pattern first, so nothing from the service can leave the directory.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import numpy as np

from kernelfleet.conv_dispatcher import TABLE_KEY as CONV_KEY
from kernelfleet.conv_dispatcher import ConvDispatcher, ConvGeometry
from kernelfleet.dispatch import DispatchTable
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from kernelfleet.errors import KernelFleetError
from kernelfleet.models import DispatchDoc
from kernelfleet.signing import UntrustedArtifact, verify_bytes, verify_document
from kernelfleet.tuple_dispatch import FORMAT as TUPLE_FORMAT

if TYPE_CHECKING:
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.cuda_ukernel import CudaDispatcher

log = logging.getLogger(__name__)
_HEX = re.compile(r"^[0-9a-f]{1,64}$")


class DispatchSource(Protocol):
    """What loading a dispatcher needs from the service (kernelfleet.client.Client is one): the cache is used by
    the client, never the reverse."""

    base_url: str

    def dispatch_raw(self, workload: str, target: str, etag: str | None = None) -> tuple[bytes, str | None, str] | None:
        """(body, ETag, signature) of the newest dispatch document; None when `etag` is still current."""

    def artifact(self, sha256: str) -> bytes:
        """An artifact's bytes, unverified."""

    def signing_key(self) -> str:
        """The service's public key (base64) that signs dispatch documents."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("KERNELFLEET_CACHE_DIR") or Path.home() / ".cache" / "kernelfleet")


def _hex(name: str, what: str) -> str:
    if not _HEX.match(name):
        raise ValueError(f"{what} must be lowercase hex (at most 64 digits), got {name!r}")
    return name


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class CachedDoc:
    etag: str | None
    body: bytes
    signature: str


class DispatchCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _doc_path(self, workload: str, target: str) -> Path:
        return self.root / "dispatch" / f"{_hex(workload, 'workload')}-{_hex(target, 'target')}.json"

    def read_doc(self, workload: str, target: str) -> CachedDoc | None:
        path = self._doc_path(workload, target)
        try:
            raw = json.loads(path.read_text())
            return CachedDoc(raw.get("etag"), raw["body"].encode(), raw.get("signature") or "")
        except (OSError, ValueError, KeyError, AttributeError):
            return None  # absent or damaged: as if never cached

    def write_doc(self, workload: str, target: str, doc: CachedDoc) -> None:
        record = {"etag": doc.etag, "signature": doc.signature, "body": doc.body.decode()}
        _write_atomic(self._doc_path(workload, target), json.dumps(record).encode())

    def artifact_path(self, sha256: str) -> Path:
        return self.root / "artifacts" / f"{_hex(sha256, 'sha256')}.so"

    def put_artifact(self, sha256: str, data: bytes) -> Path:
        path = self.artifact_path(sha256)
        _write_atomic(path, data)
        return path

    def _key_path(self, base_url: str) -> Path:
        return self.root / "keys" / f"{hashlib.sha256(base_url.encode()).hexdigest()}.pub"

    def pinned_key(self, base_url: str) -> str | None:
        try:
            return self._key_path(base_url).read_text().strip() or None
        except OSError:
            return None

    def pin_key(self, base_url: str, key: str) -> None:
        _write_atomic(self._key_path(base_url), key.encode())


def resolve_trusted_key(client: DispatchSource, cache: DispatchCache, explicit: str | None) -> str:
    """The explicit key, else the key pinned for this service, else the service's key (then pinned)."""
    if explicit:
        return explicit
    pinned = cache.pinned_key(client.base_url)
    if pinned:
        return pinned
    key = client.signing_key()
    cache.pin_key(client.base_url, key)
    return key


def verified_doc(cached: CachedDoc, workload: str, target: str, key: str) -> DispatchDoc:
    """The document, once its signature verifies for exactly this workload and target."""
    verify_document(cached.body, workload, target, cached.signature, key)
    doc = DispatchDoc.model_validate_json(cached.body)
    if (doc.workload_hash, doc.target_fingerprint) != (workload, target):
        raise UntrustedArtifact(f"a document for {doc.workload_hash} on {doc.target_fingerprint} answered {workload}")
    return doc


def _fetch(
    client: DispatchSource, cache: DispatchCache, workload: str, target: str, trusted_key: str | None
) -> DispatchDoc:
    """The current document, verified, with every artifact on disk and verified; raises when the service
    cannot answer."""
    cached = cache.read_doc(workload, target)
    fetched = client.dispatch_raw(workload, target, etag=cached.etag if cached else None)
    current = cached if fetched is None else CachedDoc(fetched[1], fetched[0], fetched[2])
    assert current is not None, "a 304 answers only a request that sent an ETag"
    doc = verified_doc(current, workload, target, resolve_trusted_key(client, cache, trusted_key))
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        if path.exists():
            continue
        data = client.artifact(u.sha256)
        verify_bytes(data, u.sha256)
        cache.put_artifact(u.sha256, data)
    if fetched is not None:
        cache.write_doc(workload, target, current)  # after its artifacts, so a cached doc is always complete
    return doc


class _LazyKernel:
    """An exact-shape kernel built from its (signed) config on first use: building compiles, ~1 s. A build
    that fails raises, and the dispatcher then drops the override and runs the table's program."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._kernel: Callable[..., np.ndarray] | None = None
        self._lock = threading.Lock()

    def __call__(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self._kernel is None:
            with self._lock:
                if self._kernel is None:
                    from kernelfleet.tvm_kernel import build_kernel

                    self._kernel = build_kernel(self.config)
        return self._kernel(x, w)


def dispatcher_from_doc(
    doc: DispatchDoc, cache: DispatchCache, source: str, epilogue: Epilogue | None = None
) -> Dispatcher | CudaDispatcher | BmmDispatcher | ConvDispatcher:
    """Load a verified document's uKernels from the cache, checking each library's hash before loading it.
    `epilogue`, when given, must be the table's (the layer the caller runs is the layer that was tuned)."""
    from kernelfleet.cuda_ukernel import is_cuda_spec

    if doc.table.get("format") == TUPLE_FORMAT:  # batch_matmul over several dynamic dims
        return bmm_dispatcher_from_doc(doc, cache, source)
    if doc.ukernels and is_cuda_spec(doc.ukernels[0].spec):
        return cuda_dispatcher_from_doc(doc, cache, source)
    from kernelfleet.ukernel import UKernelSpec, load_ukernel

    kernels = {}
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        verify_bytes(path.read_bytes(), u.sha256)
        kernels[u.id] = load_ukernel(path, UKernelSpec.from_dict(u.spec))
    spec = next(iter(kernels.values())).spec if kernels else None  # None: every S routed to the vendor
    dense = Dispatcher(
        DispatchTable.from_dict(doc.table),
        kernels,
        N=spec.N if spec else None,
        K=spec.K if spec else None,
        exact={o.S: _LazyKernel(o.config) for o in doc.overrides},
        source=source,
        epilogue=epilogue,
        meta={
            "workload_hash": doc.workload_hash,
            "target_fingerprint": doc.target_fingerprint,
            "dim": doc.dim,
            "job_id": doc.job_id,
        },
    )
    if CONV_KEY in doc.table:  # a conv2d layer as an implicit GEMM over M = N·OH·OW
        return ConvDispatcher(dense, ConvGeometry.from_dict(doc.table[CONV_KEY]))
    return dense


def bmm_dispatcher_from_doc(doc: DispatchDoc, cache: DispatchCache, source: str) -> BmmDispatcher:
    """A batch_matmul tuple table's dispatcher (kernelfleet.bmm_dispatcher), each library's hash checked first."""
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.bmm_ukernel import BmmSpec, load_bmm_ukernel
    from kernelfleet.tuple_dispatch import TupleDispatchTable

    kernels = {}
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        verify_bytes(path.read_bytes(), u.sha256)
        kernels[u.id] = load_bmm_ukernel(path, BmmSpec.from_dict(u.spec))
    static = {str(d): int(v) for d, v in doc.table.get("static", {}).items()}
    return BmmDispatcher(TupleDispatchTable.from_dict(doc.table), kernels, static, source)


def cuda_dispatcher_from_doc(doc: DispatchDoc, cache: DispatchCache, source: str) -> CudaDispatcher:
    """A CUDA table's dispatcher: device tensors in and out. Raises NoCudaDevice on a host without a GPU
    (a CUDA table is for GPU inference hosts; there is no CPU fallback that would honour it)."""
    from kernelfleet.cuda_ukernel import CudaDispatcher, CudaUKernelSpec, load_cuda_ukernel, require_cuda

    require_cuda()
    kernels = {}
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        verify_bytes(path.read_bytes(), u.sha256)
        kernels[u.id] = load_cuda_ukernel(path, CudaUKernelSpec.from_dict(u.spec))
    spec = next(iter(kernels.values())).spec
    meta = {
        "workload_hash": doc.workload_hash,
        "target_fingerprint": doc.target_fingerprint,
        "dim": doc.dim,
        "job_id": doc.job_id,
    }
    return CudaDispatcher(
        DispatchTable.from_dict(doc.table),
        kernels,
        N=spec.N,
        K=spec.K,
        source=source,
        meta=meta,
    )


# What a service that cannot answer looks like to the SDK: unreachable, 503, a revoked key (401/403), a
# rate limit, a malformed answer. None of them may stop inference when a verified table is cached.
_UNANSWERED = (KernelFleetError, httpx.HTTPError, OSError, ValueError)


def load_dispatcher(
    client: DispatchSource,
    workload: str,
    target: str,
    cache_dir: Path | None = None,
    trusted_key: str | None = None,
    epilogue: Epilogue | None = None,
) -> Dispatcher | CudaDispatcher | BmmDispatcher | ConvDispatcher:
    """The dispatcher for `workload` on `target` (see Client.dispatcher). `epilogue` is the layer's bias and
    activation: the numpy fallback (no table) needs it to compute the layer; a table carries its own, and one
    that differs from `epilogue` is an error."""
    cache = DispatchCache(cache_dir or default_cache_dir())
    meta = {"workload_hash": _hex(workload, "workload"), "target_fingerprint": _hex(target, "target"), "dim": "M"}
    try:
        doc = _fetch(client, cache, workload, target, trusted_key)
        source = "service"
    except UntrustedArtifact:
        raise
    except _UNANSWERED as exc:
        cached = cache.read_doc(workload, target)
        key = trusted_key or cache.pinned_key(client.base_url)
        if cached is None or key is None:
            log.warning("no dispatch table for %s on %s (%s): running numpy", workload, target, exc)
            return Dispatcher(
                None, {}, N=None, K=None, source="fallback", meta={**meta, "reason": str(exc)}, epilogue=epilogue
            )
        log.warning("the service did not answer (%s): using the cached dispatch table", exc)
        doc, source = verified_doc(cached, workload, target, key), "cache"
    try:
        return dispatcher_from_doc(doc, cache, source, epilogue)
    except UntrustedArtifact:
        raise
    except (ImportError, OSError) as exc:  # no TVM runtime here, or an artifact missing from the cache
        log.warning("cannot load uKernels (%s): running numpy", exc)
        return Dispatcher(
            None, {}, N=None, K=None, source="fallback", meta={**meta, "reason": str(exc)}, epilogue=epilogue
        )
