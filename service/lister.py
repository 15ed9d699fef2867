"""StoreLister: ``list()`` of a store, done on a thread and event loop of its own.

A listing of a large store is mostly Python work while holding the GIL: the store checks
every snapshot folder or prefix and sorts every summary (10,000 snapshots in a local
store: 20-30 ms of it on the loop that awaits the listing, the rest in the store's
threads). Done on the service's event loop, every request that arrives meanwhile waits
for all of it, and the index relists twice per refresh interval. Here the listing runs
on another thread, so requests wait at most for a switch of the GIL, never for a whole
listing; the service's loop only swaps in the result.

The lister opens a store of its own (same URL and options as the service's): a store
object and its connections belong to the event loop that uses them. It sees the store
as another process would; the index keeps this service's own writes and deletes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from gradvault.core import SnapshotInfo, SnapshotStore, open_store

T = TypeVar("T")


class StoreLister:
    """Lists the store at ``url`` (opened with ``options``) from a thread of its own."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        self._url = url
        self._options = dict(options or {})
        self._store: SnapshotStore | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="gradvault-index", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def location(self) -> str:
        """The store's URL or folder, as given."""
        return self._url

    def __repr__(self) -> str:
        return f"StoreLister({self._url!r})"

    async def _on_thread(self, work: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            work.close()
            raise RuntimeError(f"{self!r} is closed")
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self._loop))

    async def _list(self) -> list[SnapshotInfo]:
        if self._store is None:
            self._store = open_store(self._url, **self._options)
        return await self._store.list()

    async def list(self) -> list[SnapshotInfo]:
        """Committed snapshots, newest first, as ``SnapshotStore.list()`` gives them."""
        return await self._on_thread(self._list())

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        under_way = [task for task in asyncio.all_tasks() if task is not current]
        for task in under_way:
            task.cancel()
        await asyncio.gather(*under_way, return_exceptions=True)
        if self._store is not None:
            await self._store.close()
        await asyncio.get_running_loop().shutdown_default_executor()

    async def aclose(self) -> None:
        """Close the lister's store and stop its thread (a listing under way is cancelled)."""
        if self._closed:
            return
        try:
            await self._on_thread(self._shutdown())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join)
            self._loop.close()
