"""What a snapshot's write hands its writers: each array's encoded chunks.

Each chunk is checksummed, and reduced into its gradient's stats, as the writer reads it:
a gradient's own array, chunk by chunk (``GradientChunks``); a gradient on a CUDA device,
each chunk copied through a ring of pinned host buffers (``StreamedChunks``); or every
gradient of a small snapshot in one packed chunk (``OneChunkPacked``). Each source stops
(``Abandoned``) once another array of the same write has failed.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

import numpy as np

from ..errors import DeviceError
from ..records.mapped_file import release_pages
from ..records.record import GradientRecordEntry
from ._backend import EncodedChunk
from ._checksums import (
    SLICE_BYTES,
    Crc32cTrailer,
    ReadAlong,
    crc32c_combine,
    crc32c_of_tail,
)
from ._codecs import encode_chunk, zeros
from ._device_snapshot import DeviceGradient
from ._device_stream import RingStreamer
from ._manifest import PackedGradients, lay_out
from ._stats import (
    CHECKSUM_WITH_STATS,
    StatsAccumulator,
    packed_columns,
    stats_of_kernel_result,
)
from ._validation import STATS_COLUMNS
from ._zarr_format import CHUNK_KEY_SEPARATOR, ChunkSpan, Compression

#: A run of at most this many small gradients in a one-chunk snapshot is written part by
#: part, each with stats of its own; a longer one is laid out in one buffer whose crc32cs
#: and stats are taken together (``packed_columns``: 0.02 ms for 17 float32 gradients of
#: 4 KiB, 0.09 ms through a crc32c call each and ``packed_stats``)
FEW_SMALL_GRADIENTS = 16


class Abandoned(Exception):
    """Another array of the same snapshot failed; stop writing this one."""


class WriteProgress(Protocol):
    """What a chunk source asks of the write it feeds (``SnapshotWrite``)."""

    snapshot_id: str
    #: whether another array of the write has failed: the source then stops
    failed: bool


class GradientChunks:
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
        write: WriteProgress,
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
                raise Abandoned
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


class StreamedChunks(GradientChunks):
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
        write: WriteProgress,
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
                    raise Abandoned
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


class OneChunkPacked:
    """The one chunk of a packed array no longer than a chunk, written from the gradients'
    own memory: its checksums and stats, known once iterated.

    Nothing is copied but runs of more than FEW_SMALL_GRADIENTS small gradients (under
    ``large_bytes``), which are laid end to end into one buffer each (a write of 10,000
    gradients of 1 KiB is then a few writes, not 10,000, and their crc32cs and stats are
    taken together, by ``packed_columns``). Every other gradient is a part of the chunk of
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
        write: WriteProgress,
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
            sums, columns = packed_columns(
                block,
                [offsets[slot] - start for slot in run],
                [entry.array.nbytes for entry in small],
                [entry.dtype for entry in small],
            )
            for index, slot in enumerate(run):
                checksums[slot] = sums[index]
                for key in STATS_COLUMNS:
                    stats[key][slot] = columns[key][index]
            run.clear()

        for slot, entry in enumerate(entries):
            if self._write.failed:
                raise Abandoned
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


def end_stream(stream: Generator[EncodedChunk, None, None]) -> None:
    """Close a chunk stream that may be left suspended (not one still running in a thread:
    its ring is then dropped by the pool, not reused)."""
    try:
        stream.close()
    except ValueError:  # "generator already executing": a backend thread still in it
        pass
