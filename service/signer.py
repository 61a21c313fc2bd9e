"""The service's Ed25519 signing key.

The API signs every dispatch document and best-config answer it serves (over the request and the
body's sha256); a dispatch document names each artifact by sha256. Inference hosts verify both before
compiling or loading anything, so a tampered cache or a man in the middle cannot make them run
foreign code. Only the API needs the key: `KERNELFLEET_SIGNING_KEY` (base64 of a 32-byte seed, for
API replicas on several hosts) or, by default, `$DATA_DIR/signing.key`, created on first use with
mode 0600.
"""

from __future__ import annotations

import base64
import functools
import os
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from kernelfleet.signing import document_message
from service.settings import Settings


def _load_or_create(path: Path) -> bytes:
    try:
        return base64.b64decode(path.read_text().strip())
    except FileNotFoundError:
        pass
    seed = os.urandom(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process of the fleet created it first: use theirs
        return base64.b64decode(path.read_text().strip())
    with os.fdopen(fd, "w") as f:
        f.write(base64.b64encode(seed).decode())
    return seed


@functools.cache
def _private_key(seed_b64: str | None, path: Path) -> Ed25519PrivateKey:
    seed = base64.b64decode(seed_b64) if seed_b64 else _load_or_create(path)
    if len(seed) != 32:
        raise ValueError("the signing key must be a base64-encoded 32-byte Ed25519 seed")
    return Ed25519PrivateKey.from_private_bytes(seed)


def private_key(settings: Settings) -> Ed25519PrivateKey:
    return _key_of(settings.signing_key, settings.data_dir)


@functools.cache
def _key_of(seed_b64: str | None, data_dir: Path) -> Ed25519PrivateKey:
    # every answer the API serves is signed: resolving the key's path (syscalls) once per data dir, not per call
    return _private_key(seed_b64, (data_dir / "signing.key").resolve())


def public_key_b64(settings: Settings) -> str:
    raw = private_key(settings).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def sign_document(settings: Settings, workload: str, target: str, body: bytes, what: str = "dispatch") -> str:
    message = document_message(workload, target, body, what)
    return base64.b64encode(private_key(settings).sign(message)).decode()
