"""Dispatch tables, the artifacts they name, and the key that signs the tables.

Inference hosts fetch a dispatch document once and revalidate it with `If-None-Match`: an unchanged
table costs a 304 with no body. Each document is signed (`X-KernelFleet-Signature`, Ed25519 over the
requested workload and target and the body's sha256) and names its artifacts by sha256; artifacts
are immutable, so they may be cached forever. The SDK checks the signature and every hash before it
compiles or loads anything.
"""

from __future__ import annotations

from fastapi import APIRouter, Header, Path, Query
from fastapi.responses import Response

from kernelfleet.models import SHA256_PATTERN, DispatchDoc
from service import signer
from service.api.auth import ReadKey
from service.api.deps import SessionDep, not_found
from service.api.documents import dispatch_document
from service.api.limits import enforce
from service.api.state import lookup_bucket
from service.settings import get_settings
from service.store import dispatch as dispatch_store

router = APIRouter(prefix="/v1", tags=["dispatch"])

_HEX = r"^[0-9a-f]{1,64}$"


@router.get(
    "/dispatch",
    response_model=DispatchDoc,
    responses={304: {"description": "the table is unchanged since the ETag in If-None-Match"}},
    summary="The newest dispatch table of a workload on a target, with exact-shape overrides",
)
def get_dispatch(
    session: SessionDep,
    who: ReadKey,
    workload: str = Query(pattern=_HEX, description="workload hash"),
    target: str = Query(pattern=_HEX, description="target fingerprint (includes toolchain)"),
    if_none_match: str | None = Header(default=None, max_length=200),
) -> Response:
    enforce(lookup_bucket(), who.id, "lookups")  # a revalidation (304) counts too: it costs two queries
    row = dispatch_store.latest(session, workload, target)
    if row is None:
        not_found(f"no dispatch table for workload {workload} on target {target}; submit a ukernel job")
    # a revalidation costs two small queries: the document is built only when it changed
    keys = dispatch_store.override_keys(session, row)
    etag = dispatch_store.etag(row, keys)
    headers = {"ETag": etag, "Cache-Control": "no-cache"}
    if if_none_match is not None and etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    body = dispatch_document(session, row, keys).model_dump_json().encode()
    headers["X-KernelFleet-Signature"] = signer.sign_document(get_settings(), workload, target, body)
    return Response(body, media_type="application/json", headers=headers)


@router.get(
    "/artifacts/{sha256}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
    summary="A compiled artifact by the sha256 of its bytes (a signed dispatch document names it)",
)
def get_artifact(session: SessionDep, who: ReadKey, sha256: str = Path(pattern=SHA256_PATTERN)) -> Response:
    enforce(lookup_bucket(), who.id, "lookups")
    row = dispatch_store.get_artifact(session, sha256)
    if row is None:
        not_found(f"artifact {sha256} not found")
    headers = {
        "X-KernelFleet-Target": row.target_fingerprint,
        "Cache-Control": "public, max-age=31536000, immutable",
    }
    return Response(row.data, media_type="application/octet-stream", headers=headers)


@router.get("/signing-key", summary="The Ed25519 public key dispatch documents are signed with (base64)")
def signing_key(_: ReadKey) -> dict[str, str]:
    return {"algorithm": "ed25519", "public_key": signer.public_key_b64(get_settings())}
