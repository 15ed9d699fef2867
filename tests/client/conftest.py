"""Both clients against a real uvicorn on 127.0.0.1 over a local and an S3 store.

One service per store kind serves the whole test session (``service``, started at the
first test that needs it): tests keep apart by run names of their own (``run_named``) and
look only at their own snapshots. ``api`` is a :class:`ClientUnderTest` for the blocking or
the asyncio client (the ``client_kind`` parameter), so one test body checks both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import pytest

from gradvault.client import AsyncClient, Client
from gradvault.service import Settings, create_app
from tests.conftest import S3_BUCKET, S3_CREDENTIALS
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


@dataclass(frozen=True)
class SharedService:
    """A uvicorn on loopback over ``store_url``; it writes for ``WRITE_TOKEN`` only."""

    base_url: str
    store_url: str
    store_options: dict[str, object] = field(default_factory=dict)


def serve(store_url: str, store_options: dict[str, object]) -> Iterator[SharedService]:
    settings = Settings(
        store=store_url,
        store_options=dict(store_options),
        index_refresh_seconds=0,
        tokens=f"{WRITE_TOKEN}:write,{READ_TOKEN}:read",
    )
    server = UvicornThread(create_app(settings))
    server.start()
    try:
        yield SharedService(server.base_url, store_url, dict(store_options))
    finally:
        server.stop()


@pytest.fixture(scope="session")
def local_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedService]:
    """The session's service over a local folder."""
    yield from serve(str(tmp_path_factory.mktemp("client-service") / "store"), {})


@pytest.fixture(scope="session")
def s3_service(s3_endpoint: str) -> Iterator[SharedService]:
    """The session's service over a prefix of its own in the S3 bucket."""
    options: dict[str, object] = {"endpoint": s3_endpoint, "allow_http": True, **S3_CREDENTIALS}
    yield from serve(f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/client-service", options)


@pytest.fixture
def service(store_kind: str, request: pytest.FixtureRequest) -> SharedService:
    """The session's service over this test's kind of store."""
    return request.getfixturevalue(f"{store_kind}_service")


@pytest.fixture
def service_url(service: SharedService) -> str:
    return service.base_url


@pytest.fixture
def run_named() -> Callable[[str], str]:
    """``run_named("paged")``: the same run name each time this test asks, and one no other
    test on the shared service uses."""
    suffix = uuid.uuid4().hex[:12]
    return lambda name: f"{name}-{suffix}"


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
