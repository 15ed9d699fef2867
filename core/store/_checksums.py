"""crc32c: the manifest's checksum text, and the algebra that combines chunk checksums."""

from __future__ import annotations

import functools
import re
from typing import Any

import crc32c
import numpy as np

_CHECKSUM_PREFIX = "crc32c:"
_CHECKSUM_TEXT = re.compile(r"crc32c:[0-9a-fA-F]{8}")


def format_checksum(value: int) -> str:
    return f"{_CHECKSUM_PREFIX}{value:08x}"


def format_checksums(values: list[int]) -> list[str]:
    """:func:`format_checksum` of each value, hex-encoded at once (10,000: 1.5 ms, not 2.3)."""
    digits = np.asarray(values, dtype=">u4").tobytes().hex()
    return [_CHECKSUM_PREFIX + digits[start : start + 8] for start in range(0, len(digits), 8)]


def parse_checksum(text: object) -> int:
    """The crc32c a manifest's ``"crc32c:<8 hex digits>"`` names; ValueError otherwise.

    The one rule for checksum text: manifest validation checks every entry with it.
    """
    if type(text) is not str or not _CHECKSUM_TEXT.fullmatch(text):
        raise ValueError(f"checksum is 'crc32c:<8 hex digits>'; got {text!r}")
    return int(text[len(_CHECKSUM_PREFIX) :], 16)


_CRC32C_POLY = 0x82F63B78


def _gf2_times(matrix: list[int], vector: int) -> int:
    total = 0
    row = 0
    while vector:
        if vector & 1:
            total ^= matrix[row]
        vector >>= 1
        row += 1
    return total


def _gf2_square(matrix: list[int]) -> list[int]:
    return [_gf2_times(matrix, matrix[n]) for n in range(32)]


@functools.lru_cache(maxsize=64)
def _append_zeros_operator(length: int) -> tuple[int, ...]:
    """The GF(2) matrix that advances a crc32c state over ``length`` zero bytes."""
    power = [_CRC32C_POLY] + [1 << n for n in range(31)]  # one zero bit
    for _ in range(3):
        power = _gf2_square(power)  # eight zero bits: one byte
    result = [1 << n for n in range(32)]
    while length:
        if length & 1:
            result = [_gf2_times(power, column) for column in result]
        length >>= 1
        if length:
            power = _gf2_square(power)
    return tuple(result)


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """crc32c of A+B from crc32c(A), crc32c(B) and len(B) (zlib's crc32_combine)."""
    if length_b <= 0:
        return crc_a
    return _gf2_times(list(_append_zeros_operator(length_b)), crc_a) ^ crc_b


#: Bytes checksummed and then written (or read and then checksummed) at a time: small
#: enough that the second touch of a slice finds it still in the CPU's cache, so that each
#: byte goes through memory once.
SLICE_BYTES = 1 << 20


class Crc32cTrailer:
    """The last part of an encoded chunk: the crc32c of the parts before it, 4 bytes LE.

    It is computed by whoever writes the chunk, as it writes the parts (each slice is
    checksummed right before it is written, while it is in cache), and must be resolved
    before the next chunk is taken from the chunk iterator. Afterwards ``running[i]`` is
    the crc32c of parts ``0..i``.
    """

    def __init__(self) -> None:
        self.running: list[int] = []

    def add(self, crc: int) -> None:
        """Record the crc32c of the parts up to the next one."""
        self.running.append(crc)

    def value(self) -> bytes:
        """The trailer's bytes, once every part before it is recorded."""
        return (self.running[-1] if self.running else 0).to_bytes(4, "little")

    def resolve(self, parts: list[Any]) -> bytes:
        """Compute the trailer over ``parts`` (the chunk's parts before it), in one go."""
        crc = 0
        for part in parts:
            crc = crc32c.crc32c(part, value=crc)
            self.add(crc)
        return self.value()


def resolved(parts: list[Any]) -> list[Any]:
    """``parts`` with a final Crc32cTrailer replaced by its bytes (computed here)."""
    if parts and isinstance(parts[-1], Crc32cTrailer):
        return [*parts[:-1], parts[-1].resolve(parts[:-1])]
    return parts
