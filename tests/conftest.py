"""Fixtures shared by every test package: an S3 server (SeaweedFS) on loopback, store locations.

One SeaweedFS process serves the whole test session of each pytest-xdist worker
(``s3_server``, started at the first test that needs it, stopped at the end); tests keep
apart by a fresh prefix each in ``S3_BUCKET``. No test needs an S3 mock's fault injection
(moto is gone): faults are injected into the store's backend
(tests/core/store/test_store_races.py patches its requests), objects are damaged through
``boto3`` on the real server, and an unreachable endpoint is a closed port.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.s3server import SeaweedFS

S3_BUCKET = "gradvault-test"
S3_CREDENTIALS = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[SeaweedFS]:
    """SeaweedFS on 127.0.0.1 (free ports, its own data folder) with ``S3_BUCKET`` created.

    It checks signatures: only ``S3_CREDENTIALS`` may use it.
    """
    with SeaweedFS(
        bucket=S3_BUCKET,
        access_key_id=S3_CREDENTIALS["access_key_id"],
        secret_access_key=S3_CREDENTIALS["secret_access_key"],
    ) as server:
        yield server


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: SeaweedFS) -> str:
    """The S3 server's URL, ``http://127.0.0.1:<port>``."""
    return s3_server.endpoint


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
