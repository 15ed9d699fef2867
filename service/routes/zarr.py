"""The store's Zarr keys, read-only, so that Zarr readers open snapshots by URL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response

from ..deps import ReadAccess, StoreDep
from ..error_handlers import error_responses
from ..ranges import select_range

router = APIRouter(prefix="/v1/zarr", tags=["zarr"])

_METADATA_NAME = "zarr.json"


@router.api_route(
    "/{path:path}",
    methods=["GET", "HEAD"],
    response_class=Response,
    dependencies=[ReadAccess],
    responses={
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
        **error_responses(400, 401, 403, 404, 416, 503),
    },
)
async def get_key(
    request: Request,
    path: Annotated[
        str, Path(description="a key under the store root, e.g. snapshots/<id>/zarr.json")
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
