"""What a storage backend provides to SnapshotStore: keyed bytes plus a commit protocol.

Keys are ``/``-separated paths relative to the store root (``snapshots/<id>/zarr.json``).
A backend never sees a record; SnapshotStore hands it encoded chunks and metadata
documents, so the local folder and the object store share all format logic.

:class:`StoreBackend` is public (``SnapshotStore.backend``): every read, write, listing
and removal of the store goes through its methods on that one instance, which is the
seam where tests inject faults and pauses (docs/API.md, "The store's backend").
"""

from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import StoreUnavailableError
from ._checksums import crc32c

if TYPE_CHECKING:
    from ._commit_order import CommitTurn
    from ._shards import ShardedSet

T = TypeVar("T")

#: An encoded chunk: its key under the array (``c.0.1``) and the buffers to write, in order.
#: The last buffer may be a ``Crc32cTrailer`` (``_checksums``): the writer computes it
#: from the buffers before it as it writes them, before taking the next chunk.
EncodedChunk = tuple[str, list[Any]]

SNAPSHOTS_PREFIX = "snapshots"
MANIFEST_NAME = "zarr.json"
#: The group of a sharded snapshot that holds one group per rank (docs/FORMAT.md).
RANKS_GROUP = "ranks"
#: The object gc writes into an object-store prefix it removes (``snapshots/<id>/``); a
#: commit that finds it fails (docs/FORMAT.md, "Commit protocol"). Never listed.
GC_MARKER_NAME = "gc-collected"


def snapshot_key(snapshot_id: str, *parts: str) -> str:
    """The key of ``parts`` inside the snapshot group ``snapshot_id``."""
    return "/".join((SNAPSHOTS_PREFIX, snapshot_id, *parts))


def shard_prefix(snapshot_id: str, rank: int) -> str:
    """The key prefix of rank ``rank``'s shard: ``snapshots/<id>/ranks/<rank>``."""
    return snapshot_key(snapshot_id, RANKS_GROUP, str(rank))


class ThreadRunner:
    """Runs blocking work (file I/O, checksums, stats) off the event loop, in its own pool.

    A dedicated pool rather than the loop's default one: the store keeps many files in
    flight at once, and must not starve (or be starved by) the application's to_thread.
    """

    def __init__(self, max_workers: int) -> None:
        self._max_workers = max_workers
        self._executor: ThreadPoolExecutor | None = None

    @property
    def max_workers(self) -> int:
        """How many functions run at once, at most."""
        return self._max_workers

    async def run(self, function: Callable[..., T], *args: Any) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                self._max_workers, thread_name_prefix="gradvault-store"
            )
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args))

    @property
    def started(self) -> bool:
        """Whether the pool's threads were started (by a first :meth:`run`) and not closed."""
        return self._executor is not None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def running_crc32c(buffers: list[memoryview]) -> list[int]:
    """The crc32c of ``buffers[0..i]`` together, for each ``i``."""
    crcs = []
    crc = 0
    for buffer in buffers:
        crc = crc32c(buffer, crc)
        crcs.append(crc)
    return crcs


def collected_error(snapshot_id: str, written: str) -> StoreUnavailableError:
    """The error of a write whose leftovers gc took before it committed; ``written`` names
    what it wrote, with its verb (``"its staging folder /data/.staging/<id> was"``)."""
    return StoreUnavailableError(
        f"snapshot {snapshot_id}: {written} collected by gc before commit (gc took this "
        f"write, older than its grace period, for a leftover); nothing was committed"
    )


class MissingKeyError(KeyError):
    """A key that is not in the store (backends raise it; SnapshotStore translates it)."""


class UnexpectedObjectError(Exception):
    """What a key holds is not what the reader asked for: not a regular file, or a size
    outside the bounds given (found before the object's bytes are read). The message
    completes a sentence that starts with the key: ``"... is a FIFO, not a regular file"``.
    """


#: Why ``read_many`` or ``read_many_into_checked`` got nothing from one key (returned, not
#: raised, so that the caller can name what it was reading there).
Refusal = MissingKeyError | UnexpectedObjectError
#: One key's outcome in ``read_many``: its bytes, or why there are none.
ManyRead = memoryview | Refusal
#: One request's outcome in ``read_many_into_checked``: the running crc32cs, or why none.
CheckedRead = list[int] | Refusal


async def _refusal_or(read: Awaitable[T]) -> T | Refusal:
    """What ``read`` gives, or the MissingKeyError or UnexpectedObjectError it raises."""
    try:
        return await read
    except (MissingKeyError, UnexpectedObjectError) as error:
        return error


class SnapshotWriter(ABC):
    """Writes one snapshot; nothing is visible to readers until :meth:`commit` returns.

    ``turn`` (None unless the store sets it after ``begin``) is the snapshot's place in a
    :class:`~._commit_order.CommitOrder`: the step of :meth:`commit` that makes the
    snapshot visible waits for ``turn.wait()`` and releases the turn right after; the
    turn is released before ``commit`` returns, whatever happens.
    """

    turn: CommitTurn | None = None

    @abstractmethod
    async def write_array(
        self, name: str, metadata: bytes | None, chunks: Iterator[EncodedChunk]
    ) -> None:
        """Write every chunk of array ``name``, then its ``zarr.json`` (``metadata``).

        ``chunks`` may do CPU work (checksums) as it is iterated; iterate it off the loop.
        The array PACKED_AT_ROOT (``""``) is the snapshot's node: its chunks go under the
        snapshot's own prefix, and it has no document of its own (``metadata`` None): the
        document :meth:`commit` writes is the array's.
        """

    @abstractmethod
    async def commit(self, group_metadata: bytes) -> None:
        """Write the group's ``zarr.json`` (the manifest) and make the snapshot visible
        (in ``turn``, if set)."""

    async def write_array_and_commit(
        self,
        name: str,
        metadata: bytes | None,
        chunks: Iterator[EncodedChunk],
        group_metadata: Callable[[], bytes],
    ) -> None:
        """:meth:`write_array`, then :meth:`commit` of ``group_metadata()``: the snapshot's
        document, made once every chunk is written (from what iterating ``chunks``
        computed, its checksums and stats).

        For a snapshot of one array. A backend may do both in one step off the loop (the
        local one does, in one thread); ``group_metadata`` may then run in that thread.
        """
        await self.write_array(name, metadata, chunks)
        await self.commit(group_metadata())

    @abstractmethod
    async def abort(self) -> None:
        """Remove whatever was written, as far as possible; never raises."""

    def write_array_and_commit_blocking(
        self,
        name: str,
        metadata: bytes | None,
        chunks: Iterator[EncodedChunk],
        group_metadata: Callable[[], bytes],
    ) -> None:
        """:meth:`write_array_and_commit` in the calling thread, for a writer from
        :meth:`StoreBackend.begin_blocking` whose ``turn``, if set, is open (RuntimeError
        otherwise). The turn is not released here: its holder releases it, on the loop
        its order's waiters wait on."""
        raise NotImplementedError(f"{type(self).__name__} has no blocking commit")

    def abort_blocking(self) -> None:
        """:meth:`abort` in the calling thread; never raises."""
        raise NotImplementedError(f"{type(self).__name__} has no blocking abort")


class ShardWriter(SnapshotWriter):
    """Writes one rank's shard of a sharded snapshot; :meth:`publish` makes it durable.

    ``commit`` is not used: a shard is published, and the snapshot commits once every
    rank's shard is (docs/FORMAT.md, "Sharded snapshots"). ``abort`` removes only what
    was not published yet: a published shard is left to the snapshot (or to gc).
    """

    async def commit(self, group_metadata: bytes) -> None:
        raise TypeError("a shard is published with publish(), not committed alone")

    @abstractmethod
    async def publish(self, shard_document: bytes, shards: ShardedSet) -> bytes | None:
        """Write the shard's ``zarr.json`` and make the shard durable and visible to the
        other ranks, atomically, once ``shards.check`` accepts the shards published before
        it; then, if ``shards.commit_document`` gives a manifest, commit the snapshot.

        Returns the committed snapshot's group document (this rank's commit, or one that
        another rank's call made at the same time), or None while some rank is missing.
        InvalidArgumentError if this rank's shard was published already or the snapshot
        is committed without it; StoreUnavailableError if gc took the write.
        """


class StoreBackend(ABC):
    """A store root: the local folder or an object-store prefix (``SnapshotStore.backend``).

    The store and everything it uses (readers, writers, the key view, retention) call
    this one instance, so wrapping a method on it (``monkeypatch.setattr(store.backend,
    "read", spy)``) sees or changes every call of that kind.
    """

    #: How messages name this store (a path or a URL).
    location: str
    #: set by each backend's constructor; read through :attr:`threads`
    _threads: ThreadRunner

    @property
    def threads(self) -> ThreadRunner:
        """The store's pool for blocking work (file I/O, checksums, parsing): the one pool
        this backend's writers and readers run such work in."""
        return self._threads

    async def check(self) -> None:
        """Raise StoreUnavailableError, in one line naming what is wrong, if the store
        cannot be listed (a service checks this before it serves)."""
        await self.committed_ids()

    @abstractmethod
    async def prepare(self) -> None:
        """Create the root and ``snapshots`` group documents if they are missing."""

    @abstractmethod
    async def begin(self, snapshot_id: str, *, in_one_step: bool = False) -> SnapshotWriter:
        """A writer for a new snapshot.

        With ``in_one_step`` (the snapshot is written by one ``write_array_and_commit``),
        the backend may leave what it makes for a write (the local staging folder) to
        that step, off the loop, instead of a step of its own now.
        """

    def begin_blocking(self, snapshot_id: str) -> SnapshotWriter | None:
        """A writer for a new snapshot of one array, written and committed by its
        ``write_array_and_commit_blocking`` in the calling thread (a thread that runs no
        event loop: it blocks for the whole write); None where this backend writes
        nothing so (the S3 one, whose requests run on its event loop). The local one
        makes the store's folders first if no write has yet (``prepare``), in the
        calling thread."""
        return None

    @abstractmethod
    async def begin_shard(self, snapshot_id: str, rank: int) -> ShardWriter:
        """A writer for rank ``rank``'s shard of the sharded snapshot ``snapshot_id``."""

    @abstractmethod
    async def read(self, key: str, max_size: int | None = None) -> memoryview:
        """The bytes at ``key``, in memory of their own (nothing maps or shares the file).

        MissingKeyError if absent; UnexpectedObjectError if it is not a regular file or is
        larger than ``max_size`` (checked before anything is allocated for it);
        StoreUnavailableError if unreadable.
        """

    @abstractmethod
    async def read_into(self, key: str, buffers: list[memoryview]) -> None:
        """Fill ``buffers``, in order, with the bytes at ``key``.

        The object must be exactly as long as the buffers together: UnexpectedObjectError
        otherwise, checked before a byte is read (and again if it changes meanwhile), and
        if it is not a regular file; MissingKeyError if absent.
        """

    async def read_into_checked(self, key: str, buffers: list[memoryview]) -> list[int]:
        """:meth:`read_into`, and the running crc32c of the bytes read after each buffer.

        ``result[i]`` is the crc32c of buffers ``0..i`` together. A backend that can
        checksum each piece as it lands (while in cache) overrides this.
        """
        await self.read_into(key, buffers)
        return await self.threads.run(running_crc32c, buffers)

    async def read_many(self, keys: list[str], max_size: int | None = None) -> list[ManyRead]:
        """:meth:`read` of every key, all at once.

        For each key, in order: its bytes, or the MissingKeyError or UnexpectedObjectError
        that refused it, returned rather than raised so that the caller can name what it
        was reading (StoreUnavailableError is raised). A backend that reads many objects
        with less overhead than a call each overrides this.
        """
        return list(await asyncio.gather(*(_refusal_or(self.read(key, max_size)) for key in keys)))

    async def read_many_into_checked(
        self, requests: list[tuple[str, list[memoryview]]]
    ) -> list[CheckedRead]:
        """:meth:`read_into_checked` of every ``(key, buffers)`` request, all at once.

        For each request, in order: the running crc32cs, or the refusal, as
        :meth:`read_many` gives them.
        """
        reads = (_refusal_or(self.read_into_checked(key, buffers)) for key, buffers in requests)
        return list(await asyncio.gather(*reads))

    @abstractmethod
    async def size(self, key: str) -> int:
        """The size of the object at ``key``, without reading it.

        MissingKeyError if absent; UnexpectedObjectError if it is not a regular file.
        """

    @abstractmethod
    async def object_sizes(self, prefix: str) -> dict[str, int | None]:
        """Everything under the folder ``prefix``: its keys (relative to ``prefix``) and sizes.

        None stands for something that is not a regular file (a folder, a symbolic link, a
        FIFO), which a read refuses; nothing under ``prefix`` is an empty dict. The work
        done is bounded by what is there, whatever a manifest claims.
        """

    @abstractmethod
    async def committed_ids(self, *, fresh: bool = False) -> list[str]:
        """Ids of the snapshots whose manifest exists, in any order.

        A backend may remember manifests it has seen; ``fresh`` checks every one now.
        """

    @abstractmethod
    async def is_committed(self, snapshot_id: str) -> bool:
        """Whether the snapshot's manifest exists now (no cache)."""

    def note_committed(self, snapshot_id: str) -> None:  # noqa: B027 - a hook most leave empty
        """Told by this backend's writers once ``snapshot_id`` is committed (visible).

        A backend that remembers which manifests it has seen, for ``committed_ids`` (the
        S3 one), remembers this one; the local folder remembers nothing.
        """

    @abstractmethod
    async def delete_snapshot(self, snapshot_id: str) -> bool:
        """Remove a committed snapshot (invisible first, then its data); False if absent.

        Safe to run at the same time as another delete or ``collect_garbage``: once the
        snapshot is invisible, data that someone else removes first is not an error.
        """

    @abstractmethod
    async def collect_garbage(self, grace_seconds: float) -> list[str]:
        """Remove leftovers of unfinished writes untouched for ``grace_seconds``; their names.

        Never removes anything a writer can still commit: a writer whose leftovers were
        taken fails its commit with StoreUnavailableError instead.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections and handles."""
