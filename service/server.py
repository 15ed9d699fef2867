"""serve: run the app under uvicorn, refusing an open service on a reachable address."""

from __future__ import annotations

import logging

import uvicorn

from .app import create_app
from .settings import Settings, check_binding

_log = logging.getLogger("gradvault.service")


def serve(settings: Settings | None = None, *, log_level: str = "info") -> None:
    """Serve until interrupted; OpenBindingError if tokens are missing off loopback."""
    if settings is None:
        settings = Settings()
    check_binding(settings)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if settings.is_open:
        _log.warning(
            "no tokens configured: the service is open, bound to %s:%d only",
            settings.host,
            settings.port,
        )
    app = create_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=log_level)
