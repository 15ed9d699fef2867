"""Per-request telemetry: one JSON access-log line and the request metrics.

A plain ASGI middleware rather than Starlette's BaseHTTPMiddleware, which would buffer
streamed responses through a memory channel and hide a stream that breaks half way.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import ServiceMetrics

access_log = logging.getLogger("gradvault.access")

#: the route label of a request that matched no route (never its path: unbounded labels)
UNMATCHED = "unmatched"
#: the method label of a method HTTP does not define (never the method as sent: a client
#: may send any token there, and every new label value is a new series kept for ever)
OTHER_METHOD = "other"
#: the methods labelled as themselves (RFC 9110's, and PATCH)
KNOWN_METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)


def method_label(scope: Scope) -> str:
    """The request's method if HTTP defines it, else ``other``."""
    method = scope["method"]
    return method if method in KNOWN_METHODS else OTHER_METHOD


def route_template(scope: Scope) -> str:
    """The path template of the route that handled the request (``/v1/snapshots/{id}``)."""
    route = scope.get("route")
    return getattr(route, "path", None) or UNMATCHED


class RequestTelemetry:
    """Counts, times and logs every HTTP request that passes through it."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        sent = received = 0
        finished = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def counting_send(message: Message) -> None:
            nonlocal status, sent, finished
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                finished = not message.get("more_body", False)
            await send(message)

        try:
            await self.app(scope, counting_receive, counting_send)
        finally:
            self._record(scope, status, sent, received, started, finished)

    def _record(
        self, scope: Scope, status: int, sent: int, received: int, started: float, finished: bool
    ) -> None:
        elapsed = time.perf_counter() - started
        route = route_template(scope)
        method = method_label(scope)
        metrics = self.metrics
        metrics.requests.labels(method, route, str(status)).inc()
        metrics.latency.labels(method, route).observe(elapsed)
        if sent:
            metrics.bytes_served.labels(route).inc(sent)
        if received:
            metrics.bytes_received.labels(route).inc(received)
        if access_log.isEnabledFor(logging.INFO):
            line: dict[str, Any] = {
                "method": method,
                "route": route,
                "path": scope.get("path", ""),
                "status": status,
                "bytes": sent,
                "bytes_received": received,
                "duration_ms": round(elapsed * 1000, 3),
            }
            if not finished:
                line["aborted"] = True  # the response never sent its last byte
            access_log.info(orjson.dumps(line).decode())
