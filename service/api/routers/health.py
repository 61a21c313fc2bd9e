"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from service.api.deps import SessionDep
from service.workers.celery_app import app as celery_app

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The API process is up")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="The store and the broker answer")
def readyz(session: SessionDep) -> JSONResponse:
    checks: dict[str, str] = {}
    try:
        session.execute(text("SELECT 1"))
        checks["store"] = "ok"
    except Exception as exc:
        checks["store"] = f"unavailable: {type(exc).__name__}"
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        checks["broker"] = "ok"
    except Exception as exc:
        checks["broker"] = f"unavailable: {type(exc).__name__}"
    ok = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ok else "not ready", **checks}, status_code=200 if ok else 503)
