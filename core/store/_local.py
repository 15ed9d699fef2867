"""The local-folder backend: stage, fsync everything, rename into place.

A snapshot is written under ``.staging/<id>/``; a chunk file written through the page
cache is fsynced as soon as it is written; one written with O_DIRECT (its bytes on the
device already), the arrays' ``zarr.json`` documents and every folder once all chunks
are written (all together, in parallel threads: on ext4 each folder fsync forces a
journal commit, and while chunks are still streaming every one of them forced a new
one); then the manifest,
fsynced, one ``os.rename`` to ``snapshots/<id>`` and an fsync of the ``snapshots`` folder.
A reader therefore sees a whole snapshot or none. Files are written with
``os.open``/``os.writev``/``os.fsync`` in a thread pool, many at once (measured faster
than aiofiles, which makes one thread hop per call; docs/FORMAT.md has the figures),
large chunk files with O_DIRECT where the file system takes it (``_file_writes``). A
writer with a ``turn`` does all of this at once with other writers and waits for its
turn only to rename.

Removal is claimed before it starts. ``delete`` locks the snapshot's folder (``flock``)
and renames it to ``.staging/<id>.deleting-<random>``; ``gc`` locks a leftover and
renames it to ``.staging/.collecting-<random>``. Only the claimant removes what it
renamed (a writer that aborts removes its own staging folder, nothing else is removed in
place), and a folder whose lock is held is in use by a live delete or gc, so gc never
takes it, however old its files are. A writer whose staging folder gc claimed finds it
gone and fails; its final rename can no longer move half-removed files into
``snapshots/``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import fcntl
import logging
import os
import secrets
import shutil
import signal
import stat
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..errors import StoreUnavailableError
from ._backend import (
    MANIFEST_NAME,
    RANKS_GROUP,
    SNAPSHOTS_PREFIX,
    CheckedRead,
    EncodedChunk,
    ManyRead,
    MissingKeyError,
    Refusal,
    ShardWriter,
    SnapshotWriter,
    StoreBackend,
    ThreadRunner,
    UnexpectedObjectError,
    collected_error,
)
from ._checksums import SLICE_BYTES, crc32c
from ._commit_order import CommitTurn, holding
from ._file_writes import DirectWrites, is_own_file, write_file, write_file_unsynced
from ._ids import parse_snapshot_id
from ._shard_publish import ShardSteps, Taken, publish_shard
from ._shards import ShardedSet, rank_of_folder, ranks_group_document
from ._zarr_format import (
    CHUNK_KEY_SEPARATOR,
    PACKED_ARRAY,
    PACKED_AT_ROOT,
    dump_json,
    group_metadata,
)

STAGING_FOLDER = ".staging"
#: Names under ``.staging/`` of folders being removed (see the module docstring).
COLLECTING_PREFIX = ".collecting-"
DELETING_INFIX = ".deleting-"
#: Names under ``.staging/`` of deleted snapshots' folders kept for the next commits to
#: write into (:meth:`LocalBackend.keep_as_spare`)
SPARE_PREFIX = ".spare-"
#: What a snapshot of one chunk holds (docs/FORMAT.md, format 4): the only kind kept spare
_ONE_CHUNK_FILES = frozenset({MANIFEST_NAME, f"c{CHUNK_KEY_SEPARATOR}0"})
#: How many passes a removal makes when files keep appearing in what it removes.
_REMOVAL_PASSES = 3
#: flock errors that mean "this file system does not lock", not "someone holds the lock"
_NO_LOCKING = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}
_log = logging.getLogger("gradvault.store")
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
_LOCK_FLAGS = _DIRECTORY_FLAGS | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: A file looked at, not read: never through a link, never waiting on someone's lease
_PROBE_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NONBLOCK", 0)
)
#: Threads that share one ``read_many_into_checked``, each reading file after file: more
#: than the cores, so that one waiting on the disk or on page faults leaves its core to
#: another, but few enough that the slices in flight stay in the cores' caches.
READ_LANES = 2 * (os.cpu_count() or 1)

T = TypeVar("T")


def _fsync_directory(path: str) -> None:
    """fsync the folder at ``path``."""
    fd = os.open(path, _DIRECTORY_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_folders(path: Path) -> list[Path]:
    """Make the folder ``path`` and every missing folder above it (as ``mkdir -p``); the
    folders this call made, outermost first (none where ``path`` was there)."""
    missing = []
    while not path.is_dir() and path != path.parent:
        missing.append(path)
        path = path.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made meanwhile by someone else, who makes it durable
        made.append(folder)
    return made


def _fsync_paths(paths: list[str]) -> None:
    """fsync each file or folder of ``paths``, in order (a read-only descriptor will do)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class FsyncTogether:
    """fsyncs several files and folders, from any thread: one after the other in the
    calling thread while this device's fsyncs are quick, at once in a few threads of its
    own while they are slow.

    Every fsync on ext4 ends with a flush of the device's write cache, even when the first
    one already made every change durable. Where a flush is slow (1-4 ms each, measured
    on an earlier machine of this project's), the six fsyncs of a small snapshot issued
    together overlap their flushes. Where it is quick (0.07-0.09 ms for a folder or a file
    whose writeback was started, 0.47 ms for the chunk written with ``O_DIRECT``, on ext4
    without a journal), handing an fsync to another thread costs more than it saves: on
    two busy cores each hand-over took ~0.15 ms of CPU, and a commit of the MLP's 8.4 MB
    took 0.33-0.50 ms less CPU with its fsyncs in line, its wall time within 0.3 ms either
    way (docs/FORMAT.md, "Local I/O"). So each round made in line is timed (its opens and
    fsyncs), and the moving average of its mean per path (capped at ``SAMPLE_CAP``)
    decides: in line below ``IN_LINE_BELOW``, together above, with one call in
    ``PROBE_EVERY`` made in line all the same to measure again (rounds made together are
    not timed: their fsyncs wait for each other's flushes, so their times would say
    nothing of one alone). The threads only ever fsync, so a writer thread that waits
    for them cannot deadlock the store's own pool.
    """

    #: Mean fsync time (seconds) under which fsyncs run one after the other in line.
    IN_LINE_BELOW = 0.5e-3
    #: Weight of the latest in-line call's mean fsync time in the moving average.
    WEIGHT = 0.25
    #: A call's mean counts for at most this much (seconds): one stall (writeback of
    #: someone else's files, a busy device) does not send fsyncs to the threads, nor keep
    #: them there for hundreds of commits; fsyncs slow call after call still do.
    SAMPLE_CAP = 2 * IN_LINE_BELOW
    #: While fsyncs run together, one call in this many runs in line, to measure again.
    PROBE_EVERY = 32

    def __init__(self, threads: int = 8) -> None:
        self._threads = threads
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._calls = 0
        #: moving average of the mean time of one fsync made in line (seconds); 0 at first
        self.mean_fsync_seconds = 0.0

    def in_line(self) -> bool:
        """Whether fsyncs run one after the other in the calling thread now."""
        return self.mean_fsync_seconds < self.IN_LINE_BELOW

    def fsync(self, paths: list[str]) -> None:
        """fsync every path of ``paths`` (in line or all at once, see the class); raises
        the first failure."""
        if not paths:
            return
        with self._lock:
            self._calls += 1
            probe = self._calls % self.PROBE_EVERY == 0
        if len(paths) == 1 or probe or self.in_line():
            start = time.perf_counter()
            _fsync_paths(paths)
            mean = min((time.perf_counter() - start) / len(paths), self.SAMPLE_CAP)
            with self._lock:
                self.mean_fsync_seconds += self.WEIGHT * (mean - self.mean_fsync_seconds)
            return
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._threads, "gradvault-fsync")
            executor = self._executor
        futures = [executor.submit(_fsync_paths, [path]) for path in paths[1:]]
        try:
            _fsync_paths(paths[:1])  # this thread takes one itself
        finally:
            concurrent.futures.wait(futures)
        for future in futures:
            future.result()

    @property
    def started(self) -> bool:
        """Whether fsyncs were ever handed to threads of its own (not closed since)."""
        with self._lock:
            return self._executor is not None

    def close(self) -> None:
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


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


def _check_no_linked_folder(root: str, key: str) -> None:
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
    _check_no_linked_folder(root, key)
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


def _fill(fd: int, buffers: list[memoryview], size: int, checksum: bool = False) -> list[int]:
    """Read exactly ``size`` bytes into ``buffers``; refuse a file that changed length.

    With ``checksum``, the running crc32c after each buffer, each slice of SLICE_BYTES
    checksummed as soon as it is read (while in cache); else an empty list.
    """
    crcs: list[int] = []
    crc = 0
    filled = 0
    for buffer in buffers:
        for start in range(0, len(buffer), SLICE_BYTES):
            piece = buffer[start : start + SLICE_BYTES]
            view = piece
            while len(view):
                count = os.readv(fd, [view])
                if not count:
                    raise UnexpectedObjectError(
                        f"shrank to {filled} bytes while read; it had {size}"
                    )
                filled += count
                view = view[count:]
            if checksum:
                crc = crc32c(piece, crc)
        if checksum:
            crcs.append(crc)
    if os.read(fd, 1):
        raise UnexpectedObjectError(f"grew while read; it had {size} bytes")
    return crcs


def _read_file(root: str, key: str, max_size: int | None = None) -> memoryview:
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


def _file_size(root: str, key: str) -> int:
    """The size of the regular file ``key`` under ``root`` (refused as a read would refuse it)."""
    fd, size = _open_regular(root, key)
    os.close(fd)
    return size


def _read_file_into(
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


class _Handout:
    """Hands out ``0 .. count - 1`` in order, each once, to any number of threads, until
    none is left or it is stopped (then None)."""

    def __init__(self, count: int) -> None:
        self._lock = threading.Lock()
        self._indices = iter(range(count))
        self._stopped = False

    def take(self) -> int | None:
        with self._lock:
            return None if self._stopped else next(self._indices, None)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True


def _object_sizes(folder: str) -> dict[str, int | None]:
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


def _newest_mtime(path: str) -> float:
    newest = os.lstat(path).st_mtime
    for folder, subfolders, files in os.walk(path):
        for name in subfolders + files:
            try:
                newest = max(newest, os.lstat(os.path.join(folder, name)).st_mtime)
            except FileNotFoundError:
                pass
    return newest


def _lock_for_removal(path: str) -> int | None:
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


def _only_name_and_unopened(path: str) -> bool:
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


def _lock_folder(path: str) -> int:
    """A descriptor of folder ``path`` holding its lock exclusively, waiting for it.

    The lock a writer of a sharded snapshot holds while it publishes its shard and
    perhaps commits: gc and other ranks wait or skip meanwhile. FileNotFoundError if the
    folder is gone. (Without flock the folder is returned unlocked; see _lock_for_removal.)
    """
    fd = os.open(path, _LOCK_FLAGS)
    _take_lock(fd, fcntl.LOCK_EX)
    return fd


def _replace_file(path: str, buffers: list[Any]) -> None:
    """Write ``path`` whole (a private temporary file, fsynced, renamed over it)."""
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(8)}")
    write_file(temporary, buffers)
    os.replace(temporary, path)


def _remove_tree(path: str) -> bool:
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


class LocalBackend(StoreBackend):
    """Snapshots in a local folder (see the module docstring for the commit protocol)."""

    def __init__(self, root: Path, threads: ThreadRunner) -> None:
        self.root = root
        self.location = str(root)
        self.snapshots_dir = root / SNAPSHOTS_PREFIX
        #: ``snapshots_dir`` as text, which a commit's rename and fsync take
        self.snapshots_path = str(self.snapshots_dir)
        self.staging_dir = root / STAGING_FOLDER
        #: ``staging_dir`` as text, to join a one-step write's folder (no Path per commit)
        self.staging_path = str(self.staging_dir)
        self._threads = threads
        self._prepared = False
        #: chunk files are written with O_DIRECT until the file system refuses it
        self.direct = DirectWrites()
        #: a commit's last fsyncs, issued together
        self.fsyncs = FsyncTogether()
        #: deleted snapshots' folders kept for the next commits of one chunk to write into
        self._spares: list[str] = []
        self._spares_lock = threading.Lock()
        #: whether this store has committed a snapshot of one chunk in one step (a
        #: trainer's store): only then does it keep spare folders
        self._commits_in_one_step = False
        #: at most this many folders of deleted snapshots are kept spare (0: none; each
        #: holds a snapshot of one chunk, at most ``chunk_bytes`` long)
        self.spare_folders = 2

    def keep_as_spare(self, path: str) -> bool:
        """Keep ``path``, the folder of a snapshot of one chunk just deleted (renamed into
        ``.staging/``), for the next commit of one chunk to write its files into: True if
        it is kept (renamed ``.staging/.spare-<random>``), False if it is to be removed.

        Only a store that commits in one step keeps any, at most ``spare_folders`` at once,
        and only a folder that holds the two files of a snapshot of one chunk, each a
        regular file with no other name that nobody has open or mapped (a reader that
        opened one before the delete reads it to its end, as from a removed file).
        """
        if not self._commits_in_one_step:
            return False
        with self._spares_lock:
            if len(self._spares) >= self.spare_folders:
                return False
            try:
                names = os.listdir(path)
            except OSError:
                return False
            if set(names) != _ONE_CHUNK_FILES:
                return False
            if not all(_only_name_and_unopened(f"{path}/{name}") for name in names):
                return False
            spare = f"{self.staging_path}/{SPARE_PREFIX}{secrets.token_hex(8)}"
            try:
                os.rename(path, spare)
            except OSError:
                return False
            self._spares.append(spare)
        return True

    def take_spare(self, folder: str) -> bool:
        """Rename a spare folder (:meth:`keep_as_spare`) to ``folder``, a staging folder of
        a commit of one chunk, its mtime made now (gc goes by mtimes); False if there is
        none (or gc took it), and the commit makes ``folder`` itself."""
        self._commits_in_one_step = True
        while True:
            with self._spares_lock:
                if not self._spares:
                    return False
                spare = self._spares.pop()
            try:
                os.utime(spare)
                os.rename(spare, folder)
            except OSError:  # collected by gc, or unusable: gc removes what is left
                continue
            return True

    def _remove_spares_sync(self) -> None:
        with self._spares_lock:
            spares, self._spares = self._spares, []
        for spare in spares:
            try:
                _remove_tree(spare)
            except OSError as error:  # left to gc
                _log.warning("store %s: removing %s failed (%s)", self.location, spare, error)

    async def in_thread(self, action: str, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in the store's threads; an OSError but FileNotFoundError becomes
        StoreUnavailableError naming the store and ``action`` ("reading <key>")."""
        return await self.threads.run(self.here, action, function, *args)

    def here(self, action: str, function: Callable[..., T], *args: Any) -> T:
        """:meth:`in_thread` in the calling thread."""
        try:
            return function(*args)
        except FileNotFoundError:
            raise
        except OSError as error:
            if isinstance(error, StoreUnavailableError):
                raise
            raise StoreUnavailableError(
                f"local store {self.location}: {action} failed: {error}"
            ) from error

    def _prepare_sync(self) -> None:
        """Make the store's folders and group documents where they are missing, durably:
        each folder made has its entry fsynced in its parent (the store folder's own in
        the folder that holds it), each document its folder, before the first snapshot
        counts on them."""
        made = [
            folder
            for target in (self.root, self.snapshots_dir, self.staging_dir)
            for folder in _make_folders(target)
        ]
        synced: set[Path] = set()
        for folder in (self.root, self.snapshots_dir):
            document = folder / MANIFEST_NAME
            if not document.exists():
                temporary = folder / f".{MANIFEST_NAME}.{secrets.token_hex(8)}"
                write_file(str(temporary), [dump_json(group_metadata())])
                os.replace(temporary, document)
                _fsync_directory(str(folder))
                synced.add(folder)
        # deepest first: a folder's entry is durable before the entry of the folder above
        parents = {folder.parent for folder in made} - synced
        for parent in sorted(parents, key=lambda path: len(path.parts), reverse=True):
            _fsync_directory(str(parent))

    def _check_sync(self) -> None:
        # a folder that is not there yet is fine (the first snapshot creates it), as long
        # as the nearest part of its path that is there is a folder
        existing = self.root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            shown = "it" if existing == self.root else f"{existing}, on its path,"
            raise StoreUnavailableError(
                f"local store {self.location}: {shown} is a file, not a folder"
            )
        if existing == self.root:
            self._committed_ids_sync()

    async def check(self) -> None:
        await self.in_thread("listing the store folder", self._check_sync)

    async def prepare(self) -> None:
        if not self._prepared:
            await self.in_thread("creating the store folders", self._prepare_sync)
            self._prepared = True

    async def begin(self, snapshot_id: str, *, in_one_step: bool = False) -> SnapshotWriter:
        folder = self.staging_dir / snapshot_id
        writer = _LocalSnapshotWriter(self, snapshot_id, folder)
        if in_one_step:  # made by that step, in its thread: one trip through a thread
            writer.folder_to_make = True
        else:
            await self.in_thread(f"creating staging folder {folder}", folder.mkdir)
        return writer

    def begin_blocking(self, snapshot_id: str) -> SnapshotWriter | None:
        if not self._prepared:  # the first write makes the store's folders, here too
            self.here("creating the store folders", self._prepare_sync)
            self._prepared = True
        writer = _LocalSnapshotWriter(self, snapshot_id, f"{self.staging_path}/{snapshot_id}")
        writer.folder_to_make = True  # made by write_array_and_commit_blocking
        return writer

    async def begin_shard(self, snapshot_id: str, rank: int) -> ShardWriter:
        # A private folder: the shard appears under ranks/ only once whole (a rename).
        folder = self.staging_dir / f"{snapshot_id}.rank{rank}-{secrets.token_hex(4)}"
        await self.in_thread(f"creating staging folder {folder}", folder.mkdir)
        return _LocalShardWriter(self, snapshot_id, folder, rank)

    async def read(self, key: str, max_size: int | None = None) -> memoryview:
        try:
            return await self.in_thread(f"reading {key}", _read_file, str(self.root), key, max_size)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def read_into(self, key: str, buffers: list[memoryview]) -> None:
        try:
            await self.in_thread(f"reading {key}", _read_file_into, str(self.root), key, buffers)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def read_into_checked(self, key: str, buffers: list[memoryview]) -> list[int]:
        """Each slice is checksummed as it is read, in the reading thread (one pass)."""
        try:
            return await self.in_thread(
                f"reading {key}", _read_file_into, str(self.root), key, buffers, True
            )
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def read_many(self, keys: list[str], max_size: int | None = None) -> list[ManyRead]:
        """The files are read by a few threads (:meth:`_in_lanes`): one trip through the
        event loop for all of them, and several reads waiting on the disk at once."""
        root = str(self.root)
        return await self._in_lanes(keys, lambda _, key: _read_file(root, key, max_size))

    async def read_many_into_checked(
        self, requests: list[tuple[str, list[memoryview]]]
    ) -> list[CheckedRead]:
        """The files are read by a few threads (:meth:`_in_lanes`), each slice checksummed
        as it lands (one pass over the bytes, the GIL released for both the read and the
        crc32c)."""
        root = str(self.root)
        return await self._in_lanes(
            [key for key, _ in requests],
            lambda index, key: _read_file_into(root, key, requests[index][1], True),
        )

    async def _in_lanes(self, keys: list[str], read: Callable[[int, str], T]) -> list[T | Refusal]:
        """``read(index, key)`` of each key's file, the keys shared out among READ_LANES
        threads of the store's pool, each going file after file with no trip through the
        event loop in between. Per key its result, or the MissingKeyError or
        UnexpectedObjectError that refused it; other OSErrors raise StoreUnavailableError.
        Once the call fails or is cancelled, the threads start no other file.
        """
        outcomes: list[Any] = [None] * len(keys)
        handout = _Handout(len(keys))
        location = self.location

        def lane() -> None:
            while (index := handout.take()) is not None:
                key = keys[index]
                try:
                    outcomes[index] = read(index, key)
                except (FileNotFoundError, NotADirectoryError):
                    outcomes[index] = MissingKeyError(key)
                except UnexpectedObjectError as error:
                    outcomes[index] = error
                except OSError as error:
                    raise StoreUnavailableError(
                        f"local store {location}: reading {key} failed: {error}"
                    ) from error

        lanes = min(len(keys), READ_LANES, self.threads.max_workers)
        try:
            await asyncio.gather(*(self.threads.run(lane) for _ in range(lanes)))
        except BaseException:
            handout.stop()  # a failed or cancelled read starts no other file
            raise
        return outcomes

    async def size(self, key: str) -> int:
        try:
            return await self.in_thread(f"reading {key}", _file_size, str(self.root), key)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def object_sizes(self, prefix: str) -> dict[str, int | None]:
        return await self.in_thread(f"listing {prefix}", _object_sizes, str(self.root / prefix))

    def _committed_ids_sync(self) -> list[str]:
        try:
            entries = list(os.scandir(self.snapshots_dir))
        except FileNotFoundError:
            return []
        found = []
        for entry in entries:
            try:
                parse_snapshot_id(entry.name)
            except ValueError:
                continue
            # a folder that is a symbolic link holds nothing (see _check_no_linked_folder)
            if entry.is_dir(follow_symlinks=False) and os.path.exists(
                os.path.join(entry.path, MANIFEST_NAME)
            ):
                found.append(entry.name)
        return found

    def _is_committed_sync(self, snapshot_id: str) -> bool:
        try:
            _check_no_linked_folder(
                str(self.root), f"{SNAPSHOTS_PREFIX}/{snapshot_id}/{MANIFEST_NAME}"
            )
        except (FileNotFoundError, NotADirectoryError):
            return False
        return os.path.exists(self.snapshots_dir / snapshot_id / MANIFEST_NAME)

    async def committed_ids(self, *, fresh: bool = False) -> list[str]:
        """Every call reads the folder: there is no cache to refresh."""
        return await self.in_thread("listing snapshots", self._committed_ids_sync)

    async def is_committed(self, snapshot_id: str) -> bool:
        return await self.in_thread(
            f"checking snapshot {snapshot_id}", self._is_committed_sync, snapshot_id
        )

    def _delete_sync(self, snapshot_id: str) -> bool:
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        # Locked before it moves, so no gc ever sees the renamed folder unlocked.
        fd = _lock_for_removal(str(self.snapshots_dir / snapshot_id))
        if fd is None:
            return False  # absent, or another delete holds it
        try:
            doomed = self.staging_dir / f"{snapshot_id}{DELETING_INFIX}{secrets.token_hex(4)}"
            try:
                os.rename(self.snapshots_dir / snapshot_id, doomed)
            except FileNotFoundError:
                return False
            _fsync_directory(str(self.snapshots_dir))
            # Invisible from here on: the snapshot is deleted whatever happens to its files.
            if self.keep_as_spare(str(doomed)):
                return True
            try:
                removed = _remove_tree(str(doomed))
            except OSError as error:
                _log.warning(
                    "store %s: snapshot %s is deleted but removing its files failed (%s); "
                    "gc removes %s later",
                    self.location,
                    snapshot_id,
                    error,
                    doomed,
                )
            else:
                if not removed:
                    _log.warning(
                        "store %s: snapshot %s is deleted; files kept appearing in %s, which "
                        "gc removes later",
                        self.location,
                        snapshot_id,
                        doomed,
                    )
            return True
        finally:
            os.close(fd)

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        return await self.in_thread(
            f"deleting snapshot {snapshot_id}", self._delete_sync, snapshot_id
        )

    def _collect_sync(self, grace_seconds: float) -> list[str]:
        try:
            entries = list(os.scandir(self.staging_dir))
        except FileNotFoundError:
            return []
        cutoff = time.time() - grace_seconds
        return sorted(entry.name for entry in entries if self._collect_entry(entry, cutoff))

    def _collect_entry(self, entry: os.DirEntry[str], cutoff: float) -> bool:
        """Claim one ``.staging/`` entry untouched since ``cutoff`` and remove it.

        False if it is fresh, or gone, or someone else (a live delete or gc) has it.
        """
        claimed = str(self.staging_dir / f"{COLLECTING_PREFIX}{secrets.token_hex(8)}")
        if not entry.is_dir(follow_symlinks=False):
            try:
                if _newest_mtime(entry.path) > cutoff:
                    return False
                os.rename(entry.path, claimed)
                os.unlink(claimed)
            except FileNotFoundError:
                return False
            return True
        # The lock first: a folder a live delete is removing is skipped without a walk.
        fd = _lock_for_removal(entry.path)
        if fd is None:
            return False
        try:
            try:
                if _newest_mtime(entry.path) > cutoff:
                    return False
                if not os.path.samestat(os.fstat(fd), os.lstat(entry.path)):
                    return False  # the name was reused since it was locked
                # From here on a writer of this folder finds it gone and fails.
                os.rename(entry.path, claimed)
            except FileNotFoundError:
                return False  # committed, claimed or removed since the listing
            return _remove_tree(claimed)
        finally:
            os.close(fd)

    async def collect_garbage(self, grace_seconds: float) -> list[str]:
        return await self.in_thread("collecting leftovers", self._collect_sync, grace_seconds)

    async def close(self) -> None:
        """The fsync threads end and the spare folders are removed; files are opened and
        closed per operation. A store that started no fsync thread and keeps no spare
        folder has nothing to release: its close makes no trip through a thread."""
        if self.fsyncs.started:
            await asyncio.to_thread(self.fsyncs.close)
        with self._spares_lock:
            spares = bool(self._spares)
        if spares:
            await asyncio.to_thread(self._remove_spares_sync)


class _LocalSnapshotWriter(SnapshotWriter):
    def __init__(self, backend: LocalBackend, snapshot_id: str, folder: Path | str) -> None:
        self._backend = backend
        self._snapshot_id = snapshot_id
        self._folder = str(folder)  # as text: the paths a write joins (no Path per file)
        #: every file written so far, relative to the staging folder
        self._written: set[str] = set()
        #: array documents and folders written but not fsynced yet: all of them are
        #: fsynced together, in parallel, before the manifest is written
        self._unsynced: list[str] = []
        #: whether the staging folder is still to be made by the write (``begin``'s
        #: ``in_one_step``)
        self.folder_to_make = False
        #: whether the staging folder is a spare one (``LocalBackend.take_spare``): its
        #: chunk and document are written again in place
        self._in_spare = False

    @property
    def written_where(self) -> str:
        """What this write put in the store, as messages name it."""
        return f"its staging folder {self._folder} was"

    def _collected(self) -> StoreUnavailableError:
        return collected_error(self._snapshot_id, self.written_where)

    async def _run(self, action: str, function: Callable[..., T], *args: Any) -> T:
        return await self._backend.threads.run(self._here, action, function, *args)

    def _here(self, action: str, function: Callable[..., T], *args: Any) -> T:
        """:meth:`_run` in the calling thread: the backend's errors (``LocalBackend.here``),
        and a file gone with the staging folder reported as gc having collected the write."""
        try:
            return self._backend.here(action, function, *args)
        except FileNotFoundError as error:
            if not os.path.isdir(self._folder):
                raise self._collected() from error
            raise

    def _write_array_sync(
        self,
        name: str,
        metadata: bytes | None,
        chunks: Iterator[EncodedChunk],
        meanwhile: Callable[[], None] | None = None,
    ) -> None:
        """Write array ``name``: its folders, its chunks, its document. With ``meanwhile``
        (an array of one chunk), the document is written and ``meanwhile`` called once
        the chunk's bytes are all read, while its last direct writes are in flight.

        The array PACKED_AT_ROOT is the snapshot's node: its chunks go into the staging
        folder itself, and its document (``metadata`` None) is the snapshot's, which the
        commit writes.
        """
        at_root = name == PACKED_AT_ROOT
        array_dir = self._folder if at_root else f"{self._folder}/{name}"
        key_prefix = "" if at_root else f"{name}/"
        folders = []
        if not at_root:
            os.mkdir(array_dir)
            folders.append(array_dir)
        deferred = at_root or name == PACKED_ARRAY
        made = {""}
        written = []
        document = f"{array_dir}/{MANIFEST_NAME}"
        documented = metadata is None

        def document_then_meanwhile() -> None:
            nonlocal documented
            if not documented:
                write_file_unsynced(document, [metadata])
                documented = True
            assert meanwhile is not None
            meanwhile()

        for key, buffers in chunks:
            parent = key.rpartition("/")[0]
            if parent not in made:
                partial = ""
                for part in parent.split("/"):
                    partial = f"{partial}/{part}" if partial else part
                    if partial not in made:
                        os.mkdir(os.path.join(array_dir, partial))
                        folders.append(os.path.join(array_dir, partial))
                        made.add(partial)
            path = f"{array_dir}/{key}"
            # the packed array's chunks (usually one), and every chunk file written with
            # O_DIRECT, are fsynced with the documents and folders before the manifest;
            # a chunk file written through the page cache right after it is written
            fsync_later = write_file(
                path,
                buffers,
                self._backend.direct,
                fsync=not deferred,
                fsync_direct=False,
                whole_file=deferred,
                meanwhile=None if meanwhile is None else document_then_meanwhile,
                existing=self._in_spare and at_root and key in _ONE_CHUNK_FILES,
            )
            written.append(f"{key_prefix}{key}")
            if fsync_later:
                self._unsynced.append(path)
        # The array's document is fsynced with the folders, before the manifest
        if metadata is not None:
            if not documented:
                write_file_unsynced(document, [metadata])
            written.append(f"{key_prefix}{MANIFEST_NAME}")
            self._unsynced.append(document)
        self._unsynced.extend(reversed(folders))  # deepest first
        self._written.update(written)

    #: At most this many array documents and folders are fsynced by the committing thread
    #: itself, one after the other (a snapshot of one packed array has three); more are
    #: shared out among threads (:meth:`_sync_pending`).
    SYNC_IN_LINE = 8

    async def _sync_pending(self) -> None:
        """fsync the array documents, every folder the arrays made and every chunk file
        written with O_DIRECT, in parallel threads.

        Called once every chunk is written, before the manifest. On ext4 every
        folder fsync (and every fsync of a small new file) forces a journal commit: one
        per array while the other arrays were still streaming their chunks slowed those
        down; done together at the end they share a few commits (docs/FORMAT.md, "Local
        I/O", has the figures).
        """
        pending, self._unsynced = self._unsynced, []
        if not pending:
            return
        threads = max(1, min(len(pending), self._backend.threads.max_workers))
        await asyncio.gather(
            *(
                self._run(
                    f"syncing the arrays of snapshot {self._snapshot_id}",
                    self._fsync_staged_in_order,
                    pending[first::threads],
                )
                for first in range(threads)
            )
        )

    async def write_array(
        self, name: str, metadata: bytes | None, chunks: Iterator[EncodedChunk]
    ) -> None:
        await self._run(
            f"writing array {name} of snapshot {self._snapshot_id}",
            self._write_array_sync,
            name,
            metadata,
            chunks,
        )

    #: Up to this many files written, :meth:`_missing_files` looks each one up; beyond,
    #: it lists the staging folder once (fewer calls for a tree of many files).
    LOOKUP_FILES_BELOW = 32

    def _missing_files(self) -> list[str]:
        """The files this writer wrote that are no longer in its staging folder."""
        if len(self._written) < self.LOOKUP_FILES_BELOW:
            folder = self._folder
            return sorted(key for key in self._written if not os.path.isfile(f"{folder}/{key}"))
        present: set[str] = set()
        for folder, _, files in os.walk(self._folder):
            relative = os.path.relpath(folder, self._folder)
            prefix = "" if relative == "." else relative.replace(os.sep, "/") + "/"
            present.update(prefix + name for name in files)
        return sorted(self._written - present)

    def _rename_into_place_sync(self) -> None:
        """Check that every file written is still there, then rename the folder into place."""
        self._check_nothing_missing()
        os.rename(self._folder, f"{self._backend.snapshots_path}/{self._snapshot_id}")

    def _fsync_staged_in_order(self, paths: list[str]) -> None:
        """fsync ``paths`` of the staging folder one after the other (reported as
        :meth:`_fsync_staged` reports a file gone)."""
        try:
            _fsync_paths(paths)
        except FileNotFoundError:
            self._check_nothing_missing()
            raise

    def _fsync_staged(self, paths: list[str]) -> None:
        """fsync ``paths`` of the staging folder together; a file or folder gone is reported
        as :meth:`_check_nothing_missing` reports it."""
        try:
            self._backend.fsyncs.fsync(paths)
        except FileNotFoundError:
            self._check_nothing_missing()  # says what vanished, or that gc took the folder
            raise

    def _check_nothing_missing(self) -> None:
        """StoreUnavailableError if a file this writer wrote is gone from its staging folder."""
        # Nothing of ours removes files in place, but a snapshot must not be committed
        # with files missing, whoever removed them.
        missing = self._missing_files()
        if missing and not os.path.isdir(self._folder):
            raise self._collected()
        if missing:
            raise StoreUnavailableError(
                f"snapshot {self._snapshot_id}: {len(missing)} of the {len(self._written)} "
                f"files written to its staging folder {self._folder} vanished before commit "
                f"(first: {missing[0]}); nothing was committed"
            )

    def _commit_sync(self, group_document: bytes, turn: CommitTurn | None) -> bool:
        """Seal the snapshot and, if ``turn`` is None or open already, rename it into place
        and fsync ``snapshots/``: True once committed, False if it must wait for its turn.

        The files and folders still pending (the packed array's chunk, every array's
        document, every folder; those of a large snapshot are fsynced before, in
        parallel, by :meth:`commit`) are fsynced here, together (``FsyncTogether``), then
        the manifest and the staging folder: a small snapshot commits in this one call,
        one trip through a thread.
        """
        # The manifest is written before the fsyncs, and fsynced after every other file
        # and folder: a snapshot of one packed array (its chunk, its document, its folder,
        # the manifest, the staging folder) then costs one journal commit, the first
        # fsync's, not one per file, and nothing is visible before the rename anyway.
        self._write_manifest_sync(group_document)
        return self._seal_and_rename_sync(turn)

    def _write_manifest_sync(self, group_document: bytes) -> None:
        """Write the manifest (the group's ``zarr.json``), not fsynced yet."""
        write_file_unsynced(
            f"{self._folder}/{MANIFEST_NAME}", [group_document], existing=self._in_spare
        )
        self._written.add(MANIFEST_NAME)

    def _seal_and_rename_sync(self, turn: CommitTurn | None) -> bool:
        """fsync what is pending, then the manifest and the staging folder; rename into
        place if ``turn`` allows (:meth:`_commit_sync`)."""
        manifest = f"{self._folder}/{MANIFEST_NAME}"
        pending, self._unsynced = self._unsynced, []
        self._fsync_staged(pending)
        # a spare folder whose two files were both written again holds the same two names
        # of the same files that its own commit made durable: only a folder made now, or
        # emptied of a stale file, is fsynced
        entries_durable = self._in_spare and _ONE_CHUNK_FILES <= self._written
        self._fsync_staged([manifest] if entries_durable else [manifest, self._folder])
        if turn is not None and not turn.is_open():
            return False
        self._rename_into_place_sync()
        _fsync_directory(self._backend.snapshots_path)
        return True

    async def commit(self, group_metadata: bytes) -> None:
        if len(self._unsynced) > self.SYNC_IN_LINE:
            await self._sync_pending()
        action = f"committing snapshot {self._snapshot_id}"
        await self._commit_in_turn(action, self._commit_sync, group_metadata, self.turn)

    def _write_and_commit_sync(
        self,
        name: str,
        metadata: bytes | None,
        chunks: Iterator[EncodedChunk],
        group_metadata: Callable[[], bytes],
        turn: CommitTurn | None,
    ) -> bool:
        """:meth:`_write_array_sync`, then :meth:`_commit_sync` of ``group_metadata()``
        (the staging folder made first if ``begin`` left it to this step: for the
        snapshot's node, a spare folder renamed, where the store keeps one, its two files
        written again in place).

        The manifest is made and written while the device writes the chunk's last bytes
        (``meanwhile``): it needs only their checksums and stats, known once they are read.
        """
        if self.folder_to_make:
            self._in_spare = name == PACKED_AT_ROOT and self._backend.take_spare(self._folder)
            if not self._in_spare:
                os.mkdir(self._folder)
            self.folder_to_make = False
        self._write_array_sync(
            name, metadata, chunks, lambda: self._write_manifest_sync(group_metadata())
        )
        if MANIFEST_NAME not in self._written:  # the array had no chunk
            self._write_manifest_sync(group_metadata())
        if self._in_spare:  # nothing of the deleted snapshot stays
            for stale in _ONE_CHUNK_FILES - self._written:
                os.unlink(f"{self._folder}/{stale}")
        return self._seal_and_rename_sync(turn)

    async def write_array_and_commit(
        self,
        name: str,
        metadata: bytes | None,
        chunks: Iterator[EncodedChunk],
        group_metadata: Callable[[], bytes],
    ) -> None:
        """The array written and the snapshot committed in one trip through a thread (two
        when the snapshot must wait for its turn to be renamed into place)."""
        await self._commit_in_turn(
            self._write_and_commit_action(name),
            self._write_and_commit_sync,
            name,
            metadata,
            chunks,
            group_metadata,
            self.turn,
        )

    def write_array_and_commit_blocking(
        self,
        name: str,
        metadata: bytes | None,
        chunks: Iterator[EncodedChunk],
        group_metadata: Callable[[], bytes],
    ) -> None:
        turn = self.turn
        if turn is not None and not turn.is_open():
            raise RuntimeError(
                f"snapshot {self._snapshot_id}: a blocking commit needs its turn open; "
                "an earlier snapshot of its order is not visible yet"
            )
        committed = self._here(
            self._write_and_commit_action(name),
            self._write_and_commit_sync,
            name,
            metadata,
            chunks,
            group_metadata,
            turn,
        )
        assert committed, "an open turn stays open"

    def _write_and_commit_action(self, name: str) -> str:
        return f"writing array {name} of snapshot {self._snapshot_id} and committing it"

    def abort_blocking(self) -> None:
        shutil.rmtree(self._folder, True)

    async def _commit_in_turn(
        self, action: str, commit_sync: Callable[..., bool], *args: Any
    ) -> None:
        """Run ``commit_sync(*args)`` (True once it has renamed the snapshot into place and
        fsynced ``snapshots/``); if it had to leave the rename to the snapshot's turn,
        wait for the turn and rename. The turn is released in any case."""
        turn = self.turn
        with holding(turn):  # released once the rename is done, or has failed
            if await self._run(action, commit_sync, *args):
                return
            assert turn is not None
            await turn.wait()
            await self._run(action, self._rename_into_place_sync)
        # Renames of snapshots in flight together are made durable by one fsync of the
        # snapshots folder, or by fsyncs that run at once and share a journal commit.
        await self._run(action, _fsync_directory, str(self._backend.snapshots_dir))

    async def abort(self) -> None:
        try:
            await self._backend.threads.run(shutil.rmtree, self._folder, True)
        except Exception:  # noqa: BLE001 - best effort; gc collects what remains
            pass


class _LocalShardWriter(_LocalSnapshotWriter, ShardWriter, ShardSteps):
    """Writes one rank's shard in a private staging folder, then moves it under
    ``.staging/<id>/ranks/<rank>`` and, if every rank is there, commits the snapshot.

    Publishing and committing happen under the lock of ``.staging/<id>`` (the lock gc
    takes before it claims a folder), so gc never takes a shard set while a rank looks
    at it, and the ranks that finish together commit one at a time: the first that finds
    every shard commits, and any later one finds ``.staging/<id>`` gone. The steps are
    those of ``_shard_publish``.
    """

    def __init__(self, backend: LocalBackend, snapshot_id: str, folder: Path, rank: int) -> None:
        super().__init__(backend, snapshot_id, folder)
        self._rank = rank
        #: the snapshot's shard set: ``.staging/<id>``, its ranks group, and where it commits
        self._staging = str(backend.staging_dir / snapshot_id)
        self._ranks = os.path.join(self._staging, RANKS_GROUP)
        self._committed = str(backend.snapshots_dir / snapshot_id)

    async def publish(self, shard_document: bytes, shards: ShardedSet) -> bytes | None:
        try:
            await self._sync_pending()
            await self._step(self._seal_shard_sync, shard_document)
            return await publish_shard(self, shard_document, shards, self._backend.threads)
        except FileNotFoundError as error:
            raise self._collected() from error

    async def _step(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` in a thread, as one step of publishing the shard.

        A cancelled caller waits for the thread to finish first: the lock of the shard set
        is held until the last step taken under it is done.
        """
        action = f"publishing rank {self._rank}'s shard of snapshot {self._snapshot_id}"
        running = asyncio.ensure_future(self._backend.in_thread(action, function, *args))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            await asyncio.wait([running])
            if not running.cancelled():
                running.exception()  # retrieved: the cancelled caller drops its outcome
            raise

    def _seal_shard_sync(self, shard_document: bytes) -> None:
        """Write the shard's ``zarr.json``, fsynced, and check that every file written is
        still in the private folder (which the placing rename then moves whole)."""
        write_file(os.path.join(self._folder, MANIFEST_NAME), [shard_document])
        self._written.add(MANIFEST_NAME)
        _fsync_directory(self._folder)
        missing = self._missing_files()
        if missing:
            if not os.path.isdir(self._folder):
                raise self._collected()
            raise StoreUnavailableError(
                f"snapshot {self._snapshot_id}: {len(missing)} files of the shard of rank "
                f"{self._rank} vanished from {self._folder} before it was published (first: "
                f"{missing[0]}); nothing was published"
            )

    def _claim_sync(self) -> int | Taken:
        """A descriptor holding the lock of ``.staging/<id>``, or why the set is taken."""
        if os.path.isdir(self._committed):
            return Taken.COMMITTED
        os.makedirs(self._ranks, exist_ok=True)
        try:
            fd = _lock_folder(self._staging)
        except FileNotFoundError:
            return Taken.COLLECTED
        try:
            locked = os.path.samestat(os.fstat(fd), os.lstat(self._staging))
        except FileNotFoundError:
            locked = False
        except BaseException:
            os.close(fd)
            raise
        if not locked:
            os.close(fd)
            # committed or collected between the folder's creation and its lock
            return Taken.COMMITTED if os.path.isdir(self._committed) else Taken.COLLECTED
        return fd

    @contextlib.asynccontextmanager
    async def claim_shard_set(self) -> AsyncIterator[Taken | None]:
        claimed = await self._step(self._claim_sync)
        if isinstance(claimed, Taken):
            yield claimed
            return
        try:
            yield None
        finally:
            os.close(claimed)

    def _published_shards_sync(self, known: dict[str, memoryview]) -> dict[str, memoryview]:
        published = dict(known)
        for entry in os.scandir(self._ranks):
            name = entry.name
            if name in known or rank_of_folder(name) is None:
                continue
            if entry.is_dir(follow_symlinks=False):
                published[name] = _read_file(entry.path, MANIFEST_NAME)
        return published

    async def published_shards(self, known: dict[str, memoryview]) -> dict[str, memoryview]:
        return await self._step(self._published_shards_sync, known)

    def _place_sync(self) -> bool:
        try:
            os.rename(self._folder, os.path.join(self._ranks, str(self._rank)))
        except OSError as error:
            if error.errno in (errno.ENOTEMPTY, errno.EEXIST):
                return False
            raise
        _fsync_directory(self._ranks)
        return True

    async def place_shard(self, shard_document: bytes) -> bool:
        """One rename of the private folder, where ``shard_document`` was sealed (fsynced)
        before the shard set was claimed."""
        return await self._step(self._place_sync)

    async def shard_set_collected(self) -> bool:
        """Never: the lock held since the claim keeps gc out."""
        return False

    def _commit_shard_set_sync(self, document: bytes) -> bytes:
        _replace_file(os.path.join(self._ranks, MANIFEST_NAME), [ranks_group_document()])
        _fsync_directory(self._ranks)
        _replace_file(os.path.join(self._staging, MANIFEST_NAME), [document])
        _fsync_directory(self._staging)
        try:
            os.rename(self._staging, self._committed)
        except FileNotFoundError:
            # only where flock is missing: another rank committed first
            return _read_file(self._committed, MANIFEST_NAME).tobytes()
        _fsync_directory(str(self._backend.snapshots_dir))
        return document

    async def commit_shard_set(self, document: bytes) -> bytes | Taken | None:
        return await self._step(self._commit_shard_set_sync, document)
