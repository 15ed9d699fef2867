"""Both clients against a real uvicorn on 127.0.0.1 over this test's store (local and S3).

``api`` is a :class:`ClientUnderTest` for the blocking or the asyncio client (the
``client_kind`` parameter), so one test body checks both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest

from gradvault.client import AsyncClient, Client
from gradvault.service import Settings, create_app
from tests.service.conftest import UvicornThread

WRITE_TOKEN = "client-test-write-token"
READ_TOKEN = "client-test-read-token"


class ClientUnderTest:
    """A :class:`Client` or :class:`AsyncClient` whose every method is awaited here.

    The blocking client runs in a thread, so the test's event loop stays free.
    """

    def __init__(self, kind: str, base_url: str, token: str | None, **options: Any) -> None:
        self.kind = kind
        cls = Client if kind == "sync" else AsyncClient
        self.client: Client | AsyncClient = cls(base_url, token, **options)

    async def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        method = getattr(self.client, name)
        if self.kind == "sync":
            return await asyncio.to_thread(method, *args, **kwargs)
        return await method(*args, **kwargs)

    async def list(self, **filters: Any) -> list[Any]:
        if isinstance(self.client, Client):
            sync_client = self.client
            return await asyncio.to_thread(lambda: list(sync_client.list(**filters)))
        return [summary async for summary in self.client.list(**filters)]

    async def close(self) -> None:
        if isinstance(self.client, Client):
            self.client.close()
        else:
            await self.client.aclose()


@pytest.fixture(params=["sync", "async"])
def client_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def service_url(store_url: str, connection_options: dict[str, object]) -> AsyncIterator[str]:
    """A uvicorn on loopback over this test's store; it writes for ``WRITE_TOKEN`` only."""
    settings = Settings(
        store=store_url,
        store_options=dict(connection_options),
        index_refresh_seconds=0,
        tokens=f"{WRITE_TOKEN}:write,{READ_TOKEN}:read",
    )
    server = UvicornThread(create_app(settings))
    await asyncio.to_thread(server.start)
    try:
        yield server.base_url
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def make_api(
    client_kind: str, service_url: str
) -> AsyncIterator[Callable[..., Awaitable[ClientUnderTest]]]:
    async with AsyncExitStack() as stack:

        async def make(token: str | None = WRITE_TOKEN, **options: Any) -> ClientUnderTest:
            api = ClientUnderTest(client_kind, service_url, token, **options)
            stack.push_async_callback(api.close)
            return api

        yield make


@pytest.fixture
async def api(make_api: Callable[..., Awaitable[ClientUnderTest]]) -> ClientUnderTest:
    return await make_api()
