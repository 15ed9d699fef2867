"""Per-snapshot gradient stats read from manifests, and a run's norms over steps.

Everything here comes from the stats every manifest already holds (L2 norm, max |g|,
NaN and Inf counts per gradient, docs/FORMAT.md); no gradient byte is ever read. A
sharded snapshot's stats are its ranks', from each rank's shard manifest. A
snapshot never changes once committed, so its stats are cached by id for the life of
the process: the first look at a run of 10,000 snapshots reads 10,000 manifests, every
later one only walks the cache.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gradvault.core import FormatVersionError, SnapshotNotFoundError, SnapshotStore

#: how many manifests are read at once when a run is first looked at
MANIFEST_READS_AT_ONCE = 32
#: snapshots whose stats are kept in memory (a few hundred bytes each for small models)
STATS_CACHE_ENTRIES = 200_000
#: the most steps with NaN or Inf that one run-stats answer lists one by one
MAX_NONFINITE_LISTED = 1_000


def _summary_of(manifest: dict[str, Any]) -> dict[str, Any]:
    """The fields every snapshot's stats take from its (top) manifest as they are."""
    return {key: manifest[key] for key in ("id", "run", "step", "created_at", "nbytes")}


def _as_float(value: float | str) -> float:
    """A manifest number; the string ``"Infinity"`` (an overflowed norm) as ``inf``."""
    return math.inf if value == "Infinity" else float(value)


_STATS = ("l2_norm", "max_abs", "nan_count", "inf_count")


@dataclass(frozen=True, slots=True)
class SnapshotStats:
    """One snapshot's summary and, per gradient, its name and stats (from its manifest)."""

    id: str
    run: str
    step: int
    created_at: str
    nbytes: int
    param_ids: tuple[str, ...]
    names: tuple[str, ...]
    l2_norms: tuple[float, ...]
    max_abs: tuple[float, ...]
    nan_counts: tuple[int, ...]
    inf_counts: tuple[int, ...]
    #: a sharded snapshot's ranks, each one's stats (its gradients are theirs, in rank order)
    ranks: tuple[SnapshotStats, ...] = ()

    @property
    def world_size(self) -> int | None:
        """The number of ranks of a sharded snapshot; None for one written whole."""
        return len(self.ranks) or None

    @classmethod
    def of_shards(cls, manifest: dict[str, Any], ranks: Sequence[SnapshotStats]) -> SnapshotStats:
        """A sharded snapshot's stats: its ranks' gradients one after another, in rank order
        (a ParamId that several ranks hold is there once per rank)."""
        return cls(
            **_summary_of(manifest),
            param_ids=tuple(p for rank in ranks for p in rank.param_ids),
            names=tuple(n for rank in ranks for n in rank.names),
            l2_norms=tuple(v for rank in ranks for v in rank.l2_norms),
            max_abs=tuple(v for rank in ranks for v in rank.max_abs),
            nan_counts=tuple(v for rank in ranks for v in rank.nan_counts),
            inf_counts=tuple(v for rank in ranks for v in rank.inf_counts),
            ranks=tuple(ranks),
        )

    @classmethod
    def of_manifest(cls, manifest: dict[str, Any]) -> SnapshotStats:
        # a sharded snapshot's gradients are in its shards: none at the top
        table = manifest.get("gradients") or {"param_id": [], "name": [], "stats": {}}
        stats = table["stats"] or {key: [] for key in _STATS}
        return cls(
            **_summary_of(manifest),
            param_ids=tuple(table["param_id"]),
            names=tuple(table["name"]),
            l2_norms=tuple(_as_float(value) for value in stats["l2_norm"]),
            max_abs=tuple(_as_float(value) for value in stats["max_abs"]),
            nan_counts=tuple(stats["nan_count"]),
            inf_counts=tuple(stats["inf_count"]),
        )

    @property
    def nan_count(self) -> int:
        """NaN values over every gradient."""
        return sum(self.nan_counts)

    @property
    def inf_count(self) -> int:
        """Inf values over every gradient."""
        return sum(self.inf_counts)

    @property
    def healthy(self) -> bool:
        """No NaN, no Inf and no overflowed norm anywhere."""
        return not self.nan_count and not self.inf_count and all(map(math.isfinite, self.l2_norms))

    @property
    def largest(self) -> tuple[str, float] | None:
        """The name and L2 norm of the gradient with the largest norm (None if there is none)."""
        if not self.l2_norms:
            return None
        position = max(range(len(self.l2_norms)), key=self.l2_norms.__getitem__)
        return self.names[position], self.l2_norms[position]


class SnapshotStatsCache:
    """Stats of snapshots by id, read from the store's manifests once and then remembered.

    A manifest being read is read once however many requests want it: they all wait for
    the same load, and a request that goes away does not cancel a load others wait for.
    Nothing is read ahead of a request: warming a whole store in the background would
    cost one GET per snapshot on S3 and compete with the requests the pages make.
    """

    def __init__(self, store: SnapshotStore, max_entries: int = STATS_CACHE_ENTRIES) -> None:
        self.store = store
        self.max_entries = max_entries
        self._stats: OrderedDict[str, SnapshotStats] = OrderedDict()
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(MANIFEST_READS_AT_ONCE)

    def _remember(self, stats: SnapshotStats) -> None:
        self._stats[stats.id] = stats
        if len(self._stats) > self.max_entries:
            self._stats.popitem(last=False)

    async def _read(self, snapshot_id: str) -> None:
        async with self._slots:
            try:
                manifest = await self.store.info(snapshot_id)
                world_size = manifest.get("world_size")
                if world_size is None:
                    stats = SnapshotStats.of_manifest(manifest)
                else:  # the stats are in the ranks' manifests
                    ranks = [
                        SnapshotStats.of_manifest(await self.store.info(snapshot_id, rank=rank))
                        for rank in range(world_size)
                    ]
                    stats = SnapshotStats.of_shards(manifest, ranks)
            except (SnapshotNotFoundError, FormatVersionError):
                return  # deleted since the listing, or unlisted: nothing to show
            self._remember(stats)

    def _load(self, snapshot_id: str) -> asyncio.Task[None]:
        load = self._loading.get(snapshot_id)
        if load is None:
            load = self._loading[snapshot_id] = asyncio.ensure_future(self._read(snapshot_id))
            load.add_done_callback(lambda done: self._loaded(snapshot_id, done))
        return load

    def _loaded(self, snapshot_id: str, load: asyncio.Task[None]) -> None:
        if self._loading.get(snapshot_id) is load:
            del self._loading[snapshot_id]
        if not load.cancelled():
            load.exception()  # seen by its waiters; not "never retrieved" if none is left

    async def many(self, snapshot_ids: Sequence[str]) -> list[SnapshotStats]:
        """The stats of each id, in order; ids deleted since they were listed are left out.

        A store error (StoreUnavailableError ...) while reading a manifest is raised.
        """
        loads = [self._load(i) for i in snapshot_ids if i not in self._stats]
        if loads:
            await asyncio.gather(*(asyncio.shield(load) for load in loads))
        found = (self._stats.get(i) for i in snapshot_ids)
        return [stats for stats in found if stats is not None]


def _drawable(norm: float) -> float | None:
    """A norm a log-scale chart can draw (finite, above zero), else None (JSON null)."""
    return norm if 0 < norm < math.inf else None


def run_series(run: str, snapshots: list[SnapshotStats], max_points: int) -> dict[str, Any]:
    """Per-layer L2 norms over steps for ``snapshots`` of ``run``, at most ``max_points``.

    Snapshots are taken in step order (ties by id, i.e. commit order). Beyond
    ``max_points`` they are cut into runs of ``bucket_size`` consecutive snapshots and
    each point shows the largest norm of each layer over its bucket, at the bucket's last
    step, so a spike is never averaged away. Steps with NaN or Inf (or an overflowed
    norm) are listed one by one in ``nonfinite`` whatever the bucketing (up to
    ``MAX_NONFINITE_LISTED``). A layer is a gradient, one series per ParamId (two
    gradients may share a name), labelled by its name (the first the run gives it), or by
    ``"<name> (<param_id>)"`` where other gradients of the run have that name too; one a
    snapshot lacks is null.
    """
    ordered = sorted(snapshots, key=lambda stats: (stats.step, stats.id))
    layer_of: dict[str, int] = {}
    first_names: list[str] = []
    for stats in ordered:
        for param_id, name in zip(stats.param_ids, stats.names, strict=True):
            if param_id not in layer_of:
                layer_of[param_id] = len(layer_of)
                first_names.append(name)
    shared = {name for name, count in Counter(first_names).items() if count > 1}
    labels = [
        f"{name} ({param_id})" if name in shared else name
        for param_id, name in zip(layer_of, first_names, strict=True)
    ]
    bucket_size = max(1, math.ceil(len(ordered) / max_points))
    steps: list[int] = []
    ids: list[str] = []
    norms: list[list[float | None]] = [[] for _ in layer_of]
    for start in range(0, len(ordered), bucket_size):
        bucket = ordered[start : start + bucket_size]
        largest: list[float | None] = [None] * len(layer_of)
        for stats in bucket:
            for param_id, norm in zip(stats.param_ids, stats.l2_norms, strict=True):
                value = _drawable(norm)
                position = layer_of[param_id]
                current = largest[position]
                if value is not None and (current is None or value > current):
                    largest[position] = value
        steps.append(bucket[-1].step)
        ids.append(bucket[-1].id)
        for series, value in zip(norms, largest, strict=True):
            series.append(value)
    nonfinite = [
        {
            "step": stats.step,
            "id": stats.id,
            "nan_count": stats.nan_count,
            "inf_count": stats.inf_count,
            "layers": [
                labels[layer_of[param_id]]
                for param_id, nans, infs, norm in zip(
                    stats.param_ids,
                    stats.nan_counts,
                    stats.inf_counts,
                    stats.l2_norms,
                    strict=True,
                )
                if nans or infs or not math.isfinite(norm)
            ],
        }
        for stats in ordered
        if not stats.healthy
    ]
    return {
        "run": run,
        "snapshots": len(ordered),
        "bucket_size": bucket_size,
        "layers": labels,
        "param_ids": list(layer_of),
        "steps": steps,
        "ids": ids,
        "l2_norm": norms,
        "nonfinite": nonfinite[:MAX_NONFINITE_LISTED],
        "nonfinite_total": len(nonfinite),
    }
