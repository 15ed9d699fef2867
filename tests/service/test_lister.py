"""StoreLister: the store's listing, done on a thread of its own, local store and S3."""

from __future__ import annotations

import threading

import pytest

from gradvault.core import StoreUnavailableError
from gradvault.service import Settings, create_app
from gradvault.service.index import SnapshotIndex
from gradvault.service.lister import StoreLister

from .conftest import make_record


def _lister_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "gradvault-index"]


@pytest.fixture
async def lister(store_url, connection_options):
    lister = StoreLister(store_url, connection_options)
    yield lister
    await lister.aclose()


async def test_it_lists_what_another_store_object_commits_and_deletes(lister, direct_store):
    assert await lister.list() == []
    first = await direct_store.write_snapshot(make_record(1), run="a", step=1)
    second = await direct_store.write_snapshot(make_record(2), run="b", step=2)
    assert [info.id for info in await lister.list()] == [second.id, first.id]
    assert await lister.list() == await direct_store.list()  # the same summaries, same order
    await direct_store.delete(first.id)
    assert [info.id for info in await lister.list()] == [second.id]


async def test_an_index_over_it_pages_newest_first(lister, direct_store):
    written = [await direct_store.write_snapshot(make_record(i), run="r", step=i) for i in range(5)]
    index = SnapshotIndex(lister, refresh_seconds=0)
    infos, cursor = await index.page(limit=3)
    rest, end = await index.page(limit=3, cursor=cursor)
    assert [info.id for info in infos + rest] == [info.id for info in reversed(written)]
    assert end is None


async def test_closing_it_stops_its_thread_and_later_listings_fail_clearly(
    store_url, connection_options
):
    before = len(_lister_threads())
    lister = StoreLister(store_url, connection_options)
    await lister.list()
    assert len(_lister_threads()) == before + 1
    await lister.aclose()
    assert len(_lister_threads()) == before
    with pytest.raises(RuntimeError, match=r"StoreLister\(.*\) is closed"):
        await lister.list()
    await lister.aclose()  # closing twice is harmless


async def test_a_store_failure_on_its_thread_reaches_the_caller(tmp_path):
    folder = tmp_path / "store"
    (folder / "snapshots").mkdir(parents=True)
    (folder / "snapshots").rmdir()
    (folder / "snapshots").write_text("not a folder")
    lister = StoreLister(str(folder))
    try:
        with pytest.raises(StoreUnavailableError, match="listing snapshots"):
            await lister.list()
    finally:
        await lister.aclose()


async def test_the_service_lists_through_one_and_stops_it_when_it_stops(
    store_url, connection_options, direct_store
):
    info = await direct_store.write_snapshot(make_record(), run="r", step=0)
    before = len(_lister_threads())
    app = create_app(Settings(store=store_url, store_options=connection_options))
    async with app.router.lifespan_context(app):
        assert isinstance(app.state.index.store, StoreLister)
        await app.state.index.refresh()
        assert [i.id for i in (await app.state.index.page())[0]] == [info.id]
        assert len(_lister_threads()) == before + 1
    assert len(_lister_threads()) == before
