"""Validation errors as clear 422s, whatever the request held.

FastAPI's own handler echoes each error's input, and Python's json reads NaN, Infinity and 1e400 (as
inf) from a request body, so an echo of such a value made the handler itself fail (a 500). Here every
echoed value is made JSON-safe first, locations are cut down to the fields a user wrote, and if
anything still goes wrong the answer is a 422 with the locations and messages alone.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

log = logging.getLogger(__name__)

# Pydantic labels the validators it ran inside a model ("function-after[_complete(), WorkloadSpec]");
# they are no field a user could write.
_VALIDATOR_LABEL = re.compile(r"^function-(after|before|wrap|plain)\[")
_MAX_DEPTH = 16
_MAX_ITEMS = 100
_MAX_TEXT = 2000


def clean_loc(loc: Sequence[Any]) -> list[str | int]:
    return [
        part if isinstance(part, int) and not isinstance(part, bool) else str(part)
        for part in loc
        if not (isinstance(part, str) and _VALIDATOR_LABEL.match(part))
    ]


def json_safe(value: Any, depth: int = 0) -> Any:
    """`value` as strict JSON can carry it: non-finite floats as their names ("NaN", "Infinity"), anything
    else that is not JSON as text, long or deep inputs cut short."""
    if value is None or isinstance(value, bool | int | str):
        return value[:_MAX_TEXT] if isinstance(value, str) else value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if depth >= _MAX_DEPTH:
        return "…"
    if isinstance(value, Mapping):
        return {str(k)[:_MAX_TEXT]: json_safe(v, depth + 1) for k, v in list(value.items())[:_MAX_ITEMS]}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_safe(v, depth + 1) for v in list(value)[:_MAX_ITEMS]]
    if isinstance(value, bytes):
        return value[:_MAX_TEXT].decode("utf-8", "replace")
    return str(value)[:_MAX_TEXT]


def _error(raw: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": str(raw.get("type", "value_error")),
        "loc": clean_loc(raw.get("loc", ())),
        "msg": str(raw.get("msg", ""))[:_MAX_TEXT],
    }
    if "input" in raw:
        out["input"] = json_safe(raw["input"])
    if raw.get("ctx"):
        out["ctx"] = json_safe(raw["ctx"])  # exceptions in ctx (ValueError(...)) become their message
    return out


# The member labels pydantic appends when a value matches no type of a union of scalars (`int | bool`): one
# error per member, e.g. at attrs.stride.int and attrs.stride.bool, where the user wrote attrs.stride.
_SCALAR_MEMBERS = frozenset({"str", "int", "bool", "float"})


def merge_union_members(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One error per field for a scalar union: its members' errors merged at the field's own location."""
    members: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for e in errors:
        loc = e["loc"]
        if loc and loc[-1] in _SCALAR_MEMBERS:
            members.setdefault(tuple(loc[:-1]), []).append(e)
    out: list[dict[str, Any]] = []
    merged: set[tuple[Any, ...]] = set()
    for e in errors:
        field = tuple(e["loc"][:-1])
        group = members.get(field, [])
        if len({g["loc"][-1] for g in group}) < 2 or e not in group:
            out.append(e)
        elif field not in merged:
            merged.add(field)
            out.append({**e, "type": "union_type", "loc": list(field), "msg": "; or ".join(g["msg"] for g in group)})
    return out


def validation_body(errors: Sequence[Mapping[str, Any]]) -> bytes:
    """The 422 body for `errors`: never raises, never holds a value strict JSON cannot."""
    try:
        detail = merge_union_members([_error(e) for e in errors])
        return json.dumps({"detail": detail}, allow_nan=False).encode()
    except Exception:
        log.exception("could not render validation errors in full; answering with locations only")
    try:
        bare = [
            {"loc": clean_loc(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
            for e in errors
        ]
        return json.dumps({"detail": bare}, allow_nan=False).encode()
    except Exception:
        log.exception("could not render validation error locations")
        return b'{"detail":[{"loc":["body"],"msg":"invalid request","type":"value_error"}]}'


async def _on_validation_error(_: Request, exc: Exception) -> Response:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    return Response(validation_body(errors), status_code=422, media_type="application/json")


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _on_validation_error)
