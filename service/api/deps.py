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


SessionDep = Annotated[Session, Depends(get_session)]


def unprocessable(loc: list[str | int], msg: str) -> NoReturn:
    """A 422 shaped like FastAPI's own validation errors, naming the offending field."""
    raise HTTPException(status_code=422, detail=[{"loc": loc, "msg": msg, "type": "value_error"}])


def not_found(what: str) -> NoReturn:
    raise HTTPException(status_code=404, detail=what)
