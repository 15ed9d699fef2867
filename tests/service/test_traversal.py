"""Ids and paths are refused before any store access: no request leaves the store.

Requests go out byte for byte (clients would normalise ``..`` away): over a socket to
uvicorn, or as an ASGI scope built the way uvicorn builds it (the path percent-decoded).
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import unquote

import pytest

from .conftest import make_record
from .spy import spy_on_store

SNAPSHOT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
PARAM = "00000000000000a1"


@pytest.fixture
def store_kind() -> str:
    return "local"  # refusing happens before any store is asked


async def raw_get(service, raw_path: str) -> tuple[int, dict]:
    """The status and JSON body of ``GET raw_path``, sent exactly as written."""
    if service.base_url.startswith("http://127.0.0.1"):
        host, port = service.base_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"GET {raw_path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        response = await reader.read()
        writer.close()
        head, _, body = response.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(body)
    messages = []
    path, _, query = raw_path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"x")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    await service.app(scope, receive, send)
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return status, json.loads(body)


SNAPSHOT_ATTEMPTS = {
    "dot-dot": "/v1/snapshots/..",
    "encoded-dot-dot": "/v1/snapshots/%2e%2e",
    "encoded-slash": f"/v1/snapshots/..%2F..%2F{SNAPSHOT}",
    "absolute": "/v1/snapshots/%2Fetc%2Fpasswd",
    "nul": f"/v1/snapshots/{SNAPSHOT}%00",
    "over-long": f"/v1/snapshots/{SNAPSHOT * 40}",
    "lowercase": f"/v1/snapshots/{SNAPSHOT.lower()}",
    "param-dot-dot": f"/v1/snapshots/{SNAPSHOT}/grads/%2e%2e",
    "param-encoded-slash": f"/v1/snapshots/{SNAPSHOT}/grads/..%2F..%2Fzarr.json",
    "param-nul": f"/v1/snapshots/{SNAPSHOT}/grads/{PARAM}%00",
    "param-over-long": f"/v1/snapshots/{SNAPSHOT}/grads/{PARAM * 50}",
    "safetensors-dot-dot": "/v1/snapshots/%2e%2e/safetensors",
    "cursor-traversal": "/v1/snapshots?cursor=..%2F..%2Fzarr.json",
}

ZARR_ATTEMPTS = {
    "dot-dot": "/v1/zarr/../../etc/passwd",
    "dot-dot-inside": "/v1/zarr/snapshots/../../zarr.json",
    "encoded-dot-dot": "/v1/zarr/%2e%2e/%2e%2e/etc/passwd",
    "encoded-slash": "/v1/zarr/snapshots%2F..%2F..%2Fetc%2Fpasswd",
    "absolute": "/v1/zarr//etc/passwd",
    "encoded-absolute": "/v1/zarr/%2Fetc%2Fpasswd",
    "nul": "/v1/zarr/zarr.json%00",
    "hidden-staging": "/v1/zarr/.staging/x/zarr.json",
    "backslash": "/v1/zarr/snapshots%5C..%5C..%5Cetc",
    "over-long": "/v1/zarr/" + "a/" * 400 + "zarr.json",
}


@pytest.mark.parametrize("attempt", sorted(SNAPSHOT_ATTEMPTS))
async def test_a_bad_id_is_4xx_and_never_reaches_the_store(service, direct_store, attempt):
    await direct_store.write_snapshot(make_record(), run="r", step=0)
    spy = await spy_on_store(service)
    status, body = await raw_get(service, SNAPSHOT_ATTEMPTS[attempt])
    assert 400 <= status < 500, body
    assert set(body) == {"detail", "error"}
    assert [call for call in spy.calls if call != "list"] == []


@pytest.mark.parametrize("attempt", sorted(ZARR_ATTEMPTS))
async def test_a_bad_store_path_is_refused_before_any_io(service, attempt):
    status, body = await raw_get(service, ZARR_ATTEMPTS[attempt])
    assert status in (400, 404), body
    # 400 from the store's path check, which runs before any I/O; 404 only where the
    # router itself found no route (the path never reached the store)
    assert body["error"] in ("InvalidStorePathError", "HTTPException"), body
