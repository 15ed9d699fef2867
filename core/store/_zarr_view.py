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

import math
import re
from dataclasses import dataclass
from math import ceil

import numpy as np

from ..errors import (
    ChecksumMismatchError,
    InvalidRangeError,
    InvalidStorePathError,
    ManifestError,
    StoreKeyNotFoundError,
    shown,
)
from ._backend import (
    MANIFEST_NAME,
    RANKS_GROUP,
    SNAPSHOTS_PREFIX,
    MissingKeyError,
    StoreBackend,
    UnexpectedObjectError,
)
from ._checksums import crc32c
from ._codecs import encoded_size_bounds, split_crc
from ._ids import is_snapshot_id
from ._manifest import Manifest
from ._manifest_cache import ManifestCache
from ._shards import ShardedManifest, rank_of_folder
from ._validation import validate_array_document, validate_array_fields
from ._zarr_format import PACKED_ARRAY, ChunkSpan

#: The longest store path read; every real key is far shorter.
MAX_STORE_PATH = 512
#: Zarr v2 metadata names: readers that do not know the format version probe for them
#: next to ``zarr.json``, and must be told "not found", not "bad request".
ZARR_V2_NAMES = frozenset({".zgroup", ".zattrs", ".zarray", ".zmetadata"})

#: The largest document read for the root and the ``snapshots`` group, and for an array.
_DOCUMENT_LIMIT = 16 << 20

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHUNK_INDEX = re.compile(r"0|[1-9][0-9]{0,18}")


def checked_range(start: object, end: object, size: int, what: str) -> tuple[int, int]:
    """``(start, end)`` with ``end=None`` as ``size``; InvalidRangeError unless within ``size``."""
    if end is None:
        end = size
    if type(start) is not int or type(end) is not int:
        value = start if type(start) is not int else end
        raise InvalidRangeError(f"{what}: a byte range is two ints; got {value!r}")
    if not 0 <= start <= end <= size:
        raise InvalidRangeError(f"{what}: bytes [{start}, {end}) are not within its {size} bytes")
    return start, end


def parse_store_path(path: object) -> list[str]:
    """The segments of ``path``; InvalidStorePathError if it could leave the readable keys.

    StoreKeyNotFoundError for a Zarr v2 metadata name, which this store never holds.
    """
    if not isinstance(path, str):
        raise InvalidStorePathError(f"a store path is a string; got {type(path).__name__}")
    path_shown = shown(path)
    if len(path) > MAX_STORE_PATH:
        raise InvalidStorePathError(
            f"store path {path_shown} is {len(path)} characters; at most {MAX_STORE_PATH}"
        )
    if _CONTROL.search(path):
        raise InvalidStorePathError(f"store path {path_shown} holds a control character")
    if "\\" in path:
        raise InvalidStorePathError(f"store path {path_shown} holds a backslash")
    if path.startswith("/"):
        raise InvalidStorePathError(
            f"store path {path_shown} is absolute; paths are relative to the store root"
        )
    segments = path.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidStorePathError(
                f"store path {path_shown} has the segment {segment!r}; expected names "
                "separated by single slashes"
            )
    if segments[-1] in ZARR_V2_NAMES:
        raise StoreKeyNotFoundError(f"store path {path_shown}: this store holds Zarr v3 only")
    for segment in segments:
        if segment.startswith("."):
            raise InvalidStorePathError(
                f"store path {path_shown} has the hidden name {segment!r}; not readable"
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
    """Whether ``inside`` (the segments after ``snapshots/<id>/``) is a key of the snapshot.

    A chunk key is ``c`` and the chunk's indices, separated as the snapshot's format
    separates them: ``c.0.1`` (one segment) from format 3, ``c/0/1`` before.
    """
    if inside == [MANIFEST_NAME]:
        return True
    array, rest = array_and_rest(manifest, inside)
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
    rest = "/".join(rest).split(manifest.chunk_separator)  # "c" and the chunk's indices
    if not rest or rest[0] != "c" or len(rest) != len(grid) + 1:
        return False
    indices = rest[1:]
    if not all(_CHUNK_INDEX.fullmatch(index) for index in indices):
        return False
    if any(n == 0 for n in grid):
        return False  # an empty array has no chunk files
    return all(int(index) < n for index, n in zip(indices, grid, strict=True))


def array_and_rest(manifest: Manifest, inside: list[str]) -> tuple[str, list[str]]:
    """The array a path inside a snapshot (its segments after ``snapshots/<id>/``) is in, and
    the rest of the path inside that array: in a snapshot whose node is the packed array,
    every path is the packed array's."""
    if manifest.packed_at_root:
        return PACKED_ARRAY, inside
    return inside[0], inside[1:]


@dataclass(frozen=True)
class _Key:
    """A readable key: what it is, so that what is read can be held against the manifest."""

    key: str
    snapshot_id: str | None = None
    array: str | None = None  # an array's document or chunk
    chunk: ChunkSpan | None = None
    owner: str = ""  # how messages name the gradients a chunk holds
    rank: int | None = None  # the shard of a sharded snapshot the key is in
    manifest: bool = False  # the document holding the snapshot's (or the shard's) manifest

    def snapshot(self) -> str:
        """The snapshot of a key inside one (an array's document or chunk)."""
        assert self.snapshot_id is not None, f"store key {self.key} is in no snapshot"
        return self.snapshot_id


class ZarrView:
    """Reads single keys of the store for Zarr readers, only those the rules above allow."""

    def __init__(
        self,
        backend: StoreBackend,
        manifests: ManifestCache,
    ) -> None:
        self._backend = backend
        #: the store's manifests, loaded and rechecked through the store's one cache
        self._manifests = manifests

    async def read(self, path: str, start: int = 0, end: int | None = None) -> memoryview:
        """The bytes ``[start, end)`` of the key at ``path`` (a chunk's crc32c verified)."""
        found = await self._resolve(path)
        limit: int | None = _DOCUMENT_LIMIT
        if found.chunk is not None:
            manifest = await self._manifests.manifest(found.snapshot(), found.rank)
            compression = manifest.compression
            limit = encoded_size_bounds(found.chunk.padded_length, compression)[1]
        elif found.snapshot_id is not None and found.array is None:
            limit = None  # the manifest, which the store has read whole already
        try:
            data = await self._backend.read(found.key, limit)
        except (MissingKeyError, UnexpectedObjectError) as error:
            raise await self._unreadable(found, error) from None
        if found.chunk is not None:
            self._verify_chunk(found, data)
        elif found.array is not None:
            manifest = await self._manifests.manifest(found.snapshot(), found.rank)
            claim = self._manifests.reader(manifest).array_claim(found.array)
            validate_array_document(data, claim, manifest.snapshot_id, found.key)
        elif found.manifest:
            await self._check_manifest_document(found, data)
        start, end = checked_range(start, end, len(data), f"store key {found.key}")
        return data[start:end]

    async def size(self, path: str) -> int:
        """The stored size of the key at ``path``, without reading it."""
        found = await self._resolve(path)
        try:
            return await self._backend.size(found.key)
        except (MissingKeyError, UnexpectedObjectError) as error:
            raise await self._unreadable(found, error) from None

    async def _resolve(self, path: str) -> _Key:
        segments = parse_store_path(path)  # before any I/O
        key = "/".join(segments)
        if is_top_level_key(segments):
            return _Key(key)
        snapshot_id = snapshot_id_of(segments)
        if snapshot_id is None:
            raise StoreKeyNotFoundError(f"store path {key!r} is not a key this store serves")
        top = await self._manifests.top(snapshot_id)  # SnapshotNotFoundError
        inside = segments[2:]
        rank = None
        if isinstance(top, ShardedManifest):
            # the snapshot's group, the ranks group, and each shard as a snapshot of its own
            if inside == [MANIFEST_NAME]:
                return _Key(key, snapshot_id, manifest=True)
            if inside == [RANKS_GROUP, MANIFEST_NAME]:
                return _Key(key, snapshot_id)
            rank = rank_of_folder(inside[1]) if inside[0] == RANKS_GROUP else None
            if rank is None or rank >= top.world_size or len(inside) < 3:
                raise StoreKeyNotFoundError(
                    f"snapshot {snapshot_id} has no key {'/'.join(inside)!r}"
                )
            inside = inside[2:]
        manifest = await self._manifests.manifest(snapshot_id, rank)
        if not snapshot_key_exists(manifest, inside):
            raise StoreKeyNotFoundError(f"snapshot {snapshot_id} has no key {'/'.join(inside)!r}")
        if inside == [MANIFEST_NAME]:
            return _Key(key, snapshot_id, rank=rank, manifest=True)
        array, rest = array_and_rest(manifest, inside)
        if rest == [MANIFEST_NAME]:
            return _Key(key, snapshot_id, array, rank=rank)
        span, owner = _chunk_of(manifest, array, "/".join(rest))
        return _Key(key, snapshot_id, array, span, owner, rank)

    async def _check_manifest_document(self, found: _Key, data: memoryview) -> None:
        """ManifestError unless ``data``, a manifest's document as read now, is the one the
        store validated (``ManifestCache.check_document``) and, where the snapshot's node is
        the packed array, has that array's fields (as every read of its chunk checks)."""
        manifest = await self._manifests.check_document(found.snapshot(), found.rank, data)
        if isinstance(manifest, Manifest) and manifest.packed_at_root:
            claim = self._manifests.reader(manifest).array_claim(PACKED_ARRAY)
            validate_array_fields(manifest.node, claim, manifest.snapshot_id, found.key)

    def _verify_chunk(self, found: _Key, data: memoryview) -> None:
        try:
            body, stored = split_crc(data)
        except ValueError as error:
            raise ChecksumMismatchError(self._chunk_problem(found, str(error))) from None
        computed = crc32c(body)
        if computed != stored:
            raise ChecksumMismatchError(
                self._chunk_problem(
                    found, f"fails its crc32c check: stored {stored:08x}, computed {computed:08x}"
                )
            )

    @staticmethod
    def _chunk_problem(found: _Key, problem: str) -> str:
        assert found.chunk is not None  # asked only about a chunk
        where = found.key.split("/", 2)[2]  # the chunk's path inside its snapshot
        return f"snapshot {found.snapshot_id}: chunk {where} of {found.owner} {problem}"

    async def _unreadable(self, found: _Key, error: Exception) -> Exception:
        """The error to raise for a key the rules allow that cannot be read."""
        missing = isinstance(error, MissingKeyError)
        problem = "is missing" if missing else str(error)
        if found.snapshot_id is None:
            if missing:
                return StoreKeyNotFoundError(f"store key {found.key} is missing (an empty store)")
            return ManifestError(f"store key {found.key} {problem}")
        if missing:
            # SnapshotNotFoundError if deleted meanwhile
            await self._manifests.recheck(found.snapshot_id)
        if found.chunk is not None:
            return ChecksumMismatchError(self._chunk_problem(found, problem))
        return ManifestError(f"snapshot {found.snapshot_id}: {found.key} {problem}")


def _chunk_of(manifest: Manifest, array: str, chunk_key: str) -> tuple[ChunkSpan, str]:
    """The span of a chunk within the snapshot's chunk grid, and who it holds."""
    columns = manifest.columns
    if array == PACKED_ARRAY:
        span = manifest.packed_chunk(int(chunk_key.removeprefix(f"c{manifest.chunk_separator}")))
        return span, manifest.describe_packed_chunk(span) or "the packed array"
    position = manifest.position(array)
    assert position is not None  # the caller found the key in the manifest
    itemsize = np.dtype(columns["dtype"][position]).itemsize
    padded = itemsize * math.prod(columns["chunk_shape"][position])
    return ChunkSpan(chunk_key, 0, padded, padded), manifest.describe(position)
