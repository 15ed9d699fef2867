"""The shared suite: health, listing, manifests and deletion on every store, both ways served."""

from __future__ import annotations

import pytest

from .conftest import make_record


async def test_healthz_and_readyz_answer_ok(service):
    async with service.client() as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        assert (await client.get("/readyz")).json() == {"status": "ok"}


async def test_listing_pages_newest_first_with_filters(service, direct_store):
    written = [
        await direct_store.write_snapshot(make_record(i), run="a" if i % 2 else "b", step=i)
        for i in range(5)
    ]
    async with service.client() as client:
        first = (await client.get("/v1/snapshots", params={"limit": 2})).json()
        assert [s["id"] for s in first["data"]] == [written[4].id, written[3].id]
        rest = (
            await client.get("/v1/snapshots", params={"limit": 10, "cursor": first["next_cursor"]})
        ).json()
        assert [s["id"] for s in rest["data"]] == [w.id for w in reversed(written[:3])]
        assert rest["next_cursor"] is None
        runs = (await client.get("/v1/snapshots", params={"run": "a", "step_min": 2})).json()
        assert [s["id"] for s in runs["data"]] == [written[3].id]
        assert runs["data"][0] == {
            "id": written[3].id,
            "run": "a",
            "step": 3,
            "created_at": written[3].created_at,
            "nbytes": written[3].nbytes,
            "num_params": 2,
        }


@pytest.mark.parametrize("cursor", ["nonsense", "", "01arz3ndektsv4rrffq69g5fav", "a" * 200])
async def test_a_cursor_the_service_did_not_make_is_400(service, cursor):
    async with service.client() as client:
        response = await client.get("/v1/snapshots", params={"cursor": cursor})
    assert response.status_code == 400
    assert response.json()["error"] == "InvalidCursorError"


async def test_manifest_names_every_gradient(service, direct_store):
    record = make_record(7)
    info = await direct_store.write_snapshot(record, run="r", step=3, tags={"k": "v"})
    async with service.client() as client:
        detail = (await client.get(f"/v1/snapshots/{info.id}")).json()
    assert detail["id"] == info.id and detail["tags"] == {"k": "v"}
    assert [(g["param_id"], g["name"], g["dtype"], g["shape"]) for g in detail["gradients"]] == [
        (str(e.param_id), e.name, e.dtype, list(e.shape)) for e in record
    ]


async def test_unknown_snapshot_is_404_with_its_error_name(service):
    async with service.client() as client:
        response = await client.get("/v1/snapshots/01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert response.status_code == 404
    body = response.json()
    assert body["error"] == "SnapshotNotFoundError"
    assert "01ARZ3NDEKTSV4RRFFQ69G5FAV" in body["detail"]


async def test_delete_removes_it_from_store_and_listing(service, direct_store):
    info = await direct_store.write_snapshot(make_record(1), run="r", step=1)
    async with service.client() as client:
        assert [s["id"] for s in (await client.get("/v1/snapshots")).json()["data"]] == [info.id]
        response = await client.delete(f"/v1/snapshots/{info.id}")
        assert response.status_code == 204 and response.content == b""
        assert (await client.get("/v1/snapshots")).json()["data"] == []
        assert (await client.delete(f"/v1/snapshots/{info.id}")).status_code == 404
    assert await direct_store.list() == []
