"""A job or model named in a route's path: by its id or a unique prefix of it, and readable by the caller.

Reading a job or model needs the `read` scope, except for the key that submitted it: a submit-only key (a CI bot)
can always follow what it started. Such a key resolves ids among its own rows only, so it can learn nothing about
anyone else's, not even whether an id exists.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException
from sqlalchemy.orm import Session

from service.api.auth import Principal, allows
from service.api.deps import SessionDep, not_found
from service.models.auth import ApiKeyView, Scope
from service.store import ids
from service.store.tables import JobRow, ModelRow

ID_RULE = (
    f"By its id or any unique prefix of it ({ids.MIN_PREFIX_CHARS} characters at least; 409 when several match). "
    "Needs the read scope, except for the key that submitted it."
)
# documented on every route that takes an id prefix, so clients (and the schema fuzzer) expect it
AMBIGUOUS_PREFIX: dict[int | str, dict[str, Any]] = {
    409: {"description": "the id prefix names several rows; the detail lists some of them"}
}


def find(session: Session, table: type[JobRow] | type[ModelRow], given: str, who: ApiKeyView) -> str:
    """The full id `given` names for `who`: 404 when none (403 for a key that may see only its own rows),
    409 naming the candidates when the prefix is ambiguous."""
    noun = "job" if table is JobRow else "model"
    own_only = None if allows(who, Scope.read) else who.id
    try:
        return ids.resolve_id(session, table, given, owner_key_id=own_only)
    except ids.UnknownId:
        if own_only is not None:
            raise HTTPException(
                403, f"this API key lacks the 'read' scope and submitted no {noun} {given}: it reads only its own"
            ) from None
        hint = "" if len(given) >= ids.MIN_PREFIX_CHARS else f" (an id prefix needs {ids.MIN_PREFIX_CHARS} characters)"
        not_found(f"{noun} {given} not found{hint}")
    except ids.AmbiguousId as exc:
        listed = ", ".join(exc.candidates)
        detail = f"{noun} id prefix {given} matches several {noun}s ({listed}): give more of it"
        raise HTTPException(409, detail) from None


def readable_job(job_id: str, session: SessionDep, who: Principal) -> JobRow:
    row = session.get(JobRow, find(session, JobRow, job_id, who))
    assert row is not None  # just resolved in this transaction
    return row


def readable_model(model_id: str, session: SessionDep, who: Principal) -> ModelRow:
    row = session.get(ModelRow, find(session, ModelRow, model_id, who))
    assert row is not None
    return row


ReadableJob = Annotated[JobRow, Depends(readable_job)]
ReadableModel = Annotated[ModelRow, Depends(readable_model)]
