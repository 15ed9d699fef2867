"""create_app: the FastAPI application over one snapshot store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from gradvault.core import open_store

from .access_log import RequestTelemetry
from .deps import SAFE_METHODS, DocumentedBody, SameSiteWrites
from .error_handlers import error_responses, install_error_handlers
from .index import SnapshotIndex
from .limits import RequestLimits
from .lister import StoreLister
from .metrics import ServiceMetrics
from .routes import gradients, health, metrics, shards, snapshots, zarr
from .settings import Settings
from .spool import sweep_spool
from .ui import install_ui

_log = logging.getLogger("gradvault.service")

#: routes that stream their body to disk and bound it themselves (max_upload_bytes); every
#: other route that reads a body reads it whole, at most max_body_bytes
STREAMED_BODY_ENDPOINTS = (snapshots.upload_snapshot, shards.upload_shard)


def _document_refusals(app: FastAPI) -> None:
    """Add to the schema the answers every route may give through the app's own guards.

    The guards are the app's dependencies (a write from another site: 403; a body of
    another media type: 415) and :class:`RequestLimits` (a body that stops arriving: 408);
    the routes do not repeat them.
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        for operations in schema.get("paths", {}).values():
            for method, operation in operations.items():
                if method.upper() in SAFE_METHODS:
                    continue
                statuses = [403] + ([408, 415] if "requestBody" in operation else [])
                documented = error_responses(*statuses, binary_route=True)
                responses = operation.setdefault("responses", {})
                for status, response in documented.items():
                    responses.setdefault(str(status), response)
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service as an ASGI app; ``settings`` default to the ``GRADVAULT_*`` environment.

    The store is opened when the app starts (its lifespan) and closed when it stops.
    """
    if settings is None:
        settings = Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for swept in await asyncio.to_thread(sweep_spool, settings.spool_dir):
            _log.warning(
                "spool sweep: removed %s (%d bytes), an orphaned upload", swept.path, swept.size
            )
        store = open_store(settings.store, **settings.store_options)
        app.state.store = store
        # listed on a thread of its own, so that relisting never holds up requests
        lister = StoreLister(settings.store, settings.store_options)
        app.state.index = SnapshotIndex(lister, settings.index_refresh_seconds)
        app.state.index.prefetch()  # the first listing reads every manifest: start it now
        if settings.is_open:
            _log.warning(
                "no tokens configured: the service is open; anyone who reaches %s:%d may "
                "read, write and delete snapshots in %s",
                settings.host,
                settings.port,
                store.location,
            )
        try:
            yield
        finally:
            try:
                await lister.aclose()
            finally:
                await store.close()

    app = FastAPI(
        title="gradvault",
        summary="List, serve, accept and delete gradient snapshots",
        version="1",
        lifespan=lifespan,
        # served by the UI package instead, from its own files and behind the read rule
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        # every route, the pages' included: no write from another site, no undocumented body
        dependencies=[SameSiteWrites, DocumentedBody],
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    install_error_handlers(app)
    routers = [module.router for module in (health, snapshots, shards, gradients, zarr, metrics)]
    for router in routers:
        app.include_router(router)
    app.state.api_routes = [route for router in routers for route in router.routes]
    install_ui(app)
    _document_refusals(app)
    app.add_middleware(
        RequestLimits,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_seconds=settings.body_timeout_seconds,
        streamed_endpoints=STREAMED_BODY_ENDPOINTS,
    )
    # outermost, so that it sees every answer, the limits' refusals included
    app.add_middleware(RequestTelemetry, metrics=app.state.metrics)
    return app
