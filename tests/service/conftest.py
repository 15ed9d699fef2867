"""The service under test: in process (httpx's ASGITransport) or a real uvicorn on loopback.

``make_service(**settings)`` starts the app over this test's store (a local folder or a
prefix on the S3 server) and returns a :class:`RunningService`; ``service`` is one with
default settings. Both are parametrized over the two ways of serving and, through
``store_kind``, the two stores.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from gradvault.client.cli.serve import BackgroundService
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId, open_store
from gradvault.core.store import SnapshotStore
from gradvault.service import Settings, create_app

#: bounds every wait on a server thread; a test that hits it fails, it never sleeps it out
STARTUP_DEADLINE_SECONDS = 30


class UvicornThread:
    """A uvicorn server on 127.0.0.1 (a free port) running ``app`` in its own thread."""

    def __init__(self, app: FastAPI) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("127.0.0.1", 0))
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(STARTUP_DEADLINE_SECONDS)
        self._socket.close()


class RunningService:
    """A started app: its base URL, a way to make clients, and its own objects."""

    def __init__(self, app: FastAPI, base_url: str, transport: httpx.AsyncBaseTransport | None):
        self.app = app
        self.base_url = base_url
        self._transport = transport
        self._clients: list[httpx.AsyncClient] = []

    @property
    def settings(self) -> Settings:
        return self.app.state.settings

    def client(self, token: str | None = None, **options: Any) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        client = httpx.AsyncClient(
            base_url=self.base_url,
            transport=self._transport,
            headers=headers,
            timeout=60,
            **options,
        )
        self._clients.append(client)
        return client

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


@pytest.fixture(params=["asgi", "uvicorn"])
def serving(request: pytest.FixtureRequest) -> str:
    """How the app is served: in process (ASGITransport) or by uvicorn on loopback."""
    return request.param


@pytest.fixture
def service_settings(store_url: str, connection_options: dict[str, object]) -> dict[str, Any]:
    """The settings every service in a test starts from (its store and how to reach it).

    Tests arrange snapshots through a store object of their own, so the index relists the
    store for every page (refresh interval 0) unless a test says otherwise.
    """
    return {
        "store": store_url,
        "store_options": dict(connection_options),
        "index_refresh_seconds": 0,
    }


@pytest.fixture
async def make_service(
    serving: str, service_settings: dict[str, Any]
) -> AsyncIterator[Callable[..., Awaitable[RunningService]]]:
    async with AsyncExitStack() as stack:

        async def start(**overrides: Any) -> RunningService:
            settings = Settings(**{**service_settings, **overrides})
            app = create_app(settings)
            if serving == "asgi":
                await stack.enter_async_context(app.router.lifespan_context(app))
                running = RunningService(app, "http://testserver", httpx.ASGITransport(app=app))
            else:
                server = UvicornThread(app)
                await asyncio.to_thread(server.start)
                stack.push_async_callback(asyncio.to_thread, server.stop)
                running = RunningService(app, server.base_url, None)
            stack.push_async_callback(running.aclose)
            return running

        yield start


@pytest.fixture
async def service(make_service: Callable[..., Awaitable[RunningService]]) -> RunningService:
    return await make_service()


@pytest.fixture
async def direct_store(
    store_url: str, connection_options: dict[str, object]
) -> AsyncIterator[SnapshotStore]:
    """This test's store opened apart from the service, to arrange and check what is there."""
    store = open_store(store_url, **connection_options, chunk_bytes=4096, pack_threshold=512)
    yield store
    await store.close()


def make_record(seed: int = 0, sizes: tuple[tuple[int, ...], ...] = ((3, 4), (5,))) -> Any:
    """A record of float32 gradients of ``sizes`` (deterministic from ``seed``)."""
    rng = np.random.default_rng(seed)
    entries = [
        GradientRecordEntry.from_array(
            ParamId(int(rng.integers(0, 2**63))),
            f"layer{i}.weight",
            rng.standard_normal(shape, "f4"),
        )
        for i, shape in enumerate(sizes)
    ]
    return GradientsParamsRecord(entries)


async def store_keys(store_url: str, connection_options: dict[str, object]) -> list[str]:
    """Every snapshot id a fresh store object lists (nothing cached from the service)."""
    store = open_store(store_url, **connection_options)
    try:
        return [info.id for info in await store.list()]
    finally:
        await store.close()


@pytest.fixture
def make_served(tmp_path) -> Iterator[Callable[..., BackgroundService]]:
    """Start services in this process under uvicorn with the service's own options
    (``gradvault serve``'s way: the connection limits apply), each on a store of its own;
    keyword arguments are settings. All are stopped after the test."""
    started: list[BackgroundService] = []

    def start(**settings: object) -> BackgroundService:
        base = {"store": str(tmp_path / f"store{len(started)}"), "port": 0}
        service = BackgroundService(Settings(**(base | settings))).start()
        started.append(service)
        return service

    yield start
    for service in started:
        service.stop()
