"""Streamed device-to-host reads: a gradient on a GPU, copied chunk by chunk into a ring.

A device buffer is not read to host whole. Its bytes are copied in chunks of at most
``slot_bytes`` into a small ring of reusable pinned host buffers, on a side stream, and
each chunk is handed to the consumer (checksums, a write) as soon as its copy is done,
while the copies of the next chunks proceed. Host memory is bounded by the ring
(``slots * slot_bytes``), however large the gradient or the snapshot.

The ordering rules, which :class:`RingStreamer` keeps and the tests check:

- a slot is given a new copy only once the consumer has returned from the chunk it
  held (the consumer is done with its bytes);
- a chunk is handed over only after its copy's completion was waited for;
- chunks are handed over in order of their offset, and together cover every byte once.

The device side is behind :class:`DeviceCopier`, so the logic runs on the CPU with a
fake device in the tests; :class:`CupyCopier` is the CUDA one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

#: Ring defaults: 4 slots of 16 MiB (64 MiB of pinned host memory).
DEFAULT_SLOTS = 4
DEFAULT_SLOT_BYTES = 16 << 20


def _check_counts(**counts: object) -> None:
    """Raise ValueError naming the first of ``counts`` that is not an int >= 1."""
    for name, value in counts.items():
        if type(value) is not int or value < 1:
            raise ValueError(f"{name} must be an int >= 1; got {value!r}")


class DeviceCopier(Protocol):
    """What the streamer needs from a device: pinned buffers, async copies, their events."""

    def pinned(self, nbytes: int) -> memoryview:
        """A page-locked host buffer of ``nbytes`` (allocated once per ring slot)."""

    def copy_async(self, source: Any, offset: int, length: int, target: memoryview) -> Any:
        """Start copying ``length`` bytes of ``source`` from ``offset`` into ``target``.

        Returns an event that :meth:`wait` takes; the copy runs on a side stream.
        """

    def wait(self, event: Any) -> None:
        """Block until the copy of ``event`` is complete."""


@dataclass(frozen=True)
class ChunkCopy:
    """One chunk in flight: its byte range in the source, its ring slot and its event."""

    offset: int
    length: int
    slot: int
    event: Any


class RingStreamer:
    """Streams device buffers through a ring of ``slots`` pinned buffers of ``slot_bytes``.

    The ring's buffers are allocated once, when the streamer is made, and reused for
    every chunk of every buffer streamed through it.
    """

    def __init__(
        self,
        copier: DeviceCopier,
        *,
        slots: int = DEFAULT_SLOTS,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
    ) -> None:
        _check_counts(slots=slots, slot_bytes=slot_bytes)
        self._copier = copier
        self.slot_bytes = slot_bytes
        self._buffers = [copier.pinned(slot_bytes) for _ in range(slots)]
        #: whether a stream has started and not ended (copies may still target the ring)
        self.streaming = False

    @property
    def host_bytes(self) -> int:
        """The pinned host memory the ring holds: its bound on host memory."""
        return len(self._buffers) * self.slot_bytes

    def stream(
        self,
        source: Any,
        nbytes: int,
        chunk_bytes: int | None = None,
        *,
        lengths: Sequence[int] | None = None,
    ) -> Generator[memoryview, None, None]:
        """The ``nbytes`` of ``source`` in order, as views of the ring's buffers.

        Each view is valid until the consumer asks for the next one (its slot is then
        given a new copy). ``chunk_bytes`` (at most ``slot_bytes``) sets the piece size,
        so that pieces can match a store's chunk layout; ``lengths`` instead gives every
        piece's length (each in ``[1, slot_bytes]``, summing to ``nbytes``), for a layout
        whose chunks differ in size (a store's edge chunks).
        """
        if type(nbytes) is not int or nbytes < 0:
            raise ValueError(f"nbytes must be an int >= 0; got {nbytes!r}")
        if lengths is None:
            piece = self.slot_bytes if chunk_bytes is None else chunk_bytes
            if type(piece) is not int or not 1 <= piece <= self.slot_bytes:
                raise ValueError(
                    f"chunk_bytes must be an int in [1, {self.slot_bytes}]; got {chunk_bytes!r}"
                )
            pieces = [piece] * -(-nbytes // piece)
            if pieces:
                pieces[-1] = nbytes - piece * (len(pieces) - 1)
        else:
            pieces = list(lengths)
            if chunk_bytes is not None:
                raise ValueError("give chunk_bytes or lengths, not both")
            bad = [n for n in pieces if type(n) is not int or not 1 <= n <= self.slot_bytes]
            if bad:
                raise ValueError(f"lengths must be ints in [1, {self.slot_bytes}]; got {bad[0]!r}")
            if sum(pieces) != nbytes:
                raise ValueError(f"lengths sum to {sum(pieces)}; nbytes is {nbytes}")
        free = deque(range(len(self._buffers)))
        pending: deque[ChunkCopy] = deque()
        next_offset = 0
        next_piece = 0

        def issue() -> None:
            nonlocal next_offset, next_piece
            while free and next_piece < len(pieces):
                slot = free.popleft()
                length = pieces[next_piece]
                next_piece += 1
                target = self._buffers[slot][:length]
                event = self._copier.copy_async(source, next_offset, length, target)
                pending.append(ChunkCopy(next_offset, length, slot, event))
                next_offset += length

        self.streaming = True
        failure: BaseException | None = None
        try:
            issue()
            while pending:
                chunk = pending.popleft()
                try:
                    self._copier.wait(chunk.event)
                except BaseException as error:
                    failure = error
                    raise
                yield self._buffers[chunk.slot][: chunk.length]
                # the consumer is done with this slot: it takes the next copy
                free.append(chunk.slot)
                issue()
        finally:
            # never leave a copy running into a buffer the next stream will hand out:
            # every copy in flight is waited for, even after one failed
            for chunk in pending:
                try:
                    self._copier.wait(chunk.event)
                except BaseException as error:
                    failure = failure or error
            # after a failed copy the ring stays marked streaming: it is not reused (the
            # failure itself is raised where the consumer waits, or the stream was being
            # abandoned already)
            if failure is None:
                self.streaming = False


#: A write's rings by default: 2 slots each (one chunk copied while the one before is
#: written), at most 2 rings lent at once.
DEFAULT_WRITE_SLOTS = 2
DEFAULT_MAX_RINGS = 2


class RingPool:
    """Rings over one device, lent to the arrays being written, at most ``max_rings`` at once.

    A ring streams one buffer at a time, so each array written takes a ring of its own
    for the duration; a writer that finds every ring lent waits for one to come back.
    Rings are made on first need (their pinned buffers allocated then) and kept for the
    next snapshot; a ring that comes back with its stream still open (copies may still
    land in it) or after a failed copy is dropped instead. Host memory is bounded by
    ``max_rings * slots * slot_bytes`` (a ring made for chunks larger than
    ``slot_bytes`` replaces a smaller idle one).
    ``peak_lent`` is the most rings ever lent at once, ``peak_host_bytes`` the most
    pinned bytes the pool ever held.
    """

    def __init__(
        self,
        copier: DeviceCopier,
        *,
        slots: int = DEFAULT_WRITE_SLOTS,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        max_rings: int = DEFAULT_MAX_RINGS,
    ) -> None:
        _check_counts(slots=slots, slot_bytes=slot_bytes, max_rings=max_rings)
        self.copier = copier
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.max_rings = max_rings
        self._idle: list[RingStreamer] = []
        self._lent: list[RingStreamer] = []
        self._turns: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.peak_lent = 0
        self.peak_host_bytes = 0

    @contextlib.asynccontextmanager
    async def lend(self, piece_bytes: int) -> AsyncIterator[RingStreamer]:
        """A ring whose slots hold ``piece_bytes`` at least, for the ``async with`` body."""
        async with self._turns_here():
            ring = self._take(piece_bytes)
            self._lent.append(ring)
            self.peak_lent = max(self.peak_lent, len(self._lent))
            self.peak_host_bytes = max(self.peak_host_bytes, self.host_bytes)
            try:
                yield ring
            finally:
                self._lent.remove(ring)
                if not ring.streaming:
                    self._idle.append(ring)
                # else a stream over it was left open: copies may still land in its
                # buffers, so it is never lent again (its memory goes with it)

    @property
    def host_bytes(self) -> int:
        """The pinned host memory of the rings the pool holds now (lent or idle)."""
        return sum(ring.host_bytes for ring in self._idle + self._lent)

    def _turns_here(self) -> asyncio.Semaphore:
        """The semaphore of the running loop (a pool moves to another loop once idle)."""
        loop = asyncio.get_running_loop()
        if self._turns is None or self._loop is not loop:
            if self._lent:
                raise RuntimeError(
                    "a RingPool lends its rings within one event loop at a time; "
                    f"{len(self._lent)} are lent in another loop"
                )
            self._turns, self._loop = asyncio.Semaphore(self.max_rings), loop
        return self._turns

    def _take(self, piece_bytes: int) -> RingStreamer:
        """An idle ring that fits ``piece_bytes``, else a new one (dropping a small idle one)."""
        for index, ring in enumerate(self._idle):
            if ring.slot_bytes >= piece_bytes:
                return self._idle.pop(index)
        if self._idle and len(self._idle) + len(self._lent) >= self.max_rings:
            self._idle.pop(0)  # too small for this piece: its pinned buffers go
        return RingStreamer(
            self.copier, slots=self.slots, slot_bytes=max(self.slot_bytes, piece_bytes)
        )


class CupyCopier:
    """DeviceCopier on CUDA through CuPy: pinned memory, one non-blocking side stream."""

    def __init__(self, device: int = 0) -> None:
        import cupy  # optional dependency, only where a GPU is used

        self._cupy = cupy
        self._device = device
        with cupy.cuda.Device(device):
            self._stream = cupy.cuda.Stream(non_blocking=True)

    def pinned(self, nbytes: int) -> memoryview:
        memory = self._cupy.cuda.alloc_pinned_memory(nbytes)
        # the view holds the array, whose base holds the allocation: it goes back to
        # CuPy's pinned pool once the ring that holds the view is dropped
        return np.frombuffer(memory, np.uint8, nbytes).data

    def copy_async(self, source: Any, offset: int, length: int, target: memoryview) -> Any:
        cupy = self._cupy
        runtime = cupy.cuda.runtime
        host = _address_of(target)
        with cupy.cuda.Device(self._device):
            # the side stream must see the source complete on the stream that wrote it
            self._stream.wait_event(cupy.cuda.get_current_stream().record())
            runtime.memcpyAsync(
                host,
                source.data.ptr + offset,
                length,
                runtime.memcpyDeviceToHost,
                self._stream.ptr,
            )
            return self._stream.record()

    def wait(self, event: Any) -> None:
        event.synchronize()


def _address_of(view: memoryview) -> int:
    """The address of a buffer's first byte."""
    return int(np.frombuffer(view, np.uint8).ctypes.data)
