"""The web dashboard, served by the API under /dashboard: pages from templates, charts drawn by a small SVG
module shipped in this package, live updates by polling JSON feeds, sign-in with an API key (a cookie).

Pages: jobs (live), a job (its kind's page: see `job_pages`), the config store, the
fleet, Gemmini, and API keys (admin). It also serves the API's own docs, /docs (`api_docs`), from this service.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import Response

from service.api.dashboard import api_docs, feeds, pages, render
from service.api.dashboard.session import PATH, DashboardError, signed_in


async def _show_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DashboardError)
    if request.url.path.startswith(f"{PATH}/api/"):
        return render.json_response({"detail": exc.message}, exc.status)
    if exc.status == 401:  # a browser that is not signed in goes to the login page, and comes back after
        back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "GET":  # a form sent after the sign-in lapsed: come back to a page, not the form
            back = f"{PATH}/jobs"
        return pages.see_other(f"{PATH}/login?next={quote(back, safe='')}")
    return render.error_page(request, exc.status, exc.message, await signed_in(request))


def install(app: FastAPI) -> None:
    app.include_router(pages.router)
    app.include_router(feeds.router)
    app.include_router(api_docs.router)
    app.add_exception_handler(DashboardError, _show_error)


__all__ = ["install"]
