"""API keys: created with a random secret, stored as its hash, checked on every request."""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models.auth import ApiKeyCreated, ApiKeyView, Scope
from service.store.tables import ApiKeyRow, utcnow


def hash_key(secret: str) -> str:
    # Keys carry 256 random bits, so one SHA-256 is as strong as a slow password hash would be here.
    return hashlib.sha256(secret.encode()).hexdigest()


def _view(row: ApiKeyRow) -> ApiKeyView:
    return ApiKeyView(
        id=row.id,
        name=row.name,
        prefix=row.prefix,
        scopes=[Scope(s) for s in row.scopes],
        created_at=row.created_at,
        revoked_at=row.revoked_at,
    )


def create(session: Session, name: str, scopes: Sequence[Scope]) -> ApiKeyCreated:
    secret = f"kf_{secrets.token_urlsafe(32)}"
    row = ApiKeyRow(
        id=str(uuid.uuid4()),
        name=name,
        prefix=secret[:10],
        key_hash=hash_key(secret),
        scopes=sorted({s.value for s in scopes}),
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return ApiKeyCreated(**_view(row).model_dump(), key=secret)


def authenticate(session: Session, secret: str) -> ApiKeyView | None:
    row = session.scalar(select(ApiKeyRow).where(ApiKeyRow.key_hash == hash_key(secret)))
    return None if row is None or row.revoked_at is not None else _view(row)


def list_all(session: Session) -> list[ApiKeyView]:
    return [_view(r) for r in session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.created_at))]


def revoke(session: Session, key_id: str) -> ApiKeyView | None:
    row = session.get(ApiKeyRow, key_id)
    if row is None:
        return None
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return _view(row)


def count_active(session: Session) -> int:
    return session.scalar(select(func.count()).where(ApiKeyRow.revoked_at.is_(None))) or 0


def bootstrap_admin(session: Session) -> ApiKeyCreated | None:
    """An admin key for a store that has none yet (first start of the embedded default); else None."""
    if count_active(session):
        return None
    return create(session, "bootstrap-admin", [Scope.admin])
