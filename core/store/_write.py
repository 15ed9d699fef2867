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
RingPool (``_StreamedChunks``), so host memory is bounded by the pool; the small ones
are read to host whole and packed.
"""

from __future__ import annotations

import asyncio
import functools
import math
import threading
from collections.abc import Awaitable, Callable, Generator, Iterator
from typing import Any

import numpy as np

from ..errors import DeviceError, StoreUnavailableError
from ..records.mapped_file import release_pages
from ..records.record import GradientRecordEntry, GradientsParamsRecord
from ._backend import EncodedChunk, ShardWriter, SnapshotWriter, StoreBackend, ThreadRunner
from ._checksums import (
    SLICE_BYTES,
    Crc32cTrailer,
    ReadAlong,
    crc32c,
    crc32c_combine,
    crc32c_of_tail,
    format_checksum,
)
from ._codecs import encode_chunk, zeros
from ._commit_order import CommitTurn, holding
from ._device_snapshot import DeviceGradient, DeviceSnapshot
from ._device_stream import RingPool, RingStreamer
from ._manifest import (
    OneChunkPlan,
    PackedGradients,
    build_manifest,
    lay_out,
    pack,
    packed_checksums,
    structure,
)
from ._manifest_checksum import seal
from ._shards import ShardedSet
from ._stats import (
    CHECKSUM_WITH_STATS,
    StatsAccumulator,
    packed_stats,
    stats_of_kernel_result,
)
from ._validation import STATS_COLUMNS
from ._zarr_format import (
    CHUNK_KEY_SEPARATOR,
    PACKED_ARRAY,
    PACKED_AT_ROOT,
    ChunkSpan,
    Compression,
    array_metadata,
    chunk_shape_for,
    chunk_spans,
    dump_json,
    group_metadata,
    packed_layout,
)

#: A run of at most this many small gradients in a one-chunk snapshot is written part by
#: part, each with stats of its own; a longer one is laid out in one buffer whose stats
#: are taken together (``packed_stats``, ~0.3 ms a call however few it holds)
FEW_SMALL_GRADIENTS = 16

#: A manifest of at most this many gradients is encoded on the event loop (a fraction of
#: a millisecond), not in a thread: the trip there and back would cost more.
INLINE_MANIFEST_GRADIENTS = 64


class _Abandoned(Exception):
    """Another array of the same snapshot failed; stop writing this one."""


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


class _GradientChunks:
    """The encoded chunks of one array; once iterated, ``checksum`` is its data's crc32c.

    The payload crc32c of each chunk is taken once the backend has written the chunk
    (before it asks for the next one), and combined into the array's checksum. With
    ``values`` (a gradient's own array, flat) the gradient's stats are taken chunk by
    chunk too, just before the chunk is written, and the pages read are let go slice by
    slice (``release_pages``: it acts on a mapped upload only; the local backend lets
    each slice go once written), so that writing a mapped file holds about a slice of it
    per array in flight, and never more than a chunk, not the whole file.
    """

    def __init__(
        self,
        data: memoryview,
        spans: list[ChunkSpan],
        compression: Compression | None,
        write: SnapshotWrite,
        values: np.ndarray | None = None,
    ) -> None:
        self._data = data
        self._spans = spans
        self._compression = compression
        self._write = write
        self._values = values
        self.checksum = 0
        self.stats = StatsAccumulator()

    def __iter__(self) -> Iterator[EncodedChunk]:
        return self._host_chunks()

    def _host_chunks(self) -> Iterator[EncodedChunk]:
        checksum = 0
        values = self._values
        itemsize = 1 if values is None else values.itemsize
        for span in self._spans:
            if self._write.failed:
                raise _Abandoned
            payload = self._data[span.start : span.start + span.length]
            if values is not None:
                self._reduce(values, span.start // itemsize, span.length // itemsize)
            parts, payload_crc = encode_chunk(
                payload, span.padded_length - span.length, self._compression
            )
            yield span.key, parts
            checksum = crc32c_combine(checksum, payload_crc(), span.length)
            release_pages(payload)
        self.checksum = checksum

    def _reduce(self, values: np.ndarray, first: int, count: int) -> None:
        """Take ``values[first:first + count]`` into the stats, a slice at a time, letting
        each slice's pages go once read (the write reads them again slice by slice)."""
        step = max(1, SLICE_BYTES // values.itemsize)
        for start in range(first, first + count, step):
            piece = values[start : min(start + step, first + count)]
            self.stats.add(piece)
            release_pages(piece)


class _StreamedChunks(_GradientChunks):
    """The encoded chunks of one gradient on a device, its bytes streamed through a ring.

    Each chunk's payload is a view of one of the ring's pinned buffers, copied from the
    device just before it is needed (the next chunks' copies run meanwhile); the view is
    reduced into the stats, encoded and written before the next chunk is asked for, as
    the ring requires. Stats and checksums are taken exactly as for a host array (the
    same slices, the same order), so the stored bytes and manifest are the same. A copy
    that fails raises DeviceError naming the snapshot and the gradient.
    """

    def __init__(
        self,
        entry: DeviceGradient,
        spans: list[ChunkSpan],
        compression: Compression | None,
        write: SnapshotWrite,
        ring: RingStreamer,
        device: str,
    ) -> None:
        super().__init__(memoryview(b""), spans, compression, write)
        self._entry = entry
        self._ring = ring
        self._device = device
        self._dtype = np.dtype(entry.array.dtype)

    def __iter__(self) -> Generator[EncodedChunk, None, None]:
        return self._streamed_chunks()

    def _streamed_chunks(self) -> Generator[EncodedChunk, None, None]:
        entry = self._entry
        pieces = self._ring.stream(
            entry.array, entry.nbytes, lengths=[span.length for span in self._spans]
        )
        checksum = 0
        try:
            for span in self._spans:
                if self._write.failed:
                    raise _Abandoned
                payload = self._next_piece(pieces, span)
                values = np.frombuffer(payload, self._dtype)
                step = max(1, SLICE_BYTES // self._dtype.itemsize)
                for start in range(0, values.size, step):  # the host path's slices
                    self.stats.add(values[start : start + step])
                parts, payload_crc = encode_chunk(
                    payload, span.padded_length - span.length, self._compression
                )
                yield span.key, parts
                checksum = crc32c_combine(checksum, payload_crc(), span.length)
        finally:
            pieces.close()  # waits for the copies still in flight
        self.checksum = checksum

    def _next_piece(self, pieces: Generator[memoryview, None, None], span: ChunkSpan) -> memoryview:
        try:
            return next(pieces)
        except Exception as error:
            raise self._copy_failed(span.start, error) from error

    def _copy_failed(self, offset: int, error: Exception) -> DeviceError:
        entry = self._entry
        return DeviceError(
            f"snapshot {self._write.snapshot_id}: copying gradient for param "
            f"{entry.param_id} ({entry.name!r}) from {self._device} to host failed at byte "
            f"{offset}: {type(error).__name__}: {error}; nothing was committed"
        )


class _OneChunkPacked:
    """The one chunk of a packed array no longer than a chunk, written from the gradients'
    own memory: its checksums and stats, known once iterated.

    Nothing is copied but runs of more than FEW_SMALL_GRADIENTS small gradients (under
    ``large_bytes``), which are laid end to end into one buffer each (a write of 10,000
    gradients of 1 KiB is then a few writes, not 10,000, and their stats are taken
    together, as ``packed_stats`` does). Every other gradient is a part of the chunk of
    its own (a ReadAlong): its stats are taken a slice at a time as the writer copies or
    writes and checksums that slice, in the same pass over its bytes, and its crc32c
    falls out of the running crc32c the writer records after each part
    (``crc32c_of_tail``), with no pass of its own; or, a float32 one the writer reads
    whole with the others (``ReadAlong.whole``), its crc32c and stats come from that one
    pass (``Crc32cTrailer.whole``). Nothing is read before the writer starts, so the
    first bytes go to the device at once.
    """

    def __init__(
        self,
        entries: list[GradientRecordEntry],
        layout: tuple[list[int], int],
        large_bytes: int,
        write: SnapshotWrite,
    ) -> None:
        self._entries = entries
        self._large_bytes = large_bytes
        self._write = write
        self.offsets, self.length = layout  # the packed layout: offsets and length
        self.chunk_bytes = self.length  # one chunk
        self.checksums: list[int] = []
        self.stats: dict[str, list] = {}
        #: what the write's reads leave to be summed up (:meth:`_settle`), once iterated
        self._unsettled: Callable[[], None] | None = None

    def __iter__(self) -> Iterator[EncodedChunk]:
        entries, offsets = self._entries, self.offsets
        count = len(entries)
        checksums = [0] * count
        stats: dict[str, list] = {key: [None] * count for key in STATS_COLUMNS}
        parts: list[Any] = []
        large: list[tuple[int, int]] = []  # (slot, part index)
        accumulators: list[tuple[int, StatsAccumulator]] = []
        run: list[int] = []  # slots of the small gradients laid out since the last part
        end = 0

        def read_along(slot: int) -> ReadAlong:
            """Gradient ``slot`` as a part of its own, its stats and crc32c taken as the
            writer reads it (after the large ones before it are on their way)."""
            accumulator = StatsAccumulator()
            accumulators.append((slot, accumulator))
            large.append((slot, len(parts)))
            array = entries[slot].array
            visit, checksum_and_visit = _stats_of_slices(accumulator, array.dtype)
            # float32, where the C extension has the one pass: the writer may read it whole
            whole = checksum_and_visit is not None
            return ReadAlong(entries[slot].data, visit, checksum_and_visit, whole)

        def close_run() -> None:
            if not run:
                return
            if len(run) <= FEW_SMALL_GRADIENTS:  # each its own part, its stats of its own
                for position, slot in enumerate(run):
                    if position:  # the gap before the run's first is in parts already
                        previous = run[position - 1]
                        gap = offsets[slot] - offsets[previous] - entries[previous].array.nbytes
                        if gap:
                            parts.append(zeros(gap))
                    parts.append(read_along(slot))
                run.clear()
                return
            start = offsets[run[0]]
            small = [entries[slot] for slot in run]
            block = lay_out(small, [offsets[slot] for slot in run], start)
            parts.append(block)
            columns = packed_stats(
                block,
                [offsets[slot] - start for slot in run],
                [entry.array.nbytes for entry in small],
                [entry.dtype for entry in small],
            )
            for index, slot in enumerate(run):
                checksums[slot] = crc32c(small[index].array)
                for key in STATS_COLUMNS:
                    stats[key][slot] = columns[key][index]
            run.clear()

        for slot, entry in enumerate(entries):
            if self._write.failed:
                raise _Abandoned
            nbytes = entry.array.nbytes
            if nbytes < self._large_bytes:
                if not run and offsets[slot] > end:
                    parts.append(zeros(offsets[slot] - end))
                run.append(slot)
            else:
                close_run()
                if offsets[slot] > end:
                    parts.append(zeros(offsets[slot] - end))
                parts.append(read_along(slot))
            end = offsets[slot] + nbytes
        close_run()
        trailer = Crc32cTrailer()
        parts.append(trailer)

        def settle() -> None:
            whole = trailer.whole
            if whole is not None:  # every part read in one pass: its crc32c and stats
                for slot, index in large:
                    _, checksums[slot], low, high, sum_squares = whole[index]
                    array = entries[slot].array
                    values = stats_of_kernel_result(array, low, high, sum_squares)
                    for key, value in values.items():
                        stats[key][slot] = value
            else:
                for slot, accumulator in accumulators:  # each slice taken in as it was read
                    for key, value in accumulator.result().items():
                        stats[key][slot] = value
                running = trailer.running  # the chunk's crc32c up to the end of each part
                for slot, index in large:
                    before = running[index - 1] if index else 0
                    nbytes = entries[slot].array.nbytes
                    checksums[slot] = crc32c_of_tail(running[index], before, nbytes)
            self.checksums = checksums
            self.stats = stats

        self._unsettled = settle
        yield f"c{CHUNK_KEY_SEPARATOR}0", parts
        self._settle()

    def _settle(self) -> None:
        """Sum up the checksums and stats the write's reads took: callable once every byte
        of the chunk is read, before its writes have finished (``write_file``'s
        ``meanwhile``); once only."""
        settle, self._unsettled = self._unsettled, None
        if settle is not None:
            settle()

    def packed(self) -> PackedGradients:
        """The packed gradients' layout and columns, once the chunk's bytes are all read."""
        self._settle()
        return PackedGradients(
            b"", self.length, self.chunk_bytes, self.offsets, self.checksums, self.stats
        )


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

    def _packed_and_own(
        self, record: GradientsParamsRecord | DeviceSnapshot
    ) -> tuple[list[int], list[int]]:
        """The record positions of the packed gradients and of those with arrays of their own."""
        entries: tuple[Any, ...] = record.entries
        threshold: float = self._pack_threshold
        if threshold and sum(entry.array.nbytes for entry in entries) <= self._chunk_bytes:
            # a snapshot no longer than a chunk is one chunk of the packed array: one file
            # and one folder to write and fsync, not a folder tree per gradient
            threshold = math.inf
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
        if self._compression is not None:
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
                    raise next((f for f in failures if not isinstance(f, _Abandoned)), failures[0])
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
                raise _Abandoned
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
        chunks = _GradientChunks(entry.data, spans, self._compression, self, values)
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
            chunks = _StreamedChunks(entry, spans, self._compression, self, ring, device)
            stream = iter(chunks)
            try:
                await writer.write_array(str(entry.param_id), dump_json(document), stream)
            finally:
                # a backend that stopped early leaves the stream open: end it here, so
                # its copies are waited for before the ring goes back to the pool
                _end(stream)
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
        chunks = _GradientChunks(memoryview(packed.buffer), spans, self._compression, self)
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
        uncompressed chunk from their own memory (``_OneChunkPacked``), else None (packed
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
    ) -> tuple[_OneChunkPacked, bytes]:
        """The packed array's one chunk and its ``zarr.json``."""
        chunk = _OneChunkPacked(small, layout, self._pack_threshold, self)
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
        (``_OneChunkPacked``); their columns, taken as it is written."""
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
        chunk = _OneChunkPacked(
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


def _stats_of_slices(
    accumulator: StatsAccumulator, dtype: np.dtype
) -> tuple[Callable[[memoryview], None], Callable[[memoryview, int], int] | None]:
    """A ReadAlong's visit, which takes each slice of a gradient's bytes into
    ``accumulator``, and its checksum_and_visit where the slice's crc32c comes in the
    same pass (float32, where the C extension has it)."""

    def visit(piece: memoryview) -> None:
        accumulator.add(np.frombuffer(piece, dtype))

    if dtype != np.float32 or not CHECKSUM_WITH_STATS:
        return visit, None

    def checksum_and_visit(piece: memoryview, crc: int) -> int:
        return accumulator.add_checksummed(np.frombuffer(piece, np.float32), crc)

    return visit, checksum_and_visit


def _end(stream: Generator[EncodedChunk, None, None]) -> None:
    """Close a chunk stream that may be left suspended (not one still running in a thread:
    its ring is then dropped by the pool, not reused)."""
    try:
        stream.close()
    except ValueError:  # "generator already executing": a backend thread still in it
        pass


def _host_entries(small: list[DeviceGradient]) -> list[GradientRecordEntry]:
    """The small device gradients read to host, as record entries."""
    return [entry.host_entry() for entry in small]


def _packed_columns(
    packed: PackedGradients, small: list[GradientRecordEntry]
) -> tuple[list[int], dict[str, list]]:
    """The packed gradients' crc32c and stats, computed while their array is written."""
    stats = packed_stats(
        packed.buffer,
        packed.offsets,
        [entry.array.nbytes for entry in small],
        [entry.dtype for entry in small],
    )
    return packed_checksums(small), stats


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
