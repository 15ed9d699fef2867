"""A snapshot's gradients: one at a time (raw or .npy), or all as one safetensors file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import crc32c
from fastapi import APIRouter, Header, Path, Query, Response

from gradvault.core import MissingGradientError, ParamId, ShardedSnapshotError
from gradvault.core.records.safetensors_file import data_order
from gradvault.core.store import SnapshotStore, parse_snapshot_id

from ..deps import MetricsDep, ReadAccess, StoreDep
from ..error_handlers import error_responses
from ..npy import npy_header
from ..ranges import etag_matches, range_applies, select_range
from ..streaming import OctetStreamResponse, prefixed, started_stream
from .snapshots import SnapshotIdPath

router = APIRouter(prefix="/v1/snapshots/{snapshot_id}", tags=["gradients"])

PARAM_ID_PATTERN = r"^[0-9a-f]{16}$"
ParamIdPath = Annotated[
    str,
    Path(
        description="a ParamId: 16 lowercase hex digits",
        json_schema_extra={"pattern": PARAM_ID_PATTERN},
    ),
]
_BINARY = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def _header(description: str, required: bool = True) -> dict[str, Any]:
    return {"description": description, "required": required, "schema": {"type": "string"}}


_GRADIENT_HEADERS = {
    "ETag": _header('the gradient\'s crc32c, "crc32c-<8 hex>" (".npy" appended for the npy form)'),
    "X-Gradvault-Dtype": _header("the gradient's dtype, e.g. float32"),
    "X-Gradvault-Shape": _header("the gradient's shape, comma-separated (empty for a scalar)"),
    "Accept-Ranges": _header("bytes"),
}


def _gradient_row(manifest: dict[str, Any], snapshot_id: str, param_id: str) -> dict[str, Any]:
    table = manifest.get("gradients")
    if table is None:  # a sharded snapshot: each rank's gradients are in its shard
        raise ShardedSnapshotError(
            f"snapshot {snapshot_id} is sharded over {manifest.get('world_size')} ranks; this "
            f"route serves the gradients of a snapshot written whole (read a shard's arrays "
            f"under /v1/zarr/snapshots/{snapshot_id}/ranks/<rank>/)"
        )
    try:
        position = table["param_id"].index(param_id)
    except ValueError:
        raise MissingGradientError(
            f"snapshot {snapshot_id} has no gradient for param {param_id}"
        ) from None
    return {key: table[key][position] for key in ("name", "dtype", "shape", "nbytes", "checksum")}


@router.get(
    "/grads/{param_id}",
    response_class=OctetStreamResponse,
    dependencies=[ReadAccess],
    responses={
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
        **error_responses(400, 401, 403, 404, 416, 422, 500, 503, binary_route=True),
    },
)
async def get_gradient(
    snapshot_id: SnapshotIdPath,
    param_id: ParamIdPath,
    store: StoreDep,
    metrics: MetricsDep,
    format: Annotated[
        Literal["raw", "npy"], Query(description="raw little-endian bytes, or a .npy file")
    ] = "raw",
    range_header: Annotated[str | None, Header(alias="Range")] = None,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
    if_range: Annotated[str | None, Header(alias="If-Range")] = None,
) -> Response:
    """One gradient's bytes, streamed and verified; dtype and shape in headers; Range, ETag."""
    snapshot_id = parse_snapshot_id(snapshot_id)
    param_id = str(ParamId.parse(param_id))
    gradient = _gradient_row(await store.info(snapshot_id), snapshot_id, param_id)
    checksum = gradient["checksum"].removeprefix("crc32c:")
    prefix = npy_header(gradient["dtype"], tuple(gradient["shape"])) if format == "npy" else b""
    etag = f'"crc32c-{checksum}{".npy" if format == "npy" else ""}"'
    headers = {
        "ETag": etag,
        "X-Gradvault-Dtype": gradient["dtype"],
        "X-Gradvault-Shape": ",".join(str(n) for n in gradient["shape"]),
        "Accept-Ranges": "bytes",
    }
    if etag_matches(if_none_match, etag):
        return Response(status_code=304, headers=headers)
    size = len(prefix) + gradient["nbytes"]
    chosen = select_range(range_header, size) if range_applies(if_range, etag) else None
    start, stop = (chosen.start, chosen.stop) if chosen else (0, size)
    data_start, data_stop = max(start - len(prefix), 0), stop - len(prefix)
    data = None
    if data_stop > data_start:
        data = await started_stream(
            store.iter_gradient(snapshot_id, param_id, data_start, data_stop),
            what=lambda: f"gradient {param_id} ({gradient['name']!r}) of snapshot {snapshot_id}",
            metrics=metrics,
        )
    headers["Content-Length"] = str(stop - start)
    if chosen:
        headers["Content-Range"] = chosen.content_range
    return OctetStreamResponse(
        prefixed(prefix[start:stop], data), status_code=206 if chosen else 200, headers=headers
    )


_SAFETENSORS_HEADERS = {
    "ETag": _header(
        "strong, \"st-<8 hex>\": the crc32c of the file's header and its gradients' checksums"
    ),
    "Accept-Ranges": _header("bytes"),
}


def _safetensors_etag(header: bytes, manifest: dict[str, Any]) -> str:
    """A strong validator of the file: its header (layout, names, summary) and data checksums."""
    value = crc32c.crc32c(header)
    for checksum in manifest["gradients"]["checksum"]:
        value = crc32c.crc32c(checksum.encode(), value)
    return f'"st-{value:08x}"'


async def _safetensors_range(
    store: SnapshotStore,
    snapshot_id: str,
    manifest: dict[str, Any],
    header: bytes,
    start: int,
    stop: int,
) -> AsyncIterator[bytes | memoryview]:
    """Bytes ``[start, stop)`` of the safetensors file: only the gradients' bytes it covers
    are read from the store, in the file's data order."""
    if start < len(header):
        yield header[start:stop]
    table = manifest["gradients"]
    entries = list(
        zip(table["param_id"], table["dtype"], table["shape"], table["nbytes"], strict=True)
    )
    offset = len(header)
    for position in data_order(entries):
        param_id, nbytes = entries[position][0], entries[position][3]
        first, last = max(start - offset, 0), min(stop - offset, nbytes)
        if first < last:
            async for piece in store.iter_gradient(snapshot_id, param_id, first, last):
                yield piece
                del piece  # not kept while the next piece is read
        offset += nbytes
        if offset >= stop:
            return


@router.get(
    "/safetensors",
    response_class=OctetStreamResponse,
    dependencies=[ReadAccess],
    responses={
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
        **error_responses(400, 401, 403, 404, 416, 422, 500, 503, binary_route=True),
    },
)
async def get_safetensors(
    snapshot_id: SnapshotIdPath,
    store: StoreDep,
    metrics: MetricsDep,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
    if_range: Annotated[str | None, Header(alias="If-Range")] = None,
) -> Response:
    """The whole snapshot as one safetensors file (keys: ParamIds), streamed and verified;
    Range (one), If-Range and ETag, so that a broken download resumes."""
    snapshot_id = parse_snapshot_id(snapshot_id)
    manifest = await store.info(snapshot_id)
    length, pieces = await store.iter_safetensors(snapshot_id)
    header = bytes(await anext(pieces))  # iter_safetensors yields the header first
    etag = _safetensors_etag(header, manifest)
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'attachment; filename="{snapshot_id}.safetensors"',
    }
    try:
        if etag_matches(if_none_match, etag):
            return Response(status_code=304, headers=headers)
        chosen = select_range(range_header, length) if range_applies(if_range, etag) else None
    except BaseException:
        await pieces.aclose()
        raise
    if chosen is None:
        source = prefixed(header, pieces)
    else:
        await pieces.aclose()
        source = _safetensors_range(store, snapshot_id, manifest, header, chosen.start, chosen.stop)
        headers["Content-Range"] = chosen.content_range
    body = await started_stream(
        source, what=lambda: f"the safetensors file of snapshot {snapshot_id}", metrics=metrics
    )
    headers["Content-Length"] = str(chosen.length if chosen else length)
    return OctetStreamResponse(body, status_code=206 if chosen else 200, headers=headers)
