"""The order in which snapshots written at the same time become visible.

A writer that keeps several snapshots in flight (the Recorder, while earlier commits
still wait for their fsyncs) takes a :class:`CommitTurn` for each, in the order it
starts them, from one :class:`CommitOrder`. A turn carries the snapshot's id, minted
when the turn is taken (so ids, and with them ``list()`` and ``keep_last``, follow that
order), and its place: the backend makes the snapshot visible (the local rename, the S3
manifest PUT) only once every earlier turn has been released, and releases its own turn
as soon as it is visible (before its last fsync when it had to wait for its turn; a
local writer whose turn is open already renames and fsyncs in the same trip to its
thread, and releases it after both). Everything before that step (chunks,
documents, their fsyncs) runs in parallel, so the fsyncs of snapshots in flight together
share the file system's journal commits.

A turn is released exactly once in effect (releasing it again does nothing), whether its
snapshot became visible or its write failed: a failed write never holds up later ones.
Within gradvault a turn is released in one place, on leaving a :meth:`CommitTurn.held`
block: whoever has the turn holds it for as long as the write may still need it (the
recorder while it builds the record, the store's write while it writes, the writer until
the snapshot is visible), and the first block left releases it, so no path out of a
write, failed or not, can keep it. The exception is the recorder's commit thread, which
writes a small snapshot in the calling thread (``SnapshotStore.write_snapshot_blocking``)
and releases its turn once that returns or raises, unless it hands the snapshot to the
loop, whose write then holds the turn. A release may come from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from ._ids import new_snapshot_id


class CommitOrder:
    """Hands out turns; snapshots become visible in the order their turns were taken.

    ``take()`` and a turn's ``release()`` may be called from any thread; waiting happens
    on the event loop that runs the writes (one loop per order), and a release from
    another thread wakes the waiters there.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued = 0
        self._passage = _Passage()

    def take(self) -> CommitTurn:
        """The next turn, with a freshly minted snapshot id (ids increase with turns)."""
        with self._lock:
            position = self._issued
            self._issued += 1
            snapshot_id = new_snapshot_id()
        return CommitTurn(self._passage, position, snapshot_id)


class _Passage:
    """Which turns of one order have been released, and who waits for which (the state a
    :class:`CommitOrder` and its turns share; only the turns call it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # releases may come from any thread
        #: every turn below this one has been released
        self._passed = 0
        self._released: set[int] = set()
        self._waiters: dict[int, asyncio.Future[None]] = {}

    async def wait(self, position: int) -> None:
        """Return once every turn below ``position`` has been released."""
        with self._lock:
            if self._passed >= position:
                return
            waiter = self._waiters.get(position)
            if waiter is None:
                waiter = asyncio.get_running_loop().create_future()
                self._waiters[position] = waiter
        await asyncio.shield(waiter)

    def is_open(self, position: int) -> bool:
        """Whether every turn below ``position`` has been released (from any thread: the
        count only grows, so a true answer stays true)."""
        return self._passed >= position

    def release(self, position: int) -> None:
        """Turn ``position`` is released (again: nothing changes); wake whom that lets pass,
        on their loop (from another thread, through ``call_soon_threadsafe``)."""
        woken = []
        with self._lock:
            if position < self._passed or position in self._released:
                return
            self._released.add(position)
            while self._passed in self._released:
                self._released.discard(self._passed)
                self._passed += 1
                waiter = self._waiters.pop(self._passed, None)
                if waiter is not None:
                    woken.append(waiter)
        for waiter in woken:
            _wake(waiter)


def _wake(waiter: asyncio.Future[None]) -> None:
    """Resolve ``waiter``, here if this thread runs its loop, else on its loop's thread."""
    loop = waiter.get_loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        if not waiter.done():
            waiter.set_result(None)
        return
    try:
        loop.call_soon_threadsafe(_wake, waiter)
    except RuntimeError:  # its loop is closed: nothing waits on it any more
        pass


class CommitTurn:
    """One snapshot's id and place in a :class:`CommitOrder`."""

    __slots__ = ("_passage", "_position", "snapshot_id")

    def __init__(self, passage: _Passage, position: int, snapshot_id: str) -> None:
        self._passage = passage
        self._position = position
        self.snapshot_id = snapshot_id
        """The id of the snapshot written in this turn."""

    async def wait(self) -> None:
        """Return once every earlier turn of the order has been released."""
        await self._passage.wait(self._position)

    def is_open(self) -> bool:
        """Whether every earlier turn of the order has been released already; callable
        from any thread (a writer's thread asks before it renames without a trip through
        the event loop; a false answer may be stale, a true one never is)."""
        return self._passage.is_open(self._position)

    def release(self) -> None:
        """This snapshot is visible, or will never be: later turns may go on (callable
        from any thread)."""
        self._passage.release(self._position)

    @contextlib.contextmanager
    def held(self) -> Iterator[CommitTurn]:
        """Hold the turn for the block; it is released on leaving the block, whatever happens.

        Blocks may nest (a write holds the turn that its writer holds until the snapshot
        is visible): the first one left releases it, the others' release does nothing.
        """
        try:
            yield self
        finally:
            self.release()


def holding(turn: CommitTurn | None) -> contextlib.AbstractContextManager[object]:
    """``turn.held()``, or a block that holds nothing for a write without a turn."""
    return contextlib.nullcontext() if turn is None else turn.held()
