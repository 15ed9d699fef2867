"""``make load``: a bounded load test of one uvicorn on loopback.

32 concurrent clients (``gradvault.client.AsyncClient``) each push a 64 MiB snapshot
(16 gradients of 4 MiB), restore a snapshot someone pushed (every byte verified by the
client against the manifest), and delete their own previous push (so the store stays
bounded), for 2 minutes. Reported: operations and bytes per second, p50/p99 latency per
operation, errors, and the service's resident memory before the load and at its peak
(sampled from /proc every 0.2 s: the total, and its anonymous and file-backed
parts; uploads are spooled to files that the service maps). Targets: zero errors, peak
RSS growth < 200 MiB.
``GRADVAULT_LOAD_SECONDS`` and ``GRADVAULT_LOAD_CLIENTS`` change the length and width.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from bench.service_list import _free_port, _wait_ready

CLIENTS = int(os.environ.get("GRADVAULT_LOAD_CLIENTS", "32"))
SECONDS = float(os.environ.get("GRADVAULT_LOAD_SECONDS", "120"))
PARAMS, PARAM_BYTES = 16, 4 << 20
SNAPSHOT_BYTES = PARAMS * PARAM_BYTES
GROWTH_LIMIT = 200 << 20

_SERVER = """
import sys, uvicorn
from gradvault.service import Settings, create_app
app = create_app(Settings(store=sys.argv[1], port=int(sys.argv[2])))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", access_log=False)
"""


def _memory(pid: int) -> dict[str, int]:
    """Resident memory of process ``pid`` in bytes: total, anonymous, file-backed."""
    found = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in found:
                found[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


class _PeakMemory(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for key, value in _memory(self.pid).items():
                self.peak[key] = max(self.peak[key], value)


def _record(seed: int):  # noqa: ANN202 - a GradientsParamsRecord
    import gradvault.core as gv

    rng = np.random.default_rng(seed)
    return gv.GradientsParamsRecord(
        [
            gv.GradientRecordEntry.from_array(
                gv.ParamId(), f"layer{i}.weight", rng.standard_normal(PARAM_BYTES // 4, np.float32)
            )
            for i in range(PARAMS)
        ]
    )


async def _load(base_url: str) -> dict:
    from gradvault.client import AsyncClient

    records = [_record(seed) for seed in range(4)]
    latencies: dict[str, list[float]] = {"push": [], "restore": [], "delete": []}
    errors: list[str] = []
    pushed: list[str] = []
    async with AsyncClient(base_url, timeout=300) as seeder:
        for i in range(4):
            pushed.append((await seeder.push(records[i], run="load-seed", step=i)).id)
    seeds = list(pushed)
    deadline = time.monotonic() + SECONDS

    async def client(number: int) -> None:
        previous: str | None = None
        step = 0
        async with AsyncClient(base_url, timeout=300) as api:
            while time.monotonic() < deadline:
                for operation in ("push", "restore", "delete"):
                    started = time.perf_counter()
                    try:
                        if operation == "push":
                            summary = await api.push(
                                records[number % 4], run=f"load-{number}", step=step
                            )
                            step += 1
                            pushed.append(summary.id)
                            mine, previous = previous, summary.id
                        elif operation == "restore":
                            restored = await api.fetch(random.choice(seeds))
                            assert len(restored) == PARAMS
                        elif mine is not None:
                            await api.delete(mine)
                        else:
                            continue
                    except Exception as error:  # noqa: BLE001 - counted and reported
                        errors.append(f"{operation}: {type(error).__name__}: {error}")
                        continue
                    latencies[operation].append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    return {"seconds": time.perf_counter() - started, "latencies": latencies, "errors": errors}


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def main() -> int:
    """Run the load; print the report; exit status 1 if a target is missed."""
    with tempfile.TemporaryDirectory(prefix="gv-load-") as folder:
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
        server = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(Path(folder) / "store"), str(port)], env=env
        )
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as probe:
                _wait_ready(probe)
            before = _memory(server.pid)
            watcher = _PeakMemory(server.pid)
            watcher.start()
            result = asyncio.run(_load(f"http://127.0.0.1:{port}"))
            watcher.stop.set()
            watcher.join()
        finally:
            server.terminate()
            server.wait(30)
    seconds = result["seconds"]
    latencies = result["latencies"]
    errors = result["errors"]
    moved = (len(latencies["push"]) + len(latencies["restore"])) * SNAPSHOT_BYTES
    growth = watcher.peak["VmRSS"] - before["VmRSS"]
    print(
        f"# load: {CLIENTS} clients, {seconds:.0f} s, snapshots of {SNAPSHOT_BYTES >> 20} MiB "
        f"({PARAMS} x {PARAM_BYTES >> 20} MiB), one uvicorn on loopback"
    )
    print(f"{'operation':10s} {'count':>7s} {'per s':>7s} {'p50':>9s} {'p99':>9s}")
    for name, values in latencies.items():
        print(
            f"{name:10s} {len(values):7d} {len(values) / seconds:7.2f} "
            f"{_quantile(values, 0.5):8.2f}s {_quantile(values, 0.99):8.2f}s"
        )
    print(f"throughput: {moved / seconds / 1e6:.1f} MB/s pushed + restored")
    print(f"errors: {len(errors)}" + "".join(f"\n  {e}" for e in errors[:10]))
    for key, what in (("VmRSS", "RSS"), ("RssAnon", "anonymous"), ("RssFile", "file-backed")):
        print(
            f"service {what}: {before[key] / 2**20:.0f} MiB before, peak "
            f"{watcher.peak[key] / 2**20:.0f} MiB, growth "
            f"{(watcher.peak[key] - before[key]) / 2**20:.0f} MiB"
        )
    print(f"target: RSS growth < {GROWTH_LIMIT >> 20} MiB")
    met = not errors and growth < GROWTH_LIMIT
    print(f"targets (zero errors, growth < {GROWTH_LIMIT >> 20} MiB): {'met' if met else 'MISSED'}")
    if latencies["push"]:
        print(f"median push: {statistics.median(latencies['push']):.2f} s")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
