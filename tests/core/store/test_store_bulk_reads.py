"""Whole-snapshot reads: every chunk read at once, each byte read and checksummed once.

``read_snapshot`` reads every array document with one ``StoreBackend.read_many`` and every
chunk with ``StoreBackend.read_many_into_checked`` (the local backend shares the files out
among a few threads). These check both calls on each store, what a restore asks of them,
and that a damaged chunk is still named, the first in read order.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import pytest

from gradvault.core.errors import ChecksumMismatchError, ManifestError
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, open_store

from ..store_files import is_chunk_key


def make_record(arrays: dict[str, np.ndarray]) -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, array) for name, array in arrays.items()]
    )


def many_arrays(count: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``count`` gradients of different sizes, each over several 4 KiB chunks, edge chunks
    included (the store fixture's chunk_bytes is 4096)."""
    rng = np.random.default_rng(seed)
    return {
        f"layer{i}.weight": rng.standard_normal((9 + i % 7, 150 + 3 * i)).astype(np.float32)
        for i in range(count)
    }


async def chunk_keys(store: SnapshotStore, snapshot_id: str) -> dict[str, int]:
    """Every chunk object of the snapshot's own arrays, by key, with its size."""
    prefix = f"snapshots/{snapshot_id}"
    objects = await store.backend.object_sizes(prefix)
    return {
        f"{prefix}/{key}": size
        for key, size in objects.items()
        if is_chunk_key(key) and not key.startswith("packed/") and size is not None
    }


async def test_read_many_gives_each_key_its_bytes_or_its_refusal(store: SnapshotStore) -> None:
    info = await store.write_snapshot(make_record(many_arrays(6)), run="r", step=1)
    keys = sorted(await chunk_keys(store, info.id))
    assert len(keys) > 12  # more than the threads that read them
    missing = f"snapshots/{info.id}/{ParamId()}/c.0.0"
    outcomes = await store.backend.read_many([*keys, missing])
    assert len(outcomes) == len(keys) + 1
    for key, outcome in zip(keys, outcomes, strict=False):
        assert bytes(outcome) == bytes(await store.backend.read(key)), key
    assert isinstance(outcomes[-1], KeyError)
    # a size limit refuses, per key, what is larger, and only that
    small = min(len(o) for o in outcomes[:-1])
    limited = await store.backend.read_many(keys, small)
    for outcome in limited:
        if isinstance(outcome, Exception):
            assert "bytes; at most" in str(outcome)
        else:
            assert len(outcome) <= small
    assert any(isinstance(o, Exception) for o in limited) == any(
        len(o) > small for o in outcomes[:-1]
    )


async def test_read_many_into_checked_fills_the_buffers_and_gives_running_crcs(
    store: SnapshotStore,
) -> None:
    info = await store.write_snapshot(make_record(many_arrays(6, seed=1)), run="r", step=1)
    sizes = await chunk_keys(store, info.id)
    rng = random.Random(0)
    requests: list[tuple[str, list[memoryview]]] = []
    for key, size in sorted(sizes.items()):
        cuts = sorted(rng.randrange(size + 1) for _ in range(rng.randrange(0, 4)))
        bounds = [0, *cuts, size]
        whole = memoryview(bytearray(size))
        requests.append((key, [whole[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]))
    wrong_size = (requests[0][0], [memoryview(bytearray(sizes[requests[0][0]] + 1))])
    missing = (f"snapshots/{info.id}/{ParamId()}/c.0.0", [memoryview(bytearray(8))])
    outcomes = await store.backend.read_many_into_checked([*requests, wrong_size, missing])
    for (key, buffers), outcome in zip(requests, outcomes, strict=False):
        expected = bytes(await store.backend.read(key))
        assert b"".join(bytes(b) for b in buffers) == expected, key
        running, crc = [], 0
        for buffer in buffers:
            crc = google_crc32c.extend(crc, bytes(buffer))
            running.append(crc)
        assert outcome == running, key
    assert isinstance(outcomes[-2], Exception) and "expected" in str(outcomes[-2])
    assert isinstance(outcomes[-1], KeyError)


class ChunkReads:
    """Records the requests of every ``read_many_into_checked`` the store makes."""

    def __init__(self, store: SnapshotStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[list[tuple[str, list[memoryview]]]] = []
        backend = store.backend
        original = backend.read_many_into_checked

        async def recorded(requests: list[tuple[str, list[memoryview]]]) -> Any:
            self.calls.append(list(requests))
            return await original(requests)

        monkeypatch.setattr(backend, "read_many_into_checked", recorded)


async def test_a_restore_reads_each_chunk_once_straight_into_the_gradients(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_record(many_arrays(8, seed=2))
    info = await store.write_snapshot(record, run="r", step=1)
    keys = await chunk_keys(store, info.id)
    reads = ChunkReads(store, monkeypatch)
    found = await store.read_snapshot(info.id)
    assert len(reads.calls) == 1  # every chunk of every gradient in one call
    requested = [key for key, _ in reads.calls[0]]
    assert sorted(requested) == sorted(keys)  # each chunk once, nothing else
    assert any(len(buffers[1]) for _, buffers in reads.calls[0])  # edge chunks among them
    for got, want in zip(found, record, strict=True):
        assert got.array.tobytes() == want.array.tobytes()
        # the data went where the restored array is: its own buffer, no copy made after
        targets = [b[0] for key, b in reads.calls[0] if f"/{got.param_id}/" in key]
        assert targets and all(np.shares_memory(got.array, t) for t in targets)


async def test_a_large_restored_gradient_starts_on_a_huge_page_boundary(
    make_store: Any,
) -> None:
    # the kernel backs it with huge pages from its first byte: one fault per 2 MiB, not
    # one per 4 KiB page; smaller gradients are left as NumPy places them
    store = make_store(chunk_bytes=1 << 20, pack_threshold=512)
    rng = np.random.default_rng(3)
    arrays = {
        f"layer{i}.weight": rng.standard_normal(shape).astype(np.float32)
        for i, shape in enumerate([(1024, 700), (3, 1000, 300), (2 << 18,)])
    }
    record = make_record(arrays)
    info = await store.write_snapshot(record, run="r", step=1)
    found = await store.read_snapshot(info.id)
    for got, want in zip(found, record, strict=True):
        assert got.array.tobytes() == want.array.tobytes()
        assert got.array.ctypes.data % (2 << 20) == 0, got.name


async def test_the_edge_chunks_padding_held_at_once_is_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 gradients just over a 1 MiB chunk: their edge chunks' padding, about 40 MiB, is
    read in runs of at most 32 MiB (plus one chunk), and every byte still comes back."""
    store = open_store(tmp_path, chunk_bytes=1 << 20, pack_threshold=1024)
    rng = np.random.default_rng(3)
    record = make_record(
        {f"g{i}": rng.integers(0, 255, (1 << 20) + 8 * (i + 1), np.uint8) for i in range(40)}
    )
    info = await store.write_snapshot(record, run="r", step=1)
    reads = ChunkReads(store, monkeypatch)
    found = await store.read_snapshot(info.id)
    assert len(reads.calls) >= 2
    for requests in reads.calls:
        padding = sum(len(buffers[1]) for _, buffers in requests)
        assert padding <= (32 << 20) + (1 << 20)
    assert [e.array.tobytes() for e in found] == [e.array.tobytes() for e in record]
    await store.close()


async def test_the_first_damaged_chunk_in_read_order_is_named(tmp_path: Path) -> None:
    store = open_store(tmp_path, chunk_bytes=4096, pack_threshold=1024)
    record = make_record(many_arrays(5, seed=4))
    info = await store.write_snapshot(record, run="r", step=1)
    folder = tmp_path / "snapshots" / info.id
    entries = list(record)
    # damage the last chunk of the fourth gradient and a middle one of the second
    for entry, pick in ((entries[3], -1), (entries[1], 1)):
        chunks = sorted((folder / str(entry.param_id)).glob("c.*"))
        path = [p for p in chunks if p.is_file()][pick]
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0x10
        path.write_bytes(bytes(data))
    for _ in range(3):  # whichever thread gets there first
        with pytest.raises(ChecksumMismatchError) as caught:
            await store.read_snapshot(info.id)
        message = str(caught.value)
        assert str(entries[1].param_id) in message and entries[1].name in message
        assert "fails its crc32c check" in message
        assert str(entries[3].param_id) not in message
    # the other gradients still read alone; the damaged ones are named alone too
    for entry in entries:
        if entry in (entries[1], entries[3]):
            with pytest.raises(ChecksumMismatchError, match=str(entry.param_id)):
                await store.read_gradient(info.id, entry.param_id)
        else:
            got = await store.read_gradient(info.id, entry.param_id)
            assert got.array.tobytes() == entry.array.tobytes()
    await store.close()


async def test_a_damaged_array_document_is_named_before_the_chunks_read_beside_it(
    tmp_path: Path,
) -> None:
    """The documents are checked while the chunks are read: a document that says other
    than the manifest is named, whether the chunks read well or one of them fails."""
    store = open_store(tmp_path, chunk_bytes=4096, pack_threshold=1024)
    record = make_record(many_arrays(5, seed=6))
    info = await store.write_snapshot(record, run="r", step=1)
    folder = tmp_path / "snapshots" / info.id
    entries = list(record)
    document = folder / str(entries[3].param_id) / "zarr.json"
    edited = json.loads(document.read_bytes())
    edited["data_type"] = "int32"
    document.write_text(json.dumps(edited))
    for damaged_chunk in (False, True):
        if damaged_chunk:  # an earlier gradient's chunk, read before the fourth's
            path = sorted((folder / str(entries[0].param_id)).glob("c.*"))[0]
            data = bytearray(path.read_bytes())
            data[1] ^= 0x10
            path.write_bytes(bytes(data))
        with pytest.raises(ManifestError) as caught:
            await store.read_snapshot(info.id)
        message = str(caught.value)
        assert entries[3].name in message and "data_type" in message
        assert str(entries[0].param_id) not in message
    await store.close()


async def test_a_damaged_array_document_stops_the_chunk_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document found at fault while the chunks are read cancels their read (which then
    starts no other file) instead of waiting for every chunk."""
    store = open_store(tmp_path, chunk_bytes=4096, pack_threshold=1024)
    record = make_record(many_arrays(4, seed=7))
    info = await store.write_snapshot(record, run="r", step=1)
    document = tmp_path / "snapshots" / info.id / str(list(record)[2].param_id) / "zarr.json"
    edited = json.loads(document.read_bytes())
    edited["shape"] = [1, 1]
    document.write_text(json.dumps(edited))
    cancelled = asyncio.Event()

    async def never_done(requests: Any) -> Any:
        try:
            await asyncio.Event().wait()  # chunks that take forever to read
        except asyncio.CancelledError:
            cancelled.set()
            raise

    monkeypatch.setattr(store.backend, "read_many_into_checked", never_done)
    with pytest.raises(ManifestError, match="shape"):
        await asyncio.wait_for(store.read_snapshot(info.id), timeout=30)
    assert cancelled.is_set()
    await store.close()


async def test_a_cancelled_bulk_read_starts_no_other_file(tmp_path: Path) -> None:
    """The reading threads cannot be interrupted, but once the call is cancelled they take
    no further file: a restore given up (a client gone) does not go on reading a GiB."""
    store = open_store(tmp_path, chunk_bytes=4096, pack_threshold=1024)
    info = await store.write_snapshot(make_record(many_arrays(4, seed=5)), run="r", step=1)
    sizes = await chunk_keys(store, info.id)
    requests = [(key, [memoryview(bytearray(b"\xab" * size))]) for key, size in sizes.items()]
    assert len(requests) > 1  # else no reading thread would start, and the wait below with it
    pool = store.backend.threads
    run = pool.run
    release = threading.Event()
    started: list[bool] = []

    async def held(function: Any, *args: Any) -> Any:
        def held_function() -> Any:
            started.append(True)
            release.wait(30)
            return function(*args)

        return await run(held_function)

    pool.run = held  # type: ignore[method-assign]
    task = asyncio.create_task(store.backend.read_many_into_checked(requests))
    while not started:  # a reading thread is running, held before its first file
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    await asyncio.to_thread(pool.close)  # waits for the reading threads to end
    assert all(bytes(buffers[0]) == b"\xab" * len(buffers[0]) for _, buffers in requests)
    await store.close()
