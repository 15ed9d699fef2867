"""Fixtures shared by every test package: an S3 server (moto) on loopback, store locations."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from moto.server import ThreadedMotoServer

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
