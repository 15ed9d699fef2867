"""The service's memory does not grow with what it moves: serving a 1 GiB gradient, or
committing a 256 MiB upload, barely grows its peak resident set."""

from __future__ import annotations

import os

import google_crc32c
import httpx
import numpy as np
import pytest

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId, open_store
from gradvault.core.records.safetensors_file import record_header, safetensors_chunks

from .processes import ServiceProcess

GRADIENT_BYTES = 1 << 30
GROWTH_LIMIT = 64 << 20
UPLOAD_BYTES = 256 << 20
UPLOAD_GROWTH_LIMIT = 96 << 20


def _peak_rss(pid: int) -> int:
    """The process's peak resident set (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
async def test_serving_a_1_gib_gradient_grows_peak_rss_by_under_64_mib(tmp_path):
    store_path = tmp_path / "store"
    param_id = ParamId(0xBEEF)
    store = open_store(store_path)  # the default chunks, 32 MiB
    try:
        gradient = np.full(GRADIENT_BYTES // 4, 0.5, dtype="f4")
        record = GradientsParamsRecord([GradientRecordEntry.from_array(param_id, "huge", gradient)])
        info = await store.write_snapshot(record, run="big", step=0)
        del record, gradient
    finally:
        await store.close()
    url = f"/v1/snapshots/{info.id}/grads/{param_id}"
    with ServiceProcess(str(store_path)) as service:
        async with httpx.AsyncClient(base_url=service.base_url, timeout=120) as client:
            # warm up every code path the download takes, then take the baseline
            assert (await client.get(url, headers={"Range": "bytes=0-1023"})).status_code == 206
            before = _peak_rss(service.pid)
            received = 0
            async with client.stream("GET", url) as response:
                assert response.status_code == 200
                async for piece in response.aiter_raw():
                    received += len(piece)
            after = _peak_rss(service.pid)
    assert received == GRADIENT_BYTES
    assert after - before < GROWTH_LIMIT, f"peak RSS grew by {(after - before) >> 20} MiB"


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
async def test_committing_a_256_mib_upload_grows_peak_rss_by_under_96_mib(tmp_path):
    """The upload is spooled to a file and committed from a mapping of it; the commit lets
    each chunk's pages go once written (before: every page of the file stayed resident,
    256 MiB, until the commit ended)."""
    rng = np.random.default_rng(7)
    gradient = rng.standard_normal(UPLOAD_BYTES // 4).astype(np.float32)  # 8 chunks of 32 MiB
    record = GradientsParamsRecord([GradientRecordEntry.from_array(ParamId(7), "big", gradient)])
    small = GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(8), "warm-up", gradient[: 1 << 20])]
    )

    async def body(upload: GradientsParamsRecord):  # noqa: ANN202 - an iterator of bytes
        for piece in safetensors_chunks(upload):
            yield bytes(piece)

    with ServiceProcess(str(tmp_path / "store")) as service:
        async with httpx.AsyncClient(base_url=service.base_url, timeout=300) as client:
            # warm up every code path an upload takes, then take the baseline
            warm = await client.post(
                "/v1/snapshots", params={"run": "warm", "step": 0}, content=body(small)
            )
            assert warm.status_code == 201, warm.text
            before = _peak_rss(service.pid)
            response = await client.post(
                "/v1/snapshots",
                params={"run": "big", "step": 1},
                content=body(record),
                headers={"Content-Length": str(len(record_header(record)) + UPLOAD_BYTES)},
            )
            after = _peak_rss(service.pid)
            assert response.status_code == 201, response.text
            manifest = (await client.get(f"/v1/snapshots/{response.json()['id']}")).json()
    assert manifest["nbytes"] == UPLOAD_BYTES
    (checksum,) = [g["checksum"] for g in manifest["gradients"]]
    assert checksum == f"crc32c:{google_crc32c.value(bytes(gradient)):08x}"
    assert after - before < UPLOAD_GROWTH_LIMIT, f"peak RSS grew by {(after - before) >> 20} MiB"
