"""The store's streamed write path for gradients on a device, driven on the CPU.

NumPy arrays play the device buffers and :class:`FakeDevice` the device (copies land only
when waited for). A :class:`DeviceSnapshot` of them must be written exactly as a host
record of the same arrays is (same files, same bytes, same manifest but for the id and
time), through at most the pool's rings, each chunk copied in order, and a failed copy
must abort the snapshot with nothing committed.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import numpy as np
import pytest

from gradvault.core.errors import (
    DeviceError,
    DtypeMismatchError,
    DuplicateParamError,
    InvalidFieldError,
    InvalidParamIdError,
)
from gradvault.core.records.dtypes import bfloat16
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, open_store
from gradvault.core.store._device_snapshot import DeviceSnapshot
from gradvault.core.store._device_stream import RingPool

from ..fake_device import FakeDevice, address_of

#: small enough that the large gradients below take several chunks, edge chunks included
CHUNK_BYTES = 4096
PACK_THRESHOLD = 1024


def _gradients() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    with_specials = rng.standard_normal(3000).astype(np.float32)
    with_specials[[5, 2500]] = np.nan
    with_specials[1700] = -np.inf
    return {
        "tiny.bias": rng.standard_normal(8).astype(np.float32),
        "small.weight": rng.standard_normal((4, 16)).astype(np.float64),
        "conv.weight": rng.standard_normal((3, 10, 100)).astype(np.float32),  # edge chunks
        "fc.weight": rng.standard_normal((700, 3)).astype(np.float64),
        "specials": with_specials,
        "half": rng.standard_normal((33, 77)).astype(np.float16),
        "brain": rng.standard_normal(5000).astype(np.float32).astype(bfloat16),
        "counts": rng.integers(-100, 100, (50, 41), dtype=np.int32),
        "mask": rng.integers(0, 2, 9000).astype(bool),
        "bytes": rng.integers(0, 256, 70_001, dtype=np.uint8),
        "scalar": np.array(2.5, np.float32),
        "empty": np.zeros((0, 5), np.float32),
    }


IDS = {name: ParamId() for name in _gradients()}


def _host_record(arrays: dict[str, np.ndarray]) -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(IDS[name], name, a) for name, a in arrays.items()],
        metadata={"device": "cuda:0"},
    )


def _device_snapshot(arrays: dict[str, np.ndarray], pool: RingPool) -> DeviceSnapshot:
    return DeviceSnapshot.of(
        [IDS[name] for name in arrays],
        list(arrays),
        list(arrays.values()),
        pool,
        {"device": "cuda:0"},
    )


def _store(path: Path, **options: object) -> SnapshotStore:
    return open_store(path, chunk_bytes=CHUNK_BYTES, pack_threshold=PACK_THRESHOLD, **options)


def _snapshot_files(root: Path, snapshot_id: str) -> dict[str, bytes]:
    folder = root / "snapshots" / snapshot_id
    files = {}
    for directory, _, names in os.walk(folder):
        for name in names:
            path = Path(directory) / name
            files[str(path.relative_to(folder))] = path.read_bytes()
    return files


def _manifest_without_identity(files: dict[str, bytes]) -> dict:
    manifest = json.loads(files.pop("zarr.json"))["attributes"]["gradvault"]
    for key in ("id", "created_at", "manifest_checksum"):  # the checksum covers the id
        manifest.pop(key)
    return manifest


async def _write(path: Path, source: object, **options: object) -> str:
    store = _store(path, **options)
    try:
        info = await store.write_snapshot(source, run="r", step=3, device="cuda:0", **{})
    finally:
        await store.close()
    return info.id


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_streamed_write_stores_the_host_paths_bytes(tmp_path: Path, compression) -> None:
    arrays = _gradients()
    device = FakeDevice()
    pool = RingPool(device, slots=2, slot_bytes=CHUNK_BYTES, max_rings=2)

    async def both() -> tuple[str, str]:
        host_store = _store(tmp_path / "host")
        streamed_store = _store(tmp_path / "streamed")
        try:
            host = await host_store.write_snapshot(
                _host_record(arrays), run="r", step=3, device="cuda:0", compression=compression
            )
            streamed = await streamed_store.write_snapshot(
                _device_snapshot(arrays, pool),
                run="r",
                step=3,
                device="cuda:0",
                compression=compression,
            )
        finally:
            await host_store.close()
            await streamed_store.close()
        return host.id, streamed.id

    host_id, streamed_id = asyncio.run(both())
    host_files = _snapshot_files(tmp_path / "host", host_id)
    streamed_files = _snapshot_files(tmp_path / "streamed", streamed_id)
    host_manifest = _manifest_without_identity(host_files)
    streamed_manifest = _manifest_without_identity(streamed_files)
    assert streamed_manifest == host_manifest
    assert streamed_files == host_files  # every chunk and array document, byte for byte
    # the large gradients were streamed, the small ones were not
    large = [name for name, a in arrays.items() if a.nbytes >= PACK_THRESHOLD]
    assert len(large) >= 6
    for name in large:
        array = arrays[name]
        copies = device.copies_of(array)
        offsets = [offset for offset, _ in copies]
        assert offsets == sorted(offsets), f"{name}: chunks copied out of order"
        assert sum(length for _, length in copies) == array.nbytes, name
        assert all(length <= CHUNK_BYTES for _, length in copies), name
    for name in set(arrays) - set(large):
        assert device.copies_of(arrays[name]) == [], f"{name} is small: read to host whole"
    assert device.in_flight == 0


def test_streamed_snapshot_reads_back_bit_identical(tmp_path: Path) -> None:
    arrays = _gradients()
    pool = RingPool(FakeDevice(), slots=3, slot_bytes=CHUNK_BYTES, max_rings=1)

    async def round_trip() -> GradientsParamsRecord:
        store = _store(tmp_path)
        try:
            info = await store.write_snapshot(
                _device_snapshot(arrays, pool), run="r", step=0, device="cuda:0"
            )
            return await store.read_snapshot(info.id)
        finally:
            await store.close()

    record = asyncio.run(round_trip())
    assert record == _host_record(arrays)
    for name, array in arrays.items():
        read = record[IDS[name]].array
        assert read.dtype == array.dtype and read.shape == array.shape
        assert read.tobytes() == array.tobytes(), name


def test_host_memory_is_bounded_by_the_pool(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    arrays = {
        f"layer{i}.weight": rng.standard_normal((64, 100)).astype(np.float32) for i in range(12)
    }
    ids = [ParamId() for _ in arrays]
    device = FakeDevice()
    pool = RingPool(device, slots=2, slot_bytes=CHUNK_BYTES, max_rings=2)
    snapshot = DeviceSnapshot.of(ids, list(arrays), list(arrays.values()), pool, {})

    async def write() -> None:
        store = _store(tmp_path, max_concurrency=8)  # more arrays in flight than rings
        try:
            await store.write_snapshot(snapshot, run="r", step=0, device="cuda:0")
            await store.write_snapshot(snapshot, run="r", step=1, device="cuda:0")
        finally:
            await store.close()

    asyncio.run(write())
    bound = 2 * 2 * CHUNK_BYTES
    total = sum(a.nbytes for a in arrays.values())
    assert total > 10 * bound  # the snapshot is far larger than the rings
    assert pool.peak_lent == 2  # every ring was used, never a third
    assert pool.peak_host_bytes == bound == pool.host_bytes
    assert device.allocated == bound  # the rings were made once, reused by the 2nd write
    assert device.peak_in_flight <= 2 * 2  # slots in use across the rings
    assert device.in_flight == 0


def test_a_failed_copy_aborts_the_snapshot_and_names_the_gradient(tmp_path: Path) -> None:
    arrays = _gradients()
    failing = arrays["conv.weight"]
    device = FakeDevice(fail_at=(id(failing), 5000))
    pool = RingPool(device, slots=2, slot_bytes=CHUNK_BYTES, max_rings=2)

    async def write() -> tuple[list, list]:
        store = _store(tmp_path)
        try:
            with pytest.raises(DeviceError) as raised:
                await store.write_snapshot(
                    _device_snapshot(arrays, pool), run="r", step=0, device="cuda:0"
                )
            message = str(raised.value)
            assert f"param {IDS['conv.weight']} ('conv.weight')" in message
            assert "from cuda:0 to host failed at byte 4000" in message  # the chunk's start
            assert "fake fault at byte 5000" in message
            assert "nothing was committed" in message
            assert isinstance(raised.value.__cause__, RuntimeError)
            listed_after_failure = await store.list()
            # the pool is whole again: the next snapshot (copies sound now) commits
            device.fail_at = None
            info = await store.write_snapshot(
                _device_snapshot(arrays, pool), run="r", step=1, device="cuda:0"
            )
            return listed_after_failure, [info.id, *(i.id for i in await store.list())]
        finally:
            await store.close()

    listed_after_failure, ids = asyncio.run(write())
    assert listed_after_failure == []
    assert ids[0] == ids[1] and len(ids) == 2
    snapshot_folders = [name for name in os.listdir(tmp_path / "snapshots") if name != "zarr.json"]
    assert snapshot_folders == [ids[0]]
    assert os.listdir(tmp_path / ".staging") == []  # the aborted write removed its files
    assert device.in_flight == 0  # no copy was left running into a ring's buffer


def test_a_device_snapshot_refuses_what_a_record_refuses() -> None:
    pool = RingPool(FakeDevice())
    pid = ParamId()
    with pytest.raises(DuplicateParamError, match=f"param {pid}"):
        DeviceSnapshot.of(
            [pid, pid], ["a", "b"], [np.zeros(2, np.float32)] * 2, pool, {"device": "cuda:0"}
        )
    with pytest.raises(DtypeMismatchError, match=r"\('c'\) has dtype complex64"):
        DeviceSnapshot.of([pid], ["c"], [np.zeros(2, np.complex64)], pool, {})
    with pytest.raises(InvalidParamIdError, match="'zz'"):
        DeviceSnapshot.of(["zz"], ["d"], [np.zeros(2, np.float32)], pool, {})
    with pytest.raises(InvalidFieldError, match="metadata"):
        DeviceSnapshot.of([pid], ["e"], [np.zeros(2, np.float32)], pool, {"x": object()})
    (entry,) = DeviceSnapshot.of([str(pid)], ["f"], [np.zeros(2, np.float32)], pool, {}).entries
    assert entry.param_id == pid and entry.dtype == "float32" and entry.shape == (2,)


def test_a_strided_device_buffer_is_made_contiguous_on_its_device() -> None:
    pool = RingPool(FakeDevice())
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    snapshot = DeviceSnapshot.of([ParamId()], ["s"], [strided], pool, {})
    (entry,) = snapshot.entries
    assert entry.array.flags.c_contiguous and entry.shape == (4, 3)
    np.testing.assert_array_equal(entry.array, strided)


def test_a_store_refuses_what_is_neither_record_nor_device_snapshot(tmp_path: Path) -> None:
    async def write() -> None:
        store = _store(tmp_path)
        try:
            await store.write_snapshot({"a": np.zeros(2)}, run="r", step=0)  # type: ignore[arg-type]
        finally:
            await store.close()

    with pytest.raises(TypeError, match="GradientsParamsRecord or a DeviceSnapshot; got dict"):
        asyncio.run(write())


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"slots": 0}, "slots must be an int >= 1"),
        ({"slot_bytes": 1.5}, "slot_bytes must be an int >= 1"),
        ({"max_rings": 0}, "max_rings must be an int >= 1"),
    ],
)
def test_bad_pool_settings_are_refused(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RingPool(FakeDevice(), **arguments)


def test_a_pool_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(3000).astype(np.float32) for _ in range(6)]
    device = FakeDevice()
    pool = RingPool(device, slots=2, slot_bytes=CHUNK_BYTES, max_rings=1)
    snapshot = DeviceSnapshot.of([ParamId() for _ in arrays], ["w"] * 6, arrays, pool, {})

    async def write(step: int) -> str:
        store = _store(tmp_path, max_concurrency=4)  # writers wait for the one ring
        try:
            return (await store.write_snapshot(snapshot, run="r", step=step)).id
        finally:
            await store.close()

    first, second = asyncio.run(write(0)), asyncio.run(write(1))  # two loops, one pool
    assert first != second
    assert pool.peak_lent == 1 and device.allocated == 2 * CHUNK_BYTES


def test_a_ring_given_back_mid_stream_or_after_a_failed_copy_is_not_lent_again() -> None:
    source = np.arange(1000, dtype=np.uint8)
    device = FakeDevice(fail_at=(id(source), 950))
    pool = RingPool(device, slots=2, slot_bytes=100, max_rings=1)

    async def lend_three() -> list[int]:
        addresses = []
        async with pool.lend(100) as ring:  # given back with its stream still open
            stream = ring.stream(source, 1000)
            first = next(stream)
            addresses.append(address_of(first))
        assert pool.host_bytes == 0  # dropped: copies in flight could still land in it
        stream.close()
        async with pool.lend(100) as ring:  # a copy fails: dropped too
            with pytest.raises(RuntimeError, match="fake fault at byte 950"):
                for view in ring.stream(source, 1000):
                    addresses.append(address_of(view))
        assert pool.host_bytes == 0
        device.fail_at = None
        async with pool.lend(100) as ring:
            assert bytes(b"".join(bytes(v) for v in ring.stream(source, 1000))) == source.tobytes()
        assert pool.host_bytes == 2 * 100  # a sound ring is kept
        return addresses

    asyncio.run(lend_three())
    assert device.allocated == 3 * 2 * 100
    assert device.in_flight == 0
