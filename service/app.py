"""create_app: the FastAPI application over one snapshot store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gradvault.core import open_store

from .access_log import RequestTelemetry
from .error_handlers import install_error_handlers
from .index import SnapshotIndex
from .lister import StoreLister
from .metrics import ServiceMetrics
from .routes import gradients, health, metrics, snapshots, zarr
from .settings import Settings
from .spool import sweep_spool
from .ui import install_ui

_log = logging.getLogger("gradvault.service")


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
    )
    app.state.settings = settings
    app.state.metrics = ServiceMetrics()
    install_error_handlers(app)
    routers = [module.router for module in (health, snapshots, gradients, zarr, metrics)]
    for router in routers:
        app.include_router(router)
    app.state.api_routes = [route for router in routers for route in router.routes]
    install_ui(app)
    app.add_middleware(RequestTelemetry, metrics=app.state.metrics)
    return app
