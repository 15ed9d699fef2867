"""Conditional and range requests on a byte resource, as RFC 9110 sections 13 and 14 say."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import RangeNotSatisfiableError

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


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether If-None-Match names ``etag`` (weak comparison) or is ``*``: answer 304."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    wanted = etag.removeprefix("W/")
    return any(
        candidate.strip().removeprefix("W/") == wanted for candidate in if_none_match.split(",")
    )


def range_applies(if_range: str | None, etag: str) -> bool:
    """Whether a Range header is honoured: no If-Range, or one naming this strong ETag."""
    return if_range is None or if_range.strip() == etag
