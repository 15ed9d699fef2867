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
    """This rank's shard, being written to ``where`` (a store or the service)."""

    def __init__(self, where: Target, store_options: Mapping[str, Any]) -> None:
        self.where = where
        self._recorder = None if where.is_service else where.recorder(**store_options)
        self._client = where.client() if where.is_service else None
        self._uploads: concurrent.futures.ThreadPoolExecutor | None = None
        self._pending: SnapshotHandle[ShardInfo] | concurrent.futures.Future[ShardInfo] | None = (
            None
        )

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
        if self._recorder is not None:
            self._pending = self._recorder.start_snapshot_shard(
                record,
                snapshot_id=snapshot_id,
                rank=rank,
                world_size=world_size,
                run=run,
                step=step,
                tags=tags,
            )
            return
        client = self._client
        assert client is not None
        self._uploads = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gradvault-shard-upload"
        )
        self._pending = self._uploads.submit(
            lambda: client.push_shard(
                record,
                snapshot_id=snapshot_id,
                rank=rank,
                world_size=world_size,
                run=run,
                step=step,
                tags=tags,
            )
        )

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
        """Release the recorder's thread, or the upload's thread and the client; a write
        still running is left to its thread (a stuck store must not hold this rank)."""
        if self._pending is not None and not self._pending.done():
            if self._uploads is not None:
                self._uploads.shutdown(wait=False)
            return
        if self._recorder is not None:
            self._recorder.close()
        if self._uploads is not None:
            self._uploads.shutdown(wait=False)
        if self._client is not None:
            self._client.close()
