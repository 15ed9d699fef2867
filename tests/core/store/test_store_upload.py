"""Committing an uploaded safetensors file: a record mapped from the file, written as is.

An upload is spooled to a file, read with ``record_from_safetensors`` (a mapping, no
copy) and committed with ``write_snapshot``. The write itself must not hold the
gradients in memory more than once more (the packed array), however many there are.
"""

from __future__ import annotations

import math
import os
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.records.safetensors_file import record_from_safetensors, safetensors_chunks
from gradvault.core.store import SnapshotStore, open_store
from tests.core.os_probes import mapped_rss


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
        # float32 squares added in blocks, the blocks in float64 (docs/FORMAT.md, "Gradient
        # stats"): within the sum's rounding, as for every other gradient's norm
        assert math.isclose(stats["l2_norm"][i], expected_norm, rel_tol=1e-7), gradient.name
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


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads /proc/self/smaps")
async def test_committing_a_mapped_file_holds_a_chunk_per_array_in_flight(tmp_path: Path) -> None:
    """The pages of an uploaded file are let go as its chunks are written: what stays
    resident is bounded by the chunks in flight, not by the file's size."""
    chunk, gradients, gradient_bytes = 1 << 20, 8, 8 << 20
    # two arrays in flight, a chunk each, and around each fault what the kernel maps at
    # once (a page cache folio, up to 2 MiB on ext4 with large folios)
    bound = 2 * (chunk + 2 * (2 << 20))
    rng = np.random.default_rng(2)
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                ParamId(), f"g{i}", rng.standard_normal(gradient_bytes // 4).astype(np.float32)
            )
            for i in range(gradients)
        ]
    )
    path = write_file(record, tmp_path / "up.safetensors")
    resident: list[int] = []
    async with open_store(tmp_path / "store", chunk_bytes=chunk, max_concurrency=2) as store:
        begin = store.backend.begin

        async def watched_begin(snapshot_id: str) -> Any:
            writer = await begin(snapshot_id)
            write_array = writer.write_array

            async def watched_write_array(name: str, metadata: bytes, chunks: Any) -> None:
                def watched() -> Any:
                    for item in chunks:
                        resident.append(mapped_rss(path))
                        yield item

                await write_array(name, metadata, watched())

            writer.write_array = watched_write_array
            return writer

        store.backend.begin = watched_begin
        uploaded = record_from_safetensors(path)
        info = await store.write_snapshot(uploaded, run="r", step=0)
        assert mapped_rss(path) <= bound  # what is left once every chunk is written
        del uploaded
        back = await store.read_snapshot(info.id)
    assert back == record
    assert len(resident) == gradients * gradient_bytes // chunk
    # before: the whole 64 MiB file was resident by the last chunk
    assert max(resident) <= bound, f"up to {max(resident) / 2**20:.1f} MiB of the file"


async def test_stats_taken_chunk_by_chunk_are_those_of_the_whole_gradient(
    tmp_path: Path,
) -> None:
    rng = np.random.default_rng(3)
    plain = rng.standard_normal(300_000).astype(np.float32)
    nonfinite = rng.standard_normal(300_000).astype(np.float32)
    nonfinite[[5, 200_000]] = [np.nan, np.inf]
    nonfinite[250_000] = -np.inf
    integers = rng.integers(-1000, 1000, 100_000).astype(np.int64)
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(ParamId(), name, array)
            for name, array in (("plain", plain), ("nonfinite", nonfinite), ("ints", integers))
        ]
    )
    path = write_file(record, tmp_path / "up.safetensors")
    async with open_store(tmp_path / "store", chunk_bytes=64 * 1024) as store:
        info = await store.write_snapshot(record_from_safetensors(path), run="r", step=0)
        manifest = await store.info(info.id)
    stats = manifest["gradients"]["stats"]
    for i, (values, nan_count, inf_count) in enumerate(
        [(plain, 0, 0), (nonfinite, 1, 2), (integers, 0, 0)]
    ):
        finite = values[np.isfinite(values)].astype(np.float64)
        assert math.isclose(stats["l2_norm"][i], math.sqrt(float(finite @ finite)), rel_tol=1e-6)
        assert stats["max_abs"][i] == float(np.abs(finite).max())
        assert (stats["nan_count"][i], stats["inf_count"][i]) == (nan_count, inf_count)
