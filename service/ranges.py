"""Conditional and range requests on a byte resource, as RFC 9110 sections 13 and 14 say.

:func:`ranged_response` is the one place the service answers them: every resource it
serves as bytes (a gradient, a snapshot's safetensors file, a key of the Zarr view, and
the pages' downloads of the first two) is a :class:`RangedResource` handed to it. In
RFC 9110's order: ``If-None-Match`` naming the ETag (or ``*``) is a 304; ``HEAD`` is
the headers of the whole resource (a Range is defined for GET only); ``If-Range`` that
is not the resource's strong ETag (or any ``If-Range`` on a resource without one) drops
the Range; one satisfiable Range is a 206 with ``Content-Range``, one that misses is a
416 (RangeNotSatisfiableError); anything else is the whole resource, 200.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.responses import Response, StreamingResponse

from .errors import RangeNotSatisfiableError
from .metrics import ServiceMetrics
from .streaming import prefixed, started_stream

#: the media type of a 206: a part of a resource is bytes, whatever the whole is (a range
#: of a ``zarr.json`` document is not a JSON document)
PART_MEDIA_TYPE = "application/octet-stream"

_RANGE_SPEC = re.compile(r"(\d*)-(\d*)")


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``start`` to ``stop`` (exclusive) of a resource of ``size`` bytes."""

    start: int
    stop: int
    size: int

    @property
    def length(self) -> int:
        return self.stop - self.start

    @property
    def content_range(self) -> str:
        return f"bytes {self.start}-{self.stop - 1}/{self.size}"


def _parse_specs(header: str) -> list[tuple[int | None, int | None]] | None:
    """The (first, last) pairs of a ``bytes=`` header; None if it is not valid syntax."""
    unit, equals, specs = header.partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return None
    parsed: list[tuple[int | None, int | None]] = []
    for spec in specs.split(","):
        match = _RANGE_SPEC.fullmatch(spec.strip())
        if match is None or not (match[1] or match[2]):
            return None
        first = int(match[1]) if match[1] else None
        last = int(match[2]) if match[2] else None
        if first is not None and last is not None and last < first:
            return None  # an invalid range-spec makes the whole header invalid
        parsed.append((first, last))
    return parsed


def select_range(header: str | None, size: int) -> ByteRange | None:
    """The one range to send (206), or None to send the whole resource (200).

    A header that is absent, malformed, of another unit, or asks for several ranges is
    answered with the whole resource, as RFC 9110 allows; one whose ranges all miss the
    resource raises RangeNotSatisfiableError (416, ``Content-Range: bytes */size``).
    """
    if header is None or size == 0:
        return None
    specs = _parse_specs(header)
    if specs is None:
        return None
    satisfiable = []
    for first, last in specs:
        if first is None:  # suffix: the last `last` bytes
            if last:
                satisfiable.append(ByteRange(max(0, size - last), size, size))
        elif first < size:
            stop = size if last is None else min(last + 1, size)
            satisfiable.append(ByteRange(first, stop, size))
    if not satisfiable:
        raise RangeNotSatisfiableError(
            f"Range {header[:200]!r} asks for no byte of the {size} there are", size
        )
    return satisfiable[0] if len(specs) == 1 else None


def etag_matches(if_none_match: str | None, etag: str | None) -> bool:
    """Whether If-None-Match names ``etag`` (weak comparison) or is ``*``: answer 304.

    ``*`` matches any resource that exists, one without an ETag (None) included.
    """
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    if etag is None:
        return False
    wanted = etag.removeprefix("W/")
    return any(
        candidate.strip().removeprefix("W/") == wanted for candidate in if_none_match.split(",")
    )


def range_applies(if_range: str | None, etag: str | None) -> bool:
    """Whether a Range header is honoured: no If-Range, or one naming this strong ETag.

    A resource without an ETag (None) matches no If-Range: it has no Last-Modified
    either, so the validator cannot be its own and the whole resource is sent.
    """
    return if_range is None or (etag is not None and if_range.strip() == etag)


@dataclass(frozen=True)
class Conditions:
    """What a request asks of a byte resource: its method, Range and validators."""

    method: str = "GET"
    range: str | None = None
    if_none_match: str | None = None
    if_range: str | None = None


class RangedResource(ABC):
    """A resource of ``size`` bytes that :func:`ranged_response` serves.

    Subclasses set the attributes and say how bytes ``[start, stop)`` are read.
    """

    #: its length in bytes
    size: int
    #: its strong validator (``"..."``), or None when it has none
    etag: str | None = None
    #: the media type of the whole resource (a 200)
    media_type: str = "application/octet-stream"
    #: headers sent with every answer about it (200, 206, 304, HEAD), besides ETag and
    #: Accept-Ranges
    headers: dict[str, str]

    @abstractmethod
    def describe(self) -> str:
        """The resource named for a log line (a transfer broken after it started)."""

    @abstractmethod
    def open(self, start: int, stop: int) -> tuple[bytes, AsyncIterator[bytes | memoryview] | None]:
        """Bytes ``[start, stop)``: those already in memory, sent first, then those read
        from the store (None if none is), whose first piece is read before the response
        starts."""

    async def aclose(self) -> None:  # noqa: B027 - most resources hold nothing open
        """Let go of what was opened to describe the resource and not handed to ``open``."""


async def ranged_response(
    conditions: Conditions, resource: RangedResource, metrics: ServiceMetrics
) -> Response:
    """The answer to ``conditions`` about ``resource``: 304, HEAD's 200, 206, or 200.

    A Range that misses the resource raises RangeNotSatisfiableError (416). The stored
    bytes are streamed, verified, with their first piece read before the response
    starts, so that an error there is an ordinary error response (:mod:`.streaming`).
    """
    headers = {"ETag": resource.etag} if resource.etag is not None else {}
    headers.update(resource.headers)
    headers["Accept-Ranges"] = "bytes"
    try:
        if etag_matches(conditions.if_none_match, resource.etag):
            return Response(status_code=304, headers=headers)
        if conditions.method == "HEAD":
            headers["Content-Length"] = str(resource.size)
            return Response(status_code=200, headers=headers, media_type=resource.media_type)
        chosen = None
        if range_applies(conditions.if_range, resource.etag):
            chosen = select_range(conditions.range, resource.size)
        start, stop = (chosen.start, chosen.stop) if chosen else (0, resource.size)
        held, stored = resource.open(start, stop)
    finally:
        await resource.aclose()
    if stored is not None:
        stored = await started_stream(stored, what=resource.describe, metrics=metrics)
    body = prefixed(held, stored)
    headers["Content-Length"] = str(stop - start)
    if chosen is None:
        return StreamingResponse(body, headers=headers, media_type=resource.media_type)
    headers["Content-Range"] = chosen.content_range
    return StreamingResponse(body, status_code=206, headers=headers, media_type=PART_MEDIA_TYPE)
