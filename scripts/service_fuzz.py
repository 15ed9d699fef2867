"""Run schemathesis against a real service: every route, generated requests, every check.

    python scripts/service_fuzz.py [--max-examples N] [extra schemathesis options]

Starts ``python -m gradvault.service`` on 127.0.0.1 (a free port) over a temporary local
store holding a few snapshots (one of them sharded over two ranks), with one write token,
and runs ``schemathesis run`` on its ``/openapi.json`` with that token and ``--checks
all``. Exits with schemathesis's status:
0 when no response was a 5xx and none broke the schema it documents.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

TOKEN = "fuzz-write-token"


async def _seed(store_path: Path) -> list[str]:
    import gradvault.core as gv

    store = gv.open_store(store_path)
    try:
        ids = []
        for step in range(3):
            record = gv.GradientsParamsRecord(
                [
                    gv.GradientRecordEntry.from_array(
                        gv.ParamId(0x1000 + i), f"layer{i}.weight", np.full((4, 3), i, "f4")
                    )
                    for i in range(3)
                ]
            )
            ids.append((await store.write_snapshot(record, run="fuzz", step=step)).id)
        # and one written by two ranks, so that ?rank= and the 409 of a whole read are met
        sharded = gv.new_snapshot_id()
        for rank in range(2):
            await store.write_shard(
                record, snapshot_id=sharded, rank=rank, world_size=2, run="fuzz", step=3
            )
        ids.append(sharded)
        return ids
    finally:
        await store.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_ready(base_url: str, deadline_seconds: float = 60) -> None:
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{base_url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("the service did not become ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-examples", type=int, default=60)
    args, extra = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as folder:
        store_path = Path(folder) / "store"
        ids = asyncio.run(_seed(store_path))
        print(f"store {store_path} with snapshots {', '.join(ids)}", flush=True)
        port = _free_port()
        base_url = f"http://127.0.0.1:{port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GRADVAULT_")}
        env["GRADVAULT_TOKENS"] = f"{TOKEN}:write"
        env["GRADVAULT_MAX_UPLOAD_BYTES"] = str(1 << 20)
        env["GRADVAULT_SPOOL_DIR"] = str(Path(folder) / "spool")
        (Path(folder) / "spool").mkdir()
        service = subprocess.Popen(
            [sys.executable, "-m", "gradvault.service", "--store", str(store_path)]
            + ["--port", str(port), "--log-level", "warning"],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        try:
            _wait_ready(base_url)
            command = [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(Path(__file__).with_name("schemathesis.toml")),
                "run",
                f"{base_url}/openapi.json",
                "--header",
                f"Authorization: Bearer {TOKEN}",
                "--checks",
                "all",
                "--max-examples",
                str(args.max_examples),
                "--seed",
                "1",
                "--workers",
                "1",
                *extra,
            ]
            print("$ " + " ".join(re.sub(TOKEN, "<token>", part) for part in command), flush=True)
            status = subprocess.call(command)
        finally:
            service.terminate()
            service.wait(30)
        leftovers = list((Path(folder) / "spool").iterdir())
        if leftovers:
            print(f"spool files left behind: {leftovers}")
            return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
