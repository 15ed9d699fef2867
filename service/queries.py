"""What the routes and the pages ask of the store, written once for both.

Each function checks the ids it is given (InvalidSnapshotIdError, InvalidParamIdError:
400) and reads what it needs; a route or a page adds only how it answers. The byte
resources (:class:`GradientBytes`, :class:`SafetensorsFile`, :class:`StoreKey`) are
answered by :func:`gradvault.service.ranges.ranged_response`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, Literal

import crc32c_rs

from gradvault.core import MissingGradientError, ParamId, ShardedSnapshotError
from gradvault.core.records.safetensors_file import data_order
from gradvault.core.store import SnapshotStore, parse_snapshot_id

from .npy import npy_header
from .ranges import RangedResource

#: how a gradient is served: its raw little-endian bytes, or a .npy file of them
GradientForm = Literal["raw", "npy"]

#: the name of a Zarr group's or array's document
ZARR_METADATA_NAME = "zarr.json"


async def snapshot_manifest(
    store: SnapshotStore, snapshot_id: str, rank: int | None = None
) -> dict[str, Any]:
    """The manifest of snapshot ``snapshot_id``, or of rank ``rank``'s shard of a sharded
    one (a copy; docs/FORMAT.md)."""
    return await store.info(parse_snapshot_id(snapshot_id), rank=rank)


def refuse_sharded(manifest: dict[str, Any]) -> None:
    """ShardedSnapshotError (409) if ``manifest`` is a sharded snapshot's, whose gradients
    are in its ranks' shards: the error names the ``rank`` query that reads one."""
    world_size = manifest.get("world_size")
    if world_size is not None:
        raise ShardedSnapshotError(
            f"snapshot {manifest['id']} is sharded over {world_size} ranks and its gradients "
            f"are in the ranks' shards: pass ?rank= (0..{world_size - 1}) to read one rank's"
        )


def gradient_row(manifest: dict[str, Any], param_id: str) -> dict[str, Any]:
    """The manifest's entry for ``param_id``: name, dtype, shape, nbytes and checksum.

    ShardedSnapshotError (409) for a sharded snapshot, MissingGradientError (404) for a
    param id the snapshot (or the shard) lacks.
    """
    refuse_sharded(manifest)
    table, shard = manifest["gradients"], manifest.get("shard")
    where = f"snapshot {manifest['id']}" + (f" (rank {shard['rank']}'s shard)" if shard else "")
    try:
        position = table["param_id"].index(param_id)
    except ValueError:
        raise MissingGradientError(f"{where} has no gradient for param {param_id}") from None
    return {key: table[key][position] for key in ("name", "dtype", "shape", "nbytes", "checksum")}


class GradientBytes(RangedResource):
    """One gradient of a snapshot: its raw bytes, or those after a .npy header."""

    def __init__(
        self,
        store: SnapshotStore,
        snapshot_id: str,
        param_id: str,
        row: dict[str, Any],
        form: GradientForm,
        rank: int | None = None,
    ) -> None:
        self.store, self.snapshot_id, self.param_id = store, snapshot_id, param_id
        self.rank = rank
        self.name = row["name"]
        self.prefix = npy_header(row["dtype"], tuple(row["shape"])) if form == "npy" else b""
        self.size = len(self.prefix) + row["nbytes"]
        checksum = row["checksum"].removeprefix("crc32c:")
        self.etag = f'"crc32c-{checksum}{".npy" if form == "npy" else ""}"'
        self.headers = {
            "X-Gradvault-Dtype": row["dtype"],
            "X-Gradvault-Shape": ",".join(str(n) for n in row["shape"]),
        }

    def describe(self) -> str:
        shard = "" if self.rank is None else f", rank {self.rank}'s shard"
        return f"gradient {self.param_id} ({self.name!r}) of snapshot {self.snapshot_id}{shard}"

    def open(self, start: int, stop: int) -> tuple[bytes, AsyncIterator[bytes | memoryview] | None]:
        held = len(self.prefix)
        first, last = max(start - held, 0), stop - held
        stored = None
        if last > first:
            stored = self.store.iter_gradient(
                self.snapshot_id, self.param_id, first, last, rank=self.rank
            )
        return self.prefix[start:stop], stored


async def open_gradient(
    store: SnapshotStore,
    snapshot_id: str,
    param_id: str,
    form: GradientForm,
    rank: int | None = None,
) -> GradientBytes:
    """Gradient ``param_id`` of snapshot ``snapshot_id`` (of rank ``rank``'s shard of a
    sharded one), as ``form``, ready to serve."""
    snapshot_id = parse_snapshot_id(snapshot_id)
    param_id = str(ParamId.parse(param_id))
    row = gradient_row(await store.info(snapshot_id, rank=rank), param_id)
    return GradientBytes(store, snapshot_id, param_id, row, form, rank)


def safetensors_etag(header: bytes, manifest: dict[str, Any]) -> str:
    """A strong validator of the file: its header (layout, names, summary) and data checksums."""
    value = crc32c_rs.crc32c(header)
    for checksum in manifest["gradients"]["checksum"]:
        value = crc32c_rs.crc32c(checksum.encode(), value)
    return f'"st-{value:08x}"'


class SafetensorsFile(RangedResource):
    """A snapshot as one safetensors file: its header, then its gradients in data order.

    The whole file streams from the store's own stream, opened to learn its length and
    header; a range reads only the gradients' bytes it covers.
    """

    def __init__(
        self,
        store: SnapshotStore,
        manifest: dict[str, Any],
        size: int,
        header: bytes,
        rest: AsyncGenerator[bytes | memoryview, None],
        rank: int | None = None,
    ) -> None:
        self.store, self.manifest, self.snapshot_id = store, manifest, manifest["id"]
        self.rank = rank
        self.size, self.header = size, header
        self._rest: AsyncGenerator[bytes | memoryview, None] | None = rest
        self.etag = safetensors_etag(header, manifest)
        name = self.snapshot_id if rank is None else f"{self.snapshot_id}-rank{rank}"
        self.headers = {"Content-Disposition": f'attachment; filename="{name}.safetensors"'}

    def describe(self) -> str:
        shard = "" if self.rank is None else f", rank {self.rank}'s shard"
        return f"the safetensors file of snapshot {self.snapshot_id}{shard}"

    def open(self, start: int, stop: int) -> tuple[bytes, AsyncIterator[bytes | memoryview] | None]:
        if (start, stop) == (0, self.size) and self._rest is not None:
            rest, self._rest = self._rest, None  # handed over: aclose leaves it alone
            return self.header, rest
        stored = self._gradients(start, stop) if stop > len(self.header) else None
        return self.header[start:stop], stored

    async def _gradients(self, start: int, stop: int) -> AsyncIterator[bytes | memoryview]:
        """The gradients' bytes in ``[start, stop)`` of the file, read range by range."""
        table = self.manifest["gradients"]
        entries = list(
            zip(table["param_id"], table["dtype"], table["shape"], table["nbytes"], strict=True)
        )
        offset, store = len(self.header), self.store
        for position in data_order(entries):
            param_id, nbytes = entries[position][0], entries[position][3]
            first, last = max(start - offset, 0), min(stop - offset, nbytes)
            if first < last:
                async for piece in store.iter_gradient(
                    self.snapshot_id, param_id, first, last, rank=self.rank
                ):
                    yield piece
                    del piece  # not kept while the next piece is read
            offset += nbytes
            if offset >= stop:
                return

    async def aclose(self) -> None:
        if self._rest is not None:
            rest, self._rest = self._rest, None
            await rest.aclose()


async def open_safetensors(
    store: SnapshotStore, snapshot_id: str, rank: int | None = None
) -> SafetensorsFile:
    """Snapshot ``snapshot_id`` as one safetensors file, ready to serve; of a sharded one,
    rank ``rank``'s shard (ShardedSnapshotError without ``rank``)."""
    snapshot_id = parse_snapshot_id(snapshot_id)
    manifest = await store.info(snapshot_id, rank=rank)
    refuse_sharded(manifest)
    size, pieces = await store.iter_safetensors(snapshot_id, rank=rank)
    try:
        header = bytes(await anext(pieces))  # iter_safetensors yields the header first
    except BaseException:
        await pieces.aclose()
        raise
    return SafetensorsFile(store, manifest, size, header, pieces, rank)


class StoreKey(RangedResource):
    """One key of the store's read-only Zarr view: a ``zarr.json`` document or a chunk.

    It has no ETag: a key is read whole to be verified, so a validator would cost a read.
    """

    def __init__(self, store: SnapshotStore, path: str, size: int) -> None:
        self.store, self.path, self.size = store, path, size
        self.headers = {}
        if path.rpartition("/")[2] == ZARR_METADATA_NAME:
            self.media_type = "application/json"

    def describe(self) -> str:
        return f"key {self.path} of the store"

    def open(self, start: int, stop: int) -> tuple[bytes, AsyncIterator[bytes | memoryview] | None]:
        return b"", self._read(start, stop)

    async def _read(self, start: int, stop: int) -> AsyncIterator[bytes | memoryview]:
        if (start, stop) == (0, self.size):
            yield await self.store.read_key(self.path)
        else:
            yield await self.store.read_key(self.path, start=start, end=stop)


async def open_store_key(store: SnapshotStore, path: str) -> StoreKey:
    """Key ``path`` of the store's Zarr view (InvalidStorePathError before any I/O)."""
    return StoreKey(store, path, await store.key_size(path))
