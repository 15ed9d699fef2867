"""Chunk codecs: a chunk's bytes -> [zstd] -> crc32c chain, as zarr-python encodes it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from numcodecs.zstd import Zstd
from numcodecs.zstd import decompress as zstd_decompress

from ._checksums import Crc32cTrailer, crc32c
from ._zarr_format import Compression

_ZEROS = memoryview(bytes(1 << 16))


def zeros(count: int) -> memoryview:
    """``count`` zero bytes (a view of a shared buffer where it is long enough)."""
    return _ZEROS[:count] if count <= len(_ZEROS) else memoryview(bytes(count))


def encode_chunk(
    payload: memoryview, padding: int, compression: Compression | None
) -> tuple[list[Any], Callable[[], int]]:
    """The parts of one encoded chunk (bytes -> [zstd] -> crc32c) and its payload's crc32c.

    Uncompressed, the parts share the payload's memory (no copy): payload, zero padding,
    then a :class:`Crc32cTrailer` that the writer fills as it writes the bytes before it
    (one pass over them); the payload's crc32c is known once the chunk is written. With
    zstd, the encoded frame and its crc32c, the payload's crc32c computed here.
    """
    if compression is None:
        trailer = Crc32cTrailer()
        parts: list[Any] = [payload, zeros(padding), trailer] if padding else [payload, trailer]
        return parts, lambda: trailer.running[0]
    payload_crc = crc32c(payload)
    raw = bytes(payload) + bytes(padding) if padding else payload
    encoded = Zstd(level=compression.level).encode(raw)
    return [encoded, crc32c(encoded).to_bytes(4, "little")], lambda: payload_crc


#: A zstd block holds at most 128 KiB and takes at least 4 bytes (an RLE block), so no
#: stored chunk can decode to more than this many bytes per stored byte.
ZSTD_MAX_RATIO = 32768


def encoded_size_bounds(padded_length: int, compression: Compression | None) -> tuple[int, int]:
    """The least and the most bytes a stored chunk of ``padded_length`` bytes can take.

    Uncompressed: exactly the bytes plus the crc32c; with zstd: from what the best ratio
    allows to zstd's compress bound (plus frame header) plus the crc32c.
    """
    if compression is None:
        return padded_length + 4, padded_length + 4
    least = 4 + 6 + -(-padded_length // ZSTD_MAX_RATIO)
    return least, 4 + padded_length + (padded_length >> 8) + 1024


def split_crc(chunk: memoryview) -> tuple[memoryview, int]:
    """A stored chunk's body and the crc32c stored after it; ValueError if too short."""
    if len(chunk) < 4:
        raise ValueError(f"chunk is {len(chunk)} bytes, too short for its crc32c")
    return chunk[:-4], int.from_bytes(chunk[-4:], "little")


_ZSTD_MAGIC = 0xFD2FB528


def zstd_content_size(frame: memoryview) -> int | None:
    """The decoded size a zstd frame's header declares (None if it declares none).

    ValueError if ``frame`` does not start with a zstd frame header.
    """
    if len(frame) < 6 or int.from_bytes(frame[:4], "little") != _ZSTD_MAGIC:
        raise ValueError("it is not a zstd frame")
    descriptor = frame[4]
    single_segment = (descriptor >> 5) & 1
    position = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[descriptor & 3]
    width = (single_segment, 2, 4, 8)[descriptor >> 6]
    if not width:
        return None
    if len(frame) < position + width:
        raise ValueError("its zstd frame header is cut short")
    size = int.from_bytes(frame[position : position + width], "little")
    return size + 256 if width == 2 else size


def decompress_into(frame: memoryview, out: memoryview) -> None:
    """Decode the zstd ``frame`` into ``out``, which it must fill exactly; ValueError if not.

    The frame's declared size is checked before decoding, and the decoder never writes
    past ``out``: a frame cannot make the reader allocate what its header claims.
    """
    declared = zstd_content_size(frame)
    if declared is not None and declared != len(out):
        raise ValueError(f"it decodes to {declared} bytes; expected {len(out)}")
    try:
        zstd_decompress(frame, out)
    except (RuntimeError, ValueError) as error:
        raise ValueError(f"its zstd frame does not decode: {error}") from None
