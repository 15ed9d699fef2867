"""Snapshot ids: 26-character, time-sortable, collision-free without coordination.

An id is 128 bits written in Crockford base32 (ULID layout): the top 48 bits are the
creation time in milliseconds since the Unix epoch, the low 80 bits are random. The text
form is 26 characters from ``0123456789ABCDEFGHJKMNPQRSTVWXYZ`` (uppercase only; the
first is ``0``-``7`` because 26 x 5 = 130 bits carry two leading zero bits). Sorting the
text sorts by creation time; within one process, ids made in the same millisecond
increase monotonically (the random part is incremented), so they also sort in creation
order. Two writers on different machines collide only if they draw the same 80 random
bits in the same millisecond.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from datetime import UTC, datetime

from ..errors import InvalidSnapshotIdError, shown

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_DECODE = {char: index for index, char in enumerate(_ALPHABET)}
_TEXT = re.compile(r"[0-7][0-9A-HJKMNP-TV-Z]{25}")
_RANDOM_BITS = 80

_lock = threading.Lock()
_last_ms = -1
_last_random = 0


def _encode(value: int) -> str:
    chars = []
    for _ in range(26):
        chars.append(_ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_snapshot_id() -> str:
    """A fresh snapshot id: later ids sort after earlier ones (see the module docstring)."""
    global _last_ms, _last_random
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms <= _last_ms:
            # Same millisecond (or the clock stepped back): stay monotonic in this process.
            now_ms, random_part = _last_ms, _last_random + 1
            if random_part >= 1 << _RANDOM_BITS:
                now_ms, random_part = now_ms + 1, secrets.randbits(_RANDOM_BITS - 1)
        else:
            random_part = secrets.randbits(_RANDOM_BITS)
        _last_ms, _last_random = now_ms, random_part
    return _encode((now_ms << _RANDOM_BITS) | random_part)


def is_snapshot_id(text: object) -> bool:
    """Whether ``text`` is a well-formed snapshot id."""
    return isinstance(text, str) and _TEXT.fullmatch(text) is not None


def parse_snapshot_id(text: str) -> str:
    """``text`` if it is a well-formed snapshot id; InvalidSnapshotIdError otherwise."""
    if not isinstance(text, str) or not _TEXT.fullmatch(text):
        raise InvalidSnapshotIdError(
            f"a snapshot id is 26 uppercase Crockford base32 characters "
            f"(e.g. {new_snapshot_id()!r}); got {shown(text)}"
        )
    return text


def snapshot_id_time_ms(snapshot_id: str) -> int:
    """The creation time encoded in a (valid) snapshot id, in ms since the epoch."""
    value = 0
    for char in parse_snapshot_id(snapshot_id)[:10]:
        value = (value << 5) | _DECODE[char]
    return value


def iso_utc(time_ms: int) -> str:
    """``time_ms`` as an ISO 8601 UTC timestamp with milliseconds, e.g. ``...T12:00:00.123Z``."""
    seconds, millis = divmod(time_ms, 1000)
    moment = datetime.fromtimestamp(seconds, tz=UTC).replace(microsecond=millis * 1000)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
