"""How the local store writes a file: through the page cache, or with O_DIRECT.

Every file is created new (``O_EXCL``) and written start to finish by one thread. A
final :class:`Crc32cTrailer` among the buffers is computed as the bytes before it are
written (each slice checksummed while it is still in the CPU's cache), or while the
device writes them.

Large chunk files are written with ``O_DIRECT`` when the file system allows it. Through
the page cache, a chunk's bytes are copied into newly allocated cache pages (on the VMs
measured often fresh host memory, ~2.2 s per GiB on first touch) and written back by the
kernel; with ``O_DIRECT`` they are copied, slice by slice, into one aligned buffer per
thread that is reused for every chunk (in huge pages where the kernel has them), and the
device reads them from there. A file that fits the whole-file buffer (a snapshot of one
packed chunk) is laid out in it at once, its page-aligned gradients left in their own
memory, and handed to the device in one vectored write before its bytes are checksummed
(:class:`_FileImage`). The last piece that does not fill an aligned block (the crc32c
trailer at least) is written through the page cache, ``O_DIRECT`` cleared on the
descriptor first. The fsync that follows is the same either way (it makes the file's
size and blocks durable).

A file written without its fsync (the caller fsyncs it later, with others) has its
writeback started at once (:func:`start_writeback`): its blocks are allocated and its
bytes on their way while the caller does other work, so the fsync that follows finds
less to do.

``O_DIRECT`` is set on the open descriptor with ``fcntl``, so a file system that refuses
it (tmpfs answers ``EINVAL``) costs nothing but that call: the file is written through
the page cache, as it is where ``O_DIRECT`` does not exist. One that accepts the flag
but refuses an aligned write (``EINVAL``: a larger alignment than ours) gets the same
bytes again through the page cache. Either way the store stops trying (``DirectWrites``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import logging
import mmap
import os
import queue
import stat
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from ..records.mapped_file import release_pages
from ._checksums import SLICE_BYTES, Crc32cTrailer, ReadAlong, crc32c
from ._stats import crc32c_parts

_log = logging.getLogger("gradvault.store")
NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
#: A file written again in place (a spare folder's, see ``_local``): never through a link
REUSED_FILE_FLAGS = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: 0 where the platform has none (macOS): every write then goes through the page cache
O_DIRECT = getattr(os, "O_DIRECT", 0)
#: Offsets, lengths and buffer addresses of direct writes are multiples of this (the
#: logical block size of common disks is 512 or 4096 bytes).
DIRECT_ALIGNMENT = 4096
#: The aligned buffer each writing thread keeps (a chunk is written in pieces this long):
#: one huge page (:func:`huge_page_memory`). Writing 1 GiB as 256 files of 4 MiB in four
#: threads took 826-931 ms in 1 MiB pieces from small pages, 661-696 ms in 2 MiB pieces
#: from a huge page, 635-673 ms in 4 MiB ones; a service with many writing threads keeps
#: 2 MiB resident per thread, not 4.
DIRECT_BUFFER_BYTES = 2 << 20
#: Files shorter than this go through the page cache: they gain nothing from O_DIRECT.
DIRECT_MIN_BYTES = 256 << 10

_thread_state = threading.local()


class DirectWrites:
    """Whether one store writes its large files with O_DIRECT; off for good once refused."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled and O_DIRECT != 0

    def refused(self, path: str, error: OSError) -> None:
        if self.enabled:
            self.enabled = False
            _log.info("O_DIRECT refused for %s (%s); writing through the page cache", path, error)


def write_all(fd: int, views: list[memoryview]) -> None:
    """Write ``views`` back to back at the file's offset, however the kernel splits it."""
    views = [view for view in views if len(view)]
    while views:
        written = os.writev(fd, views[:1024])
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


#: Linux's ``sync_file_range(2)`` flag: start writing back the range's dirty pages, wait
#: for nothing
SYNC_FILE_RANGE_WRITE = 2


def _sync_file_range() -> Any:
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_sync_file_range_call = _sync_file_range()

#: Whether :func:`start_writeback` does anything here (Linux's ``sync_file_range``)
CAN_START_WRITEBACK = _sync_file_range_call is not None


def start_writeback(fd: int) -> None:
    """Start writing ``fd``'s dirty pages to the device, without waiting for them.

    For a file written now and fsynced later: on ext4 its blocks are allocated now
    (delayed allocation otherwise waits for the fsync; with a journal, the next fsync of
    any file commits them) and its bytes go to the device meanwhile, so its own fsync
    finds them there (a manifest and its staging folder fsynced after the chunk's round,
    on ext4 without a journal: 0.23-0.25 ms, against 0.35 ms without). Only a hint: it
    makes nothing durable, and a write error it meets is reported by the fsync (with
    ``SYNC_FILE_RANGE_WRITE`` alone the call neither waits nor consumes the file's
    writeback error), so its own result is not looked at. Nothing where the call does not exist.
    """
    if _sync_file_range_call is not None:
        _sync_file_range_call(fd, 0, 0, SYNC_FILE_RANGE_WRITE)


#: Who reads a part along as it is written (None: nobody)
Reader = ReadAlong | None
#: Called by a write once every byte is read (checksummed, every ReadAlong visited) and
#: before it waits for the device: work that needs what the reads computed overlaps the
#: last direct writes (see :func:`write_file`)
Meanwhile = Callable[[], None] | None


#: A file's parts as :func:`_split_trailer` gives them: bytes, readers, trailer
_Parts = tuple[list[memoryview], list[Reader], Crc32cTrailer | None]


def _split_trailer(buffers: list[Any]) -> _Parts:
    """The parts' bytes, who reads each along (``ReadAlong``), and the final trailer."""
    trailer = buffers[-1] if buffers and isinstance(buffers[-1], Crc32cTrailer) else None
    views: list[memoryview] = []
    readers: list[Reader] = []
    for b in buffers[:-1] if trailer else buffers:
        if isinstance(b, ReadAlong):
            views.append(b.data)
            readers.append(b)
        else:
            views.append(memoryview(b).cast("B"))
            readers.append(None)
    return views, readers, trailer


def write_buffers(fd: int, buffers: list[Any]) -> None:
    """Write ``buffers`` back to back to ``fd`` (a final Crc32cTrailer computed as it goes,
    each ReadAlong's slices handed on as they are written)."""
    _write_parts(fd, _split_trailer(buffers))


def _write_parts(fd: int, parts: _Parts) -> None:
    views, readers, trailer = parts
    if trailer is None and not any(readers):
        write_all(fd, views)
        return
    # in the page cache once written: a mapped upload's slice need not stay resident
    # (through the fsync)
    _read_along(views, readers, trailer, SLICE_BYTES, lambda piece: write_all(fd, [piece]))
    if trailer is not None:
        write_all(fd, [memoryview(trailer.value())])


def _read_span(reader: Reader, span: memoryview, crc: int | None) -> int | None:
    """``span`` visited by its part's reader, if any, and its crc32c continued from
    ``crc`` (None: no checksum taken), in one pass where the reader can."""
    if reader is None:
        return None if crc is None else crc32c(span, crc)
    if crc is None:
        reader.visit(span)
        return None
    return reader.take(span, crc)


def _read_along(
    views: list[memoryview],
    readers: list[Reader],
    trailer: Crc32cTrailer | None,
    span_bytes: int,
    write: Callable[[memoryview], None] | None = None,
) -> None:
    """Go over each part in spans of ``span_bytes``: the span's running crc32c (recorded
    in ``trailer`` after each part) and the part's reader's visit (in one pass where the
    reader can), ``write(span)`` if given while the span is in the CPU's cache, then the
    span's pages let go (a mapped upload's; a no-op for any other memory).

    Without ``write``, and where every reader's part is float32 values it lets be read
    whole (``ReadAlong.whole``), every part is read in one call instead
    (:func:`_read_in_one_call`)."""
    if write is None and trailer is not None and _read_in_one_call(views, readers, trailer):
        return
    crc = None if trailer is None else 0
    for view, reader in zip(views, readers, strict=True):
        for start in range(0, len(view), span_bytes):
            span = view[start : start + span_bytes]
            crc = _read_span(reader, span, crc)
            if write is not None:
                write(span)
            release_pages(span)
        if trailer is not None:
            assert crc is not None
            trailer.add(crc)


def _read_in_one_call(
    views: list[memoryview], readers: list[Reader], trailer: Crc32cTrailer
) -> bool:
    """:func:`_read_along` without ``write`` in one call of the C extension
    (``crc32c_parts``): every part's running crc32c recorded in ``trailer``, and what the
    pass took of each part in ``trailer.whole`` (its own crc32c, and of a reader's part
    its values' min, max and sum of squares, from the same pass), then each part's pages
    let go. No reader is called. False, with nothing read, where the extension lacks it
    or a reader's part is not float32 values it lets be read whole.

    One call for every part, where the spans took several Python calls a part (a slice
    handed to its reader, its stats taken in); a file read so is at most
    WHOLE_FILE_MAX_BYTES, so a mapped part's pages are let go a part, not a span, at a
    time."""
    if crc32c_parts is None:
        return False
    wanted = []
    for view, reader in zip(views, readers, strict=True):
        if reader is None:
            wanted.append(False)
        elif not reader.whole or not len(view):
            return False
        else:
            wanted.append(True)
    taken = crc32c_parts(views, wanted)
    for view, part in zip(views, taken, strict=True):
        trailer.add(part[0])
        release_pages(view)
    trailer.whole = taken
    return True


#: Buffers for direct writes start at a multiple of this and ask for transparent huge
#: pages (``MADV_HUGEPAGE``, where the kernel has them): a direct write from them pins a
#: few 2 MiB pages, not 4 KiB ones one by one, and reaches the device in fewer, larger
#: requests. One write of 8 MiB took 0.29-0.44 ms of CPU from huge pages against
#: 0.73-0.98 ms from small ones, and 5.1 ms of wall time against 8.1-8.4 ms; 1 GiB in
#: 256 files of 4 MiB, 1 MiB at a time in four threads, 614-910 ms against 826-931 ms.
HUGE_PAGE_BYTES = 2 << 20


def huge_page_memory(length: int) -> memoryview:
    """``length`` bytes of private anonymous memory (counted as the process's own, not
    shared) at a multiple of HUGE_PAGE_BYTES, in huge pages where the kernel gives them."""
    memory = mmap.mmap(-1, length + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            memory.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # a kernel without transparent huge pages
            pass
    start = -np.frombuffer(memory, np.uint8).ctypes.data % HUGE_PAGE_BYTES
    return memoryview(memory)[start : start + length]


def _aligned_buffer() -> memoryview:
    """This thread's aligned buffer for direct writes (made on first use)."""
    buffer = getattr(_thread_state, "buffer", None)
    if buffer is None:
        buffer = _thread_state.buffer = huge_page_memory(DIRECT_BUFFER_BYTES)
    return buffer


#: A file up to this long is written from a buffer as long as the file
#: (:class:`WholeFileBuffer`, :class:`_FileImage`), not DIRECT_BUFFER_BYTES at a time:
#: each direct write waits for the device, and eight 1 MiB writes of an 8 MiB file took
#: 7 ms where one took 4.
WHOLE_FILE_MAX_BYTES = 64 << 20


class WholeFileBuffer:
    """One aligned buffer for writing a whole file at once, lent to one writer at a time.

    Kept between writes (fresh memory costs a page fault per page on first touch, more
    than the copy into it) and grown to the longest file written through it, up to
    WHOLE_FILE_MAX_BYTES; a writer that finds it lent out writes DIRECT_BUFFER_BYTES at a
    time instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer: memoryview | None = None
        self._lent = False

    def borrow(self, length: int) -> memoryview | None:
        """The buffer, at least ``length`` bytes long; None while another writer has it."""
        with self._lock:
            if self._lent:
                return None
            self._lent = True
        if self._buffer is None or len(self._buffer) < length:
            # the old mapping goes once the last view of it does
            size = -(-length // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
            self._buffer = huge_page_memory(size)
        return self._buffer

    def give_back(self) -> None:
        with self._lock:
            self._lent = False


_whole_file_buffer = WholeFileBuffer()


def _goes_cached(direct: DirectWrites, path: str, error: OSError) -> bool:
    """Whether a direct write that failed with ``error`` (writing nothing) is made again
    through the page cache: on EINVAL (the file system's refusal: the store stops trying)
    and on EFAULT (memory written from as it is that the kernel cannot pin for the device,
    such as some drivers' mappings: the page cache copies from it all the same)."""
    if error.errno == errno.EINVAL:
        direct.refused(path, error)
        return True
    return error.errno == errno.EFAULT


def set_direct(fd: int, on: bool) -> None:
    """Set or clear O_DIRECT on the open file ``fd`` (OSError where refused)."""
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | O_DIRECT if on else flags & ~O_DIRECT)


class _DirectFile:
    """Writes one file through the thread's aligned buffer, O_DIRECT set on ``fd``."""

    def __init__(self, fd: int, path: str, direct: DirectWrites) -> None:
        self._fd = fd
        self._path = path
        self._direct = direct
        self._buffer = _aligned_buffer()
        self._filled = 0

    def _copy_in(self, piece: memoryview, crc: int | None) -> int | None:
        """Copy ``piece`` (it fits) to the buffer after what it holds; with ``crc``, the
        crc32c continued over ``piece``, taken from the copy."""
        target = self._buffer[self._filled : self._filled + len(piece)]
        # NumPy copies without the GIL (a memoryview assignment holds it), so the
        # threads writing other chunks copy at the same time
        np.copyto(np.frombuffer(target, np.uint8), np.frombuffer(piece, np.uint8))
        if crc is not None:
            crc = crc32c(target, crc)
        self._filled += len(piece)
        return crc

    def from_memory(self, view: memoryview) -> int:
        """Write the start of ``view`` from its own memory, not copied, where it can be: its
        whole aligned blocks, when it starts at an aligned address and the file's bytes so
        far are whole blocks (a page-aligned gradient, ``backend.empty``, at an aligned
        offset of the packed array). Returns how many bytes that is (0: none); the caller
        still takes their crc32c, and :meth:`add` the rest."""
        if len(view) < DIRECT_ALIGNMENT or self._filled % DIRECT_ALIGNMENT:
            return 0
        if address_of(view) % DIRECT_ALIGNMENT:
            return 0
        length = len(view) - len(view) % DIRECT_ALIGNMENT
        self._write_from_memory(view[:length])
        return length

    def add(self, piece: memoryview, crc: int | None) -> int | None:
        """Copy ``piece`` into the buffer (writing it out whenever it is full); with
        ``crc``, the crc32c continued over ``piece``, taken from the copy."""
        buffer = self._buffer
        while len(piece):
            take = min(len(piece), len(buffer) - self._filled)
            crc = self._copy_in(piece[:take], crc)
            piece = piece[take:]
            if self._filled == len(buffer):
                self._write(buffer)
                self._filled = 0
        return crc

    def _write_from_memory(self, view: memoryview) -> None:
        """Write ``view`` (aligned) after the buffer's bytes, which go first (whole blocks)."""
        if self._filled:
            self._write(self._buffer[: self._filled])
            self._filled = 0
        self._write(view)

    def abandon(self) -> None:
        """The write failed part way: nothing of this file is left in flight."""

    def finish(self, meanwhile: Meanwhile = None) -> None:
        """Write what the buffer holds: its aligned part directly, the rest through the
        cache; ``meanwhile`` (if any) is called once nothing is left to read."""
        aligned = self._filled - self._filled % DIRECT_ALIGNMENT
        if meanwhile is not None:
            meanwhile()
        if aligned:
            self._write(self._buffer[:aligned])
        if self._filled > aligned:
            set_direct(self._fd, False)
            write_all(self._fd, [self._buffer[aligned : self._filled]])

    def _write(self, view: memoryview) -> None:
        try:
            written = os.write(self._fd, view)
        except OSError as error:
            # accepted at fcntl, refused at the write (nothing was written): go on cached
            if not _goes_cached(self._direct, self._path, error):
                raise
            written = 0
        if written < len(view):  # refused, or short: the rest through the cache
            set_direct(self._fd, False)
            write_all(self._fd, [view[written:]])


#: A part written from its own memory is checksummed and read along (its stats) in spans
#: this long, not SLICE_BYTES: nothing is copied between the reads, and the stats of the
#: MLP's two 4 MiB gradients took 0.75 ms of a commit in 4 MiB spans, 0.98 ms in 1 MiB
#: slices (fewer calls; the span is still in the 32 MiB L3 cache for the second read)
READ_ALONG_BYTES = 4 << 20

#: A whole-file write hands the device the bytes it has copied every time it has copied
#: this many (:class:`_FileImage`): the device writes one piece while the next is copied.
#: Direct writes of 8 MiB in pieces of 1, 2 or 4 MiB, one after the other, took as long as
#: one write of 8 MiB (5.1-5.2 ms here).
PIECE_BYTES = 2 << 20

#: Most buffers one ``pwritev`` takes (Linux's IOV_MAX)
_MOST_VECTORS = 1024


class _Piece:
    """One write handed to the piece thread; :meth:`result` waits for it (and raises what
    it raised). A lock held until the write is done: handing a piece over and waiting for
    it took 38 us here, against 65 us through a ``ThreadPoolExecutor`` and its futures."""

    __slots__ = ("_function", "_done", "_error")

    def __init__(self, function: Callable[[], None]) -> None:
        self._function = function
        self._error: BaseException | None = None
        self._done = threading.Lock()
        self._done.acquire()

    def run(self) -> None:
        try:
            self._function()
        except BaseException as error:  # noqa: BLE001 - raised again by result()
            self._error = error
        finally:
            self._done.release()

    def result(self) -> None:
        """Once the write is done: None, or raise what it raised."""
        with self._done:
            pass
        if self._error is not None:
            raise self._error

    def done(self) -> bool:
        """Whether the write has finished (well or not)."""
        if not self._done.acquire(blocking=False):
            return False
        self._done.release()
        return True


def _serve_pieces(pieces: queue.SimpleQueue[_Piece]) -> None:
    while True:
        pieces.get().run()


class _PieceThread:
    """The one thread that writes pieces (one whole-file buffer, so one file at a time),
    in the order handed over; made again in a process forked from one that had it (its
    thread is not there). A daemon: every piece is waited for by the write that handed it
    over, so none is left when the threads that write have finished."""

    def __init__(self) -> None:
        self._forked()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._pieces: queue.SimpleQueue[_Piece] | None = None

    def submit(self, function: Callable[[], None]) -> _Piece:
        pieces = self._pieces
        if pieces is None:
            with self._lock:
                pieces = self._pieces
                if pieces is None:
                    pieces = queue.SimpleQueue()
                    threading.Thread(
                        target=_serve_pieces, args=(pieces,), name="gradvault-direct", daemon=True
                    ).start()
                    self._pieces = pieces
        piece = _Piece(function)
        pieces.put(piece)
        return piece


_piece_thread = _PieceThread()


def _after(views: list[memoryview], skipped: int) -> list[memoryview]:
    """``views`` without their first ``skipped`` bytes (and without empty ones)."""
    rest = []
    for view in views:
        if skipped >= len(view):
            skipped -= len(view)
            continue
        rest.append(view[skipped:])
        skipped = 0
    return rest


def _pwritev_all(fd: int, views: list[memoryview], offset: int) -> None:
    """Write ``views`` back to back from ``offset``, however the kernel splits it."""
    views = _after(views, 0)
    while views:
        written = os.pwritev(fd, views[:_MOST_VECTORS], offset)
        offset += written
        views = _after(views, written)


def address_of(view: memoryview) -> int:
    """The address of ``view``'s first byte (0 for an empty one): direct I/O wants it
    aligned to DIRECT_ALIGNMENT."""
    return np.frombuffer(view, np.uint8).ctypes.data if len(view) else 0


class _FileImage:
    """Writes one file that fits the whole-file buffer, whose offsets are the file's.

    Each part is laid out at its offset (:meth:`lay_out`): the whole aligned blocks of a
    part that starts at an aligned address and offset go to the device from the part's
    own memory (a page-aligned gradient, ``backend.empty``, at an aligned offset of the
    packed array); every other byte is copied into the buffer. What is laid out is handed
    to the piece thread in one vectored direct write (``pwritev``) each time the copies
    reach a multiple of PIECE_BYTES, and the rest by :meth:`hand_over_rest`: a snapshot of
    large aligned gradients is one write, handed over before its first byte is
    checksummed, so the device writes while the caller reads. :meth:`finish` waits for
    the device and writes the unaligned tail through the page cache.
    """

    def __init__(
        self, fd: int, path: str, direct: DirectWrites, buffer: memoryview, length: int
    ) -> None:
        self._fd = fd
        self._path = path
        self._direct = direct
        self._buffer = buffer
        self._length = length  # the bytes laid out; a trailer after them goes with the tail
        self._aligned_end = length - length % DIRECT_ALIGNMENT
        self._offset = 0  # where the next part goes
        self._run = 0  # where the buffer's bytes not yet in _waiting start
        self._waiting: list[memoryview] = []  # laid out, not handed over yet
        self._waiting_from = 0  # the file offset of _waiting's first byte
        self._in_flight: list[_Piece] = []

    def lay_out(self, view: memoryview) -> None:
        """Place ``view`` after the parts before it: from its own memory, or copied."""
        offset, end = self._offset, self._offset + len(view)
        own = 0
        if not offset % DIRECT_ALIGNMENT and not address_of(view) % DIRECT_ALIGNMENT:
            own = max(0, min(end, self._aligned_end) - offset)
            own -= own % DIRECT_ALIGNMENT
        if own:
            self._close_run(offset)
            self._waiting.append(view[:own])
            self._run = offset + own
        at = offset + own
        while at < end:  # copied a piece at a time, each handed over once copied
            stop = min(end, (at // PIECE_BYTES + 1) * PIECE_BYTES)
            self._buffer[at:stop] = view[at - offset : stop - offset]  # one memcpy
            at = stop
            if not at % PIECE_BYTES and at <= self._aligned_end:
                self._close_run(at)
                self._hand_over()
        self._offset = end

    def hand_over_rest(self) -> None:
        """Hand over every aligned block laid out and not handed over yet."""
        self._close_run(self._aligned_end)
        self._hand_over()

    def _close_run(self, end: int) -> None:
        """Add the buffer's bytes from the last handed over or own part to ``end``."""
        if end > self._run:
            self._waiting.append(self._buffer[self._run : end])
            self._run = end

    def _hand_over(self) -> None:
        views, start = self._waiting, self._waiting_from
        if not views:
            return
        self._waiting = []
        self._waiting_from = start + sum(len(view) for view in views)
        self._in_flight.append(_piece_thread.submit(lambda: self._write_at(views, start)))

    def _write_at(self, views: list[memoryview], start: int) -> None:
        """Write ``views`` from ``start`` (in the piece thread, in order), directly; where
        refused or short, the rest through the cache."""
        for first in range(0, len(views), _MOST_VECTORS):
            batch = views[first : first + _MOST_VECTORS]
            length = sum(len(view) for view in batch)
            try:
                written = os.pwritev(self._fd, batch, start)
            except OSError as error:
                if not _goes_cached(self._direct, self._path, error):
                    raise
                written = 0
            if written < length:
                set_direct(self._fd, False)
                _pwritev_all(self._fd, _after(batch, written), start + written)
            start += length

    def finish(self, trailer: bytes) -> None:
        """Wait for the direct writes, then write the tail and ``trailer`` through the cache."""
        self._wait(raising=True)
        tail = self._buffer[self._aligned_end : self._length]
        if len(tail) or trailer:
            set_direct(self._fd, False)
            _pwritev_all(self._fd, [tail, memoryview(trailer)], self._aligned_end)

    def abandon(self) -> None:
        """The write failed part way: wait for what is in flight (the buffer is given back
        once nothing reads it)."""
        self._wait(raising=False)

    def _wait(self, raising: bool) -> None:
        pending, self._in_flight = self._in_flight, []
        failure: BaseException | None = None
        for piece in pending:
            while True:
                try:
                    piece.result()
                except BaseException as error:  # noqa: BLE001 - every piece is waited for
                    failure = failure or error
                    if not piece.done():  # interrupted while waiting: it still writes
                        continue  # its file and the buffer it reads stay until it is done
                break
        if failure is not None and raising:
            raise failure


def _write_direct(
    fd: int,
    path: str,
    parts: _Parts,
    length: int,
    direct: DirectWrites,
    whole_file: bool,
    meanwhile: Meanwhile = None,
) -> None:
    whole = None
    if whole_file and length <= WHOLE_FILE_MAX_BYTES:
        whole = _whole_file_buffer.borrow(length)
    try:
        _write_direct_through(fd, path, parts, length, direct, whole, meanwhile)
    finally:
        if whole is not None:
            _whole_file_buffer.give_back()


def _write_direct_through(
    fd: int,
    path: str,
    parts: _Parts,
    length: int,
    direct: DirectWrites,
    whole: memoryview | None,
    meanwhile: Meanwhile = None,
) -> None:
    views, readers, trailer = parts
    if whole is not None:
        laid_out = length if trailer is None else length - Crc32cTrailer.BYTES
        _write_image(fd, path, views, readers, trailer, laid_out, direct, whole, meanwhile)
        return
    out = _DirectFile(fd, path, direct)
    crc = None if trailer is None else 0
    try:
        for view, reader in zip(views, readers, strict=True):
            # an aligned gradient goes to the device from its memory while it is read here,
            # in spans of READ_ALONG_BYTES (nothing is copied: fewer, longer reads)
            from_memory = out.from_memory(view)
            for start in range(0, from_memory, READ_ALONG_BYTES):
                span = view[start : min(start + READ_ALONG_BYTES, from_memory)]
                crc = _read_span(reader, span, crc)
                release_pages(span)  # in flight: a mapped upload's span may go
            for start in range(from_memory, len(view), SLICE_BYTES):
                piece = view[start : start + SLICE_BYTES]
                crc = out.add(piece, crc)
                if reader is not None:  # just copied: still in the CPU's cache
                    reader.visit(piece)
                release_pages(piece)  # copied: a mapped upload's slice may go
            if trailer is not None:
                assert crc is not None
                trailer.add(crc)
        if trailer is not None:
            out.add(memoryview(trailer.value()), None)
        out.finish(meanwhile)
    except BaseException:
        out.abandon()
        raise


def _write_image(
    fd: int,
    path: str,
    views: list[memoryview],
    readers: list[Reader],
    trailer: Crc32cTrailer | None,
    length: int,
    direct: DirectWrites,
    buffer: memoryview,
    meanwhile: Meanwhile,
) -> None:
    """Write a file that fits the whole-file buffer (:class:`_FileImage`): every part
    (``length`` bytes together) laid out and its direct writes handed over first, then
    each part checksummed and read along (its stats) in spans of READ_ALONG_BYTES while
    the device writes, ``meanwhile``, and the unaligned tail with the trailer once the
    device is done."""
    image = _FileImage(fd, path, direct, buffer, length)
    try:
        for view in views:
            image.lay_out(view)
        image.hand_over_rest()
        _read_along(views, readers, trailer, READ_ALONG_BYTES)  # while the device writes
        if meanwhile is not None:  # while the device writes
            meanwhile()
        image.finish(b"" if trailer is None else trailer.value())
    except BaseException:
        image.abandon()
        raise


def _try_direct(fd: int, path: str, direct: DirectWrites) -> bool:
    """Set O_DIRECT on ``fd``; False (and the store stops trying) where it is refused."""
    try:
        set_direct(fd, True)
    except OSError as error:
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
            raise
        direct.refused(path, error)
        return False
    return True


def is_own_file(status: os.stat_result) -> bool:
    """Whether ``status`` is that of a regular file with no other name: one a store may
    write again in place without changing anything but itself."""
    return stat.S_ISREG(status.st_mode) and status.st_nlink == 1


def open_to_write(path: str, existing: bool = False) -> int:
    """A descriptor to write ``path`` from its start: a new file, or with ``existing`` the
    file already there, which must be a regular file with no other name (OSError
    otherwise, naming it): its bytes are replaced, and the caller sets its length."""
    if not existing:
        return os.open(path, NEW_FILE_FLAGS, 0o644)
    fd = os.open(path, REUSED_FILE_FLAGS)
    if not is_own_file(os.fstat(fd)):
        os.close(fd)
        raise OSError(errno.EEXIST, "not a file of its own (another name links to it)", path)
    return fd


def write_file(
    path: str,
    buffers: list[Any],
    direct: DirectWrites | None = None,
    *,
    fsync: bool = True,
    fsync_direct: bool = True,
    whole_file: bool = False,
    meanwhile: Meanwhile = None,
    existing: bool = False,
) -> bool:
    """Create ``path`` holding ``buffers`` back to back, and fsync it (unless ``fsync`` is
    false: the caller fsyncs it later, and its writeback is started, see
    :func:`start_writeback`). With ``fsync_direct`` false, a file written with O_DIRECT
    is left to the caller to fsync too: its bytes are on the device already, and the
    fsync that makes its size, its blocks and the device's cache durable can be made with
    others'. Returns whether the file is left to the caller to fsync.

    ``meanwhile``, if given, is called once every byte has been read (the trailer and
    every ReadAlong's visits done), while direct writes may still be in flight: the file
    is whole only once this returns. If it raises, the write waits for what is in flight
    and raises that.

    With ``direct`` (and the file long enough), through O_DIRECT where the file system
    allows it; the bytes on disk are the same either way. With ``whole_file`` too, a file
    of at most WHOLE_FILE_MAX_BYTES goes to the device in one direct write (through the
    :class:`WholeFileBuffer`, when no other write has it), not 1 MiB at a time.

    With ``existing``, the file at ``path`` is written again in place (:func:`open_to_write`)
    and cut or extended to the new length first: no new file, and where the length is the
    same, no block allocated.
    """
    fd = open_to_write(path, existing)
    try:
        written_direct = False
        parts = _split_trailer(buffers)
        views, _, trailer = parts
        length = sum(map(len, views)) + (0 if trailer is None else Crc32cTrailer.BYTES)
        if existing:
            os.ftruncate(fd, length)
        if (
            length >= DIRECT_MIN_BYTES
            and direct is not None
            and direct.enabled
            and _try_direct(fd, path, direct)
        ):
            _write_direct(fd, path, parts, length, direct, whole_file, meanwhile)
            written_direct = True
        else:
            _write_parts(fd, parts)
            if meanwhile is not None:
                meanwhile()
        later = not fsync or (written_direct and not fsync_direct)
        if later:
            start_writeback(fd)
        else:
            os.fsync(fd)
    finally:
        os.close(fd)
    return later


def write_file_unsynced(path: str, buffers: list[Any], existing: bool = False) -> None:
    """Create ``path`` holding ``buffers`` through the page cache, its writeback started
    (:func:`start_writeback`); the caller fsyncs it. With ``existing``, the file there is
    written again in place and cut to the new length (:func:`open_to_write`)."""
    fd = open_to_write(path, existing)
    try:
        write_buffers(fd, buffers)
        if existing:
            os.ftruncate(fd, os.lseek(fd, 0, os.SEEK_CUR))
        start_writeback(fd)
    finally:
        os.close(fd)
