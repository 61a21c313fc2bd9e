"""Verifying what the service signed before anything from it is compiled or loaded.

The service signs each dispatch document and each best-config answer it serves with its Ed25519 key,
over the request (workload, target, and the shape for a config) and the sha256 of the exact body. A
dispatch document names every artifact by sha256, so a verified document vouches for the artifacts'
bytes, its table and its exact-shape configs alike; a verified config vouches for the IR and trace
the SDK compiles. The
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


def document_message(workload: str, target: str, body: bytes, what: str = "dispatch") -> bytes:
    """What the service signs: which answer (`what`: a dispatch document, or a best config for one shape),
    the request it answers, and the body's hash."""
    return f"kernelfleet-{what}-v1:{workload}:{target}:{hashlib.sha256(body).hexdigest()}".encode()


def verify_document(
    body: bytes, workload: str, target: str, signature_b64: str | None, public_key_b64: str, what: str = "dispatch"
) -> None:
    """Raise UntrustedArtifact unless `body` is what the key's owner signed as this answer to this request."""
    if not signature_b64:
        raise UntrustedArtifact(f"the {what} answer for {workload} on {target} carries no signature")
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64))
        key.verify(base64.b64decode(signature_b64), document_message(workload, target, body, what))
    except (InvalidSignature, ValueError) as exc:
        raise UntrustedArtifact(
            f"the {what} answer for {workload} on {target} does not verify with the trusted key"
        ) from exc


def verify_bytes(data: bytes, sha256: str) -> None:
    """Raise UntrustedArtifact unless `data` hashes to the sha256 a verified document names."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise UntrustedArtifact(f"artifact bytes hash to {digest}, expected {sha256}")
