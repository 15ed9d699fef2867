"""A local store's files, a system call or a few at a time.

Reading one (a regular file only, no symbolic link followed, into memory of its own: from
the page cache where its first page is there, with O_DIRECT where it is not), the
sizes of the files under a folder, the locks that claim a folder for its removal or for a
shard's publication, removing a folder and what it holds, and replacing a file whole.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import secrets
import shutil
import signal
import stat
import sys
from typing import Any

import numpy as np

from ._backend import UnexpectedObjectError
from ._checksums import SLICE_BYTES, crc32c
from ._file_writes import (
    DIRECT_ALIGNMENT,
    O_DIRECT,
    address_of,
    is_own_file,
    set_direct,
    write_file,
)

#: How many passes a removal makes when files keep appearing in what it removes.
_REMOVAL_PASSES = 3
#: flock errors that mean "this file system does not lock", not "someone holds the lock"
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
_LOCK_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)
#: A file looked at, not read: never through a link, never waiting on someone's lease
_PROBE_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)

#: How a store file is opened for reading: without following a symbolic link in its place,
#: and without blocking (a FIFO in a chunk's place would otherwise hang the open).
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)

_FILE_KINDS = {
    stat.S_IFDIR: "a folder",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def check_no_linked_folder(root: str, key: str) -> None:
    """FileNotFoundError if a folder on the way from ``root`` to ``key`` is a symbolic link.

    The store follows no symbolic link below its root: a folder that is one (a snapshot
    folder linked in from elsewhere, say) holds nothing, for reads as for the listing and
    delete, so no key can reach a file outside the store.
    """
    folder = root
    for name in key.split("/")[:-1]:
        folder = os.path.join(folder, name)
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            raise FileNotFoundError(errno.ENOENT, "a folder on its path is a symbolic link", folder)


def _open_regular(root: str, key: str) -> tuple[int, int]:
    """An fd open on the regular file ``key`` under ``root``, and its size.

    Refused with UnexpectedObjectError before anything is read: a symbolic link (even one
    to the right bytes: a store's files are its own), a folder, a FIFO, a device; a key
    under a folder that is a symbolic link is absent (FileNotFoundError).
    """
    check_no_linked_folder(root, key)
    path = os.path.join(root, key)
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise UnexpectedObjectError("is a symbolic link, not a regular file") from None
        raise
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(status.st_mode), "not a file")
            raise UnexpectedObjectError(f"is {kind}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd, status.st_size


#: A first buffer at least this long (4 KiB-aligned in address) is read with O_DIRECT where
#: the file's first page is not in the page cache (:func:`_read_uncached`).
DIRECT_READ_MIN_BYTES = 1 << 20
#: The bytes after the first buffer (a chunk's padding and crc32c) that come in the same
#: direct read, through a scratch buffer; where there are more, they are read as before.
_DIRECT_TAIL_BYTES = 64 << 10
#: What a refused direct read raises: O_DIRECT or the buffer not taken
_DIRECT_REFUSALS = {errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EFAULT}


#: Linux's ``cachestat(2)`` (6.5 on; the same number on every architecture)
_CACHESTAT = 451


class _CachestatRange(ctypes.Structure):
    _fields_ = [("offset", ctypes.c_uint64), ("length", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("cached", "dirty", "writeback", "evicted", "recently_evicted")
    ]


def _libc_functions() -> tuple[Any, Any]:
    """libc's ``syscall`` and ``mincore`` (Linux), or None where there are none."""
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syscall, mincore = libc.syscall, libc.mincore
    except (OSError, AttributeError):
        return None, None
    syscall.restype = mincore.restype = ctypes.c_long
    mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return syscall, mincore


_syscall, _mincore = _libc_functions()
#: whether the kernel has cachestat (until a call says ENOSYS, or EPERM: a container's
#: seccomp filter that does not know it)
_has_cachestat = _syscall is not None


def _first_page_cached(fd: int) -> bool:
    """Whether the first page of the file ``fd`` is in the page cache, asked without
    reading it: ``cachestat`` (Linux 6.5 on), else ``mincore`` of a mapping of the page. A
    read with RWF_NOWAIT that misses starts reading the file's first pages (15-20 ms more
    of a 1 GiB restore in 256 files), a mapping's ``munmap`` stops the other threads' CPUs
    (5-10 ms). True where it cannot be told: neither call, a file that cannot be mapped,
    or one the process may not write (Linux then reports ``mincore`` pages as cached)."""
    global _has_cachestat
    if _has_cachestat:
        assert _syscall is not None
        span, state = _CachestatRange(0, DIRECT_ALIGNMENT), _Cachestat()
        if _syscall(_CACHESTAT, fd, ctypes.byref(span), ctypes.byref(state), 0) == 0:
            return state.cached > 0
        if ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM):
            return True
        _has_cachestat = False  # not in this kernel, or refused by a seccomp filter
    if _mincore is None:
        return True
    try:
        mapping = mmap.mmap(fd, DIRECT_ALIGNMENT, mmap.MAP_SHARED, mmap.PROT_READ)
    except (OSError, ValueError):
        return True
    try:
        resident = (ctypes.c_ubyte * 1)()
        with memoryview(mapping) as page:  # the mapping closes once nothing holds it
            failed = _mincore(address_of(page), DIRECT_ALIGNMENT, resident)
        return failed != 0 or bool(resident[0] & 1)
    finally:
        mapping.close()


def _aligned_scratch(nbytes: int) -> memoryview:
    block = np.empty(nbytes + DIRECT_ALIGNMENT, dtype=np.uint8)
    start = -block.ctypes.data % DIRECT_ALIGNMENT
    return block[start : start + nbytes].data


def _read_uncached(fd: int, buffers: list[memoryview], size: int) -> int:
    """Read the ``size``-byte file's first bytes into ``buffers`` with O_DIRECT if its first
    page is not in the page cache; how many are in place (from offset 0, buffer after
    buffer). 0 where it is cached, the first buffer is too short or not aligned, or the
    platform or file system refuses: the caller then reads every byte through the cache.

    A restore from a cold cache spent most of its CPU on the page cache: each page
    allocated and filled by the device, then copied into the gradient's buffer. A direct
    read has the device fill the buffer itself and leaves the cache as it was. The first
    buffer's aligned bytes and the file's last bytes (its padding and crc32c, up to
    _DIRECT_TAIL_BYTES, through an aligned scratch buffer) go in one request. Whether the
    file is cached is told by its first page (:func:`_first_page_cached`): a file just
    written or read is read from the cache as before.
    """
    if not (O_DIRECT and buffers):
        return 0
    first = buffers[0]
    aligned = len(first) - len(first) % DIRECT_ALIGNMENT
    if aligned < DIRECT_READ_MIN_BYTES or address_of(first) % DIRECT_ALIGNMENT:
        return 0
    if _first_page_cached(fd):
        return 0
    rest = size - aligned
    views = [first[:aligned]]
    if 0 < rest <= _DIRECT_TAIL_BYTES:
        views.append(_aligned_scratch(-(-rest // DIRECT_ALIGNMENT) * DIRECT_ALIGNMENT))
    try:
        set_direct(fd, True)
    except OSError as error:
        if error.errno in _DIRECT_REFUSALS:
            return 0
        raise
    try:
        count = os.preadv(fd, views, 0)
    except OSError as error:
        if error.errno not in _DIRECT_REFUSALS:
            raise
        count = 0
    finally:
        set_direct(fd, False)
    if count < aligned:  # shorter than expected: the caller's reads say so
        return count - count % DIRECT_ALIGNMENT
    tail = views[-1][: min(count - aligned, rest)] if len(views) > 1 else memoryview(b"")
    placed = aligned
    for target in [first[aligned:], *buffers[1:]]:  # the tail's bytes where they belong
        take = min(len(target), len(tail))
        target[:take] = tail[:take]
        tail = tail[take:]
        placed += take
    return placed


def _fill(fd: int, buffers: list[memoryview], size: int, checksum: bool = False) -> list[int]:
    """Read exactly ``size`` bytes into ``buffers``; refuse a file that changed length.

    With ``checksum``, the running crc32c after each buffer, each slice of SLICE_BYTES
    checksummed as soon as it is read (while in cache); else an empty list. Where the file
    is not cached, its bytes are read with O_DIRECT first (:func:`_read_uncached`) and
    checksummed once read.
    """
    crcs: list[int] = []
    crc = 0
    done = _read_uncached(fd, buffers, size)
    offset = 0  # the file offset of the buffer's first byte
    for buffer in buffers:
        ready = min(len(buffer), max(0, done - offset))
        if checksum and ready:
            crc = crc32c(buffer[:ready], crc)
        for start in range(ready, len(buffer), SLICE_BYTES):
            piece = buffer[start : start + SLICE_BYTES]
            view, at = piece, offset + start
            while len(view):
                count = os.preadv(fd, [view], at)
                if not count:
                    raise UnexpectedObjectError(f"shrank to {at} bytes while read; it had {size}")
                at += count
                view = view[count:]
            if checksum:
                crc = crc32c(piece, crc)
        offset += len(buffer)
        if checksum:
            crcs.append(crc)
    if os.pread(fd, 1, offset):
        raise UnexpectedObjectError(f"grew while read; it had {size} bytes")
    return crcs


def read_file(root: str, key: str, max_size: int | None = None) -> memoryview:
    """The bytes of the regular file ``key`` under ``root``, read into memory of their own.

    Nothing is mapped: a file that someone else changes or truncates later cannot change
    (or, through SIGBUS, kill) what was read. docs/FORMAT.md, "Reads", has the
    figures against the mapped copy-on-write reads this replaced.
    """
    fd, size = _open_regular(root, key)
    try:
        if max_size is not None and size > max_size:
            raise UnexpectedObjectError(f"is {size} bytes; at most {max_size} expected")
        buffer = np.empty(size, dtype=np.uint8).data  # not zero-filled: read over
        _fill(fd, [buffer], size)
        return buffer
    finally:
        os.close(fd)


def file_size(root: str, key: str) -> int:
    """The size of the regular file ``key`` under ``root`` (refused as a read would refuse it)."""
    fd, size = _open_regular(root, key)
    os.close(fd)
    return size


def read_file_into(
    root: str, key: str, buffers: list[memoryview], checksum: bool = False
) -> list[int]:
    """Fill ``buffers`` with the regular file ``key`` under ``root``, exactly as long as they
    are.

    With ``checksum``, the running crc32c after each buffer (see :func:`_fill`).
    """
    expected = sum(len(view) for view in buffers)
    fd, size = _open_regular(root, key)
    try:
        if size != expected:
            raise UnexpectedObjectError(f"is {size} bytes; expected {expected}")
        return _fill(fd, buffers, size, checksum)
    finally:
        os.close(fd)


def file_sizes_under(folder: str) -> dict[str, int | None]:
    """Regular files under ``folder`` with their sizes; None for anything else, not entered
    (a folder that is a symbolic link holds nothing, as it would inside the walk)."""
    found: dict[str, int | None] = {}
    try:
        if stat.S_ISLNK(os.lstat(folder).st_mode):
            return found
    except (FileNotFoundError, NotADirectoryError):
        return found
    pending = [("", folder)]
    while pending:
        prefix, path = pending.pop()
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            key = prefix + entry.name
            try:
                if entry.is_file(follow_symlinks=False):
                    found[key] = entry.stat(follow_symlinks=False).st_size
                    continue
                found[key] = None
                if entry.is_dir(follow_symlinks=False):
                    pending.append((key + "/", entry.path))
            except FileNotFoundError:
                continue  # removed meanwhile: absent
    return found


def newest_mtime(path: str) -> float:
    newest = os.lstat(path).st_mtime
    for folder, subfolders, files in os.walk(path):
        for name in subfolders + files:
            try:
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def lock_for_removal(path: str) -> int | None:
    """A descriptor of folder ``path`` holding its removal lock; None if gone or held elsewhere.

    The lock (``flock``) belongs to the open descriptor and so follows the folder through
    renames; the kernel drops it when its holder exits, so a crashed delete or gc leaves
    a folder that the next gc can take.
    """
    try:
        fd = os.open(path, _LOCK_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        _take_lock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    return fd


def only_name_and_unopened(path: str) -> bool:
    """Whether ``path`` is a regular file with no other name that no descriptor, of this
    process or any other, has open or mapped: then nobody reads it as it is written again.

    Asked of the kernel with a write lease (``F_SETLEASE``), granted only where no other
    descriptor of the file is open, and given back at once. A file system or a user the
    kernel gives no lease to answers False.
    """
    try:
        fd = os.open(path, _PROBE_FLAGS)
    except OSError:
        return False
    try:
        if not is_own_file(os.fstat(fd)):
            return False
        # should someone open the file while the lease is held, the kernel signals its
        # holder: with SIGURG, ignored unless handled, rather than SIGIO, which would end
        # this process
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    except (OSError, AttributeError):  # AttributeError: no leases on this platform
        return False
    finally:
        os.close(fd)
    return True


def _take_lock(fd: int, operation: int) -> None:
    """``flock(fd, operation)``; closes ``fd`` when it raises.

    On a file system without flock nothing is locked: removal is still claimed by the
    rename and tolerant of others, only a live removal can no longer be told from a
    leftover.
    """
    try:
        fcntl.flock(fd, operation)
    except OSError as error:
        if error.errno not in _NO_LOCKING:
            os.close(fd)
            raise
    except BaseException:
        os.close(fd)
        raise


def lock_folder(path: str) -> int:
    """A descriptor of folder ``path`` holding its lock exclusively, waiting for it.

    The lock a writer of a sharded snapshot holds while it publishes its shard and
    perhaps commits: gc and other ranks wait or skip meanwhile. FileNotFoundError if the
    folder is gone. (Without flock the folder is returned unlocked; see lock_for_removal.)
    """
    fd = os.open(path, _LOCK_FLAGS)
    _take_lock(fd, fcntl.LOCK_EX)
    return fd


def replace_file(path: str, buffers: list[Any]) -> None:
    """Write ``path`` whole (a private temporary file, fsynced, renamed over it)."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(8)}")
    write_file(temporary, buffers)
    os.replace(temporary, path)


def remove_tree(path: str) -> bool:
    """Remove ``path`` and what it holds; True once it is gone.

    Entries that vanish meanwhile (someone else removed them) are not errors; a folder
    that files appeared in while it was being emptied is emptied again, a few times at
    most. Other failures (permissions, I/O) raise.
    """
    failures: list[BaseException] = []

    def tolerate(function: Any, failed_path: str, error: BaseException) -> None:
        if isinstance(error, FileNotFoundError):
            return
        if isinstance(error, OSError) and error.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return  # emptied again on the next pass
        failures.append(error)

    for _ in range(_REMOVAL_PASSES):
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=tolerate)
        else:
            shutil.rmtree(
                path, onerror=lambda function, where, info: tolerate(function, where, info[1])
            )
        if failures:
            raise failures[0]
        if not os.path.lexists(path):
            return True
    return False
