"""Sharded snapshots: one snapshot id written by several processes, one shard per rank.

Each rank writes its gradients as a complete snapshot group of its own under
``snapshots/<id>/ranks/<rank>/`` (packed array, own arrays, and a manifest that says
``"shard": {"rank", "world_size"}``) and publishes it atomically; the snapshot's own
``zarr.json``, the sharded manifest (``world_size`` and one summary per rank), is written
only once every rank of the declared world size has published, and that is the commit.
The backends decide who commits (``_local``, ``_s3``); this module holds what does no
I/O: the arguments' checks, the agreement between shards, and the sharded manifest.
docs/FORMAT.md, "Sharded snapshots", is the layout and the protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from ..errors import InvalidArgumentError, InvalidFieldError, ManifestError
from ._manifest import Manifest, SnapshotInfo
from ._manifest_checksum import check_sealed, seal
from ._zarr_format import STORE_FORMAT_VERSION, dump_json, group_metadata

#: Columns of the sharded manifest's ``shards`` table, one entry per rank.
SHARD_COLUMNS = ("rank", "device", "backend", "compression", "nbytes", "num_params")


def check_rank(rank: object, world_size: object) -> tuple[int, int]:
    """``(rank, world_size)`` if ``world_size >= 1`` and ``0 <= rank < world_size`` (ints)."""
    if type(world_size) is not int or world_size < 1:  # bools are refused
        raise InvalidArgumentError(f"world_size must be an int >= 1; got {world_size!r}")
    if type(rank) is not int or not 0 <= rank < world_size:
        raise InvalidArgumentError(
            f"rank must be an int in 0..{world_size - 1} (world_size {world_size}); got {rank!r}"
        )
    return rank, world_size


def rank_of_folder(name: str) -> int | None:
    """The rank a folder under ``ranks/`` is named for (plain decimal), else None."""
    if name.isdecimal() and name.isascii() and str(int(name)) == name:
        return int(name)
    return None


@dataclass(frozen=True)
class ShardInfo:
    """One rank's shard, durable: which snapshot, which rank, and whether it is committed.

    ``committed`` is True once every rank of ``world_size`` has written its shard and the
    snapshot is visible; ``snapshot`` is then its SnapshotInfo (else None: another rank's
    write completes it).
    """

    id: str
    run: str
    step: int
    created_at: str
    rank: int
    world_size: int
    nbytes: int
    num_params: int
    committed: bool
    snapshot: SnapshotInfo | None = None


def manifest_in(raw: bytes | memoryview, where: str) -> dict[str, Any]:
    """``attributes["gradvault"]`` of a snapshot's ``zarr.json``; ManifestError if there is
    none."""
    return manifest_and_node(raw, where)[0]


def manifest_and_node(raw: bytes | memoryview, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`manifest_in`, and the document's other fields: its node's own (a group's, or
    the packed array's where the snapshot's node is that array)."""
    try:
        document = orjson.loads(raw)
        manifest = document["attributes"]["gradvault"]
    except (ValueError, KeyError, TypeError) as error:
        raise ManifestError(
            f"{where}: its zarr.json has no gradvault manifest ({error!r})"
        ) from None
    if type(manifest) is not dict:
        raise ManifestError(f"{where}: its gradvault manifest is not an object")
    return manifest, {key: value for key, value in document.items() if key != "attributes"}


class ShardedSet:
    """What one rank knows of its snapshot; decides from the published shards whether to commit.

    The backend calls :meth:`check` with the shards published before this rank's (folder
    name under ``ranks/`` to that shard's raw ``zarr.json``), so that a rank that
    disagrees is refused before its shard is published, and :meth:`commit_document` with
    every shard published after it: None while some rank is missing, else the sharded
    manifest's document. Shards that disagree with this one (another world size, run,
    step or tags, a rank outside the world) raise InvalidArgumentError or
    InvalidFieldError, and nothing commits.
    """

    def __init__(
        self,
        snapshot_id: str,
        *,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: dict[str, str],
    ) -> None:
        self.snapshot_id = snapshot_id
        self.rank = rank
        self.world_size = world_size
        self.run = run
        self.step = step
        self.tags = tags

    def _where(self, rank: int) -> str:
        return f"snapshot {self.snapshot_id}: the shard of rank {rank}"

    def check_agreement(self, rank: int, manifest: dict[str, Any]) -> None:
        """Raise if the shard ``manifest`` of ``rank`` disagrees with this rank's write."""
        shard = manifest.get("shard")
        theirs = shard.get("world_size") if isinstance(shard, dict) else None
        if theirs != self.world_size:
            raise InvalidArgumentError(
                f"{self._where(rank)} declares world_size {theirs!r}; rank {self.rank} "
                f"declares world_size {self.world_size}: every rank of one snapshot must "
                f"declare the same world size"
            )
        if rank >= self.world_size:
            raise InvalidArgumentError(
                f"{self._where(rank)} is outside world_size {self.world_size} "
                f"(ranks 0..{self.world_size - 1})"
            )
        for field, ours in (("run", self.run), ("step", self.step), ("tags", self.tags)):
            if manifest.get(field) != ours:
                raise InvalidFieldError(
                    f"{self._where(rank)} has {field} {manifest.get(field)!r}; rank "
                    f"{self.rank} writes {field} {ours!r}: every rank of one snapshot must "
                    f"write the same run, step and tags"
                )

    def check(self, published: Mapping[str, bytes | memoryview]) -> dict[int, dict[str, Any]]:
        """The published shards' manifests by rank, once each is seen to agree with this one.

        ``published`` maps folder names under ``ranks/`` to their raw ``zarr.json``.
        """
        manifests: dict[int, dict[str, Any]] = {}
        for name, raw in published.items():
            rank = rank_of_folder(name)
            if rank is None:
                continue  # not a shard (nothing of ours writes such a folder)
            manifest = manifest_in(raw, self._where(rank))
            check_sealed(manifest, self._where(rank))
            self.check_agreement(rank, manifest)
            manifests[rank] = manifest
        return manifests

    def commit_document(self, published: Mapping[str, bytes | memoryview]) -> bytes | None:
        """The sharded manifest's group document once every rank is published, else None."""
        manifests = self.check(published)
        if len(manifests) < self.world_size:
            return None
        shards = [
            Manifest(manifests[r], self.snapshot_id, (r, self.world_size))
            for r in range(self.world_size)
        ]
        sealed = seal(self.sharded_manifest(shards))
        return dump_json(group_metadata({"gradvault": sealed}), compact=True)

    def sharded_manifest(self, shards: list[Manifest]) -> dict[str, Any]:
        """The snapshot's manifest over its validated shards, in rank order."""
        documents = [shard.document for shard in shards]
        columns = {
            "rank": list(range(len(documents))),
            "device": [d["device"] for d in documents],
            "backend": [d.get("backend") for d in documents],
            "compression": [d["compression"] for d in documents],
            "nbytes": [d["nbytes"] for d in documents],
            "num_params": [d["num_params"] for d in documents],
        }
        compressions = set(columns["compression"])
        first = documents[0]
        return {
            "format_version": STORE_FORMAT_VERSION,
            "id": self.snapshot_id,
            "run": self.run,
            "step": self.step,
            "created_at": first["created_at"],
            "device": ",".join(dict.fromkeys(columns["device"])),
            "backend": ",".join(dict.fromkeys(b or "" for b in columns["backend"])),
            "tags": self.tags,
            "metadata": None,
            "compression": compressions.pop() if len(compressions) == 1 else None,
            "nbytes": sum(columns["nbytes"]),
            "num_params": sum(columns["num_params"]),
            "world_size": self.world_size,
            "shards": columns,
        }


def ranks_group_document() -> bytes:
    """The ``ranks`` group's ``zarr.json`` (no attributes)."""
    return dump_json(group_metadata())


class ShardedManifest:
    """A sharded snapshot's manifest, validated: world size and the per-rank summaries.

    ManifestError (a FormatVersionError) names the field that is wrong.
    """

    def __init__(self, document: dict[str, Any], snapshot_id: str) -> None:
        self.snapshot_id = snapshot_id
        self.document = document

        def fail(field: str, expected: str, found: object) -> NoReturn:
            raise ManifestError(
                f"snapshot {snapshot_id}: sharded manifest field {field!r} should be "
                f"{expected}; found {found!r}"[:600]
            )

        if document.get("id") != snapshot_id:
            fail("id", f"the snapshot's own id {snapshot_id!r}", document.get("id"))
        run = document.get("run")
        if type(run) is not str or not run:
            fail("run", "a non-empty string", run)
        step = document.get("step")
        if type(step) is not int or step < 0:
            fail("step", "an int >= 0", step)
        for field in ("created_at", "device"):
            if type(document.get(field)) is not str:
                fail(field, "a string", document.get(field))
        tags = document.get("tags")
        if type(tags) is not dict or not all(type(v) is str for v in tags.values()):
            fail("tags", "an object mapping strings to strings", tags)
        world_size = document.get("world_size")
        if type(world_size) is not int or world_size < 1:
            fail("world_size", "an int >= 1", world_size)
        shards = document.get("shards")
        if type(shards) is not dict:
            fail("shards", "an object of per-rank columns", shards)
        for column in SHARD_COLUMNS:
            values = shards.get(column)
            if type(values) is not list or len(values) != world_size:
                fail(f"shards.{column}", f"a list of {world_size} entries", values)
        if shards["rank"] != list(range(world_size)):
            fail("shards.rank", f"the ranks 0..{world_size - 1} in order", shards["rank"])
        for column in ("nbytes", "num_params"):
            values = shards[column]
            if not all(type(v) is int and v >= 0 for v in values):
                fail(f"shards.{column}", "ints >= 0", values)
            if document.get(column) != sum(values):
                fail(column, f"the shards' total {sum(values)}", document.get(column))
        self.world_size: int = world_size

    def check_rank(self, rank: object) -> int:
        """``rank`` if it is one of this snapshot's ranks; InvalidArgumentError otherwise."""
        if type(rank) is not int or not 0 <= rank < self.world_size:
            raise InvalidArgumentError(
                f"snapshot {self.snapshot_id} has ranks 0..{self.world_size - 1} "
                f"(world_size {self.world_size}); got rank {rank!r}"
            )
        return rank
