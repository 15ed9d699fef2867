"""Snapshots of every earlier store format version, read with today's code.

tests/fixtures/format<N>_store was written by the last release that wrote format N
(tests/fixtures/make_format_store.py): own arrays over several chunks (chunk keys
``c/<i>/<j>``, a folder per level, in formats 1 and 2; ``c.<i>.<j>`` from format 3), the
packed array, bfloat16 (a NaN payload, -0, a subnormal, infinity), a snapshot of one
chunk (a group holding the packed array, before format 4), zstd chunks and a sharded
snapshot of two ranks. Format 1 manifests carry no checksum of themselves, later ones
do. Every gradient reads bit for bit against the arrays the writer recorded beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gradvault.core.errors import StoreKeyNotFoundError
from gradvault.core.store import open_store

FIXTURES = Path(__file__).parents[2] / "fixtures"
#: Every earlier format version, with a store of its snapshots under tests/fixtures.
EARLIER_VERSIONS = (1, 2, 3)


def separator(version: int) -> str:
    """The separator of a format's chunk keys: a folder per level before format 3."""
    return "/" if version < 3 else "."


def snapshots(version: int) -> dict[str, dict[str, object]]:
    """The fixture's snapshot ids (and world sizes) by the kind of snapshot."""
    return json.loads((FIXTURES / f"format{version}_snapshots.json").read_text())


def expected_arrays(version: int) -> dict[tuple[str, int | None], dict[str, np.ndarray]]:
    """The recorded arrays by (snapshot id, rank or None), then by ParamId text."""
    found: dict[tuple[str, int | None], dict[str, np.ndarray]] = {}
    with np.load(FIXTURES / f"format{version}_expected.npz") as recorded:
        for key in recorded.files:
            snapshot_id, rank, param_id = key.split("/")
            where = (snapshot_id, None if rank == "-" else int(rank))
            found.setdefault(where, {})[param_id] = recorded[key]
    return found


def same_bits(found: np.ndarray, expected: np.ndarray) -> bool:
    if found.dtype == ml_dtypes.bfloat16:  # recorded as its 16-bit patterns
        found = found.view(np.uint16)
    return (
        found.dtype == expected.dtype
        and found.shape == expected.shape
        and (found.tobytes() == expected.tobytes())
    )


@pytest.mark.parametrize("version", EARLIER_VERSIONS)
async def test_every_earlier_snapshot_reads_bit_for_bit(tmp_path: Path, version: int) -> None:
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / f"format{version}_store", root)
    expected = expected_arrays(version)
    store = open_store(root)
    try:
        listed = {info.id for info in await store.list()}
        assert listed == {entry["id"] for entry in snapshots(version).values()}
        checked = 0
        for (snapshot_id, rank), arrays in expected.items():
            info = await store.info(snapshot_id, rank=rank)
            assert info["format_version"] == version
            assert ("manifest_checksum" in info) == (version >= 2)
            record = await store.read_snapshot(snapshot_id, rank=rank)
            assert sorted(str(entry.param_id) for entry in record) == sorted(arrays)
            for entry in record:
                assert same_bits(np.asarray(entry.array), arrays[str(entry.param_id)]), entry.name
                one = await store.read_gradient(snapshot_id, str(entry.param_id), rank=rank)
                assert same_bits(np.asarray(one.array), arrays[str(entry.param_id)]), entry.name
                assert (one.name, one.dtype, one.shape) == (entry.name, entry.dtype, entry.shape)
                checked += 1
        assert checked == sum(len(arrays) for arrays in expected.values())
    finally:
        await store.close()


@pytest.mark.parametrize("version", EARLIER_VERSIONS)
def test_each_fixture_holds_each_kind_of_snapshot(version: int) -> None:
    kinds = {}
    store = FIXTURES / f"format{version}_store"
    for label, entry in snapshots(version).items():
        document = json.loads((store / "snapshots" / entry["id"] / "zarr.json").read_text())
        kinds[label] = document["attributes"]["gradvault"]
        assert kinds[label]["format_version"] == version
    columns = kinds["own_and_packed"]["gradients"]
    assert "packed" in columns["array"] and set(columns["array"]) != {"packed"}
    assert "bfloat16" in kinds["bfloat16"]["gradients"]["dtype"]
    assert set(kinds["one_chunk"]["gradients"]["array"]) == {"packed"}
    assert kinds["zstd"]["compression"] == "zstd:3"
    assert kinds["sharded"]["world_size"] == 2
    # chunk keys of format 1 and 2 have a folder per level: c/<i>/<j>; format 3's c.<i>.<j>
    own = next(a for a in columns["array"] if a != "packed")
    own_folder = store / "snapshots" / snapshots(version)["own_and_packed"]["id"] / own
    assert (own_folder / separator(version).join(["c", "0", "0"])).is_file()
    one_chunk = store / "snapshots" / snapshots(version)["one_chunk"]["id"]
    assert json.loads((one_chunk / "zarr.json").read_text())["node_type"] == "group"
    assert (one_chunk / "packed" / f"c{separator(version)}0").is_file()


@pytest.mark.parametrize("version", EARLIER_VERSIONS)
async def test_the_zarr_view_serves_earlier_chunk_keys_as_written(
    tmp_path: Path, version: int
) -> None:
    """``read_key`` (the service's ``/v1/zarr``) serves an earlier snapshot's chunks under
    their own keys (``c/0/0`` in formats 1 and 2); the key of the other separator is not
    one of them."""
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / f"format{version}_store", root)
    snapshot_id = snapshots(version)["own_and_packed"]["id"]
    folder = root / "snapshots" / snapshot_id
    columns = json.loads((folder / "zarr.json").read_text())["attributes"]["gradvault"]
    own = next(a for a in columns["gradients"]["array"] if a != "packed")
    store = open_store(root)
    written, other = separator(version), "." if version < 3 else "/"
    try:
        own_chunk = written.join(["c", "0", "0"])
        served = await store.read_key(f"snapshots/{snapshot_id}/{own}/{own_chunk}")
        assert bytes(served) == (folder / own / own_chunk).read_bytes()
        packed = await store.read_key(f"snapshots/{snapshot_id}/packed/c{written}0")
        assert bytes(packed) == (folder / "packed" / f"c{written}0").read_bytes()
        for key in (f"{own}/c{other}0{other}0", f"packed/c{other}0"):
            with pytest.raises(StoreKeyNotFoundError, match="has no key"):
                await store.read_key(f"snapshots/{snapshot_id}/{key}")
    finally:
        await store.close()
