"""Downloads and uploads, bit for bit: numpy, safetensors and zarr-python read what is served."""

from __future__ import annotations

import asyncio
import io
import logging
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
import safetensors.numpy

from gradvault.core import (
    GradientRecordEntry,
    GradientsParamsRecord,
    ParamId,
    Recorder,
)
from gradvault.core.records.safetensors_file import SafetensorsHeader
from gradvault.service.streaming import TransferAborted

SHAPES = {
    "big.weight": ((40, 50), "float32"),  # 8000 bytes: two chunks of the test store's 4096
    "small.bias": ((5,), "float32"),  # packed
    "half": ((3, 7), "float16"),
    "counts": ((6,), "int64"),
    "mask": ((9,), "bool"),
    "scalar": ((), "float64"),
}


def _record(seed: int = 0) -> GradientsParamsRecord:
    rng = np.random.default_rng(seed)
    entries = []
    for i, (name, (shape, dtype)) in enumerate(SHAPES.items()):
        values = rng.standard_normal(shape) * 100
        array = (values > 0) if dtype == "bool" else values.astype(dtype)
        entries.append(GradientRecordEntry.from_array(ParamId(0x100 + i + seed * 64), name, array))
    return GradientsParamsRecord(entries, metadata={"note": "transfer test"})


@pytest.fixture
async def stored(direct_store, store_url, connection_options):
    """A snapshot, and what the recorder's restore gives for it: {param id text: array}."""
    info = await direct_store.write_snapshot(_record(), run="t", step=3)
    recorder = Recorder(store_url, **connection_options)
    try:
        restored = await recorder.restore(info.id, "cpu")
        arrays = {str(pid): restored.get(pid).numpy().copy() for pid in restored}
    finally:
        await recorder.aclose()
    return info, arrays


async def test_raw_and_npy_downloads_are_the_restored_gradients(service, stored):
    info, arrays = stored
    async with service.client() as client:
        for param_id, array in arrays.items():
            url = f"/v1/snapshots/{info.id}/grads/{param_id}"
            raw = await client.get(url)
            assert raw.status_code == 200
            assert raw.content == array.tobytes()
            assert raw.headers["x-gradvault-dtype"] == str(array.dtype)
            assert raw.headers["x-gradvault-shape"] == ",".join(map(str, array.shape))
            assert raw.headers["content-length"] == str(array.nbytes)
            npy = await client.get(url, params={"format": "npy"})
            loaded = np.load(io.BytesIO(npy.content), allow_pickle=False)
            assert loaded.dtype == array.dtype and loaded.shape == array.shape
            assert loaded.tobytes() == array.tobytes()
            assert npy.headers["etag"] != raw.headers["etag"]


async def test_etag_ranges_and_conditions(service, stored):
    info, arrays = stored
    param_id = str(ParamId(0x100))  # big.weight: 8000 bytes in two chunks
    data = arrays[param_id].tobytes()
    url = f"/v1/snapshots/{info.id}/grads/{param_id}"
    async with service.client() as client:
        whole = await client.get(url)
        etag = whole.headers["etag"]
        assert etag.startswith('"crc32c-')
        assert (await client.get(url, headers={"If-None-Match": etag})).status_code == 304
        across = await client.get(url, headers={"Range": "bytes=4000-4199"})
        assert across.status_code == 206
        assert across.headers["content-range"] == f"bytes 4000-4199/{len(data)}"
        assert across.content == data[4000:4200]
        suffix = await client.get(url, headers={"Range": "bytes=-10"})
        assert suffix.status_code == 206 and suffix.content == data[-10:]
        missed = await client.get(url, headers={"Range": f"bytes={len(data)}-"})
        assert missed.status_code == 416
        assert missed.headers["content-range"] == f"bytes */{len(data)}"
        assert missed.json()["error"] == "RangeNotSatisfiableError"
        several = await client.get(url, headers={"Range": "bytes=0-1,10-11"})
        assert several.status_code == 200 and several.content == data
        stale = await client.get(url, headers={"Range": "bytes=0-1", "If-Range": '"other"'})
        assert stale.status_code == 200 and stale.content == data
        npy = await client.get(url, params={"format": "npy"}, headers={"Range": "bytes=0-5"})
        assert npy.status_code == 206 and npy.content == b"\x93NUMPY"
        assert (await client.get(f"/v1/snapshots/{info.id}/grads/{ParamId(7)}")).status_code == 404


async def test_safetensors_download_loads_and_uploads_back_identical(service, stored):
    info, arrays = stored
    async with service.client() as client:
        response = await client.get(f"/v1/snapshots/{info.id}/safetensors")
        assert response.status_code == 200
        assert response.headers["content-length"] == str(len(response.content))
        loaded = safetensors.numpy.load(response.content)
        assert set(loaded) == set(arrays)
        for key, array in arrays.items():
            assert loaded[key].dtype == array.dtype and loaded[key].tobytes() == array.tobytes()
        header = SafetensorsHeader.parse(response.content, body_bytes=len(response.content))
        assert {t.name for t in header.tensors} == set(SHAPES)
        again = await client.post(
            "/v1/snapshots", params={"run": "again", "step": 4}, content=response.content
        )
        assert again.status_code == 201, again.text
        copy = await client.get(f"/v1/snapshots/{again.json()['id']}/safetensors")
        copied = safetensors.numpy.load(copy.content)
        assert {k: v.tobytes() for k, v in copied.items()} == {
            k: v.tobytes() for k, v in arrays.items()
        }


class TestOverHTTP:
    """zarr-python through fsspec's HTTP filesystem needs a real server."""

    @pytest.fixture
    def serving(self) -> str:
        return "uvicorn"

    async def test_zarr_python_reads_the_snapshot_by_url(self, service, stored):
        import zarr

        info, arrays = stored
        url = f"{service.base_url}/v1/zarr/snapshots/{info.id}"

        def read() -> dict[str, np.ndarray]:
            group = zarr.open_group(url, mode="r")
            manifest = group.attrs["gradvault"]
            table = manifest["gradients"]
            found = {}
            packed = group["packed"][:] if "packed" in group else None
            for i, param_id in enumerate(table["param_id"]):
                dtype, shape = np.dtype(table["dtype"][i]), tuple(table["shape"][i])
                if table["array"][i] == "packed":
                    start = table["offset"][i]
                    raw = packed[start : start + table["nbytes"][i]].tobytes()
                    found[param_id] = np.frombuffer(raw, dtype.newbyteorder("<")).reshape(shape)
                else:
                    found[param_id] = group[table["array"][i]][...]
            return found

        found = await asyncio.to_thread(read)
        assert set(found) == set(arrays)
        for key, array in arrays.items():
            assert found[key].dtype == array.dtype and found[key].tobytes() == array.tobytes()

    async def test_tensorstore_reads_own_arrays_by_url(self, service, stored):
        """A second Zarr v3 implementation, tensorstore, through its http kvstore."""
        import tensorstore

        info, arrays = stored
        base = f"{service.base_url}/v1/zarr/snapshots/{info.id}/"
        manifest = (await _get_json(base + "zarr.json"))["attributes"]["gradvault"]
        table = manifest["gradients"]
        own = [
            (param_id, array)
            for param_id, array in zip(table["param_id"], table["array"], strict=True)
            if array != "packed"
        ]
        assert own, "the stored record has no gradient in an array of its own"

        def read() -> dict[str, np.ndarray]:
            found = {}
            for param_id, array in own:
                spec = {
                    "driver": "zarr3",
                    "kvstore": {"driver": "http", "base_url": base, "path": f"{array}/"},
                }
                found[param_id] = tensorstore.open(spec, read=True).result().read().result()
            return found

        found = await asyncio.to_thread(read)
        for param_id, array in found.items():
            expected = arrays[param_id]
            assert array.dtype == expected.dtype and array.tobytes() == expected.tobytes()


async def _get_json(url: str) -> dict:
    async with httpx.AsyncClient() as client:
        response = await client.get(url)
        response.raise_for_status()
        return response.json()


def _chunk_files(store_url: str, snapshot_id: str, param_id: str) -> list[Path]:
    array = Path(store_url) / "snapshots" / snapshot_id / param_id
    return sorted(p for p in array.rglob("*") if p.is_file() and p.name != "zarr.json")


def _flip_first_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("store_kind", ["local"])
async def test_a_flipped_byte_in_a_later_chunk_breaks_the_transfer_and_is_logged(
    service, stored, store_url, caplog
):
    info, _ = stored
    param_id = str(ParamId(0x100))
    chunks = _chunk_files(store_url, info.id, param_id)
    assert len(chunks) == 2
    _flip_first_byte(chunks[1])
    caplog.set_level(logging.ERROR, logger="gradvault.service")
    async with service.client() as client:
        # over HTTP the connection drops; in process, the transport raises the app's abort
        with pytest.raises((httpx.TransportError, TransferAborted)):
            async with client.stream("GET", f"/v1/snapshots/{info.id}/grads/{param_id}") as r:
                assert r.status_code == 200  # the first chunk was good: the response started
                async for _ in r.aiter_bytes():
                    pass
    deadline = asyncio.get_running_loop().time() + 10
    while not any(param_id in m and "big.weight" in m for m in caplog.messages):
        assert asyncio.get_running_loop().time() < deadline, caplog.messages
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("store_kind", ["local"])
async def test_a_flipped_byte_in_the_first_chunk_is_a_500_error_body(service, stored, store_url):
    info, _ = stored
    param_id = str(ParamId(0x100))
    _flip_first_byte(_chunk_files(store_url, info.id, param_id)[0])
    async with service.client() as client:
        response = await client.get(f"/v1/snapshots/{info.id}/grads/{param_id}")
        assert response.status_code == 500
        assert response.json()["error"] == "ChecksumMismatchError"
        assert param_id in response.json()["detail"]
        metrics = (await client.get("/metrics")).text
    assert 'gradvault_errors_total{error="ChecksumMismatchError"} 1.0' in metrics
