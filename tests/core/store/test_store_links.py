"""A local store follows no symbolic link below its root: a linked folder holds nothing.

A snapshot folder linked into ``snapshots/`` from elsewhere used to be listed and read
(through the link) while ``delete`` said it did not exist. Listing, reading and delete now
agree: it is not a snapshot of the store, and nothing outside the store is read or removed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from gradvault.core.errors import ManifestError, SnapshotNotFoundError, StoreKeyNotFoundError
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import open_store


def record() -> GradientsParamsRecord:
    arrays = {"w": np.arange(2000, dtype=np.float32), "b": np.ones(3, np.float32)}
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), n, a) for n, a in arrays.items()]
    )


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


async def test_a_linked_snapshot_folder_is_not_listed_read_or_deleted(tmp_path: Path) -> None:
    store_path, outside = tmp_path / "store", tmp_path / "outside"
    async with open_store(store_path, pack_threshold=512) as store:
        kept = await store.write_snapshot(record(), run="r", step=1)
        linked = await store.write_snapshot(record(), run="r", step=2)
    # the second snapshot's folder moves out of the store and is linked back in
    folder = store_path / "snapshots" / linked.id
    shutil.move(folder, outside)
    os.symlink(outside, folder)
    before = files_under(outside)

    async with open_store(store_path, pack_threshold=512) as store:
        assert [info.id for info in await store.list()] == [kept.id]
        with pytest.raises(SnapshotNotFoundError):
            await store.info(linked.id)
        with pytest.raises(SnapshotNotFoundError):
            await store.read_snapshot(linked.id)
        with pytest.raises((SnapshotNotFoundError, StoreKeyNotFoundError)):
            await store.read_key(f"snapshots/{linked.id}/zarr.json")
        with pytest.raises(SnapshotNotFoundError):
            await store.delete(linked.id)
        assert len((await store.read_snapshot(kept.id)).entries) == 2  # the rest reads
    assert files_under(outside) == before  # nothing outside the store was touched
    assert folder.is_symlink()


@pytest.mark.parametrize(
    ("options", "linked"),
    [
        ({"pack_threshold": 512, "chunk_bytes": 4096}, "own"),
        ({"pack_threshold": 1 << 20}, "packed"),
    ],
    ids=["own array", "packed array of small gradients"],
)
async def test_a_linked_array_folder_inside_a_snapshot_is_not_read(
    tmp_path: Path, options: dict[str, int], linked: str
) -> None:
    store_path, outside = tmp_path / "store", tmp_path / "outside"
    # 8 KB of gradients: over a 4096-byte chunk they get own arrays; all small, they are
    # packed in the folder of the packed array (a snapshot of one chunk written from the
    # gradients' memory has none: its node is the packed array)
    async with open_store(store_path, **options) as store:
        info = await store.write_snapshot(record(), run="r", step=1)
        manifest = await store.info(info.id)
    own = next(
        name
        for name in manifest["gradients"]["array"]
        if (name == "packed") == (linked == "packed")
    )
    folder = store_path / "snapshots" / info.id / own
    shutil.move(folder, outside)
    os.symlink(outside, folder)
    async with open_store(store_path, **options) as store:
        # its array is missing, as if it were removed: never the linked bytes
        with pytest.raises(ManifestError, match="array document is missing"):
            await store.read_snapshot(info.id)
        with pytest.raises(ManifestError, match="zarr.json is missing"):
            await store.read_key(f"snapshots/{info.id}/{own}/zarr.json")
