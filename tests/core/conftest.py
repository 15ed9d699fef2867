"""Fixtures for the store tests: a local folder and an S3 server (moto) on loopback."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

from gradvault.core.store import SnapshotStore, open_store

S3_BUCKET = "gradvault-test"
S3_CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3-protocol server (moto) on 127.0.0.1, a free port, with one empty bucket."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=S3_CREDENTIALS["region"],
        aws_access_key_id=S3_CREDENTIALS["access_key_id"],
        aws_secret_access_key=S3_CREDENTIALS["secret_access_key"],
    ).create_bucket(Bucket=S3_BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture(params=["local", "s3"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def store_url(store_kind: str, tmp_path, request: pytest.FixtureRequest) -> str:
    """Where this test's store lives: a fresh folder, or a fresh prefix in the bucket."""
    if store_kind == "local":
        return str(tmp_path / "store")
    return f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/store"


@pytest.fixture
def connection_options(store_kind: str, request: pytest.FixtureRequest) -> dict[str, object]:
    """What opening this test's store needs besides its URL: the S3 server's address."""
    if store_kind != "s3":
        return {}
    endpoint = request.getfixturevalue("s3_endpoint")
    return {"endpoint": endpoint, "allow_http": True, **S3_CREDENTIALS}


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
def boto3_s3(s3_endpoint: str):
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=S3_CREDENTIALS["region"],
        aws_access_key_id=S3_CREDENTIALS["access_key_id"],
        aws_secret_access_key=S3_CREDENTIALS["secret_access_key"],
    )
