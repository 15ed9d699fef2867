"""Heavy requests leave the event loop free: ``/healthz`` answers while they are at work.

A snapshot of many small gradients makes the three CPU-heavy requests heavy for real:
its page (``/ui/snapshots/{id}``), its manifest (``GET /v1/snapshots/{id}``) and an
upload of it (a safetensors header of as many tensors). Each is sent to a real uvicorn
on loopback; once the service is at work on it, ``/healthz`` is asked for, and must be
answered first. Nothing is timed; the test's own wrappers make the order observable:

- around the app (:class:`Watch`): when it has been given an upload's whole header, and
  in which order answers go out;
- around the store (:class:`GatedStore`): the manifest a route gets holds back its
  gradient table, the route's heavy work, until ``/healthz`` has been answered. Where
  that work runs on the event loop, ``/healthz`` cannot be answered meanwhile: the gate
  then gives way after ``GATE_SECONDS`` and the test fails on the order of the answers.
  (Without the gate the page's remaining work, a tenth of a second once it is off the
  loop and paged, would race the ``/healthz`` round trip on a busy machine.)
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId, open_store
from gradvault.core.store import SnapshotStore
from gradvault.service import Settings, create_app
from gradvault.service.deps import get_store

from .conftest import STARTUP_DEADLINE_SECONDS, UvicornThread

#: gradients in the snapshot: enough that its page, manifest and header take the service
#: a good part of a second of CPU, few enough that the module takes seconds
GRADIENTS = 20_000


class Watch:
    """An ASGI wrapper that signals arrivals and records the order answers finish in.

    ``received(path, count)`` is set once the app has been given ``count`` body bytes
    of a request for ``path``.
    ``finished`` lists paths in the order their last response bytes were handed to the
    server to send, and ``on_finish`` runs (on the server's thread) as each is.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.finished: list[str] = []
        self.on_finish: dict[str, Any] = {}
        self._bodies: dict[str, tuple[int, threading.Event]] = {}

    def received(self, path: str, count: int) -> threading.Event:
        event = threading.Event()
        self._bodies[path] = (count, event)
        return event

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        awaited = self._bodies.pop(path, None)
        seen = 0

        async def watched_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if awaited is not None and seen >= awaited[0]:
                awaited[1].set()
            return message

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                if path in self.on_finish:
                    self.on_finish[path]()
                self.finished.append(path)  # before it is sent: the client may act on it
            await send(message)

        await self.app(scope, watched_receive, watched_send)


#: how long a gated manifest holds back its gradients when /healthz never answers
GATE_SECONDS = 10


class GatedManifest(dict):  # type: ignore[type-arg]
    """A manifest whose ``"gradients"`` wait, when asked for, until ``gate`` is set."""

    def __init__(self, manifest: dict[str, Any], gate: threading.Event) -> None:
        super().__init__(manifest)
        self._gate = gate

    def __getitem__(self, key: str) -> Any:
        if key == "gradients":
            self._gate.wait(GATE_SECONDS)
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key == "gradients":
            self._gate.wait(GATE_SECONDS)
        return super().get(key, default)


class GatedStore:
    """The app's store, but ``info`` returns a GatedManifest and sets ``handed_over``."""

    def __init__(self, store: SnapshotStore) -> None:
        self._store = store
        self.handed_over = threading.Event()
        self.gate = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def info(self, snapshot_id: str, **options: Any) -> dict[str, Any]:
        manifest = GatedManifest(await self._store.info(snapshot_id, **options), self.gate)
        self.handed_over.set()
        return manifest


@dataclass
class Served:
    base_url: str
    app: FastAPI
    watch: Watch
    snapshot_id: str
    spool: Path


def _record(count: int) -> GradientsParamsRecord:
    values = np.arange(count, dtype=np.float32)
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(i + 1), f"layers.{i}.weight", values[i : i + 1])
            for i in range(count)
        ]
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = tmp_path_factory.mktemp("event-loop") / "store"
    spool = path.parent / "spool"
    spool.mkdir()

    async def fill() -> str:
        store = open_store(path)
        try:
            return (await store.write_snapshot(_record(GRADIENTS), run="big", step=0)).id
        finally:
            await store.close()

    snapshot_id = asyncio.run(fill())
    settings = Settings(store=str(path), index_refresh_seconds=0, spool_dir=str(spool))
    app = create_app(settings)
    watch = Watch(app)
    server = UvicornThread(watch)  # type: ignore[arg-type]
    server.start()
    try:
        yield Served(server.base_url, app, watch, snapshot_id, spool)
    finally:
        server.stop()


async def _wait(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, STARTUP_DEADLINE_SECONDS), "never happened"


async def _healthz_answers_first(served: Served, path: str, **params: Any) -> httpx.Response:
    """Ask for ``path``; while its route works on the manifest, ``/healthz`` must answer."""
    async with httpx.AsyncClient(base_url=served.base_url, timeout=120) as client:
        # the store reads (and parses) the manifest once here; later it hands out copies
        assert (await client.get(path, params=params)).status_code == 200
        assert (await client.get("/healthz")).status_code == 200  # a connection kept open
        store = GatedStore(served.app.state.store)
        served.app.dependency_overrides[get_store] = lambda: store
        try:
            served.watch.finished.clear()
            heavy = asyncio.create_task(client.get(path, params=params))
            await _wait(store.handed_over)
            health = await client.get("/healthz")
            store.gate.set()
            response = await heavy
        finally:
            store.gate.set()
            del served.app.dependency_overrides[get_store]
    assert health.status_code == 200 and response.status_code == 200
    assert served.watch.finished == ["/healthz", path], (
        f"/healthz was answered after {path} ended: the event loop was held"
    )
    return response


async def test_healthz_answers_while_a_big_snapshot_page_renders(served: Served) -> None:
    path = f"/ui/snapshots/{served.snapshot_id}"
    page = await _healthz_answers_first(served, path, sort="l2_norm", order="desc")
    assert page.text.count("<tr class=") == 500  # one page of the gradients, not all
    assert f"gradients 1–500 of {GRADIENTS}" in page.text


async def test_healthz_answers_while_a_big_manifest_is_encoded(served: Served) -> None:
    path = f"/v1/snapshots/{served.snapshot_id}"
    manifest = (await _healthz_answers_first(served, path)).json()
    assert len(manifest["gradients"]) == GRADIENTS


async def test_healthz_answers_while_a_big_upload_header_is_checked(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.base_url, timeout=120) as client:
        download = await client.get(f"/v1/snapshots/{served.snapshot_id}/safetensors")
        assert download.status_code == 200
        file = download.content
        header_end = 8 + int.from_bytes(file[:8], "little")
        assert (await client.get("/healthz")).status_code == 200  # a connection kept open

        # the service holds the whole header; the data follows only after /healthz answers
        header_in = served.watch.received("/v1/snapshots", header_end)
        healthz_done = asyncio.Event()
        spooled_at_healthz: list[list[str]] = []
        served.watch.on_finish["/healthz"] = lambda: spooled_at_healthz.append(
            os.listdir(served.spool)
        )
        served.watch.finished.clear()

        async def body() -> AsyncIterator[bytes]:
            yield file[:header_end]
            await healthz_done.wait()
            yield file[header_end:]

        upload = asyncio.create_task(
            client.post(
                "/v1/snapshots",
                params={"run": "again", "step": 1},
                content=body(),
                headers={"Content-Length": str(len(file))},
            )
        )
        await _wait(header_in)
        health = await client.get("/healthz")
        healthz_done.set()
        response = await upload
    del served.watch.on_finish["/healthz"]
    assert health.status_code == 200
    assert response.status_code == 201, response.text
    assert response.json()["num_params"] == GRADIENTS
    # the header is checked before anything is spooled: an empty spool folder when
    # /healthz was answered means the service answered it while checking the header
    assert spooled_at_healthz == [[]], (
        "/healthz was answered only after the upload's header was checked: the event "
        f"loop was held (spool folder then: {spooled_at_healthz})"
    )
    assert served.watch.finished == ["/healthz", "/v1/snapshots"]
