"""Reading a snapshot's gradients from a store whose files may be damaged or hostile.

Nothing a manifest or a file claims is acted on before it is held against what is there:

- each array's own ``zarr.json`` must say what the validated manifest says of the array
  (dtype, shape, chunk shape, codecs), so bytes are never reinterpreted;
- the snapshot's objects are listed with their sizes first, and every chunk a gradient
  needs must be there, a regular file, of a size its decoded length allows, before memory
  for the gradient is allocated; the chunks are walked lazily, so a claim of 2**40 chunks
  stops at the first one that is not there: time and memory are bounded by what the files
  hold, not by what the manifest says;
- chunks are read into memory of the reader's own, straight into the gradient's buffer
  (no file is mapped, so nothing that later happens to a file can change or crash a
  restored gradient), and every chunk's crc32c and every gradient's checksum is verified.

Restoring N bytes of uncompressed gradients takes N bytes plus, per chunk in flight, its
crc32c and an edge chunk's zero padding (at most READ_AHEAD_BYTES of padding at once, or
one chunk's); with zstd, plus the compressed chunks in flight (``max_concurrency``).

A gradient is assembled from its chunks in one place per step, for both ways of reading
it (whole, ``read_all``/``read_one``, and streamed, ``stream``): which chunks hold which
of its bytes and whether they are all there (:meth:`SnapshotReader._own_chunks`;
``Manifest.packed_chunk`` for the packed array), reading and verifying chunks
(:meth:`SnapshotReader._read_chunks`), and the gradient's checksum combined from its
chunks' (:class:`_GradientChecksum`, ``Manifest.checksum_mismatch``). Only the order of
the reads differs: a whole read checks every array's document, then reads every chunk of
every gradient at once into the gradients' buffers (one ``read_many_into_checked``: on
disk a few threads go file after file, each byte read once and checksummed once while in
cache, with no trip through the event loop between files), a stream one chunk after
another into a buffer of the chunk's own, within its memory bound.
"""

from __future__ import annotations

import asyncio
import itertools
import operator
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ChecksumMismatchError, ManifestError
from ..records.record import GradientRecordEntry
from ._backend import (
    MANIFEST_NAME,
    ManyRead,
    MissingKeyError,
    StoreBackend,
    ThreadRunner,
    UnexpectedObjectError,
)
from ._checksums import crc32c, crc32c_combine, parse_checksum
from ._codecs import decompress_into, encoded_size_bounds, split_crc
from ._manifest import Manifest
from ._validation import ArrayClaim, validate_array_document, validate_array_fields
from ._zarr_format import PACKED_ARRAY, ChunkSpan, iter_chunk_spans

#: Chunks at least this big are checked and decoded in a thread rather than on the loop.
THREAD_DECODE_BYTES = 256 * 1024
#: A stream reads its next chunk ahead only while both chunks fit in this many bytes, so a
#: download holds at most this much (or one chunk, if chunks are larger) of gradient data.
READ_AHEAD_BYTES = 32 << 20
#: An array's ``zarr.json`` is a few hundred bytes; anything this big is not one.
_ARRAY_DOCUMENT_LIMIT = 16 << 20

#: Objects of one array, by key under the array's folder: their sizes (None: not a file).
ArrayObjects = dict[str, int | None]
_ABSENT = object()


#: Buffers of at least this many bytes start on a boundary of this many bytes (a huge page)
HUGE_PAGE_BYTES = 2 << 20


def _allocate(nbytes: int) -> memoryview:
    """Writable memory for ``nbytes``, not zero-filled first (every byte is read into)."""
    return np.empty(nbytes, dtype=np.uint8).data


def _allocate_gradient(nbytes: int) -> memoryview:
    """:func:`_allocate` for a restored gradient's own buffer: a large one starts on a
    huge-page boundary.

    NumPy asks the kernel for transparent huge pages for large arrays, but a buffer that
    starts between two boundaries gets them only for the aligned stretches inside it, and
    every other 4 KiB page costs a page fault of its own on first touch (a 1 GiB restore
    into fresh memory took 1.7x a raw read of the same bytes into one large array, for
    this alone). The slack before the boundary is never touched, so it takes address
    space, not memory. Short-lived buffers (a streamed chunk) are not aligned: the slack
    would only fragment the heap.
    """
    if nbytes < HUGE_PAGE_BYTES:
        return _allocate(nbytes)
    block = np.empty(nbytes + HUGE_PAGE_BYTES, dtype=np.uint8)
    start = -block.ctypes.data % HUGE_PAGE_BYTES
    return block[start : start + nbytes].data


class _GradientChecksum:
    """A gradient's crc32c, combined from its pieces in order, checked against the manifest."""

    def __init__(self, manifest: Manifest, position: int) -> None:
        self._manifest = manifest
        self._position = position
        self.value = 0

    def add_chunk(self, payload_crc: int, length: int) -> None:
        """Append a chunk's data of ``length`` bytes whose crc32c is ``payload_crc``."""
        self.value = crc32c_combine(self.value, payload_crc, length)

    def add_bytes(self, data: memoryview) -> None:
        self.value = crc32c(data, self.value)

    def check(self) -> None:
        """ChecksumMismatchError naming the gradient unless the pieces were all of it."""
        if self.value != parse_checksum(self._manifest.columns["checksum"][self._position]):
            raise self._manifest.checksum_mismatch(self._position, self.value)


class SnapshotReader:
    """Reads the gradients of one snapshot through its validated manifest.

    ``recheck`` is awaited before a missing object is reported: it raises
    SnapshotNotFoundError if the snapshot was deleted meanwhile.
    """

    def __init__(
        self,
        backend: StoreBackend,
        threads: ThreadRunner,
        manifest: Manifest,
        recheck: Callable[[], Awaitable[None]],
    ) -> None:
        self._backend = backend
        self._threads = threads
        self._manifest = manifest
        self._id = manifest.snapshot_id
        self._recheck = recheck

    def _key(self, array: str, *parts: str) -> str:
        """The key of ``parts`` inside ``array`` of the snapshot (or the shard) this reader
        reads; the array's prefix itself without ``parts``."""
        return "/".join((self._manifest.array_prefix(array), *parts))

    def _chunk_path(self, array: str, key: str) -> str:
        """How messages name chunk ``key`` of ``array``: its path in the snapshot."""
        return key if self._manifest.is_node(array) else f"{array}/{key}"

    # --- the two ways in ----------------------------------------------------------------

    async def read_all(self, max_concurrency: int) -> list[np.ndarray]:
        """Every gradient's read-only array, in the manifest's order (the manifest gives
        their ids, names and dtypes)."""
        manifest = self._manifest
        objects = manifest.objects_by_array(await self._backend.object_sizes(manifest.prefix))
        packed_positions = manifest.packed_positions()
        packed_set = set(packed_positions)
        own_positions = [i for i in range(manifest.count) if i not in packed_set]
        packed_arrays, own_entries = await asyncio.gather(
            self._read_packed(packed_positions, objects.get(PACKED_ARRAY, {})),
            self._read_owns(own_positions, objects, max_concurrency),
        )
        if not own_positions:
            return packed_arrays
        ordered: list[Any] = [None] * manifest.count
        for position, array in zip(packed_positions, packed_arrays, strict=True):
            ordered[position] = array
        for position, entry in zip(own_positions, own_entries, strict=True):
            ordered[position] = entry.array
        return ordered

    async def read_one(self, position: int) -> GradientRecordEntry:
        """The gradient at ``position`` (only its array's objects are listed and read)."""
        array = self._manifest.columns["array"][position]
        objects = await self._backend.object_sizes(self._key(array))
        if array == PACKED_ARRAY:
            (packed,) = await self._read_packed([position], objects)
            return self._manifest.packed_entry(position, packed)
        concurrency = self._threads.max_workers
        return (await self._read_owns([position], {array: objects}, concurrency))[0]

    # --- streaming ----------------------------------------------------------------------

    async def present_objects(self) -> dict[str, ArrayObjects]:
        """The snapshot's objects by array, once every chunk of every gradient is seen there.

        Raises (ChecksumMismatchError naming the gradient) at the first chunk that is
        missing or of a size it cannot have; the work is bounded by the objects listed.
        """
        manifest = self._manifest
        objects = manifest.objects_by_array(await self._backend.object_sizes(manifest.prefix))
        columns = manifest.columns
        for position in range(manifest.count):
            array = columns["array"][position]
            if array == PACKED_ARRAY:
                continue
            itemsize = np.dtype(columns["dtype"][position]).itemsize
            spans = iter_chunk_spans(
                tuple(columns["shape"][position]),
                tuple(columns["chunk_shape"][position]),
                itemsize,
                separator=manifest.chunk_separator,
            )
            await self._present_chunks(
                array, spans, objects.get(array, {}), manifest.describe(position)
            )
        if manifest.packed is not None:
            chunk, length = manifest.packed["chunk_bytes"], manifest.packed["nbytes"]
            spans = (manifest.packed_chunk(j) for j in range(-(-length // chunk)))
            await self._present_chunks(
                PACKED_ARRAY, spans, objects.get(PACKED_ARRAY, {}), "the packed array"
            )
        return objects

    def packed_chunks(self, objects: ArrayObjects | None = None) -> PackedChunks:
        """A cache of the packed array's chunks for :meth:`stream` (one chunk held at once)."""
        return PackedChunks(self, objects)

    async def stream(
        self,
        position: int,
        start: int,
        end: int,
        *,
        objects: ArrayObjects | None = None,
        packed: PackedChunks | None = None,
    ) -> AsyncIterator[memoryview]:
        """Bytes ``[start, end)`` of the gradient at ``position``, one chunk at a time.

        Before the first byte: the array's document is checked and every chunk the range
        needs is seen to be there. Each chunk's crc32c is verified before any of its bytes
        is yielded; for the whole gradient, its checksum too, before the last piece. The
        next chunk is read while one is yielded only when both fit ``READ_AHEAD_BYTES``;
        otherwise one chunk is held at a time.
        ``objects`` are the array's objects if already listed; ``packed`` shares packed
        chunks between the gradients of one stream.
        """
        if start >= end:
            return
        if self._manifest.columns["array"][position] == PACKED_ARRAY:
            pieces = self._stream_packed(position, start, end, packed or self.packed_chunks())
        else:
            pieces = self._stream_own(position, start, end, objects)
        async for piece in pieces:
            yield piece

    async def _stream_own(
        self, position: int, start: int, end: int, objects: ArrayObjects | None
    ) -> AsyncIterator[memoryview]:
        manifest = self._manifest
        array = manifest.columns["array"][position]
        who = manifest.describe(position)
        spans = await self._own_chunks(position, start, end, objects)
        whole = start == 0 and end == manifest.columns["nbytes"][position]
        checksum = _GradientChecksum(manifest, position)

        async def fetch(span: ChunkSpan) -> tuple[memoryview, int]:
            out = _allocate(span.length)
            return out, await self._read_chunk(array, span, out, who)

        pending: asyncio.Future[tuple[memoryview, int]] | None = None
        try:
            for index, span in enumerate(spans):
                if pending is None:
                    pending = asyncio.ensure_future(fetch(span))
                data, payload_crc = await pending
                pending = None
                last = index + 1 == len(spans)
                # read the next chunk while this one is sent, if both fit the read-ahead budget
                if not last and span.length + spans[index + 1].length <= READ_AHEAD_BYTES:
                    pending = asyncio.ensure_future(fetch(spans[index + 1]))
                if whole:
                    checksum.add_chunk(payload_crc, span.length)
                    if last:
                        checksum.check()
                yield data[max(start - span.start, 0) : min(end - span.start, span.length)]
                del data  # let the sent chunk go before the next one is read
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    async def _stream_packed(
        self, position: int, start: int, end: int, packed: PackedChunks
    ) -> AsyncIterator[memoryview]:
        columns = self._manifest.columns
        chunk = self._manifest.packed_fields()["chunk_bytes"]
        begin, stop = columns["offset"][position] + start, columns["offset"][position] + end
        who = f"{self._manifest.describe(position)}, in the packed array"
        whole = start == 0 and end == columns["nbytes"][position]
        checksum = _GradientChecksum(self._manifest, position)
        last_chunk = (stop - 1) // chunk
        for j in range(begin // chunk, last_chunk + 1):
            data = await packed.chunk(j, who)
            piece = data[max(begin - j * chunk, 0) : min(stop - j * chunk, chunk)]
            if whole:
                checksum.add_bytes(piece)
                if j == last_chunk:
                    checksum.check()
            yield piece

    async def read_packed_chunk(self, cache: PackedChunks, index: int, who: str) -> memoryview:
        """Chunk ``index`` of the packed array, verified; ``cache`` remembers its document check
        and object listing (the one :class:`PackedChunks` of a stream calls this)."""
        if not cache.checked:
            await self._check_document(PACKED_ARRAY, self._packed_claim())
            if cache.objects is None:
                cache.objects = await self._backend.object_sizes(self._key(PACKED_ARRAY))
            cache.checked = True
        objects = cache.objects
        assert objects is not None  # listed when the cache was checked
        wanted = [self._manifest.packed_chunk(index)]
        (span,) = await self._present_chunks(PACKED_ARRAY, wanted, objects, who)
        out = _allocate(span.padded_length)
        await self._read_chunk(PACKED_ARRAY, span, out, who)
        return out

    # --- one array ----------------------------------------------------------------------

    def array_claim(self, array: str) -> ArrayClaim:
        """What the manifest says of ``array`` (``packed`` or a gradient's own array)."""
        if array == PACKED_ARRAY:
            return self._packed_claim()
        position = self._manifest.position(array)
        assert position is not None and self._manifest.columns["array"][position] == array
        return self._own_claim(position)

    def _own_claim(self, position: int) -> ArrayClaim:
        columns = self._manifest.columns
        return ArrayClaim(
            who=self._manifest.describe(position),
            shape=columns["shape"][position],
            dtype=columns["dtype"][position],
            chunk_shape=columns["chunk_shape"][position],
            compression=self._manifest.compression,
            separator=self._manifest.chunk_separator,
            fields={
                "data_type": "gradients.dtype",
                "shape": "gradients.shape",
                "chunk_grid": "gradients.chunk_shape",
                "codecs": "compression",
                "attributes.gradvault.param_id": "gradients.param_id",
                "attributes.gradvault.name": "gradients.name",
            },
            attributes={"param_id": columns["array"][position], "name": columns["name"][position]},
        )

    def _packed_claim(self) -> ArrayClaim:
        packed = self._manifest.packed_fields()
        return ArrayClaim(
            who="the packed array",
            shape=[packed["nbytes"]],
            dtype="uint8",
            chunk_shape=[packed["chunk_bytes"]],
            compression=self._manifest.compression,
            separator=self._manifest.chunk_separator,
            fields={
                "shape": "packed.nbytes",
                "chunk_grid": "packed.chunk_bytes",
                "codecs": "compression",
            },
        )

    async def _own_chunks(
        self,
        position: int,
        start: int,
        end: int,
        objects: ArrayObjects | None,
        *,
        document_checked: bool = False,
    ) -> list[ChunkSpan]:
        """The chunks of gradient ``position``'s own array that hold its bytes ``[start,
        end)``, in order, once the array's document says what the manifest says (checked
        here unless ``document_checked``) and each of them is seen in ``objects`` (the
        array's objects; listed now if None), a regular file of a size it can have."""
        manifest = self._manifest
        columns = manifest.columns
        array = columns["array"][position]
        if not document_checked:
            await self._check_document(array, self._own_claim(position))
        if objects is None:
            objects = await self._backend.object_sizes(self._key(array))
        itemsize = np.dtype(columns["dtype"][position]).itemsize
        needed = itertools.takewhile(
            lambda span: span.start < end,
            iter_chunk_spans(
                tuple(columns["shape"][position]),
                tuple(columns["chunk_shape"][position]),
                itemsize,
                start,
                separator=manifest.chunk_separator,
            ),
        )
        return await self._present_chunks(array, needed, objects, manifest.describe(position))

    async def _read_owns(
        self, positions: list[int], objects: dict[str, ArrayObjects], max_concurrency: int
    ) -> list[GradientRecordEntry]:
        """The gradients at ``positions``, each from its own array (``objects`` by array).

        Every array's document is checked (all read at once) while its chunks, seen to
        be there in the listing, are read: each gradient gets one buffer, not zero-filled,
        and all chunks are read at once, each straight into its place
        (:meth:`_read_chunks`; zstd chunks ``max_concurrency`` at a time). Nothing is
        returned unless every document says what the manifest says, and a document at
        fault is named before any chunk and stops the reads (the chunks' places come from
        the manifest, so the documents need not be read first: a restore from a cold cache
        waited 8 ms of its 1 GiB's 240 for them). A gradient's checksum is combined from its chunks'
        crc32cs, so each byte is read once and checksummed once.
        """
        manifest = self._manifest
        arrays = manifest.columns["array"]
        documents = asyncio.ensure_future(
            self._check_documents([(arrays[p], self._own_claim(p)) for p in positions])
        )
        chunks = asyncio.ensure_future(self._read_own_chunks(positions, objects, max_concurrency))
        both = [documents, chunks]
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_EXCEPTION)
            if _failure(documents) is not None:
                chunks.cancel()  # its threads start no other file
            await asyncio.wait(both)
        except BaseException:
            for task in both:
                task.cancel()
            raise
        fault = _failure(documents) or _failure(chunks)
        if fault is not None:
            raise fault
        spans_of, buffers, crcs = chunks.result()
        payload_crcs = iter(crcs)
        entries = []
        for position, spans, data in zip(positions, spans_of, buffers, strict=True):
            checksum = _GradientChecksum(manifest, position)
            for span in spans:
                checksum.add_chunk(next(payload_crcs), span.length)
            checksum.check()
            entries.append(manifest.entry(position, data))
        return entries

    async def _read_own_chunks(
        self, positions: list[int], objects: dict[str, ArrayObjects], max_concurrency: int
    ) -> tuple[list[list[ChunkSpan]], list[memoryview], list[int]]:
        """For :meth:`_read_owns`: each gradient's chunks (seen in ``objects``), its buffer,
        and every chunk's data crc32c, in order."""
        manifest = self._manifest
        arrays, sizes = manifest.columns["array"], manifest.columns["nbytes"]
        spans_of = [
            await self._own_chunks(
                position,
                0,
                sizes[position],
                objects.get(arrays[position], {}),
                document_checked=True,
            )
            for position in positions
        ]
        buffers = [_allocate_gradient(sizes[position]) for position in positions]
        reads = [
            _ChunkRead(
                arrays[position],
                span,
                data[span.start : span.start + span.length],
                manifest.describe(position),
            )
            for position, spans, data in zip(positions, spans_of, buffers, strict=True)
            for span in spans
        ]
        return spans_of, buffers, await self._read_chunks(reads, max_concurrency)

    async def _read_packed(self, positions: list[int], objects: ArrayObjects) -> list[np.ndarray]:
        """The packed gradients at ``positions``, reading only the chunks they lie in."""
        if not positions:
            return []
        manifest = self._manifest
        chunk = manifest.packed_fields()["chunk_bytes"]
        await self._check_document(PACKED_ARRAY, self._packed_claim())
        offsets, sizes = manifest.columns["offset"], manifest.columns["nbytes"]
        holding = [i for i in positions if sizes[i]]
        if not holding:
            return manifest.packed_arrays(positions, memoryview(b""))
        starts = list(map(offsets.__getitem__, holding))  # at C speed: thousands of them
        first = min(starts) // chunk
        last = (max(map(operator.add, starts, map(sizes.__getitem__, holding))) - 1) // chunk
        who = manifest.describe_packed_chunk
        # Each chunk's padding is read as data: the buffer holds whole chunks.
        wanted = (manifest.packed_chunk(j) for j in range(first, last + 1))
        spans = await self._present_chunks(PACKED_ARRAY, wanted, objects, who)
        base = first * chunk
        buffer = _allocate((last + 1 - first) * chunk)
        await asyncio.gather(
            *(
                self._read_chunk(
                    PACKED_ARRAY, span, buffer[span.start - base : span.start - base + chunk], who
                )
                for span in spans
            )
        )
        if len(positions) > 64:
            return await self._threads.run(manifest.packed_arrays, positions, buffer, base)
        return manifest.packed_arrays(positions, buffer, base)

    # --- checks before reading ----------------------------------------------------------

    async def _check_document(self, array: str, claim: ArrayClaim) -> None:
        """ManifestError unless ``array``'s own ``zarr.json`` says what ``claim`` says.

        The packed array that is the snapshot's node has the snapshot's document, which the
        manifest was loaded from: its fields are checked as loaded, not read again (it
        holds the whole manifest, and may be as long)."""
        node = self._manifest.node
        if node is not None and self._manifest.is_node(array):
            validate_array_fields(node, claim, self._id, self._key(array, MANIFEST_NAME))
            return
        try:
            document: ManyRead = await self._backend.read(
                self._key(array, MANIFEST_NAME), _ARRAY_DOCUMENT_LIMIT
            )
        except (MissingKeyError, UnexpectedObjectError) as error:
            document = error
        await self._hold_document(array, claim, document)

    async def _check_documents(self, claims: list[tuple[str, ArrayClaim]]) -> None:
        """:meth:`_check_document` of each ``(array, claim)``, the documents read at once."""
        keys = [self._key(array, MANIFEST_NAME) for array, _ in claims]
        documents = await self._backend.read_many(keys, _ARRAY_DOCUMENT_LIMIT)
        for (array, claim), document in zip(claims, documents, strict=True):
            await self._hold_document(array, claim, document)

    async def _hold_document(self, array: str, claim: ArrayClaim, document: ManyRead) -> None:
        key = self._key(array, MANIFEST_NAME)
        if isinstance(document, MissingKeyError):
            await self._recheck()
            problem = "is missing"
        elif isinstance(document, UnexpectedObjectError):
            problem = str(document)
        else:
            validate_array_document(document, claim, self._id, key)
            return
        raise ManifestError(f"snapshot {self._id}: {claim.who}: its array document {problem}")

    async def _present_chunks(
        self,
        array: str,
        spans: Iterable[ChunkSpan],
        objects: ArrayObjects,
        who: Callable[[ChunkSpan], str] | str,
    ) -> list[ChunkSpan]:
        """``spans``, each checked to be a regular file of a size it can have.

        Stops at the first chunk that fails, so that the work is bounded by the objects
        listed, however many chunks ``spans`` would go on to claim.
        """
        compression = self._manifest.compression
        present = []
        for span in spans:
            size = objects.get(span.key, _ABSENT)
            if isinstance(size, int):  # neither absent nor a folder, link or FIFO (None)
                least, most = encoded_size_bounds(span.padded_length, compression)
                if least <= size <= most:
                    present.append(span)
                    continue
            name = who(span) if callable(who) else who
            where = f"snapshot {self._id}: chunk {self._chunk_path(array, span.key)} of {name}"
            if size is _ABSENT:
                await self._recheck()
                files = sum(1 for k, n in objects.items() if n is not None and k != MANIFEST_NAME)
                raise ChecksumMismatchError(
                    f"{where} is missing (the array's folder holds {files} files besides its "
                    f"{MANIFEST_NAME})"
                )
            if size is None:
                raise ChecksumMismatchError(
                    f"{where} is not a regular file (a folder, a link or a FIFO)"
                )
            expected = f"{least}" if least == most else f"{least} to {most}"
            raise ChecksumMismatchError(
                f"{where} is {size} bytes; a chunk of {span.padded_length} bytes "
                f"({'zstd' if compression else 'uncompressed'}) takes {expected}"
            )
        return present

    # --- one chunk ----------------------------------------------------------------------

    async def _read_chunk(
        self,
        array: str,
        span: ChunkSpan,
        out: memoryview,
        who: Callable[[ChunkSpan], str] | str,
    ) -> int:
        """Read chunk ``span`` and put its data part in ``out``; the crc32c of ``out``."""
        return (await self._read_chunks([_ChunkRead(array, span, out, who)], 1))[0]

    def _where(self, read: _ChunkRead) -> str:
        """How messages name the chunk of ``read``."""
        who = read.who(read.span) if callable(read.who) else read.who
        return f"snapshot {self._id}: chunk {self._chunk_path(read.array, read.span.key)} of {who}"

    async def _read_chunks(self, reads: list[_ChunkRead], max_concurrency: int) -> list[int]:
        """Read each chunk, verify its crc32c and put its data in its ``out``; the crc32c
        of each ``out``.

        Uncompressed chunks are read all at once by the backend's
        ``read_many_into_checked`` (locally a few threads, file after file, each slice
        checksummed as it lands), zstd ones ``max_concurrency`` at a time. An error names
        the first chunk, in the order of ``reads``, at fault.
        """
        if self._manifest.compression is not None:
            slots = asyncio.Semaphore(max_concurrency)

            async def bounded(read: _ChunkRead) -> int:
                async with slots:
                    return await self._read_compressed_chunk(read)

            return list(await asyncio.gather(*(bounded(read) for read in reads)))
        payload_crcs = []
        for group in _padding_bounded(reads):
            payload_crcs += await self._read_plain_chunks(group)
        return payload_crcs

    async def _read_plain_chunks(self, reads: list[_ChunkRead]) -> list[int]:
        """Uncompressed chunks, read all at once, each verified; their data's crc32cs."""
        requests, trailers = [], []
        for read in reads:
            padding = read.span.padded_length - read.span.length
            tail = _allocate(padding + 4)  # for the zero padding and the crc32c
            trailers.append(tail)
            key = self._key(read.array, read.span.key)
            requests.append((key, [read.out, tail[:padding], tail[padding:]]))
        outcomes = await self._backend.read_many_into_checked(requests)
        payload_crcs = []
        for read, tail, outcome in zip(reads, trailers, outcomes, strict=True):
            if isinstance(outcome, MissingKeyError):
                await self._recheck()
                raise ChecksumMismatchError(f"{self._where(read)} is missing")
            if isinstance(outcome, UnexpectedObjectError):
                raise ChecksumMismatchError(f"{self._where(read)} {outcome}")
            payload_crc, computed, _ = outcome  # after the data, the padding, the crc32c
            stored = int.from_bytes(tail[-4:], "little")
            if computed != stored:
                raise ChecksumMismatchError(
                    f"{self._where(read)} fails its crc32c check: stored crc32c "
                    f"{stored:08x}, computed {computed:08x}"
                )
            payload_crcs.append(payload_crc)
        return payload_crcs

    async def _read_compressed_chunk(self, read: _ChunkRead) -> int:
        """A zstd chunk: read whole, its crc32c verified, decoded into ``read.out``."""
        compression = self._manifest.compression
        assert compression is not None
        span, out = read.span, read.out
        padding = span.padded_length - span.length
        _, most = encoded_size_bounds(span.padded_length, compression)
        try:
            raw = await self._backend.read(self._key(read.array, span.key), most)
        except MissingKeyError:
            await self._recheck()
            raise ChecksumMismatchError(f"{self._where(read)} is missing") from None
        except UnexpectedObjectError as error:
            raise ChecksumMismatchError(f"{self._where(read)} {error}") from None

        def check() -> int:
            try:
                body, stored = split_crc(raw)
            except ValueError as error:
                raise ChecksumMismatchError(f"{self._where(read)}: {error}") from None
            computed = crc32c(body)
            if computed != stored:
                raise ChecksumMismatchError(
                    f"{self._where(read)} fails its crc32c check: stored crc32c {stored:08x}, "
                    f"computed {computed:08x}"
                )
            try:
                if padding:
                    whole = _allocate(span.padded_length)
                    decompress_into(body, whole)
                    out[:] = whole[: span.length]
                else:
                    decompress_into(body, out)
            except ValueError as error:
                raise ChecksumMismatchError(
                    f"{self._where(read)} does not decode as the snapshot's compression "
                    f"({compression.codec['name']}) says: {error}"
                ) from None
            return crc32c(out)

        if span.padded_length >= THREAD_DECODE_BYTES:
            return await self._threads.run(check)
        return check()


def _failure(task: asyncio.Future[Any]) -> BaseException | None:
    """What ``task`` raised; None while it runs, and once it has returned or was cancelled."""
    return None if not task.done() or task.cancelled() else task.exception()


def _padding_bounded(reads: list[_ChunkRead]) -> Iterator[list[_ChunkRead]]:
    """``reads`` in runs whose edge chunks' zero padding (read into buffers of its own)
    adds up to at most READ_AHEAD_BYTES, or to one chunk's if that is more: a snapshot of
    many gradients just over a chunk long must not hold all their padding at once."""
    group: list[_ChunkRead] = []
    padding = 0
    for read in reads:
        extra = read.span.padded_length - read.span.length
        if group and padding + extra > READ_AHEAD_BYTES:
            yield group
            group, padding = [], 0
        group.append(read)
        padding += extra
    if group:
        yield group


@dataclass(frozen=True)
class _ChunkRead:
    """One chunk to read: ``span`` of ``array``, its data into ``out``; ``who`` (or
    ``who(span)``) names the gradients it holds in messages."""

    array: str
    span: ChunkSpan
    out: memoryview
    who: Callable[[ChunkSpan], str] | str


class PackedChunks:
    """The packed array's chunks while a stream walks its gradients: one held at a time.

    The array's document is checked and its objects listed once; each chunk is read and
    verified when first needed, and kept until another one is.
    """

    def __init__(self, reader: SnapshotReader, objects: ArrayObjects | None) -> None:
        self._reader = reader
        self.objects = objects
        self.checked = False
        self._held: tuple[int, memoryview] | None = None

    async def chunk(self, index: int, who: str) -> memoryview:
        """Chunk ``index`` of the packed array (padding included), its crc32c verified."""
        if self._held is not None and self._held[0] == index:
            return self._held[1]
        self._held = None  # let the previous chunk go before the next is read
        data = await self._reader.read_packed_chunk(self, index, who)
        self._held = (index, data)
        return data
