"""SnapshotIndex: refresh interval, shared listings, own changes, and paging."""

from __future__ import annotations

import asyncio

import pytest

from gradvault.core import open_store
from gradvault.service.index import SnapshotIndex, decode_cursor, encode_cursor

from .conftest import make_record


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountingStore:
    """A store whose list() is counted and, when ``gate`` is set, waits for it."""

    def __init__(self, store) -> None:
        self.store = store
        self.listings = 0
        self.gate: asyncio.Event | None = None
        self.entered = asyncio.Event()

    async def list(self):
        self.listings += 1
        found = await self.store.list()
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        return found


@pytest.fixture
async def local_store(tmp_path):
    store = open_store(tmp_path / "store")
    yield store
    await store.close()


async def test_a_new_snapshot_shows_after_the_refresh_interval_not_before(local_store, tmp_path):
    clock = Clock()
    counting = CountingStore(local_store)
    index = SnapshotIndex(counting, refresh_seconds=1.0, clock=clock)
    assert (await index.page())[0] == []
    other = open_store(tmp_path / "store")  # another process's store object
    try:
        info = await other.write_snapshot(make_record(), run="r", step=0)
    finally:
        await other.close()
    clock.now += 0.4
    assert (await index.page())[0] == []  # young: the index is not relisted
    assert counting.listings == 1
    clock.now += 0.6
    assert [i.id for i in (await index.page())[0]] == [info.id]  # waited for a listing
    assert counting.listings == 2


async def test_past_half_its_age_the_index_answers_at_once_and_relists_behind(local_store):
    clock = Clock()
    counting = CountingStore(local_store)
    index = SnapshotIndex(counting, refresh_seconds=1.0, clock=clock)
    await index.page()
    info = await local_store.write_snapshot(make_record(), run="r", step=0)
    clock.now += 0.6
    counting.gate, counting.entered = asyncio.Event(), asyncio.Event()
    assert (await index.page())[0] == []  # answered from the index, not held by the listing
    await counting.entered.wait()
    counting.gate.set()
    await index.refresh(force=True)  # joins the listing under way; starts none
    assert [i.id for i in (await index.page())[0]] == [info.id]
    assert counting.listings == 2


async def test_concurrent_pages_share_one_listing(local_store):
    counting = CountingStore(local_store)
    counting.gate = asyncio.Event()
    index = SnapshotIndex(counting, refresh_seconds=1.0, clock=Clock())
    pages = [asyncio.ensure_future(index.page()) for _ in range(5)]
    await counting.entered.wait()
    counting.gate.set()
    await asyncio.gather(*pages)
    assert counting.listings == 1


async def test_a_listing_under_way_does_not_undo_this_services_changes(local_store):
    kept = await local_store.write_snapshot(make_record(1), run="r", step=1)
    doomed = await local_store.write_snapshot(make_record(2), run="r", step=2)
    clock = Clock()
    counting = CountingStore(local_store)
    index = SnapshotIndex(counting, refresh_seconds=1.0, clock=clock)
    await index.page()
    clock.now += 2
    counting.gate, counting.entered = asyncio.Event(), asyncio.Event()
    page = asyncio.ensure_future(index.page())
    await counting.entered.wait()  # the listing has read the store: both snapshots
    await local_store.delete(doomed.id)
    index.removed(doomed.id)
    added = await local_store.write_snapshot(make_record(3), run="r", step=3)
    index.added(added)
    counting.gate.set()
    assert [i.id for i in (await page)[0]] == [added.id, kept.id]


async def test_pages_walk_every_snapshot_once_newest_first(local_store):
    written = [await local_store.write_snapshot(make_record(i), run="r", step=i) for i in range(7)]
    index = SnapshotIndex(local_store, refresh_seconds=1.0)
    seen, cursor = [], None
    while True:
        infos, cursor = await index.page(limit=3, cursor=cursor)
        seen.extend(info.id for info in infos)
        if cursor is None:
            break
    assert seen == [info.id for info in reversed(written)]
    step_range = (await index.page(step_min=2, step_max=4))[0]
    assert [i.step for i in step_range] == [4, 3, 2]


async def test_a_cursor_keeps_its_place_after_its_snapshot_is_deleted(local_store):
    written = [await local_store.write_snapshot(make_record(i), run="r", step=i) for i in range(4)]
    index = SnapshotIndex(local_store, refresh_seconds=1.0)
    first, cursor = await index.page(limit=2)
    assert decode_cursor(cursor) == first[-1].id == written[2].id
    await local_store.delete(written[2].id)
    index.removed(written[2].id)
    rest, _ = await index.page(limit=2, cursor=cursor)
    assert [info.id for info in rest] == [written[1].id, written[0].id]
    assert encode_cursor(written[0].id) == written[0].id
