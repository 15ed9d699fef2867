"""Both clients on a sharded snapshot (written by three ranks with ``Recorder.snapshot_shard``)
over a real uvicorn (local and S3 stores): listed with its world size and ranks, and read one
rank's shard at a time with ``rank=``; without it, ShardedSnapshotError says to pass one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.client import AsyncClient, Client
from gradvault.core import (
    ClientRequestError,
    InvalidArgumentError,
    ShardedSnapshotError,
    ShardSummary,
    open_store,
)
from gradvault.core.records.safetensors_file import record_from_safetensors
from gradvault.service import Settings, create_app
from tests.service.conftest import UvicornThread, make_record
from tests.sharded_writes import PARAMS, rank_nbytes, rank_record, write_sharded

READ_TOKEN = "sharded-client-read-token"


@pytest.fixture
async def written(store_url: str, connection_options: dict) -> tuple[str, str]:
    """A sharded snapshot of three ranks, then one written whole: their ids."""
    sharded = await asyncio.to_thread(
        write_sharded, store_url, world_size=3, run="ddp", step=7, **connection_options
    )
    store = open_store(store_url, **connection_options)
    try:
        whole = await store.write_snapshot(make_record(1), run="ddp", step=8)
    finally:
        await store.close()
    return sharded, whole.id


@pytest.fixture
async def service_url(store_url: str, connection_options: dict) -> AsyncIterator[str]:
    settings = Settings(
        store=store_url,
        store_options=dict(connection_options),
        index_refresh_seconds=0,
        tokens=f"{READ_TOKEN}:read",
    )
    server = UvicornThread(create_app(settings))
    await asyncio.to_thread(server.start)
    try:
        yield server.base_url
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture(params=["sync", "async"])
async def call(request: pytest.FixtureRequest, service_url: str) -> AsyncIterator[Any]:
    """``await call(name, *args, **kwargs)``: the method of a Client (run in a thread) or an
    AsyncClient; ``"list"`` gives a list."""
    if request.param == "sync":
        client = Client(service_url, READ_TOKEN)

        async def sync_call(name: str, *args: Any, **kwargs: Any) -> Any:
            if name == "list":
                return await asyncio.to_thread(lambda: list(client.list(*args, **kwargs)))
            return await asyncio.to_thread(getattr(client, name), *args, **kwargs)

        yield sync_call
        client.close()
    else:
        async_client = AsyncClient(service_url, READ_TOKEN)

        async def async_call(name: str, *args: Any, **kwargs: Any) -> Any:
            if name == "list":
                return [summary async for summary in async_client.list(*args, **kwargs)]
            return await getattr(async_client, name)(*args, **kwargs)

        yield async_call
        await async_client.aclose()


async def test_the_listing_has_the_world_size_and_each_rank(call, written):
    sharded, whole = written
    newest, with_ranks = await call("list")
    assert (newest.id, newest.world_size, newest.shards) == (whole, None, ())
    assert (with_ranks.id, with_ranks.world_size, with_ranks.num_params) == (sharded, 3, 6)
    assert with_ranks.shards == tuple(
        ShardSummary(
            rank=r,
            device="cpu",
            backend="numpy",
            compression=None,
            nbytes=rank_nbytes(r),
            num_params=2,
        )
        for r in range(3)
    )
    detail = await call("info", sharded)
    assert (detail["world_size"], len(detail["shards"]), detail["gradients"]) == (3, 3, [])
    shard = await call("info", sharded, rank=1)
    assert (shard["rank"], shard["world_size"], shard["nbytes"]) == (1, 3, rank_nbytes(1))


async def test_fetch_restore_and_download_take_one_rank(call, written, tmp_path: Path):
    sharded, _ = written
    record = await call("fetch", sharded, rank=1)
    assert record.metadata["snapshot"]["rank"] == 1
    for got, want in zip(record, rank_record(1), strict=True):
        assert got.param_id == want.param_id
        np.testing.assert_array_equal(got.array, want.array)

    grads = await call("restore", sharded, "cpu", rank=2)
    weight = grads.get(PARAMS[0][0])
    assert weight is not None and weight.shape == (3, 6)
    np.testing.assert_array_equal(weight.numpy(), next(iter(rank_record(2))).array)

    path = await call("download", sharded, tmp_path / "rank0.safetensors", rank=0)
    downloaded = record_from_safetensors(Path(path).read_bytes())
    assert [e.nbytes for e in downloaded] == [e.nbytes for e in rank_record(0)]


async def test_a_whole_read_of_a_sharded_snapshot_or_a_wrong_rank_is_refused(
    call, written, tmp_path: Path
):
    sharded, whole = written
    for name, args in (
        ("fetch", (sharded,)),
        ("restore", (sharded, "cpu")),
        ("download", (sharded, tmp_path / "all.safetensors")),
    ):
        with pytest.raises(
            ShardedSnapshotError, match=r"sharded over 3 ranks: pass rank= \(0\.\.2\)"
        ):
            await call(name, *args)
    assert not (tmp_path / "all.safetensors").exists()
    with pytest.raises(ClientRequestError, match="ranks 0..2") as outside:
        await call("fetch", sharded, rank=3)
    assert (outside.value.status, outside.value.error) == (422, "InvalidArgumentError")
    with pytest.raises(ClientRequestError, match="not sharded"):
        await call("info", whole, rank=0)
    with pytest.raises(InvalidArgumentError, match="rank must be an int >= 0"):
        await call("fetch", sharded, rank=True)
