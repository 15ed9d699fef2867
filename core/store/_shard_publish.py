"""Publishing one rank's shard of a sharded snapshot: the sequence, written once.

Every backend publishes a shard in the same steps (docs/FORMAT.md, "Sharded snapshots"):
claim the snapshot's shard set (refused if gc took it or the snapshot is committed
already), check this shard against those published before it, place it (refused if this
rank's shard is there already), look again for gc, and if every rank's shard is now
there, commit the snapshot. :func:`publish_shard` runs those steps and raises every error
a publish raises; a backend provides each step as a :class:`ShardSteps` (the local folder
renames under the lock of the staging folder; S3 makes conditional PUTs and checks gc's
marker after each).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager

from ..errors import InvalidArgumentError
from ._backend import ThreadRunner, collected_error
from ._shards import ShardedSet


class Taken(enum.Enum):
    """Why a shard set can no longer be published to."""

    #: gc claimed the write's leftovers (a write older than gc's grace period)
    COLLECTED = "collected"
    #: the snapshot is committed already, without this shard
    COMMITTED = "committed"


class ShardSteps(ABC):
    """How one backend does each step of :func:`publish_shard` for one rank's shard."""

    @property
    @abstractmethod
    def written_where(self) -> str:
        """What this write put in the store, as messages name it with its verb
        (``"its objects in s3://bucket/prefix were"``)."""

    @abstractmethod
    def claim_shard_set(self) -> AbstractAsyncContextManager[Taken | None]:
        """Hold the snapshot's shard set for the block (against gc, and against other ranks
        that commit), where the backend can; yields why it is taken, or None."""

    @abstractmethod
    async def published_shards(self, known: dict[str, memoryview]) -> dict[str, memoryview]:
        """The ``zarr.json`` of every shard published now, by rank folder name; ``known``
        ones are not read again (a published shard's document never changes)."""

    @abstractmethod
    async def place_shard(self, shard_document: bytes) -> bool:
        """Make this shard durable and visible to the other ranks, with ``shard_document``
        as its ``zarr.json``; False, with nothing changed, if this rank's shard is there."""

    @abstractmethod
    async def shard_set_collected(self) -> bool:
        """Whether gc has claimed the shard set since it was claimed here."""

    @abstractmethod
    async def commit_shard_set(self, document: bytes) -> bytes | Taken | None:
        """Commit the snapshot with ``document`` as its group ``zarr.json``.

        Returns the committed group document (``document``, or the one another rank
        committed at the same time), None if another rank is committing it now, or
        ``Taken.COLLECTED`` if gc took the write (nothing is then committed).
        """


def committed_without_rank(snapshot_id: str, rank: int) -> InvalidArgumentError:
    """The error for a shard whose snapshot is committed already, without it."""
    return InvalidArgumentError(
        f"snapshot {snapshot_id} is committed already, without this write of rank "
        f"{rank}: rank {rank} was written twice (or the id was reused); "
        f"nothing was changed"
    )


def written_twice(snapshot_id: str, rank: int) -> InvalidArgumentError:
    """The error for a second shard of one rank."""
    return InvalidArgumentError(
        f"snapshot {snapshot_id}: rank {rank} has written its shard "
        f"already; a rank writes one shard per snapshot (this second write was not "
        f"published)"
    )


async def publish_shard(
    steps: ShardSteps, shard_document: bytes, shards: ShardedSet, threads: ThreadRunner
) -> bytes | None:
    """Publish ``shards.rank``'s shard through ``steps``, and commit the snapshot if it is
    the last one missing.

    Returns the committed snapshot's group document (this call's commit, or one that
    another rank's call made at the same time), or None while some rank is missing.
    InvalidArgumentError if this rank's shard was published already or the snapshot is
    committed without it (and what ``shards.check`` refuses); StoreUnavailableError if gc
    took the write.
    """
    snapshot_id, rank = shards.snapshot_id, shards.rank
    async with steps.claim_shard_set() as taken:
        if taken is Taken.COLLECTED:
            raise collected_error(snapshot_id, steps.written_where)
        if taken is Taken.COMMITTED:
            raise committed_without_rank(snapshot_id, rank)
        published = await steps.published_shards({})
        await threads.run(shards.check, published)
        if not await steps.place_shard(shard_document):
            raise written_twice(snapshot_id, rank)
        # gc claims a shard set before it looks for the snapshot's manifest, which a
        # shard does not write: a claimed set is being removed, this shard with it.
        if await steps.shard_set_collected():
            raise collected_error(snapshot_id, steps.written_where)
        published = await steps.published_shards(published)
        document = await threads.run(shards.commit_document, published)
        if document is None:
            return None
        committed = await steps.commit_shard_set(document)
        if committed is Taken.COLLECTED:
            raise collected_error(snapshot_id, steps.written_where)
        assert not isinstance(committed, Taken), f"commit_shard_set answered {committed}"
        return committed
