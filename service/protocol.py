"""HeaderTimeoutProtocol: uvicorn's HTTP/1.1 protocol with a deadline for a request's head.

It also answers a request that cannot be parsed with the service's JSON error body,
where uvicorn answers in plain text.

uvicorn bounds the idle time between two requests of a kept-alive connection
(``timeout_keep_alive``) but not the time a client takes to send a request line and its
headers: a connection that sends half a request line is held for ever, and enough of them
use up the process's open files, after which no client is served. This protocol gives
each request head a deadline (``header_timeout_seconds``), counted from the connection's
start or from the end of the previous response, and not moved by the bytes that trickle
in. A head still incomplete at the deadline is answered 408 and the connection closed
(a connection that sent nothing is just closed), as nginx's ``client_header_timeout``
does. It works on the protocol, below ASGI, because no ASGI app is called before a
request's head is complete.

It extends uvicorn's h11 protocol (``uvicorn.protocols.http.h11_impl``), which the service
always runs on; ``tests/service/test_limits.py`` pins the behaviour on the installed
uvicorn with real sockets.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

#: what a connection whose head did not arrive in time is told before it is closed
REQUEST_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
REQUEST_TIMEOUT_BODY = (
    b'{"detail":"the request line and headers did not arrive within '
    b'header_timeout_seconds","error":"RequestTimeoutError"}'
)

#: uvicorn answers a request it cannot parse in plain text; the service's errors are JSON
INVALID_REQUEST_BODY = (
    b'{"detail":"the request is not valid HTTP/1.1, or its line and headers are over '
    b'16 KiB","error":"RemoteProtocolError"}'
)


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head is late."""

    #: seconds a request's line and headers may take; set by :func:`protocol_with_timeout`
    header_timeout_seconds: float = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_bytes = 0

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_bytes = 0
        self._head_deadline = self.loop.call_later(
            self.header_timeout_seconds, self._head_deadline_passed
        )

    def _disarm_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _waiting_for_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        waiting = self._waiting_for_head()
        if waiting:
            self._head_bytes += len(data)
        super().data_received(data)
        if waiting and not self._waiting_for_head():
            self._disarm_head_deadline()  # the head is complete: the app has the request
        elif not waiting and self._waiting_for_head() and self._head_deadline is None:
            # the rest of a body arrived after its response, and h11 began the next cycle
            self._arm_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._waiting_for_head():
            self._arm_head_deadline()  # the next request's head, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """Answer a request h11 cannot parse (or a head over 16 KiB) with the JSON error body."""
        body = INVALID_REQUEST_BODY
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        for event in (
            h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
            h11.Data(data=body),
            h11.EndOfMessage(),
        ):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _head_deadline_passed(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing() or not self._waiting_for_head():
            return
        if self._head_bytes:
            body = REQUEST_TIMEOUT_BODY
            self.transport.write(REQUEST_TIMEOUT_RESPONSE % (len(body), body))
        self.transport.close()


def protocol_with_timeout(header_timeout_seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's ``http`` option, with this head deadline."""
    return type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout_seconds": header_timeout_seconds},
    )
