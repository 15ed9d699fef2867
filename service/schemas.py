"""The JSON bodies the service sends: summaries, details, pages and errors."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gradvault.core import SnapshotInfo


class SnapshotSummary(BaseModel):
    """What a listing shows of one committed snapshot."""

    id: str = Field(description="26-character, time-sortable snapshot id")
    run: str
    step: int = Field(ge=0)
    created_at: str = Field(description="ISO 8601 UTC with milliseconds")
    nbytes: int = Field(ge=0, description="total gradient bytes")
    num_params: int = Field(ge=0, description="number of gradients")

    @classmethod
    def of(cls, info: SnapshotInfo) -> SnapshotSummary:
        return cls.model_construct(
            id=info.id,
            run=info.run,
            step=info.step,
            created_at=info.created_at,
            nbytes=info.nbytes,
            num_params=info.num_params,
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


class SnapshotDetail(SnapshotSummary):
    """A snapshot's manifest: the summary, where it came from, and every gradient.

    A sharded snapshot (written by several ranks) has ``world_size`` and no gradients
    here: each rank's gradients are in its shard.
    """

    device: str
    backend: str | None = None
    tags: dict[str, str]
    metadata: dict[str, Any] | None = None
    compression: str | None = None
    gradients: list[GradientInfo]
    world_size: int | None = Field(
        default=None, description="the ranks of a sharded snapshot; null if written whole"
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
            world_size=manifest.get("world_size"),
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
