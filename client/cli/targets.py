"""Where a command finds snapshots: a service (``--url``, ``--token``) or a store (``--store``).

What a flag's text names is :class:`gradvault.client.Target`'s to decide (and to refuse);
:class:`ServiceTarget` then goes through :class:`gradvault.client.Client`, and
:class:`StoreTarget` opens the store itself (:func:`gradvault.core.open_store`), no service
involved. Both answer in the same shapes: :class:`SnapshotInfo` summaries, and a
snapshot's detail as the service's ``GET /v1/snapshots/{id}`` gives it (``gradients`` as a
list of objects).
"""

from __future__ import annotations

import asyncio
import builtins  # builtins.list in annotations: inside the classes, list is a method
import itertools
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from gradvault.client import Target
from gradvault.core import GradientsParamsRecord, InvalidArgumentError
from gradvault.core.store import SnapshotInfo

from .errors import MissingExtraError, UsageError
from .files import save_npz, save_stream

Progress = Callable[[int, int | None], None]


class CommandTarget(Protocol):
    """What the snapshot commands need of a service or a store."""

    where: str

    def list(
        self, run: str | None, step_min: int | None, step_max: int | None, limit: int | None
    ) -> list[SnapshotInfo]: ...

    def detail(self, snapshot_id: str, rank: int | None = None) -> dict[str, Any]: ...

    def pull(
        self, snapshot_id: str, path: Path, progress: Progress | None, rank: int | None = None
    ) -> Path: ...

    def push(
        self,
        record: GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None,
        progress: Progress | None,
    ) -> SnapshotInfo: ...

    def delete(self, snapshot_id: str) -> None: ...

    def apply_retention(
        self, keep_last: int | None, keep_every: int | None, run: str | None
    ) -> builtins.list[str]: ...

    def collect_garbage(self, grace_seconds: float) -> builtins.list[str]: ...

    def close(self) -> None: ...


def detail_from_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A store manifest (gradients by column) in the service's detail shape (by row).

    A sharded snapshot's manifest has no gradients (they are in its shards), and says
    ``world_size`` and ``shards`` (one object per rank); a shard's manifest is a snapshot's
    that also says its ``rank`` and ``world_size``.
    """
    table = manifest.get("gradients") or {"param_id": [], "stats": {}}
    stats = table["stats"]
    gradients = [
        {
            "param_id": table["param_id"][i],
            "name": table["name"][i],
            "dtype": table["dtype"][i],
            "shape": table["shape"][i],
            "nbytes": table["nbytes"][i],
            "checksum": table["checksum"][i],
            "stats": {key: stats[key][i] for key in stats},
        }
        for i in range(len(table["param_id"]))
    ]
    summary = ("id", "run", "step", "created_at", "nbytes", "num_params", "device")
    shard = manifest.get("shard") or {}
    detail = {
        **{key: manifest[key] for key in summary},
        "backend": manifest.get("backend"),
        "tags": manifest.get("tags", {}),
        "metadata": manifest.get("metadata"),
        "compression": manifest.get("compression"),
        "gradients": gradients,
        "world_size": shard.get("world_size", manifest.get("world_size")),
    }
    shards = manifest.get("shards")
    if shards is not None:  # by column in the manifest, one object per rank here
        rows = zip(*shards.values(), strict=True)
        detail["shards"] = [dict(zip(shards, row, strict=True)) for row in rows]
    if shard:
        detail["rank"] = shard["rank"]
    return detail


class ServiceTarget:
    """The service at ``url`` through the blocking client."""

    def __init__(self, url: str, token: str | None, *, retries: int = 3) -> None:
        try:
            service = Target.service(url, token)
        except InvalidArgumentError as error:
            raise UsageError(f"--url takes an http:// or https:// URL; got {url!r}") from error
        try:
            self.client = service.client(retries=retries)
        except ImportError as error:
            raise MissingExtraError("reaching a service (--url)", "client", error) from error
        self.where = url

    def list(
        self, run: str | None, step_min: int | None, step_max: int | None, limit: int | None
    ) -> list[SnapshotInfo]:
        page_size = min(limit, 1000) if limit else 1000
        found = self.client.list(run=run, step_min=step_min, step_max=step_max, page_size=page_size)
        return list(itertools.islice(found, limit))

    def detail(self, snapshot_id: str, rank: int | None = None) -> dict[str, Any]:
        return self.client.info(snapshot_id, rank=rank)

    def pull(
        self, snapshot_id: str, path: Path, progress: Progress | None, rank: int | None = None
    ) -> Path:
        return self.client.download(snapshot_id, path, rank=rank, progress=progress)

    def push(
        self,
        record: GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None,
        progress: Progress | None,
    ) -> SnapshotInfo:
        return self.client.push(record, run=run, step=step, tags=tags, progress=progress)

    def delete(self, snapshot_id: str) -> None:
        self.client.delete(snapshot_id)

    def apply_retention(
        self, keep_last: int | None, keep_every: int | None, run: str | None
    ) -> builtins.list[str]:
        """The client's retention pass over HTTP (the rules and checks of a store's)."""
        return self.client.apply_retention(keep_last, keep_every, run)

    def collect_garbage(self, grace_seconds: float) -> builtins.list[str]:
        raise UsageError(
            "leftovers of interrupted writes are collected on the store itself: give --store "
            "(over the service, gc applies --keep-last/--keep-every only)",
            prog="gradvault gc",
        )

    def close(self) -> None:
        self.client.close()


class StoreTarget:
    """The store at ``url`` (a folder, ``file://`` or ``s3://``), opened by this process.

    With ``must_exist``, a local folder that is not there is an error (a typo should not
    read as an empty store).
    """

    def __init__(self, url: str, *, must_exist: bool) -> None:
        store = Target.store(url)
        folder = store.local_folder
        if folder is not None:
            if folder.exists() and not folder.is_dir():
                raise NotADirectoryError(20, "the store is a file, not a folder", os.fspath(folder))
            if must_exist and not folder.is_dir():
                raise FileNotFoundError(2, "no store (no such folder)", os.fspath(folder))
        self.where = url
        self._runner = asyncio.Runner()
        self._store = store.open_store()

    def _run(self, coroutine: Any) -> Any:
        return self._runner.run(coroutine)

    def list(
        self, run: str | None, step_min: int | None, step_max: int | None, limit: int | None
    ) -> list[SnapshotInfo]:
        found = self._run(self._store.list(run=run, step_min=step_min, step_max=step_max))
        return found[:limit] if limit else found

    def detail(self, snapshot_id: str, rank: int | None = None) -> dict[str, Any]:
        return detail_from_manifest(self._run(self._store.info(snapshot_id, rank=rank)))

    def pull(
        self, snapshot_id: str, path: Path, progress: Progress | None, rank: int | None = None
    ) -> Path:
        if path.suffix == ".npz":
            save_npz(path, self._run(self._store.read_snapshot(snapshot_id, rank=rank)))
            return path

        async def write() -> None:
            total, pieces = await self._store.iter_safetensors(snapshot_id, rank=rank)
            await save_stream(path, pieces, progress, total)

        self._run(write())
        return path

    def push(
        self,
        record: GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None,
        progress: Progress | None,
    ) -> SnapshotInfo:
        return self._run(
            self._store.write_snapshot(
                record, run=run, step=step, tags=dict(tags) if tags else None
            )
        )

    def delete(self, snapshot_id: str) -> None:
        self._run(self._store.delete(snapshot_id))

    def apply_retention(
        self, keep_last: int | None, keep_every: int | None, run: str | None
    ) -> builtins.list[str]:
        return self._run(self._store.apply_retention(keep_last, keep_every, run=run))

    def collect_garbage(self, grace_seconds: float) -> builtins.list[str]:
        return self._run(self._store.gc(grace_seconds))

    def close(self) -> None:
        try:
            self._run(self._store.close())
        finally:
            self._runner.close()
