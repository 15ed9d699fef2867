"""A sharded snapshot (written by several ranks) through the service: listed, described,
readable shard by shard through the Zarr view, refused with 409 where a route serves one
snapshot's gradients whole."""

from __future__ import annotations

from gradvault.core import new_snapshot_id

from .conftest import make_record


async def _sharded(direct_store) -> str:
    snapshot_id = new_snapshot_id()
    for rank in range(2):
        await direct_store.write_shard(
            make_record(rank),
            snapshot_id=snapshot_id,
            rank=rank,
            world_size=2,
            run="ddp",
            step=5,
            tags={"k": "v"},
        )
    return snapshot_id


async def test_a_sharded_snapshot_is_listed_and_described(service, direct_store):
    snapshot_id = await _sharded(direct_store)
    whole = await direct_store.write_snapshot(make_record(9), run="ddp", step=6)
    async with service.client() as client:
        listing = (await client.get("/v1/snapshots")).json()
        assert [s["id"] for s in listing["data"]] == [whole.id, snapshot_id]
        assert listing["data"][1]["num_params"] == 4
        response = await client.get(f"/v1/snapshots/{snapshot_id}")
        assert response.status_code == 200, response.text
        detail = response.json()
        assert (detail["run"], detail["step"], detail["tags"]) == ("ddp", 5, {"k": "v"})
        assert (detail["world_size"], detail["gradients"]) == (2, [])
        assert (await client.get(f"/v1/snapshots/{whole.id}")).json()["world_size"] is None
        shard = await client.get(f"/v1/zarr/snapshots/{snapshot_id}/ranks/1/zarr.json")
        assert shard.status_code == 200
        assert shard.json()["attributes"]["gradvault"]["shard"] == {"rank": 1, "world_size": 2}
        page = await client.get(f"/ui/snapshots/{snapshot_id}")
        assert page.status_code == 200, page.text


async def test_whole_snapshot_routes_answer_409_naming_the_sharding(service, direct_store):
    snapshot_id = await _sharded(direct_store)
    param_id = next(iter(make_record(0))).param_id
    async with service.client() as client:
        for path in ("/safetensors", f"/grads/{param_id}"):
            response = await client.get(f"/v1/snapshots/{snapshot_id}{path}")
            assert response.status_code == 409, (path, response.text)
            body = response.json()
            assert body["error"] == "ShardedSnapshotError"
            assert "sharded over 2 ranks" in body["detail"]
        deleted = await client.delete(f"/v1/snapshots/{snapshot_id}")
        assert deleted.status_code == 204, deleted.text
        assert (await client.get(f"/v1/snapshots/{snapshot_id}")).status_code == 404
