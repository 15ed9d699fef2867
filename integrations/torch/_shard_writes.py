"""One rank's shard on its way to a store (a Recorder) or to the service (an upload).

Either way the write runs in the background while training goes on, and ends with the
shard durable; the write whose shard completed the ranks also knows the committed
snapshot. A store's shard is written by the core's :class:`Recorder`
(``start_snapshot_shard``); the service's is uploaded by a :class:`Client`
(``push_shard``, docs/SERVICE.md, "Shard uploads") on a thread of its own, since the
client blocks.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import Any

from gradvault.client import Target
from gradvault.core import GradientsParamsRecord, SnapshotHandle
from gradvault.core.store import ShardInfo, SnapshotInfo


class ShardWrite:
    """This rank's shard, being written to a store or uploaded to the service
    (:meth:`to` opens the one a target names)."""

    def __init__(self) -> None:
        self._pending: SnapshotHandle[ShardInfo] | concurrent.futures.Future[ShardInfo] | None
        self._pending = None

    @staticmethod
    def to(where: Target, store_options: Mapping[str, Any]) -> ShardWrite:
        """The write to ``where``: a store opened with ``store_options``, or the service."""
        return _ServiceUpload(where) if where.is_service else _StoreWrite(where, store_options)

    def start(
        self,
        record: GradientsParamsRecord,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: Mapping[str, str],
    ) -> None:
        """Begin writing ``record`` as rank ``rank``'s shard of ``snapshot_id``."""
        self._pending = self._begin(
            record,
            {
                "snapshot_id": snapshot_id,
                "rank": rank,
                "world_size": world_size,
                "run": run,
                "step": step,
                "tags": tags,
            },
        )

    def _begin(
        self, record: GradientsParamsRecord, shard: dict[str, Any]
    ) -> SnapshotHandle[ShardInfo] | concurrent.futures.Future[ShardInfo]:
        """The running write of ``record``; ``shard`` holds :meth:`start`'s keywords."""
        raise NotImplementedError

    def done(self) -> bool:
        """Whether the write has ended (durable, or failed)."""
        return self._pending is not None and self._pending.done()

    def committed(self, timeout: float) -> SnapshotInfo | None:
        """Waits up to ``timeout`` seconds for the shard to be durable: the committed
        snapshot if this write completed it, else None. Raises the write's error, or
        ``concurrent.futures.TimeoutError``."""
        assert self._pending is not None
        return self._pending.result(timeout=timeout).snapshot

    def close(self) -> None:
        """Release what the write holds; a write still running is left to its thread (a
        stuck store or service must not hold this rank)."""
        self._release(ended=self._pending is None or self._pending.done())

    def _release(self, ended: bool) -> None:
        raise NotImplementedError


class _StoreWrite(ShardWrite):
    """A shard written by the core's Recorder (its own background thread)."""

    def __init__(self, where: Target, store_options: Mapping[str, Any]) -> None:
        super().__init__()
        self._recorder = where.recorder(**store_options)

    def _begin(
        self, record: GradientsParamsRecord, shard: dict[str, Any]
    ) -> SnapshotHandle[ShardInfo]:
        return self._recorder.start_snapshot_shard(record, **shard)

    def _release(self, ended: bool) -> None:
        if ended:  # the recorder's close would wait for a write that has not
            self._recorder.close()


class _ServiceUpload(ShardWrite):
    """A shard uploaded with the blocking Client's ``push_shard``, on a thread of its own."""

    def __init__(self, where: Target) -> None:
        super().__init__()
        self._client = where.client()
        self._uploads = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gradvault-shard-upload"
        )

    def _begin(
        self, record: GradientsParamsRecord, shard: dict[str, Any]
    ) -> concurrent.futures.Future[ShardInfo]:
        client = self._client
        return self._uploads.submit(lambda: client.push_shard(record, **shard))

    def _release(self, ended: bool) -> None:
        self._uploads.shutdown(wait=False)
        if ended:  # else the upload still uses the client
            self._client.close()
