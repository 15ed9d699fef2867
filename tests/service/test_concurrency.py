"""Many transfers at once on loopback: every byte arrives intact."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import safetensors.numpy

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId

DOWNLOADS = 32
UPLOADS = 8


@pytest.fixture
def serving() -> str:
    return "uvicorn"


def _array(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((64, 1024)).astype("f4")  # 256 KiB


async def test_32_downloads_and_8_uploads_at_once(service, direct_store):
    arrays = {str(ParamId(0x200 + i)): _array(i) for i in range(4)}
    record = GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId.parse(k), f"w{k}", a) for k, a in arrays.items()]
    )
    info = await direct_store.write_snapshot(record, run="c", step=0)
    keys = list(arrays)
    bodies = [
        safetensors.numpy.save({str(ParamId(0x300 + i)): _array(100 + i)}) for i in range(UPLOADS)
    ]
    async with service.client() as client:

        async def download(i: int) -> bytes:
            response = await client.get(f"/v1/snapshots/{info.id}/grads/{keys[i % len(keys)]}")
            response.raise_for_status()
            return response.content

        async def upload(i: int) -> str:
            response = await client.post(
                "/v1/snapshots", params={"run": "up", "step": i}, content=bodies[i]
            )
            assert response.status_code == 201, response.text
            return response.json()["id"]

        results = await asyncio.gather(
            *(download(i) for i in range(DOWNLOADS)), *(upload(i) for i in range(UPLOADS))
        )
    for i, content in enumerate(results[:DOWNLOADS]):
        assert content == arrays[keys[i % len(keys)]].tobytes()
    for i, snapshot_id in enumerate(results[DOWNLOADS:]):
        stored = await direct_store.read_snapshot(snapshot_id)
        assert [e.array.tobytes() for e in stored] == [_array(100 + i).tobytes()]
