"""The dispatch cache keyed by service: a client reads and revalidates its own service's entries, an entry written
before the cache was keyed (no service in its name) only when it verifies, another service's never; offline, any
entry that verifies. Documents here route every S to numpy (no uKernel to build), so only the cache is exercised."""

from __future__ import annotations

import base64
import datetime as dt
import logging
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kernelfleet.dispatch import DispatchTable, Interval
from kernelfleet.dispatch_cache import CachedDoc, DispatchCache, Entry, cached_doc, load_dispatcher, service_id
from kernelfleet.errors import NotFound, ServiceUnavailable
from kernelfleet.models import DispatchDoc
from kernelfleet.signing import UntrustedArtifact, document_message

WL, TARGET = "ab" * 16, "cd" * 16
URL, OTHER_URL = "http://fleet.test", "http://other.test"


@dataclass
class Signer:
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    @property
    def public(self) -> str:
        return base64.b64encode(self.key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()

    def doc(self, s_max: int, day: int = 1) -> CachedDoc:
        """A signed document for WL on TARGET whose table routes 1..s_max to numpy (`s_max` tells documents apart)."""
        body = DispatchDoc(
            workload_hash=WL,
            target_fingerprint=TARGET,
            dim="M",
            s_max=s_max,
            table=DispatchTable((Interval(1, s_max, None),), {}).to_dict(),
            ukernels=[],
            predicted_latency_s=[],
            measured_latency_s={},
            created_at=dt.datetime(2026, 1, day, tzinfo=dt.UTC),
        )
        data = body.model_dump_json().encode()
        return CachedDoc(
            f'"{s_max}"', data, base64.b64encode(self.key.sign(document_message(WL, TARGET, data))).decode()
        )


class Service:
    """GET /v1/dispatch as a service answers it, recording the ETag each request sent; `down` refuses them all."""

    def __init__(self, signer: Signer, s_max: int) -> None:
        self.signer, self.current = signer, signer.doc(s_max)
        self.down = False
        self.withdrawn = False  # the table was rolled back or retired: GET /v1/dispatch answers 404
        self.etags: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/signing-key":
            return httpx.Response(200, json={"public_key": self.signer.public})
        self.etags.append(request.headers.get("If-None-Match"))
        if self.withdrawn:
            return httpx.Response(404, json={"detail": "no dispatch table"})
        if request.headers.get("If-None-Match") == self.current.etag:
            return httpx.Response(304)
        headers = {"ETag": self.current.etag or "", "X-KernelFleet-Signature": self.current.signature}
        return httpx.Response(200, content=self.current.body, headers=headers)


class Source:
    """A DispatchSource over a Service (the Client's dispatch calls, without its retries)."""

    def __init__(self, base_url: str, service: Service) -> None:
        self.base_url, self.service = base_url, service
        self._http = httpx.Client(base_url=base_url, transport=httpx.MockTransport(service))

    def dispatch_raw(self, workload: str, target: str, etag: str | None = None) -> tuple[bytes, str | None, str] | None:
        try:
            resp = self._http.get("/v1/dispatch", headers={"If-None-Match": etag} if etag else {})
        except httpx.ConnectError as exc:
            raise ServiceUnavailable(str(exc)) from exc
        if resp.status_code == 304:
            return None
        if resp.status_code == 404:
            raise NotFound("GET /v1/dispatch -> 404: no dispatch table", 404)
        return resp.content, resp.headers["ETag"], resp.headers["X-KernelFleet-Signature"]

    def artifact(self, sha256: str) -> bytes:
        raise AssertionError("these documents name no artifact")

    def signing_key(self) -> str:
        return str(self._http.get("/v1/signing-key").json()["public_key"])


def _s_max(d: object) -> int:
    table = getattr(d, "table", None)
    assert table is not None, "a table was expected, not the numpy fallback"
    return int(table.s_max)


def test_each_service_writes_and_revalidates_its_own_entry_in_a_shared_cache(tmp_path: Path) -> None:
    mine, theirs = Service(Signer(), 8), Service(Signer(), 16)  # two services, the same workload and target
    me, them = Source(URL, mine), Source(OTHER_URL, theirs)
    assert _s_max(load_dispatcher(them, WL, TARGET, tmp_path)) == 16
    assert _s_max(load_dispatcher(me, WL, TARGET, tmp_path)) == 8
    # neither sent the other's ETag: a 304 must mean "your own cached document is current"
    assert mine.etags == [None] and theirs.etags == [None]
    assert sorted(DispatchCache(tmp_path).entries(), key=str) == sorted(
        [Entry(WL, TARGET, service_id(URL)), Entry(WL, TARGET, service_id(OTHER_URL))], key=str
    )
    assert _s_max(load_dispatcher(me, WL, TARGET, tmp_path)) == 8 and mine.etags[-1] == '"8"'  # revalidated: 304

    mine.down = theirs.down = True  # both down: each serves its own cached table, verified with its pinned key
    assert _s_max(load_dispatcher(me, WL, TARGET, tmp_path)) == 8
    assert _s_max(load_dispatcher(them, WL, TARGET, tmp_path)) == 16


def test_a_table_the_service_no_longer_serves_is_dropped_from_the_cache_not_served_from_it(tmp_path: Path) -> None:
    """Down, a service's cached table keeps serving; answering 404 (the fleet rolled it back or retired it), it is
    gone: no table now, none when the service is down later, none offline. Another service's entry stays."""
    mine, theirs = Service(Signer(), 8), Service(Signer(), 16)
    me, them = Source(URL, mine), Source(OTHER_URL, theirs)
    assert _s_max(load_dispatcher(me, WL, TARGET, tmp_path)) == 8 and _s_max(
        load_dispatcher(them, WL, TARGET, tmp_path)
    )
    mine.withdrawn = True
    d = load_dispatcher(me, WL, TARGET, tmp_path)
    assert d.table is None and "404" in d.meta["reason"]
    assert DispatchCache(tmp_path).entries() == [Entry(WL, TARGET, service_id(OTHER_URL))]
    mine.withdrawn, mine.down = False, True
    assert load_dispatcher(me, WL, TARGET, tmp_path).table is None  # down: nothing of this service's cached


def test_a_service_signing_with_another_key_is_refused_with_the_pinned_key_to_delete(tmp_path: Path) -> None:
    """A service redeployed at the same URL with a new key cannot be told from an impostor: refused, and the error
    names the pinned key whose deletion trusts the new one."""
    assert _s_max(load_dispatcher(Source(URL, Service(Signer(), 8)), WL, TARGET, tmp_path)) == 8
    redeployed = Source(URL, Service(Signer(), 16))
    with pytest.raises(UntrustedArtifact) as refused:
        load_dispatcher(redeployed, WL, TARGET, tmp_path)
    pinned = DispatchCache(tmp_path).pinned_key_path(URL)
    assert str(pinned) in str(refused.value) and pinned.exists()
    pinned.unlink()  # the user's decision: trust the new key
    assert _s_max(load_dispatcher(redeployed, WL, TARGET, tmp_path)) == 16


def test_an_unkeyed_entry_is_read_only_when_it_verifies_and_an_altered_own_entry_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    signer, stranger = Signer(), Signer()
    cache = DispatchCache(tmp_path)
    cache.write_doc(WL, TARGET, stranger.doc(16))  # the older layout: whose it is is unknown
    with caplog.at_level(logging.WARNING, logger="kernelfleet.dispatch_cache"):
        assert cached_doc(cache, WL, TARGET, signer.public, service_id(URL)) is None
    assert "does not verify with the trusted key" in caplog.text  # another service's: skipped, said, no error
    cache.write_doc(WL, TARGET, signer.doc(4))
    found = cached_doc(cache, WL, TARGET, signer.public, service_id(URL))
    assert found is not None and found.s_max == 4  # this signer's: used while the service has no entry of its own

    cache.write_doc(WL, TARGET, signer.doc(8), service_id(URL))
    own = cached_doc(cache, WL, TARGET, signer.public, service_id(URL))
    assert own is not None and own.s_max == 8  # its own entry first
    altered = CachedDoc('"8"', signer.doc(32).body, signer.doc(8).signature)  # another body under the signature
    cache.write_doc(WL, TARGET, altered, service_id(URL))
    with pytest.raises(UntrustedArtifact):  # its own entry, altered: an attack or a misconfiguration
        cached_doc(cache, WL, TARGET, signer.public, service_id(URL))


def test_offline_the_newest_entry_that_verifies_is_used_whichever_service_cached_it(tmp_path: Path) -> None:
    signer, stranger = Signer(), Signer()
    cache = DispatchCache(tmp_path)
    cache.write_doc(WL, TARGET, signer.doc(4, day=1))
    cache.write_doc(WL, TARGET, signer.doc(8, day=3), service_id(URL))
    cache.write_doc(WL, TARGET, stranger.doc(16, day=9), service_id(OTHER_URL))  # newest, another key: not used
    found = cached_doc(cache, WL, TARGET, signer.public, None)
    assert found is not None and found.s_max == 8
    theirs = cached_doc(cache, WL, TARGET, stranger.public, None)
    assert theirs is not None and theirs.s_max == 16  # the other key: the other service's entry
    cache.pin_key(URL, signer.public)  # the service that pinned this key: its entry must verify
    cache.write_doc(WL, TARGET, CachedDoc('"8"', signer.doc(32).body, signer.doc(8, day=3).signature), service_id(URL))
    with pytest.raises(UntrustedArtifact):
        cached_doc(cache, WL, TARGET, signer.public, None)


def test_names_that_are_not_the_caches_own_are_passed_over(tmp_path: Path) -> None:
    (tmp_path / "dispatch").mkdir()
    for name in ["notes.json", "ab-cd-ef-01.json", "AB-cd.json", f"{WL}-{TARGET}.json"]:
        (tmp_path / "dispatch" / name).write_text("{}")
    assert DispatchCache(tmp_path).entries() == [Entry(WL, TARGET, None)]
    with pytest.raises(ValueError):
        DispatchCache(tmp_path).read_doc(WL, TARGET, "../keys")
