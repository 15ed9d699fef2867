"""Writing a snapshot into a local store: stage, fsync everything, rename into place.

A snapshot is written under ``.staging/<id>/``; a chunk file written through the page
cache is fsynced as soon as it is written; one written with O_DIRECT (its bytes on the
device already), the arrays' ``zarr.json`` documents and every folder once all chunks
are written (all together, in parallel threads: on ext4 each folder fsync forces a
journal commit, and while chunks are still streaming every one of them forced a new
one); then the manifest, fsynced, one ``os.rename`` to ``snapshots/<id>`` and fsyncs of
the two folders it changed. A reader therefore sees a whole snapshot or none. Files are
written with ``os.open``/``os.writev``/``os.fsync`` in a thread pool, many at once
(measured faster than aiofiles, which makes one thread hop per call; docs/FORMAT.md has
the figures), large chunk files with O_DIRECT where the file system takes it
(``_file_writes``). A writer with a ``turn`` does all of this at once with other writers
and waits for its turn only to rename. A writer sees its store through
:class:`LocalStore` (``LocalBackend`` in ``_local``, which makes the writers).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..errors import StoreUnavailableError
from ._backend import (
    MANIFEST_NAME,
    RANKS_GROUP,
    EncodedChunk,
    ShardWriter,
    SnapshotWriter,
    ThreadRunner,
    collected_error,
)
from ._commit_order import CommitTurn, holding
from ._file_writes import DirectWrites, write_file, write_file_unsynced
from ._fsync import FsyncTogether, fsync_directory, fsync_paths
from ._local_files import lock_folder, read_file, replace_file
from ._shard_publish import ShardSteps, Taken, publish_shard
from ._shards import ShardedSet, rank_of_folder, ranks_group_document
from ._zarr_format import CHUNK_KEY_SEPARATOR, PACKED_ARRAY, PACKED_AT_ROOT

#: What a snapshot of one chunk holds (docs/FORMAT.md, format 4): the only kind kept spare
ONE_CHUNK_FILES = frozenset({MANIFEST_NAME, f"c{CHUNK_KEY_SEPARATOR}0"})

T = TypeVar("T")


class LocalStore(Protocol):
    """What a writer uses of the local store it writes into (``LocalBackend``)."""

    #: chunk files are written with O_DIRECT until the file system refuses it
    direct: DirectWrites
    #: a commit's last fsyncs, issued together
    fsyncs: FsyncTogether
    snapshots_dir: Path
    #: ``snapshots_dir`` as text
    snapshots_path: str
    #: where snapshots are staged (``.staging/``)
    staging_dir: Path
    #: ``staging_dir`` as text
    staging_path: str

    @property
    def threads(self) -> ThreadRunner: ...

    def here(self, action: str, function: Callable[..., T], *args: Any) -> T: ...

    async def in_thread(self, action: str, function: Callable[..., T], *args: Any) -> T: ...

    def take_spare(self, folder: str) -> bool: ...

    def make_moves_durable(self) -> None: ...


class LocalSnapshotWriter(SnapshotWriter):
    def __init__(self, backend: LocalStore, snapshot_id: str, folder: Path | str) -> None:
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
                existing=self._in_spare and at_root and key in ONE_CHUNK_FILES,
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
            fsync_paths(paths)
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
        and make that durable: True once committed, False if it must wait for its turn.

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
        entries_durable = self._in_spare and ONE_CHUNK_FILES <= self._written
        self._fsync_staged([manifest] if entries_durable else [manifest, self._folder])
        if turn is not None and not turn.is_open():
            return False
        self._rename_into_place_sync()
        self._backend.make_moves_durable()
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
            for stale in ONE_CHUNK_FILES - self._written:
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
        made it durable); if it had to leave the rename to the snapshot's turn,
        wait for the turn and rename. The turn is released in any case."""
        turn = self.turn
        with holding(turn):  # released once the rename is done, or has failed
            if await self._run(action, commit_sync, *args):
                return
            assert turn is not None
            await turn.wait()
            await self._run(action, self._rename_into_place_sync)
        # Renames of snapshots in flight together are made durable by one fsync of each
        # folder, or by fsyncs that run at once and share a journal commit.
        await self._run(action, self._backend.make_moves_durable)

    async def abort(self) -> None:
        try:
            await self._backend.threads.run(shutil.rmtree, self._folder, True)
        except Exception:  # noqa: BLE001 - best effort; gc collects what remains
            pass


class LocalShardWriter(LocalSnapshotWriter, ShardWriter, ShardSteps):
    """Writes one rank's shard in a private staging folder, then moves it under
    ``.staging/<id>/ranks/<rank>`` and, if every rank is there, commits the snapshot.

    Publishing and committing happen under the lock of ``.staging/<id>`` (the lock gc
    takes before it claims a folder), so gc never takes a shard set while a rank looks
    at it, and the ranks that finish together commit one at a time: the first that finds
    every shard commits, and any later one finds ``.staging/<id>`` gone. The steps are
    those of ``_shard_publish``.
    """

    def __init__(self, backend: LocalStore, snapshot_id: str, folder: Path, rank: int) -> None:
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
        fsync_directory(self._folder)
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
            fd = lock_folder(self._staging)
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
                published[name] = read_file(entry.path, MANIFEST_NAME)
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
        # its new name, then its old one gone (``LocalBackend.make_moves_durable``)
        fsync_paths([self._ranks, self._backend.staging_path])
        return True

    async def place_shard(self, shard_document: bytes) -> bool:
        """One rename of the private folder, where ``shard_document`` was sealed (fsynced)
        before the shard set was claimed."""
        return await self._step(self._place_sync)

    async def shard_set_collected(self) -> bool:
        """Never: the lock held since the claim keeps gc out."""
        return False

    def _commit_shard_set_sync(self, document: bytes) -> bytes:
        replace_file(os.path.join(self._ranks, MANIFEST_NAME), [ranks_group_document()])
        fsync_directory(self._ranks)
        replace_file(os.path.join(self._staging, MANIFEST_NAME), [document])
        fsync_directory(self._staging)
        try:
            os.rename(self._staging, self._committed)
        except FileNotFoundError:
            # only where flock is missing: another rank committed first
            return read_file(self._committed, MANIFEST_NAME).tobytes()
        self._backend.make_moves_durable()
        return document

    async def commit_shard_set(self, document: bytes) -> bytes | Taken | None:
        return await self._step(self._commit_shard_set_sync, document)
