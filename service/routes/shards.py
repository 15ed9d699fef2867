"""Shards: each rank of a multi-rank job uploads its own shard of one sharded snapshot."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from gradvault.core.records.record_rules import check_snapshot_fields
from gradvault.core.store import check_rank, parse_snapshot_id

from ..deps import IndexDep, MetricsDep, SettingsDep, StoreDep, WriteAccess
from ..error_handlers import error_responses
from ..params import RunQuery, SnapshotIdPath, StepQuery, TagsQuery
from ..schemas import ShardInfo
from ..uploads import parse_tags, receive_upload, remove_spool
from .snapshots import SAFETENSORS_BODY, created

router = APIRouter(prefix="/v1/snapshots/{snapshot_id}/shards", tags=["shards"])


@router.post(
    "",
    status_code=201,
    response_model=ShardInfo,
    dependencies=[WriteAccess],
    responses={
        201: created(
            "The shard is durable; `committed` says whether the snapshot is",
            "the snapshot's URL, when this upload committed it",
        ),
        **error_responses(400, 401, 403, 413, 422, 503, 507),
    },
    openapi_extra={"requestBody": SAFETENSORS_BODY},
)
async def upload_shard(
    snapshot_id: SnapshotIdPath,
    request: Request,
    response: Response,
    store: StoreDep,
    index: IndexDep,
    metrics: MetricsDep,
    settings: SettingsDep,
    rank: Annotated[int, Query(ge=0, description="this shard's rank, 0..world_size-1")],
    world_size: Annotated[int, Query(ge=1, description="the job's number of ranks")],
    run: RunQuery,
    step: StepQuery,
    tags: TagsQuery = None,
) -> ShardInfo:
    """Upload a safetensors file (streamed) as rank ``rank``'s shard of the sharded snapshot
    ``snapshot_id``; the snapshot commits with the upload that completes its ranks."""
    # everything the query can be refused for, before a byte of the body is read
    snapshot_id = parse_snapshot_id(snapshot_id)
    rank, world_size = check_rank(rank, world_size)
    run, step, tag_map = check_snapshot_fields(run, step, parse_tags(tags))
    record, spool = await receive_upload(request, settings)
    try:
        shard = await store.write_shard(
            record,
            snapshot_id=snapshot_id,
            rank=rank,
            world_size=world_size,
            run=run,
            step=step,
            tags=tag_map,
        )
    finally:
        del record  # maps the spool file
        await remove_spool(spool)
    if shard.snapshot is not None:  # this upload completed the snapshot
        index.added(shard.snapshot)
        metrics.snapshots_written.inc()
        response.headers["Location"] = f"/v1/snapshots/{snapshot_id}"
    return ShardInfo.of(shard)
