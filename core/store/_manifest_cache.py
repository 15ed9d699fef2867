"""The store's manifests as read: a few parsed ones, and the summary of every one seen.

One owner for what the store remembers of its snapshots. :class:`SnapshotStore`, its key
view (``_zarr_view``) and retention (``_retention``) all load manifests, forget them and
list snapshots through one :class:`ManifestCache`; none of them touches what it holds.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from ..errors import (
    FormatVersionError,
    InvalidArgumentError,
    ManifestError,
    ShardedSnapshotError,
    SnapshotNotFoundError,
)
from ._backend import (
    MANIFEST_NAME,
    MissingKeyError,
    StoreBackend,
    ThreadRunner,
    UnexpectedObjectError,
    shard_prefix,
    snapshot_key,
)
from ._manifest import Manifest, SnapshotInfo
from ._manifest_checksum import check_sealed
from ._reader import SnapshotReader
from ._shards import ShardedManifest, manifest_and_node

_log = logging.getLogger("gradvault.store")

#: Manifests at least this big are parsed in a thread rather than on the loop.
_THREAD_DECODE_BYTES = 256 * 1024
#: How many parsed manifests (a snapshot's, or a shard's) are kept.
_MANIFEST_CACHE_SIZE = 8


class ManifestCache:
    """The last few parsed manifests of one store, and the SnapshotInfo of each one seen.

    Parsed manifests are kept by snapshot id (a shard's by ``<id>/<rank>``), the least
    recently used dropped past ``_MANIFEST_CACHE_SIZE``; summaries are kept for every
    snapshot loaded or written, so that ``listing`` reads only the manifests it has not
    seen. A committed manifest never changes, so what is kept is only ever stale by the
    snapshot's deletion: :meth:`forget` drops it, :meth:`recheck` asks the store again.
    """

    def __init__(self, backend: StoreBackend, threads: ThreadRunner) -> None:
        self._backend = backend
        self._threads = threads
        self._infos: dict[str, SnapshotInfo] = {}
        #: parsed manifests by snapshot id, and shards' by ``<id>/<rank>``
        self._manifests: OrderedDict[str, Manifest | ShardedManifest] = OrderedDict()
        #: the document each of them was parsed from, as read, by the same keys
        self._sources: dict[str, bytes] = {}

    def remembers(self, snapshot_id: str) -> bool:
        """Whether a parsed manifest of the snapshot (or of one of its shards) is kept."""
        return any(key.partition("/")[0] == snapshot_id for key in self._manifests)

    def written(self, info: SnapshotInfo) -> None:
        """Remember the summary of a snapshot this store has just committed."""
        self._infos[info.id] = info

    def forget(self, snapshot_id: str) -> None:
        """Drop everything kept of the snapshot (its manifests, its shards', its summary)."""
        for key in [k for k in self._manifests if k.partition("/")[0] == snapshot_id]:
            del self._manifests[key]
            self._sources.pop(key, None)
        self._infos.pop(snapshot_id, None)

    async def recheck(self, snapshot_id: str) -> None:
        """SnapshotNotFoundError if the snapshot was deleted since its manifest was loaded."""
        self.forget(snapshot_id)
        await self.top(snapshot_id)

    def reader(self, manifest: Manifest) -> SnapshotReader:
        """A reader of ``manifest``'s gradients that rechecks the snapshot through this cache
        when an object it needs is missing."""
        snapshot_id = manifest.snapshot_id
        return SnapshotReader(
            self._backend, self._threads, manifest, lambda: self.recheck(snapshot_id)
        )

    async def _load_document(
        self, snapshot_id: str, key: str, where: str
    ) -> tuple[dict[str, Any], dict[str, Any], bytes]:
        """The gradvault manifest in the snapshot's document at ``key``, the document's other
        fields (its node's own: the packed array's, where the snapshot's node is that
        array) and the document as read.

        SnapshotNotFoundError if it is absent; ManifestError or FormatVersionError if it is
        not a manifest this release reads, or fails its own checksum (format 2).
        """
        try:
            raw = await self._backend.read(key)
        except MissingKeyError:
            raise SnapshotNotFoundError(
                f"no committed snapshot {snapshot_id} in store {self._backend.location}"
            ) from None
        except UnexpectedObjectError as error:
            raise ManifestError(f"{where}: its manifest document {MANIFEST_NAME} {error}") from None

        def parse() -> tuple[dict[str, Any], dict[str, Any]]:
            manifest, node = manifest_and_node(raw, where)
            check_sealed(manifest, where)
            return manifest, node

        source = bytes(raw)
        if len(raw) > _THREAD_DECODE_BYTES:
            return (*await self._threads.run(parse), source)
        return (*parse(), source)

    def _remember(self, key: str, parsed: Manifest | ShardedManifest, source: bytes) -> None:
        self._manifests[key] = parsed
        self._sources[key] = source
        if len(self._manifests) > _MANIFEST_CACHE_SIZE:
            dropped, _ = self._manifests.popitem(last=False)
            self._sources.pop(dropped, None)

    async def top(self, snapshot_id: str) -> Manifest | ShardedManifest:
        """The snapshot's own manifest: a whole snapshot's, or a sharded one's (validated)."""
        cached = self._manifests.get(snapshot_id)
        if cached is not None:
            self._manifests.move_to_end(snapshot_id)
            return cached
        where = f"snapshot {snapshot_id}"
        document, node, source = await self._load_document(
            snapshot_id, snapshot_key(snapshot_id, MANIFEST_NAME), where
        )
        parsed: Manifest | ShardedManifest
        if "world_size" in document:
            parsed = ShardedManifest(document, snapshot_id)
        elif len(source) > _THREAD_DECODE_BYTES:
            parsed = await self._threads.run(Manifest, document, snapshot_id, None, node)
        else:  # validated: FormatVersionError if malformed
            parsed = Manifest(document, snapshot_id, node=node)
        self._remember(snapshot_id, parsed, source)
        self._infos[snapshot_id] = SnapshotInfo.from_manifest(parsed.document)
        return parsed

    async def manifest(self, snapshot_id: str, rank: int | None = None) -> Manifest:
        """The manifest gradients are read through: the snapshot's, or rank ``rank``'s shard's.

        A sharded snapshot needs ``rank`` (ShardedSnapshotError without it), a snapshot
        written whole refuses one (InvalidArgumentError).
        """
        top = await self.top(snapshot_id)
        if isinstance(top, Manifest):
            if rank is not None:
                raise InvalidArgumentError(
                    f"snapshot {snapshot_id} is not sharded (it was written whole); rank= "
                    f"is for sharded snapshots; got rank {rank!r}"
                )
            return top
        if rank is None:
            raise ShardedSnapshotError(
                f"snapshot {snapshot_id} is sharded over {top.world_size} ranks: pass rank= "
                f"(0..{top.world_size - 1}) to read one rank's shard"
            )
        rank = top.check_rank(rank)
        key = f"{snapshot_id}/{rank}"
        cached = self._manifests.get(key)
        if isinstance(cached, Manifest):
            self._manifests.move_to_end(key)
            return cached
        where = f"snapshot {snapshot_id}, the shard of rank {rank}"
        try:
            document, _, source = await self._load_document(
                snapshot_id, f"{shard_prefix(snapshot_id, rank)}/{MANIFEST_NAME}", where
            )
        except SnapshotNotFoundError:
            await self.recheck(snapshot_id)  # SnapshotNotFoundError if deleted meanwhile
            raise ManifestError(f"{where}: its manifest {MANIFEST_NAME} is missing") from None
        shard = (rank, top.world_size)
        if len(source) > _THREAD_DECODE_BYTES:
            parsed = await self._threads.run(Manifest, document, snapshot_id, shard)
        else:
            parsed = Manifest(document, snapshot_id, shard)
        self._remember(key, parsed, source)
        return parsed

    async def check_document(
        self, snapshot_id: str, rank: int | None, data: bytes | memoryview
    ) -> Manifest | ShardedManifest:
        """The manifest that ``data`` holds: the snapshot's own (``rank`` None) or its shard
        of ``rank``'s, if ``data`` is, byte for byte, the document that manifest was loaded
        and validated from; else the document is loaded (and validated) again, and ``data``
        must be that one.

        A key reader serves a manifest document read afresh; this makes sure what it serves
        is what the store validated (a document edited or corrupted since it was loaded
        is refused by that validation, with its own error, or as changed meanwhile).
        """
        key = snapshot_id if rank is None else f"{snapshot_id}/{rank}"
        source = bytes(data)
        for attempt in range(2):
            if attempt:
                self.forget(snapshot_id)  # read again from the store: validated again
            parsed: Manifest | ShardedManifest = await (
                self.top(snapshot_id) if rank is None else self.manifest(snapshot_id, rank)
            )
            if self._sources.get(key) == source:
                return parsed
        shard = "" if rank is None else f", the shard of rank {rank}"
        raise ManifestError(
            f"snapshot {snapshot_id}{shard}: its manifest document {MANIFEST_NAME} changed "
            "while it was read"
        )

    async def listing(
        self,
        run: str | None,
        step_min: int | None,
        step_max: int | None,
        *,
        fresh: bool,
        concurrency: int,
    ) -> list[SnapshotInfo]:
        """Committed snapshots, newest first, filtered by run and inclusive step range.

        Manifests not seen yet are loaded, ``concurrency`` at a time; with ``fresh``, the
        backend checks every snapshot's manifest now rather than recall it. A snapshot
        whose manifest cannot be read is logged and left out.
        """
        ids = await self._backend.committed_ids(fresh=fresh)
        slots = asyncio.Semaphore(concurrency)

        async def load(snapshot_id: str) -> None:
            async with slots:
                try:
                    await self.top(snapshot_id)
                except SnapshotNotFoundError:
                    pass  # deleted since the listing
                except FormatVersionError as error:
                    # unreadable: left out of listings, explained by info() and reads
                    _log.warning(
                        "store %s: snapshot %s is not listed: %s",
                        self._backend.location,
                        snapshot_id,
                        error,
                    )

        await asyncio.gather(*(load(i) for i in ids if i not in self._infos))
        found = [self._infos[i] for i in ids if i in self._infos]
        return sorted(
            (
                info
                for info in found
                if (run is None or info.run == run)
                and (step_min is None or info.step >= step_min)
                and (step_max is None or info.step <= step_max)
            ),
            key=lambda info: info.id,
            reverse=True,
        )
