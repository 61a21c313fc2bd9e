"""Fetching a dispatcher from the service, with a disk cache that keeps inference running without it.

`load_dispatcher` revalidates the cached dispatch document with its ETag (a 304 costs no body),
downloads only artifacts it lacks, and checks every artifact's sha256 and signature before loading
it. When the service is unreachable it uses the cached document and artifacts; with nothing cached
(or no table published yet, or no TVM on this host) it returns a numpy fallback dispatcher that
counts every call as a miss.

Layout under the cache directory (default `$KERNELFLEET_CACHE_DIR` or `~/.cache/kernelfleet`):
  dispatch/<workload>-<target>.json   {"etag": ..., "doc": DispatchDoc}
  artifacts/<sha256>.so               verified libraries, named by content
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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kernelfleet.dispatch import DispatchTable
from kernelfleet.dispatcher import Dispatcher
from kernelfleet.errors import NotFound, ServiceUnavailable
from kernelfleet.models import DispatchDoc
from kernelfleet.signing import UntrustedArtifact, verify_artifact

if TYPE_CHECKING:
    from kernelfleet.client import Client

log = logging.getLogger(__name__)
_HEX = re.compile(r"^[0-9a-f]{1,64}$")


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


class DispatchCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _doc_path(self, workload: str, target: str) -> Path:
        return self.root / "dispatch" / f"{_hex(workload, 'workload')}-{_hex(target, 'target')}.json"

    def read_doc(self, workload: str, target: str) -> tuple[str | None, DispatchDoc] | None:
        path = self._doc_path(workload, target)
        try:
            raw = json.loads(path.read_text())
            return raw.get("etag"), DispatchDoc.model_validate(raw["doc"])
        except (OSError, ValueError, KeyError):
            return None  # absent or damaged: as if never cached

    def write_doc(self, workload: str, target: str, etag: str | None, doc: DispatchDoc) -> None:
        body = json.dumps({"etag": etag, "doc": doc.model_dump(mode="json")}).encode()
        _write_atomic(self._doc_path(workload, target), body)

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


def _trusted_key(client: Client, cache: DispatchCache, explicit: str | None) -> str:
    """The explicit key, else the key pinned for this service, else the service's key (then pinned)."""
    if explicit:
        return explicit
    pinned = cache.pinned_key(client.base_url)
    if pinned:
        return pinned
    key = client.signing_key()
    cache.pin_key(client.base_url, key)
    return key


def _fetch(client: Client, cache: DispatchCache, workload: str, target: str, trusted_key: str | None) -> DispatchDoc:
    """The current document with every artifact on disk and verified; raises when the service cannot answer."""
    cached = cache.read_doc(workload, target)
    fetched = client.dispatch_doc(workload, target, etag=cached[0] if cached else None)
    if fetched is None:
        assert cached is not None, "a 304 answers only a request that sent an ETag"
        doc = cached[1]
    else:
        doc, etag = fetched
    key = _trusted_key(client, cache, trusted_key)
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        if path.exists():
            continue
        data = client.artifact(u.sha256)
        verify_artifact(data, u.sha256, doc.target_fingerprint, u.signature, key)
        cache.put_artifact(u.sha256, data)
    if fetched is not None:
        cache.write_doc(workload, target, etag, doc)  # after its artifacts, so a cached doc is always complete
    return doc


class _LazyKernel:
    """An exact-shape kernel built from its config on first use (building compiles, ~1 s)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self._kernel: Callable[..., np.ndarray] | None = None

    def __call__(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        if self._kernel is None:
            from kernelfleet.tvm_kernel import build_kernel

            self._kernel = build_kernel(self.config)
        return self._kernel(x, w)


def dispatcher_from_doc(doc: DispatchDoc, cache: DispatchCache, trusted_key: str | None, source: str) -> Dispatcher:
    """Load the document's uKernels from the cache, verifying each one's hash and signature again."""
    from kernelfleet.ukernel import UKernelSpec, load_ukernel

    kernels = {}
    for u in doc.ukernels:
        path = cache.artifact_path(u.sha256)
        if trusted_key is not None:
            verify_artifact(path.read_bytes(), u.sha256, doc.target_fingerprint, u.signature, trusted_key)
        kernels[u.id] = load_ukernel(path, UKernelSpec.from_dict(u.spec), sha256=u.sha256)
    spec = next(iter(kernels.values())).spec
    return Dispatcher(
        DispatchTable.from_dict(doc.table),
        kernels,
        N=spec.N,
        K=spec.K,
        exact={o.S: _LazyKernel(o.config) for o in doc.overrides},
        source=source,
        meta={
            "workload_hash": doc.workload_hash,
            "target_fingerprint": doc.target_fingerprint,
            "dim": doc.dim,
            "job_id": doc.job_id,
        },
    )


def load_dispatcher(
    client: Client, workload: str, target: str, cache_dir: Path | None = None, trusted_key: str | None = None
) -> Dispatcher:
    cache = DispatchCache(cache_dir or default_cache_dir())
    meta = {"workload_hash": _hex(workload, "workload"), "target_fingerprint": _hex(target, "target"), "dim": "M"}
    try:
        doc = _fetch(client, cache, workload, target, trusted_key)
        source = "service"
    except (ServiceUnavailable, NotFound) as exc:
        cached = cache.read_doc(workload, target)
        if cached is None:
            log.warning("no dispatch table for %s on %s (%s): running numpy", workload, target, exc)
            return Dispatcher(None, {}, N=None, K=None, source="fallback", meta={**meta, "reason": str(exc)})
        log.warning("service unavailable (%s): using the cached dispatch table", exc)
        doc, source = cached[1], "cache"
    key = trusted_key or cache.pinned_key(client.base_url)
    try:
        return dispatcher_from_doc(doc, cache, key, source)
    except UntrustedArtifact:
        raise
    except (ImportError, OSError) as exc:  # no TVM runtime here, or an artifact missing from the cache
        log.warning("cannot load uKernels (%s): running numpy", exc)
        return Dispatcher(None, {}, N=None, K=None, source="fallback", meta={**meta, "reason": str(exc)})
