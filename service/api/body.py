"""Request bodies are UTF-8 JSON: a wrong content type is a 415, bytes that are not UTF-8 a 400 saying so.

Without this FastAPI reads a non-JSON content type as raw bytes and answers with a 422 about a missing
object, and a body that is not UTF-8 with a bare "There was an error parsing the body".
"""

from __future__ import annotations

import json
from email.message import Message as MimeHeader
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


def is_json(content_type: str) -> bool:
    header = MimeHeader()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def _charset(content_type: str) -> str | None:
    header = MimeHeader()
    header["content-type"] = content_type
    charset = header.get_param("charset")
    return charset.lower() if isinstance(charset, str) else None


class JsonBodies:
    """Checks the content type before reading a body, then that the body is UTF-8, and replays it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only the JSON API: the dashboard's HTML forms (/dashboard) post urlencoded bodies.
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length", b"")
        if not (b"transfer-encoding" in headers or (length.isdigit() and int(length) > 0)):
            await self.app(scope, receive, send)  # no body: e.g. POST /v1/jobs/{id}/cancel
            return
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        if not is_json(content_type):
            got = f"'{content_type}'" if content_type else "none"
            await _answer(send, 415, f"request bodies must be JSON: send Content-Type: application/json (got {got})")
            return
        if _charset(content_type) not in (None, "utf-8", "utf8"):
            await _answer(send, 415, f"request bodies must be UTF-8 JSON, not charset={_charset(content_type)}")
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            body.decode("utf-8")
        except UnicodeDecodeError as exc:
            await _answer(
                send,
                400,
                f"request body is not valid UTF-8 (byte {body[exc.start]:#04x} at offset {exc.start}); "
                "JSON bodies must be UTF-8",
            )
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


_DETAIL = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
_BODY_ERRORS = {
    "400": "the body is not UTF-8",
    "413": "the body is larger than KERNELFLEET_MAX_BODY_BYTES",
    "415": "the body is not sent as Content-Type: application/json",
}


def document(app: FastAPI) -> None:
    """Add the answers above to every operation that takes a body, in the OpenAPI schema."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path, operations in schema.get("paths", {}).items():
                if not path.startswith("/v1/"):
                    continue
                for operation in operations.values():
                    if isinstance(operation, dict) and "requestBody" in operation:
                        for status, why in _BODY_ERRORS.items():
                            operation["responses"].setdefault(
                                status, {"description": why, "content": {"application/json": {"schema": _DETAIL}}}
                            )
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
