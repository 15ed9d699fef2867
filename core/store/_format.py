"""The on-disk format: Zarr v3 metadata documents, chunk layout, chunk codecs and stats.

Everything here is pure computation (no I/O), so the local and the S3 backends share it.
zarr-python is not used on the write path (creating one array through it costs ~3 ms);
instead this module writes the same ``zarr.json`` documents zarr-python writes and encodes
chunks exactly as its ``bytes`` -> ``zstd`` -> ``crc32c`` codec chain does. docs/FORMAT.md
describes the result; tests/core/test_store.py pins it against zarr-python itself.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import crc32c
import numpy as np
import orjson
from numcodecs.zstd import Zstd
from numcodecs.zstd import decompress as zstd_decompress

from ..bfloat16 import BFLOAT16_NAME, COMPUTE_DTYPE, bfloat16

#: Version of the snapshot layout and manifest (``attributes["gradvault"]["format_version"]``).
STORE_FORMAT_VERSION = 1
#: Name of the array that holds the packed small gradients of a snapshot.
PACKED_ARRAY = "packed"
#: Every gradient in the packed array starts at a multiple of this many bytes.
PACK_ALIGNMENT = 8
#: Gradients smaller than this many bytes are packed (by default).
DEFAULT_PACK_THRESHOLD = 64 * 1024
#: Target size of one chunk, before the crc32c suffix (by default).
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024

_CHECKSUM_PREFIX = "crc32c:"


@dataclass(frozen=True)
class Compression:
    """A zstd level; ``None`` in its place means chunks are stored uncompressed."""

    level: int = 3

    @property
    def codec(self) -> dict[str, Any]:
        return {"name": "zstd", "configuration": {"level": self.level, "checksum": False}}


def parse_compression(text: str | None) -> Compression | None:
    """``None`` for no compression, ``"zstd"`` or ``"zstd:<level>"``; ValueError otherwise."""
    if text is None or text == "none":
        return None
    name, _, level = text.partition(":")
    if name != "zstd" or (level and not level.lstrip("-").isdigit()):
        raise ValueError(f"compression is None, 'zstd' or 'zstd:<level>'; got {text!r}")
    return Compression(int(level)) if level else Compression()


# --- Zarr v3 metadata documents -------------------------------------------------------


def _fill_value(dtype: str) -> bool | int | float:
    if dtype == "bool":
        return False
    return 0.0 if dtype.startswith("float") or dtype == BFLOAT16_NAME else 0


def array_metadata(
    shape: tuple[int, ...],
    dtype: str,
    chunk_shape: tuple[int, ...],
    compression: Compression | None,
    attributes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``zarr.json`` zarr-python 3.1 writes for such an array (key order included)."""
    bytes_codec: dict[str, Any] = {"name": "bytes"}
    if np.dtype(dtype).itemsize > 1:
        bytes_codec["configuration"] = {"endian": "little"}
    codecs = [bytes_codec]
    if compression is not None:
        codecs.append(compression.codec)
    codecs.append({"name": "crc32c"})
    return {
        "shape": list(shape),
        "data_type": dtype,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill_value(dtype),
        "codecs": codecs,
        "attributes": attributes or {},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def group_metadata(attributes: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``zarr.json`` zarr-python writes for a group with these attributes."""
    return {"attributes": attributes or {}, "zarr_format": 3, "node_type": "group"}


def dump_json(document: dict[str, Any], *, compact: bool = False) -> bytes:
    """``document`` as UTF-8 JSON; strict (NaN and Infinity are never written bare).

    Small documents are laid out as zarr-python writes them (indent 2). ``compact`` is for
    the manifest, whose gradient columns the manifest code has already made strict (no
    NaN or Infinity): orjson encodes the 10,000-gradient manifest in 1 ms against 18 ms
    for the standard library (measured here).
    """
    if compact:
        return orjson.dumps(document)
    return json.dumps(document, indent=2, allow_nan=False).encode()


# --- chunk layout ---------------------------------------------------------------------


@dataclass(frozen=True)
class ChunkSpan:
    """One chunk: its key under the array, and the bytes of the C-order data it holds.

    ``length`` bytes from ``start`` are data; the chunk is ``padded_length`` bytes long
    before encoding (an edge chunk is padded with zeros, as Zarr stores edge chunks whole).
    """

    key: str
    start: int
    length: int
    padded_length: int


def chunk_shape_for(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> tuple[int, ...]:
    """Chunks of about ``chunk_bytes`` that are contiguous runs of the C-order bytes.

    The shape is ``(1, ..., 1, k, *shape[a+1:])`` where ``a`` is the first axis whose
    trailing block fits in ``chunk_bytes``; each chunk is then one contiguous byte range.
    """
    if not shape:
        return ()
    if 0 in shape:
        return tuple(max(1, n) for n in shape)
    for axis in range(len(shape)):
        inner = itemsize * math.prod(shape[axis + 1 :])
        if inner <= chunk_bytes or axis == len(shape) - 1:
            rows = max(1, min(shape[axis], chunk_bytes // inner))
            return (1,) * axis + (rows,) + tuple(shape[axis + 1 :])
    raise AssertionError("unreachable")


def iter_chunk_spans(
    shape: tuple[int, ...], chunk_shape: tuple[int, ...], itemsize: int, start: int = 0
) -> Iterator[ChunkSpan]:
    """Every chunk of an array laid out by :func:`chunk_shape_for`, in C order of keys.

    Lazy, so that a reader can stop at the first chunk the store does not hold, however
    many chunks a damaged manifest claims. With ``start``, the chunks from the one that
    holds byte ``start`` on (found by arithmetic, not by walking the chunks before it).
    """
    if not shape:
        if start < itemsize:
            yield ChunkSpan("c", 0, itemsize, itemsize)
        return
    if 0 in shape:
        return
    # The split axis: leading axes have chunk extent 1, trailing axes are whole.
    axis = len(shape) - 1
    while axis > 0 and chunk_shape[axis] == shape[axis]:
        axis -= 1
    if any(extent != 1 for extent in chunk_shape[:axis]):
        raise ValueError(f"chunk shape {chunk_shape} of shape {shape} is not contiguous")
    inner = itemsize * math.prod(shape[axis + 1 :])
    rows = chunk_shape[axis]
    row_bytes = shape[axis] * inner  # the bytes of one index of the leading axes
    trailing_zeros = "/0" * (len(shape) - axis - 1)
    first_outer, within = divmod(start, row_bytes)
    first_chunk = within // (rows * inner)
    for flat in range(first_outer, math.prod(shape[:axis])):
        prefix = "".join(f"/{i}" for i in _c_order_unravel(flat, shape[:axis]))
        base = flat * row_bytes
        for j in range(first_chunk if flat == first_outer else 0, -(-shape[axis] // rows)):
            length = min(rows, shape[axis] - j * rows) * inner
            yield ChunkSpan(
                f"c{prefix}/{j}{trailing_zeros}", base + j * rows * inner, length, rows * inner
            )


def _c_order_unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


def chunk_spans(
    shape: tuple[int, ...], chunk_shape: tuple[int, ...], itemsize: int
) -> list[ChunkSpan]:
    """Every chunk of an array laid out by :func:`chunk_shape_for`, in C order of keys."""
    return list(iter_chunk_spans(shape, chunk_shape, itemsize))


def packed_layout(sizes: list[int], chunk_bytes: int) -> tuple[list[int], int, int]:
    """Offsets of gradients of ``sizes`` bytes in the packed array, its length and chunk size.

    Offsets are multiples of PACK_ALIGNMENT; the chunk size splits the array into the
    fewest chunks of at most ``chunk_bytes`` with less than one byte per chunk of padding.
    """
    offsets = []
    end = 0
    for size in sizes:
        start = -(-end // PACK_ALIGNMENT) * PACK_ALIGNMENT
        offsets.append(start)
        end = start + size
    if end == 0:
        return offsets, 0, 1
    count = -(-end // chunk_bytes)
    return offsets, end, -(-end // count)


# --- chunk codecs ---------------------------------------------------------------------

_ZEROS = memoryview(bytes(1 << 16))


def _zeros(count: int) -> memoryview:
    return _ZEROS[:count] if count <= len(_ZEROS) else memoryview(bytes(count))


def encode_chunk(
    payload: memoryview, padding: int, compression: Compression | None
) -> tuple[list[memoryview | bytes], int]:
    """The buffers of one encoded chunk (bytes -> [zstd] -> crc32c) and the payload's crc32c.

    Uncompressed, the buffers share the payload's memory (no copy): payload, zero padding,
    then the 4-byte little-endian crc32c of everything before it.
    """
    payload_crc = crc32c.crc32c(payload)
    if compression is None:
        parts: list[memoryview | bytes] = [payload]
        chunk_crc = payload_crc
        if padding:
            zeros = _zeros(padding)
            parts.append(zeros)
            chunk_crc = crc32c.crc32c(zeros, value=payload_crc)
    else:
        raw = bytes(payload) + bytes(padding) if padding else payload
        encoded = Zstd(level=compression.level).encode(raw)
        parts = [encoded]
        chunk_crc = crc32c.crc32c(encoded)
    parts.append(chunk_crc.to_bytes(4, "little"))
    return parts, payload_crc


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


def format_checksum(value: int) -> str:
    return f"{_CHECKSUM_PREFIX}{value:08x}"


def parse_checksum(text: str) -> int:
    if not text.startswith(_CHECKSUM_PREFIX):
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


# --- stats ----------------------------------------------------------------------------


def _json_float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def _stats_dict(sum_squares: float, max_abs: float, nan_count: int, inf_count: int) -> dict:
    return {
        "l2_norm": _json_float(math.sqrt(sum_squares)),
        "max_abs": _json_float(max_abs),
        "nan_count": nan_count,
        "inf_count": inf_count,
    }


_ZERO_STATS = {"l2_norm": 0.0, "max_abs": 0.0, "nan_count": 0, "inf_count": 0}


def _flat_for_math(array: np.ndarray) -> np.ndarray:
    flat = array.reshape(-1)
    if flat.dtype == bfloat16:  # exact in float32; NumPy math in bf16 would round each step
        return flat.astype(COMPUTE_DTYPE)
    return flat.view(np.uint8) if flat.dtype == np.bool_ else flat


@np.errstate(over="ignore", invalid="ignore")
def _careful_stats(flat: np.ndarray) -> dict:
    """Stats of an array holding NaN or Inf: norms over the finite values, plus counts."""
    nan_count = int(np.count_nonzero(np.isnan(flat)))
    inf_count = int(np.count_nonzero(np.isinf(flat)))
    finite = flat[np.isfinite(flat)]
    if finite.size == 0:
        return _stats_dict(0.0, 0.0, nan_count, inf_count)
    sum_squares = float(np.einsum("i,i->", finite, finite, dtype=np.float64))
    max_abs = max(float(finite.max()), -float(finite.min()))
    return _stats_dict(sum_squares, max_abs, nan_count, inf_count)


_ROW = 1024


def _sum_squares(flat: np.ndarray) -> float:
    """Sum of squares: float32 partial sums over rows of 1024, added up in float64.

    Five times faster than a float64 einsum on float32 data; relative error ~1e-9 on
    normal data (each row's sum carries at most 1024 roundings).
    """
    if flat.dtype != np.float32 or flat.size < 2 * _ROW:
        return float(np.einsum("i,i->", flat, flat, dtype=np.float64))
    whole = flat.size // _ROW * _ROW
    rows = flat[:whole].reshape(-1, _ROW)
    total = float(np.einsum("ij,ij->i", rows, rows).sum(dtype=np.float64))
    tail = flat[whole:]
    return total + float(np.einsum("i,i->", tail, tail, dtype=np.float64))


@np.errstate(over="ignore", invalid="ignore")
def gradient_stats(array: np.ndarray) -> dict:
    """L2 norm and max |g| (float64 accumulation, finite values only) and NaN/Inf counts."""
    if array.size == 0:
        return dict(_ZERO_STATS)
    flat = _flat_for_math(array)
    sum_squares = _sum_squares(flat)
    high, low = flat.max(), flat.min()
    if flat.dtype.kind == "f":
        max_abs = max(float(high), -float(low))
        if not (math.isfinite(sum_squares) and math.isfinite(max_abs)):
            return _careful_stats(flat)
    else:
        max_abs = float(max(int(high), -int(low)))
    return _stats_dict(sum_squares, max_abs, 0, 0)


#: packed_stats squares this many bytes of the packed buffer at a time, in float64 (up to
#: 8 MiB for a 1-byte dtype): its memory stays bounded however large the packed array is.
STATS_WINDOW_BYTES = 2**20


@np.errstate(over="ignore", invalid="ignore")
def packed_stats(
    buffer: bytes, offsets: list[int], sizes: list[int], dtypes: list[str]
) -> dict[str, list]:
    """:func:`gradient_stats` of the gradients packed in ``buffer``, as four columns.

    Vectorised per dtype without touching the gradients one by one: a window of the
    buffer is viewed as that dtype (offsets are aligned, so every gradient of the dtype is
    a run of elements) and ``reduceat`` over interleaved (start, end) indices reduces each
    gradient's run; the even results are the gradients, the odd ones the bytes between
    them, discarded. Windows hold the gradients starting within ``STATS_WINDOW_BYTES`` of
    each other (offsets increase in packing order), so the float64 squares never cover
    the whole buffer at once.
    """
    count = len(offsets)
    sum_squares = np.zeros(count)
    max_abs = np.zeros(count)
    starts_bytes = np.asarray(offsets, dtype=np.intp)
    size_bytes = np.asarray(sizes, dtype=np.intp)
    names = np.asarray(dtypes)
    cuts = (np.flatnonzero(np.diff(starts_bytes // STATS_WINDOW_BYTES)) + 1).tolist()
    for first, stop in itertools.pairwise([0, *cuts, count] if count else []):
        low = int(starts_bytes[first])
        high = int(starts_bytes[stop - 1] + size_bytes[stop - 1])
        window_names = names[first:stop]
        for name in np.unique(window_names).tolist():
            dtype = np.dtype(name)
            positions = first + np.flatnonzero(
                (window_names == name) & (size_bytes[first:stop] > 0)
            )
            if not positions.size:
                continue
            values = np.frombuffer(
                buffer,
                np.uint8 if dtype == np.bool_ else dtype.newbyteorder("<"),
                count=(high - low) // dtype.itemsize,
                offset=low,
            )
            bounds = np.empty(2 * positions.size, dtype=np.intp)
            bounds[0::2] = (starts_bytes[positions] - low) // dtype.itemsize
            bounds[1::2] = bounds[0::2] + size_bytes[positions] // dtype.itemsize
            if bounds[-1] >= values.size:  # the last run ends the window: reduce to the end
                bounds = bounds[:-1]
            squares = np.square(values, dtype=np.float64)
            sum_squares[positions] = np.add.reduceat(squares, bounds)[0::2]
            highs = np.maximum.reduceat(values, bounds)[0::2].astype(np.float64)
            lows = np.minimum.reduceat(values, bounds)[0::2].astype(np.float64)
            max_abs[positions] = np.maximum(highs, -lows)
    columns: dict[str, list] = {
        "l2_norm": np.sqrt(sum_squares).tolist(),
        "max_abs": max_abs.tolist(),
        "nan_count": [0] * count,
        "inf_count": [0] * count,
    }
    for index in np.flatnonzero(~(np.isfinite(sum_squares) & np.isfinite(max_abs))).tolist():
        dtype = np.dtype(dtypes[index]).newbyteorder("<")
        array = np.frombuffer(
            buffer, dtype, count=sizes[index] // dtype.itemsize, offset=offsets[index]
        )
        for key, value in gradient_stats(array).items():
            columns[key][index] = value
    return columns
