"""The JSON bodies the service sends: summaries, details, pages and errors."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from gradvault.core import ShardInfo as WrittenShard
from gradvault.core import SnapshotInfo


class ShardSummary(BaseModel):
    """One rank's shard of a sharded snapshot (``?rank=`` reads it)."""

    rank: int = Field(ge=0)
    device: str
    backend: str | None = None
    compression: str | None = None
    nbytes: int = Field(ge=0, description="the shard's gradient bytes")
    num_params: int = Field(ge=0, description="the shard's number of gradients")


def shard_rows(columns: dict[str, list[Any]] | None) -> list[ShardSummary] | None:
    """A sharded manifest's ``shards`` table (by column) as one entry per rank."""
    if columns is None:
        return None
    names = list(ShardSummary.model_fields)
    return [
        ShardSummary.model_construct(**dict(zip(names, values, strict=True)))
        for values in zip(*(columns[name] for name in names), strict=True)
    ]


class SnapshotBasics(BaseModel):
    """What every description of one snapshot starts with.

    The fields a subclass names in ``SHARDING_ONLY`` are left out of the document when
    they are null, so that a snapshot written whole is described as it always was.
    """

    SHARDING_ONLY: ClassVar[tuple[str, ...]] = ()

    id: str = Field(description="26-character, time-sortable snapshot id")
    run: str
    step: int = Field(ge=0)
    created_at: str = Field(description="ISO 8601 UTC with milliseconds")
    nbytes: int = Field(ge=0, description="total gradient bytes")
    num_params: int = Field(ge=0, description="number of gradients")

    # no return annotation: the JSON schema stays the one of the fields
    @model_serializer(mode="wrap")
    def _without_null_sharding(self, handler: SerializerFunctionWrapHandler):
        document = handler(self)
        for name in self.SHARDING_ONLY:
            if name in document and document[name] is None:
                del document[name]
        return document


class SnapshotSummary(SnapshotBasics):
    """What a listing shows of one committed snapshot.

    A sharded snapshot (written by several ranks) also has ``world_size`` and ``shards``,
    one entry per rank; a snapshot written whole has neither.
    """

    SHARDING_ONLY = ("world_size", "shards")

    world_size: int | None = Field(
        default=None, description="a sharded snapshot's number of ranks; absent if written whole"
    )
    shards: list[ShardSummary] | None = Field(
        default=None, description="a sharded snapshot's ranks in order; absent if written whole"
    )

    @classmethod
    def of(cls, info: SnapshotInfo) -> SnapshotSummary:
        sharded = info.world_size is not None
        return cls.model_construct(
            id=info.id,
            run=info.run,
            step=info.step,
            created_at=info.created_at,
            nbytes=info.nbytes,
            num_params=info.num_params,
            world_size=info.world_size,
            shards=[ShardSummary.model_construct(**asdict(s)) for s in info.shards]
            if sharded
            else None,
        )


class GradientStats(BaseModel):
    """Stats of one gradient: L2 norm and max |g| over finite values, NaN and Inf counts."""

    l2_norm: float | Literal["Infinity"]
    max_abs: float | Literal["Infinity"]
    nan_count: int = Field(ge=0)
    inf_count: int = Field(ge=0)


class GradientInfo(BaseModel):
    """One gradient of a snapshot; its bytes are at ``/grads/{param_id}``."""

    param_id: str = Field(description="16 lowercase hex digits")
    name: str = Field(description="the parameter's module path")
    dtype: str
    shape: list[int]
    nbytes: int = Field(ge=0)
    checksum: str = Field(description="crc32c:<8 hex> of the raw little-endian bytes")
    stats: GradientStats


class SnapshotDetail(SnapshotBasics):
    """A snapshot's manifest: the summary, where it came from, and every gradient.

    A sharded snapshot (written by several ranks) has ``world_size``, ``shards`` (one
    entry per rank) and no gradients here: each rank's gradients are in its shard, whose
    detail (``?rank=``) is the shard's manifest, with ``rank`` and ``world_size``.
    """

    SHARDING_ONLY = ("shards", "rank")

    device: str
    backend: str | None = None
    tags: dict[str, str]
    metadata: dict[str, Any] | None = None
    compression: str | None = None
    gradients: list[GradientInfo]
    world_size: int | None = Field(
        default=None, description="the ranks of a sharded snapshot; null if written whole"
    )
    shards: list[ShardSummary] | None = Field(
        default=None, description="a sharded snapshot's ranks in order; absent otherwise"
    )
    rank: int | None = Field(
        default=None, description="the rank of a shard's detail (?rank=); absent otherwise"
    )

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> SnapshotDetail:
        table = manifest.get("gradients") or {"param_id": [], "stats": {}}
        stats = table["stats"]
        gradients = [
            GradientInfo.model_construct(
                param_id=table["param_id"][i],
                name=table["name"][i],
                dtype=table["dtype"][i],
                shape=table["shape"][i],
                nbytes=table["nbytes"][i],
                checksum=table["checksum"][i],
                stats=GradientStats.model_construct(**{key: stats[key][i] for key in stats}),
            )
            for i in range(len(table["param_id"]))
        ]
        rank, world_size = sharding_of(manifest)
        return cls.model_construct(
            id=manifest["id"],
            run=manifest["run"],
            step=manifest["step"],
            created_at=manifest["created_at"],
            nbytes=manifest["nbytes"],
            num_params=manifest["num_params"],
            device=manifest["device"],
            backend=manifest.get("backend"),
            tags=manifest["tags"],
            metadata=manifest.get("metadata"),
            compression=manifest.get("compression"),
            gradients=gradients,
            world_size=world_size,
            shards=shard_rows(manifest.get("shards")),
            rank=rank,
        )


def sharding_of(manifest: dict[str, Any]) -> tuple[int | None, int | None]:
    """``(rank, world_size)`` of a shard's manifest, ``(None, world_size)`` of a snapshot's."""
    shard = manifest.get("shard")
    if isinstance(shard, dict):
        return shard["rank"], shard["world_size"]
    return None, manifest.get("world_size")


class ShardInfo(BaseModel):
    """One rank's uploaded shard, durable: which snapshot, which rank, and whether the
    snapshot is committed (``snapshot`` is then its summary; else null, and the snapshot
    commits with the upload that completes its ranks)."""

    id: str = Field(description="the sharded snapshot's id")
    run: str
    step: int = Field(ge=0)
    created_at: str = Field(description="ISO 8601 UTC with milliseconds")
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    nbytes: int = Field(ge=0, description="this shard's gradient bytes")
    num_params: int = Field(ge=0, description="this shard's number of gradients")
    committed: bool
    snapshot: SnapshotSummary | None = None

    @classmethod
    def of(cls, shard: WrittenShard) -> ShardInfo:
        return cls.model_construct(
            id=shard.id,
            run=shard.run,
            step=shard.step,
            created_at=shard.created_at,
            rank=shard.rank,
            world_size=shard.world_size,
            nbytes=shard.nbytes,
            num_params=shard.num_params,
            committed=shard.committed,
            snapshot=None if shard.snapshot is None else SnapshotSummary.of(shard.snapshot),
        )


class SnapshotPage(BaseModel):
    """One page of a listing, newest first; pass ``next_cursor`` back for the next page."""

    data: list[SnapshotSummary]
    next_cursor: str | None = Field(description="null on the last page")


class ErrorBody(BaseModel):
    """Every error response: a message naming the thing, and the error's class name."""

    detail: str
    error: str = Field(description="e.g. SnapshotNotFoundError, AuthenticationError")


class Health(BaseModel):
    """Liveness and readiness answers."""

    status: Literal["ok"]
