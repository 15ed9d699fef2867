"""The write pipeline: one snapshot's arrays written in parallel, its manifest, its commit.

Each gradient of at least ``pack_threshold`` bytes gets its own array; the smaller ones
are packed into one (``_manifest.pack``). Per array, each chunk is reduced into the
gradient's stats and then written, checksummed as it goes (the backend fills each
chunk's crc32c trailer slice by slice); the gradient's checksum is combined from its
chunks' crc32c, never a second pass. The pages of a mapped file (an upload) are let go
as they are read and written, so a write holds about a slice of it (SLICE_BYTES) per
array in flight. The manifest is encoded while the last writes finish; nothing is
visible to a reader before the backend's commit, and a failure anywhere aborts the
whole write.

A DeviceSnapshot (gradients on a CUDA device) is written the same way, to the same
bytes, except where the chunks come from: each large gradient's chunks are copied from
the device one at a time into a ring of pinned host buffers lent by the snapshot's
RingPool (``_chunks.StreamedChunks``), so host memory is bounded by the pool; the small
ones are read to host whole and packed.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ..errors import StoreUnavailableError
from ..records.record import GradientRecordEntry, GradientsParamsRecord
from ._backend import EncodedChunk, ShardWriter, SnapshotWriter, StoreBackend, ThreadRunner
from ._checksums import (
    format_checksum,
)
from ._chunks import Abandoned, GradientChunks, OneChunkPacked, StreamedChunks, end_stream
from ._commit_order import CommitTurn, holding
from ._device_snapshot import DeviceGradient, DeviceSnapshot
from ._device_stream import RingPool
from ._manifest import (
    OneChunkPlan,
    PackedGradients,
    build_manifest,
    pack,
    structure,
)
from ._manifest_checksum import seal
from ._shards import ShardedSet
from ._stats import packed_columns
from ._zarr_format import (
    PACKED_ARRAY,
    PACKED_AT_ROOT,
    Compression,
    array_metadata,
    chunk_shape_for,
    chunk_spans,
    dump_json,
    group_metadata,
    packed_layout,
)

#: A manifest of at most this many gradients is encoded on the event loop (a fraction of
#: a millisecond), not in a thread: the trip there and back would cost more.
INLINE_MANIFEST_GRADIENTS = 64


class OneChunkPlans:
    """A store's last few :class:`OneChunkPlan`, by what they depend on (the record's
    ``structure``, the store's pack threshold and chunk size); None for a structure that
    is not written in one step. Shared by the threads that write."""

    #: How many structures are remembered (the oldest is forgotten first)
    MOST = 4

    def __init__(self) -> None:
        self._plans: dict[tuple[Any, ...], OneChunkPlan | None] = {}
        self._lock = threading.Lock()

    def get(
        self, key: tuple[Any, ...], make: Callable[[], OneChunkPlan | None]
    ) -> OneChunkPlan | None:
        """The plan remembered for ``key``, else ``make()``'s, remembered."""
        with self._lock:
            if key in self._plans:
                return self._plans[key]
        plan = make()
        with self._lock:
            self._plans[key] = plan
            while len(self._plans) > self.MOST:
                del self._plans[next(iter(self._plans))]
        return plan


class SnapshotWrite:
    """Writes one record as snapshot ``snapshot_id``; :meth:`run` returns its manifest.

    With ``shard`` it writes one rank's shard of a sharded snapshot instead, and publishes
    it; ``committed_document`` is then the snapshot's group document if the snapshot
    committed (every rank's shard is there), else None.
    """

    def __init__(
        self,
        backend: StoreBackend,
        threads: ThreadRunner,
        *,
        snapshot_id: str,
        pack_threshold: int,
        chunk_bytes: int,
        max_concurrency: int,
        compression: Compression | None,
        plans: OneChunkPlans,
        shard: ShardedSet | None = None,
    ) -> None:
        self._backend = backend
        self._plans = plans
        self._shard = shard
        self.committed_document: bytes | None = None
        self._threads = threads
        self._id = snapshot_id
        self.snapshot_id = snapshot_id
        self._pack_threshold = pack_threshold
        self._chunk_bytes = chunk_bytes
        self._slots = asyncio.Semaphore(max_concurrency)
        self._compression = compression
        #: set once any array fails: the others stop at their next chunk
        self.failed = False
        #: writes still in flight once their arrays' checksums and stats are known
        self._in_flight: list[asyncio.Future[None]] = []
        #: each array's ``zarr.json`` document by array name, for the group's
        #: consolidated metadata
        self._array_documents: dict[str, dict[str, Any]] = {}

    def _fits_one_chunk(self, record: GradientsParamsRecord | DeviceSnapshot) -> bool:
        """Whether ``record``'s snapshot is one chunk of the packed array: where packing is
        on and it is no longer than a chunk (one file and one folder to write and fsync,
        not a folder tree per gradient)."""
        return bool(self._pack_threshold) and record.nbytes <= self._chunk_bytes

    def _packed_and_own(
        self, record: GradientsParamsRecord | DeviceSnapshot
    ) -> tuple[list[int], list[int]]:
        """The record positions of the packed gradients and of those with arrays of their own."""
        entries: tuple[Any, ...] = record.entries
        threshold = math.inf if self._fits_one_chunk(record) else self._pack_threshold
        packed = [i for i, entry in enumerate(entries) if entry.array.nbytes < threshold]
        own = [i for i, entry in enumerate(entries) if entry.array.nbytes >= threshold]
        return packed, own

    def one_step_plan(
        self,
        record: GradientsParamsRecord | DeviceSnapshot,
        positions: tuple[list[int], list[int]] | None = None,
    ) -> OneChunkPlan | None:
        """The plan of ``record``'s snapshot if it is written and committed in one step (a
        host record, not a shard, that is one uncompressed chunk of the packed array
        holding a gradient of at least ``pack_threshold`` bytes), else None. Made once per
        structure of record (``OneChunkPlans``); ``positions`` is the record's
        :meth:`_packed_and_own`, where known already."""
        if self._shard is not None or isinstance(record, DeviceSnapshot):
            return None
        if self._compression is not None or not self._fits_one_chunk(record):
            return None
        if all(entry.array.nbytes < self._pack_threshold for entry in record.entries):
            # no large gradient: ``_one_chunk_layout`` packs it into one buffer; no plan,
            # and the record's structure is not worked out (1.2 ms for 10,000 gradients)
            return None
        key = (structure(record), self._pack_threshold, self._chunk_bytes)
        return self._plans.get(key, lambda: self._new_plan(record, positions))

    def _new_plan(
        self, record: GradientsParamsRecord, positions: tuple[list[int], list[int]] | None
    ) -> OneChunkPlan | None:
        packed_positions, own_positions = positions or self._packed_and_own(record)
        if own_positions:
            return None
        entries = record.entries
        layout = self._one_chunk_layout([entries[i] for i in packed_positions])
        return None if layout is None else OneChunkPlan(record, *layout)

    def _manifest_maker(
        self,
        record: GradientsParamsRecord | DeviceSnapshot,
        packed_positions: list[int],
        run: str,
        step: int,
        tags: dict[str, str],
        device: str,
    ) -> Callable[[PackedGradients | None, dict[int, dict[str, Any]]], dict[str, Any]]:
        """``manifest_of(packed, own_arrays)``: the manifest once every array is written."""
        shard = self._shard

        def manifest_of(
            packed: PackedGradients | None, own_arrays: dict[int, dict[str, Any]]
        ) -> dict[str, Any]:
            return build_manifest(
                record,
                snapshot_id=self._id,
                run=run,
                step=step,
                tags=tags,
                device=device,
                compression=self._compression,
                packed_positions=packed_positions,
                packed=packed,
                own_arrays=own_arrays,
                shard=None if shard is None else (shard.rank, shard.world_size),
            )

        return manifest_of

    def run_blocking(
        self,
        writer: SnapshotWriter,
        record: GradientsParamsRecord,
        plan: OneChunkPlan,
        *,
        run: str,
        step: int,
        tags: dict[str, str],
        device: str,
    ) -> dict[str, Any]:
        """:meth:`run` of a record that commits in one step (``plan`` is its
        :meth:`one_step_plan`), in the calling thread, through ``writer`` (from the
        backend's ``begin_blocking``, its turn open); the manifest once durable.

        The same write as :meth:`run`'s: on any failure nothing becomes visible and the
        staging folder is removed; OSError becomes StoreUnavailableError. The writer's
        turn is left to its holder to release.
        """
        try:
            name, document, chunks, group_document, made = self._one_step(
                record, plan, run, step, tags, device
            )
            writer.write_array_and_commit_blocking(name, document, chunks, group_document)
        except BaseException as error:
            self.failed = True
            writer.abort_blocking()
            self._raise_unavailable(error)
            raise
        return made[0]

    def _raise_unavailable(self, error: BaseException) -> None:
        """Raise an OSError of the write as StoreUnavailableError naming the store and the
        snapshot; any other error is left to the caller to raise."""
        if isinstance(error, OSError) and not isinstance(error, StoreUnavailableError):
            raise StoreUnavailableError(
                f"store {self._backend.location}: writing snapshot {self._id} failed: {error}"
            ) from error

    async def run(
        self,
        record: GradientsParamsRecord | DeviceSnapshot,
        *,
        run: str,
        step: int,
        tags: dict[str, str],
        device: str,
        turn: CommitTurn | None = None,
    ) -> dict[str, Any]:
        """Write every array, then commit the manifest; the manifest once durable.

        With ``turn`` the snapshot becomes visible in its turn (``_commit_order``); the
        turn is released once it is visible or the write has failed. A DeviceSnapshot's
        small gradients are read to host whole and packed; each other one is streamed
        from its device through a ring of its pool. On any failure
        nothing becomes visible and the partial write is removed where possible; OSError
        becomes StoreUnavailableError naming the store and the snapshot.
        """
        entries: tuple[Any, ...] = record.entries
        positions = self._packed_and_own(record)
        packed_positions, own_positions = positions
        await self._backend.prepare()
        shard = self._shard
        small = [entries[i] for i in packed_positions]
        # a host snapshot of one uncompressed chunk: written and committed in one step
        alone = self.one_step_plan(record, positions)
        if shard is None:
            writer = await (
                self._backend.begin(self._id, in_one_step=True)
                if alone is not None
                else self._backend.begin(self._id)
            )
            writer.turn = turn
        else:
            writer = await self._backend.begin_shard(self._id, shard.rank)
        if isinstance(record, DeviceSnapshot):
            rings = record.rings
            jobs = [
                self._guarded(self._write_streamed, writer, entries[i], rings, device)
                for i in own_positions
            ]
        else:
            jobs = [self._guarded(self._write_own, writer, entries[i]) for i in own_positions]
        if packed_positions and alone is None:
            if isinstance(record, DeviceSnapshot):  # small: read to host whole, then packed
                jobs.append(self._guarded(self._write_packed_from_device, writer, small))
            else:
                jobs.append(self._guarded(self._write_packed, writer, small))

        manifest_of = self._manifest_maker(record, packed_positions, run, step, tags, device)

        try:
            # released on leaving the block: visible (the writer released it already), or
            # failed, and then before the abort, so a failed write holds up no later one
            with holding(turn):
                if alone is not None:
                    assert isinstance(record, GradientsParamsRecord)  # a host record
                    return await self._write_and_commit_one_chunk(
                        writer, record, alone, run, step, tags, device
                    )
                results = await asyncio.gather(*jobs, return_exceptions=True)
                failures = [r for r in results if isinstance(r, BaseException)]
                if failures:
                    raise next((f for f in failures if not isinstance(f, Abandoned)), failures[0])
                written = [r for r in results if not isinstance(r, BaseException)]  # all of them
                manifest = manifest_of(
                    written[-1] if packed_positions else None,
                    dict(zip(own_positions, written, strict=False)),
                )
                if len(entries) <= INLINE_MANIFEST_GRADIENTS:  # ~0.1 ms: not worth a thread
                    group_document = _manifest_document(manifest, self._array_documents)
                else:
                    group_document = await self._threads.run(
                        _manifest_document, manifest, self._array_documents
                    )
                if self._in_flight:
                    await asyncio.gather(*self._in_flight)
                if shard is None:
                    await writer.commit(group_document)
                else:
                    assert isinstance(writer, ShardWriter)
                    self.committed_document = await writer.publish(group_document, shard)
        except BaseException as error:
            self.failed = True
            await asyncio.gather(*self._in_flight, return_exceptions=True)
            await asyncio.shield(writer.abort())
            self._raise_unavailable(error)
            raise
        return manifest

    async def _guarded(self, job: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """Run ``job`` within the concurrency bound; a failure stops the other arrays."""
        async with self._slots:
            if self.failed:
                raise Abandoned
            try:
                return await job(*args)
            except BaseException:
                self.failed = True
                raise

    async def _write_own(
        self, writer: SnapshotWriter, entry: GradientRecordEntry
    ) -> dict[str, Any]:
        """Write one gradient's own array; its manifest columns (checksum, stats, ...)."""
        itemsize = entry.array.dtype.itemsize
        chunk_shape = chunk_shape_for(entry.shape, itemsize, self._chunk_bytes)
        spans = chunk_spans(entry.shape, chunk_shape, itemsize)
        values = entry.array.reshape(-1)
        chunks = GradientChunks(entry.data, spans, self._compression, self, values)
        attributes = {"gradvault": {"param_id": str(entry.param_id), "name": entry.name}}
        document = array_metadata(
            entry.shape, entry.dtype, chunk_shape, self._compression, attributes
        )
        self._array_documents[str(entry.param_id)] = document
        await writer.write_array(str(entry.param_id), dump_json(document), iter(chunks))
        return {
            "array": str(entry.param_id),
            "chunk_shape": list(chunk_shape),
            "checksum": format_checksum(chunks.checksum),
            "stats": chunks.stats.result(),
        }

    async def _write_streamed(
        self, writer: SnapshotWriter, entry: DeviceGradient, rings: RingPool, device: str
    ) -> dict[str, Any]:
        """Write one device gradient's own array, its chunks streamed through a ring."""
        chunk_shape = chunk_shape_for(entry.shape, entry.itemsize, self._chunk_bytes)
        spans = chunk_spans(entry.shape, chunk_shape, entry.itemsize)
        attributes = {"gradvault": {"param_id": str(entry.param_id), "name": entry.name}}
        document = array_metadata(
            entry.shape, entry.dtype, chunk_shape, self._compression, attributes
        )
        self._array_documents[str(entry.param_id)] = document
        async with rings.lend(max((span.length for span in spans), default=1)) as ring:
            chunks = StreamedChunks(entry, spans, self._compression, self, ring, device)
            stream = iter(chunks)
            try:
                await writer.write_array(str(entry.param_id), dump_json(document), stream)
            finally:
                # a backend that stopped early leaves the stream open: end it here, so
                # its copies are waited for before the ring goes back to the pool
                end_stream(stream)
        return {
            "array": str(entry.param_id),
            "chunk_shape": list(chunk_shape),
            "checksum": format_checksum(chunks.checksum),
            "stats": chunks.stats.result(),
        }

    async def _write_packed_from_device(
        self, writer: SnapshotWriter, small: list[DeviceGradient]
    ) -> PackedGradients:
        """Read the small device gradients to host whole (a thread), then pack them."""
        return await self._write_packed(writer, await self._threads.run(_host_entries, small))

    async def _write_packed(
        self, writer: SnapshotWriter, small: list[GradientRecordEntry]
    ) -> PackedGradients:
        """Pack the small gradients into one array and start writing it; their columns.

        The write starts as soon as the gradients are laid out; their checksums and stats
        are computed meanwhile, and the write goes on while the manifest is built (it is
        awaited before the commit).
        """
        layout = self._one_chunk_layout(small)
        if layout is not None:
            return await self._write_one_chunk_packed(writer, small, layout)
        # Only small gradients (or zstd): one buffer, written while their checksums and
        # stats are taken in another thread (for 10,000 gradients of 1 KiB that overlap
        # is worth more than the copy it costs)
        packed = await self._threads.run(pack, small, self._chunk_bytes)
        spans = chunk_spans((packed.length,), (packed.chunk_bytes,), 1)
        chunks = GradientChunks(memoryview(packed.buffer), spans, self._compression, self)
        document = array_metadata(
            (packed.length,), "uint8", (packed.chunk_bytes,), self._compression
        )
        self._array_documents[PACKED_ARRAY] = document
        self._in_flight.append(
            asyncio.ensure_future(
                writer.write_array(PACKED_ARRAY, dump_json(document), iter(chunks))
            )
        )
        packed.checksums, packed.stats = await self._threads.run(_packed_columns, packed, small)
        return packed

    def _one_chunk_layout(self, small: list[GradientRecordEntry]) -> tuple[list[int], int] | None:
        """The packed array's offsets and length if ``small`` are written as one
        uncompressed chunk from their own memory (``OneChunkPacked``), else None (packed
        into one buffer)."""
        if not small or self._compression is not None:
            return None
        sizes = [entry.array.nbytes for entry in small]
        offsets, length, chunk_bytes = packed_layout(sizes, self._chunk_bytes)
        if length != chunk_bytes or max(sizes) < self._pack_threshold:
            return None  # several chunks, or only small gradients: not worth it
        return offsets, length

    def _one_chunk(
        self, small: list[GradientRecordEntry], layout: tuple[list[int], int]
    ) -> tuple[OneChunkPacked, bytes]:
        """The packed array's one chunk and its ``zarr.json``."""
        chunk = OneChunkPacked(small, layout, self._pack_threshold, self)
        document = array_metadata((chunk.length,), "uint8", (chunk.chunk_bytes,), self._compression)
        self._array_documents[PACKED_ARRAY] = document
        return chunk, _packed_document_json(chunk.length, chunk.chunk_bytes)

    async def _write_one_chunk_packed(
        self,
        writer: SnapshotWriter,
        small: list[GradientRecordEntry],
        layout: tuple[list[int], int],
    ) -> PackedGradients:
        """Write a packed array of one uncompressed chunk from the gradients' own memory
        (``OneChunkPacked``); their columns, taken as it is written."""
        chunk, document = self._one_chunk(small, layout)
        await writer.write_array(PACKED_ARRAY, document, iter(chunk))
        return chunk.packed()

    async def _write_and_commit_one_chunk(
        self,
        writer: SnapshotWriter,
        record: GradientsParamsRecord,
        plan: OneChunkPlan,
        run: str,
        step: int,
        tags: dict[str, str],
        device: str,
    ) -> dict[str, Any]:
        """A snapshot that is one chunk of the packed array: the chunk written and the
        snapshot committed in one step of the writer (``write_array_and_commit``), its
        manifest made there once the chunk's checksums and stats are known; the manifest."""
        name, document, chunks, group_document, made = self._one_step(
            record, plan, run, step, tags, device
        )
        await writer.write_array_and_commit(name, document, chunks, group_document)
        return made[0]

    def _one_step(
        self,
        record: GradientsParamsRecord,
        plan: OneChunkPlan,
        run: str,
        step: int,
        tags: dict[str, str],
        device: str,
    ) -> tuple[str, None, Iterator[EncodedChunk], Callable[[], bytes], list[dict[str, Any]]]:
        """What ``write_array_and_commit`` writes for a one-step snapshot, whose node is the
        packed array (format 4): the array's name (PACKED_AT_ROOT), no document of its own,
        its one chunk, and the maker of the snapshot's document (the array's, the manifest
        in its attributes), which puts the manifest into the list returned last when it
        runs."""
        chunk = OneChunkPacked(
            list(record.entries), (plan.offsets, plan.length), self._pack_threshold, self
        )
        made: list[dict[str, Any]] = []

        def root_document() -> bytes:
            packed = chunk.packed()
            manifest = plan.manifest(
                record,
                snapshot_id=self._id,
                run=run,
                step=step,
                tags=tags,
                device=device,
                checksums=packed.checksums,
                stats=packed.stats,
            )
            made.append(manifest)
            return _root_array_document(manifest, chunk.length)

        return PACKED_AT_ROOT, None, iter(chunk), root_document, made


@functools.lru_cache(maxsize=64)
def _packed_document_json(length: int, chunk_bytes: int) -> bytes:
    """The ``zarr.json`` of an uncompressed packed array of one chunk, encoded once per
    layout: a trainer commits the same layout step after step, and the indented encoding
    (the standard library's, in Python) was a quarter of the event loop's CPU time for
    such a commit."""
    return dump_json(array_metadata((length,), "uint8", (chunk_bytes,), None))


def _host_entries(small: list[DeviceGradient]) -> list[GradientRecordEntry]:
    """The small device gradients read to host, as record entries."""
    return [entry.host_entry() for entry in small]


def _packed_columns(
    packed: PackedGradients, small: list[GradientRecordEntry]
) -> tuple[list[int], dict[str, list]]:
    """The packed gradients' crc32c and stats, computed while their array is written."""
    return packed_columns(
        packed.buffer,
        packed.offsets,
        [entry.array.nbytes for entry in small],
        [entry.dtype for entry in small],
    )


def _manifest_document(manifest: dict[str, Any], arrays: dict[str, dict[str, Any]]) -> bytes:
    """The snapshot group's ``zarr.json``: the manifest in its attributes, and every array's
    ``zarr.json`` (``arrays``, by name) as its consolidated metadata. The manifest is
    sealed here (its ``manifest_checksum`` set), in the thread a large one is encoded in."""
    return dump_json(group_metadata({"gradvault": seal(manifest)}, arrays), compact=True)


def _root_array_document(manifest: dict[str, Any], length: int) -> bytes:
    """The ``zarr.json`` of a snapshot whose node is the packed array (one uncompressed
    chunk of ``length`` bytes): the array's document, the manifest (sealed here) in its
    attributes."""
    attributes = {"gradvault": seal(manifest)}
    return dump_json(array_metadata((length,), "uint8", (length,), None, attributes), compact=True)
