"""Two service processes over one store see each other's snapshots within the index delay.

Over S3 this is the deployment of docker-compose.yml's scaled profile: replicas that share
nothing but the object store (here the test session's SeaweedFS).
"""

from __future__ import annotations

import asyncio

import httpx

from .processes import ServiceProcess
from .safetensors_bodies import good_file, good_tensors

#: far beyond the documented delay (index_refresh_seconds, 1 s by default); never waited out
DEADLINE_SECONDS = 30


async def _wait_for(client: httpx.AsyncClient, condition) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_SECONDS
    while True:
        ids = [s["id"] for s in (await client.get("/v1/snapshots")).json()["data"]]
        if condition(ids):
            return
        assert loop.time() < deadline, f"not seen within {DEADLINE_SECONDS} s: {ids}"
        await asyncio.sleep(0.05)


async def test_each_replica_sees_the_others_new_and_deleted_snapshot(store_url, connection_options):
    with (
        ServiceProcess(store_url, store_options=connection_options) as first,
        ServiceProcess(store_url, store_options=connection_options) as second,
    ):
        assert any("the service is open" in line for line in first.log)
        async with (
            httpx.AsyncClient(base_url=first.base_url, timeout=60) as a,
            httpx.AsyncClient(base_url=second.base_url, timeout=60) as b,
        ):
            assert (await b.get("/v1/snapshots")).json()["data"] == []  # b's index is built
            created = await a.post(
                "/v1/snapshots", params={"run": "r", "step": 1}, content=good_file()
            )
            assert created.status_code == 201, created.text
            snapshot = created.json()["id"]
            await _wait_for(b, lambda ids: ids == [snapshot])
            # and b serves it: the manifest and every gradient, bit for bit
            assert (await b.get(f"/v1/snapshots/{snapshot}")).json()["run"] == "r"
            for param_id, array in good_tensors()[2].items():
                served = await b.get(f"/v1/snapshots/{snapshot}/grads/{param_id}")
                assert served.status_code == 200, served.text
                assert served.content == array.tobytes()
            assert (await b.delete(f"/v1/snapshots/{snapshot}")).status_code == 204
            await _wait_for(a, lambda ids: ids == [])
