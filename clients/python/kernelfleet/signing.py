"""Verifying what the service signed before anything from it is compiled or loaded.

The service signs each dispatch document it serves with its Ed25519 key, over the requested workload
and target and the sha256 of the exact body. The document names every artifact by sha256, so a
verified document vouches for the artifacts' bytes, its table and its exact-shape configs alike. The
key is pinned: given explicitly (`KERNELFLEET_TRUSTED_KEY`), or learnt on first contact and kept in
the cache, after which a different key from the service is refused.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kernelfleet.errors import KernelFleetError


class UntrustedArtifact(KernelFleetError):
    """A dispatch document or artifact that fails verification: nothing from it is loaded."""


def document_message(workload: str, target: str, body: bytes) -> bytes:
    """What the service signs: the request the document answers, bound to the body's hash."""
    return f"kernelfleet-dispatch-v1:{workload}:{target}:{hashlib.sha256(body).hexdigest()}".encode()


def verify_document(body: bytes, workload: str, target: str, signature_b64: str | None, public_key_b64: str) -> None:
    """Raise UntrustedArtifact unless `body` is what the key's owner signed for this workload and target."""
    if not signature_b64:
        raise UntrustedArtifact(f"the dispatch document for {workload} on {target} carries no signature")
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64))
        key.verify(base64.b64decode(signature_b64), document_message(workload, target, body))
    except (InvalidSignature, ValueError) as exc:
        raise UntrustedArtifact(
            f"the dispatch document for {workload} on {target} does not verify with the trusted key"
        ) from exc


def verify_bytes(data: bytes, sha256: str) -> None:
    """Raise UntrustedArtifact unless `data` hashes to the sha256 a verified document names."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise UntrustedArtifact(f"artifact bytes hash to {digest}, expected {sha256}")
