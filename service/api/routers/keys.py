"""API keys (admin only)."""

from __future__ import annotations

from fastapi import APIRouter, status

from service.api.auth import AdminKey, clear_cache
from service.api.deps import SessionDep, not_found
from service.models.auth import ApiKeyCreate, ApiKeyCreated, ApiKeyView
from service.store import keys

router = APIRouter(prefix="/v1/keys", tags=["keys"])


@router.post("", status_code=status.HTTP_201_CREATED, summary="Create a key; its secret is shown only here")
def create_key(body: ApiKeyCreate, session: SessionDep, _: AdminKey) -> ApiKeyCreated:
    return keys.create(session, body.name, body.scopes)


@router.get("", summary="List keys (never their secrets)")
def list_keys(session: SessionDep, _: AdminKey) -> list[ApiKeyView]:
    return keys.list_all(session)


@router.post("/{key_id}/revoke", summary="Revoke a key")
def revoke_key(key_id: str, session: SessionDep, _: AdminKey) -> ApiKeyView:
    view = keys.revoke(session, key_id) or not_found(f"key {key_id} not found")
    clear_cache()
    return view
