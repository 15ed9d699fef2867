"""Streaming verified bytes out: the first piece before the response starts, the rest after.

The store checks every chunk's crc32c as it streams. A damaged chunk found before the
first byte is sent becomes an ordinary error response (500, ChecksumMismatchError); one
found later cannot change the status any more, so the error is logged, counted, and
raised inside the body iterator: the server then closes the connection without the final
chunk (TransferAborted), and the client sees a broken transfer rather than wrong bytes
that look complete.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterator

from fastapi.responses import StreamingResponse

from gradvault.core import ChecksumMismatchError, GradvaultError

from .metrics import ServiceMetrics

_log = logging.getLogger("gradvault.service")

#: The most handed to the server at once, as a copy of its own. A stored chunk (32 MiB by
#: default) goes out in slices of this size: the HTTP layer copies what it is given (h11
#: joins it into bytes, the transport keeps what the socket did not take), so a whole
#: chunk at once would cost another chunk's worth of memory per response. A copy that
#: is ``bytes`` already is passed on by h11 as is, and holds no reference to the chunk:
#: once its last slice is out, nothing the server or the framework keeps (Starlette's
#: loop keeps the last body part while it asks for the next) holds the chunk alive.
SEND_BYTES = 256 << 10


def _slices(piece: bytes | memoryview) -> Iterator[bytes]:
    """``piece`` as copies of at most SEND_BYTES, made one at a time as they are sent."""
    view = memoryview(piece).cast("B")
    del piece
    for start in range(0, len(view), SEND_BYTES):
        yield bytes(view[start : start + SEND_BYTES])


class TransferAborted(Exception):
    """Raised inside a response body to make the server drop the connection.

    Deliberately not a GradvaultError: once the response has started, no error handler
    may answer it; it must reach the server, which closes the connection.
    """


class OctetStreamResponse(StreamingResponse):
    """A streamed binary body (documents ``application/octet-stream`` in OpenAPI)."""

    media_type = "application/octet-stream"


async def started_stream(
    pieces: AsyncIterator[bytes | memoryview],
    *,
    what: Callable[[], str],
    metrics: ServiceMetrics,
) -> AsyncIterator[bytes | memoryview]:
    """``pieces`` with its first piece already read (errors in it raise here, not later).

    ``what`` names the resource for the log line of a failure after the response started.
    """
    try:
        first = await anext(pieces)
    except StopAsyncIteration:
        first = None

    async def body() -> AsyncIterator[bytes | memoryview]:
        nonlocal first
        # No name may keep a sent chunk alive while the next one is read: the chunk goes
        # out as copies of a slice each, and is dropped before the next one is asked for,
        # so a response holds one stored chunk at a time, never two.
        piece, first = first, None
        try:
            while piece is not None:
                slices, piece = _slices(piece), None
                for part in slices:
                    yield part
                del slices
                piece = await anext(pieces, None)
        except GradvaultError as error:
            name = type(error).__name__
            metrics.errors.labels(name).inc()
            level = logging.ERROR if isinstance(error, ChecksumMismatchError) else logging.WARNING
            _log.log(level, "aborted the transfer of %s: %s: %s", what(), name, error)
            raise TransferAborted(f"aborted the transfer of {what()}: {error}") from error

    return body()


async def prefixed(
    prefix: bytes, pieces: AsyncIterator[bytes | memoryview] | None
) -> AsyncIterator[bytes | memoryview]:
    """``prefix`` (if any), then ``pieces`` (if any)."""
    if prefix:
        yield prefix
    if pieces is not None:
        async for piece in pieces:
            yield piece
            del piece  # not kept while the next piece is read
