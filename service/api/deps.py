"""Dependencies injected into the routers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, NoReturn

from fastapi import Depends, HTTPException
from sqlalchemy.orm import Session

from service.store.db import session_scope


def get_session() -> Iterator[Session]:
    with session_scope() as session:
        yield session


# scope="function": the transaction commits when the route returns, before the response is sent. FastAPI's default
# ("request") commits after sending, so a client could be told 200 for a write whose commit then failed, and a read
# right after an acknowledged write could miss it (a race the fleet simulation hit: telemetry acknowledged, then
# half-visible to the next GET).
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def unprocessable(loc: list[str | int], msg: str) -> NoReturn:
    """A 422 shaped like FastAPI's own validation errors, naming the offending field."""
    raise HTTPException(status_code=422, detail=[{"loc": loc, "msg": msg, "type": "value_error"}])


def not_found(what: str) -> NoReturn:
    raise HTTPException(status_code=404, detail=what)
