"""Push a snapshot into the compose stack and read it back through every replica.

    python deploy/check_stack.py push URL TOKEN            -> prints the snapshot id
    python deploy/check_stack.py replicas URL TOKEN ID N   -> needs N distinct replicas

``push`` pushes a small random record with the client and fetches it back bit-identical;
``replicas`` lists and restores through URL (nginx) until N distinct upstreams
(X-Gradvault-Upstream) have each listed and served snapshot ID bit-identical.
Used by deploy/check.sh; exits non-zero with a message on any difference.
"""

from __future__ import annotations

import sys

import httpx
import numpy as np

from gradvault.client import Client
from gradvault.core import GradientRecordEntry, GradientsParamsRecord, ParamId

MAX_REQUESTS = 60


def _record() -> GradientsParamsRecord:
    rng = np.random.default_rng(11)
    return GradientsParamsRecord(
        [
            GradientRecordEntry.from_array(
                ParamId(1000 + i), f"layer{i}.weight", rng.standard_normal((256, 129), "f4")
            )
            for i in range(4)
        ]
    )


def _entries(record: GradientsParamsRecord) -> list[tuple]:
    return sorted(
        (str(e.param_id), e.name, e.dtype, tuple(e.shape), e.array.tobytes())
        for e in record.entries
    )


def _same(a: GradientsParamsRecord, b: GradientsParamsRecord) -> bool:
    return _entries(a) == _entries(b)


def push(url: str, token: str) -> int:
    record = _record()
    with Client(url, token) as client:
        info = client.push(record, run="deploy-check", step=1)
        if not _same(client.fetch(info.id), record):
            print(f"snapshot {info.id} came back different", file=sys.stderr)
            return 1
    print(info.id)
    return 0


def replicas(url: str, token: str, snapshot_id: str, wanted: int) -> int:
    record = _record()
    seen: set[str] = set()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for _ in range(MAX_REQUESTS):
            response = http.get("/v1/snapshots", params={"run": "deploy-check"})
            response.raise_for_status()
            upstream = response.headers["X-Gradvault-Upstream"]
            if [s["id"] for s in response.json()["data"]] != [snapshot_id]:
                print(f"replica {upstream} lists {response.text}", file=sys.stderr)
                return 1
            seen.add(upstream)
            if len(seen) >= wanted:
                break
    if len(seen) < wanted:
        print(f"only {sorted(seen)} answered in {MAX_REQUESTS} requests", file=sys.stderr)
        return 1
    with Client(url, token) as client:
        if not _same(client.fetch(snapshot_id), record):
            print(f"snapshot {snapshot_id} came back different through {url}", file=sys.stderr)
            return 1
    replicas_seen = ", ".join(sorted(seen))
    print(f"{len(seen)} replicas list {snapshot_id}: {replicas_seen}; restored bit-identical")
    return 0


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "push":
        sys.exit(push(*args))
    sys.exit(replicas(args[0], args[1], args[2], int(args[3])))
