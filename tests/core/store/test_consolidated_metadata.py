"""Each snapshot group's ``zarr.json`` lists its arrays (Zarr v3 consolidated metadata).

A reader that cannot list the store (HTTP) learns a snapshot's arrays from that one
document. It must be what zarr-python's ``consolidate_metadata`` writes, hold every array
of the snapshot with the array's own ``zarr.json``, and be written by every kind of
write: local and S3, whole snapshots and shards, own arrays and the packed one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import zarr
from zarr.core.group import ConsolidatedMetadata, GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata

import gradvault.zarr_dtypes  # noqa: F401 - registers bfloat16 with zarr-python
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, new_snapshot_id


def make_record(seed: int) -> GradientsParamsRecord:
    """Own arrays (two chunks, one chunk, 0-d, empty, bf16) and packed small gradients."""
    rng = np.random.default_rng(seed)
    arrays = {
        "fc1.weight": rng.standard_normal((40, 50)).astype(np.float32),
        "fc1.bias": rng.standard_normal(5).astype(np.float32),
        "scale": np.asarray(2.5, dtype=np.float64),
        "empty": np.zeros((0, 600), dtype=np.float32),
        "emb": rng.standard_normal((30, 20)).astype(ml_dtypes.bfloat16),
        "counts": rng.integers(-9, 9, 700).astype(np.int64),
        "mask": rng.integers(0, 2, 9).astype(bool),
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, a) for name, a in arrays.items()]
    )


async def document(store: SnapshotStore, path: str) -> dict[str, Any]:
    return json.loads(bytes(await store.read_key(path)))


async def check_group(store: SnapshotStore, group: str) -> dict[str, Any]:
    """The group's document, checked against zarr-python's consolidation of its arrays."""
    ours = await document(store, f"{group}/zarr.json")
    table = ours["attributes"]["gradvault"]["gradients"]
    names = sorted(set(table["array"]))
    assert "packed" in names and len(names) > 2  # both kinds of array are there
    arrays = {name: await document(store, f"{group}/{name}/zarr.json") for name in names}
    consolidated = GroupMetadata(
        attributes=ours["attributes"],
        consolidated_metadata=ConsolidatedMetadata(
            metadata={name: ArrayV3Metadata.from_dict(doc) for name, doc in arrays.items()}
        ),
    )
    theirs = json.loads(json.dumps(consolidated.to_dict()))  # as zarr-python writes it
    assert ours == theirs
    assert list(ours) == list(theirs)  # key order, as zarr-python writes it
    assert list(ours["consolidated_metadata"]["metadata"]) == names
    assert ours["consolidated_metadata"]["metadata"] == arrays
    return ours


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_snapshot_group_lists_every_array_as_zarr_python_consolidates(
    store: SnapshotStore, compression: str | None
) -> None:
    info = await store.write_snapshot(make_record(0), run="r", step=1, compression=compression)
    await check_group(store, f"snapshots/{info.id}")


async def test_each_shard_group_lists_its_own_arrays(store: SnapshotStore) -> None:
    snapshot_id = new_snapshot_id()
    for rank in range(2):
        shard = await store.write_shard(
            make_record(rank), snapshot_id=snapshot_id, rank=rank, world_size=2, run="r", step=1
        )
    assert shard.committed
    for rank in range(2):
        await check_group(store, f"snapshots/{snapshot_id}/ranks/{rank}")
    # the snapshot's own document stays the sharded manifest alone (docs/FORMAT.md)
    top = await document(store, f"snapshots/{snapshot_id}/zarr.json")
    assert list(top) == ["attributes", "zarr_format", "node_type"]


async def test_zarr_python_lists_and_reads_a_snapshot_from_its_group_document(
    tmp_path: Path,
) -> None:
    from gradvault.core.store import open_store

    record = make_record(3)
    async with open_store(tmp_path, chunk_bytes=4096, pack_threshold=512) as store:
        info = await store.write_snapshot(record, run="r", step=1)
    group = zarr.open_group(tmp_path / "snapshots" / info.id, mode="r")
    assert group.metadata.consolidated_metadata is not None
    table = group.attrs["gradvault"]["gradients"]
    own = {a for a in table["array"] if a != "packed"}
    assert sorted(group.array_keys()) == sorted(own | {"packed"})
    assert {name for name, _ in group.members()} == own | {"packed"}
    for entry in record:
        position = table["param_id"].index(str(entry.param_id))
        if table["array"][position] != "packed":
            found = group[table["array"][position]][...]
            assert found.dtype == entry.array.dtype
            assert found.tobytes() == entry.array.tobytes()
