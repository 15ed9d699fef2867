"""crc32c: the manifest's checksum text, and the algebra that combines chunk checksums."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

import crc32c_rs
import numpy as np

_CHECKSUM_PREFIX = "crc32c:"
_CHECKSUM_TEXT = re.compile(r"crc32c:[0-9a-fA-F]{8}")


def crc32c(data: Any, value: int = 0) -> int:
    """The crc32c of ``data`` continued from ``value``, the crc32c of the bytes before it.

    ``value`` 0 (no bytes before) gives ``data``'s own crc32c, so a running checksum is
    ``crc = crc32c(piece, crc)`` piece after piece. ``data`` is any C-contiguous buffer
    (ValueError or BufferError otherwise). Every checksum of gradient bytes the store
    takes goes through here, but a float32 gradient's as a commit writes it where the C
    extension takes it with the stats (``StatsAccumulator.add_checksummed``). It is the
    ``crc32c-rs`` package's: folding with carry-less multiplies where the CPU has them
    (AVX-512 VPCLMULQDQ here, 2.5 times the speed of the ``crc32c`` package's crc32
    instructions), releasing the GIL while it runs, so the store's writing and reading
    threads checksum in parallel (docs/FORMAT.md, "Checksums")."""
    return crc32c_rs.crc32c(data, value)


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


_CRC32C_POLY = 0x82F63B78  # Castagnoli, bit-reflected, x^32 implied


def _multiply_mod_poly(a: int, b: int) -> int:
    """a(x) * b(x) modulo the crc32c polynomial, both in the crc's reflected bit order."""
    product = 0
    mask = 1 << 31
    while a & ((mask << 1) - 1):
        if a & mask:
            product ^= b
            a ^= mask
        mask >>= 1
        b = (b >> 1) ^ _CRC32C_POLY if b & 1 else b >> 1
    return product


def _x_to_power_of_two_table() -> tuple[int, ...]:
    """``x^(2^k)`` modulo the polynomial for k = 0..66, enough for any length below 2**64
    bytes (x^1 is bit 30 when reflected)."""
    table = [1 << 30]
    for _ in range(66):
        table.append(_multiply_mod_poly(table[-1], table[-1]))
    return tuple(table)


_X_TO_POWER_OF_TWO = _x_to_power_of_two_table()


@functools.lru_cache(maxsize=256)
def _shift_operator(length: int) -> int:
    """``x^(8 * length)`` modulo the polynomial: appending ``length`` zero bytes to a crc
    state multiplies it by this (zlib's x2nmodp). A new length costs 0.03 ms here, against
    5.6 ms for the 32 x 32 GF(2) matrix powers this replaced: a restore of gradients of
    many sizes meets a new length per gradient."""
    power = 1 << 31  # x^0
    exponent = 3  # one byte is x^8 = x^(2^3)
    while length:
        if length & 1:
            power = _multiply_mod_poly(_X_TO_POWER_OF_TWO[exponent], power)
        length >>= 1
        exponent += 1
    return power


def crc32c_combine(crc_a: int, crc_b: int, length_b: int) -> int:
    """crc32c of A+B from crc32c(A), crc32c(B) and len(B) (zlib's crc32_combine).

    The crc of A is shifted past B's length and added (GF(2)): the crc is linear in its
    input once the pre- and post-inversions cancel, so crc32c(A) = 0 (A empty) gives
    crc32c(B) with no work, the case of a gradient's first chunk.
    """
    if length_b <= 0:
        return crc_a
    if crc_a == 0:
        return crc_b
    return _multiply_mod_poly(_shift_operator(length_b), crc_a) ^ crc_b


@functools.lru_cache(maxsize=256)
def _shift_table(length: int) -> tuple[tuple[int, ...], ...]:
    """:func:`_shift_operator` of ``length`` as eight tables, one per 4 bits of the crc
    it multiplies: the product is then eight lookups (:func:`_shift`), not the 32 steps of
    :func:`_multiply_mod_poly` (10 us here). Made once per length (about the cost of two
    products): a trainer's one-step commits meet the same lengths at every step."""
    operator = _shift_operator(length)
    # the operator times each power of x: bit j of a crc (reflected) is x^(31 - j)
    times_bit = [0] * 32
    for bit in range(31, -1, -1):
        times_bit[bit] = operator
        operator = (operator >> 1) ^ _CRC32C_POLY if operator & 1 else operator >> 1
    tables = []
    for low in range(0, 32, 4):
        table = [0] * 16
        for value in range(1, 16):
            lowest = value & -value
            table[value] = table[value ^ lowest] ^ times_bit[low + lowest.bit_length() - 1]
        tables.append(tuple(table))
    return tuple(tables)


def _shift(length: int, crc: int) -> int:
    """``crc`` with ``length`` zero bytes appended (``_multiply_mod_poly`` by the length's
    shift operator), by table."""
    t0, t1, t2, t3, t4, t5, t6, t7 = _shift_table(length)
    return (
        t0[crc & 15]
        ^ t1[crc >> 4 & 15]
        ^ t2[crc >> 8 & 15]
        ^ t3[crc >> 12 & 15]
        ^ t4[crc >> 16 & 15]
        ^ t5[crc >> 20 & 15]
        ^ t6[crc >> 24 & 15]
        ^ t7[crc >> 28 & 15]
    )


def crc32c_of_tail(crc_whole: int, crc_head: int, length_tail: int) -> int:
    """crc32c of B from crc32c(A+B), crc32c(A) and len(B): :func:`crc32c_combine` undone.

    A running checksum taken over parts written back to back gives each part's own
    checksum this way, with no second pass over its bytes.
    """
    if crc_head == 0 or length_tail <= 0:
        return crc_whole if length_tail > 0 else 0
    return _shift(length_tail, crc_head) ^ crc_whole


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

    #: The trailer's length in the chunk
    BYTES = 4

    def __init__(self) -> None:
        self.running: list[int] = []
        #: where the writer read every part in one call (``crc32c_parts``), what it took of
        #: each: ``(running, own)`` crc32c, and of a ``ReadAlong`` part marked ``whole``
        #: ``(running, own, min, max, sum of squares)``; None where it read them otherwise
        self.whole: list[tuple[Any, ...]] | None = None

    def add(self, crc: int) -> None:
        """Record the crc32c of the parts up to the next one."""
        self.running.append(crc)

    def value(self) -> bytes:
        """The trailer's bytes, once every part before it is recorded."""
        return (self.running[-1] if self.running else 0).to_bytes(self.BYTES, "little")

    def resolve(self, parts: list[Any]) -> bytes:
        """Compute the trailer over ``parts`` (the chunk's parts before it), in one go,
        each ReadAlong's slices visited as they are checksummed (:meth:`ReadAlong.take`)."""
        crc = 0
        for part in parts:
            if isinstance(part, ReadAlong):
                for piece in part.slices():
                    crc = part.take(piece, crc)
            else:
                crc = crc32c(part, crc)
            self.add(crc)
        return self.value()


class ReadAlong:
    """A part of an encoded chunk whose bytes someone else reads too, in the write's pass.

    The writer hands each slice of ``data`` (in order from its start, SLICE_BYTES at a
    time, or longer spans where it writes them from their own memory) to ``visit`` right
    after it has copied or written and checksummed it, while the slice is still in the
    CPU's cache: a gradient's stats are taken in the same pass as its crc32c and its
    write. A writer that checksums as it goes hands each slice to :meth:`take`, which
    takes both in one pass where ``checksum_and_visit`` is given (``(slice, crc) ->`` the
    crc32c continued over the slice, the slice visited). A writer that does not write
    slice by slice hands them all over first (:func:`resolved`).

    A part of float32 values may say so (``whole``): a writer that checksums every part
    of a file in one call of the C extension (``crc32c_parts``: the parts' crc32c and
    their values' min, max and sum of squares in one pass) then hands over no slice, and
    leaves what the pass took of each part in the trailer (``Crc32cTrailer.whole``).
    """

    __slots__ = ("checksum_and_visit", "data", "visit", "whole")

    def __init__(
        self,
        data: memoryview,
        visit: Callable[[memoryview], None],
        checksum_and_visit: Callable[[memoryview, int], int] | None = None,
        whole: bool = False,
    ) -> None:
        self.data = memoryview(data).cast("B")
        self.visit = visit
        self.checksum_and_visit = checksum_and_visit
        self.whole = whole

    def take(self, piece: memoryview, crc: int) -> int:
        """Visit ``piece`` (a slice of ``data``, in order) and return the crc32c continued
        over it from ``crc``."""
        if self.checksum_and_visit is not None:
            return self.checksum_and_visit(piece, crc)
        crc = crc32c(piece, crc)
        self.visit(piece)
        return crc

    def slices(self) -> Iterator[memoryview]:
        """``data`` in order, SLICE_BYTES at a time."""
        for start in range(0, len(self.data), SLICE_BYTES):
            yield self.data[start : start + SLICE_BYTES]

    def visit_all(self) -> memoryview:
        """Hand every slice to ``visit`` now; the bytes."""
        for piece in self.slices():
            self.visit(piece)
        return self.data


def plain(parts: list[Any]) -> list[Any]:
    """``parts`` with every ReadAlong visited whole and replaced by its bytes."""
    if not any(isinstance(part, ReadAlong) for part in parts):
        return parts
    return [part.visit_all() if isinstance(part, ReadAlong) else part for part in parts]


def resolved(parts: list[Any]) -> list[Any]:
    """``parts`` with a final Crc32cTrailer replaced by its bytes (computed here), and every
    ReadAlong visited (as it is checksummed, where there is a trailer) and replaced by its
    bytes."""
    if not parts or not isinstance(parts[-1], Crc32cTrailer):
        return plain(parts)
    body = parts[:-1]
    trailer = parts[-1].resolve(body)
    return [*(part.data if isinstance(part, ReadAlong) else part for part in body), trailer]
