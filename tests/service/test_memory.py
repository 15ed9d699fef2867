"""Downloads are streamed: serving a 1 GiB gradient barely grows the service's memory."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest

from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId, open_store

from .processes import ServiceProcess

GRADIENT_BYTES = 1 << 30
GROWTH_LIMIT = 64 << 20


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
