"""The Zarr v3 side of the format: metadata documents, constants and the chunk layout.

Pure computation (no I/O), shared by the local and the S3 backends. zarr-python is not
used on the write path (creating one array through it costs ~3 ms); instead this module
writes the same ``zarr.json`` documents zarr-python writes. docs/FORMAT.md describes the
result; tests/core/store/test_store.py pins it against zarr-python itself.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from ..records.dtypes import BFLOAT16_NAME

#: Version of the snapshot layout and manifest (``attributes["gradvault"]["format_version"]``).
STORE_FORMAT_VERSION = 4
#: Chunk keys are written with this separator (store format 3 on): ``c.0.1``, a file beside
#: the array's ``zarr.json``. Formats 1 and 2 wrote ``c/0/1``, a folder per level.
CHUNK_KEY_SEPARATOR = "."
#: Name of the array that holds the packed small gradients of a snapshot.
PACKED_ARRAY = "packed"
#: What a manifest (format 4 on) names the packed array by when it is the snapshot's node
#: itself (a snapshot of one chunk written from its gradients' memory): the empty path,
#: the node relative to itself. Its chunk is ``snapshots/<id>/c.0``.
PACKED_AT_ROOT = ""
#: The first format version whose snapshots may be an array (the packed one) at the root.
PACKED_AT_ROOT_FROM = 4
#: Every gradient in the packed array starts at a multiple of this many bytes.
PACK_ALIGNMENT = 8
#: ... and one of at least LARGE_PACKED_BYTES at a multiple of this many: in a snapshot
#: written as one chunk of the packed array, a page-aligned gradient then lies at an
#: aligned offset of the file too, and goes to the disk from its own memory (O_DIRECT).
LARGE_PACK_ALIGNMENT = 4096
LARGE_PACKED_BYTES = 64 * 1024
#: Gradients smaller than this many bytes are packed (by default).
DEFAULT_PACK_THRESHOLD = 64 * 1024
#: Target size of one chunk, before the crc32c suffix (by default).
DEFAULT_CHUNK_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Compression:
    """A zstd level; ``None`` in its place means chunks are stored uncompressed."""

    level: int = 3

    @property
    def codec(self) -> dict[str, Any]:
        return {"name": "zstd", "configuration": {"level": self.level, "checksum": False}}


def parse_compression(text: object) -> Compression | None:
    """``None`` for no compression, ``"zstd"`` or ``"zstd:<level>"``; ValueError otherwise."""
    if text is None or text == "none":
        return None
    if not isinstance(text, str):
        raise ValueError(f"compression is None, 'zstd' or 'zstd:<level>'; got {text!r}")
    name, _, level = text.partition(":")
    if name != "zstd" or (level and not level.lstrip("-").isdigit()):
        raise ValueError(f"compression is None, 'zstd' or 'zstd:<level>'; got {text!r}")
    return Compression(int(level)) if level else Compression()


# --- Zarr v3 metadata documents -------------------------------------------------------


def chunk_key_separator(format_version: int) -> str:
    """The separator of the chunk keys of a snapshot of ``format_version``."""
    return "/" if format_version < 3 else CHUNK_KEY_SEPARATOR


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
    """The ``zarr.json`` zarr-python 3.1 writes for such an array (key order included), its
    chunk keys separated by CHUNK_KEY_SEPARATOR."""
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
        "chunk_key_encoding": {
            "name": "default",
            "configuration": {"separator": CHUNK_KEY_SEPARATOR},
        },
        "fill_value": _fill_value(dtype),
        "codecs": codecs,
        "attributes": attributes or {},
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def group_metadata(
    attributes: dict[str, Any] | None = None, members: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The ``zarr.json`` zarr-python writes for a group with these attributes.

    With ``members`` (each node under the group, by its path relative to the group, to
    that node's own ``zarr.json`` document), the group carries them as Zarr v3
    consolidated metadata, as ``zarr.consolidate_metadata`` writes it (members ordered by
    depth, then by name), so that a reader lists the group's nodes from this one document
    instead of listing the store, which HTTP cannot do.
    """
    document: dict[str, Any] = {"attributes": attributes or {}, "zarr_format": 3}
    if members is not None:
        document["consolidated_metadata"] = {
            "kind": "inline",
            "must_understand": False,
            "metadata": {path: members[path] for path in sorted(members, key=_member_order)},
        }
    document["node_type"] = "group"
    return document


def _member_order(path: str) -> tuple[int, str]:
    """zarr-python's order of consolidated members: by depth, then by folded name."""
    return path.count("/"), unicodedata.normalize("NFKC", path).casefold()


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
    shape: tuple[int, ...],
    chunk_shape: tuple[int, ...],
    itemsize: int,
    start: int = 0,
    *,
    separator: str = CHUNK_KEY_SEPARATOR,
) -> Iterator[ChunkSpan]:
    """Every chunk of an array laid out by :func:`chunk_shape_for`, in C order of keys.

    Lazy, so that a reader can stop at the first chunk the store does not hold, however
    many chunks a damaged manifest claims. With ``start``, the chunks from the one that
    holds byte ``start`` on (found by arithmetic, not by walking the chunks before it).
    Keys are separated by ``separator``: a reader passes the one of the snapshot's format
    (:func:`chunk_key_separator`).
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
    trailing_zeros = f"{separator}0" * (len(shape) - axis - 1)
    first_outer, within = divmod(start, row_bytes)
    first_chunk = within // (rows * inner)
    for flat in range(first_outer, math.prod(shape[:axis])):
        prefix = "".join(f"{separator}{i}" for i in _c_order_unravel(flat, shape[:axis]))
        base = flat * row_bytes
        for j in range(first_chunk if flat == first_outer else 0, -(-shape[axis] // rows)):
            length = min(rows, shape[axis] - j * rows) * inner
            yield ChunkSpan(
                f"c{prefix}{separator}{j}{trailing_zeros}",
                base + j * rows * inner,
                length,
                rows * inner,
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

    Offsets are multiples of PACK_ALIGNMENT, those of gradients of LARGE_PACKED_BYTES or
    more of LARGE_PACK_ALIGNMENT; the chunk size splits the array into the fewest chunks
    of at most ``chunk_bytes`` with less than one byte per chunk of padding.
    """
    offsets = []
    end = 0
    for size in sizes:
        alignment = LARGE_PACK_ALIGNMENT if size >= LARGE_PACKED_BYTES else PACK_ALIGNMENT
        start = -(-end // alignment) * alignment
        offsets.append(start)
        end = start + size
    if end == 0:
        return offsets, 0, 1
    count = -(-end // chunk_bytes)
    return offsets, end, -(-end // count)
