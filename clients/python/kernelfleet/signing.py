"""Verifying the service's signatures on artifacts before anything is loaded.

An artifact is accepted only when its bytes hash to the sha256 the dispatch table names and the
service's Ed25519 signature over (sha256, target fingerprint) verifies with the trusted public key.
The key is pinned: given explicitly (`KERNELFLEET_TRUSTED_KEY`), or learnt on first contact and kept
in the cache, after which a different key from the service is refused.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kernelfleet.errors import KernelFleetError


class UntrustedArtifact(KernelFleetError):
    """An artifact whose hash or signature does not match: never loaded."""


def artifact_message(sha256: str, target_fingerprint: str) -> bytes:
    """What the service signs: the content address bound to the hardware it was compiled for."""
    return f"kernelfleet-artifact-v1:{sha256}:{target_fingerprint}".encode()


def verify_artifact(
    data: bytes, sha256: str, target_fingerprint: str, signature_b64: str | None, public_key_b64: str
) -> None:
    """Raise UntrustedArtifact unless `data` is exactly the signed artifact."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise UntrustedArtifact(f"artifact bytes hash to {digest}, expected {sha256}")
    if not signature_b64:
        raise UntrustedArtifact(f"artifact {sha256} carries no signature")
    try:
        key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key_b64))
        key.verify(base64.b64decode(signature_b64), artifact_message(sha256, target_fingerprint))
    except (InvalidSignature, ValueError) as exc:
        raise UntrustedArtifact(f"artifact {sha256}: signature does not verify with the trusted key") from exc
