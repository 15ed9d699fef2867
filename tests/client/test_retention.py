"""``apply_retention`` over HTTP keeps what a store's own retention pass keeps, also when
someone else deletes the newest snapshot while the pass runs (both clients, both stores).

Someone else is a real second user of the service: a transport in front of the client
under test passes every request on, and once the pass's listing has answered it deletes
the newest snapshot listed, through its own connection. The store's pass meets the same
deletion at the point it first asks after the newest snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gradvault.client import Client
from gradvault.core.store import SnapshotStore, open_store
from tests.service.conftest import make_record

from .conftest import WRITE_TOKEN, ClientUnderTest, SharedService

STEPS = range(5)
KEEP_LAST = 2
SNAPSHOTS = "/v1/snapshots"


def push_run(service_url: str, run: str) -> list[str]:
    """One snapshot per step of ``STEPS`` in ``run``; their ids, newest first."""
    with Client(service_url, WRITE_TOKEN) as client:
        ids = [client.push(make_record(step), run=run, step=step).id for step in STEPS]
    return ids[::-1]


def listed_newest(request: httpx.Request, body: Any) -> str | None:
    """The newest snapshot a listing answer names (None for another request)."""
    if request.method != "GET" or request.url.path != SNAPSHOTS or not body["data"]:
        return None
    return body["data"][0]["id"]


class DeletesTheNewestAfterTheListing(httpx.HTTPTransport):
    """The service, and a second user who deletes the newest snapshot of the first listing
    as soon as that listing has answered."""

    def __init__(self, service_url: str) -> None:
        super().__init__()
        self._other = httpx.Client(
            base_url=service_url, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}
        )
        self.deleted: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not self.deleted and request.method == "GET" and request.url.path == SNAPSHOTS:
            response.read()
            newest = listed_newest(request, response.json())
            if newest is not None:
                self._other.delete(f"{SNAPSHOTS}/{newest}").raise_for_status()
                self.deleted.append(newest)
        return response

    def close(self) -> None:
        self._other.close()
        super().close()


class AsyncDeletesTheNewestAfterTheListing(httpx.AsyncHTTPTransport):
    """:class:`DeletesTheNewestAfterTheListing` for the asyncio client."""

    def __init__(self, service_url: str) -> None:
        super().__init__()
        self._other = httpx.AsyncClient(
            base_url=service_url, headers={"Authorization": f"Bearer {WRITE_TOKEN}"}
        )
        self.deleted: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        if not self.deleted and request.method == "GET" and request.url.path == SNAPSHOTS:
            await response.aread()
            newest = listed_newest(request, response.json())
            if newest is not None:
                (await self._other.delete(f"{SNAPSHOTS}/{newest}")).raise_for_status()
                self.deleted.append(newest)
        return response

    async def aclose(self) -> None:
        await self._other.aclose()
        await super().aclose()


def delete_the_newest_when_asked_after(
    store: SnapshotStore, newest: str, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """The first time the store's pass asks whether ``newest`` is committed, a second
    user deletes it just before the answer; the list says when that happened."""
    deleted: list[str] = []
    is_committed: Callable[[str], Any] = store.backend.is_committed

    async def deleted_under_the_pass(snapshot_id: str) -> bool:
        if snapshot_id == newest and not deleted:
            deleted.append(snapshot_id)
            await store.delete(snapshot_id)
        return await is_committed(snapshot_id)

    monkeypatch.setattr(store.backend, "is_committed", deleted_under_the_pass)
    return deleted


async def store_pass_keeps(
    store_url: str, connection_options: dict[str, object], run: str, newest: str, monkeypatch
) -> tuple[list[int], list[str]]:
    """The steps the store's own pass leaves in ``run`` (newest first), and what it deleted."""
    store = open_store(store_url, **connection_options)
    try:
        deleted_by_other = delete_the_newest_when_asked_after(store, newest, monkeypatch)
        deleted = await store.apply_retention(keep_last=KEEP_LAST, run=run)
        assert deleted_by_other == [newest]
        return [info.step for info in await store.list(run=run)], deleted
    finally:
        await store.close()


async def test_over_http_retention_keeps_what_the_store_pass_keeps(
    client_kind: str,
    service: SharedService,
    run_named: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service_url = service.base_url
    by_store = await asyncio.to_thread(push_run, service_url, run_named("by-store"))
    by_http = await asyncio.to_thread(push_run, service_url, run_named("by-http"))

    kept_by_store, deleted_by_store = await store_pass_keeps(
        service.store_url, service.store_options, run_named("by-store"), by_store[0], monkeypatch
    )

    transport: Any = (
        DeletesTheNewestAfterTheListing(service_url)
        if client_kind == "sync"
        else AsyncDeletesTheNewestAfterTheListing(service_url)
    )
    api = ClientUnderTest(client_kind, service_url, WRITE_TOKEN, transport=transport)
    try:
        deleted_over_http = await api.call(
            "apply_retention", keep_last=KEEP_LAST, run=run_named("by-http")
        )
        assert transport.deleted == [by_http[0]]
        kept_over_http = [summary.step for summary in await api.list(run=run_named("by-http"))]
    finally:
        await api.close()

    # the newest (step 4) went under both passes; each decided again and kept the two
    # newest that were left, rather than leave the run with one snapshot
    assert kept_by_store == [3, 2]
    assert kept_over_http == kept_by_store
    assert deleted_by_store == by_store[3:]
    assert deleted_over_http == by_http[3:]


async def test_retention_rules_are_checked_before_anything_is_sent(client_kind: str) -> None:
    requests: list[httpx.Request] = []
    transport: Any = httpx.MockTransport(lambda request: requests.append(request))  # type: ignore[func-returns-value]
    api = ClientUnderTest(client_kind, "http://127.0.0.1:9", None, transport=transport)
    try:
        with pytest.raises(ValueError, match=r"keep_last must be an int >= 0 or None; got -1"):
            await api.call("apply_retention", keep_last=-1)
        with pytest.raises(ValueError, match=r"keep_every must be an int >= 1 or None; got True"):
            await api.call("apply_retention", keep_every=True)
        assert await api.call("apply_retention") == []  # no rule: nothing to do, nothing sent
    finally:
        await api.close()
    assert requests == []
