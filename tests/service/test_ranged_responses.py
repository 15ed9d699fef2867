"""Every byte resource answers Range, If-Range, If-None-Match and HEAD by one rule (RFC 9110).

The resources: a gradient (raw and .npy), a snapshot's safetensors file, a key of the Zarr
view (a ``zarr.json`` and a chunk), and the pages' downloads of a gradient and of the
safetensors file.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId

from .test_transfers import _chunk_files, _flip_first_byte, _record

pytestmark = pytest.mark.parametrize("store_kind", ["local"])

BIG = str(ParamId(0x100))  # big.weight: 8000 bytes, two chunks of the test store's 4096

#: each resource's URL, ``{id}`` and ``{chunk}`` filled in; whether it has an ETag
RESOURCES = {
    "gradient": ("/v1/snapshots/{id}/grads/" + BIG, True),
    "gradient-npy": ("/v1/snapshots/{id}/grads/" + BIG + "?format=npy", True),
    "safetensors": ("/v1/snapshots/{id}/safetensors", True),
    "zarr-document": ("/v1/zarr/snapshots/{id}/zarr.json", False),
    "zarr-chunk": ("/v1/zarr/{chunk}", False),
    "page-npy": ("/ui/snapshots/{id}/grads/" + BIG + ".npy", True),
    "page-safetensors": ("/ui/snapshots/{id}/safetensors", True),
}
#: the resources HEAD is asked of (the pages' downloads are links: GET only)
HEAD_RESOURCES = [name for name in RESOURCES if not name.startswith("page-")]


@pytest.fixture
async def urls(direct_store, store_url) -> dict[str, str]:
    """Each resource's URL over one stored snapshot."""
    info = await direct_store.write_snapshot(_record(), run="r", step=1)
    chunk = _chunk_files(store_url, info.id, BIG)[0].relative_to(Path(store_url))
    return {
        name: path.replace("{id}", info.id).replace("{chunk}", chunk.as_posix())
        for name, (path, _) in RESOURCES.items()
    }


async def _whole(client: httpx.AsyncClient, url: str) -> httpx.Response:
    whole = await client.get(url)
    assert whole.status_code == 200, whole.text
    assert whole.headers["accept-ranges"] == "bytes"
    assert len(whole.content) > 100
    return whole


@pytest.mark.parametrize("name", HEAD_RESOURCES)
async def test_head_answers_the_headers_of_the_whole_resource(service, urls, name):
    async with service.client() as client:
        whole = await _whole(client, urls[name])
        size = len(whole.content)
        # a Range is for GET alone (RFC 9110 section 14.2): HEAD ignores it, even one
        # that misses the resource
        for headers in ({}, {"Range": "bytes=0-9"}, {"Range": f"bytes={size}-"}):
            head = await client.head(urls[name], headers=headers)
            assert head.status_code == 200, (headers, head.status_code)
            assert head.content == b""
            assert head.headers["content-length"] == str(size)
            assert head.headers["content-type"] == whole.headers["content-type"]
            assert head.headers.get("etag") == whole.headers.get("etag")
            assert head.headers["accept-ranges"] == "bytes"
        if "etag" in whole.headers:
            unchanged = await client.head(
                urls[name], headers={"If-None-Match": whole.headers["etag"]}
            )
            assert unchanged.status_code == 304


@pytest.mark.parametrize("name", list(RESOURCES))
async def test_if_none_match_star_is_304_for_any_resource_there_is(service, urls, name):
    async with service.client() as client:
        await _whole(client, urls[name])
        unchanged = await client.get(urls[name], headers={"If-None-Match": "*"})
    assert unchanged.status_code == 304
    assert unchanged.content == b""
    assert unchanged.headers["accept-ranges"] == "bytes"


@pytest.mark.parametrize("name", list(RESOURCES))
async def test_an_if_range_that_is_not_the_etag_gets_the_whole_resource(service, urls, name):
    async with service.client() as client:
        whole = await _whole(client, urls[name])
        stale = await client.get(
            urls[name], headers={"Range": "bytes=10-19", "If-Range": '"crc32c-00000000"'}
        )
        assert stale.status_code == 200 and stale.content == whole.content
        assert "content-range" not in stale.headers
        if "etag" in whole.headers:  # a resource without an ETag matches no If-Range
            fresh = await client.get(
                urls[name], headers={"Range": "bytes=10-19", "If-Range": whole.headers["etag"]}
            )
            assert fresh.status_code == 206 and fresh.content == whole.content[10:20]


@pytest.mark.parametrize("name", list(RESOURCES))
async def test_one_range_is_a_206_and_one_that_misses_a_416(service, urls, name):
    async with service.client() as client:
        whole = await _whole(client, urls[name])
        size = len(whole.content)
        part = await client.get(urls[name], headers={"Range": "bytes=-10"})
        assert part.status_code == 206 and part.content == whole.content[-10:]
        assert part.headers["content-range"] == f"bytes {size - 10}-{size - 1}/{size}"
        assert part.headers["content-type"] == "application/octet-stream"
        assert part.headers.get("etag") == whole.headers.get("etag")
        if "etag" in whole.headers:
            unchanged = await client.get(
                urls[name], headers={"If-None-Match": whole.headers["etag"]}
            )
            assert (
                unchanged.status_code == 304 and unchanged.headers["etag"] == whole.headers["etag"]
            )
        missed = await client.get(urls[name], headers={"Range": f"bytes={size}-"})
        assert missed.status_code == 416
        assert missed.headers["content-range"] == f"bytes */{size}"


@pytest.mark.parametrize(
    "url", ["/v1/snapshots/{id}/safetensors", "/ui/snapshots/{id}/safetensors"]
)
async def test_a_damaged_first_chunk_of_a_safetensors_file_is_a_500_error_body(
    service, direct_store, store_url, url
):
    """The first stored piece is read and verified before the response starts, whatever
    is sent ahead of it (here the file's header)."""
    big = np.arange(40 * 50, dtype=np.float32).reshape(40, 50)  # two chunks
    record = GradientsParamsRecord([GradientRecordEntry.from_array(ParamId.parse(BIG), "big", big)])
    info = await direct_store.write_snapshot(record, run="r", step=1)
    async with service.client() as client:
        header_length = int.from_bytes(
            (await client.get(f"/v1/snapshots/{info.id}/safetensors")).content[:8], "little"
        )
        _flip_first_byte(_chunk_files(store_url, info.id, BIG)[0])
        response = await client.get(url.replace("{id}", info.id))
        assert response.status_code == 500
        assert response.json()["error"] == "ChecksumMismatchError"
        # a range wholly inside the header reads no stored byte
        header = await client.get(
            url.replace("{id}", info.id), headers={"Range": f"bytes=0-{header_length + 7}"}
        )
        assert header.status_code == 206 and len(header.content) == header_length + 8
