"""The store's Zarr keys, read-only, so that Zarr readers open snapshots by URL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response

from ..deps import ReadAccess, StoreDep
from ..error_handlers import error_responses
from ..ranges import select_range

router = APIRouter(prefix="/v1/zarr", tags=["zarr"])

_METADATA_NAME = "zarr.json"
#: What a readable key looks like (names without a leading dot, single slashes); the
#: store checks every path itself before any I/O, this documents the shape
STORE_PATH_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$"


_KEY_ROUTE: dict = {
    "response_class": Response,
    "dependencies": [ReadAccess],
    "responses": {
        200: {
            "description": "The key's bytes: zarr.json documents as JSON, chunks as bytes",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        206: {
            "description": "One byte range of the key",
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        },
        **error_responses(400, 401, 403, 404, 416, 422, 503, binary_route=True),
    },
}


@router.head("/{path:path}", operation_id="head_store_key", **_KEY_ROUTE)
@router.get("/{path:path}", operation_id="get_store_key", **_KEY_ROUTE)
async def get_key(
    request: Request,
    path: Annotated[
        str,
        Path(
            description="a key under the store root, e.g. snapshots/<id>/zarr.json",
            json_schema_extra={"pattern": STORE_PATH_PATTERN, "maxLength": 512},
        ),
    ],
    store: StoreDep,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
) -> Response:
    """One key of the store (``zarr.json`` or a chunk), read-only; one Range honoured."""
    size = await store.key_size(path)  # InvalidStorePathError before any I/O
    media_type = (
        "application/json"
        if path.rpartition("/")[2] == _METADATA_NAME
        else "application/octet-stream"
    )
    chosen = select_range(range_header, size)
    headers = {"Accept-Ranges": "bytes"}
    if request.method == "HEAD":
        headers["Content-Length"] = str(size)
        return Response(status_code=200, headers=headers, media_type=media_type)
    if chosen is None:
        return Response(bytes(await store.read_key(path)), media_type=media_type, headers=headers)
    data = await store.read_key(path, start=chosen.start, end=chosen.stop)
    headers["Content-Range"] = chosen.content_range
    return Response(
        bytes(data), status_code=206, media_type="application/octet-stream", headers=headers
    )
