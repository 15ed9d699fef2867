"""Snapshots: list, show, upload and delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Response

from gradvault.core.store import parse_snapshot_id

from ..deps import IndexDep, MetricsDep, ReadAccess, StoreDep, WriteAccess
from ..error_handlers import error_responses
from ..schemas import SnapshotDetail, SnapshotPage, SnapshotSummary

router = APIRouter(prefix="/v1/snapshots", tags=["snapshots"])

SNAPSHOT_ID_PATTERN = r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$"
MAX_STEP = 2**63 - 1

SnapshotIdPath = Annotated[
    str,
    Path(
        description="a snapshot id: 26 uppercase Crockford base32 characters",
        json_schema_extra={"pattern": SNAPSHOT_ID_PATTERN},
    ),
]
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
    responses=error_responses(400, *_AUTH_ERRORS, 404, 500, 503),
)
async def get_snapshot(snapshot_id: SnapshotIdPath, store: StoreDep) -> SnapshotDetail:
    """The snapshot's manifest: summary, tags, metadata and every gradient with its stats."""
    manifest = await store.info(parse_snapshot_id(snapshot_id))
    return SnapshotDetail.of_manifest(manifest)


@router.delete(
    "/{snapshot_id}",
    status_code=204,
    response_class=Response,
    dependencies=[WriteAccess],
    responses=error_responses(400, *_AUTH_ERRORS, 404, 503),
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
