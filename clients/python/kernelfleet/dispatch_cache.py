"""Fetching a dispatcher from the service, with a disk cache that keeps inference running without it.

`load_dispatcher` revalidates the cached dispatch document with its ETag (a 304 costs no body),
verifies the document's signature (bound to the workload and target asked for) and the sha256 of
every artifact it names, and downloads only artifacts it lacks. When the service cannot answer
(down, store outage, revoked key, rate limit) it uses the cached document, verified again; with
nothing verified cached (or no table published yet, or no TVM on this host) it returns a numpy
fallback dispatcher that counts every call as a miss. A document or artifact that fails verification
raises `UntrustedArtifact`: it is an attack or a misconfiguration, and must not pass silently.

Layout under the cache directory (default `$KERNELFLEET_CACHE_DIR` or `~/.cache/kernelfleet`):
  dispatch/<workload>-<target>-<service>.json   {"etag", "signature", "body"}: the document exactly as signed,
                                                by the service at that URL (<service>: `service_id`)
  dispatch/<workload>-<target>.json             the same, written before the cache was keyed by service (or by
                                                a tool that publishes with no service): whose it is is unknown
  artifacts/<sha256>.so                         libraries, named by content (shared: the hash is the identity)
  keys/<service>.pub                            the pinned signing key of each service
Every name is checked against a hex pattern first, so nothing from the service can leave the directory.

Keyed by service because one cache directory can serve several services (a shared ~/.cache, a staging and a
production fleet) whose tables share workload hashes and even target fingerprints, each signed with its own key.
A client reads and revalidates its own service's entries only; an entry of its own that fails verification
raises (it was altered). An entry of the older, unkeyed layout is read when this service has none cached and
it verifies with the trusted key (then it is this signer's, whoever fetched it); one that does not verify is
another service's and is skipped with a warning, never an error. Offline (`load_dispatcher(any_service=True)`,
`kernelfleet.torch.accelerate` on a cache directory) every entry for the pair is a candidate and the newest one
that verifies with the trusted key is used; an entry of a service that pinned that very key must verify.
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

from kernelfleet.conv_dispatcher import ConvDispatcher
from kernelfleet.dispatch import DispatchTable
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.epilogue import Epilogue
from kernelfleet.errors import KernelFleetError, NotFound
from kernelfleet.models import DispatchDoc
from kernelfleet.signing import UntrustedArtifact, verify_bytes, verify_document
from kernelfleet.tables import BatchMatmulTable, ConvTable, DenseTable, table_from_json

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


def service_id(base_url: str) -> str:
    """The name a service's entries (and its pinned key) carry in the cache: the sha256 of its URL."""
    return hashlib.sha256(base_url.encode()).hexdigest()


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


@dataclass(frozen=True)
class Entry:
    """A cached document's key, read from its file name; `service` None: the unkeyed (older) layout."""

    workload: str
    target: str
    service: str | None


class DispatchCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _doc_path(self, workload: str, target: str, service: str | None) -> Path:
        name = f"{_hex(workload, 'workload')}-{_hex(target, 'target')}"
        if service is not None:
            name += f"-{_hex(service, 'service')}"
        return self.root / "dispatch" / f"{name}.json"

    def entries(self, workload: str | None = None) -> list[Entry]:
        """Every cached document's key, or those of one workload (names that are not the cache's own are passed
        over)."""
        pattern = f"{_hex(workload, 'workload')}-*.json" if workload else "*.json"  # hex: no glob syntax in it
        found = []
        for path in sorted((self.root / "dispatch").glob(pattern)):
            parts = path.stem.split("-")
            if 2 <= len(parts) <= 3 and all(_HEX.match(p) for p in parts):
                found.append(Entry(parts[0], parts[1], parts[2] if len(parts) == 3 else None))
        return found

    def read_doc(self, workload: str, target: str, service: str | None = None) -> CachedDoc | None:
        """The entry of `service` (a `service_id`), or of the unkeyed layout when None."""
        path = self._doc_path(workload, target, service)
        try:
            raw = json.loads(path.read_text())
            return CachedDoc(raw.get("etag"), raw["body"].encode(), raw.get("signature") or "")
        except (OSError, ValueError, KeyError, AttributeError):
            return None  # absent or damaged: as if never cached

    def write_doc(self, workload: str, target: str, doc: CachedDoc, service: str | None = None) -> None:
        """Write the entry of `service` (a `service_id`); None writes the unkeyed layout (a tool that signs and
        publishes tables itself, with no service to name)."""
        record = {"etag": doc.etag, "signature": doc.signature, "body": doc.body.decode()}
        _write_atomic(self._doc_path(workload, target, service), json.dumps(record).encode())

    def drop_doc(self, workload: str, target: str, service: str) -> bool:
        """Remove the entry of `service` (it answered that it serves no table for the pair: one rolled back or
        retired must not be served from here, offline either); whether there was one."""
        path = self._doc_path(workload, target, service)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def artifact_path(self, sha256: str) -> Path:
        return self.root / "artifacts" / f"{_hex(sha256, 'sha256')}.so"

    def put_artifact(self, sha256: str, data: bytes) -> Path:
        path = self.artifact_path(sha256)
        _write_atomic(path, data)
        return path

    def _key_path(self, base_url: str) -> Path:
        return self.root / "keys" / f"{service_id(base_url)}.pub"

    def services_pinning(self, key: str) -> set[str]:
        """The services (`service_id`) whose pinned key is `key`."""
        pinned = {p.stem: self.pinned_key_of(p.stem) for p in (self.root / "keys").glob("*.pub")}
        return {service for service, k in pinned.items() if k == key}

    def pinned_key_of(self, service: str) -> str | None:
        try:
            return (self.root / "keys" / f"{_hex(service, 'service')}.pub").read_text().strip() or None
        except (OSError, ValueError):
            return None  # unreadable, or a name that is not the cache's own

    def pinned_key(self, base_url: str) -> str | None:
        return self.pinned_key_of(service_id(base_url))

    def pin_key(self, base_url: str, key: str) -> None:
        _write_atomic(self._key_path(base_url), key.encode())

    def pinned_key_path(self, base_url: str) -> Path:
        return self._key_path(base_url)


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
    service = service_id(client.base_url)
    # this service's entry only: an ETag of another service's (or an unkeyed) entry could match by chance and
    # make a 304 hand back a document this service never sent
    cached = cache.read_doc(workload, target, service)
    fetched = client.dispatch_raw(workload, target, etag=cached.etag if cached else None)
    current = cached if fetched is None else CachedDoc(fetched[1], fetched[0], fetched[2])
    assert current is not None, "a 304 answers only a request that sent an ETag"
    try:
        doc = verified_doc(current, workload, target, resolve_trusted_key(client, cache, trusted_key))
    except UntrustedArtifact as exc:
        if trusted_key or fetched is None:
            raise
        # the key pinned when this host first fetched from the service: a service redeployed with a new key at the
        # same URL looks like this too, and only the user can tell the two apart
        path = cache.pinned_key_path(client.base_url)
        raise UntrustedArtifact(
            f"{exc}: the key pinned for {client.base_url} ({path}) when this host first fetched from it; if the "
            f"service was redeployed with a new signing key on purpose, delete {path} to trust its new key"
        ) from exc
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        if path.exists():
            continue
        data = client.artifact(u.sha256)
        verify_bytes(data, u.sha256)
        cache.put_artifact(u.sha256, data)
    if fetched is not None:
        cache.write_doc(workload, target, current, service)  # after its artifacts: a cached doc is always complete
    return doc


def cached_doc(cache: DispatchCache, workload: str, target: str, key: str, service: str | None) -> DispatchDoc | None:
    """The cached document for `workload` on `target` that verifies with `key`, or None.

    `service` (a `service_id`): its own entry if cached (one that fails verification raises UntrustedArtifact: it
    was written for this service, so it was altered), else the unkeyed entry if it verifies. None (offline): the
    newest of all entries for the pair that verify; one of a service that pinned `key` must verify. Any other entry
    that does not verify is another service's: skipped, with a warning."""
    if service is not None:
        own = cache.read_doc(workload, target, service)
        if own is not None:
            return verified_doc(own, workload, target, key)
        candidates: dict[str | None, CachedDoc | None] = {None: cache.read_doc(workload, target)}
        must_verify: set[str] = set()
    else:
        pairs = (e.service for e in cache.entries(workload) if e.target == target)
        candidates = {s: cache.read_doc(workload, target, s) for s in pairs}
        must_verify = cache.services_pinning(key)
    verified = []
    for owner, cached in candidates.items():
        if cached is None:
            continue
        try:
            verified.append(verified_doc(cached, workload, target, key))
        except UntrustedArtifact:
            if owner in must_verify:
                raise
            log.warning(
                "skipping the cached table of %s on %s from %s: it does not verify with the trusted key "
                "(another service's table, or altered)",
                workload,
                target,
                f"service {owner[:12]}" if owner else "the unkeyed cache layout",
            )
    return max(verified, key=lambda d: d.created_at, default=None)


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


def _timings(doc: DispatchDoc) -> dict[str, Any]:
    """The job's per-S timings of its program and the vendor libraries (validation.vendor_routes.timed_s), kept in
    the dispatcher's meta by reference (no copy) so what the table is expected to buy can be told to the user
    (kernelfleet.accelerate_summary); nothing when the document has none."""
    routes = doc.validation.get("vendor_routes")
    timed = routes.get("timed_s") if isinstance(routes, dict) else None
    return {"timed_s": timed} if isinstance(timed, dict) and timed else {}


class DispatcherLoader(Protocol):
    """Builds a table family's dispatcher from a verified document and its table (the family's
    kernelfleet.tables variant), loading each uKernel from the cache with `verified_artifact`."""

    def __call__(
        self, doc: DispatchDoc, table: Any, cache: DispatchCache, source: str, epilogue: Epilogue | None
    ) -> Any: ...


_LOADERS: dict[str, DispatcherLoader] = {}


def register_loader(kind: str, loader: DispatcherLoader) -> None:
    """Load tables of `kind` (a kernelfleet.tables variant's tag) with `loader`."""
    known = _LOADERS.get(kind)
    if known is not None and known is not loader:
        raise ValueError(f"tables of kind {kind!r} already load with {known!r}")
    _LOADERS[kind] = loader


def verified_artifact(cache: DispatchCache, sha256: str) -> Path:
    """The cached library with this sha256, once its bytes hash to it."""
    path = cache.artifact_path(sha256)
    verify_bytes(path.read_bytes(), sha256)
    return path


def dispatcher_from_doc(
    doc: DispatchDoc, cache: DispatchCache, source: str, epilogue: Epilogue | None = None
) -> Dispatcher | CudaDispatcher | BmmDispatcher | ConvDispatcher:
    """Load a verified document's uKernels from the cache, checking each library's hash before loading it, into
    the dispatcher its table's family loads with (`register_loader`). `epilogue`, when given, must be the table's
    (the layer the caller runs is the layer that was tuned)."""
    table = table_from_json(doc.table)
    loader = _LOADERS.get(table.kind)
    if loader is None:
        raise ValueError(f"this SDK reads {table.kind} tables but cannot load them into a dispatcher")
    dispatcher: Dispatcher | CudaDispatcher | BmmDispatcher | ConvDispatcher = loader(
        doc, table, cache, source, epilogue
    )
    return dispatcher


def _meta(doc: DispatchDoc) -> dict[str, Any]:
    return {
        "workload_hash": doc.workload_hash,
        "target_fingerprint": doc.target_fingerprint,
        "dim": doc.dim,
        "job_id": doc.job_id,
        **_timings(doc),
    }


def _dense_dispatcher(
    doc: DispatchDoc, table: DispatchTable, cache: DispatchCache, source: str, epilogue: Epilogue | None
) -> Dispatcher | CudaDispatcher:
    """A dense table's dispatcher: on CUDA uKernels when its uKernels are CUDA ones (the table itself is the same
    on both platforms), else on CPU uKernels."""
    from kernelfleet.cuda_ukernel import is_cuda_spec

    if doc.ukernels and is_cuda_spec(doc.ukernels[0].spec):
        return _cuda_dispatcher(doc, table, cache, source)
    from kernelfleet.ukernel import UKernelSpec, load_ukernel

    kernels = {
        u.id: load_ukernel(verified_artifact(cache, u.sha256), UKernelSpec.from_dict(u.spec)) for u in doc.ukernels
    }
    spec = next(iter(kernels.values())).spec if kernels else None  # None: every S routed to the vendor
    return Dispatcher(
        table,
        kernels,
        N=spec.N if spec else None,
        K=spec.K if spec else None,
        exact={o.S: _LazyKernel(o.config) for o in doc.overrides},
        source=source,
        epilogue=epilogue,
        meta=_meta(doc),
    )


def _load_dense(
    doc: DispatchDoc, table: DenseTable, cache: DispatchCache, source: str, epilogue: Epilogue | None
) -> Dispatcher | CudaDispatcher:
    return _dense_dispatcher(doc, table.table, cache, source, epilogue)


def _load_conv(
    doc: DispatchDoc, table: ConvTable, cache: DispatchCache, source: str, epilogue: Epilogue | None
) -> ConvDispatcher:
    """A conv2d layer as an implicit GEMM over M = N·OH·OW: the dense dispatcher behind the layer's geometry."""
    dense = _dense_dispatcher(doc, table.table, cache, source, epilogue)
    assert isinstance(dense, Dispatcher), "conv2d tables are published for CPU targets only"
    return ConvDispatcher(dense, table.geometry)


def _load_batch_matmul(
    doc: DispatchDoc, table: BatchMatmulTable, cache: DispatchCache, source: str, epilogue: Epilogue | None
) -> BmmDispatcher:
    """A batch_matmul tuple table's dispatcher (kernelfleet.bmm_dispatcher)."""
    from kernelfleet.bmm_dispatcher import BmmDispatcher
    from kernelfleet.bmm_ukernel import BmmSpec, load_bmm_ukernel

    kernels = {
        u.id: load_bmm_ukernel(verified_artifact(cache, u.sha256), BmmSpec.from_dict(u.spec)) for u in doc.ukernels
    }
    return BmmDispatcher(table.table, kernels, dict(table.static), source)


def _cuda_dispatcher(doc: DispatchDoc, table: DispatchTable, cache: DispatchCache, source: str) -> CudaDispatcher:
    """A CUDA table's dispatcher: device tensors in and out. Raises NoCudaDevice on a host without a GPU
    (a CUDA table is for GPU inference hosts; there is no CPU fallback that would honour it)."""
    from kernelfleet.cuda_ukernel import CudaDispatcher, CudaUKernelSpec, load_cuda_ukernel, require_cuda

    require_cuda()
    kernels = {
        u.id: load_cuda_ukernel(verified_artifact(cache, u.sha256), CudaUKernelSpec.from_dict(u.spec))
        for u in doc.ukernels
    }
    spec = next(iter(kernels.values())).spec
    return CudaDispatcher(table, kernels, N=spec.N, K=spec.K, source=source, meta=_meta(doc))


register_loader(DenseTable.kind, _load_dense)
register_loader(ConvTable.kind, _load_conv)
register_loader(BatchMatmulTable.kind, _load_batch_matmul)


# What a service that cannot answer looks like to the SDK: unreachable, 503, a revoked key (401/403), a
# rate limit, a malformed answer. None of them may stop inference when a verified table is cached.
_UNANSWERED = (KernelFleetError, httpx.HTTPError, OSError, ValueError)


def _no_table(
    workload: str, target: str, reason: str, meta: dict[str, Any], epilogue: Epilogue | None, level: int
) -> Dispatcher:
    """The numpy fallback where no table loads, `reason` in its meta."""
    log.log(level, "no dispatch table for %s on %s (%s): running numpy", workload, target, reason)
    return Dispatcher(None, {}, N=None, K=None, source="fallback", meta={**meta, "reason": reason}, epilogue=epilogue)


def load_dispatcher(
    client: DispatchSource,
    workload: str,
    target: str,
    cache_dir: Path | None = None,
    trusted_key: str | None = None,
    epilogue: Epilogue | None = None,
    *,
    any_service: bool = False,
    quiet_fallback: bool = False,
) -> Dispatcher | CudaDispatcher | BmmDispatcher | ConvDispatcher:
    """The dispatcher for `workload` on `target` (see Client.dispatcher). `epilogue` is the layer's bias and
    activation: the numpy fallback (no table) needs it to compute the layer; a table carries its own, and one
    that differs from `epilogue` is an error.

    `any_service`: a source that is no service (offline) reads every service's cached entries (cached_doc).
    `quiet_fallback`: the caller runs something else than numpy where no table loads and says so itself
    (kernelfleet.torch.accelerate: PyTorch, per layer), so the numpy fallback is logged at debug only; its
    `meta["reason"]` says why there is no table either way."""
    cache = DispatchCache(cache_dir or default_cache_dir())
    meta = {"workload_hash": _hex(workload, "workload"), "target_fingerprint": _hex(target, "target"), "dim": "M"}
    level = logging.DEBUG if quiet_fallback else logging.WARNING
    try:
        doc = _fetch(client, cache, workload, target, trusted_key)
        source = "service"
    except UntrustedArtifact:
        raise
    except NotFound as exc:  # the service answered: it serves no table for the pair (none yet, rolled back, retired)
        if not any_service and cache.drop_doc(workload, target, service_id(client.base_url)):
            log.warning("%s: dropped the cached dispatch table the service no longer serves", exc)
        return _no_table(workload, target, str(exc), meta, epilogue, level)
    except _UNANSWERED as exc:
        key = trusted_key or cache.pinned_key(client.base_url)
        service = None if any_service else service_id(client.base_url)
        found = cached_doc(cache, workload, target, key, service) if key else None
        if found is None:
            reason = f"{exc}; no verified table cached" if key else f"{exc}; no trusted key to verify a cached table"
            return _no_table(workload, target, reason, meta, epilogue, level)
        cached_level = logging.INFO if any_service else logging.WARNING  # offline, reading the cache is the point
        log.log(cached_level, "the service did not answer (%s): using the cached dispatch table", exc)
        doc, source = found, "cache"
    try:
        return dispatcher_from_doc(doc, cache, source, epilogue)
    except UntrustedArtifact:
        raise
    except (ImportError, OSError) as exc:  # no TVM runtime here, or an artifact missing from the cache
        log.log(level, "cannot load uKernels (%s): running numpy", exc)
        reason = f"cannot load uKernels: {exc}"
        return Dispatcher(
            None, {}, N=None, K=None, source="fallback", meta={**meta, "reason": reason}, epilogue=epilogue
        )
