"""A damaged snapshot manifest is refused with ManifestError, never read through.

Each case writes a real snapshot to a local store, rewrites the manifest in its
``zarr.json`` with one kind of damage, and opens the store afresh (no cached manifest).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.core.errors import (
    FormatVersionError,
    InvalidParamIdError,
    ManifestError,
    RecorderError,
    StoreKeyNotFoundError,
)
from gradvault.core.records.param_id import ParamId
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, open_store

from ..store_files import reseal

OPTIONS = {"chunk_bytes": 4096, "pack_threshold": 512}


def make_record(seed: int = 0) -> GradientsParamsRecord:
    """Packed (small) and own (large, multi-chunk) gradients of several dtypes and ranks."""
    rng = np.random.default_rng(seed)
    arrays = {
        "fc1.weight": rng.standard_normal((64, 33)).astype(np.float32),  # own, 3 chunks
        "fc1.bias": rng.standard_normal(33).astype(np.float32),  # packed
        "fc2.weight": rng.standard_normal((8, 100)).astype(np.float64),  # own
        "scalar": np.array(3.25, dtype=np.float32),  # packed, 0-d
        "empty": np.zeros((0, 4), dtype=np.float32),  # packed, 0 bytes
        "flags": rng.integers(0, 2, (13,)).astype(bool),  # packed
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, array) for name, array in arrays.items()]
    )


def manifest_path(root: Path, snapshot_id: str) -> Path:
    return root / "snapshots" / snapshot_id / "zarr.json"


def rewrite_manifest(root: Path, snapshot_id: str, damage: Callable[[dict], None]) -> None:
    path = manifest_path(root, snapshot_id)
    document = json.loads(path.read_text())
    damage(document["attributes"]["gradvault"])
    reseal(document)  # a manifest written so: its fields are what is refused, not its checksum
    path.write_text(json.dumps(document))


def spy_on_reads(store: SnapshotStore) -> list[str]:
    """The keys ``store``'s backend reads from now on, in order."""
    keys_read: list[str] = []
    real_read = store.backend.read

    async def spy(key: str, *args: object):
        keys_read.append(key)
        return await real_read(key, *args)

    store.backend.read = spy  # type: ignore[method-assign]
    return keys_read


def position(manifest: dict, name: str) -> int:
    return manifest["gradients"]["name"].index(name)


def set_column(column: str, name: str, value: Any) -> Callable[[dict], None]:
    def damage(manifest: dict) -> None:
        manifest["gradients"][column][position(manifest, name)] = value

    return damage


def set_field(key: str, value: Any) -> Callable[[dict], None]:
    def damage(manifest: dict) -> None:
        manifest[key] = value

    return damage


def drop_field(*keys: str) -> Callable[[dict], None]:
    def damage(manifest: dict) -> None:
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        del target[keys[-1]]

    return damage


def shorten_column(column: str) -> Callable[[dict], None]:
    def damage(manifest: dict) -> None:
        manifest["gradients"][column].pop()

    return damage


def shorten_stats_column(manifest: dict) -> None:
    manifest["gradients"]["stats"]["max_abs"].pop()


def duplicate_param_id(manifest: dict) -> None:
    ids = manifest["gradients"]["param_id"]
    ids[position(manifest, "fc1.bias")] = ids[position(manifest, "fc1.weight")]


def shift_packed_length(delta: int) -> Callable[[dict], None]:
    def damage(manifest: dict) -> None:
        manifest["packed"]["nbytes"] += delta

    return damage


def claim_more_bytes_than_addressable(manifest: dict) -> None:
    """A consistent claim (shape, nbytes, total) of 2**63 bytes: more than any process holds."""
    i = position(manifest, "fc1.weight")
    table = manifest["gradients"]
    table["shape"][i], table["chunk_shape"][i] = [2**61], [2**61]
    manifest["nbytes"] += 2**63 - table["nbytes"][i]
    table["nbytes"][i] = 2**63


def change_shape_keep_nbytes(manifest: dict) -> None:
    manifest["gradients"]["shape"][position(manifest, "fc1.bias")] = [34]


# (case id, damage, field named in the message, gradient named in the message or None)
CASES: list[tuple[str, Callable[[dict], None], str, str | None]] = [
    ("missing-gradients", drop_field("gradients"), "'gradients'", None),
    ("gradients-not-object", set_field("gradients", []), "'gradients'", None),
    ("missing-run", drop_field("run"), "'run'", None),
    ("run-not-str", set_field("run", 7), "'run'", None),
    ("id-of-another-snapshot", set_field("id", "01ARZ3NDEKTSV4RRFFQ69G5FAV"), "'id'", None),
    ("step-negative", set_field("step", -1), "'step'", None),
    ("step-str", set_field("step", "3"), "'step'", None),
    ("step-bool", set_field("step", True), "'step'", None),
    ("missing-created-at", drop_field("created_at"), "'created_at'", None),
    ("device-not-str", set_field("device", 0), "'device'", None),
    ("tags-not-str", set_field("tags", {"a": 1}), "'tags'", None),
    ("tags-list", set_field("tags", ["a"]), "'tags'", None),
    ("metadata-list", set_field("metadata", [1, 2]), "'metadata'", None),
    ("unknown-compression", set_field("compression", "lz4"), "'compression'", None),
    ("compression-int", set_field("compression", 3), "'compression'", None),
    ("num-params", set_field("num_params", 99), "'num_params'", None),
    ("total-nbytes", set_field("nbytes", 1), "'nbytes'", None),
    ("short-dtype-column", shorten_column("dtype"), "'gradients.dtype'", None),
    ("short-array-column", shorten_column("array"), "'gradients.array'", None),
    ("missing-checksum-column", drop_field("gradients", "checksum"), "'gradients.checksum'", None),
    ("missing-stats", drop_field("gradients", "stats"), "'gradients.stats'", None),
    ("short-stats-column", shorten_stats_column, "'gradients.stats.max_abs'", None),
    (
        "missing-stats-column",
        drop_field("gradients", "stats", "l2_norm"),
        "'gradients.stats.l2_norm'",
        None,
    ),
    ("bad-param-id", set_column("param_id", "fc1.bias", "zz"), "'gradients.param_id'", None),
    (
        "path-param-id",
        set_column("param_id", "fc1.weight", "../../../../etc"),
        "'gradients.param_id'",
        None,
    ),
    ("duplicate-param-id", duplicate_param_id, "'gradients.param_id'", "fc1.weight"),
    ("name-not-str", set_column("name", "fc1.bias", None), "'gradients.name'", None),
    (
        "unsupported-dtype",
        set_column("dtype", "fc1.bias", "complex64"),
        "'gradients.dtype'",
        "fc1.bias",
    ),
    (
        "shape-negative",
        set_column("shape", "fc1.weight", [-64, -33]),
        "'gradients.shape'",
        "fc1.weight",
    ),
    ("shape-not-list", set_column("shape", "fc1.bias", 33), "'gradients.shape'", "fc1.bias"),
    ("shape-disagrees-with-nbytes", change_shape_keep_nbytes, "'gradients.nbytes'", "fc1.bias"),
    ("nbytes-float", set_column("nbytes", "fc1.bias", 132.0), "'gradients.nbytes'", "fc1.bias"),
    (
        "nbytes-beyond-address-space",
        claim_more_bytes_than_addressable,
        "'gradients.nbytes'",
        "fc1.weight",
    ),
    (
        "bad-checksum-text",
        set_column("checksum", "fc1.bias", "crc32c:zzzzzzzz"),
        "'gradients.checksum'",
        "fc1.bias",
    ),
    (
        "checksum-wrong-algorithm",
        set_column("checksum", "fc1.weight", "md5:0123456789"),
        "'gradients.checksum'",
        "fc1.weight",
    ),
    (
        "array-escapes-store",
        set_column("array", "fc1.weight", "../../../../etc"),
        "'gradients.array'",
        "fc1.weight",
    ),
    (
        "packed-array-escapes-store",
        set_column("array", "fc1.bias", "../../../../etc"),
        "'gradients.array'",
        "fc1.bias",
    ),
    (
        "array-of-another-gradient",
        set_column("array", "fc1.weight", "0123456789abcdef"),
        "'gradients.array'",
        "fc1.weight",
    ),
    ("packed-length-short", shift_packed_length(-8), "'packed.nbytes'", None),
    ("packed-length-long", shift_packed_length(+8), "'packed.nbytes'", None),
    ("packed-null-with-packed-rows", set_field("packed", None), "'packed'", "fc1.bias"),
    (
        "packed-chunk-bytes-zero",
        lambda m: m["packed"].update(chunk_bytes=0),
        "'packed.chunk_bytes'",
        None,
    ),
    (
        "offset-outside-packed",
        set_column("offset", "fc1.bias", 10**9),
        "'gradients.offset'",
        "fc1.bias",
    ),
    ("offset-negative", set_column("offset", "fc1.bias", -8), "'gradients.offset'", "fc1.bias"),
    ("offset-null", set_column("offset", "fc1.bias", None), "'gradients.offset'", "fc1.bias"),
    (
        "chunk-shape-zero",
        set_column("chunk_shape", "fc1.weight", [0, 33]),
        "'gradients.chunk_shape'",
        "fc1.weight",
    ),
    (
        "chunk-shape-rank",
        set_column("chunk_shape", "fc1.weight", [24]),
        "'gradients.chunk_shape'",
        "fc1.weight",
    ),
    (
        "chunk-shape-not-contiguous",
        set_column("chunk_shape", "fc1.weight", [24, 11]),
        "'gradients.chunk_shape'",
        "fc1.weight",
    ),
    (
        "chunk-shape-null",
        set_column("chunk_shape", "fc1.weight", None),
        "'gradients.chunk_shape'",
        "fc1.weight",
    ),
    ("manifest-not-object", None, "manifest", None),
]


@pytest.fixture
async def three_snapshots(tmp_path: Path):
    """A local store root, three committed snapshots (ids oldest first) and their records."""
    root = tmp_path / "store"
    records = [make_record(seed) for seed in range(3)]
    async with open_store(root, **OPTIONS) as store:
        infos = [await store.write_snapshot(r, run="train", step=i) for i, r in enumerate(records)]
    return root, [info.id for info in infos], records


def assert_same(found: GradientsParamsRecord, expected: GradientsParamsRecord) -> None:
    assert [e.param_id for e in found] == [e.param_id for e in expected]
    for got, want in zip(found, expected, strict=True):
        assert (got.name, got.dtype, got.shape) == (want.name, want.dtype, want.shape)
        assert got.array.tobytes() == want.array.tobytes()


@pytest.mark.parametrize(
    ("damage", "field", "gradient"),
    [pytest.param(damage, field, gradient, id=case) for case, damage, field, gradient in CASES],
)
async def test_a_damaged_manifest_is_refused_clearly_and_skipped_by_list(
    three_snapshots, damage: Callable[[dict], None] | None, field: str, gradient: str | None
) -> None:
    root, ids, records = three_snapshots
    victim = ids[1]
    original = json.loads(manifest_path(root, victim).read_text())["attributes"]["gradvault"]
    if damage is None:  # the manifest is not an object at all
        path = manifest_path(root, victim)
        document = json.loads(path.read_text())
        document["attributes"]["gradvault"] = ["not", "a", "manifest"]
        path.write_text(json.dumps(document))
    else:
        rewrite_manifest(root, victim, damage)

    async with open_store(root, **OPTIONS) as store:
        keys_read = spy_on_reads(store)

        some_param = original["gradients"]["param_id"][0]
        for call in (
            lambda: store.info(victim),
            lambda: store.read_snapshot(victim),
            lambda: store.read_gradient(victim, some_param),
        ):
            with pytest.raises(ManifestError) as caught:
                await call()
            message = str(caught.value)
            assert isinstance(caught.value, RecorderError) and isinstance(caught.value, ValueError)
            assert victim in message and field in message, message
            if gradient is not None:
                row = original["gradients"]["name"].index(gradient)
                assert original["gradients"]["param_id"][row] in message, message
                assert repr(gradient) in message, message
        # only the manifest was ever read: no key was built from the damaged table
        assert set(keys_read) == {f"snapshots/{victim}/zarr.json"}

        listed = await store.list()
        assert [info.id for info in listed] == [ids[2], ids[0]]
        for snapshot_id, record in ((ids[0], records[0]), (ids[2], records[2])):
            assert_same(await store.read_snapshot(snapshot_id), record)
        with pytest.raises(ManifestError):  # still refused after list()
            await store.info(victim)


async def test_list_skips_a_manifest_of_another_format_version(three_snapshots) -> None:
    root, ids, records = three_snapshots
    rewrite_manifest(root, ids[0], set_field("format_version", 5))
    rewrite_manifest(root, ids[2], drop_field("gradients"))
    async with open_store(root, **OPTIONS) as store:
        assert [info.id for info in await store.list()] == [ids[1]]
        assert [info.id for info in await store.list(run="train")] == [ids[1]]
        assert_same(await store.read_snapshot(ids[1]), records[1])
        with pytest.raises(FormatVersionError, match="format version 5"):
            await store.read_snapshot(ids[0])


async def test_packed_section_without_packed_gradients_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "store"
    rng = np.random.default_rng(1)
    record = GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                # longer than a chunk (4096), so not packed whole: an array of its own
                ParamId(),
                "big",
                rng.standard_normal((33, 32)).astype(np.float32),
            )
        ]
    )
    async with open_store(root, **OPTIONS) as store:
        info = await store.write_snapshot(record, run="r", step=0)
    bogus = {"array": "packed", "nbytes": 8, "chunk_bytes": 8, "alignment": 8}
    rewrite_manifest(root, info.id, set_field("packed", bogus))
    async with open_store(root, **OPTIONS) as store:
        with pytest.raises(FormatVersionError, match="'packed'.*no gradient is packed"):
            await store.info(info.id)
        assert await store.list() == []


async def test_an_undamaged_manifest_still_reads(three_snapshots) -> None:
    root, ids, records = three_snapshots
    rewrite_manifest(root, ids[0], lambda manifest: None)  # re-encoded, not changed
    async with open_store(root, **OPTIONS) as store:
        assert [info.id for info in await store.list()] == ids[::-1]
        for snapshot_id, record in zip(ids, records, strict=True):
            assert_same(await store.read_snapshot(snapshot_id), record)
            for entry in record:
                got = await store.read_gradient(snapshot_id, entry.param_id)
                assert got.array.tobytes() == entry.array.tobytes()


async def test_read_gradient_rejects_a_malformed_param_id_before_any_io(tmp_path: Path) -> None:
    root = tmp_path / "never-created"
    store: SnapshotStore = open_store(root)

    async def no_io(key: str) -> None:
        raise AssertionError(f"read {key} before checking the param id")

    store.backend.read = no_io  # type: ignore[method-assign]
    for bad in ("zz", "../x", "0123456789ABCDEF", "0123456789abcdef0"):
        with pytest.raises(InvalidParamIdError, match="16 lowercase hex digits"):
            await store.read_gradient("01ARZ3NDEKTSV4RRFFQ69G5FAV", bad)
    assert not root.exists()
    await store.close()


def test_param_id_parse_raises_invalid_param_id_error() -> None:
    with pytest.raises(InvalidParamIdError) as caught:
        ParamId.parse("../x")
    assert isinstance(caught.value, ValueError)
    assert "'../x'" in str(caught.value) and "16 lowercase hex digits" in str(caught.value)
    for bad_value in (-1, 2**64, 1.5, True, "12"):
        with pytest.raises(InvalidParamIdError):
            ParamId(bad_value)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # existing callers catching ValueError keep working
        ParamId.parse("zz")


# --- the packed array as the snapshot's node (format 4) ---------------------------------


async def one_chunk_snapshot(tmp_path: Path) -> tuple[Path, str, GradientsParamsRecord]:
    """A snapshot of one chunk, its node the packed array: (store root, id, its record)."""
    root = tmp_path / "store"
    record = make_record(7)
    async with open_store(root, pack_threshold=512) as store:
        info = await store.write_snapshot(record, run="train", step=1)
    document = json.loads(manifest_path(root, info.id).read_text())
    assert document["node_type"] == "array"
    assert document["attributes"]["gradvault"]["packed"]["array"] == ""
    return root, info.id, record


def name_packed(name: str, *, gradient: str | None = None) -> Callable[[dict], None]:
    """Call the packed array ``name`` in ``packed.array``, or only in ``gradient``'s row."""

    def damage(manifest: dict) -> None:
        if gradient is None:
            manifest["packed"]["array"] = name
        else:
            manifest["gradients"]["array"][position(manifest, gradient)] = name

    return damage


def halve_packed_chunk(manifest: dict) -> None:
    manifest["packed"]["chunk_bytes"] = -(-manifest["packed"]["nbytes"] // 2)


@pytest.mark.parametrize(
    ("damage", "field", "gradient"),
    [
        (name_packed("packed", gradient="fc1.bias"), "'gradients.array'", "fc1.bias"),
        (name_packed("packed"), "'gradients.array'", None),  # the rows say "", packed does not
        (set_field("format_version", 3), "'gradients.array'", None),  # "" before format 4
        (set_field("compression", "zstd:3"), "'compression'", None),  # one raw chunk only
        (halve_packed_chunk, "'packed.chunk_bytes'", None),
    ],
    ids=["one-row-says-packed", "packed-says-packed", "format-3", "compressed", "two-chunks"],
)
async def test_a_root_packed_array_named_otherwise_is_refused(
    tmp_path: Path, damage: Callable[[dict], None], field: str, gradient: str | None
) -> None:
    """A manifest that names the packed array "" must do so for every gradient and in
    ``packed``, from format 4, and describe one uncompressed chunk: anything else is
    refused before any key is built."""
    root, snapshot_id, _ = await one_chunk_snapshot(tmp_path)
    rewrite_manifest(root, snapshot_id, damage)
    async with open_store(root) as store:
        keys_read = spy_on_reads(store)
        with pytest.raises(ManifestError, match=field) as raised:
            await store.read_snapshot(snapshot_id)
    assert snapshot_id in str(raised.value)
    assert keys_read == [f"snapshots/{snapshot_id}/zarr.json"]  # refused as it was loaded
    if gradient is not None:
        assert repr(gradient) in str(raised.value)


async def test_a_root_manifest_in_a_group_document_is_refused_before_a_chunk_is_read(
    tmp_path: Path,
) -> None:
    """The manifest says the snapshot's node is the packed array, its document says group:
    the packed array's document check refuses it (node_type), nothing is read as packed."""
    root, snapshot_id, _ = await one_chunk_snapshot(tmp_path)
    path = manifest_path(root, snapshot_id)
    document = json.loads(path.read_text())
    group = {"attributes": document["attributes"], "zarr_format": 3, "node_type": "group"}
    path.write_text(json.dumps(group))
    async with open_store(root) as store:
        with pytest.raises(ManifestError, match="node_type") as raised:
            await store.read_snapshot(snapshot_id)
    assert snapshot_id in str(raised.value)


async def test_a_root_packed_array_reads_bit_for_bit_and_by_gradient(tmp_path: Path) -> None:
    """Its document (the manifest, however long) is read once, as the manifest is loaded;
    the packed array's fields are checked from it, not read again for each gradient."""
    root, snapshot_id, record = await one_chunk_snapshot(tmp_path)
    async with open_store(root) as store:
        keys_read = spy_on_reads(store)
        restored = await store.read_snapshot(snapshot_id)
        assert [e.array.tobytes() for e in restored] == [e.array.tobytes() for e in record]
        for entry in record:
            one = await store.read_gradient(snapshot_id, str(entry.param_id))
            assert one.array.tobytes() == entry.array.tobytes()
        assert keys_read.count(f"snapshots/{snapshot_id}/zarr.json") == 1, keys_read
        chunk = await store.read_key(f"snapshots/{snapshot_id}/c.0")
        assert bytes(chunk) == (root / "snapshots" / snapshot_id / "c.0").read_bytes()
        for absent in ("packed/c.0", "packed/zarr.json", "c.1"):
            with pytest.raises(StoreKeyNotFoundError, match="has no key"):
                await store.read_key(f"snapshots/{snapshot_id}/{absent}")


def edit_node(field: str, value: Any) -> Callable[[dict], None]:
    """Set one of the document's own fields (the packed array's, not the manifest's)."""

    def edit(document: dict) -> None:
        if field == "separator":
            document["chunk_key_encoding"]["configuration"]["separator"] = value
        else:
            document[field] = value

    return edit


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("data_type", "int8"),
        ("shape", [12]),
        ("separator", "/"),
        ("codecs", [{"name": "bytes"}]),
        ("node_type", "group"),
    ],
)
async def test_a_root_packed_arrays_document_is_served_by_key_only_with_its_fields_right(
    tmp_path: Path, field: str, value: Any
) -> None:
    """The snapshot's document is also the packed array's: a Zarr reader asking for it by
    key (as over ``/v1/zarr``) is refused what the manifest's checksum does not cover, an
    array field edited, as every read of the array refuses it."""
    root, snapshot_id, _ = await one_chunk_snapshot(tmp_path)
    key = f"snapshots/{snapshot_id}/zarr.json"
    async with open_store(root) as store:
        assert bytes(await store.read_key(key)) == manifest_path(root, snapshot_id).read_bytes()
    path = manifest_path(root, snapshot_id)
    document = json.loads(path.read_text())
    edit_node(field, value)(document)
    path.write_text(json.dumps(document))
    async with open_store(root) as store:
        named = field.replace("separator", "chunk_key_encoding")
        with pytest.raises(ManifestError, match=named) as raised:
            await store.read_key(key)
    assert snapshot_id in str(raised.value) and key in str(raised.value)


@pytest.mark.parametrize("one_chunk", [True, False], ids=["array-node", "group"])
async def test_a_manifest_document_changed_after_it_was_loaded_is_not_served_by_key(
    tmp_path: Path, one_chunk: bool
) -> None:
    """A store that has loaded (and validated) a snapshot's manifest serves its document by
    key only as it was validated: a gradient renamed in place at the same length since is
    refused by the manifest's checksum as the document is loaded again, not served."""
    if one_chunk:
        root, snapshot_id, record = await one_chunk_snapshot(tmp_path)
    else:
        root = tmp_path / "store"
        record = make_record(7)
        async with open_store(root) as store:  # gradients of 64 KiB: a group of arrays
            snapshot_id = (await store.write_snapshot(record, run="train", step=1)).id
        assert json.loads(manifest_path(root, snapshot_id).read_text())["node_type"] == "group"
    key = f"snapshots/{snapshot_id}/zarr.json"
    path = manifest_path(root, snapshot_id)
    original = path.read_bytes()
    name = record.entries[0].name
    assert original.count(f'"{name}"'.encode()) == 1
    async with open_store(root) as store:
        assert bytes(await store.read_key(key)) == original  # loaded and validated
        path.write_bytes(original.replace(f'"{name}"'.encode(), f'"{name[:-1]}X"'.encode()))
        with pytest.raises(ManifestError, match="checksum") as raised:
            await store.read_key(key)
        assert snapshot_id in str(raised.value)
        path.write_bytes(original)
        assert bytes(await store.read_key(key)) == original


async def test_a_manifest_document_that_differs_from_every_load_is_not_served(
    tmp_path: Path,
) -> None:
    """Where the document read to be served differs from the one loaded again to validate
    it (it changed between the two reads), it is refused as changed, not served."""
    root, snapshot_id, _ = await one_chunk_snapshot(tmp_path)
    key = f"snapshots/{snapshot_id}/zarr.json"
    async with open_store(root) as store:
        keys_read = spy_on_reads(store)
        real_read = store.backend.read

        async def read_then_changed(read_key: str, *args: object):
            data = await real_read(read_key, *args)
            if read_key == key and keys_read.count(key) == 2:  # the read that would be served
                return memoryview(bytes(data) + b" ")  # the same manifest, other bytes
            return data

        store.backend.read = read_then_changed  # type: ignore[method-assign]
        with pytest.raises(ManifestError, match="changed while it was read") as raised:
            await store.read_key(key)
        assert keys_read == [key, key, key]  # loaded, read to serve, loaded again
        assert snapshot_id in str(raised.value)
