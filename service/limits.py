"""RequestLimits: how much of a request body the service reads, and how long it waits for it.

A plain ASGI middleware that wraps ``receive``, so that every limit is checked before a
byte is buffered:

- A route that reads its body whole (the login form) reads at most ``max_body_bytes``:
  a larger ``Content-Length`` is refused before the first byte is read, and a body sent
  without one (chunked) as soon as what arrived passes the limit (413). Routes that stream
  their body to disk (uploads) bound it themselves, with ``max_upload_bytes``.
- While a request's body is incomplete, each wait for its next part lasts at most
  ``body_timeout_seconds`` (408), so a client that stops sending half way does not hold a
  request open for ever. Once the body is complete, ``receive`` only waits for the client
  to go away, which is not bounded.

Both refusals are raised from ``receive``, that is inside the route, so the service's one
error handler answers them (and the metrics know the route). Their answer closes the
connection: the rest of a refused body is not worth reading.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import RequestTimeoutError, UploadTooLargeError


def declared_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` as a number, None when absent or not a number.

    A malformed one never reaches the app: the HTTP parser refuses it (400).
    """
    for name, value in scope["headers"]:
        if name == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


def _route_name(scope: Scope) -> str:
    route = scope.get("route")
    return f"{scope['method']} {getattr(route, 'path', None) or scope.get('path', '')}"


class RequestLimits:
    """Bounds the body a route reads whole, and the wait for each part of any body."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        body_timeout_seconds: float,
        streamed_endpoints: Collection[Callable[..., Any]],
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_seconds = body_timeout_seconds
        self.streamed_endpoints = frozenset(streamed_endpoints)

    def _limit(self, scope: Scope) -> int | None:
        """The most body bytes the route will take; None for one that streams and bounds it."""
        endpoint = getattr(scope.get("route"), "endpoint", None)
        return None if endpoint in self.streamed_endpoints else self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        received = 0
        started = complete = refused = False

        async def limited_receive() -> Message:
            nonlocal received, started, complete, refused
            if complete:
                return await receive()  # nothing but the client going away comes now
            limit = self._limit(scope)
            if not started:
                started = True
                length = declared_length(scope)
                if limit is not None and length is not None and length > limit:
                    refused = True
                    raise UploadTooLargeError(
                        f"the request body is {length} bytes (Content-Length); "
                        f"{_route_name(scope)} reads at most {limit} bytes (max_body_bytes)"
                    )
            try:
                async with asyncio.timeout(self.body_timeout_seconds):
                    message = await receive()
            except TimeoutError:
                refused = True
                raise RequestTimeoutError(
                    f"the request body stopped arriving: nothing for "
                    f"{self.body_timeout_seconds:g} s after {received} bytes "
                    f"(body_timeout_seconds)"
                ) from None
            if message["type"] != "http.request":
                complete = True
                return message
            received += len(message.get("body", b""))
            complete = not message.get("more_body", False)
            if limit is not None and received > limit:
                refused = True
                raise UploadTooLargeError(
                    f"the request body passed {limit} bytes ({received} arrived); "
                    f"{_route_name(scope)} reads at most {limit} bytes (max_body_bytes)"
                )
            return message

        async def closing_send(message: Message) -> None:
            if refused and message["type"] == "http.response.start":
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, limited_receive, closing_send)
