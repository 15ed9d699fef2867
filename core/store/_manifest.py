"""The snapshot manifest: built from a record as it is written, parsed again to read it.

The manifest is ``attributes["gradvault"]`` of the snapshot group's ``zarr.json``. Its
gradient table is stored by column (``gradients["name"][i]`` is the i-th gradient's name):
for 10,000 gradients a column table encodes to JSON in a third of the time a list of
per-gradient objects takes, and the manifest is on the commit's critical path.
docs/FORMAT.md documents every field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ChecksumMismatchError, FormatVersionError, ManifestError
from ..records.param_id import ParamId
from ..records.record import SUPPORTED_DTYPES, GradientRecordEntry, GradientsParamsRecord
from ._backend import shard_prefix, snapshot_key
from ._checksums import crc32c, format_checksum, format_checksums, parse_checksum
from ._ids import iso_utc, snapshot_id_time_ms
from ._validation import GRADIENT_COLUMNS, STATS_COLUMNS, packed_name, validate_manifest
from ._zarr_format import (
    PACK_ALIGNMENT,
    PACKED_ARRAY,
    PACKED_AT_ROOT,
    STORE_FORMAT_VERSION,
    ChunkSpan,
    Compression,
    chunk_key_separator,
    packed_layout,
    parse_compression,
)

if TYPE_CHECKING:
    from ._device_snapshot import DeviceGradient, DeviceSnapshot


@dataclass(frozen=True)
class ShardSummary:
    """One rank's shard of a sharded snapshot, as its manifest's ``shards`` table says."""

    rank: int
    device: str
    backend: str | None
    compression: str | None
    nbytes: int
    num_params: int


@dataclass(frozen=True)
class SnapshotInfo:
    """A committed snapshot: id, run, step, creation time (ISO 8601 UTC), bytes, gradients.

    ``world_size`` is the number of ranks of a sharded snapshot, None for one written whole;
    ``shards`` is then one :class:`ShardSummary` per rank, in rank order (empty for one
    written whole).
    """

    id: str
    run: str
    step: int
    created_at: str
    nbytes: int
    num_params: int
    world_size: int | None = None
    shards: tuple[ShardSummary, ...] = ()

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> SnapshotInfo:
        table = manifest.get("shards")
        shards: tuple[ShardSummary, ...] = ()
        if table:  # by column, one entry per rank (docs/FORMAT.md, "Sharded snapshots")
            names = [f.name for f in fields(ShardSummary)]
            shards = tuple(
                ShardSummary(**dict(zip(names, values, strict=True)))
                for values in zip(*(table[name] for name in names), strict=True)
            )
        return cls(
            id=manifest["id"],
            run=manifest["run"],
            step=manifest["step"],
            created_at=manifest["created_at"],
            nbytes=manifest["nbytes"],
            num_params=manifest["num_params"],
            world_size=manifest.get("world_size"),
            shards=shards,
        )


@dataclass
class PackedGradients:
    """The small gradients of a record laid end to end (see docs/FORMAT.md, "packed")."""

    buffer: bytes
    length: int
    chunk_bytes: int
    offsets: list[int]
    #: each gradient's crc32c and stats, known once the array's write is under way
    checksums: list[int] = field(default_factory=list)
    stats: dict[str, list] = field(default_factory=dict)


def pack(entries: list[GradientRecordEntry], chunk_bytes: int) -> PackedGradients:
    """One buffer (whole chunks, zero padded) holding ``entries`` at aligned offsets."""
    sizes = [entry.array.nbytes for entry in entries]
    offsets, length, chunk = packed_layout(sizes, chunk_bytes)
    tail = -(-length // chunk) * chunk - length
    return PackedGradients(lay_out(entries, offsets, 0, tail), length, chunk, offsets)


def lay_out(
    entries: list[GradientRecordEntry], offsets: list[int], start: int, tail: int = 0
) -> bytes:
    """The bytes from ``start`` to the end of the last of ``entries``, each at its offset
    in the packed array (``offsets``, from :func:`packed_layout` of the whole array), zeros
    between them and ``tail`` zeros after. A run of a packed array laid out on its own
    keeps the whole array's offsets: alignments count from the array's start."""
    pieces: list[Any] = []
    end = start
    for entry, offset in zip(entries, offsets, strict=True):
        if offset > end:
            pieces.append(bytes(offset - end))
        pieces.append(entry.array)
        end = offset + entry.array.nbytes
    pieces.append(bytes(tail))
    return b"".join(pieces)


def _param_id_texts(
    entries: tuple[GradientRecordEntry, ...] | tuple[DeviceGradient, ...],
) -> list[str]:
    """``str(entry.param_id)`` of each entry, hex-encoded at once (10,000: 2.1 ms, not 3.0)."""
    values = np.fromiter((entry.param_id.value for entry in entries), ">u8", len(entries))
    digits = values.tobytes().hex()
    return [digits[start : start + 16] for start in range(0, len(digits), 16)]


def build_manifest(
    record: GradientsParamsRecord | DeviceSnapshot,
    *,
    snapshot_id: str,
    run: str,
    step: int,
    tags: dict[str, str],
    device: str,
    compression: Compression | None,
    packed_positions: list[int],
    packed: PackedGradients | None,
    own_arrays: dict[int, dict[str, Any]],
    shard: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The manifest of a snapshot (or of one rank's shard) whose arrays are all written.

    ``packed_positions`` are the record positions of the packed gradients (in packing
    order); ``own_arrays`` maps the other positions to their array, chunk_shape, checksum
    and stats; ``shard`` is ``(rank, world_size)`` for a shard of a sharded snapshot. (A
    snapshot whose node is the packed array has its manifest made by
    :meth:`OneChunkPlan.manifest`.)
    """
    entries = record.entries
    count = len(entries)
    sizes = [entry.array.nbytes for entry in entries]
    if packed is not None and len(packed_positions) == count:  # the common all-small case
        checksums = format_checksums(packed.checksums)
        gradients: dict[str, Any] = {
            "array": [PACKED_ARRAY] * count,
            "offset": packed.offsets,
            "chunk_shape": [None] * count,
            "checksum": checksums,
        }
        stats = packed.stats
    else:
        gradients = {key: [None] * count for key in ("array", "offset", "chunk_shape", "checksum")}
        stats = {key: [None] * count for key in STATS_COLUMNS}
        if packed is not None:
            for slot, position in enumerate(packed_positions):
                gradients["array"][position] = PACKED_ARRAY
                gradients["offset"][position] = packed.offsets[slot]
                gradients["checksum"][position] = format_checksum(packed.checksums[slot])
                for key in STATS_COLUMNS:
                    stats[key][position] = packed.stats[key][slot]
        for position, placed in own_arrays.items():
            for key in ("array", "chunk_shape", "checksum"):
                gradients[key][position] = placed[key]
            for key in STATS_COLUMNS:
                stats[key][position] = placed["stats"][key]
    manifest = _manifest(
        record,
        snapshot_id=snapshot_id,
        run=run,
        step=step,
        tags=tags,
        device=device,
        compression=None if compression is None else f"zstd:{compression.level}",
        nbytes=sum(sizes),
        packed=None
        if packed is None
        else {
            "array": PACKED_ARRAY,
            "nbytes": packed.length,
            "chunk_bytes": packed.chunk_bytes,
            "alignment": PACK_ALIGNMENT,
        },
        gradients={**_described(entries, sizes), **gradients, "stats": stats},
    )
    if shard is not None:
        manifest["shard"] = {"rank": shard[0], "world_size": shard[1]}
    return manifest


def _described(
    entries: tuple[GradientRecordEntry, ...] | tuple[DeviceGradient, ...], sizes: list[int]
) -> dict[str, list]:
    """The gradient table's columns that say what each gradient is (not where or what
    its values are): param_id, name, dtype, shape, nbytes."""
    return {
        "param_id": _param_id_texts(entries),
        "name": [entry.name for entry in entries],
        "dtype": [entry.dtype for entry in entries],
        "shape": [list(entry.shape) for entry in entries],
        "nbytes": sizes,
    }


def _manifest(
    record: GradientsParamsRecord | DeviceSnapshot,
    *,
    snapshot_id: str,
    run: str,
    step: int,
    tags: dict[str, str],
    device: str,
    compression: str | None,
    nbytes: int,
    packed: dict[str, Any] | None,
    gradients: dict[str, Any],
) -> dict[str, Any]:
    """The manifest's fields, in the order it is written."""
    return {
        "format_version": STORE_FORMAT_VERSION,
        "id": snapshot_id,
        "run": run,
        "step": step,
        "created_at": iso_utc(snapshot_id_time_ms(snapshot_id)),
        "device": device,
        "backend": "cupy" if device.startswith("cuda") else "numpy",
        "tags": tags,
        "metadata": dict(record.metadata),
        "compression": compression,
        "nbytes": nbytes,
        "num_params": len(gradients["name"]),
        "packed": packed,
        "gradients": gradients,
    }


class OneChunkPlan:
    """What every snapshot whose node is a packed array of one uncompressed chunk writes
    the same while its record's gradients stay the same (ids, names, dtypes, shapes):
    the chunk's layout and the manifest's columns that do not change from step to step.

    Worked out once (``SnapshotWrite`` keeps a few, by the record's :func:`structure`), not
    once per snapshot: a trainer commits the same gradients step after step. Its lists
    are shared by every manifest made from it, which nothing changes once made.
    """

    def __init__(self, record: GradientsParamsRecord, offsets: list[int], length: int) -> None:
        entries = record.entries
        count = len(entries)
        sizes = [entry.array.nbytes for entry in entries]
        #: where each gradient starts in the chunk, and the chunk's length
        self.offsets, self.length = offsets, length
        self._nbytes = sum(sizes)
        self._columns = {
            **_described(entries, sizes),
            "array": [PACKED_AT_ROOT] * count,
            "offset": offsets,
            "chunk_shape": [None] * count,
        }

    def manifest(
        self,
        record: GradientsParamsRecord,
        *,
        snapshot_id: str,
        run: str,
        step: int,
        tags: dict[str, str],
        device: str,
        checksums: list[int],
        stats: dict[str, list],
    ) -> dict[str, Any]:
        """The manifest of ``record`` (of this plan's structure) written as snapshot
        ``snapshot_id`` with these checksums and stats: the fields :func:`build_manifest`
        writes for every gradient packed, uncompressed and whole (no shard), with the
        packed array named PACKED_AT_ROOT, the snapshot's node."""
        return _manifest(
            record,
            snapshot_id=snapshot_id,
            run=run,
            step=step,
            tags=tags,
            device=device,
            compression=None,
            nbytes=self._nbytes,
            packed={
                "array": PACKED_AT_ROOT,
                "nbytes": self.length,
                "chunk_bytes": self.length,
                "alignment": PACK_ALIGNMENT,
            },
            gradients={**self._columns, "checksum": format_checksums(checksums), "stats": stats},
        )


def structure(record: GradientsParamsRecord) -> tuple[Any, ...]:
    """What a :class:`OneChunkPlan` depends on of ``record``: its gradients' ids, names,
    dtypes and shapes, in order (hashable, equal for records of the same gradients)."""
    ids, names, dtypes, arrays = record.columns()
    return tuple(pid.value for pid in ids), names, dtypes, tuple(a.shape for a in arrays)


def _little_endian(dtype: str) -> np.dtype:
    native = np.dtype(dtype)
    return native.newbyteorder("<") if native.itemsize > 1 else native


#: stored layout of every dtype a snapshot may hold; anything else is refused
_LAYOUTS = {name: _little_endian(name) for name in SUPPORTED_DTYPES}


class Manifest:
    """A parsed manifest: gradient columns, lookups by ParamId text, packed layout.

    The document is validated first (:func:`validate_manifest`): FormatVersionError if
    it is malformed, so nothing is ever read through a damaged manifest. ``shard`` is
    ``(rank, world_size)`` for one rank's shard of a sharded snapshot, whose manifest must
    say so; ``prefix`` is the key prefix the arrays lie under.
    """

    def __init__(
        self,
        document: dict[str, Any],
        snapshot_id: str,
        shard: tuple[int, int] | None = None,
        node: dict[str, Any] | None = None,
    ) -> None:
        validate_manifest(document, snapshot_id)
        said = document.get("shard")
        expected = None if shard is None else {"rank": shard[0], "world_size": shard[1]}
        if said != expected:
            raise ManifestError(
                f"snapshot {snapshot_id}: manifest field 'shard' should be "
                f"{'absent' if expected is None else expected}; found {said!r}"
            )
        self.snapshot_id = snapshot_id
        self.shard = shard
        self.prefix = (
            snapshot_key(snapshot_id) if shard is None else shard_prefix(snapshot_id, shard[0])
        )
        self.document = document
        self.columns: dict[str, Any] = document["gradients"]
        #: whether the snapshot's node is the packed array (format 4 on): the manifest
        #: names it PACKED_AT_ROOT, and ``columns`` (a copy of the document's, then)
        #: PACKED_ARRAY, as every reader of a manifest goes by
        self.packed_at_root = packed_name(document) == PACKED_AT_ROOT
        #: the snapshot document's fields besides its attributes (the manifest), where the
        #: loader kept them: the packed array's, if the snapshot's node is that array, which
        #: readers check without reading the document again
        self.node = node
        if self.packed_at_root:
            self.columns = {**self.columns, "array": [PACKED_ARRAY] * len(self.columns["array"])}
        self.count = len(self.columns["param_id"])
        self.compression = parse_compression(document.get("compression"))
        self.packed: dict[str, Any] | None = document.get("packed")
        #: the separator of this snapshot's chunk keys ("/" before format 3)
        self.chunk_separator = chunk_key_separator(document["format_version"])
        self._index: dict[str, int] | None = None
        self._ids: list[ParamId] | None = None
        self._checksums: list[int] | None = None

    def is_node(self, array: str) -> bool:
        """Whether ``array`` is the snapshot's node itself (its packed array, format 4)."""
        return self.packed_at_root and array == PACKED_ARRAY

    def array_prefix(self, array: str) -> str:
        """The key prefix of ``array`` (PACKED_ARRAY or a ParamId's text): its folder under
        the snapshot's (or the shard's), or that folder itself for the array that is the
        snapshot's node."""
        return self.prefix if self.is_node(array) else f"{self.prefix}/{array}"

    def objects_by_array(self, objects: dict[str, int | None]) -> dict[str, dict[str, int | None]]:
        """The snapshot's objects (keys under ``prefix``, to their sizes) by array, each
        keyed under its array's prefix: a group's own document is no array's, the
        document of a snapshot whose node is the packed array is that array's."""
        grouped: dict[str, dict[str, int | None]] = {}
        if self.packed_at_root:
            grouped[PACKED_ARRAY] = {key: size for key, size in objects.items() if "/" not in key}
            return grouped
        for key, size in objects.items():
            array, slash, rest = key.partition("/")
            if slash:
                grouped.setdefault(array, {})[rest] = size
        return grouped

    def param_ids(self) -> list[ParamId]:
        """Every gradient's ParamId, parsed once per manifest."""
        if self._ids is None:
            try:
                self._ids = [ParamId.parse(text) for text in self.columns["param_id"]]
            except ValueError as error:
                raise ManifestError(f"the manifest is malformed: {error}") from None
        return self._ids

    def position(self, param_id: str) -> int | None:
        """The position of gradient ``param_id`` in the table, or None."""
        if self._index is None:
            self._index = {pid: i for i, pid in enumerate(self.columns["param_id"])}
        return self._index.get(param_id)

    def row(self, position: int) -> dict[str, Any]:
        """One gradient's fields (without stats)."""
        return {key: self.columns[key][position] for key in GRADIENT_COLUMNS}

    def describe(self, position: int) -> str:
        """How messages name a gradient: ``param 9f3c... ('fc1.weight')``."""
        return f"param {self.columns['param_id'][position]} ({self.columns['name'][position]!r})"

    def packed_positions(self) -> list[int]:
        return [i for i, name in enumerate(self.columns["array"]) if name == PACKED_ARRAY]

    def packed_fields(self) -> dict[str, Any]:
        """The manifest's ``packed`` object: only a snapshot with packed gradients has one,
        and only its readers ask for it."""
        packed = self.packed
        assert packed is not None, "a snapshot without packed gradients has no packed array"
        return packed

    def packed_chunk(self, index: int) -> ChunkSpan:
        """Chunk ``index`` of the packed array. Its padding is read as data: the packed
        gradients are read in whole chunks, and only a snapshot with packed gradients has
        this array."""
        chunk = self.packed_fields()["chunk_bytes"]
        return ChunkSpan(f"c{self.chunk_separator}{index}", index * chunk, chunk, chunk)

    def describe_packed_chunk(self, span: ChunkSpan) -> str:
        """How messages name the gradients a packed chunk holds (the first five, then a
        count); empty if it holds none."""
        offsets, sizes = self.columns["offset"], self.columns["nbytes"]
        inside = [
            self.describe(i)
            for i in self.packed_positions()
            if offsets[i] < span.start + span.length and offsets[i] + sizes[i] > span.start
        ]
        shown = ", ".join(inside[:5])
        return shown + (f" and {len(inside) - 5} more" if len(inside) > 5 else "")

    def checksum_mismatch(self, position: int, found: int) -> ChecksumMismatchError:
        """The error for gradient ``position`` read back with crc32c ``found``, which is
        not the checksum the manifest gives it."""
        return ChecksumMismatchError(
            f"snapshot {self.snapshot_id}: {self.describe(position)} has crc32c {found:08x}; "
            f"the manifest says {self.columns['checksum'][position]}"
        )

    def checksum_values(self) -> list[int]:
        """Every gradient's crc32c as an int, parsed once per manifest."""
        if self._checksums is None:
            self._checksums = [parse_checksum(text) for text in self.columns["checksum"]]
        return self._checksums

    def packed_arrays(
        self, positions: list[int], buffer: memoryview, base: int = 0
    ) -> list[np.ndarray]:
        """The read-only arrays of the packed gradients at ``positions`` over ``buffer``,
        the packed array's bytes from byte ``base`` on (the chunks that hold them).

        Each gradient's crc32c is checked against the manifest first. Gradients are
        slices of one read-only array per dtype over the buffer: no object but the array
        is built per gradient, so thousands of them take a few ms.
        """
        columns = self.columns
        offsets, sizes, dtypes = columns["offset"], columns["nbytes"], columns["dtype"]
        shapes, checksums = columns["shape"], self.checksum_values()
        every = len(positions) == self.count  # the common case: the whole table, in order
        if every:
            starts = [offset - base for offset in offsets]
            ends = [start + size for start, size in zip(starts, sizes, strict=True)]
            expected = checksums
        else:
            starts = [offsets[i] - base for i in positions]
            ends = [start + sizes[i] for start, i in zip(starts, positions, strict=True)]
            expected = [checksums[i] for i in positions]
        crc = crc32c
        found = [crc(buffer[start:end]) for start, end in zip(starts, ends, strict=True)]
        if found != expected:
            pairs = zip(positions, found, strict=True)
            i, value = next((i, value) for i, value in pairs if value != checksums[i])
            raise self.checksum_mismatch(i, value)
        kinds = set(dtypes) if every else {dtypes[i] for i in positions}
        if len(kinds) == 1 and buffer:  # one dtype: slices of one array, by element
            layout = _LAYOUTS[kinds.pop()]  # validated when the manifest was loaded
            itemsize = layout.itemsize
            if all(start % itemsize == 0 for start in starts):  # 8-aligned as written
                flat = np.frombuffer(buffer, dtype=layout, count=len(buffer) // itemsize)
                flat.setflags(write=False)  # and so is every slice of it
                held = shapes if every else [shapes[i] for i in positions]
                # a slice is 1-d of the right length already (validated: prod(shape) x
                # itemsize == nbytes); only other shapes need a reshape
                return [
                    flat[start // itemsize : end // itemsize]
                    if len(shape) == 1
                    else flat[start // itemsize : end // itemsize].reshape(tuple(shape))
                    for start, end, shape in zip(starts, ends, held, strict=True)
                ]
        whole: dict[str, np.ndarray] = {}
        arrays = []
        for i in positions:
            offset, size, dtype = offsets[i] - base, sizes[i], dtypes[i]
            layout = _LAYOUTS[dtype]  # validated when the manifest was loaded
            itemsize = layout.itemsize
            if not size:  # held by no chunk: it may lie outside the buffer
                array = np.empty(tuple(shapes[i]), dtype=layout)
                array.setflags(write=False)
            elif offset % itemsize == 0:
                typed = whole.get(dtype)
                if typed is None:  # read-only, and so is every slice of it
                    typed = whole[dtype] = np.frombuffer(
                        buffer, dtype=layout, count=len(buffer) // itemsize
                    )
                    typed.setflags(write=False)
                start = offset // itemsize
                array = typed[start : start + size // itemsize].reshape(tuple(shapes[i]))
            else:
                array = np.frombuffer(buffer[offset : offset + size], dtype=layout)
                array = array.reshape(tuple(shapes[i]))
                array.setflags(write=False)
            arrays.append(array)
        return arrays

    def packed_entry(self, position: int, array: np.ndarray) -> GradientRecordEntry:
        """The record entry of packed gradient ``position``, whose array ``packed_arrays``
        gave."""
        columns = self.columns
        pid = self.param_ids()[position]
        dtype = columns["dtype"][position]
        return GradientRecordEntry(pid, columns["name"][position], dtype, array.shape, array)

    def entry(self, position: int, data: memoryview) -> GradientRecordEntry:
        """The record entry of gradient ``position`` over ``data`` (read-only, no copy)."""
        columns = self.columns
        shape = tuple(columns["shape"][position])
        dtype = columns["dtype"][position]
        layout = _LAYOUTS.get(dtype)
        if layout is None:
            raise FormatVersionError(
                f"{self.describe(position)} has dtype {dtype!r}, which this release cannot "
                f"read; supported: {', '.join(SUPPORTED_DTYPES)}"
            )
        count = math.prod(shape)
        array = np.frombuffer(data, dtype=layout, count=count) if count else np.empty(0, layout)
        array = array.reshape(shape)
        array.flags.writeable = False
        pid = self.param_ids()[position]
        return GradientRecordEntry(pid, columns["name"][position], dtype, shape, array)
