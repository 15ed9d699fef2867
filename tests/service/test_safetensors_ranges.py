"""The safetensors download answers one Range, If-Range and If-None-Match with its ETag."""

from __future__ import annotations

import pytest

from tests.service.test_transfers import _record


@pytest.fixture
async def snapshot_file(service, direct_store):
    """A stored snapshot's id and its whole safetensors file, as served."""
    info = await direct_store.write_snapshot(_record(seed=2), run="r", step=1)
    async with service.client() as client:
        whole = await client.get(f"/v1/snapshots/{info.id}/safetensors")
    assert whole.status_code == 200
    return info.id, whole


@pytest.mark.parametrize(
    "spec",
    ["0-0", "0-99", "5-", "100-8999", "8000-", "-1", "-700", "200-200"],
)
async def test_every_range_is_the_same_bytes_as_the_whole_file(service, snapshot_file, spec):
    snapshot_id, whole = snapshot_file
    body, size = whole.content, len(whole.content)
    etag = whole.headers["etag"]
    first, _, last = spec.partition("-")
    if not first:
        start, stop = size - int(last), size
    else:
        start, stop = int(first), (int(last) + 1 if last else size)
    stop = min(stop, size)
    async with service.client() as client:
        part = await client.get(
            f"/v1/snapshots/{snapshot_id}/safetensors",
            headers={"Range": f"bytes={spec}", "If-Range": etag},
        )
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes {start}-{stop - 1}/{size}"
    assert part.headers["etag"] == etag
    assert part.content == body[start:stop]


async def test_the_etag_is_strong_and_stable(service, snapshot_file):
    snapshot_id, whole = snapshot_file
    etag = whole.headers["etag"]
    assert etag.startswith('"st-') and whole.headers["accept-ranges"] == "bytes"
    async with service.client() as client:
        again = await client.get(f"/v1/snapshots/{snapshot_id}/safetensors")
        unchanged = await client.get(
            f"/v1/snapshots/{snapshot_id}/safetensors", headers={"If-None-Match": etag}
        )
    assert again.headers["etag"] == etag
    assert unchanged.status_code == 304 and unchanged.content == b""


async def test_another_etag_in_if_range_gets_the_whole_file(service, snapshot_file):
    snapshot_id, whole = snapshot_file
    async with service.client() as client:
        answer = await client.get(
            f"/v1/snapshots/{snapshot_id}/safetensors",
            headers={"Range": "bytes=100-", "If-Range": '"st-00000000"'},
        )
    assert answer.status_code == 200
    assert answer.content == whole.content


async def test_a_range_past_the_end_is_416(service, snapshot_file):
    snapshot_id, whole = snapshot_file
    size = len(whole.content)
    async with service.client() as client:
        answer = await client.get(
            f"/v1/snapshots/{snapshot_id}/safetensors", headers={"Range": f"bytes={size}-"}
        )
    assert answer.status_code == 416
    assert answer.headers["content-range"] == f"bytes */{size}"
    assert answer.json()["error"] == "RangeNotSatisfiableError"
