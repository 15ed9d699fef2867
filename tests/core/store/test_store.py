"""The snapshot store: one suite run against a local folder and an S3 server (SeaweedFS)."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

import gradvault.core.store as store_package
from gradvault.core.errors import (
    ChecksumMismatchError,
    InvalidParamIdError,
    InvalidSnapshotIdError,
    MissingGradientError,
    SnapshotNotFoundError,
    StoreUnavailableError,
)
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import (
    SnapshotInfo,
    SnapshotStore,
    SnapshotWriter,
    new_snapshot_id,
    open_store,
    parse_snapshot_id,
)
from tests.core.os_probes import record_fsyncs_and_renames
from tests.core.store_files import manifest_checksum

from ..conftest import S3_BUCKET, S3_CREDENTIALS


def make_record(
    arrays: dict[str, np.ndarray], metadata: dict | None = None
) -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, array) for name, array in arrays.items()],
        metadata=metadata,
    )


def gradient_rows(manifest: dict) -> list[dict]:
    """The manifest's column table as one dict per gradient, stats included."""
    columns = manifest["gradients"]
    stats = columns["stats"]
    rows = []
    for i in range(len(columns["param_id"])):
        row = {key: values[i] for key, values in columns.items() if key != "stats"}
        row["stats"] = {key: values[i] for key, values in stats.items()}
        rows.append(row)
    return rows


def assert_bit_identical(found: GradientsParamsRecord, expected: GradientsParamsRecord) -> None:
    assert [e.param_id for e in found] == [e.param_id for e in expected]
    for got, want in zip(found, expected, strict=True):
        assert (got.name, got.dtype, got.shape) == (want.name, want.dtype, want.shape)
        assert got.array.dtype == want.array.dtype
        assert got.array.tobytes() == want.array.tobytes()
        assert not got.array.flags.writeable


def varied_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """Every dtype, 0-d, empty, all-zero, NaN/Inf, packed (small) and multi-chunk (large)."""
    rng = np.random.default_rng(seed)
    return {
        "fc1.weight": rng.standard_normal((64, 33)).astype(np.float32),  # 8448 B: chunked
        "fc1.bias": rng.standard_normal(33).astype(np.float32),  # packed
        "half": rng.standard_normal((7, 5)).astype(np.float16),
        "half.big": rng.standard_normal((3000,)).astype(np.float16),  # padded edge chunk
        "double": rng.standard_normal((2, 3, 4)).astype(np.float64),
        "double.big": rng.standard_normal((5, 4, 100)).astype(np.float64),
        "scalar": np.array(3.25, dtype=np.float32),
        "scalar.int": np.array(-7, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "empty.big.dims": np.zeros((100, 0, 3), dtype=np.float64),
        "zeros": np.zeros((50, 50), dtype=np.float32),  # all-zero, stored, not skipped
        "i8": rng.integers(-128, 127, (9,), dtype=np.int8),
        "i16": rng.integers(-(2**15), 2**15 - 1, (4, 4), dtype=np.int16),
        "i32": rng.integers(-(2**31), 2**31 - 1, (1500,), dtype=np.int32),
        "i64": rng.integers(-(2**62), 2**62, (3,), dtype=np.int64),
        "u8": rng.integers(0, 255, (11,), dtype=np.uint8),
        "flags": rng.integers(0, 2, (13,)).astype(bool),
        "flags.big": rng.integers(0, 2, (9000,)).astype(bool),
        "nonfinite": np.array([1.0, np.nan, np.inf, -np.inf, -2.0], dtype=np.float32),
    }


# --- snapshot ids ---------------------------------------------------------------------


def test_snapshot_ids_are_unique_sortable_and_valid() -> None:
    ids = [new_snapshot_id() for _ in range(5000)]
    assert len(set(ids)) == len(ids)
    assert sorted(ids) == ids
    for snapshot_id in ids[:50]:
        assert len(snapshot_id) == 26
        assert parse_snapshot_id(snapshot_id) == snapshot_id


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "01hzz",
        "01HZZZZZZZZZZZZZZZZZZZZZZZ".lower(),
        "01HZZZZZZZZZZZZZZZZZZZZZZI",  # I, L, O, U are not Crockford digits
        "01HZZZZZZZZZZZZZZZZZZZZZZU",
        "81HZZZZZZZZZZZZZZZZZZZZZZZ",  # would overflow 128 bits
        "../../../../etc/passwd00000",
        "01HZZZZZZZZZZZZZZZZZZZZZ/Z",
        None,
        12,
    ],
)
def test_malformed_snapshot_ids_are_rejected(bad: object) -> None:
    with pytest.raises(InvalidSnapshotIdError):
        parse_snapshot_id(bad)  # type: ignore[arg-type]


async def test_bad_ids_are_rejected_before_any_io(tmp_path: Path) -> None:
    root = tmp_path / "never-created"
    store = open_store(root)
    for call in (
        store.read_snapshot("../outside"),
        store.read_gradient("nope", "0123456789abcdef"),
        store.info("01HZZZZZZZZZZZZZZZZZZZZZZ/"),
        store.delete(".."),
    ):
        with pytest.raises(InvalidSnapshotIdError):
            await call
    for bad_param in ("../../etc", "zz", "0123456789ABCDEF", None):
        with pytest.raises(InvalidParamIdError) as caught:
            await store.read_gradient(new_snapshot_id(), bad_param)  # type: ignore[arg-type]
        assert isinstance(caught.value, ValueError)
        assert repr(bad_param) in str(caught.value) and "16 lowercase hex" in str(caught.value)
    assert not root.exists()
    await store.close()


def test_open_store_rejects_bad_locations() -> None:
    with pytest.raises(ValueError):
        open_store("gs://bucket/prefix")
    with pytest.raises(ValueError):
        open_store("s3://bucket/../escape")
    with pytest.raises(ValueError):
        open_store("s3://B/x")
    with pytest.raises(ValueError):
        open_store("file://otherhost/data")
    with pytest.raises(TypeError):
        open_store("/tmp/x", endpoint="http://127.0.0.1:1")


def test_public_names_are_pinned() -> None:
    assert sorted(store_package.__all__) == [
        "DEFAULT_CHUNK_BYTES",
        "DEFAULT_PACK_THRESHOLD",
        "GC_MARKER_NAME",
        "RetentionRules",
        "STORE_FORMAT_VERSION",
        "ShardInfo",
        "ShardSummary",
        "ShardWriter",
        "SnapshotInfo",
        "SnapshotStore",
        "SnapshotWriter",
        "StoreBackend",
        "check_rank",
        "new_snapshot_id",
        "open_store",
        "parse_compression",
        "parse_snapshot_id",
    ]


# --- round trips (both stores) --------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_round_trip_is_bit_identical(store: SnapshotStore, compression: str | None) -> None:
    record = make_record(varied_arrays(), metadata={"lr": 0.1, "note": "x"})
    info = await store.write_snapshot(
        record, run="run-a", step=7, tags={"kind": "test"}, compression=compression
    )
    assert isinstance(info, SnapshotInfo)
    assert (info.run, info.step, info.num_params, info.nbytes) == (
        "run-a",
        7,
        len(record),
        record.nbytes,
    )
    assert info.created_at.endswith("Z") and "T" in info.created_at
    found = await store.read_snapshot(info.id)
    assert_bit_identical(found, record)
    assert found.metadata["lr"] == 0.1 and found.metadata["note"] == "x"
    assert found.metadata["snapshot"]["id"] == info.id
    for entry in record:
        one = await store.read_gradient(info.id, entry.param_id)
        assert one.name == entry.name and one.array.tobytes() == entry.array.tobytes()
        assert one.shape == entry.shape and one.dtype == entry.dtype


async def test_nothing_packed_and_everything_packed_round_trip(make_store) -> None:
    record = make_record(varied_arrays(1))
    for options in ({"pack_threshold": 0, "chunk_bytes": 1000}, {"pack_threshold": 1 << 30}):
        store = make_store(**options)
        info = await store.write_snapshot(record, run="r", step=0)
        assert_bit_identical(await store.read_snapshot(info.id), record)
        manifest = await store.info(info.id)
        arrays = set(manifest["gradients"]["array"])
        if options["pack_threshold"] == 0:
            assert "packed" not in arrays and manifest["packed"] is None
        else:
            assert arrays == {"packed"}


async def test_one_chunk_snapshots_of_other_gradients_of_the_same_sizes(
    make_store,
) -> None:
    """A store works out the layout and the unchanging manifest columns of a snapshot of
    one chunk once per set of gradients (ids, names, dtypes, shapes) and uses them again:
    a snapshot of the same byte counts under other names, ids, dtypes or shapes, or in
    another order, still writes its own, step after step and back again."""
    store = make_store(pack_threshold=1024, chunk_bytes=1 << 20)
    rng = np.random.default_rng(5)
    ids = [ParamId(), ParamId()]
    weight = rng.standard_normal((64, 32)).astype(np.float32)  # 8 KiB: one large
    bias = rng.standard_normal(32).astype(np.float32)
    variants = [
        [(ids[0], "w", weight), (ids[1], "b", bias)],
        [(ids[0], "renamed", weight), (ids[1], "b", bias)],
        [(ParamId(), "w", weight), (ids[1], "b", bias)],
        [(ids[0], "w", weight.view(np.int32)), (ids[1], "b", bias)],
        [(ids[0], "w", weight.reshape(32, 64)), (ids[1], "b", bias)],
        [(ids[1], "b", bias), (ids[0], "w", weight)],
    ]
    for step, variant in enumerate([*variants, *variants]):
        record = GradientsParamsRecord(
            [GradientRecordEntry.from_array(pid, name, array) for pid, name, array in variant]
        )
        info = await store.write_snapshot(record, run="r", step=step)
        manifest = await store.info(info.id)
        assert manifest["packed"]["array"] == ""  # one chunk: the snapshot's node
        table = manifest["gradients"]
        assert table["param_id"] == [str(pid) for pid, _, _ in variant]
        assert table["name"] == [name for _, name, _ in variant]
        assert table["dtype"] == [str(array.dtype) for _, _, array in variant]
        assert table["shape"] == [list(array.shape) for _, _, array in variant]
        assert_bit_identical(await store.read_snapshot(info.id), record)


async def test_empty_record_round_trips(store: SnapshotStore) -> None:
    info = await store.write_snapshot(GradientsParamsRecord([]), run="r", step=0)
    assert info.num_params == 0 and info.nbytes == 0
    assert len(await store.read_snapshot(info.id)) == 0


async def test_manifest_has_stats_checksums_and_run_fields(store: SnapshotStore) -> None:
    arrays = {
        "w": np.array([[3.0, -4.0], [0.0, 0.0]], dtype=np.float32),
        "bad": np.array([1.0, np.nan, np.inf, -2.0], dtype=np.float64),
        "count": np.array([-3, 4], dtype=np.int8),
    }
    record = make_record(arrays)
    info = await store.write_snapshot(record, run="r", step=3, tags={"a": "b"}, device="cpu")
    manifest = await store.info(info.id)
    assert manifest["format_version"] == 4
    # the manifest's checksum of itself, computed as docs/FORMAT.md defines it
    # (tests/core/store_files.py: from the rules, apart from gradvault and orjson)
    assert manifest["manifest_checksum"] == manifest_checksum(manifest)
    import google_crc32c

    assert (manifest["id"], manifest["run"], manifest["step"]) == (info.id, "r", 3)
    assert manifest["created_at"] == info.created_at and manifest["tags"] == {"a": "b"}
    assert manifest["device"] == "cpu"
    by_name = {g["name"]: g for g in gradient_rows(manifest)}
    assert by_name["w"]["stats"] == {"l2_norm": 5.0, "max_abs": 4.0, "nan_count": 0, "inf_count": 0}
    assert by_name["bad"]["stats"] == {
        "l2_norm": pytest.approx(5**0.5),
        "max_abs": 2.0,
        "nan_count": 1,
        "inf_count": 1,
    }
    assert by_name["count"]["stats"]["max_abs"] == 4.0
    for entry in record:
        gradient = by_name[entry.name]
        assert gradient["param_id"] == str(entry.param_id)
        assert gradient["shape"] == list(entry.shape) and gradient["dtype"] == entry.dtype
        assert gradient["nbytes"] == entry.nbytes
        assert gradient["checksum"] == f"crc32c:{google_crc32c.value(bytes(entry.data)):08x}"


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arrays=st.lists(
        hnp.arrays(
            dtype=st.sampled_from(
                ["float16", "float32", "float64", "int8", "int32", "uint8", "bool"]
            ),
            shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=12),
        ),
        min_size=1,
        max_size=6,
    ),
    chunk_bytes=st.integers(1, 300),
    pack_threshold=st.sampled_from([0, 64, 1 << 20]),
)
def test_any_arrays_round_trip_locally(
    tmp_path_factory, arrays, chunk_bytes, pack_threshold
) -> None:
    record = make_record({f"p{i}": a for i, a in enumerate(arrays)})

    async def scenario() -> GradientsParamsRecord:
        store = open_store(
            tmp_path_factory.mktemp("prop"), chunk_bytes=chunk_bytes, pack_threshold=pack_threshold
        )
        info = await store.write_snapshot(record, run="r", step=0)
        found = await store.read_snapshot(info.id)
        await store.close()
        return found

    assert_bit_identical(asyncio.run(scenario()), record)


# --- listing, info, delete ------------------------------------------------------------


async def test_list_filters_and_orders_newest_first(store: SnapshotStore) -> None:
    record = make_record({"g": np.ones(3, np.float32)})
    written = []
    for run, step in [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 5)]:
        written.append(await store.write_snapshot(record, run=run, step=step))
    everything = await store.list()
    assert [i.id for i in everything] == [w.id for w in reversed(written)]
    assert [i.step for i in await store.list(run="a")] == [3, 2, 1]
    assert [(i.run, i.step) for i in await store.list(step_min=2, step_max=3)] == [
        ("a", 3),
        ("a", 2),
    ]
    assert await store.list(run="missing") == []
    assert everything[0] == written[-1]


async def test_a_second_handle_sees_committed_snapshots(store: SnapshotStore, make_store) -> None:
    record = make_record(varied_arrays(2))
    info = await store.write_snapshot(record, run="r", step=1)
    other = make_store()
    assert [i.id for i in await other.list()] == [info.id]
    assert await other.info(info.id) == await store.info(info.id)
    assert_bit_identical(await other.read_snapshot(info.id), record)


async def test_a_second_handle_stops_seeing_what_the_first_deleted(
    store: SnapshotStore, make_store
) -> None:
    record = make_record({"g": np.ones(600, np.float64)})
    keep = await store.write_snapshot(record, run="r", step=1)
    doomed = await store.write_snapshot(record, run="r", step=2)
    other = make_store()
    assert [i.id for i in await other.list()] == [doomed.id, keep.id]  # both manifests seen
    assert (await other.info(doomed.id))["step"] == 2  # and remembered
    await store.delete(doomed.id)
    assert [i.id for i in await other.list()] == [keep.id]
    with pytest.raises(SnapshotNotFoundError):  # not answered from what it remembered
        await other.info(doomed.id)
    assert (await other.info(keep.id))["step"] == 1


async def test_wrong_s3_credentials_raise_store_unavailable(s3_endpoint: str) -> None:
    store = open_store(
        f"s3://{S3_BUCKET}/wrong-credentials",
        endpoint=s3_endpoint,
        access_key_id=S3_CREDENTIALS["access_key_id"],
        secret_access_key="not-the-secret",
        retry_config={"max_retries": 0},
    )
    with pytest.raises(StoreUnavailableError) as caught:
        await store.list()
    assert f"s3://{S3_BUCKET}/wrong-credentials" in str(caught.value)
    await store.close()


async def test_concurrent_writers_get_distinct_ids(store: SnapshotStore, make_store) -> None:
    record = make_record({"g": np.arange(100, dtype=np.float32), "s": np.ones(2, np.int8)})
    other = make_store()
    infos = await asyncio.gather(
        *(s.write_snapshot(record, run="r", step=i) for i, s in enumerate([store, other] * 4))
    )
    assert len({i.id for i in infos}) == 8
    assert {i.id for i in await store.list()} == {i.id for i in infos}


async def test_delete_and_not_found(store: SnapshotStore) -> None:
    record = make_record({"g": np.ones(600, np.float64)})
    keep = await store.write_snapshot(record, run="r", step=1)
    doomed = await store.write_snapshot(record, run="r", step=2)
    await store.delete(doomed.id)
    assert [i.id for i in await store.list()] == [keep.id]
    for call in (
        store.read_snapshot(doomed.id),
        store.info(doomed.id),
        store.delete(doomed.id),
        store.read_gradient(doomed.id, record.entries[0].param_id),
    ):
        with pytest.raises(SnapshotNotFoundError) as caught:
            await call
        assert doomed.id in str(caught.value)
    with pytest.raises(KeyError):  # SnapshotNotFoundError is a KeyError too
        await store.info(new_snapshot_id())
    with pytest.raises(MissingGradientError):
        await store.read_gradient(keep.id, ParamId())
    assert_bit_identical(await store.read_snapshot(keep.id), record)


async def test_listing_an_empty_store(store: SnapshotStore) -> None:
    assert await store.list() == []
    assert await store.gc() == []
    assert await store.apply_retention(keep_last=1) == []


# --- retention and gc -----------------------------------------------------------------


async def test_retention_keeps_last_n_and_every_kth(store: SnapshotStore) -> None:
    record = make_record({"g": np.ones(4, np.float32)})
    by_step = {}
    for step in range(10):
        by_step[step] = (await store.write_snapshot(record, run="a", step=step)).id
    other_run = await store.write_snapshot(record, run="b", step=1)
    deleted = await store.apply_retention(keep_last=2, keep_every=4, run="a")
    assert sorted(deleted) == sorted(by_step[s] for s in (1, 2, 3, 5, 6, 7))
    assert sorted(i.step for i in await store.list(run="a")) == [0, 4, 8, 9]
    assert [i.id for i in await store.list(run="b")] == [other_run.id]


async def test_retention_never_deletes_the_newest(store: SnapshotStore) -> None:
    record = make_record({"g": np.ones(4, np.float32)})
    infos = [await store.write_snapshot(record, run="a", step=s) for s in (1, 2, 3)]
    assert await store.apply_retention(keep_every=10) == [infos[1].id, infos[0].id]
    assert [i.id for i in await store.list()] == [infos[2].id]
    assert await store.apply_retention(keep_last=0) == []
    assert await store.apply_retention() == []
    with pytest.raises(ValueError):
        await store.apply_retention(keep_every=0)


async def test_gc_removes_stale_leftovers_of_unfinished_writes(store: SnapshotStore) -> None:
    record = make_record({"g": np.ones(4, np.float32)})
    committed = await store.write_snapshot(record, run="r", step=1)
    # A write that crashed before its commit: chunks and array metadata, no manifest.
    leftover_id = new_snapshot_id()
    writer = await store.backend.begin(leftover_id)
    await writer.write_array("0123456789abcdef", b"{}", iter([("c/0", [b"\0" * 8])]))
    assert [i.id for i in await store.list()] == [committed.id]
    assert await store.gc(grace_seconds=3600) == []  # too fresh to be a leftover
    removed = await store.gc(grace_seconds=0)
    assert removed and all(name.startswith(leftover_id) for name in removed)
    assert await store.gc(grace_seconds=0) == []
    assert_bit_identical(await store.read_snapshot(committed.id), record)


async def test_gc_removes_an_old_staging_folder(tmp_path: Path) -> None:
    store = open_store(tmp_path)
    info = await store.write_snapshot(make_record({"g": np.ones(3)}), run="r", step=0)
    stale = tmp_path / ".staging" / new_snapshot_id()
    (stale / "abc" / "c").mkdir(parents=True)
    (stale / "abc" / "c" / "0").write_bytes(b"123")
    two_hours_ago = time.time() - 7200
    for path in [stale, stale / "abc", stale / "abc" / "c", stale / "abc" / "c" / "0"]:
        os.utime(path, (two_hours_ago, two_hours_ago))
    fresh = tmp_path / ".staging" / new_snapshot_id()
    fresh.mkdir()
    assert await store.gc() == [stale.name]
    assert not stale.exists() and fresh.exists()
    assert [i.id for i in await store.list()] == [info.id]
    await store.close()


# --- integrity ------------------------------------------------------------------------


async def test_a_flipped_byte_in_any_chunk_names_the_parameter(tmp_path: Path) -> None:
    store = open_store(tmp_path, chunk_bytes=2048, pack_threshold=256)
    arrays = {
        "big.weight": np.arange(2000, dtype=np.float32).reshape(40, 50),
        "tiny.bias": np.arange(5, dtype=np.float64),
    }
    record = make_record(arrays)
    damaged = await store.write_snapshot(record, run="r", step=1)
    intact = await store.write_snapshot(record, run="r", step=2)
    folder = tmp_path / "snapshots" / damaged.id
    chunk_files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.startswith("c."))
    chunk_files = [p for p in chunk_files if p.name != "zarr.json"]
    assert len(chunk_files) > 3
    manifest = await store.info(damaged.id)
    owner = {g["array"]: g for g in gradient_rows(manifest)}
    for path in chunk_files:
        original = path.read_bytes()
        for position in (0, len(original) // 2, len(original) - 1):  # data, and the crc itself
            flipped = bytearray(original)
            flipped[position] ^= 0x40
            path.write_bytes(bytes(flipped))
            gradient = owner[path.relative_to(folder).parts[0]]
            with pytest.raises(ChecksumMismatchError) as caught:
                await store.read_snapshot(damaged.id)
            assert gradient["param_id"] in str(caught.value)
            assert gradient["name"] in str(caught.value)
            with pytest.raises(ChecksumMismatchError):
                await store.read_gradient(damaged.id, gradient["param_id"])
            assert_bit_identical(await store.read_snapshot(intact.id), record)
        path.write_bytes(original)
    assert_bit_identical(await store.read_snapshot(damaged.id), record)
    await store.close()


async def test_a_missing_chunk_is_reported(tmp_path: Path) -> None:
    store = open_store(tmp_path, pack_threshold=0)
    record = make_record({"w": np.ones((4, 4), np.float32)})
    info = await store.write_snapshot(record, run="r", step=1)
    pid = str(record.entries[0].param_id)
    (tmp_path / "snapshots" / info.id / pid / "c.0.0").unlink()
    with pytest.raises(ChecksumMismatchError, match=pid):
        await store.read_snapshot(info.id)
    await store.close()


async def test_a_full_disk_leaves_no_snapshot_and_no_staging(tmp_path: Path, monkeypatch) -> None:
    store = open_store(tmp_path, chunk_bytes=1024, pack_threshold=64)
    record = make_record(varied_arrays(3))
    earlier = await store.write_snapshot(record, run="r", step=1)
    begin = store.backend.begin
    chunks_taken = 0

    def until_full(chunks: Iterator[tuple[str, list]]) -> Iterator[tuple[str, list]]:
        """The chunks, until the disk is full: the sixth raises ENOSPC in the writer's
        thread, at the point where the writer would create its file."""
        nonlocal chunks_taken
        for key, buffers in chunks:
            chunks_taken += 1
            if chunks_taken > 5:
                raise OSError(errno.ENOSPC, "No space left on device", key)
            yield key, buffers

    async def begin_on_a_filling_disk(snapshot_id: str, **options: bool) -> SnapshotWriter:
        writer = await begin(snapshot_id, **options)
        write_array = writer.write_array

        async def write_array_until_full(name: str, metadata: bytes, chunks: Iterator) -> None:
            await write_array(name, metadata, until_full(chunks))

        writer.write_array = write_array_until_full  # type: ignore[method-assign]
        return writer

    with monkeypatch.context() as patched:  # unit-level fault injection
        patched.setattr(store.backend, "begin", begin_on_a_filling_disk)
        with pytest.raises(StoreUnavailableError, match="No space left"):
            await store.write_snapshot(record, run="r", step=2)
    assert chunks_taken > 5
    assert [i.id for i in await store.list()] == [earlier.id]
    assert list((tmp_path / ".staging").iterdir()) == []
    assert_bit_identical(await store.read_snapshot(earlier.id), record)
    later = await store.write_snapshot(record, run="r", step=3)
    assert_bit_identical(await store.read_snapshot(later.id), record)
    await store.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_every_file_and_folder_is_fsynced_before_the_manifest_and_the_rename(
    tmp_path: Path, monkeypatch
) -> None:
    store = open_store(tmp_path, chunk_bytes=1024, pack_threshold=64)
    record = make_record(varied_arrays(4))
    await store.write_snapshot(record, run="r", step=0)  # the store's own folders exist
    events = record_fsyncs_and_renames(monkeypatch)
    info = await store.write_snapshot(record, run="r", step=1)
    monkeypatch.undo()

    staging = str(tmp_path.resolve() / ".staging" / info.id)
    committed = tmp_path / "snapshots" / info.id
    written = sorted(
        os.path.join(staging, os.path.relpath(os.path.join(folder, name), committed))
        for folder, folders, files in os.walk(committed)
        for name in folders + files
    )
    assert len(written) > 10  # chunk files, array documents, their folders, the manifest
    order = {event: position for position, event in enumerate(events)}
    renamed = order[("rename", staging)]
    manifest = order[("fsync", os.path.join(staging, "zarr.json"))]
    for path in written:
        assert ("fsync", path) in order, f"{path} was never fsynced"
        assert order[("fsync", path)] <= manifest, path
    assert order[("fsync", staging)] < renamed
    assert manifest < renamed
    assert order[("fsync", str(tmp_path.resolve() / "snapshots"))] > renamed
    assert order[("fsync", str(tmp_path.resolve() / ".staging"))] > renamed
    await store.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("blocking", [False, True], ids=["event-loop", "one-step"])
async def test_the_first_snapshot_makes_every_folder_it_creates_durable(
    tmp_path: Path, monkeypatch, blocking: bool
) -> None:
    """A store folder that does not exist yet, two levels below one that does: the first
    snapshot makes the three folders and the store's own, and before it is committed each
    new folder's entry is fsynced in its parent (a power cut after the snapshot is
    reported durable loses neither it nor the folders above it)."""
    root = tmp_path.resolve() / "a" / "b" / "store"
    store = open_store(root)
    record = make_record({"w": np.arange(1 << 18, dtype=np.float32)})
    events = record_fsyncs_and_renames(monkeypatch)
    if blocking:
        info = store.write_snapshot_blocking(record, run="r", step=0)
        assert info is not None
    else:
        info = await store.write_snapshot(record, run="r", step=0)
    monkeypatch.undo()
    order = {event: position for position, event in enumerate(events)}
    renamed = order[("rename", str(root / ".staging" / info.id))]
    for folder in (tmp_path.resolve(), root.parent.parent, root.parent, root):
        assert ("fsync", str(folder)) in order, f"{folder} was never fsynced"
        assert order[("fsync", str(folder))] < renamed, folder
    # the deepest first: a folder's entry is durable before the one of the folder above it
    assert order[("fsync", str(root.parent))] < order[("fsync", str(root.parent.parent))]
    assert order[("fsync", str(root.parent.parent))] < order[("fsync", str(tmp_path.resolve()))]
    assert_bit_identical(await store.read_snapshot(info.id), record)
    await store.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("direct", [True, False], ids=["o-direct", "page-cache"])
async def test_chunk_files_written_directly_are_fsynced_with_the_documents(
    tmp_path: Path, monkeypatch, direct: bool
) -> None:
    """A chunk file of an array of its own written with O_DIRECT holds its bytes on the
    device already: its fsync waits until every array is written, and is made with the
    documents' and folders', before the manifest's. One written through the page cache is
    fsynced right after it is written, before the next chunk file is made."""
    store = open_store(tmp_path, chunk_bytes=1 << 20, pack_threshold=4096, max_concurrency=1)
    rng = np.random.default_rng(5)
    arrays = {f"g{i}": rng.standard_normal(1 << 17).astype(np.float32) for i in range(3)}
    record = make_record(arrays)
    await store.write_snapshot(record, run="r", step=0)  # the store's own folders exist
    backend = store.backend
    if direct and not backend.direct.enabled:  # type: ignore[attr-defined]
        pytest.skip("this file system refuses O_DIRECT")
    backend.direct.enabled = direct  # type: ignore[attr-defined]
    events = record_fsyncs_and_renames(monkeypatch)
    real_open = os.open

    def recording_open(path, flags, *args):  # type: ignore[no-untyped-def]
        fd = real_open(path, flags, *args)
        if flags & os.O_CREAT:
            events.append(("create", str(path)))
        return fd

    monkeypatch.setattr(os, "open", recording_open)
    info = await store.write_snapshot(record, run="r", step=1)
    monkeypatch.undo()

    committed = tmp_path / "snapshots" / info.id
    staging = tmp_path.resolve() / ".staging" / info.id
    chunks = [
        str(staging / path.relative_to(committed))
        for path in sorted(committed.rglob("*"))
        if path.is_file() and path.name != "zarr.json"
    ]
    assert len(chunks) == 3
    order = {event: position for position, event in enumerate(events)}
    chunks.sort(key=lambda chunk: order[("create", chunk)])  # in the order written
    created = [order[("create", chunk)] for chunk in chunks]
    fsynced = [order[("fsync", chunk)] for chunk in chunks]
    manifest = order[("fsync", str(staging / "zarr.json"))]
    assert all(position < manifest for position in fsynced)
    if direct:
        assert min(fsynced) > max(created)
    else:
        assert all(fsynced[i] < created[i + 1] for i in range(len(chunks) - 1))
    assert_bit_identical(await store.read_snapshot(info.id), record)
    await store.close()


async def test_an_unreachable_s3_endpoint_raises_store_unavailable() -> None:
    store = open_store(
        "s3://gradvault-test/x",
        endpoint="http://127.0.0.1:9",  # discard port: nothing listens
        access_key_id="a",
        secret_access_key="b",
        retry_config={"max_retries": 0},
    )
    with pytest.raises(StoreUnavailableError):
        await store.list()
    await store.close()


# --- the format, as plain zarr-python sees it -----------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_plain_zarr_reads_every_gradient(tmp_path: Path, compression: str | None) -> None:
    store = open_store(tmp_path, chunk_bytes=4096, pack_threshold=512)
    record = make_record(varied_arrays(4))
    info = await store.write_snapshot(record, run="r", step=1, compression=compression)
    await store.close()

    # Reading as docs/FORMAT.md says, with zarr and numpy only.
    group = zarr.open_group(tmp_path / "snapshots" / info.id, mode="r")
    manifest = group.attrs["gradvault"]
    found = {}
    table = manifest["gradients"]
    for param_id, dtype, shape, nbytes, array_name, offset in zip(
        table["param_id"],
        table["dtype"],
        table["shape"],
        table["nbytes"],
        table["array"],
        table["offset"],
        strict=True,
    ):
        if array_name == "packed":
            raw = group["packed"][offset : offset + nbytes]
            array = raw.view(dtype).reshape(tuple(shape))
        else:
            array = group[array_name][...]
        found[param_id] = array

    for entry in record:
        array = found[str(entry.param_id)]
        assert array.dtype == entry.array.dtype and array.shape == entry.array.shape
        assert array.tobytes() == entry.array.tobytes()


async def test_metadata_documents_are_what_zarr_writes(tmp_path: Path) -> None:
    store = open_store(tmp_path / "ours", chunk_bytes=4096, pack_threshold=512)
    record = make_record(varied_arrays(5))
    info = await store.write_snapshot(record, run="r", step=1, compression="zstd:5")
    await store.close()
    ours = tmp_path / "ours" / "snapshots" / info.id
    theirs = zarr.open_group(tmp_path / "theirs", mode="w", zarr_format=3)
    for name in sorted(os.listdir(ours)):
        if name == "zarr.json":
            continue
        document = json.loads((ours / name / "zarr.json").read_text())
        array = theirs.create_array(
            name,
            shape=tuple(document["shape"]),
            chunks=tuple(document["chunk_grid"]["configuration"]["chunk_shape"]),
            dtype=document["data_type"],
            chunk_key_encoding={"name": "default", "separator": "."},
            serializer=BytesCodec(endian="little"),
            compressors=[ZstdCodec(level=5), Crc32cCodec()],
            fill_value=0,
            attributes=document["attributes"],
        )
        assert json.loads((tmp_path / "theirs" / name / "zarr.json").read_text()) == document
        # zarr's own codec chain accepts (and checks the crc32c of) every chunk we wrote.
        assert array.nchunks >= 1
    root = json.loads((tmp_path / "ours" / "zarr.json").read_text())
    assert root == {"attributes": {}, "zarr_format": 3, "node_type": "group"}
    group = zarr.open_group(ours, mode="r")
    for _name, array in group.arrays():
        np.asarray(array[...])  # decodes through zarr's crc32c codec; raises on a bad chunk


async def test_zarr_rejects_a_corrupted_chunk_too(tmp_path: Path) -> None:
    store = open_store(tmp_path, pack_threshold=0)
    record = make_record({"w": np.arange(12, dtype=np.float32).reshape(3, 4)})
    info = await store.write_snapshot(record, run="r", step=1)
    await store.close()
    pid = str(record.entries[0].param_id)
    chunk = tmp_path / "snapshots" / info.id / pid / "c.0.0"
    data = bytearray(chunk.read_bytes())
    data[0] ^= 1
    chunk.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        zarr.open_group(tmp_path / "snapshots" / info.id, mode="r")[pid][...]


@pytest.mark.parametrize("compression", [5, b"zstd", ["zstd"]])
def test_a_compression_that_is_not_text_is_refused_naming_it(compression: object) -> None:
    with pytest.raises(ValueError, match=r"compression is None, 'zstd' or 'zstd:<level>'; got "):
        store_package.parse_compression(compression)


async def test_a_run_of_small_gradients_keeps_the_packed_arrays_offsets(tmp_path: Path) -> None:
    """With a pack_threshold above 64 KiB, a run of more than 16 small gradients (laid out
    together) can start off a 4096-byte boundary and hold one of 64 KiB or more, which
    the packed layout aligns to 4096 from the array's start: every gradient is at the
    manifest's offset, for gradvault and for zarr-python, bit for bit."""
    rng = np.random.default_rng(5)
    arrays = {"big": rng.standard_normal(300 * 256 + 2).astype(np.float32)}  # 300 KiB + 8
    arrays |= {f"s{i}": rng.standard_normal(100).astype(np.float32) for i in range(20)}
    arrays["mid"] = rng.standard_normal(20_000).astype(np.float32)  # 80,000 bytes
    arrays |= {f"t{i}": rng.standard_normal(100).astype(np.float32) for i in range(5)}
    async with open_store(tmp_path, pack_threshold=256 << 10) as store:
        info = await store.write_snapshot(make_record(arrays), run="r", step=1)
        manifest = await store.info(info.id)
        restored = await store.read_snapshot(info.id)
    columns = manifest["gradients"]
    assert set(columns["array"]) == {""}  # one chunk: the packed array is the snapshot's node
    mid = columns["name"].index("mid")
    assert columns["offset"][mid] % 4096 == 0 and columns["offset"][mid - 1] % 4096 != 0
    assert {e.name: e.array.tobytes() for e in restored} == {
        name: array.tobytes() for name, array in arrays.items()
    }
    packed = zarr.open_array(tmp_path / "snapshots" / info.id, mode="r")
    for name, offset, nbytes in zip(
        columns["name"], columns["offset"], columns["nbytes"], strict=True
    ):
        assert packed[offset : offset + nbytes].tobytes() == arrays[name].tobytes(), name


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
@pytest.mark.parametrize("large", [False, True], ids=["small", "written-in-pieces"])
@pytest.mark.parametrize("slow_fsyncs", [False, True], ids=["in-line", "together"])
async def test_a_snapshot_of_one_chunk_is_one_packed_chunk_fsynced_in_three_rounds(
    tmp_path: Path, monkeypatch, large: bool, slow_fsyncs: bool
) -> None:
    """Every gradient of a snapshot no longer than a chunk is packed, large ones included,
    and the packed array is the snapshot's node (format 4): one chunk file beside the
    snapshot's ``zarr.json`` (the array's document, the manifest in its attributes), no
    folder of its own. The chunk is fsynced first, then the document and the staging
    folder, before the rename, and snapshots/ and .staging/ after it (the folders the
    rename changed: on a file system that does not journal its folders, a stale name in
    .staging/ would be taken by gc for an abandoned write). The same when the chunk is long
    enough to go to the device in pieces (at least two PIECE_BYTES), and whether a
    round's fsyncs are made one after the other (quick fsyncs, as here) or in threads of
    their own (the backend told its fsyncs are slow)."""
    store = open_store(tmp_path, pack_threshold=512)
    arrays = varied_arrays(5)
    if large:
        arrays["big"] = np.random.default_rng(3).standard_normal(5 << 18).astype(np.float32)
    record = make_record(arrays)
    await store.write_snapshot(record, run="r", step=0)  # the store's own folders exist
    fsyncs = store.backend.fsyncs  # type: ignore[attr-defined]
    if slow_fsyncs:
        fsyncs.mean_fsync_seconds = 1.0
    assert fsyncs.in_line() is not slow_fsyncs
    events = record_fsyncs_and_renames(monkeypatch)
    info = await store.write_snapshot(record, run="r", step=1)
    monkeypatch.undo()

    committed = tmp_path / "snapshots" / info.id
    found = sorted(p.relative_to(committed).as_posix() for p in committed.rglob("*"))
    assert found == ["c.0", "zarr.json"]
    document = json.loads((committed / "zarr.json").read_bytes())
    assert (
        document["node_type"] == "array"
        and document["shape"] == document["chunk_grid"]["configuration"]["chunk_shape"]
    )
    manifest = (await store.info(info.id))["gradients"]
    assert set(manifest["array"]) == {""}  # the packed array: the snapshot's node
    assert max(manifest["nbytes"]) >= 512  # gradients over pack_threshold, packed too
    assert_bit_identical(await store.read_snapshot(info.id), record)

    staging = tmp_path.resolve() / ".staging" / info.id
    assert events[0] == ("fsync", str(staging / "c.0"))
    assert set(events[1:3]) == {("fsync", str(staging / "zarr.json")), ("fsync", str(staging))}
    assert events[3] == ("rename", str(staging))
    # both folders of the rename: the snapshot's new name, then its old one gone
    assert events[4:] == [
        ("fsync", str(tmp_path.resolve() / "snapshots")),
        ("fsync", str(tmp_path.resolve() / ".staging")),
    ]
    await store.close()
