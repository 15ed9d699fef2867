"""serve: run the app under uvicorn, refusing an open service on a reachable address."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import uvicorn

from gradvault.core import open_store

from .access_log import access_log
from .app import create_app
from .protocol import protocol_with_timeout
from .settings import Settings, check_binding

#: how long requests in flight may finish once the service is told to stop
GRACEFUL_SHUTDOWN_SECONDS = 5
#: the most of a request's line and headers buffered while incomplete (h11's default,
#: named here): 400 beyond
MAX_HEAD_BYTES = 16 * 1024


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(levelname)s %(name)s: %(message)s")
    # the access log is one JSON object per line on stdout, nothing around it
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_log.addHandler(handler)
    access_log.setLevel(logging.INFO)
    access_log.propagate = False


def check_store(settings: Settings) -> None:
    """Open the store and list it once; StoreUnavailableError, one line naming what is
    missing (a folder, ``AWS_ENDPOINT_URL``, credentials), if it cannot be listed.

    A folder that does not exist yet passes: the first upload creates it.
    """

    async def check() -> None:
        store = open_store(settings.store, **settings.store_options)
        try:
            await store.check()
        finally:
            await store.close()

    asyncio.run(check())


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """``uvicorn.run`` / ``uvicorn.Config`` options that apply the service's connection limits.

    From ``settings`` (docs/SERVICE.md, "Limits"): a deadline for each request's head (the
    service's own h11 protocol, :mod:`.protocol`, since uvicorn has none), the keep-alive
    idle time, and the number of connections and requests beyond which uvicorn answers 503.
    """
    return {
        "http": protocol_with_timeout(settings.header_timeout_seconds),
        "timeout_keep_alive": settings.keep_alive_seconds,
        "limit_concurrency": settings.limit_concurrency,
        "h11_max_incomplete_event_size": MAX_HEAD_BYTES,
        "access_log": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
    }


def serve(settings: Settings | None = None, *, log_level: str = "info") -> None:
    """Serve until interrupted; OpenBindingError if tokens are missing off loopback,
    StoreUnavailableError if the store cannot be listed (:func:`check_store`).

    Logs go to stderr; the access log (logger ``gradvault.access``) to stdout, one JSON
    object per request. uvicorn's own access log is off.
    """
    if settings is None:
        settings = Settings()
    check_binding(settings)
    check_store(settings)
    serve_checked(settings, log_level=log_level)


def serve_checked(settings: Settings, *, log_level: str = "info") -> None:
    """:func:`serve` for a caller that has run :func:`check_binding` and :func:`check_store`
    itself (``gradvault serve``, to refuse before it says it serves): the store is not
    listed a second time."""
    _configure_logging(log_level)
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        **uvicorn_options(settings),
    )
