"""Read-only file mappings whose pages a reader lets go once it has read them.

Every page of a mapped file that a process touches stays in its resident memory (RssFile
in /proc/<pid>/status) until the mapping goes, even though the kernel holds the same
bytes in its page cache anyway: a service that maps a 1 GiB upload and reads it through
grows by 1 GiB, and by as many GiB as it commits uploads at once. :func:`release_pages`
drops the pages a reader is done with from the process (``madvise(MADV_DONTNEED)``); on a
read-only shared mapping of a file that changes nothing but residency: a later read of
those bytes faults them back in from the page cache (or the file). It acts only on
mappings made by :func:`map_readonly`, where that holds; any other memory (a copy, an
anonymous buffer, a caller's own mapping) is left alone, since dropping the pages of
anonymous or private memory would lose its bytes.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Any

import numpy as np

_PAGE = mmap.PAGESIZE
_CAN_RELEASE = hasattr(mmap.mmap, "madvise") and hasattr(mmap, "MADV_DONTNEED")


class _ReadOnlyMapping(mmap.mmap):
    """A read-only, shared mapping of a whole file (made only by :func:`map_readonly`)."""

    address: int


class _LiveMappings:
    """How many :func:`map_readonly` mappings exist: while there is none,
    :func:`release_pages` has nothing to look for and returns at once (a commit of
    gradients from the engine's memory calls it for every slice it reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def add(self, mapping: _ReadOnlyMapping) -> None:
        with self._lock:
            self.count += 1
        weakref.finalize(mapping, self._gone)

    def _gone(self) -> None:
        with self._lock:
            self.count -= 1


_live = _LiveMappings()


def map_readonly(path: str | os.PathLike[str]) -> memoryview:
    """The bytes of the file at ``path``, mapped read-only (an empty view for an empty file).

    The file must not change while the view is used. Pages touched through the view can
    be let go with :func:`release_pages`.
    """
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return memoryview(b"")
        mapping = _ReadOnlyMapping(file.fileno(), 0, access=mmap.ACCESS_READ)
    _live.add(mapping)
    mapping.address = np.frombuffer(mapping, np.uint8).ctypes.data
    return memoryview(mapping)


def _mapping_of(buffer: Any) -> _ReadOnlyMapping | None:
    """The :func:`map_readonly` mapping that ``buffer``'s memory belongs to, if any."""
    while not isinstance(buffer, _ReadOnlyMapping):
        if isinstance(buffer, memoryview):
            buffer = buffer.obj
        elif isinstance(buffer, np.ndarray):
            buffer = buffer.base
        else:
            return None
    return buffer


def release_pages(buffer: memoryview | np.ndarray) -> int:
    """Drop the pages of ``buffer`` from this process if it lies in a read-only file mapping.

    Its bytes stay readable (the next read faults them back in); what goes is the
    resident memory they take. Returns the bytes released (0 for memory of another kind,
    or where the system cannot release pages).
    """
    if not _CAN_RELEASE or not _live.count:
        return 0
    mapping = _mapping_of(buffer)
    if mapping is None:
        return 0
    view = np.frombuffer(buffer, np.uint8) if isinstance(buffer, memoryview) else buffer
    if view.nbytes == 0 or not view.flags.c_contiguous:
        return 0
    start = view.ctypes.data - mapping.address
    if start < 0 or start + view.nbytes > len(mapping):
        return 0
    # whole pages around the buffer: a neighbour's bytes on a shared page come back on
    # its next read, the file's bytes never change
    first = start - start % _PAGE
    end = min(len(mapping), -(-(start + view.nbytes) // _PAGE) * _PAGE)
    mapping.madvise(mmap.MADV_DONTNEED, first, end - first)
    return end - first
