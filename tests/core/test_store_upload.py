"""Committing an uploaded safetensors file: a record mapped from the file, written as is.

An upload is spooled to a file, read with ``record_from_safetensors`` (a mapping, no
copy) and committed with ``write_snapshot``. The write itself must not hold the
gradients in memory more than once more (the packed array), however many there are.
"""

from __future__ import annotations

import math
import tracemalloc
from pathlib import Path

import numpy as np

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.safetensors_file import record_from_safetensors, safetensors_chunks
from gradvault.core.store import SnapshotStore, open_store


def small_gradients(total_bytes: int, seed: int = 0) -> GradientsParamsRecord:
    """Gradients below the pack threshold, of several dtypes, ``total_bytes`` or so in all."""
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_]
    entries, size, i = [], 0, 0
    while size < total_bytes:
        dtype = np.dtype(dtypes[i % len(dtypes)])
        count = int(rng.integers(1, 12_000 // dtype.itemsize))
        if dtype.kind == "f":
            array = (rng.standard_normal(count) * 10).astype(dtype)
        elif dtype == np.bool_:
            array = rng.integers(0, 2, count).astype(bool)
        else:
            array = rng.integers(-100 if dtype.kind == "i" else 0, 100, count).astype(dtype)
        entries.append(GradientRecordEntry.from_array(ParamId(), f"p{i}", array))
        size += array.nbytes
        i += 1
    return GradientsParamsRecord(entries, metadata={"source": "upload"})


def write_file(record: GradientsParamsRecord, path: Path) -> Path:
    with open(path, "wb") as file:
        for chunk in safetensors_chunks(record):
            file.write(chunk)
    return path


async def test_an_uploaded_file_commits_bit_for_bit(store: SnapshotStore, tmp_path: Path) -> None:
    record = small_gradients(200_000)
    rng = np.random.default_rng(1)
    big = GradientRecordEntry.from_array(
        ParamId(), "big", rng.standard_normal((64, 100)).astype(np.float32)
    )
    record = GradientsParamsRecord([*record.entries, big], metadata=record.metadata)
    uploaded = record_from_safetensors(write_file(record, tmp_path / "up.safetensors"))
    info = await store.write_snapshot(uploaded, run="upload", step=3, tags={"via": "http"})
    back = await store.read_snapshot(info.id)
    assert back == record
    assert back.metadata["source"] == "upload"
    assert back.metadata["snapshot"]["tags"] == {"via": "http"}


async def test_packed_stats_are_right_across_the_whole_packed_array(tmp_path: Path) -> None:
    record = small_gradients(10 * 2**20)  # several of the stats' windows
    async with open_store(tmp_path / "store") as store:
        info = await store.write_snapshot(record, run="r", step=0)
        manifest = await store.info(info.id)
    stats = manifest["gradients"]["stats"]
    assert manifest["packed"] is not None
    for i, gradient in enumerate(record):
        values = gradient.array.astype(np.float64).reshape(-1)
        expected_norm = math.sqrt(float(np.dot(values, values)))
        expected_max = float(np.abs(values).max()) if values.size else 0.0
        assert math.isclose(stats["l2_norm"][i], expected_norm, rel_tol=1e-9), gradient.name
        assert stats["max_abs"][i] == expected_max, gradient.name


async def test_committing_an_uploaded_file_copies_its_gradients_at_most_once(
    tmp_path: Path,
) -> None:
    record = small_gradients(24 * 2**20)
    path = write_file(record, tmp_path / "up.safetensors")
    nbytes = record.nbytes
    del record
    async with open_store(tmp_path / "store") as store:
        tracemalloc.start()
        try:
            uploaded = record_from_safetensors(path)  # mapped: not a traced allocation
            await store.write_snapshot(uploaded, run="r", step=0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    # the packed array is one copy; beyond it, only bounded working space (the stats
    # used to square the whole packed array in float64: 2x to 8x its size more)
    assert peak < nbytes + 32 * 2**20, f"peak {peak / 2**20:.1f} MiB for {nbytes / 2**20:.1f} MiB"
