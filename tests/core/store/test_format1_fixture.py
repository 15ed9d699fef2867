"""Snapshots of store format version 1 (no manifest checksum) read with today's code.

tests/fixtures/format1_store was written by the release that wrote format 1
(tests/fixtures/make_format1_store.py): own arrays over several chunks, the packed
array, bfloat16 (a NaN payload, -0, a subnormal, infinity), a snapshot of one chunk,
zstd chunks and a sharded snapshot of two ranks. Every gradient reads bit for bit
against the arrays the writer recorded beside it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from gradvault.core.store import open_store

FIXTURES = Path(__file__).parents[2] / "fixtures"
SNAPSHOTS = json.loads((FIXTURES / "format1_snapshots.json").read_text())


def expected_arrays() -> dict[tuple[str, int | None], dict[str, np.ndarray]]:
    """The recorded arrays by (snapshot id, rank or None), then by ParamId text."""
    found: dict[tuple[str, int | None], dict[str, np.ndarray]] = {}
    with np.load(FIXTURES / "format1_expected.npz") as recorded:
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


@pytest.fixture
def format1_store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(FIXTURES / "format1_store", root)
    return root


async def test_every_format1_snapshot_reads_bit_for_bit(format1_store: Path) -> None:
    expected = expected_arrays()
    store = open_store(format1_store)
    try:
        listed = {info.id for info in await store.list()}
        assert listed == {entry["id"] for entry in SNAPSHOTS.values()}
        checked = 0
        for (snapshot_id, rank), arrays in expected.items():
            info = await store.info(snapshot_id, rank=rank)
            assert info["format_version"] == 1
            assert "manifest_checksum" not in info
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


def test_the_fixture_holds_each_kind_of_format1_snapshot() -> None:
    kinds = {}
    for label, entry in SNAPSHOTS.items():
        document = json.loads(
            (FIXTURES / "format1_store" / "snapshots" / entry["id"] / "zarr.json").read_text()
        )
        kinds[label] = document["attributes"]["gradvault"]
        assert kinds[label]["format_version"] == 1
    columns = kinds["own_and_packed"]["gradients"]
    assert "packed" in columns["array"] and set(columns["array"]) != {"packed"}
    assert "bfloat16" in kinds["bfloat16"]["gradients"]["dtype"]
    assert set(kinds["one_chunk"]["gradients"]["array"]) == {"packed"}
    assert kinds["zstd"]["compression"] == "zstd:3"
    assert kinds["sharded"]["world_size"] == 2
