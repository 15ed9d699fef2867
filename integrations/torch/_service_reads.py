"""A snapshot read through the service, as a restore reads one from a store.

A restore asks a store for a snapshot's manifest and its shards' (``info``), for byte
ranges of a shard's gradients (``iter_gradient``) and for whole shards
(``read_snapshot``). Through the service each of those is the client's: ``info`` is
``GET /v1/snapshots/{id}?rank=`` (its gradients, one object each, made columns as a
store's manifest holds them), and a shard is read whole, once, as its safetensors file
(``fetch(id, rank=r)``, every checksum verified), the byte ranges then cut from it. A
rank that needs a few rows of a shard (resharding FSDP2) downloads the whole shard: the
reads stay few and whole-file verified at the price of bytes it does not keep.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol

import numpy as np

from gradvault.client import AsyncClient, Target
from gradvault.core import GradientsParamsRecord


class SnapshotReads(Protocol):
    """What a restore reads of a snapshot: an opened ``SnapshotStore`` is one, and so is
    :class:`ServiceReads`."""

    async def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]: ...

    async def read_snapshot(
        self, snapshot_id: str, *, rank: int | None = None
    ) -> GradientsParamsRecord: ...

    def iter_gradient(
        self, snapshot_id: str, param_id: str, start: int, end: int, *, rank: int | None = None
    ) -> AsyncIterator[bytes | memoryview]: ...


class ServiceReads:
    """The snapshots of the service at ``where``, read with its token (an async context
    manager, as an opened store is)."""

    def __init__(self, where: Target) -> None:
        self._client: AsyncClient = where.async_client()
        self._shards: dict[tuple[str, int | None], GradientsParamsRecord] = {}
        self._fetching: dict[tuple[str, int | None], asyncio.Lock] = {}

    async def __aenter__(self) -> ServiceReads:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._shards.clear()
        await self._client.aclose()

    async def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]:
        """The manifest of the snapshot (or of rank ``rank``'s shard), gradients by column."""
        detail = await self._client.info(snapshot_id, rank=rank)
        rows = detail.get("gradients") or []
        columns = ("param_id", "name", "dtype", "shape", "nbytes")
        return {**detail, "gradients": {key: [row[key] for row in rows] for key in columns}}

    async def read_snapshot(
        self, snapshot_id: str, *, rank: int | None = None
    ) -> GradientsParamsRecord:
        """The snapshot (or rank ``rank``'s shard) as a record, downloaded once."""
        key = (snapshot_id, rank)
        lock = self._fetching.setdefault(key, asyncio.Lock())
        async with lock:  # byte ranges of one shard, read together, download it once
            if key not in self._shards:
                self._shards[key] = await self._client.fetch(snapshot_id, rank=rank)
        return self._shards[key]

    async def iter_gradient(
        self, snapshot_id: str, param_id: str, start: int, end: int, *, rank: int | None = None
    ) -> AsyncIterator[bytes]:
        """Bytes ``[start, end)`` of the gradient ``param_id`` (one piece)."""
        record = await self.read_snapshot(snapshot_id, rank=rank)
        data = np.frombuffer(record[param_id].data, dtype=np.uint8)
        yield data[start:end].tobytes()
