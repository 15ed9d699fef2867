"""bf16 snapshots: the store round trip, the format, and two other Zarr readers and writers."""

from __future__ import annotations

import json
import math
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest
import zarr

import gradvault.core as gv
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, open_store
from gradvault.zarr_dtypes import BFloat16

from ..bf16_values import special_values

ts = pytest.importorskip("tensorstore")

OWN = gv.ParamId(0xB0)  # 2 x 1500 bf16: 6000 bytes, over two of the test store's 4 KiB chunks
PACKED = gv.ParamId(0xB1)  # 16 bf16: packed
SCALAR = gv.ParamId(0xB2)  # 0-d, packed


def _record() -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(OWN, "fc.weight", special_values((2, 1500), seed=1)),
            GradientRecordEntry.from_array(PACKED, "fc.bias", special_values((16,))),
            GradientRecordEntry.from_array(SCALAR, "scale", np.array(-0.0, dtype=gv.bfloat16)),
        ],
        metadata={"dtype": "bf16"},
    )


def _assert_same_bits(found: np.ndarray, expected: np.ndarray) -> None:
    assert found.dtype == gv.bfloat16 and found.shape == expected.shape
    assert np.array_equal(found.view(np.uint16), expected.view(np.uint16))


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_local_and_s3_round_trips_are_bit_exact(make_store, compression: str | None) -> None:
    store = make_store(chunk_bytes=4096, pack_threshold=512)
    record = _record()
    info = await store.write_snapshot(record, run="bf16", step=1, compression=compression)
    back = await store.read_snapshot(info.id)
    assert back == record
    for entry in record:
        _assert_same_bits(back[entry.param_id].array, entry.array)
        one = await store.read_gradient(info.id, entry.param_id)
        _assert_same_bits(one.array, entry.array)
    streamed = b"".join([bytes(p) async for p in store.iter_gradient(info.id, OWN, 10, 5000)])
    assert streamed == record[OWN].array.tobytes()[10:5000]


async def test_manifest_names_bfloat16_and_stats_use_float_math(store: SnapshotStore) -> None:
    record = _record()
    info = await store.write_snapshot(record, run="bf16", step=1)
    manifest = await store.info(info.id)
    table = manifest["gradients"]
    assert set(table["dtype"]) == {"bfloat16"}
    for i, param_id in enumerate(table["param_id"]):
        with np.errstate(invalid="ignore"):  # NaN payloads warn as they are cast
            values = record[param_id].array.astype(np.float64).reshape(-1)
        finite = values[np.isfinite(values)]
        stats = {key: column[i] for key, column in table["stats"].items()}
        assert stats["nan_count"] == int(np.isnan(values).sum())
        assert stats["inf_count"] == int(np.isinf(values).sum())
        expected_norm = math.sqrt(float(np.sum(finite * finite)))
        if math.isfinite(expected_norm):
            assert stats["l2_norm"] == pytest.approx(expected_norm, rel=1e-6)
        else:
            assert stats["l2_norm"] == "Infinity"
        assert stats["max_abs"] == (float(np.abs(finite).max()) if finite.size else 0.0)


async def test_a_sum_of_squares_is_not_rounded_to_bf16(store: SnapshotStore) -> None:
    """1000 ones: 1000.0 in float math (bf16 math would stop at 256)."""
    ones = GradientRecordEntry.from_array(OWN, "ones", np.ones(1000, dtype=gv.bfloat16))
    info = await store.write_snapshot(GradientsParamsRecord([ones]), run="bf16", step=1)
    stats = (await store.info(info.id))["gradients"]["stats"]
    assert stats["l2_norm"] == [pytest.approx(math.sqrt(1000))] and stats["max_abs"] == [1.0]


async def _write_local(tmp_path: Path, compression: str | None = None) -> tuple[Path, str]:
    store = open_store(tmp_path, chunk_bytes=4096, pack_threshold=512)
    try:
        info = await store.write_snapshot(_record(), run="bf16", step=1, compression=compression)
    finally:
        await store.close()
    return tmp_path / "snapshots" / info.id, info.id


def _packed_values(packed: np.ndarray, manifest: dict, param_id: gv.ParamId) -> np.ndarray:
    table = manifest["gradients"]
    i = table["param_id"].index(str(param_id))
    offset, nbytes = table["offset"][i], table["nbytes"][i]
    return packed[offset : offset + nbytes].view(table["dtype"][i]).reshape(table["shape"][i])


async def test_the_array_document_says_bfloat16_with_a_float_fill(tmp_path: Path) -> None:
    group, _ = await _write_local(tmp_path)
    document = json.loads((group / str(OWN) / "zarr.json").read_text())
    assert document["data_type"] == "bfloat16"
    assert document["fill_value"] == 0.0 and isinstance(document["fill_value"], float)
    assert document["codecs"][0] == {"name": "bytes", "configuration": {"endian": "little"}}


@pytest.mark.parametrize("compression", [None, "zstd"])
async def test_tensorstore_reads_a_bf16_snapshot_bit_exact(
    tmp_path: Path, compression: str | None
) -> None:
    group, _ = await _write_local(tmp_path, compression)
    record = _record()
    manifest = zarr.open_group(group, mode="r").attrs["gradvault"]

    def open_array(name: str):  # noqa: ANN202
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(group / name)}}
        return ts.open(spec).result().read().result()

    _assert_same_bits(open_array(str(OWN)), record[OWN].array)
    packed = open_array("packed")
    for param_id in (PACKED, SCALAR):
        _assert_same_bits(_packed_values(packed, manifest, param_id), record[param_id].array)


async def test_zarr_python_with_the_shipped_type_reads_a_bf16_snapshot(tmp_path: Path) -> None:
    group_path, _ = await _write_local(tmp_path)
    record = _record()
    group = zarr.open_group(group_path, mode="r")
    own = group[str(OWN)]
    assert isinstance(own.metadata.data_type, BFloat16)
    _assert_same_bits(own[...], record[OWN].array)
    packed = group["packed"][...]
    for param_id in (PACKED, SCALAR):
        found = _packed_values(packed, group.attrs["gradvault"], param_id)
        _assert_same_bits(found, record[param_id].array)


def test_the_data_type_is_declared_as_a_zarr_entry_point() -> None:
    (point,) = [e for e in entry_points(group="zarr.data_type") if e.name == "bfloat16"]
    assert point.value == "gradvault.zarr_dtypes:BFloat16"
    assert point.load() is BFloat16
    assert zarr.dtype.data_type_registry.get("bfloat16") is BFloat16


@pytest.mark.parametrize(
    ("fill", "bits"),
    [
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (1.0, 0x3F80),
        ("0x3f80", 0x3F80),  # 1.0: zarr's float helpers would read 1.875 (float16 bits)
        ("0x7fc1", 0x7FC1),  # a NaN payload
        ("0x0001", 0x0001),  # the smallest subnormal
        ("NaN", 0x7FC0),
        ("Infinity", 0x7F80),
        ("-Infinity", 0xFF80),
    ],
)
def test_fill_values_are_parsed_as_bf16_bits(fill: float | str, bits: int) -> None:
    dtype = BFloat16()
    value = dtype.from_json_scalar(fill, zarr_format=3)
    assert int(np.array(value, dtype=gv.bfloat16).view(np.uint16)) == bits
    again = dtype.from_json_scalar(dtype.to_json_scalar(value, zarr_format=3), zarr_format=3)
    assert int(np.array(again, dtype=gv.bfloat16).view(np.uint16)) == bits


@pytest.mark.parametrize("fill", ["0x3f8", "0x3f800000", "one", True, [1]])
def test_a_bad_fill_value_is_refused(fill: object) -> None:
    with pytest.raises(TypeError, match="bfloat16"):
        BFloat16().from_json_scalar(fill, zarr_format=3)


def test_zarr_python_writes_bf16_that_tensorstore_reads(tmp_path: Path) -> None:
    values = special_values((8, 8), seed=3)
    array = zarr.create_array(
        tmp_path / "z", shape=values.shape, dtype=gv.bfloat16, chunks=(4, 8), fill_value="0x7fc1"
    )
    array[...] = values
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "z")}}
    _assert_same_bits(ts.open(spec).result().read().result(), values)
    assert zarr.open_array(tmp_path / "z", mode="r").metadata.to_dict()["fill_value"] == "0x7fc1"


async def test_gradvault_reads_a_bf16_array_tensorstore_wrote(tmp_path: Path) -> None:
    """tensorstore rewrites a snapshot's own array (same values, its own zarr.json and
    chunks, a NaN fill value of its choosing); gradvault reads it back bit for bit."""
    group, snapshot_id = await _write_local(tmp_path)
    record = _record()
    path = group / str(OWN)
    for old in sorted(path.rglob("*"), reverse=True):
        old.rmdir() if old.is_dir() else old.unlink()
    written = ts.open(
        {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(path)},
            "metadata": {
                "shape": [2, 1500],
                "data_type": "bfloat16",
                "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, 1500]}},
                "chunk_key_encoding": {"name": "default", "configuration": {"separator": "."}},
                "fill_value": "NaN",
                "codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
                "attributes": {"gradvault": {"param_id": str(OWN), "name": "fc.weight"}},
            },
            "create": True,
        }
    ).result()
    written.write(record[OWN].array).result()
    assert '"fill_value":"NaN"' in (path / "zarr.json").read_text().replace(" ", "")
    store = open_store(tmp_path)
    try:
        _assert_same_bits((await store.read_gradient(snapshot_id, OWN)).array, record[OWN].array)
        _assert_same_bits((await store.read_snapshot(snapshot_id))[OWN].array, record[OWN].array)
    finally:
        await store.close()


def test_a_recorder_snapshots_and_restores_bf16_gradients_bit_exact(tmp_path: Path) -> None:
    """A bf16 model's backward, captured by the recorder, restored as bf16 tensors."""
    gv.manual_seed(3)
    model = gv.MLP(8, [300], 4, dtype=gv.bfloat16)  # 8 x 300 bf16: an array of its own
    x = gv.randn(16, 8, dtype=gv.bfloat16)
    gv.cross_entropy(model(x), gv.tensor(np.arange(16) % 4)).backward()
    grads = gv.GradientsParams.from_module_grad(model)
    with gv.Recorder(tmp_path, chunk_bytes=1024) as recorder:
        info = recorder.sync.snapshot(grads, run="bf16", step=0)
        restored = recorder.sync.restore(info.id, "cpu")
    assert len(restored) == len(grads) == 4
    for param_id in grads:
        _assert_same_bits(restored.get(param_id).numpy(), grads.get(param_id).numpy())
