"""Snapshots: list, show, upload and delete."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query, Request, Response

from gradvault.core.records.record_rules import check_snapshot_fields
from gradvault.core.store import parse_snapshot_id

from ..deps import IndexDep, MetricsDep, ReadAccess, SettingsDep, StoreDep, WriteAccess
from ..error_handlers import error_responses
from ..params import (
    MAX_STEP,
    SNAPSHOT_ID_PATTERN,
    RankQuery,
    RunQuery,
    SnapshotIdPath,
    StepQuery,
    TagsQuery,
)
from ..queries import snapshot_manifest
from ..schemas import (
    GradientStats,
    SnapshotDetail,
    SnapshotPage,
    SnapshotSummary,
    shard_rows,
    sharding_of,
)
from ..uploads import parse_tags, receive_upload, remove_spool

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"])

_AUTH_ERRORS = (401, 403)


@router.get(
    "",
    response_model=SnapshotPage,
    dependencies=[ReadAccess],
    responses=error_responses(400, *_AUTH_ERRORS, 422, 503),
)
async def list_snapshots(
    index: IndexDep,
    run: Annotated[str | None, Query(description="only this run")] = None,
    step_min: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="inclusive")] = None,
    step_max: Annotated[int | None, Query(ge=0, le=MAX_STEP, description="inclusive")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="page size")] = 100,
    cursor: Annotated[
        str | None,
        Query(
            description="next_cursor of the page before (opaque)",
            json_schema_extra={"pattern": SNAPSHOT_ID_PATTERN},
        ),
    ] = None,
) -> SnapshotPage:
    """A page of snapshot summaries, newest first, and the cursor of the next page."""
    infos, next_cursor = await index.page(
        run=run, step_min=step_min, step_max=step_max, limit=limit, cursor=cursor
    )
    return SnapshotPage.model_construct(
        data=[SnapshotSummary.of(info) for info in infos], next_cursor=next_cursor
    )


@router.get(
    "/{snapshot_id}",
    response_model=SnapshotDetail,
    dependencies=[ReadAccess],
    responses=error_responses(400, *_AUTH_ERRORS, 404, 422, 500, 503),
)
async def get_snapshot(
    snapshot_id: SnapshotIdPath, store: StoreDep, rank: RankQuery = None
) -> Response:
    """The snapshot's manifest: summary, tags, metadata and every gradient with its stats
    (of a sharded snapshot: its ranks, or with ``rank`` that rank's shard's manifest)."""
    manifest = await snapshot_manifest(store, snapshot_id, rank)
    # 100,000 gradients are ~20 MB of JSON: encoded off the event loop, without a model each
    body = await asyncio.to_thread(detail_json, manifest)
    return Response(body, media_type="application/json")


_GRADIENT_FIELDS = ("param_id", "name", "dtype", "shape", "nbytes", "checksum")
_STAT_FIELDS = tuple(GradientStats.model_fields)


def detail_json(manifest: dict[str, Any]) -> bytes:
    """``SnapshotDetail.of_manifest(manifest)`` as JSON, built from the manifest's columns.

    The same document FastAPI would make of the model, field for field, at a fraction of
    the cost: no model object per gradient.
    """
    table = manifest.get("gradients")
    gradients: list[dict[str, Any]] = []
    if table:
        columns = [table[key] for key in _GRADIENT_FIELDS]
        stats = [table["stats"][key] for key in _STAT_FIELDS]
        gradients = [
            {
                **dict(zip(_GRADIENT_FIELDS, values, strict=True)),
                "stats": dict(zip(_STAT_FIELDS, numbers, strict=True)),
            }
            for values, numbers in zip(
                zip(*columns, strict=True), zip(*stats, strict=True), strict=True
            )
        ]
    rank, world_size = sharding_of(manifest)
    shards = shard_rows(manifest.get("shards"))
    computed = {
        "gradients": gradients,
        "world_size": world_size,
        "shards": None if shards is None else [shard.model_dump() for shard in shards],
        "rank": rank,
    }
    # the model's fields in its order: a field added to SnapshotDetail is served here too
    document = {
        name: computed[name]
        if name in computed
        else manifest[name]
        if field.is_required()
        else manifest.get(name)
        for name, field in SnapshotDetail.model_fields.items()
    }
    for name in SnapshotDetail.SHARDING_ONLY:  # as the model leaves them out
        if document[name] is None:
            del document[name]
    return orjson.dumps(document)


SAFETENSORS_BODY = {
    "required": True,
    "description": "a safetensors file whose keys are ParamIds (docs/SERVICE.md, Uploads)",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}


def created(description: str, location: str) -> dict[str, Any]:
    """An upload's 201 response in the OpenAPI schema: ``description``, and the
    ``Location`` header described as ``location``."""
    return {
        "description": description,
        "headers": {"Location": {"description": location, "schema": {"type": "string"}}},
    }


@router.post(
    "",
    status_code=201,
    response_model=SnapshotSummary,
    dependencies=[WriteAccess],
    responses={
        201: created("Committed", "the new snapshot's URL"),
        **error_responses(400, *_AUTH_ERRORS, 413, 422, 503, 507),
    },
    openapi_extra={"requestBody": SAFETENSORS_BODY},
)
async def upload_snapshot(
    request: Request,
    response: Response,
    store: StoreDep,
    index: IndexDep,
    metrics: MetricsDep,
    settings: SettingsDep,
    run: RunQuery,
    step: StepQuery,
    tags: TagsQuery = None,
) -> SnapshotSummary:
    """Upload a safetensors file (streamed) as a new snapshot; its summary once committed."""
    run, step, tag_map = check_snapshot_fields(run, step, parse_tags(tags))
    record, spool = await receive_upload(request, settings)
    try:
        info = await store.write_snapshot(record, run=run, step=step, tags=tag_map)
    finally:
        del record  # maps the spool file
        await remove_spool(spool)
    index.added(info)
    metrics.snapshots_written.inc()
    response.headers["Location"] = f"/v1/snapshots/{info.id}"
    return SnapshotSummary.of(info)


@router.delete(
    "/{snapshot_id}",
    status_code=204,
    response_class=Response,
    dependencies=[WriteAccess],
    responses=error_responses(400, *_AUTH_ERRORS, 404, 422, 503),
)
async def delete_snapshot(
    snapshot_id: SnapshotIdPath, store: StoreDep, index: IndexDep, metrics: MetricsDep
) -> Response:
    """Delete a snapshot; it is gone from listings and reads at once."""
    snapshot_id = parse_snapshot_id(snapshot_id)
    await store.delete(snapshot_id)
    index.removed(snapshot_id)
    metrics.snapshots_deleted.inc()
    return Response(status_code=204)
