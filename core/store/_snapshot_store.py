"""SnapshotStore: write, read, list, delete and expire gradient snapshots in a Zarr v3 store.

The store encodes chunks and writes the Zarr metadata itself (``_format``), builds the
manifest (``_manifest``) and leaves the commit protocol to its backend (``_local``,
``_s3``). docs/FORMAT.md is the layout.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Collection
from typing import Any

import orjson

from ..errors import (
    FormatVersionError,
    ManifestError,
    MissingGradientError,
    SnapshotNotFoundError,
)
from ..param_id import ParamId, as_param_id
from ..record import GradientRecordEntry, GradientsParamsRecord, paused_gc
from ..record_rules import check_metadata, check_snapshot_fields
from ..safetensors_file import data_order, encode_header, gradvault_metadata
from ._backend import (
    MANIFEST_NAME,
    Backend,
    MissingKeyError,
    ThreadRunner,
    UnexpectedObjectError,
    snapshot_key,
)
from ._ids import new_snapshot_id, parse_snapshot_id
from ._manifest import Manifest, SnapshotInfo
from ._reader import SnapshotReader
from ._retention import RetentionPass, RetentionRules
from ._write import SnapshotWrite
from ._zarr_format import (
    PACKED_ARRAY,
    STORE_FORMAT_VERSION,
    parse_compression,
)
from ._zarr_view import ZarrView, checked_range

_log = logging.getLogger("gradvault.store")

#: Manifests at least this big are parsed in a thread rather than on the loop.
_THREAD_DECODE_BYTES = 256 * 1024
_MANIFEST_CACHE_SIZE = 8
#: Safetensors headers of more gradients than this are encoded in a thread.
_THREAD_HEADER_COUNT = 1000


class SnapshotStore:
    """Gradient snapshots in a Zarr v3 hierarchy; get one from :func:`open_store`.

    Every method is a coroutine. A snapshot is visible (to ``list``, ``read_snapshot``,
    other processes) only once wholly written; ids are from :func:`new_snapshot_id`.
    """

    def __init__(
        self,
        backend: Backend,
        threads: ThreadRunner,
        *,
        pack_threshold: int,
        chunk_bytes: int,
        max_concurrency: int,
    ) -> None:
        self._backend = backend
        self._threads = threads
        self.pack_threshold = pack_threshold
        self.chunk_bytes = chunk_bytes
        self.max_concurrency = max_concurrency
        self._infos: dict[str, SnapshotInfo] = {}
        self._manifests: OrderedDict[str, Manifest] = OrderedDict()
        self._zarr_view = ZarrView(backend, self._load_manifest, self._recheck, self._reader)

    @property
    def location(self) -> str:
        """The folder or URL the store lives at."""
        return self._backend.location

    def __repr__(self) -> str:
        return f"SnapshotStore({self.location!r})"

    async def __aenter__(self) -> SnapshotStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the store's threads and connections."""
        await self._backend.close()
        await asyncio.to_thread(self._threads.close)

    # --- writing ----------------------------------------------------------------------

    async def write_snapshot(
        self,
        record: GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: dict[str, str] | None = None,
        device: str = "cpu",
        compression: str | None = None,
    ) -> SnapshotInfo:
        """Write ``record`` as a new snapshot and commit it; its SnapshotInfo once durable.

        ``compression`` is None, ``"zstd"`` or ``"zstd:<level>"``. On any failure nothing
        becomes visible and the partial write is removed where possible
        (StoreUnavailableError for I/O failures, a full disk included).
        """
        if not isinstance(record, GradientsParamsRecord):
            raise TypeError(f"record must be a GradientsParamsRecord; got {type(record).__name__}")
        run, step, tags = check_snapshot_fields(run, step, tags)
        if not isinstance(device, str) or not device:
            raise ValueError(f"device must be a non-empty string; got {device!r}")
        codec = parse_compression(compression)
        check_metadata(record.metadata)  # the dict may have changed since the record was built

        snapshot_id = new_snapshot_id()
        write = SnapshotWrite(
            self._backend,
            self._threads,
            snapshot_id=snapshot_id,
            pack_threshold=self.pack_threshold,
            chunk_bytes=self.chunk_bytes,
            max_concurrency=self.max_concurrency,
            compression=codec,
        )
        manifest = await write.run(record, run=run, step=step, tags=tags, device=device)
        info = SnapshotInfo.from_manifest(manifest)
        self._infos[snapshot_id] = info
        return info

    # --- reading ----------------------------------------------------------------------

    async def _load_manifest(self, snapshot_id: str) -> Manifest:
        cached = self._manifests.get(snapshot_id)
        if cached is not None:
            self._manifests.move_to_end(snapshot_id)
            return cached
        try:
            raw = await self._backend.read(snapshot_key(snapshot_id, MANIFEST_NAME))
        except MissingKeyError:
            raise SnapshotNotFoundError(
                f"no committed snapshot {snapshot_id} in store {self.location}"
            ) from None
        except UnexpectedObjectError as error:
            raise ManifestError(
                f"snapshot {snapshot_id}: its manifest document {MANIFEST_NAME} {error}"
            ) from None

        def parse() -> Manifest:
            try:
                document = orjson.loads(raw)
                manifest = document["attributes"]["gradvault"]
                version = manifest.get("format_version")
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                raise ManifestError(
                    f"snapshot {snapshot_id}: its zarr.json has no gradvault manifest ({error!r})"
                ) from None
            if type(version) is not int or version != STORE_FORMAT_VERSION:
                raise FormatVersionError(
                    f"snapshot {snapshot_id} has store format version {version!r}; this "
                    f"release reads version {STORE_FORMAT_VERSION}"
                )
            return Manifest(manifest, snapshot_id)  # validated: FormatVersionError if malformed

        if len(raw) > _THREAD_DECODE_BYTES:
            parsed = await self._threads.run(parse)
        else:
            parsed = parse()
        self._manifests[snapshot_id] = parsed
        if len(self._manifests) > _MANIFEST_CACHE_SIZE:
            self._manifests.popitem(last=False)
        self._infos[snapshot_id] = SnapshotInfo.from_manifest(parsed.document)
        return parsed

    def _forget(self, snapshot_id: str) -> None:
        self._manifests.pop(snapshot_id, None)
        self._infos.pop(snapshot_id, None)

    async def read_snapshot(self, snapshot_id: str) -> GradientsParamsRecord:
        """The snapshot's gradients, every chunk's crc32c verified.

        The record's metadata is what was written, plus ``"snapshot"``: id, run, step,
        created_at, device and tags. ChecksumMismatchError names the damaged parameter.
        """
        snapshot_id = parse_snapshot_id(snapshot_id)
        with paused_gc():  # the manifest and the entries are many small acyclic objects
            return await self._read_snapshot(snapshot_id)

    async def _recheck(self, snapshot_id: str) -> None:
        """SnapshotNotFoundError if the snapshot was deleted since its manifest was loaded."""
        self._forget(snapshot_id)
        await self._load_manifest(snapshot_id)

    def _reader(self, manifest: Manifest) -> SnapshotReader:
        snapshot_id = manifest.snapshot_id
        return SnapshotReader(
            self._backend, self._threads, manifest, lambda: self._recheck(snapshot_id)
        )

    async def _read_snapshot(self, snapshot_id: str) -> GradientsParamsRecord:
        manifest = await self._load_manifest(snapshot_id)
        ordered = await self._reader(manifest).read_all(self.max_concurrency)
        document = manifest.document
        metadata = dict(document.get("metadata") or {})
        metadata["snapshot"] = {
            key: copy.deepcopy(document[key])
            for key in ("id", "run", "step", "created_at", "device", "tags")
        }
        # entries are built from the manifest's own dtype and shape: consistent by construction
        return GradientsParamsRecord.from_checked_entries(ordered, metadata=metadata)

    async def read_gradient(self, snapshot_id: str, param_id: ParamId | str) -> GradientRecordEntry:
        """One gradient of a snapshot (only its chunks are read and verified)."""
        manifest, position = await self._locate(snapshot_id, param_id)
        return await self._reader(manifest).read_one(position)

    async def _locate(self, snapshot_id: str, param_id: ParamId | str) -> tuple[Manifest, int]:
        """The snapshot's manifest and the gradient's position in it; ids checked before I/O."""
        snapshot_id = parse_snapshot_id(snapshot_id)
        pid = str(as_param_id(param_id))
        manifest = await self._load_manifest(snapshot_id)
        position = manifest.position(pid)
        if position is None:
            raise MissingGradientError(f"snapshot {snapshot_id} has no gradient for param {pid}")
        return manifest, position

    # --- streaming reads --------------------------------------------------------------

    async def iter_gradient(
        self, snapshot_id: str, param_id: ParamId | str, start: int = 0, end: int | None = None
    ) -> AsyncIterator[memoryview]:
        """Bytes ``[start, end)`` of one gradient (little-endian, C order), chunk by chunk.

        Never the whole gradient at once: each piece is (part of) one stored chunk, whose
        crc32c is verified before any of its bytes is yielded (for the whole gradient, its
        checksum too, before the last piece); at most 32 MiB of chunks, or one larger
        chunk, is held. Ids and the range are checked before any I/O (InvalidRangeError
        unless ``0 <= start <= end <= nbytes``); the array's document and the presence of
        every chunk needed are checked before the first piece. A damaged chunk raises
        ChecksumMismatchError naming the snapshot, the param id and the name, ending the
        stream where it is.
        """
        manifest, position = await self._locate(snapshot_id, param_id)
        start, end = checked_range(
            start,
            end,
            manifest.columns["nbytes"][position],
            f"snapshot {snapshot_id}: {manifest.describe(position)}",
        )
        async for piece in self._reader(manifest).stream(position, start, end):
            yield piece

    async def iter_safetensors(
        self, snapshot_id: str
    ) -> tuple[int, AsyncIterator[bytes | memoryview]]:
        """The snapshot as one safetensors file: its length in bytes, and its pieces.

        The header is built from the manifest alone (keys: ParamId texts; names and the
        manifest's summary in ``__metadata__``; docs/FORMAT.md); then each gradient
        streams as :meth:`iter_gradient` streams it. Every chunk is seen to be in the
        store before this returns; a damaged one ends the stream with
        ChecksumMismatchError.
        """
        snapshot_id = parse_snapshot_id(snapshot_id)
        manifest = await self._load_manifest(snapshot_id)
        reader = self._reader(manifest)
        objects = await reader.present_objects()
        columns = manifest.columns
        sizes = columns["nbytes"]
        entries = list(
            zip(columns["param_id"], columns["dtype"], columns["shape"], sizes, strict=True)
        )
        summary = {k: v for k, v in manifest.document.items() if k not in ("gradients", "packed")}
        names = dict(zip(columns["param_id"], columns["name"], strict=True))
        metadata = gradvault_metadata(names, summary)
        if manifest.count > _THREAD_HEADER_COUNT:
            header = await self._threads.run(encode_header, entries, metadata)
        else:
            header = encode_header(entries, metadata)

        async def pieces() -> AsyncIterator[bytes | memoryview]:
            yield header
            packed = reader.packed_chunks(objects.get(PACKED_ARRAY, {}))
            arrays = columns["array"]
            for position in data_order(entries):
                async for piece in reader.stream(
                    position,
                    0,
                    sizes[position],
                    objects=objects.get(arrays[position], {}),
                    packed=packed,
                ):
                    yield piece

        return len(header) + sum(sizes), pieces()

    async def read_key(self, path: str, *, start: int = 0, end: int | None = None) -> memoryview:
        """The bytes of one key of the store's read-only Zarr view (``[start, end)`` of it).

        ``path`` is checked before any I/O (InvalidStorePathError for ``..``, ``.``, empty
        segments, backslashes, absolute paths, control characters, hidden names such as
        ``.staging``, paths over 512 characters). Readable: ``zarr.json``,
        ``snapshots/zarr.json`` and, for a committed snapshot, its group ``zarr.json``, its
        arrays' ``zarr.json`` (checked against the manifest) and the chunks in their chunk
        grids (crc32c verified); anything else is StoreKeyNotFoundError (or
        SnapshotNotFoundError), a KeyError.
        """
        return await self._zarr_view.read(path, start, end)

    async def key_size(self, path: str) -> int:
        """The stored size of the key ``read_key(path)`` reads, without reading it."""
        return await self._zarr_view.size(path)

    # --- listing and housekeeping -----------------------------------------------------

    async def list(
        self,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
    ) -> list[SnapshotInfo]:
        """Committed snapshots, newest first, filtered by run and inclusive step range.

        A snapshot whose manifest is malformed or of another format version is left out;
        ``info`` and ``read_snapshot`` of it raise FormatVersionError saying what is wrong.
        """
        return await self._listing(run, step_min, step_max, fresh=False)

    async def _listing(
        self,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        *,
        fresh: bool,
    ) -> list[SnapshotInfo]:
        """``list()``; with ``fresh``, every snapshot's manifest is checked now, not recalled."""
        ids = await self._backend.committed_ids(fresh=fresh)
        slots = asyncio.Semaphore(self.max_concurrency)

        async def load(snapshot_id: str) -> None:
            async with slots:
                try:
                    await self._load_manifest(snapshot_id)
                except SnapshotNotFoundError:
                    pass  # deleted since the listing
                except FormatVersionError as error:
                    # unreadable: left out of listings, explained by info() and reads
                    _log.warning(
                        "store %s: snapshot %s is not listed: %s", self.location, snapshot_id, error
                    )

        await asyncio.gather(*(load(i) for i in ids if i not in self._infos))
        found = [self._infos[i] for i in ids if i in self._infos]
        return sorted(
            (
                info
                for info in found
                if (run is None or info.run == run)
                and (step_min is None or info.step >= step_min)
                and (step_max is None or info.step <= step_max)
            ),
            key=lambda info: info.id,
            reverse=True,
        )

    async def info(self, snapshot_id: str) -> dict[str, Any]:
        """The snapshot's manifest (a copy): see docs/FORMAT.md for its fields.

        A manifest remembered from an earlier call is used only after checking that the
        snapshot is still committed, so a snapshot that another process or store handle
        deleted raises SnapshotNotFoundError here too.
        """
        snapshot_id = parse_snapshot_id(snapshot_id)
        if snapshot_id in self._manifests and not await self._backend.is_committed(snapshot_id):
            self._forget(snapshot_id)
        return copy.deepcopy((await self._load_manifest(snapshot_id)).document)

    async def delete(self, snapshot_id: str) -> None:
        """Delete a committed snapshot; SnapshotNotFoundError if there is none."""
        snapshot_id = parse_snapshot_id(snapshot_id)
        self._forget(snapshot_id)
        if not await self._backend.delete_snapshot(snapshot_id):
            raise SnapshotNotFoundError(
                f"no committed snapshot {snapshot_id} in store {self.location}"
            )

    async def gc(self, grace_seconds: float = 3600) -> list[str]:
        """Remove leftovers of writes that never committed, untouched for ``grace_seconds``.

        Returns the names of what was removed (snapshot ids; locally, staging folder names).
        """
        if not isinstance(grace_seconds, int | float) or grace_seconds < 0:
            raise ValueError(f"grace_seconds must be a number >= 0; got {grace_seconds!r}")
        return await self._backend.collect_garbage(grace_seconds)

    async def apply_retention(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        run: str | None = None,
        *,
        keep: Collection[str] = (),
    ) -> list[str]:
        """Delete snapshots (of ``run``, or all) that no rule keeps; the deleted ids.

        Kept: the ``keep_last`` newest by id (creation order, as ``list()`` sorts), every
        snapshot whose step is a multiple of ``keep_every``, the ids in ``keep``, and always
        the newest readable one. With both rules None nothing is deleted. The pass decides
        from a fresh listing (every manifest checked now, no cache; the newest one read
        and validated again), and before each deletion checks that the newest snapshot it
        keeps is still there; if someone else deleted it meanwhile, it decides again
        rather than leave the store without it.
        """
        rules = RetentionRules(keep_last, keep_every)
        if isinstance(keep, str):
            raise ValueError(f"keep must be a collection of snapshot ids; got one string {keep!r}")
        protected = {parse_snapshot_id(snapshot_id) for snapshot_id in keep}
        if rules.keeps_everything:
            return []
        return await RetentionPass(self, rules, protected).run(run)
