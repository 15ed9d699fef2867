"""The store's read-only Zarr view: which paths may be read, decided before any I/O.

A path comes from a URL, so it is checked as text first (:func:`parse_store_path`):
anything that could name a key outside the readable ones (``..``, ``.``, empty
segments, backslashes, absolute paths, control characters, hidden names such as
``.staging``, over-long paths) is an InvalidStorePathError. Then only these keys are
served: the root's and ``snapshots``' ``zarr.json``, and within a committed snapshot its
group ``zarr.json``, each array's ``zarr.json`` and the chunk keys inside each array's
chunk grid, as its (validated) manifest describes them (:func:`snapshot_key_exists`).
Everything else is "not found" without touching the store.
"""

from __future__ import annotations

import re
from math import ceil

from ..errors import InvalidStorePathError, StoreKeyNotFoundError
from ._backend import MANIFEST_NAME, SNAPSHOTS_PREFIX
from ._format import PACKED_ARRAY
from ._ids import is_snapshot_id
from ._manifest import Manifest

#: The longest store path read; every real key is far shorter.
MAX_STORE_PATH = 512
#: Zarr v2 metadata names: readers that do not know the format version probe for them
#: next to ``zarr.json``, and must be told "not found", not "bad request".
ZARR_V2_NAMES = frozenset({".zgroup", ".zattrs", ".zarray", ".zmetadata"})

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHUNK_INDEX = re.compile(r"0|[1-9][0-9]{0,18}")


def parse_store_path(path: object) -> list[str]:
    """The segments of ``path``; InvalidStorePathError if it could leave the readable keys.

    StoreKeyNotFoundError for a Zarr v2 metadata name, which this store never holds.
    """
    if not isinstance(path, str):
        raise InvalidStorePathError(f"a store path is a string; got {type(path).__name__}")
    shown = path if len(path) <= 80 else path[:77] + "..."
    if len(path) > MAX_STORE_PATH:
        raise InvalidStorePathError(
            f"store path {shown!r} is {len(path)} characters; at most {MAX_STORE_PATH}"
        )
    if _CONTROL.search(path):
        raise InvalidStorePathError(f"store path {shown!r} holds a control character")
    if "\\" in path:
        raise InvalidStorePathError(f"store path {shown!r} holds a backslash")
    if path.startswith("/"):
        raise InvalidStorePathError(
            f"store path {shown!r} is absolute; paths are relative to the store root"
        )
    segments = path.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidStorePathError(
                f"store path {shown!r} has the segment {segment!r}; expected names "
                "separated by single slashes"
            )
    if segments[-1] in ZARR_V2_NAMES:
        raise StoreKeyNotFoundError(f"store path {shown!r}: this store holds Zarr v3 only")
    for segment in segments:
        if segment.startswith("."):
            raise InvalidStorePathError(
                f"store path {shown!r} has the hidden name {segment!r}; not readable"
            )
    return segments


def snapshot_id_of(segments: list[str]) -> str | None:
    """The snapshot id a path under ``snapshots/<id>/`` names, or None for any other path."""
    if len(segments) >= 3 and segments[0] == SNAPSHOTS_PREFIX and is_snapshot_id(segments[1]):
        return segments[1]
    return None


def is_top_level_key(segments: list[str]) -> bool:
    """Whether the path is the root's or the ``snapshots`` group's ``zarr.json``."""
    return segments in ([MANIFEST_NAME], [SNAPSHOTS_PREFIX, MANIFEST_NAME])


def snapshot_key_exists(manifest: Manifest, inside: list[str]) -> bool:
    """Whether ``inside`` (the segments after ``snapshots/<id>/``) is a key of the snapshot."""
    if inside == [MANIFEST_NAME]:
        return True
    array, *rest = inside
    if array == PACKED_ARRAY:
        if manifest.packed is None:
            return False
        length, chunk = manifest.packed["nbytes"], manifest.packed["chunk_bytes"]
        grid: tuple[int, ...] = (ceil(length / chunk),)
    else:
        position = manifest.position(array)
        if position is None or manifest.columns["array"][position] != array:
            return False  # not a gradient, or a packed one: no array of its own
        shape = manifest.columns["shape"][position]
        chunk_shape = manifest.columns["chunk_shape"][position]
        grid = tuple(ceil(n / c) for n, c in zip(shape, chunk_shape, strict=True))
    if rest == [MANIFEST_NAME]:
        return True
    if not rest or rest[0] != "c" or len(rest) != len(grid) + 1:
        return False
    indices = rest[1:]
    if not all(_CHUNK_INDEX.fullmatch(index) for index in indices):
        return False
    if any(n == 0 for n in grid):
        return False  # an empty array has no chunk files
    return all(int(index) < n for index, n in zip(indices, grid, strict=True))
