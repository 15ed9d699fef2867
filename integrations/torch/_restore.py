"""Collective restores: each rank puts back its parameters' ``.grad`` from a snapshot.

A parameter's gradient comes back from the ranks of the snapshot that hold the rows
this rank needs (docs/INTEGRATIONS.md, "Resharding"):

- a slice of one global tensor (FSDP2, ``Shard(0)``) is read, as byte ranges, from the
  shards whose rows overlap this rank's (a DTensor parameter), or from all of them (a
  plain parameter: the full tensor), on any number of ranks;
- a rank's own gradient (plain tensors) comes back to the same rank of the same world
  size, whole; a snapshot of one process is the full gradient and restores anywhere.
  DDP ranks mid-window hold each their own unreduced sums, and no exact answer exists
  on another number of ranks: UnsupportedSetupError says so.

Every rank reads first; only once every rank has read without error does any rank set a
``.grad``, so a failed restore changes nothing anywhere. A store is read in byte ranges;
the service, through its client, in whole shards (:mod:`._service_reads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.distributed.tensor import DTensor

from gradvault.client import Target
from gradvault.core.errors import (
    DtypeMismatchError,
    InvalidArgumentError,
    ManifestError,
    ParamIdMismatchError,
    ShapeMismatchError,
    UnsupportedSetupError,
)
from gradvault.core.store import open_store

from ._host import dtype_name, numpy_dtype, to_torch
from ._layout import Placement, StoredGradient, dim0_slice, named_parameters, stored_gradients
from ._ranks import DEFAULT_TIMEOUT_SECONDS, Ranks
from ._service_reads import ServiceReads, SnapshotReads
from ._target import call_target

#: byte-range reads in flight at once
_READS_IN_FLIGHT = 16


def restore(
    module: Any,
    target: Target | str | os.PathLike[str],
    snapshot_id: str,
    *,
    group: Any = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
    token: str | None = None,
    store_options: Mapping[str, Any] | None = None,
) -> None:
    """Set every parameter's ``.grad`` on every rank of ``group`` to what snapshot
    ``snapshot_id`` holds for it, bit for bit (collective).

    A parameter the snapshot has no gradient for gets ``.grad = None``, as it was; a
    gradient that matches no parameter by name raises ParamIdMismatchError.
    A DTensor parameter gets a DTensor gradient of its own placement. Checked before any
    ``.grad`` changes on any rank: dtype and global shape (DtypeMismatchError,
    ShapeMismatchError), and a snapshot of per-rank gradients on another number of ranks
    (UnsupportedSetupError). A rank that does not reach a step within ``timeout``
    seconds makes the others raise DistributedSnapshotError. ``target`` is a store
    (opened with ``store_options``) or a service URL (read with ``token``, None:
    ``$GRADVAULT_TOKEN``).
    """
    ranks = Ranks.of(group, timeout)
    error: BaseException | None = None
    grads: dict[str, Any] = {}
    params: list[tuple[str, Any, Placement]] = []
    try:
        where, options = call_target(target, token, store_options)
        params = [
            (name, param, Placement.of(name, param)) for name, param in named_parameters(module)
        ]
        arrays = _run(_read(where, options, snapshot_id, params, ranks))
        grads = {name: _gradient(param, arrays[name]) for name, param, _ in params}
    except Exception as failure:
        error = failure
    ranks.agree("the restore's reads", error)
    for name, param, _ in params:
        param.grad = grads[name]


def _run(coro: Any) -> Any:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise InvalidArgumentError(
        "restore() was called from inside a running event loop, which it would block; "
        "call it from the training loop's thread"
    )


def _gradient(param: Any, array: np.ndarray | None) -> Any:
    """The ``.grad`` for ``param`` made of ``array`` (its local rows), or None."""
    if array is None:
        return None
    local = to_torch(array).to(param.device)
    if isinstance(param, DTensor):
        return DTensor.from_local(
            local,
            param.device_mesh,
            param.placements,
            run_check=False,
            shape=param.shape,
            stride=param.stride(),
        )
    return local


@dataclass(frozen=True)
class _Piece:
    """Rows ``[start, stop)`` of a global gradient, read from source rank ``rank``."""

    name: str
    param_id: str
    rank: int
    start: int
    stop: int


class _Source:
    """The snapshot being read: its shards' manifests, loaded once each; ``store`` is an
    opened store, or the service's :class:`ServiceReads`, which reads as one does."""

    def __init__(self, store: SnapshotReads, snapshot_id: str, top: dict[str, Any]) -> None:
        self.store = store
        self.id = snapshot_id
        self.sharded = top.get("world_size") is not None
        self.world_size = top["world_size"] if self.sharded else 1
        self._top = top
        self._shards: dict[int, dict[str, StoredGradient]] = {}

    def rank_argument(self, rank: int) -> int | None:
        return rank if self.sharded else None

    async def shard(self, rank: int) -> dict[str, StoredGradient]:
        if rank not in self._shards:
            manifest = await self.store.info(self.id, rank=rank) if self.sharded else self._top
            self._shards[rank] = stored_gradients(manifest)
        return self._shards[rank]


def _open(
    where: Target, options: dict[str, Any]
) -> contextlib.AbstractAsyncContextManager[SnapshotReads]:
    """The store at ``where`` opened with ``options``, or the service's reads."""
    return ServiceReads(where) if where.is_service else open_store(where.location, **options)


async def _read(
    where: Target,
    options: dict[str, Any],
    snapshot_id: str,
    params: list[tuple[str, Any, Placement]],
    ranks: Ranks,
) -> dict[str, np.ndarray | None]:
    async with _open(where, options) as store:
        source = _Source(store, snapshot_id, await store.info(snapshot_id))
        reference = await source.shard(ranks.rank % source.world_size)
        arrays: dict[str, np.ndarray | None] = {}
        buffers: dict[str, tuple[np.ndarray, Placement, int]] = {}
        pieces: list[_Piece] = []
        for name, param, placement in params:
            stored = reference.get(str(placement.param_id))
            if stored is None:
                arrays[name] = None
                continue
            _check_fits(snapshot_id, stored, param, placement)
            start, stop = _rows_needed(placement)
            holders = _holders(snapshot_id, stored, source.world_size, ranks, placement)
            for rank, first, last in holders:
                if max(start, first) < min(stop, last):
                    pieces.append(
                        _Piece(name, stored.param_id, rank, max(start, first), min(stop, last))
                    )
            array = np.empty(placement.local_shape, dtype=numpy_dtype(stored.dtype))
            arrays[name] = array
            buffers[name] = (array, placement, start)
        unmatched = set(reference) - {str(placement.param_id) for _, _, placement in params}
        if unmatched:
            names = sorted(reference[param_id].placement.name for param_id in unmatched)
            raise ParamIdMismatchError(
                f"snapshot {snapshot_id} has gradients that match no parameter of the module "
                f"by name: {', '.join(map(repr, names[:5]))}"
                + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            )
        # the manifests of the shards the pieces come from, loaded together
        await asyncio.gather(*(source.shard(rank) for rank in {piece.rank for piece in pieces}))
        ranges = [await _byte_range(source, piece, buffers) for piece in pieces]
        by_rank: dict[int, list[_Range]] = {}
        for byte_range in ranges:
            by_rank.setdefault(byte_range.rank, []).append(byte_range)
        limit = asyncio.Semaphore(_READS_IN_FLIGHT)
        reads = []
        for rank, wanted in by_rank.items():
            held = await source.shard(rank)
            if len(wanted) == len(held) and all(r.begin == 0 and r.end == r.nbytes for r in wanted):
                reads.append(_read_whole_shard(source, rank, wanted, limit))  # one read
            else:
                reads.extend(_read_range(source, byte_range, limit) for byte_range in wanted)
        await asyncio.gather(*reads)
        return arrays


def _check_fits(snapshot_id: str, stored: StoredGradient, param: Any, placement: Placement) -> None:
    if stored.dtype != dtype_name(param.dtype):
        raise DtypeMismatchError(
            f"snapshot {snapshot_id}: the gradient of {placement.name!r} (param "
            f"{stored.param_id}) has dtype {stored.dtype}; the parameter has {param.dtype}"
        )
    if stored.placement.global_shape != placement.global_shape:
        raise ShapeMismatchError(
            f"snapshot {snapshot_id}: the gradient of {placement.name!r} (param "
            f"{stored.param_id}) has global shape {stored.placement.global_shape}; the "
            f"parameter has {placement.global_shape}"
        )


def _rows_needed(placement: Placement) -> tuple[int, int]:
    """The global rows this rank's gradient of the parameter holds (all for a plain one)."""
    if placement.sharded:
        return placement.offset, placement.offset + placement.rows
    return 0, placement.global_shape[0] if placement.global_shape else 1


def _holders(
    snapshot_id: str, stored: StoredGradient, world_size: int, ranks: Ranks, wanted: Placement
) -> list[tuple[int, int, int]]:
    """``(rank, first row, row after the last)`` of each source rank that holds rows of
    the parameter's global gradient that this rank may read (``wanted``: this rank's
    placement of it)."""
    shape = stored.placement.global_shape
    length = shape[0] if shape else 1
    if stored.placement.sharded:
        return [
            (rank, offset, offset + rows)
            for rank in range(world_size)
            for offset, rows in [dim0_slice(length, world_size, rank)]
        ]
    if world_size == 1:  # one process's gradient is the full one
        return [(0, 0, length)]
    if world_size == ranks.world_size and not wanted.sharded:
        return [(ranks.rank, 0, length)]
    plural = "" if ranks.world_size == 1 else "s"
    onto = "a sharded (DTensor) parameter" if wanted.sharded else f"{ranks.world_size} rank{plural}"
    raise UnsupportedSetupError(
        f"snapshot {snapshot_id} holds each of {world_size} ranks' own gradient of "
        f"{stored.placement.name!r} (plain tensors: DDP's unreduced sums mid-window); onto "
        f"{onto} there is no exact answer: restore it on {world_size} ranks of plain tensors"
    )


@dataclass(frozen=True)
class _Range:
    """Bytes ``[begin, end)`` of one stored gradient (of ``nbytes``) of source rank
    ``rank``, which go to ``target[at:]`` (this rank's gradient, as bytes)."""

    rank: int
    param_id: str
    begin: int
    end: int
    nbytes: int
    target: np.ndarray
    at: int


async def _byte_range(
    source: _Source, piece: _Piece, buffers: dict[str, tuple[np.ndarray, Placement, int]]
) -> _Range:
    """Where the piece's rows are in its source shard (checked against that shard's
    manifest) and where they go."""
    array, placement, first_needed = buffers[piece.name]
    stored = (await source.shard(piece.rank)).get(piece.param_id)
    if stored is None:
        raise ManifestError(
            f"snapshot {source.id}: rank {piece.rank}'s shard has no gradient of "
            f"{placement.name!r} (param {piece.param_id}), whose rows it holds"
        )
    held_first = stored.placement.offset
    expected = _holder_rows(stored, source.world_size, piece.rank)
    if (held_first, stored.placement.rows) != expected:
        raise ManifestError(
            f"snapshot {source.id}: rank {piece.rank}'s shard holds rows "
            f"[{held_first}, {held_first + stored.placement.rows}) of {placement.name!r}; "
            f"its layout gives it [{expected[0]}, {expected[0] + expected[1]})"
        )
    target = array.reshape(-1).view(np.uint8)
    if not placement.global_shape:  # a 0-d gradient: its bytes whole
        return _Range(piece.rank, piece.param_id, 0, stored.nbytes, stored.nbytes, target, 0)
    row_bytes = array.dtype.itemsize * math.prod(placement.global_shape[1:])
    return _Range(
        piece.rank,
        piece.param_id,
        (piece.start - held_first) * row_bytes,
        (piece.stop - held_first) * row_bytes,
        stored.nbytes,
        target,
        (piece.start - first_needed) * row_bytes,
    )


async def _read_range(source: _Source, byte_range: _Range, limit: asyncio.Semaphore) -> None:
    """One gradient's bytes, chunk by chunk (checksums verified), into their place."""
    at = byte_range.at
    async with limit:
        async for chunk in source.store.iter_gradient(
            source.id,
            byte_range.param_id,
            byte_range.begin,
            byte_range.end,
            rank=source.rank_argument(byte_range.rank),
        ):
            size = len(chunk)
            byte_range.target[at : at + size] = np.frombuffer(chunk, dtype=np.uint8)
            at += size


async def _read_whole_shard(
    source: _Source, rank: int, wanted: list[_Range], limit: asyncio.Semaphore
) -> None:
    """A shard every gradient of which is wanted whole, read in one pass (its small
    gradients' packed chunks once, not once per gradient)."""
    async with limit:
        record = await source.store.read_snapshot(source.id, rank=source.rank_argument(rank))
    for byte_range in wanted:
        data = np.frombuffer(record[byte_range.param_id].data, dtype=np.uint8)
        byte_range.target[byte_range.at : byte_range.at + data.size] = data


def _holder_rows(stored: StoredGradient, world_size: int, rank: int) -> tuple[int, int]:
    shape = stored.placement.global_shape
    length = shape[0] if shape else 1
    if stored.placement.sharded:
        return dim0_slice(length, world_size, rank)
    return 0, length if shape else 0
