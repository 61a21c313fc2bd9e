"""The FastAPI application: versioned routers, one session per request, clear errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service import __version__
from service.api import body, dashboard, errors
from service.api.limits import BodySizeLimit
from service.api.routers import catalog, configs, dispatch, fleet, health, jobs, keys, models, ops, telemetry
from service.settings import get_settings
from service.store.db import migrate


def create_app(run_migrations: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if run_migrations:
            migrate()
        yield

    app = FastAPI(
        title="KernelFleet",
        version=__version__,
        description="Tune kernels for operator workloads and shape distributions; serve the best kernel per shape.",
        lifespan=lifespan,
        # the dashboard serves /docs from this package, not FastAPI's CDN page (dashboard.api_docs); no ReDoc
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(body.JsonBodies)  # inside BodySizeLimit: it buffers only bodies within the size limit
    app.add_middleware(BodySizeLimit, max_bytes=get_settings().max_body_bytes)
    errors.install(app)
    body.document(app)
    # Routes are matched in order, one regex each: the lookups inference hosts make come first.
    for module in (configs, dispatch, health, ops, catalog, jobs, models, telemetry, fleet, keys):
        app.include_router(module.router)
    dashboard.install(app)

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeout)
    async def _store_unavailable(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"the config store is unavailable ({type(exc).__name__}); retry later"},
            status_code=503,
            headers={"Retry-After": "5"},
        )

    return app


app = create_app()
