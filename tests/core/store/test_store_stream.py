"""Streaming reads: a gradient chunk by chunk, a snapshot as one safetensors file, raw keys.

Every test runs over both stores (the ``store`` fixture: a local folder and S3 on
loopback, with 4 KiB chunks and a 512-byte pack threshold). Bytes are verified chunk by
chunk before they are yielded; paths are refused before any I/O.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import zarr
import zarr.abc.store
import zarr.api.asynchronous
from safetensors.numpy import load

from gradvault.core import (
    ChecksumMismatchError,
    GradientRecordEntry,
    GradientsParamsRecord,
    InvalidParamIdError,
    InvalidRangeError,
    InvalidSnapshotIdError,
    InvalidStorePathError,
    MissingGradientError,
    ParamId,
    SnapshotNotFoundError,
    StoreKeyNotFoundError,
)
from gradvault.core.records.safetensors_file import (
    MANIFEST_KEY,
    NAMES_KEY,
    SafetensorsHeader,
    record_from_safetensors,
)
from gradvault.core.store import SnapshotStore, new_snapshot_id

from ..conftest import S3_BUCKET
from ..store_files import is_chunk_key

CHUNK = 4096  # the store fixture's chunk_bytes


def make_record() -> GradientsParamsRecord:
    rng = np.random.default_rng(7)
    arrays = {
        "big.weight": rng.standard_normal((40, 50)).astype(np.float32),  # 8000 B: 2 chunks
        "wide": rng.standard_normal((3, 1000)).astype(np.float64),  # chunks (1, 512): 6
        "odd": rng.integers(0, 255, 9001).astype(np.uint8),  # edge chunk padded
        "scalar": np.array(1.5, dtype=np.float64),  # packed
        "tiny.bias": rng.standard_normal(5).astype(np.float16),  # packed
        "mask": np.array([True, False, True]),  # packed
        "empty": np.zeros((0, 7), dtype=np.float32),  # packed, no bytes
        "empty.big": np.zeros((0, 4000), dtype=np.float32),  # nbytes 0: packed too
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, a) for name, a in arrays.items()],
        metadata={"epoch": 2},
    )


async def collect(pieces: Any) -> bytes:
    return b"".join([bytes(piece) async for piece in pieces])


class RawStore:
    """The store's objects as bytes, under the store (a folder or an S3 prefix)."""

    def __init__(self, store: SnapshotStore, request: pytest.FixtureRequest) -> None:
        self.location = store.location
        if self.location.startswith("s3://"):
            self.s3 = request.getfixturevalue("boto3_s3")
            self.prefix = self.location.removeprefix(f"s3://{S3_BUCKET}/").rstrip("/")
        else:
            self.s3 = None

    def get(self, key: str) -> bytes:
        if self.s3 is None:
            return (Path(self.location) / key).read_bytes()
        return self.s3.get_object(Bucket=S3_BUCKET, Key=f"{self.prefix}/{key}")["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        if self.s3 is None:
            (Path(self.location) / key).write_bytes(data)
        else:
            self.s3.put_object(Bucket=S3_BUCKET, Key=f"{self.prefix}/{key}", Body=data)


@pytest.fixture
def raw(store: SnapshotStore, request: pytest.FixtureRequest) -> RawStore:
    return RawStore(store, request)


def by_name(record: GradientsParamsRecord, name: str) -> GradientRecordEntry:
    return next(e for e in record if e.name == name)


class ReadCounter:
    """Records every key the store's backend touches (and can forbid any I/O at all)."""

    def __init__(self, store: SnapshotStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.keys: list[str] = []
        self.forbidden = False
        backend = store.backend
        for name in ("read", "read_into", "size", "object_sizes"):
            monkeypatch.setattr(backend, name, self._watch(getattr(backend, name)))

    def _watch(self, method: Any) -> Any:
        async def watched(key: str, *args: Any, **kwargs: Any) -> Any:
            if self.forbidden:
                pytest.fail(f"the store touched {key!r}; it should have refused before any I/O")
            self.keys.append(key)
            return await method(key, *args, **kwargs)

        return watched

    def chunks(self) -> list[str]:
        return [key for key in self.keys if is_chunk_key(key)]


# --- iter_gradient ----------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_a_gradient_streams_bit_for_bit(
    store: SnapshotStore, compression: str | None
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1, compression=compression)
    for gradient in record:
        pieces = [bytes(p) async for p in store.iter_gradient(info.id, gradient.param_id)]
        assert b"".join(pieces) == gradient.array.tobytes(), gradient.name
        assert all(0 < len(piece) <= CHUNK for piece in pieces), gradient.name
    # ids as text work too
    big = by_name(record, "wide")
    assert await collect(store.iter_gradient(info.id, str(big.param_id))) == big.array.tobytes()


async def test_ranges_at_chunk_boundaries(store: SnapshotStore) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    for name in ("wide", "odd", "big.weight", "tiny.bias", "scalar"):
        gradient = by_name(record, name)
        data = gradient.array.tobytes()
        n = len(data)
        pieces = [len(p) async for p in store.iter_gradient(info.id, gradient.param_id)]
        boundaries = np.cumsum(pieces)[:-1].tolist()  # one piece per chunk: where chunks end
        assert len(boundaries) == {"wide": 5, "odd": 2, "big.weight": 1}.get(name, 0)
        ranges = {(0, n), (0, 0), (n, n), (n - 1, n), (0, 1), (n // 2, n)}
        for b in boundaries:
            ranges |= {(b - 1, b + 1), (b, b + 1), (b - 1, b), (b, b), (0, b), (b, n)}
        ranges |= {(b, c) for b in boundaries for c in boundaries if b <= c}
        for start, end in sorted(ranges):
            found = [
                bytes(p) async for p in store.iter_gradient(info.id, name_id(gradient), start, end)
            ]
            assert b"".join(found) == data[start:end], (name, start, end)
            assert all(found), (name, start, end)  # no empty pieces
        tail = await collect(store.iter_gradient(info.id, gradient.param_id, n // 3))
        assert tail == data[n // 3 :]


def name_id(gradient: GradientRecordEntry) -> str:
    return str(gradient.param_id)


async def test_a_range_outside_the_gradient_is_refused_before_io(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    gradient = by_name(record, "wide")
    await store.info(info.id)  # the manifest is known; no chunk may be read below
    counter = ReadCounter(store, monkeypatch)
    for start, end in [(-1, 10), (10, 5), (0, gradient.nbytes + 1), (gradient.nbytes + 1, None)]:
        with pytest.raises(InvalidRangeError, match=str(gradient.param_id)):
            await collect(store.iter_gradient(info.id, gradient.param_id, start, end))
    with pytest.raises(InvalidRangeError):
        await collect(store.iter_gradient(info.id, gradient.param_id, 1.5))  # type: ignore[arg-type]
    assert counter.chunks() == []


async def test_at_most_two_chunks_are_read_ahead_of_the_consumer(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    gradient = by_name(record, "wide")  # 6 chunks
    await store.info(info.id)
    counter = ReadCounter(store, monkeypatch)
    stream = store.iter_gradient(info.id, gradient.param_id)
    first = await anext(stream)
    assert len(first) == CHUNK
    assert len(counter.chunks()) <= 2, counter.keys  # the chunk yielded, maybe the next one
    await stream.aclose()
    assert len(counter.chunks()) <= 2


async def test_unknown_ids_are_refused(store: SnapshotStore) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    with pytest.raises(MissingGradientError, match=info.id):
        await collect(store.iter_gradient(info.id, ParamId()))
    with pytest.raises(SnapshotNotFoundError):
        await collect(store.iter_gradient(new_snapshot_id(), record.entries[0].param_id))
    with pytest.raises(InvalidSnapshotIdError):
        await collect(store.iter_gradient("../x", record.entries[0].param_id))
    with pytest.raises(InvalidParamIdError):
        await collect(store.iter_gradient(info.id, "../../zarr.json"))


async def test_a_flipped_byte_is_caught_mid_stream_before_its_bytes_go_out(
    store: SnapshotStore, raw: RawStore
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    gradient = by_name(record, "wide")  # rows of 8000 bytes, chunks of 512 values: 2 per row
    key = f"snapshots/{info.id}/{gradient.param_id}/c.1.0"  # the 3rd chunk: bytes 8000..12096
    original = raw.get(key)
    damaged = bytearray(original)
    damaged[100] ^= 0x01
    raw.put(key, bytes(damaged))

    received = []
    with pytest.raises(ChecksumMismatchError) as caught:
        async for piece in store.iter_gradient(info.id, gradient.param_id):
            received.append(bytes(piece))
    message = str(caught.value)
    assert info.id in message and str(gradient.param_id) in message and "'wide'" in message
    data = gradient.array.tobytes()
    assert b"".join(received) == data[:8000]  # the two chunks before the damaged one, only

    # a range that avoids the damaged chunk still streams; one that touches it does not
    assert await collect(store.iter_gradient(info.id, gradient.param_id, 0, 8000)) == data[:8000]
    with pytest.raises(ChecksumMismatchError):
        await collect(store.iter_gradient(info.id, gradient.param_id, 8000, 8001))
    raw.put(key, original)
    assert await collect(store.iter_gradient(info.id, gradient.param_id)) == data


async def test_a_flipped_byte_in_the_packed_chunk_names_the_gradients(
    store: SnapshotStore, raw: RawStore
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    key = f"snapshots/{info.id}/packed/c.0"
    original = raw.get(key)
    damaged = bytearray(original)
    damaged[0] ^= 0x01
    raw.put(key, bytes(damaged))
    gradient = by_name(record, "scalar")
    with pytest.raises(ChecksumMismatchError) as caught:
        await collect(store.iter_gradient(info.id, gradient.param_id))
    assert info.id in str(caught.value) and str(gradient.param_id) in str(caught.value)
    assert "'scalar'" in str(caught.value)


# --- iter_safetensors -------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd:1"])
async def test_a_snapshot_streams_as_one_safetensors_file(
    store: SnapshotStore, compression: str | None
) -> None:
    record = make_record()
    info = await store.write_snapshot(
        record, run="r", step=5, tags={"k": "v"}, compression=compression
    )
    length, pieces = await store.iter_safetensors(info.id)
    data = await collect(pieces)
    assert len(data) == length

    arrays = load(data)  # the safetensors library is the judge
    assert set(arrays) == {str(e.param_id) for e in record}
    for gradient in record:
        assert arrays[str(gradient.param_id)].tobytes() == gradient.array.tobytes()
        assert arrays[str(gradient.param_id)].shape == gradient.shape

    header = SafetensorsHeader.parse(data, body_bytes=len(data))
    names = json.loads(header.metadata[NAMES_KEY])
    assert names == {str(e.param_id): e.name for e in record}
    summary = json.loads(header.metadata[MANIFEST_KEY])
    assert summary["id"] == info.id and summary["step"] == 5 and summary["tags"] == {"k": "v"}
    assert "gradients" not in summary and "packed" not in summary

    read = await store.read_snapshot(info.id)
    back = record_from_safetensors(data)
    assert back == read and back.metadata == read.metadata


async def test_the_safetensors_header_needs_no_gradient_bytes(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    counter = ReadCounter(store, monkeypatch)
    length, pieces = await store.iter_safetensors(info.id)
    header = await anext(pieces)
    assert counter.chunks() == [], counter.keys
    parsed = SafetensorsHeader.parse(bytes(header))
    assert parsed.file_length == length
    await pieces.aclose()


async def test_a_flipped_byte_ends_the_safetensors_stream(
    store: SnapshotStore, raw: RawStore
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    gradient = by_name(record, "big.weight")
    key = f"snapshots/{info.id}/{gradient.param_id}/c.1.0"
    damaged = bytearray(raw.get(key))
    damaged[-10] ^= 0x80
    raw.put(key, bytes(damaged))
    _, pieces = await store.iter_safetensors(info.id)
    with pytest.raises(ChecksumMismatchError, match=str(gradient.param_id)):
        await collect(pieces)


async def test_safetensors_of_an_unknown_snapshot(store: SnapshotStore) -> None:
    with pytest.raises(SnapshotNotFoundError):
        await store.iter_safetensors(new_snapshot_id())
    with pytest.raises(InvalidSnapshotIdError):
        await store.iter_safetensors("snapshots/../x")


# --- read_key and key_size: the read-only Zarr view -------------------------------------


async def test_read_key_serves_the_zarr_hierarchy_of_a_snapshot(
    store: SnapshotStore, raw: RawStore
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    manifest = await store.info(info.id)
    keys = ["zarr.json", "snapshots/zarr.json", f"snapshots/{info.id}/zarr.json"]
    keys.append(f"snapshots/{info.id}/packed/zarr.json")
    keys.append(f"snapshots/{info.id}/packed/c.0")
    wide = str(by_name(record, "wide").param_id)
    keys += [f"snapshots/{info.id}/{wide}/zarr.json"]
    keys += [f"snapshots/{info.id}/{wide}/c.{i}.{j}" for i in range(3) for j in range(2)]
    for key in keys:
        data = await store.read_key(key)
        assert bytes(data) == raw.get(key), key
        assert await store.key_size(key) == len(data), key
    document = orjson.loads(bytes(await store.read_key(f"snapshots/{info.id}/zarr.json")))
    assert document["attributes"]["gradvault"] == manifest


async def test_read_key_ranges(store: SnapshotStore) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    key = f"snapshots/{info.id}/zarr.json"
    whole = bytes(await store.read_key(key))
    assert bytes(await store.read_key(key, start=10, end=20)) == whole[10:20]
    assert bytes(await store.read_key(key, start=len(whole) - 3)) == whole[-3:]
    with pytest.raises(InvalidRangeError):
        await store.read_key(key, start=5, end=len(whole) + 1)


async def test_keys_outside_the_snapshots_chunk_grids_are_not_found(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    await store.info(info.id)  # the manifest is read; nothing else may be
    counter = ReadCounter(store, monkeypatch)
    counter.forbidden = True
    wide = str(by_name(record, "wide").param_id)
    packed = str(by_name(record, "scalar").param_id)
    empty = str(by_name(record, "empty.big").param_id)
    for key in [
        "foo",
        "zarr.json/x",
        "snapshots",
        "snapshots/foo/zarr.json",
        f"snapshots/{info.id}/nothing/zarr.json",
        f"snapshots/{info.id}/{packed}/zarr.json",  # packed: no array of its own
        f"snapshots/{info.id}/{empty}/c.0.0",
        f"snapshots/{info.id}/{wide}/c.3.0",  # outside the grid
        f"snapshots/{info.id}/{wide}/c.0.2",
        f"snapshots/{info.id}/{wide}/c.0",
        f"snapshots/{info.id}/{wide}/c.0.0.0",
        f"snapshots/{info.id}/{wide}/c.00.0",
        f"snapshots/{info.id}/{wide}/c.+1.0",
        f"snapshots/{info.id}/{wide}/c/0/0",  # the separator of formats 1 and 2
        f"snapshots/{info.id}/{wide}/c.0/0",
        f"snapshots/{info.id}/{wide}/c..0",
        f"snapshots/{info.id}/{wide}/c",
        f"snapshots/{info.id}/{wide}",
        f"snapshots/{info.id}/packed/c.1",
        f"snapshots/{info.id}/gc-collected",
        f"snapshots/{info.id}/zarr.json/x",
        "zarr.json/.zattrs",
        f"snapshots/{info.id}/.zgroup",
        ".zgroup",
        f"snapshots/{info.id}/{wide}/.zarray",
    ]:
        with pytest.raises(StoreKeyNotFoundError):
            await store.read_key(key)
        with pytest.raises(StoreKeyNotFoundError):
            await store.key_size(key)
    assert counter.keys == []
    counter.forbidden = False
    with pytest.raises(SnapshotNotFoundError):
        await store.read_key(f"snapshots/{new_snapshot_id()}/zarr.json")


TRAVERSALS = [
    "",
    "/",
    "/etc/passwd",
    "..",
    "../zarr.json",
    "snapshots/../../etc/passwd",
    "snapshots/./zarr.json",
    "snapshots//zarr.json",
    "snapshots/zarr.json/",
    "snapshots\\zarr.json",
    "snapshots/..\\..\\x",
    "zarr.json\x00",
    "snapshots/\x01/zarr.json",
    "snapshots/zarr.json\n",
    ".staging/x/zarr.json",
    "snapshots/.staging/zarr.json",
    ".hidden",
    "snapshots/.deleting-1/zarr.json",
    "a/" * 300 + "zarr.json",
    "x" * 513,
]


@pytest.mark.parametrize("path", TRAVERSALS)
async def test_traversal_attempts_are_refused_before_any_io(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    counter = ReadCounter(store, monkeypatch)
    counter.forbidden = True
    with pytest.raises(InvalidStorePathError):
        await store.read_key(path)
    with pytest.raises(InvalidStorePathError):
        await store.key_size(path)
    assert counter.keys == []


async def test_a_path_that_is_not_text_is_refused(store: SnapshotStore) -> None:
    with pytest.raises(InvalidStorePathError):
        await store.read_key(b"zarr.json")  # type: ignore[arg-type]


async def test_read_key_of_a_deleted_snapshot(store: SnapshotStore) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1)
    await store.delete(info.id)
    with pytest.raises(SnapshotNotFoundError):
        await store.read_key(f"snapshots/{info.id}/zarr.json")


class ReadKeyZarrStore(zarr.abc.store.Store):
    """A read-only Zarr store that reads only through ``SnapshotStore.read_key``.

    A path that ``read_key`` refuses as invalid is raised, as an HTTP 400 would be raised
    by a Zarr reader's HTTP file system; "not found" is a missing key, as a 404 is.
    """

    supports_writes = False
    supports_deletes = False
    supports_listing = False
    supports_partial_writes = False

    def __init__(self, store: SnapshotStore) -> None:
        super().__init__(read_only=True)
        self.store = store
        self.requested: list[str] = []

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReadKeyZarrStore) and other.store is self.store

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        self.requested.append(key)
        try:
            data = bytes(await self.store.read_key(key))
        except KeyError:
            return None
        if byte_range is not None:
            raise AssertionError(f"zarr asked for a range of {key}: {byte_range}")
        return prototype.buffer.from_bytes(data)

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
        return [await self.get(key, prototype, byte_range) for key, byte_range in key_ranges]

    async def exists(self, key: str) -> bool:
        try:
            await self.store.key_size(key)
        except KeyError:
            return False
        return True

    async def set(self, key: str, value: Any) -> None:
        raise AssertionError("read-only")

    async def delete(self, key: str) -> None:
        raise AssertionError("read-only")

    async def list(self) -> AsyncIterator[str]:  # type: ignore[override]
        raise AssertionError("Zarr readers must not need a listing")
        yield ""

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        raise AssertionError("Zarr readers must not need a listing")
        yield ""

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:  # type: ignore[override]
        raise AssertionError("Zarr readers must not need a listing")
        yield ""


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_zarr_python_reads_a_snapshot_through_read_key_alone(
    store: SnapshotStore, compression: str | None
) -> None:
    record = make_record()
    info = await store.write_snapshot(record, run="r", step=1, compression=compression)
    zarr_store = ReadKeyZarrStore(store)
    group = await zarr.api.asynchronous.open_group(
        store=zarr_store, path=f"snapshots/{info.id}", mode="r"
    )
    table = group.attrs["gradvault"]["gradients"]
    packed = await (await group.getitem("packed")).getitem(slice(None))
    for i, param_id in enumerate(table["param_id"]):
        gradient = record[param_id]
        if table["array"][i] == "packed":
            offset, size = table["offset"][i], table["nbytes"][i]
            raw = np.asarray(packed)[offset : offset + size].tobytes()
        else:
            array = await group.getitem(param_id)
            raw = np.asarray(await array.getitem(...)).tobytes()
        assert raw == gradient.array.tobytes(), gradient.name
    root = await zarr.api.asynchronous.open_group(store=zarr_store, mode="r")
    assert dict(root.attrs) == {}
    # readers that do not know the format probe Zarr v2 names: "not found", never refused
    assert f"snapshots/{info.id}/.zgroup" in zarr_store.requested
