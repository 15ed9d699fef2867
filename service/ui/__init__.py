"""The web pages under ``/ui``: runs, snapshots, norms over steps, diffs (docs/SERVICE.md).

``install_ui(app)`` adds them to a service app: the pages, their JSON endpoint, the
static files (uPlot, Swagger UI, ReDoc and the pages' own script and style), the API's
documentation pages and schema (:mod:`.docs`) and the redirect from ``/``.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from . import docs
from .access import UI_PREFIX, LoginRequiredError, login_redirect
from .pages import root_router, router

STATIC_DIR = Path(__file__).parent / "static"


def install_ui(app: FastAPI) -> None:
    """Serve the pages, their static files and the ``/`` redirect from ``app``."""
    app.include_router(root_router)
    app.include_router(router)
    app.include_router(docs.router)
    # a 405 names the methods these paths take, as it does for the API's
    app.state.api_routes = [
        *getattr(app.state, "api_routes", []),
        *root_router.routes,
        *router.routes,
        *docs.router.routes,
    ]
    app.mount(f"{UI_PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="ui-static")
    app.add_exception_handler(LoginRequiredError, login_redirect)


__all__ = ["LoginRequiredError", "install_ui"]
