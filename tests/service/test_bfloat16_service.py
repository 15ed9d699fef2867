"""bf16 gradients through the service, bit for bit: raw, .npy, safetensors, upload, Zarr."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId
from gradvault.core.records.safetensors_file import record_from_safetensors
from tests.core.bf16_values import special_values

OWN = ParamId(0xBF0)  # 3 x 1000 bf16: 6000 bytes, two of the test store's 4 KiB chunks
PACKED = ParamId(0xBF1)  # packed


def _record() -> GradientsParamsRecord:
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(OWN, "w", special_values((3, 1000), seed=5)),
            GradientRecordEntry.from_array(PACKED, "b", special_values((16,))),
            GradientRecordEntry.from_array(ParamId(0xBF2), "f", np.arange(4, dtype=np.float32)),
        ]
    )


def _bits(array: np.ndarray) -> np.ndarray:
    assert array.dtype == gv.bfloat16
    return array.view(np.uint16)


@pytest.fixture
async def stored(direct_store):
    return await direct_store.write_snapshot(_record(), run="bf16", step=2)


async def test_raw_and_npy_downloads_are_bit_exact(service, stored):
    record = _record()
    async with service.client() as client:
        for param_id in (OWN, PACKED):
            expected = record[param_id].array
            url = f"/v1/snapshots/{stored.id}/grads/{param_id}"
            raw = await client.get(url)
            assert raw.status_code == 200
            assert raw.headers["x-gradvault-dtype"] == "bfloat16"
            assert raw.content == expected.tobytes()
            found = np.frombuffer(raw.content, gv.bfloat16).reshape(expected.shape)
            assert np.array_equal(_bits(found), _bits(expected))
            npy = await client.get(url, params={"format": "npy"})
            assert npy.headers["x-gradvault-dtype"] == "bfloat16"
            loaded = np.load(io.BytesIO(npy.content), allow_pickle=False)
            assert loaded.dtype == np.dtype("<u2") and loaded.shape == expected.shape
            assert np.array_equal(_bits(loaded.view(gv.bfloat16)), _bits(expected))
        part = await client.get(
            f"/v1/snapshots/{stored.id}/grads/{OWN}", headers={"Range": "bytes=4095-4100"}
        )
        assert part.status_code == 206
        assert part.content == record[OWN].array.tobytes()[4095:4101]


async def test_safetensors_download_is_bf16_and_uploads_back_bit_exact(
    service, stored, direct_store
):
    record = _record()
    async with service.client() as client:
        response = await client.get(f"/v1/snapshots/{stored.id}/safetensors")
        assert response.status_code == 200
        assert b'"dtype":"BF16"' in response.content[:4096]
        again = record_from_safetensors(response.content)
        for entry in record:
            assert again[entry.param_id].dtype == entry.dtype
            assert again[entry.param_id].array.tobytes() == entry.array.tobytes()
        upload = await client.post(
            "/v1/snapshots", params={"run": "bf16-up", "step": 3}, content=response.content
        )
        assert upload.status_code == 201, upload.text
    uploaded = await direct_store.read_snapshot(upload.json()["id"])
    for param_id in (OWN, PACKED):
        assert uploaded[param_id].dtype == "bfloat16"
        assert np.array_equal(_bits(uploaded[param_id].array), _bits(record[param_id].array))


async def test_the_safetensors_library_reads_bf16_as_torch_bfloat16(service, stored):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load  # noqa: PLC0415

    async with service.client() as client:
        body = (await client.get(f"/v1/snapshots/{stored.id}/safetensors")).content
    tensors = load(body)
    expected = _record()[OWN].array
    assert tensors[str(OWN)].dtype == torch.bfloat16
    found = tensors[str(OWN)].view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(found, _bits(expected))


class TestOverHTTP:
    """Zarr readers of the service's read-only key view need a real server."""

    @pytest.fixture
    def serving(self) -> str:
        return "uvicorn"

    async def test_zarr_python_and_tensorstore_read_bf16_by_url(self, service, stored):
        import tensorstore  # noqa: PLC0415
        import zarr  # noqa: PLC0415

        import gradvault.zarr_dtypes  # noqa: F401, PLC0415 - registers bfloat16 with zarr

        expected = _record()[OWN].array
        base = f"{service.base_url}/v1/zarr/snapshots/{stored.id}"

        def read() -> tuple[np.ndarray, np.ndarray]:
            by_zarr = zarr.open_group(base, mode="r")[str(OWN)][...]
            spec = {
                "driver": "zarr3",
                "kvstore": {"driver": "http", "base_url": base + "/", "path": f"{OWN}/"},
            }
            by_tensorstore = tensorstore.open(spec, read=True).result().read().result()
            return by_zarr, by_tensorstore

        by_zarr, by_tensorstore = await asyncio.to_thread(read)
        assert np.array_equal(_bits(by_zarr), _bits(expected))
        assert np.array_equal(_bits(by_tensorstore), _bits(expected))
