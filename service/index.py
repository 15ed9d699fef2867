"""SnapshotIndex: the summaries of every committed snapshot, in memory, pages newest first.

Listing a store reads its snapshot folder (or object prefix) and, for a snapshot not seen
before, its manifest; far too slow to do for every page (10,000 snapshots in a local
store: about 50 ms warm, most of a second the first time). The index keeps what the last
listing found. A page is always answered from a listing that started less than
``refresh_seconds`` before the request: a request that finds the index older than that
waits for a new listing, and one that finds it past half that age starts one in the
background and is answered at once, so under steady traffic no request waits. A
snapshot that another process commits to the same store therefore shows up here at most
``refresh_seconds`` after its commit; snapshots this service writes or deletes show up
(or go) at once. Concurrent requests share one listing, and a listing that was under
way while this service wrote or deleted does not undo that change.

The service lists through a :class:`~.lister.StoreLister`, which does the listing on a
thread of its own; the index only swaps the result in. Any object with an async
``list()`` that returns summaries newest first will do (a ``SnapshotStore`` too).
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable
from typing import Protocol

from gradvault.core import SnapshotInfo
from gradvault.core.errors import shown
from gradvault.core.store import parse_snapshot_id

from .errors import InvalidCursorError


def encode_cursor(snapshot_id: str) -> str:
    """The cursor that resumes a listing after ``snapshot_id`` (clients treat it as opaque)."""
    return snapshot_id


def decode_cursor(cursor: str) -> str:
    """The snapshot id a cursor resumes after; InvalidCursorError if it is not a cursor.

    Any well-formed snapshot id is a position in the listing, whether or not that
    snapshot still exists, so a cursor keeps working after its snapshot is deleted.
    """
    try:
        return parse_snapshot_id(cursor)
    except ValueError:
        raise InvalidCursorError(
            f"cursor {shown(cursor)} is not a next_cursor this service hands out (a snapshot id)"
        ) from None


class Listable(Protocol):
    """What the index lists: a ``SnapshotStore``, or a ``StoreLister`` of one."""

    async def list(self) -> list[SnapshotInfo]: ...


class SnapshotIndex:
    """Summaries of a store's committed snapshots (see the module docstring)."""

    def __init__(
        self,
        store: Listable,
        refresh_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._ids: list[str] = []  # ascending, i.e. oldest first
        self._infos: dict[str, SnapshotInfo] = {}
        self._listed_at: float | None = None
        self._listing: asyncio.Task[None] | None = None
        # Changes this service made, by sequence number, that a listing started before
        # them may not show yet.
        self._sequence = 0
        self._changes: dict[str, tuple[int, SnapshotInfo | None]] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def _age(self) -> float:
        return float("inf") if self._listed_at is None else self._clock() - self._listed_at

    def _start_listing(self) -> asyncio.Task[None]:
        if self._listing is None:
            self._listing = asyncio.ensure_future(self._relist())
            self._listing.add_done_callback(self._listing_done)
        return self._listing

    def prefetch(self) -> None:
        """Start a listing in the background (if none is under way) without waiting for it."""
        self._start_listing()

    async def refresh(self, *, force: bool = False) -> None:
        """Make sure the index holds a listing younger than ``refresh_seconds``.

        Waits for a new listing if it does not (or if ``force``); starts one in the
        background if it is past half that age.
        """
        age = self._age()
        if force or age >= self.refresh_seconds:
            # shielded: a request that goes away does not cancel the listing others wait for
            await asyncio.shield(self._start_listing())
        elif age >= self.refresh_seconds / 2:
            self._start_listing()

    def _listing_done(self, listing: asyncio.Task[None]) -> None:
        if self._listing is listing:
            self._listing = None
        if not listing.cancelled():
            listing.exception()  # seen by its waiters; not "never retrieved" if none is left

    async def _relist(self) -> None:
        started_at, started_sequence = self._clock(), self._sequence
        infos = {info.id: info for info in await self.store.list()}
        for snapshot_id, (sequence, info) in self._changes.items():
            if sequence > started_sequence:
                if info is None:
                    infos.pop(snapshot_id, None)
                else:
                    infos[snapshot_id] = info
        self._changes = {
            key: change for key, change in self._changes.items() if change[0] > started_sequence
        }
        self._infos = infos
        self._ids = sorted(infos)
        self._listed_at = started_at

    def added(self, info: SnapshotInfo) -> None:
        """This service committed ``info``: list it from now on."""
        self._sequence += 1
        self._changes[info.id] = (self._sequence, info)
        if info.id not in self._infos:
            bisect.insort(self._ids, info.id)
        self._infos[info.id] = info

    def removed(self, snapshot_id: str) -> None:
        """This service deleted ``snapshot_id``: list it no more."""
        self._sequence += 1
        self._changes[snapshot_id] = (self._sequence, None)
        if self._infos.pop(snapshot_id, None) is not None:
            position = bisect.bisect_left(self._ids, snapshot_id)
            del self._ids[position]

    async def page(
        self,
        *,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> tuple[list[SnapshotInfo], str | None]:
        """Up to ``limit`` summaries newest first, and the cursor of the next page (or None)."""
        after = decode_cursor(cursor) if cursor is not None else None
        await self.refresh()
        ids, infos = self._ids, self._infos
        position = len(ids) if after is None else bisect.bisect_left(ids, after)
        found: list[SnapshotInfo] = []
        while position > 0:
            position -= 1
            info = infos[ids[position]]
            if (
                (run is None or info.run == run)
                and (step_min is None or info.step >= step_min)
                and (step_max is None or info.step <= step_max)
            ):
                if len(found) == limit:
                    return found, encode_cursor(found[-1].id)
                found.append(info)
        return found, None
