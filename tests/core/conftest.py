"""Fixtures for the store tests; the S3 server and store locations are in tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest

from gradvault.core.store import SnapshotStore, open_store
from tests.conftest import S3_BUCKET, S3_CREDENTIALS
from tests.s3server import SeaweedFS

__all__ = ["S3_BUCKET", "S3_CREDENTIALS"]


@pytest.fixture
async def make_store(
    store_url: str, connection_options: dict[str, object]
) -> AsyncIterator[Callable[..., SnapshotStore]]:
    """Opens stores at this test's location (each with its own options); closes them after."""
    opened: list[SnapshotStore] = []

    def factory(**options: object) -> SnapshotStore:
        store = open_store(store_url, **connection_options, **options)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def store(make_store: Callable[..., SnapshotStore]) -> SnapshotStore:
    """A store with small chunks and a small pack threshold, so tiny data exercises both."""
    return make_store(chunk_bytes=4096, pack_threshold=512)


@pytest.fixture
def boto3_s3(s3_server: SeaweedFS):
    """A boto3 client of the session's S3 server, to look at or damage objects directly."""
    return s3_server.client()
