"""The order in which snapshots written at the same time become visible.

A writer that keeps several snapshots in flight (the Recorder, while earlier commits
still wait for their fsyncs) takes a :class:`CommitTurn` for each, in the order it
starts them, from one :class:`CommitOrder`. A turn carries the snapshot's id, minted
when the turn is taken (so ids, and with them ``list()`` and ``keep_last``, follow that
order), and its place: the backend makes the snapshot visible (the local rename, the S3
manifest PUT) only once every earlier turn has been released, and releases its own turn
as soon as it is visible, before its last fsync. Everything before that step (chunks,
documents, their fsyncs) runs in parallel, so the fsyncs of snapshots in flight together
share the file system's journal commits.

A turn is released exactly once in effect (releasing it again does nothing), whether its
snapshot became visible or its write failed: a failed write never holds up later ones.
"""

from __future__ import annotations

import asyncio
import threading

from ._ids import new_snapshot_id


class CommitOrder:
    """Hands out turns; snapshots become visible in the order their turns were taken.

    ``take()`` may be called from any thread; waiting and releasing happen on the event
    loop that runs the writes (one loop per order).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued = 0
        #: every turn below this one has been released
        self._passed = 0
        self._released: set[int] = set()
        self._waiters: dict[int, asyncio.Future[None]] = {}

    def take(self) -> CommitTurn:
        """The next turn, with a freshly minted snapshot id (ids increase with turns)."""
        with self._lock:
            position = self._issued
            self._issued += 1
            snapshot_id = new_snapshot_id()
        return CommitTurn(self, position, snapshot_id)

    async def _wait(self, position: int) -> None:
        if self._passed >= position:
            return
        waiter = self._waiters.get(position)
        if waiter is None:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters[position] = waiter
        await asyncio.shield(waiter)

    def _release(self, position: int) -> None:
        if position < self._passed or position in self._released:
            return
        self._released.add(position)
        while self._passed in self._released:
            self._released.discard(self._passed)
            self._passed += 1
            waiter = self._waiters.pop(self._passed, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)


class CommitTurn:
    """One snapshot's id and place in a :class:`CommitOrder`."""

    __slots__ = ("_order", "_position", "snapshot_id")

    def __init__(self, order: CommitOrder, position: int, snapshot_id: str) -> None:
        self._order = order
        self._position = position
        self.snapshot_id = snapshot_id
        """The id of the snapshot written in this turn."""

    async def wait(self) -> None:
        """Return once every earlier turn of the order has been released."""
        await self._order._wait(self._position)

    def release(self) -> None:
        """This snapshot is visible, or will never be: later turns may go on."""
        self._order._release(self._position)
