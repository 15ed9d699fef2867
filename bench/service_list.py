"""Listing snapshots over HTTP: a page of 100 from a real uvicorn on loopback.

The store (a local folder with 10,000 tiny snapshots, then S3 on a SeaweedFS server on
loopback with 1,000 unless GRADVAULT_BENCH_S3_SNAPSHOTS says more) is served by the
service in a subprocess (uvicorn, one worker, default settings: the index relists the
store every second in the background). One client on one keep-alive connection asks for
pages of 100, alternately the newest page and one deep in the listing (by cursor). The
peer is a route that returns a constant, added to the same app so that it passes through
the same middleware, measured in the same run. Targets: median < 20 ms, p99 < 100 ms.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench._timing import Row, print_rows
from tests.s3server import SeaweedFS

SNAPSHOTS = 10_000
#: Filling an S3 store with 10,000 snapshots takes many minutes on 2 cores: ``make bench``
#: lists 1,000 there unless told otherwise.
S3_SNAPSHOTS = int(os.environ.get("GRADVAULT_BENCH_S3_SNAPSHOTS", "1000"))
PAGE = 100
REQUESTS = 2_000
WARMUP = 100

_SERVER = """
import json, sys, uvicorn
from gradvault.service import Settings, create_app
app = create_app(
    Settings(store=sys.argv[1], port=int(sys.argv[2]), store_options=json.loads(sys.argv[3]))
)

@app.get("/bench/trivial")
async def trivial() -> dict[str, bool]:
    return {"ok": True}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""


async def _fill(store_path: str, count: int, options: dict) -> float:
    import gradvault.core as gv

    store = gv.open_store(store_path, **options)
    record = gv.GradientsParamsRecord(
        [gv.GradientRecordEntry.from_array(gv.ParamId(1), "w", np.zeros(4, np.float32))]
    )
    slots = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with slots:
            await store.write_snapshot(record, run=f"run{i % 10}", step=i)

    started = time.perf_counter()
    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        await store.close()
    return time.perf_counter() - started


async def _cold_and_warm_list(store_path: str, options: dict) -> tuple[float, float]:
    import gradvault.core as gv

    store = gv.open_store(store_path, **options)
    try:
        started = time.perf_counter()
        await store.list()
        cold = time.perf_counter() - started
        started = time.perf_counter()
        await store.list()
        return cold, time.perf_counter() - started
    finally:
        await store.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_ready(client: httpx.Client, deadline_seconds: float = 120) -> None:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the service did not become ready")


def _latencies(client: httpx.Client, requests: list[tuple[str, dict]]) -> list[float]:
    for path, params in requests[:WARMUP]:
        client.get(path, params=params).raise_for_status()
    found = []
    for path, params in requests[WARMUP:]:
        started = time.perf_counter()
        response = client.get(path, params=params)
        found.append(time.perf_counter() - started)
        response.raise_for_status()
    return found


def _quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _seaweedfs() -> tuple[SeaweedFS, dict]:
    """An S3 server (SeaweedFS, as the tests start it) on loopback with one bucket."""
    server = SeaweedFS(bucket="gradvault-bench", access_key_id="bench", secret_access_key="bench")
    server.start()
    options = {
        "endpoint": server.endpoint,
        "allow_http": True,
        "access_key_id": "bench",
        "secret_access_key": "bench",
        "region": "us-east-1",
    }
    return server, options


def run() -> list[Row]:
    """The listing's p50 and p99 rows, local store and S3 (SeaweedFS on loopback)."""
    rows = _run_one("local", SNAPSHOTS)
    server, options = _seaweedfs()
    try:
        rows += _run_one("S3 (SeaweedFS)", S3_SNAPSHOTS, "s3://gradvault-bench/store", options)
    finally:
        server.stop()
    return rows


def _run_one(
    kind: str, count: int, url: str | None = None, options: dict | None = None
) -> list[Row]:
    """Fill a store with ``count`` snapshots, serve it, time pages of the listing."""
    options = options or {}
    print(f"\n## service: list {count:,} snapshots ({kind}), pages of {PAGE}, uvicorn on loopback")
    with tempfile.TemporaryDirectory() as folder:
        store_path = url or str(Path(folder) / "store")
        fill_seconds = asyncio.run(_fill(store_path, count, options))
        cold, warm = asyncio.run(_cold_and_warm_list(store_path, options))
        print(
            f"filled in {fill_seconds:.1f} s; store.list(): cold {cold * 1e3:.0f} ms, "
            f"warm {warm * 1e3:.0f} ms"
        )
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, store_path, str(port), json.dumps(options)], env=env
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                _wait_ready(client)
                newest = client.get("/v1/snapshots", params={"limit": PAGE}).json()
                assert len(newest["data"]) == PAGE, "the service does not list the snapshots"
                deep = None
                for _ in range(5):  # the cursor half way down the listing
                    params = {"limit": 1000} | ({"cursor": deep} if deep else {})
                    deep = client.get("/v1/snapshots", params=params).json()["next_cursor"]
                pages = [
                    (
                        "/v1/snapshots",
                        {"limit": PAGE, "cursor": deep} if deep and i % 2 else {"limit": PAGE},
                    )
                    for i in range(REQUESTS + WARMUP)
                ]
                trivial = [("/bench/trivial", {})] * (REQUESTS + WARMUP)
                ours = _latencies(client, pages)
                peer = _latencies(client, trivial)
        finally:
            server.terminate()
            server.wait(30)
    ours_median, ours_p99 = _quantiles(ours)
    peer_median, peer_p99 = _quantiles(peer)
    figure = f"list a page of {PAGE} of {count:,} snapshots, HTTP, {kind} store"
    rows = [
        Row(
            f"{figure}, p50",
            [ours_median],
            "trivial route",
            [peer_median],
            "< 20 ms",
            absolute=0.020,
        ),
        Row(f"{figure}, p99", [ours_p99], "trivial route", [peer_p99], "< 100 ms", absolute=0.100),
    ]
    print_rows(f"Service: listing {count:,} snapshots, {kind}", rows)
    return rows


if __name__ == "__main__":
    run()
