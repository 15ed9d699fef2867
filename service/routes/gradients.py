"""A snapshot's gradients: one at a time (raw or .npy), or all as one safetensors file."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from ..deps import ConditionsDep, MetricsDep, ReadAccess, StoreDep
from ..error_handlers import error_responses
from ..params import ParamIdPath, RankQuery, SnapshotIdPath
from ..queries import GradientForm, open_gradient, open_safetensors
from ..ranges import ranged_response
from ..streaming import OctetStreamResponse

router = APIRouter(prefix="/v1/snapshots/{snapshot_id}", tags=["gradients"])

_BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _header(description: str, required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": {"type": "string"}}


_GRADIENT_HEADERS = {
    "ETag": _header('the gradient\'s crc32c, "crc32c-<8 hex>" (".npy" appended for the npy form)'),
    "X-Gradvault-Dtype": _header("the gradient's dtype, e.g. float32"),
    "X-Gradvault-Shape": _header("the gradient's shape, comma-separated (empty for a scalar)"),
    "Accept-Ranges": _header("bytes"),
}


_GRADIENT_ROUTE: dict[str, Any] = {
    "response_class": OctetStreamResponse,
    "dependencies": [ReadAccess],
    "responses": {
        200: {
            "content": _BINARY,
            "description": "The whole gradient",
            "headers": _GRADIENT_HEADERS,
        },
        206: {
            "content": _BINARY,
            "description": "One byte range of it",
            "headers": {
                **_GRADIENT_HEADERS,
                "Content-Range": _header("bytes <first>-<last>/<size>"),
            },
        },
        304: {
            "description": "If-None-Match names the ETag",
            "headers": {"ETag": _GRADIENT_HEADERS["ETag"]},
        },
        **error_responses(400, 401, 403, 404, 409, 416, 422, 500, 503, binary_route=True),
    },
}


@router.head("/grads/{param_id}", operation_id="head_gradient", **_GRADIENT_ROUTE)
@router.get("/grads/{param_id}", **_GRADIENT_ROUTE)
async def get_gradient(
    snapshot_id: SnapshotIdPath,
    param_id: ParamIdPath,
    store: StoreDep,
    metrics: MetricsDep,
    conditions: ConditionsDep,
    format: Annotated[
        GradientForm, Query(description="raw little-endian bytes, or a .npy file")
    ] = "raw",
    rank: RankQuery = None,
) -> Response:
    """One gradient's bytes (of a sharded snapshot: of rank ``rank``'s shard), streamed and
    verified; dtype and shape in headers; Range, ETag."""
    gradient = await open_gradient(store, snapshot_id, param_id, format, rank)
    return await ranged_response(conditions, gradient, metrics)


_SAFETENSORS_HEADERS = {
    "ETag": _header(
        "strong, \"st-<8 hex>\": the crc32c of the file's header and its gradients' checksums"
    ),
    "Accept-Ranges": _header("bytes"),
}


_SAFETENSORS_ROUTE: dict[str, Any] = {
    "response_class": OctetStreamResponse,
    "dependencies": [ReadAccess],
    "responses": {
        200: {
            "content": _BINARY,
            "description": "The snapshot as one safetensors file",
            "headers": _SAFETENSORS_HEADERS,
        },
        206: {
            "content": _BINARY,
            "description": "One byte range of it (a download resumed)",
            "headers": {
                **_SAFETENSORS_HEADERS,
                "Content-Range": _header("bytes <first>-<last>/<size>"),
            },
        },
        304: {
            "description": "If-None-Match names the ETag",
            "headers": {"ETag": _SAFETENSORS_HEADERS["ETag"]},
        },
        **error_responses(400, 401, 403, 404, 409, 416, 422, 500, 503, binary_route=True),
    },
}


@router.head("/safetensors", operation_id="head_safetensors", **_SAFETENSORS_ROUTE)
@router.get("/safetensors", **_SAFETENSORS_ROUTE)
async def get_safetensors(
    snapshot_id: SnapshotIdPath,
    store: StoreDep,
    metrics: MetricsDep,
    conditions: ConditionsDep,
    rank: RankQuery = None,
) -> Response:
    """The whole snapshot (of a sharded one: rank ``rank``'s shard) as one safetensors file
    (keys: ParamIds), streamed and verified; Range (one), If-Range and ETag, so that a
    broken download resumes."""
    safetensors = await open_safetensors(store, snapshot_id, rank)
    return await ranged_response(conditions, safetensors, metrics)
