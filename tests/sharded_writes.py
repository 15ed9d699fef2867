"""Sharded snapshots written as a multi-rank job writes them: each rank a thread with a
Recorder of its own on the store, all passing one snapshot id (drawn once, as rank 0
draws it) to ``Recorder.sync.snapshot_shard``.

The ranks hold the same ParamIds (DDP replicas: each rank's own, unreduced gradients), and
rank ``r``'s first gradient has ``r`` more columns, so the ranks' sizes differ.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gradvault.core import (
    GradientRecordEntry,
    GradientsParamsRecord,
    ParamId,
    Recorder,
    ShardInfo,
    new_snapshot_id,
)

#: the ParamIds every rank holds, and their names
PARAMS = ((ParamId(0x1F2E3D4C5B6A7988), "fc1.weight"), (ParamId(0x0123456789ABCDEF), "fc1.bias"))


def rank_record(rank: int, *, nonfinite: bool = False) -> GradientsParamsRecord:
    """Rank ``rank``'s gradients: float32, (3, 4 + rank) and (5,), values drawn from the rank;
    with ``nonfinite``, the first holds a NaN and an Inf."""
    rng = np.random.default_rng(1000 + rank)
    arrays = [rng.standard_normal((3, 4 + rank), "f4"), rng.standard_normal(5, "f4")]
    if nonfinite:
        arrays[0][0, 0], arrays[0][1, 1] = np.nan, np.inf
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(param_id, name, array)
            for (param_id, name), array in zip(PARAMS, arrays, strict=True)
        ]
    )


def rank_nbytes(rank: int) -> int:
    """The bytes of rank ``rank``'s shard."""
    return sum(entry.nbytes for entry in rank_record(rank))


def write_sharded(
    store: str | Path,
    *,
    world_size: int,
    run: str,
    step: int,
    tags: Mapping[str, str] | None = None,
    record_of: Callable[[int], GradientsParamsRecord] = rank_record,
    **store_options: object,
) -> str:
    """Write one snapshot from ``world_size`` ranks at once (rank ``r`` writes
    ``record_of(r)``); its id, once committed."""
    snapshot_id = new_snapshot_id()

    def rank_writes(rank: int) -> ShardInfo:
        with Recorder(store, **store_options) as recorder:
            return recorder.sync.snapshot_shard(
                record_of(rank),
                snapshot_id=snapshot_id,
                rank=rank,
                world_size=world_size,
                run=run,
                step=step,
                tags=tags,
            )

    with ThreadPoolExecutor(world_size) as ranks:
        shards = list(ranks.map(rank_writes, range(world_size)))
    assert [shard.rank for shard in shards] == list(range(world_size))
    assert any(shard.committed for shard in shards), shards
    return snapshot_id
