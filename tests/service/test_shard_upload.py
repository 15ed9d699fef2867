"""``POST /v1/snapshots/{id}/shards``: each rank of a job uploads its shard through the
service, with the clients' ``push_shard`` (blocking and asyncio) or plain HTTP, on a local
and an S3 store; the snapshot commits once every rank is in. Malformed bodies, ranks and
world sizes that do not fit, fields the ranks disagree on, a second write of a rank and
tokens without write access get 4xx answers that name why, and lose nothing: the ranks
already in stay, and the refused rank can upload again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest

from gradvault.client import AsyncClient, Client
from gradvault.core import (
    AuthError,
    InvalidArgumentError,
    InvalidSnapshotIdError,
    ShardInfo,
    new_snapshot_id,
    open_store,
)
from gradvault.core.records.safetensors_file import safetensors_chunks
from tests.sharded_writes import rank_nbytes, rank_record

from .conftest import store_keys

WRITE_TOKEN = "shard-write-token"
READ_TOKEN = "shard-read-token"


@pytest.fixture
def serving() -> str:
    return "uvicorn"  # the blocking client needs a real address


@pytest.fixture
async def service(make_service):
    return await make_service(tokens=f"{WRITE_TOKEN}:write,{READ_TOKEN}:read")


def _body(rank: int, **options: bool) -> bytes:
    return b"".join(bytes(chunk) for chunk in safetensors_chunks(rank_record(rank, **options)))


def _query(rank: int, world_size: int = 3, **overrides: Any) -> dict[str, Any]:
    return {"rank": rank, "world_size": world_size, "run": "ddp", "step": 7} | overrides


async def _upload(client, snapshot_id: str, rank: int, body: bytes | None = None, **query: Any):
    return await client.post(
        f"/v1/snapshots/{snapshot_id}/shards",
        params=_query(rank, **query),
        content=_body(rank) if body is None else body,
    )


async def _assert_ranks_read_back(
    store_url: str, connection_options: dict, snapshot_id: str, world_size: int
) -> None:
    """The snapshot is committed and each rank's gradients are the ones it uploaded."""
    store = open_store(store_url, **connection_options)
    try:
        info = await store.info(snapshot_id)
        assert info["world_size"] == world_size
        for rank in range(world_size):
            record = await store.read_snapshot(snapshot_id, rank=rank)
            for got, want in zip(record, rank_record(rank), strict=True):
                assert got.param_id == want.param_id
                np.testing.assert_array_equal(got.array, want.array)
    finally:
        await store.close()


@pytest.mark.parametrize("client_kind", ["sync", "async"])
async def test_every_rank_pushes_its_shard_and_the_last_commits(
    service, store_url, connection_options, client_kind
):
    snapshot_id = new_snapshot_id()  # rank 0 draws it and hands it to the others

    async def rank_pushes(rank: int) -> ShardInfo:
        options = {
            "snapshot_id": snapshot_id,
            "rank": rank,
            "world_size": 3,
            "run": "ddp",
            "step": 7,
            "tags": {"job": "a"},
        }
        if client_kind == "sync":
            with Client(service.base_url, WRITE_TOKEN) as client:
                return await asyncio.to_thread(client.push_shard, rank_record(rank), **options)
        async with AsyncClient(service.base_url, WRITE_TOKEN) as async_client:
            return await async_client.push_shard(rank_record(rank), **options)

    shards = await asyncio.gather(*(rank_pushes(rank) for rank in range(3)))
    assert [(s.id, s.rank, s.world_size) for s in shards] == [(snapshot_id, r, 3) for r in range(3)]
    assert [s.nbytes for s in shards] == [rank_nbytes(r) for r in range(3)]
    committed = [s for s in shards if s.committed]
    assert committed, shards
    snapshot = committed[0].snapshot
    assert snapshot is not None
    assert (snapshot.id, snapshot.world_size, snapshot.num_params) == (snapshot_id, 3, 6)
    assert [shard.nbytes for shard in snapshot.shards] == [rank_nbytes(r) for r in range(3)]
    assert all(s.snapshot is None for s in shards if not s.committed)
    await _assert_ranks_read_back(store_url, connection_options, snapshot_id, 3)
    async with service.client(READ_TOKEN) as client:
        listing = (await client.get("/v1/snapshots")).json()["data"]
        assert [(s["id"], s["world_size"]) for s in listing] == [(snapshot_id, 3)]
        detail = (await client.get(f"/v1/snapshots/{snapshot_id}")).json()
        assert detail["tags"] == {"job": "a"}


async def test_the_answer_says_when_the_upload_committed(service):
    snapshot_id = new_snapshot_id()
    async with service.client(WRITE_TOKEN) as client:
        first = await _upload(client, snapshot_id, 0, world_size=2)
        assert first.status_code == 201, first.text
        assert first.json()["committed"] is False and first.json()["snapshot"] is None
        assert "location" not in first.headers
        last = await _upload(client, snapshot_id, 1, world_size=2)
        assert last.status_code == 201, last.text
        body = last.json()
        assert (body["committed"], body["rank"], body["nbytes"]) == (True, 1, rank_nbytes(1))
        assert body["snapshot"]["world_size"] == 2
        assert last.headers["location"] == f"/v1/snapshots/{snapshot_id}"


async def test_tokens_without_write_access_are_refused_and_nothing_is_written(
    service, store_url, connection_options
):
    snapshot_id = new_snapshot_id()
    async with service.client(READ_TOKEN) as reader, service.client() as stranger:
        refused = await _upload(reader, snapshot_id, 0, world_size=1)
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"] == "PermissionDeniedError"
        anonymous = await _upload(stranger, snapshot_id, 0, world_size=1)
        assert anonymous.status_code == 401
    assert await store_keys(store_url, connection_options) == []
    with Client(service.base_url, READ_TOKEN) as client:
        with pytest.raises(AuthError, match="HTTP 403"):
            await asyncio.to_thread(
                client.push_shard,
                rank_record(0),
                snapshot_id=snapshot_id,
                rank=0,
                world_size=1,
                run="ddp",
                step=7,
            )
    async with service.client(WRITE_TOKEN) as client:
        assert (await _upload(client, snapshot_id, 0, world_size=1)).status_code == 201
    await _assert_ranks_read_back(store_url, connection_options, snapshot_id, 1)


async def test_refused_uploads_lose_nothing_and_the_rank_can_upload_again(
    service, store_url, connection_options
):
    snapshot_id = new_snapshot_id()
    async with service.client(WRITE_TOKEN) as client:
        assert (await _upload(client, snapshot_id, 0)).status_code == 201
        cases = [
            # (rank, body, query overrides, status, error, words in the detail)
            (1, b"not a safetensors file", {}, 400, "InvalidUploadError", "safetensors"),
            (1, _body(1)[:-3], {}, 400, "InvalidUploadError", "ends early"),
            (3, None, {}, 422, "InvalidArgumentError", "rank must be an int in 0..2"),
            (1, None, {"world_size": 2}, 422, "InvalidArgumentError", "world_size 3"),
            (1, None, {"step": 8}, 422, "InvalidFieldError", "step"),
            (1, None, {"tags": json.dumps({"k": "v"})}, 422, "InvalidFieldError", "tags"),
            (1, None, {"run": "other"}, 422, "InvalidFieldError", "run"),
            (0, None, {}, 422, "InvalidArgumentError", "rank 0"),  # rank 0 a second time
            (1, None, {"world_size": 0}, 422, "RequestValidationError", "world_size"),
            (-1, None, {}, 422, "RequestValidationError", "rank"),
            (1, None, {"tags": "[1]"}, 422, "InvalidFieldError", "tags is a JSON object"),
        ]
        for rank, body, overrides, status, error, words in cases:
            refused = await _upload(client, snapshot_id, rank, body, **overrides)
            assert refused.status_code == status, (rank, overrides, refused.text)
            assert refused.json()["error"] == error, refused.text
            assert words in refused.json()["detail"], refused.text
            assert await store_keys(store_url, connection_options) == []  # nothing committed
        bad_id = await client.post(
            "/v1/snapshots/not-an-id/shards", params=_query(1), content=_body(1)
        )
        assert bad_id.status_code == 400 and bad_id.json()["error"] == "InvalidSnapshotIdError"
        for rank in (1, 2):
            again = await _upload(client, snapshot_id, rank)
            assert again.status_code == 201, again.text
        assert again.json()["committed"] is True
        late = await _upload(client, snapshot_id, 2)
        assert late.status_code == 422 and "committed already" in late.json()["detail"]
    await _assert_ranks_read_back(store_url, connection_options, snapshot_id, 3)


async def test_an_upload_over_the_limit_is_refused_with_413(
    make_service, store_url, connection_options
):
    service = await make_service(tokens=f"{WRITE_TOKEN}:write", max_upload_bytes=len(_body(0)) - 1)
    snapshot_id = new_snapshot_id()
    async with service.client(WRITE_TOKEN) as client:
        refused = await _upload(client, snapshot_id, 0, world_size=1)
        assert refused.status_code == 413, refused.text
        assert refused.json()["error"] == "UploadTooLargeError"
    assert await store_keys(store_url, connection_options) == []


async def test_the_client_checks_the_id_rank_and_world_size_before_any_request(service):
    async with AsyncClient(service.base_url, WRITE_TOKEN, retries=0) as client:
        fields = {"run": "ddp", "step": 7}
        with pytest.raises(InvalidArgumentError, match="rank must be an int in 0..1"):
            await client.push_shard(
                rank_record(0), snapshot_id=new_snapshot_id(), rank=2, world_size=2, **fields
            )
        with pytest.raises(InvalidArgumentError, match="world_size must be an int >= 1"):
            await client.push_shard(
                rank_record(0), snapshot_id=new_snapshot_id(), rank=0, world_size=0, **fields
            )
        with pytest.raises(InvalidSnapshotIdError):
            await client.push_shard(
                rank_record(0), snapshot_id="nope", rank=0, world_size=1, **fields
            )
