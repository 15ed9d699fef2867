"""A sharded snapshot written by several ranks (``Recorder.snapshot_shard``), as the service
shows it: the listing and the detail carry ``world_size`` and one entry per rank, a rank's
shard is read with ``?rank=``, and a snapshot written whole is described as it always was."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from gradvault.core.records.safetensors_file import record_from_safetensors
from tests.sharded_writes import PARAMS, rank_nbytes, rank_record, write_sharded

from .conftest import make_record

SUMMARY_KEYS = ["id", "run", "step", "created_at", "nbytes", "num_params"]
DETAIL_KEYS = [
    *SUMMARY_KEYS,
    *("device", "backend", "tags", "metadata", "compression", "gradients", "world_size"),
]


@pytest.fixture
def serving() -> str:
    return "asgi"  # the documents are the app's; test_sharded.py serves through uvicorn too


async def _sharded(store_url: str, connection_options: dict, world_size: int = 3) -> str:
    return await asyncio.to_thread(
        write_sharded,
        store_url,
        world_size=world_size,
        run="ddp",
        step=7,
        tags={"job": "a"},
        **connection_options,
    )


async def test_the_listing_carries_world_size_and_each_rank(
    service, direct_store, store_url, connection_options
):
    snapshot_id = await _sharded(store_url, connection_options)
    whole = await direct_store.write_snapshot(make_record(9), run="ddp", step=8)
    async with service.client() as client:
        listing = (await client.get("/v1/snapshots")).json()
    newest, sharded = listing["data"]
    assert newest["id"] == whole.id
    assert list(newest) == SUMMARY_KEYS  # a snapshot written whole: as it always was
    assert sharded["id"] == snapshot_id
    assert list(sharded) == [*SUMMARY_KEYS, "world_size", "shards"]
    assert sharded["world_size"] == 3
    assert sharded["num_params"] == 6
    assert sharded["nbytes"] == sum(rank_nbytes(r) for r in range(3))
    assert sharded["shards"] == [
        {
            "rank": r,
            "device": "cpu",
            "backend": "numpy",
            "compression": None,
            "nbytes": rank_nbytes(r),
            "num_params": 2,
        }
        for r in range(3)
    ]


async def test_the_detail_of_a_sharded_snapshot_and_of_each_rank(
    service, direct_store, store_url, connection_options
):
    snapshot_id = await _sharded(store_url, connection_options)
    whole = await direct_store.write_snapshot(make_record(9), run="ddp", step=8)
    async with service.client() as client:
        detail = (await client.get(f"/v1/snapshots/{snapshot_id}")).json()
        assert list(detail) == [*DETAIL_KEYS, "shards"]
        assert (detail["world_size"], detail["gradients"], detail["tags"]) == (3, [], {"job": "a"})
        assert [shard["nbytes"] for shard in detail["shards"]] == [rank_nbytes(r) for r in range(3)]

        shard = (await client.get(f"/v1/snapshots/{snapshot_id}", params={"rank": 2})).json()
        assert list(shard) == [*DETAIL_KEYS, "rank"]
        assert (shard["id"], shard["rank"], shard["world_size"]) == (snapshot_id, 2, 3)
        assert (shard["nbytes"], shard["num_params"]) == (rank_nbytes(2), 2)
        assert [(g["param_id"], g["name"], g["shape"]) for g in shard["gradients"]] == [
            (str(pid), name, shape)
            for (pid, name), shape in zip(PARAMS, ([3, 6], [5]), strict=True)
        ]

        plain = await client.get(f"/v1/snapshots/{whole.id}")
        assert list(plain.json()) == DETAIL_KEYS and plain.json()["world_size"] is None


async def test_a_rank_outside_the_snapshot_or_on_a_whole_one_is_refused(
    service, direct_store, store_url, connection_options
):
    snapshot_id = await _sharded(store_url, connection_options, world_size=2)
    whole = await direct_store.write_snapshot(make_record(9), run="ddp", step=8)
    async with service.client() as client:
        for path in ("", "/safetensors", f"/grads/{PARAMS[0][0]}"):
            outside = await client.get(f"/v1/snapshots/{snapshot_id}{path}", params={"rank": 2})
            assert outside.status_code == 422, (path, outside.text)
            assert outside.json()["error"] == "InvalidArgumentError"
            assert "ranks 0..1" in outside.json()["detail"]
            not_sharded = await client.get(f"/v1/snapshots/{whole.id}{path}", params={"rank": 0})
            assert not_sharded.status_code == 422, (path, not_sharded.text)
            assert "not sharded" in not_sharded.json()["detail"]
            negative = await client.get(f"/v1/snapshots/{snapshot_id}{path}", params={"rank": -1})
            assert negative.status_code == 422


async def test_a_rank_s_shard_downloads_and_the_whole_is_refused_naming_rank(
    service, store_url, connection_options
):
    snapshot_id = await _sharded(store_url, connection_options)
    async with service.client() as client:
        for rank in range(3):
            response = await client.get(
                f"/v1/snapshots/{snapshot_id}/safetensors", params={"rank": rank}
            )
            assert response.status_code == 200, response.text
            assert (
                f"{snapshot_id}-rank{rank}.safetensors" in response.headers["content-disposition"]
            )
            record = record_from_safetensors(response.content)
            expected = rank_record(rank)
            assert [e.param_id for e in record] == [e.param_id for e in expected]
            for got, want in zip(record, expected, strict=True):
                np.testing.assert_array_equal(got.array, want.array)
            assert record.metadata["snapshot"]["rank"] == rank

            pid = PARAMS[0][0]
            raw = await client.get(
                f"/v1/snapshots/{snapshot_id}/grads/{pid}", params={"rank": rank}
            )
            assert raw.status_code == 200, raw.text
            assert raw.headers["x-gradvault-shape"] == f"3,{4 + rank}"
            assert raw.content == bytes(next(iter(expected)).data)
        refused = await client.get(f"/v1/snapshots/{snapshot_id}/safetensors")
        assert refused.status_code == 409
        assert refused.json()["error"] == "ShardedSnapshotError"
        assert "pass ?rank= (0..2)" in refused.json()["detail"]
