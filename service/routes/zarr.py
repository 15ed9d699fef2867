"""The store's Zarr keys, read-only, so that Zarr readers open snapshots by URL."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from ..deps import ConditionsDep, MetricsDep, ReadAccess, StoreDep
from ..error_handlers import error_responses
from ..queries import open_store_key
from ..ranges import ranged_response

router = APIRouter(prefix="/v1/zarr", tags=["zarr"])

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
        304: {"description": "If-None-Match is *: the key exists (keys have no ETag)"},
        **error_responses(400, 401, 403, 404, 416, 422, 503, binary_route=True),
    },
}


@router.head("/{path:path}", operation_id="head_store_key", **_KEY_ROUTE)
@router.get("/{path:path}", operation_id="get_store_key", **_KEY_ROUTE)
async def get_key(
    path: Annotated[
        str,
        Path(
            description="a key under the store root, e.g. snapshots/<id>/zarr.json",
            json_schema_extra={"pattern": STORE_PATH_PATTERN, "maxLength": 512},
        ),
    ],
    store: StoreDep,
    metrics: MetricsDep,
    conditions: ConditionsDep,
) -> Response:
    """One key of the store (``zarr.json`` or a chunk), read-only; one Range honoured."""
    key = await open_store_key(store, path)  # InvalidStorePathError before any I/O
    return await ranged_response(conditions, key, metrics)
