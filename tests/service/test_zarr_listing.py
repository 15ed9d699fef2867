"""zarr-python lists a snapshot over HTTP (``/v1/zarr``) from its group document alone.

HTTP has no listing, so ``members()``, ``array_keys()`` and ``tree()`` of a group opened
by URL work only from the consolidated metadata of the snapshot's ``zarr.json``. Every
way a snapshot reaches the store is covered: written by the store (local and S3), uploaded
through the service, and one rank's shard of a sharded snapshot. A snapshot of one chunk
(the upload here, in the service's 32 MiB chunks) has nothing to list: its node is the
packed array (format 4), which zarr-python opens by the same URL.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import ml_dtypes
import numpy as np
import pytest
import zarr

import gradvault.zarr_dtypes  # noqa: F401 - registers bfloat16 with zarr-python
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.records.safetensors_file import safetensors_chunks
from gradvault.core.store import new_snapshot_id

#: three own arrays (64 KiB and more, the default pack threshold) and two packed gradients
ARRAYS = {
    "fc1.weight": np.arange(200 * 100, dtype=np.float32).reshape(200, 100) / 7,
    "fc1.bias": np.linspace(-1, 1, 5, dtype=np.float32),
    "emb": (np.arange(300 * 120, dtype=np.float32).reshape(300, 120) / 3).astype(
        ml_dtypes.bfloat16
    ),
    "counts": np.arange(-4000, 5000, dtype=np.int64),
    "scalar": np.asarray(2.5, dtype=np.float64),  # 0-d
}


def record() -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), n, a) for n, a in ARRAYS.items()]
    )


@pytest.fixture
def serving() -> str:
    return "uvicorn"  # zarr-python reaches the service through fsspec's HTTP filesystem


def list_and_read(
    url: str,
) -> tuple[list[str], list[str], str, list[str], dict[str, np.ndarray]]:
    """members(), array_keys() and tree() of the group at ``url``, the arrays its manifest
    names, and its gradients by name."""
    group = zarr.open_group(url, mode="r")
    members = sorted(name for name, _ in group.members())
    array_keys = sorted(group.array_keys())
    tree = str(group.tree())
    table = group.attrs["gradvault"]["gradients"]
    packed = group["packed"][...]
    found = {}
    for i, name in enumerate(table["name"]):
        if table["array"][i] == "packed":
            start, size = table["offset"][i], table["nbytes"][i]
            raw = packed[start : start + size].tobytes()
            dtype = np.dtype(table["dtype"][i])
            found[name] = np.frombuffer(raw, dtype).reshape(tuple(table["shape"][i]))
        else:
            found[name] = group[table["array"][i]][...]
    return members, array_keys, tree, sorted(set(table["array"])), found


def read_packed_node(url: str) -> tuple[str, dict[str, np.ndarray]]:
    """The node type zarr-python opens at ``url``, and the gradients of a snapshot whose node
    is the packed array, read from it by the manifest in its attributes."""
    node = zarr.open(url, mode="r")
    if not isinstance(node, zarr.Array):
        return type(node).__name__, {}
    table = node.attrs["gradvault"]["gradients"]
    assert set(table["array"]) == {""}  # every gradient: the snapshot's node
    found = {}
    for i, name in enumerate(table["name"]):
        start, size = table["offset"][i], table["nbytes"][i]
        raw = node[start : start + size].tobytes()
        found[name] = np.frombuffer(raw, np.dtype(table["dtype"][i])).reshape(
            tuple(table["shape"][i])
        )
    return "Array", found


async def check_listed(base_url: str, path: str) -> None:
    members, array_keys, tree, named, found = await asyncio.to_thread(
        list_and_read, f"{base_url}/v1/zarr/{path}"
    )
    assert array_keys == members
    # the arrays the manifest names, as the store laid them out: 3 own arrays and the packed
    # one where the snapshot is longer than a chunk (direct_store's 4 KiB chunks)
    assert "packed" in members and members == named
    for name in members:
        assert name in tree
    assert set(found) == set(ARRAYS)
    for name, array in ARRAYS.items():
        assert found[name].dtype == array.dtype, name
        assert found[name].tobytes() == array.tobytes(), name


async def test_a_stored_snapshot_lists_over_http(service, direct_store) -> None:
    info = await direct_store.write_snapshot(record(), run="r", step=1)
    await check_listed(service.base_url, f"snapshots/{info.id}")


async def upload_one_chunk(client: httpx.AsyncClient, step: int) -> str:
    """Upload ``record()`` (one chunk in the service's 32 MiB chunks); its snapshot id."""
    response = await client.post(
        "/v1/snapshots",
        params={"run": "r", "step": step},
        content=b"".join(bytes(piece) for piece in safetensors_chunks(record())),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def test_an_uploaded_snapshot_of_one_chunk_reads_over_http_as_an_array(service) -> None:
    async with service.client() as client:
        snapshot_id = await upload_one_chunk(client, 2)
    url = f"{service.base_url}/v1/zarr/snapshots/{snapshot_id}"
    kind, found = await asyncio.to_thread(read_packed_node, url)
    assert kind == "Array" and set(found) == set(ARRAYS)
    for name, array in ARRAYS.items():
        assert found[name].dtype == array.dtype, name
        assert found[name].tobytes() == array.tobytes(), name


@pytest.mark.parametrize("store_kind", ["local"])
async def test_a_one_chunk_snapshots_document_with_an_edited_array_field_is_not_served(
    service, store_url
) -> None:
    """The document of a snapshot of one chunk is its packed array's: edited (its dtype,
    which the manifest's checksum does not cover), it is a 500 naming the field, as a read
    of the gradients is, not served to a Zarr reader to misread the chunk by."""
    async with service.client() as client:
        snapshot_id = await upload_one_chunk(client, 4)
        path = Path(store_url) / "snapshots" / snapshot_id / "zarr.json"
        document = json.loads(path.read_bytes())
        assert document["node_type"] == "array"
        document["data_type"] = "int8"
        path.write_text(json.dumps(document))
        response = await client.get(f"/v1/zarr/snapshots/{snapshot_id}/zarr.json")
    assert response.status_code == 500
    assert response.json()["error"] == "ManifestError"
    assert "data_type" in response.json()["detail"] and snapshot_id in response.json()["detail"]


async def test_a_shard_lists_over_http(service, direct_store) -> None:
    snapshot_id = new_snapshot_id()
    for rank in range(2):
        await direct_store.write_shard(
            record(), snapshot_id=snapshot_id, rank=rank, world_size=2, run="r", step=3
        )
    await check_listed(service.base_url, f"snapshots/{snapshot_id}/ranks/1")
