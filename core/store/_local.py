"""The local-folder backend: a store's folders, its reads, listing, deletes and gc.

A snapshot is written by a writer of its own (``_local_writer``: staged under
``.staging/<id>/``, every file and folder fsynced, renamed into ``snapshots/<id>``), so a
reader sees a whole snapshot or none.

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
import functools
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import StoreUnavailableError
from ._backend import (
    MANIFEST_NAME,
    RANKS_GROUP,
    SNAPSHOTS_PREFIX,
    CheckedRead,
    ManyRead,
    MissingKeyError,
    Refusal,
    ShardWriter,
    SnapshotWriter,
    StoreBackend,
    ThreadRunner,
    UnexpectedObjectError,
)
from ._file_writes import DirectWrites, write_file
from ._fsync import FsyncTogether, fsync_directory, fsync_paths, make_folders
from ._ids import parse_snapshot_id
from ._local_files import (
    check_no_linked_folder,
    file_size,
    file_sizes_under,
    lock_for_removal,
    newest_mtime,
    only_name_and_unopened,
    read_file,
    read_file_into,
    remove_tree,
)
from ._local_writer import ONE_CHUNK_FILES, LocalShardWriter, LocalSnapshotWriter
from ._zarr_format import dump_json, group_metadata

STAGING_FOLDER = ".staging"
#: Names under ``.staging/`` of folders being removed (see the module docstring).
COLLECTING_PREFIX = ".collecting-"
DELETING_INFIX = ".deleting-"
#: Names under ``.staging/`` of deleted snapshots' folders kept for the next commits to
#: write into (:meth:`LocalBackend.keep_as_spare`)
SPARE_PREFIX = ".spare-"
_log = logging.getLogger("gradvault.store")
#: Threads that share one ``read_many_into_checked``, each reading file after file: more
#: than the cores, so that one waiting on the disk or on page faults leaves its core to
#: another, but few enough that the slices in flight stay in the cores' caches.
READ_LANES = 2 * (os.cpu_count() or 1)

T = TypeVar("T")


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


class LocalBackend(StoreBackend):
    """Snapshots in a local folder (``_local_writer`` has the commit protocol)."""

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
            if set(names) != ONE_CHUNK_FILES:
                return False
            if not all(only_name_and_unopened(f"{path}/{name}") for name in names):
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

    def make_moves_durable(self) -> None:
        """Make the renames of folders between ``snapshots/`` and ``.staging/`` durable
        (a commit's into ``snapshots/``, a delete's out of it): fsync ``snapshots/``, then
        ``.staging/``.

        A file system that does not journal its folders (ext4 without a journal) writes
        each folder's change on that folder's own fsync: with ``snapshots/`` alone, a power
        cut could leave a committed snapshot's folder with its old name in ``.staging/``
        too, which gc would take for an abandoned write and empty, or a deleted one's with
        no name at all.
        """
        fsync_paths([self.snapshots_path, self.staging_path])

    def _remove_spares_sync(self) -> None:
        with self._spares_lock:
            spares, self._spares = self._spares, []
        for spare in spares:
            try:
                remove_tree(spare)
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
            for folder in make_folders(target)
        ]
        synced: set[Path] = set()
        for folder in (self.root, self.snapshots_dir):
            document = folder / MANIFEST_NAME
            if not document.exists():
                temporary = folder / f".{MANIFEST_NAME}.{secrets.token_hex(8)}"
                write_file(str(temporary), [dump_json(group_metadata())])
                os.replace(temporary, document)
                fsync_directory(str(folder))
                synced.add(folder)
        # deepest first: a folder's entry is durable before the entry of the folder above
        parents = {folder.parent for folder in made} - synced
        for parent in sorted(parents, key=lambda path: len(path.parts), reverse=True):
            fsync_directory(str(parent))

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
        writer = LocalSnapshotWriter(self, snapshot_id, folder)
        if in_one_step:  # made by that step, in its thread: one trip through a thread
            writer.folder_to_make = True
        else:
            await self.in_thread(f"creating staging folder {folder}", folder.mkdir)
        return writer

    def begin_blocking(self, snapshot_id: str) -> SnapshotWriter | None:
        if not self._prepared:  # the first write makes the store's folders, here too
            self.here("creating the store folders", self._prepare_sync)
            self._prepared = True
        writer = LocalSnapshotWriter(self, snapshot_id, f"{self.staging_path}/{snapshot_id}")
        writer.folder_to_make = True  # made by write_array_and_commit_blocking
        return writer

    async def begin_shard(self, snapshot_id: str, rank: int) -> ShardWriter:
        # A private folder: the shard appears under ranks/ only once whole (a rename).
        folder = self.staging_dir / f"{snapshot_id}.rank{rank}-{secrets.token_hex(4)}"
        await self.in_thread(f"creating staging folder {folder}", folder.mkdir)
        return LocalShardWriter(self, snapshot_id, folder, rank)

    async def read(self, key: str, max_size: int | None = None) -> memoryview:
        try:
            return await self.in_thread(f"reading {key}", read_file, str(self.root), key, max_size)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def read_into(self, key: str, buffers: list[memoryview]) -> None:
        try:
            await self.in_thread(f"reading {key}", read_file_into, str(self.root), key, buffers)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def read_into_checked(self, key: str, buffers: list[memoryview]) -> list[int]:
        """Each slice is checksummed as it is read, in the reading thread (one pass)."""
        try:
            return await self.in_thread(
                f"reading {key}", read_file_into, str(self.root), key, buffers, True
            )
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def read_many(self, keys: list[str], max_size: int | None = None) -> list[ManyRead]:
        """The files are read by a few threads (:meth:`_in_lanes`): one trip through the
        event loop for all of them, and several reads waiting on the disk at once."""
        root = str(self.root)
        return await self._in_lanes(keys, lambda _, key: read_file(root, key, max_size))

    async def read_many_into_checked(
        self, requests: list[tuple[str, list[memoryview]]]
    ) -> list[CheckedRead]:
        """The files are read by a few threads (:meth:`_in_lanes`), each slice checksummed
        as it lands (one pass over the bytes, the GIL released for both the read and the
        crc32c)."""
        root = str(self.root)
        return await self._in_lanes(
            [key for key, _ in requests],
            lambda index, key: read_file_into(root, key, requests[index][1], True),
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
            return await self.in_thread(f"reading {key}", file_size, str(self.root), key)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(key) from None

    async def object_sizes(self, prefix: str) -> dict[str, int | None]:
        return await self.in_thread(f"listing {prefix}", file_sizes_under, str(self.root / prefix))

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
            # a folder that is a symbolic link holds nothing (see check_no_linked_folder)
            if entry.is_dir(follow_symlinks=False) and os.path.exists(
                os.path.join(entry.path, MANIFEST_NAME)
            ):
                found.append(entry.name)
        return found

    def _is_committed_sync(self, snapshot_id: str) -> bool:
        try:
            check_no_linked_folder(
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
        fd = lock_for_removal(str(self.snapshots_dir / snapshot_id))
        if fd is None:
            return False  # absent, or another delete holds it
        try:
            doomed = self.staging_dir / f"{snapshot_id}{DELETING_INFIX}{secrets.token_hex(4)}"
            try:
                os.rename(self.snapshots_dir / snapshot_id, doomed)
            except FileNotFoundError:
                return False
            self.make_moves_durable()  # a power cut leaves it where gc finds it
            # Invisible from here on: the snapshot is deleted whatever happens to its files.
            if self.keep_as_spare(str(doomed)):
                return True
            try:
                removed = remove_tree(str(doomed))
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
        # listed once, and only if a folder old enough to be collected is found
        committed = functools.cache(self._committed_folders_sync)
        return sorted(
            entry.name for entry in entries if self._collect_entry(entry, cutoff, committed)
        )

    def _committed_folders_sync(self) -> dict[tuple[int, int], str]:
        """The committed snapshots' folders and their ranks' folders, by (device, inode)."""
        folders: dict[tuple[int, int], str] = {}
        try:
            names = os.listdir(self.snapshots_dir)
        except FileNotFoundError:
            return folders
        for name in names:
            path = f"{self.snapshots_path}/{name}"
            inside = [path]
            try:
                inside += [
                    f"{path}/{RANKS_GROUP}/{rank}" for rank in os.listdir(f"{path}/{RANKS_GROUP}")
                ]
            except (FileNotFoundError, NotADirectoryError):
                pass
            for folder in inside:
                try:
                    status = os.lstat(folder)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(status.st_mode):
                    folders[(status.st_dev, status.st_ino)] = folder
        return folders

    def _collect_entry(
        self,
        entry: os.DirEntry[str],
        cutoff: float,
        committed: Callable[[], dict[tuple[int, int], str]],
    ) -> bool:
        """Claim one ``.staging/`` entry untouched since ``cutoff`` and remove it.

        False if it is fresh, or gone, or someone else (a live delete or gc) has it, or if
        it is another name of a folder in ``committed()`` (left by a power cut on a file
        system that does not journal its folders, docs/FORMAT.md "Commit protocol"):
        emptying it would empty that snapshot.
        """
        claimed = str(self.staging_dir / f"{COLLECTING_PREFIX}{secrets.token_hex(8)}")
        if not entry.is_dir(follow_symlinks=False):
            try:
                if newest_mtime(entry.path) > cutoff:
                    return False
                os.rename(entry.path, claimed)
                os.unlink(claimed)
            except FileNotFoundError:
                return False
            return True
        # The lock first: a folder a live delete is removing is skipped without a walk.
        fd = lock_for_removal(entry.path)
        if fd is None:
            return False
        try:
            try:
                if newest_mtime(entry.path) > cutoff:
                    return False
                locked = os.fstat(fd)
                if not os.path.samestat(locked, os.lstat(entry.path)):
                    return False  # the name was reused since it was locked
                also = committed().get((locked.st_dev, locked.st_ino))
                if also is not None:
                    _log.warning(
                        "store %s: gc leaves %s: it is another name of the committed folder "
                        "%s (a power cut left both names on a file system that does not "
                        "journal its folders); a file system check (e2fsck) removes one",
                        self.location,
                        entry.path,
                        also,
                    )
                    return False
                # From here on a writer of this folder finds it gone and fails.
                os.rename(entry.path, claimed)
            except FileNotFoundError:
                return False  # committed, claimed or removed since the listing
            return remove_tree(claimed)
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
