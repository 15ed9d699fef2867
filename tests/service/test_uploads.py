"""Uploads: every malformed kind is a 4xx that leaves nothing in the store or the spool."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import boto3
import pytest

from tests.conftest import S3_BUCKET, S3_CREDENTIALS

from .conftest import make_record, store_keys
from .safetensors_bodies import good_file, good_tensors, malformed_files
from .spy import spy_on_store

MAX_HEADER_BYTES = 4096
MAX_UPLOAD_BYTES = 64 * 1024


@pytest.fixture
def serving() -> str:
    return "asgi"  # what is refused is decided by the app; uvicorn gets its own cases below


@pytest.fixture
async def uploads(make_service, tmp_path, direct_store):
    """A service with small limits over a store that already holds one snapshot."""
    spool = tmp_path / "spool"
    spool.mkdir()
    await direct_store.write_snapshot(make_record(), run="before", step=0)
    return await make_service(
        max_header_bytes=MAX_HEADER_BYTES, max_upload_bytes=MAX_UPLOAD_BYTES, spool_dir=str(spool)
    )


def _uncommitted(store_url: str, connection_options: dict, committed: list[str]) -> list[str]:
    """What the store holds besides its committed snapshots: staging, partial writes."""
    if not store_url.startswith("s3://"):
        staging = Path(store_url) / ".staging"
        return sorted(os.listdir(staging)) if staging.exists() else []
    prefix = store_url.removeprefix(f"s3://{S3_BUCKET}/") + "/snapshots/"
    client = boto3.client(
        "s3",
        endpoint_url=connection_options["endpoint"],
        region_name=S3_CREDENTIALS["region"],
        aws_access_key_id=S3_CREDENTIALS["access_key_id"],
        aws_secret_access_key=S3_CREDENTIALS["secret_access_key"],
    )
    keys = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=prefix):
        keys.extend(item["Key"] for item in page.get("Contents", []))
    return sorted(
        key
        for key in keys
        if key != prefix + "zarr.json" and key[len(prefix) :].split("/")[0] not in committed
    )


async def _assert_nothing_left(service, store_url, connection_options, before: list[str]):
    after = await store_keys(store_url, connection_options)
    assert after == before
    assert _uncommitted(store_url, connection_options, after) == []
    assert os.listdir(service.settings.spool_dir) == []


@pytest.mark.parametrize("kind", sorted(malformed_files(MAX_HEADER_BYTES)))
async def test_a_malformed_upload_is_400_and_leaves_nothing(
    uploads, kind, store_url, connection_options
):
    before = await store_keys(store_url, connection_options)
    body = malformed_files(MAX_HEADER_BYTES)[kind]
    async with uploads.client() as client:
        response = await client.post("/v1/snapshots", params={"run": "r", "step": 1}, content=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == "InvalidUploadError"
    assert "safetensors file" in response.json()["detail"]
    await _assert_nothing_left(uploads, store_url, connection_options, before)


@pytest.mark.parametrize("kind", ["truncated-in-data", "trailing-bytes", "header-over-the-limit"])
async def test_a_malformed_upload_without_content_length_is_400_too(
    uploads, kind, store_url, connection_options
):
    before = await store_keys(store_url, connection_options)
    body = malformed_files(MAX_HEADER_BYTES)[kind]

    async def chunked():
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    async with uploads.client() as client:
        response = await client.post(
            "/v1/snapshots", params={"run": "r", "step": 1}, content=chunked()
        )
    assert response.status_code == 400, response.text
    await _assert_nothing_left(uploads, store_url, connection_options, before)


async def test_a_content_length_over_the_limit_is_413_before_the_body(
    uploads, store_url, connection_options
):
    before = await store_keys(store_url, connection_options)
    spy = await spy_on_store(uploads)
    body = good_file() + bytes(MAX_UPLOAD_BYTES)
    async with uploads.client() as client:
        response = await client.post("/v1/snapshots", params={"run": "r", "step": 1}, content=body)
    assert response.status_code == 413
    assert response.json()["error"] == "UploadTooLargeError"
    assert spy.calls == []
    await _assert_nothing_left(uploads, store_url, connection_options, before)


async def test_a_streamed_body_over_the_limit_is_413(uploads, store_url, connection_options):
    before = await store_keys(store_url, connection_options)
    header, data, _ = good_tensors()

    async def endless():
        yield good_file()
        for _ in range(MAX_UPLOAD_BYTES // 4096 + 2):
            yield bytes(4096)

    async with uploads.client() as client:
        response = await client.post(
            "/v1/snapshots", params={"run": "r", "step": 1}, content=endless()
        )
    assert response.status_code in (400, 413)  # past the declared end, or past the limit
    await _assert_nothing_left(uploads, store_url, connection_options, before)


async def test_a_header_declaring_more_than_the_limit_is_413(
    uploads, store_url, connection_options
):
    before = await store_keys(store_url, connection_options)
    from .safetensors_bodies import PARAM_A, file_bytes

    count = MAX_UPLOAD_BYTES // 4 + 1
    header = {PARAM_A: {"dtype": "F32", "shape": [count], "data_offsets": [0, count * 4]}}
    body = file_bytes(header, b"")

    async def chunked():
        yield body

    async with uploads.client() as client:
        response = await client.post(
            "/v1/snapshots", params={"run": "r", "step": 1}, content=chunked()
        )
    assert response.status_code == 413
    await _assert_nothing_left(uploads, store_url, connection_options, before)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"run": "", "step": 1}, "run"),
        ({"run": "r", "step": -1}, "step"),
        ({"run": "r", "step": 1, "tags": "[1]"}, "tags"),
        ({"run": "r", "step": 1, "tags": '{"a": 1}'}, "tags"),
        ({"step": 1}, "run"),
    ],
)
async def test_bad_run_step_or_tags_are_422_before_the_body_is_read(
    uploads, params, field, store_url, connection_options
):
    before = await store_keys(store_url, connection_options)
    async with uploads.client() as client:
        response = await client.post("/v1/snapshots", params=params, content=good_file())
    assert response.status_code == 422
    assert field in response.json()["detail"]
    await _assert_nothing_left(uploads, store_url, connection_options, before)


class TestOverUvicorn:
    """A client that goes away half way, which only a real server shows."""

    @pytest.fixture
    def serving(self) -> str:
        return "uvicorn"

    @pytest.fixture
    def store_kind(self) -> str:
        return "local"

    async def test_a_body_that_ends_early_leaves_nothing(
        self, uploads, store_url, connection_options
    ):
        before = await store_keys(store_url, connection_options)
        body = good_file()
        host, port = uploads.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as connection:
            connection.sendall(
                b"POST /v1/snapshots?run=r&step=1 HTTP/1.1\r\nHost: x\r\n"
                + f"Content-Length: {len(body) + 1000}\r\n\r\n".encode()
                + body
            )
            connection.shutdown(socket.SHUT_WR)
            reply = await asyncio.to_thread(connection.recv, 65536)
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4")
        deadline = asyncio.get_running_loop().time() + 10
        while os.listdir(uploads.settings.spool_dir):  # the server cleans up after the close
            assert asyncio.get_running_loop().time() < deadline, "spool file left behind"
            await asyncio.sleep(0.01)
        await _assert_nothing_left(uploads, store_url, connection_options, before)


async def test_a_good_upload_is_committed_listed_and_bit_identical(
    uploads, direct_store, store_url, connection_options
):
    _, _, arrays = good_tensors()
    async with uploads.client() as client:
        response = await client.post(
            "/v1/snapshots",
            params={"run": "up", "step": 9, "tags": '{"lr": "0.1"}'},
            content=good_file(),
        )
        assert response.status_code == 201, response.text
        summary = response.json()
        assert response.headers["location"] == f"/v1/snapshots/{summary['id']}"
        assert summary["run"] == "up" and summary["step"] == 9 and summary["num_params"] == 2
        listed = (await client.get("/v1/snapshots", params={"run": "up"})).json()["data"]
        assert [s["id"] for s in listed] == [summary["id"]]
    record = await direct_store.read_snapshot(summary["id"])
    for entry in record:
        assert entry.array.tobytes() == arrays[str(entry.param_id)].tobytes()
        assert entry.dtype == str(arrays[str(entry.param_id)].dtype)
    assert {entry.name for entry in record} == {"fc.weight", "fc.b"}
    assert (await direct_store.info(summary["id"]))["tags"] == {"lr": "0.1"}
    assert os.listdir(uploads.settings.spool_dir) == []
