"""SnapshotStore: write, read, list, delete and expire gradient snapshots in a Zarr v3 store.

The store encodes chunks and writes the Zarr metadata itself (``_format``), builds the
manifest (``_manifest``) and leaves the commit protocol to its backend (``_local``,
``_s3``). docs/FORMAT.md is the layout.
"""

from __future__ import annotations

import asyncio
import builtins  # builtins.list in annotations: inside the classes, list is a method
import copy
from collections.abc import AsyncGenerator, AsyncIterator, Collection
from typing import Any

import numpy as np

from ..errors import (
    InvalidArgumentError,
    MissingGradientError,
    ShardedSnapshotError,
    SnapshotNotFoundError,
)
from ..records.param_id import ParamId, as_param_id
from ..records.record import GradientRecordEntry, GradientsParamsRecord, paused_gc
from ..records.record_rules import check_metadata, check_snapshot_fields
from ..records.safetensors_file import data_order, encode_header, gradvault_metadata
from ._backend import (
    StoreBackend,
    ThreadRunner,
)
from ._commit_order import CommitTurn, holding
from ._device_snapshot import DeviceSnapshot
from ._ids import new_snapshot_id, parse_snapshot_id
from ._manifest import Manifest, SnapshotInfo
from ._manifest_cache import ManifestCache
from ._manifest_checksum import MANIFEST_CHECKSUM_KEY
from ._retention import RetentionPass, RetentionRules
from ._shards import ShardedManifest, ShardedSet, ShardInfo, check_rank, manifest_in
from ._write import OneChunkPlans, SnapshotWrite
from ._zarr_format import (
    PACKED_ARRAY,
    Compression,
    parse_compression,
)
from ._zarr_view import ZarrView, checked_range

#: Safetensors headers of more gradients than this are encoded in a thread.
_THREAD_HEADER_COUNT = 1000
#: Manifests of more gradients than this are copied for ``info`` in a thread.
_THREAD_COPY_COUNT = 1000


class SnapshotStore:
    """Gradient snapshots in a Zarr v3 hierarchy; get one from :func:`open_store`.

    Every method is a coroutine. A snapshot is visible (to ``list``, ``read_snapshot``,
    other processes) only once wholly written; ids are from :func:`new_snapshot_id`.
    """

    def __init__(
        self,
        backend: StoreBackend,
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
        self._manifests = ManifestCache(backend, threads)
        #: the layouts and unchanging manifest columns of one-step snapshots, by structure
        self._plans = OneChunkPlans()
        self._zarr_view = ZarrView(backend, self._manifests)

    @property
    def location(self) -> str:
        """The folder or URL the store lives at."""
        return self._backend.location

    @property
    def backend(self) -> StoreBackend:
        """The backend every read, write, listing and removal of this store goes through.

        Read-only. For fault injection and inspection (docs/API.md, "The store's
        backend"): the store, its readers and writers call this one instance, so a
        method wrapped on it sees every such call. Writing through it bypasses the
        store's checks.
        """
        return self._backend

    def __repr__(self) -> str:
        return f"SnapshotStore({self.location!r})"

    async def __aenter__(self) -> SnapshotStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def check(self) -> None:
        """Raise StoreUnavailableError, in one line naming what is missing (a folder, an
        endpoint, credentials), if this store cannot be listed; nothing is written."""
        await self._backend.check()

    async def close(self) -> None:
        """Release the store's threads and connections."""
        await self._backend.close()
        if self._threads.started:  # its shutdown waits for the threads: not on the loop
            await asyncio.to_thread(self._threads.close)

    # --- writing ----------------------------------------------------------------------

    async def write_snapshot(
        self,
        record: GradientsParamsRecord | DeviceSnapshot,
        *,
        run: str,
        step: int,
        tags: dict[str, str] | None = None,
        device: str = "cpu",
        compression: str | None = None,
        turn: CommitTurn | None = None,
    ) -> SnapshotInfo:
        """Write ``record`` as a new snapshot and commit it; its SnapshotInfo once durable.

        ``record`` is a host record, or a DeviceSnapshot of gradients on a CUDA device
        (their large arrays streamed to host chunk by chunk through its ring pool; the
        bytes stored are the same).

        ``compression`` is None, ``"zstd"`` or ``"zstd:<level>"``. On any failure nothing
        becomes visible and the partial write is removed where possible
        (StoreUnavailableError for I/O failures, a full disk included). With ``turn``
        (``CommitOrder.take()``), the snapshot gets the turn's id and becomes visible
        only after the snapshots of every earlier turn of its order, while its writes
        and fsyncs run alongside theirs; the turn is released in any case.
        """
        with holding(turn):  # released whatever happens, refused arguments included
            run, step, tags, codec = _checked_write(record, run, step, tags, device, compression)
            snapshot_id = new_snapshot_id() if turn is None else turn.snapshot_id
            write = self._write(snapshot_id, codec)
            manifest = await write.run(
                record, run=run, step=step, tags=tags, device=device, turn=turn
            )
        return self._written(manifest)

    def _written(self, manifest: dict[str, Any]) -> SnapshotInfo:
        """The info of the snapshot whose ``manifest`` was just committed, cached."""
        info = SnapshotInfo.from_manifest(manifest)
        self._manifests.written(info)
        return info

    def write_snapshot_blocking(
        self,
        record: GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: dict[str, str] | None = None,
        device: str = "cpu",
        compression: str | None = None,
        turn: CommitTurn | None = None,
    ) -> SnapshotInfo | None:
        """:meth:`write_snapshot` in the calling thread, for a snapshot written and
        committed in one step; None, with nothing written, for any other.

        One step: a host record no longer than a chunk, uncompressed, holding a gradient
        of at least ``pack_threshold`` bytes, in a store whose backend commits so
        (:meth:`StoreBackend.begin_blocking`: the local folder does, making its folders
        first where no write has yet). The same write, to the same bytes, with the same errors
        as :meth:`write_snapshot`'s, with no trip through an event loop or another thread
        but the device's (for a thread that runs no event loop: it blocks until the
        snapshot is durable). ``turn``, if given, must be open (every earlier turn of its
        order released); it is not released here, but by its holder.
        """
        run, step, tags, codec = _checked_write(record, run, step, tags, device, compression)
        snapshot_id = new_snapshot_id() if turn is None else turn.snapshot_id
        write = self._write(snapshot_id, codec)
        plan = write.one_step_plan(record)
        writer = None if plan is None else self._backend.begin_blocking(snapshot_id)
        if plan is None or writer is None:
            return None
        writer.turn = turn
        manifest = write.run_blocking(
            writer, record, plan, run=run, step=step, tags=tags, device=device
        )
        return self._written(manifest)

    async def write_shard(
        self,
        record: GradientsParamsRecord | DeviceSnapshot,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: dict[str, str] | None = None,
        device: str = "cpu",
        compression: str | None = None,
    ) -> ShardInfo:
        """Write ``record`` as rank ``rank``'s shard of the sharded snapshot ``snapshot_id``.

        Returns once the shard is durable. The snapshot commits when every rank of
        ``world_size`` has written its shard, in the call of the rank that completes it
        (``ShardInfo.committed``; docs/FORMAT.md, "Sharded snapshots"). Every rank passes
        the same id (drawn once, e.g. by rank 0 with :func:`new_snapshot_id`), world
        size, run, step and tags: InvalidArgumentError or InvalidFieldError otherwise, and
        for a rank written twice or outside ``0..world_size-1``; nothing commits then.
        """
        run, step, tags, codec = _checked_write(record, run, step, tags, device, compression)
        snapshot_id = parse_snapshot_id(snapshot_id)
        rank, world_size = check_rank(rank, world_size)
        if await self._backend.is_committed(snapshot_id):
            raise InvalidArgumentError(
                f"snapshot {snapshot_id} is committed already; rank {rank} cannot add a "
                f"shard to it (was rank {rank} written twice, or the id reused?)"
            )
        shards = ShardedSet(
            snapshot_id, rank=rank, world_size=world_size, run=run, step=step, tags=tags
        )
        write = self._write(snapshot_id, codec, shards)
        manifest = await write.run(record, run=run, step=step, tags=tags, device=device)
        snapshot = None
        if write.committed_document is not None:
            top = manifest_in(write.committed_document, f"snapshot {snapshot_id}")
            snapshot = self._written(top)
        return ShardInfo(
            id=snapshot_id,
            run=run,
            step=step,
            created_at=manifest["created_at"],
            rank=rank,
            world_size=world_size,
            nbytes=manifest["nbytes"],
            num_params=manifest["num_params"],
            committed=snapshot is not None,
            snapshot=snapshot,
        )

    def _write(
        self, snapshot_id: str, codec: Compression | None, shard: ShardedSet | None = None
    ) -> SnapshotWrite:
        """The write pipeline of one snapshot, or of one rank's shard, with this store's sizes."""
        return SnapshotWrite(
            self._backend,
            self._threads,
            snapshot_id=snapshot_id,
            pack_threshold=self.pack_threshold,
            chunk_bytes=self.chunk_bytes,
            max_concurrency=self.max_concurrency,
            compression=codec,
            shard=shard,
            plans=self._plans,
        )

    # --- reading ----------------------------------------------------------------------

    async def read_snapshot(
        self, snapshot_id: str, *, rank: int | None = None
    ) -> GradientsParamsRecord:
        """The snapshot's gradients, every chunk's crc32c verified.

        The record's metadata is what was written, plus ``"snapshot"``: id, run, step,
        created_at, device and tags. ChecksumMismatchError names the damaged parameter.
        Of a sharded snapshot: rank ``rank``'s shard (``"snapshot"`` then also holds
        ``rank`` and ``world_size``), or without ``rank`` every shard merged in rank order
        when no ParamId is in two shards (ShardedSnapshotError naming one otherwise).
        """
        snapshot_id = parse_snapshot_id(snapshot_id)
        with paused_gc():  # the manifest and the entries are many small acyclic objects
            top = await self._manifests.top(snapshot_id)
            if isinstance(top, ShardedManifest) and rank is None:
                return await self._read_merged(top)
            return await self._read_snapshot(await self._manifests.manifest(snapshot_id, rank))

    async def _read_merged(self, top: ShardedManifest) -> GradientsParamsRecord:
        """Every shard of a sharded snapshot as one record, if their ParamIds are disjoint."""
        snapshot_id = top.snapshot_id
        shards = [await self._manifests.manifest(snapshot_id, r) for r in range(top.world_size)]
        owner: dict[str, int] = {}
        for rank, shard in enumerate(shards):
            for pid in shard.columns["param_id"]:
                first = owner.setdefault(pid, rank)
                if first != rank:
                    raise ShardedSnapshotError(
                        f"snapshot {snapshot_id} is sharded over {top.world_size} ranks and "
                        f"param {pid} is in the shards of ranks {first} and {rank}, so they "
                        f"cannot be merged into one record: pass rank= (0..{top.world_size - 1})"
                        f" to read one rank's shard"
                    )
        ids: list[ParamId] = []
        names: list[str] = []
        dtypes: list[str] = []
        arrays: list[np.ndarray] = []
        for shard in shards:
            arrays.extend(await self._manifests.reader(shard).read_all(self.max_concurrency))
            ids.extend(shard.param_ids())
            names.extend(shard.columns["name"])
            dtypes.extend(shard.columns["dtype"])
        summary = {
            key: copy.deepcopy(top.document[key])
            for key in ("id", "run", "step", "created_at", "device", "tags", "world_size")
        }
        # ids unique: each shard's manifest was validated, and no id is in two shards
        return GradientsParamsRecord.from_columns(
            ids, names, dtypes, arrays, metadata={"snapshot": summary}, unique_ids=True
        )

    async def _read_snapshot(self, manifest: Manifest) -> GradientsParamsRecord:
        arrays = await self._manifests.reader(manifest).read_all(self.max_concurrency)
        document = manifest.document
        metadata = dict(document.get("metadata") or {})
        metadata["snapshot"] = {
            key: copy.deepcopy(document[key])
            for key in ("id", "run", "step", "created_at", "device", "tags")
        }
        if manifest.shard is not None:
            metadata["snapshot"]["rank"], metadata["snapshot"]["world_size"] = manifest.shard
        # arrays are built from the manifest's own dtype and shape: consistent by
        # construction, and the validated manifest's ids are unique
        return GradientsParamsRecord.from_columns(
            manifest.param_ids(),
            manifest.columns["name"],
            manifest.columns["dtype"],
            arrays,
            metadata=metadata,
            unique_ids=True,
        )

    async def read_gradient(
        self, snapshot_id: str, param_id: ParamId | str, *, rank: int | None = None
    ) -> GradientRecordEntry:
        """One gradient of a snapshot, or of rank ``rank``'s shard of a sharded one (only
        its chunks are read and verified)."""
        manifest, position = await self._locate(snapshot_id, param_id, rank)
        return await self._manifests.reader(manifest).read_one(position)

    async def _locate(
        self, snapshot_id: str, param_id: ParamId | str, rank: int | None = None
    ) -> tuple[Manifest, int]:
        """The snapshot's manifest and the gradient's position in it; ids checked before I/O."""
        snapshot_id = parse_snapshot_id(snapshot_id)
        pid = str(as_param_id(param_id))
        manifest = await self._manifests.manifest(snapshot_id, rank)
        position = manifest.position(pid)
        if position is None:
            raise MissingGradientError(f"snapshot {snapshot_id} has no gradient for param {pid}")
        return manifest, position

    # --- streaming reads --------------------------------------------------------------

    async def iter_gradient(
        self,
        snapshot_id: str,
        param_id: ParamId | str,
        start: int = 0,
        end: int | None = None,
        *,
        rank: int | None = None,
    ) -> AsyncIterator[memoryview]:
        """Bytes ``[start, end)`` of one gradient (little-endian, C order), chunk by chunk.

        Never the whole gradient at once: each piece is (part of) one stored chunk, whose
        crc32c is verified before any of its bytes is yielded (for the whole gradient, its
        checksum too, before the last piece); at most 32 MiB of chunks, or one larger
        chunk, is held. Ids and the range are checked before any I/O (InvalidRangeError
        unless ``0 <= start <= end <= nbytes``); the array's document and the presence of
        every chunk needed are checked before the first piece. A damaged chunk raises
        ChecksumMismatchError naming the snapshot, the param id and the name, ending the
        stream where it is. ``rank`` picks a shard of a sharded snapshot.
        """
        manifest, position = await self._locate(snapshot_id, param_id, rank)
        start, end = checked_range(
            start,
            end,
            manifest.columns["nbytes"][position],
            f"snapshot {snapshot_id}: {manifest.describe(position)}",
        )
        async for piece in self._manifests.reader(manifest).stream(position, start, end):
            yield piece

    async def iter_safetensors(
        self, snapshot_id: str, *, rank: int | None = None
    ) -> tuple[int, AsyncGenerator[bytes | memoryview, None]]:
        """The snapshot as one safetensors file: its length in bytes, and its pieces.

        The header is built from the manifest alone (keys: ParamId texts; names and the
        manifest's summary in ``__metadata__``; docs/FORMAT.md); then each gradient
        streams as :meth:`iter_gradient` streams it. Every chunk is seen to be in the
        store before this returns; a damaged one ends the stream with
        ChecksumMismatchError. ``rank`` picks a shard of a sharded snapshot (without it,
        ShardedSnapshotError).
        """
        snapshot_id = parse_snapshot_id(snapshot_id)
        manifest = await self._manifests.manifest(snapshot_id, rank)
        reader = self._manifests.reader(manifest)
        objects = await reader.present_objects()
        columns = manifest.columns
        sizes = columns["nbytes"]
        entries = list(
            zip(columns["param_id"], columns["dtype"], columns["shape"], sizes, strict=True)
        )
        # the manifest's checksum covers the whole manifest, so it leaves with the gradients
        left_out = ("gradients", "packed", MANIFEST_CHECKSUM_KEY)
        summary = {k: v for k, v in manifest.document.items() if k not in left_out}
        names = dict(zip(columns["param_id"], columns["name"], strict=True))
        metadata = gradvault_metadata(names, summary)
        if manifest.count > _THREAD_HEADER_COUNT:
            header = await self._threads.run(encode_header, entries, metadata)
        else:
            header = encode_header(entries, metadata)

        async def pieces() -> AsyncGenerator[bytes | memoryview, None]:
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
                    del piece  # not kept while the next piece is read

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
        return await self._manifests.listing(
            run, step_min, step_max, fresh=False, concurrency=self.max_concurrency
        )

    async def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]:
        """The snapshot's manifest (a copy): see docs/FORMAT.md for its fields.

        Of a sharded snapshot: its sharded manifest (``world_size``, ``shards``), or with
        ``rank`` that rank's shard's manifest. A manifest remembered from an earlier call
        is used only after checking that the snapshot is still committed, so a snapshot
        that another process or store handle deleted raises SnapshotNotFoundError here too.
        """
        snapshot_id = parse_snapshot_id(snapshot_id)
        if self._manifests.remembers(snapshot_id) and not await self._backend.is_committed(
            snapshot_id
        ):
            self._manifests.forget(snapshot_id)
        if rank is None:
            manifest = await self._manifests.top(snapshot_id)
        else:
            manifest = await self._manifests.manifest(snapshot_id, rank)
        if isinstance(manifest, Manifest) and manifest.count > _THREAD_COPY_COUNT:
            # a copy of 100,000 gradients' columns takes most of a second: not on the loop
            return await self._threads.run(copy.deepcopy, manifest.document)
        return copy.deepcopy(manifest.document)

    async def delete(self, snapshot_id: str) -> None:
        """Delete a committed snapshot; SnapshotNotFoundError if there is none."""
        snapshot_id = parse_snapshot_id(snapshot_id)
        self._manifests.forget(snapshot_id)
        if not await self._backend.delete_snapshot(snapshot_id):
            raise SnapshotNotFoundError(
                f"no committed snapshot {snapshot_id} in store {self.location}"
            )

    async def gc(self, grace_seconds: float = 3600) -> builtins.list[str]:
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
    ) -> builtins.list[str]:
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
        return await RetentionPass(self, self._manifests, rules, protected).run(run)


def _checked_write(
    record: object,
    run: object,
    step: object,
    tags: object,
    device: object,
    compression: object,
) -> tuple[str, int, dict[str, str], Compression | None]:
    """A write's arguments checked before any I/O: run, step, tags and the zstd level."""
    if not isinstance(record, GradientsParamsRecord | DeviceSnapshot):
        raise TypeError(
            f"record must be a GradientsParamsRecord or a DeviceSnapshot; "
            f"got {type(record).__name__}"
        )
    run, step, tags = check_snapshot_fields(run, step, tags)
    if not isinstance(device, str) or not device:
        raise ValueError(f"device must be a non-empty string; got {device!r}")
    codec = parse_compression(compression)
    check_metadata(record.metadata)  # the dict may have changed since the record was built
    return run, step, tags, codec
