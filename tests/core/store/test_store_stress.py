"""A bounded stress run: four writer processes, with gc (grace 0), delete and retention at once.

Afterwards every snapshot that any call reported as committed is either listed and reads
back bit-identical, or was deleted by an explicit call (a delete or a retention pass,
which report what they deleted). Nothing else is listed, and gc leaves no leftovers.
The run is bounded by counts (snapshots per writer), not by time; set
GRADVAULT_STRESS_SNAPSHOTS to run longer (about 500 gives a minute per store).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from gradvault.core import ParamId
from gradvault.core.errors import SnapshotNotFoundError
from gradvault.core.store import GC_MARKER_NAME, SnapshotStore, open_store

from ..conftest import S3_BUCKET, S3_CREDENTIALS
from ..snapshot_writer import seeded_grads
from ..store_churn import SHAPES as CHURN_SHAPES

ROOT = Path(__file__).resolve().parents[3]
WRITERS = 4
SNAPSHOTS_PER_WRITER = int(os.environ.get("GRADVAULT_STRESS_SNAPSHOTS", "16"))

pytestmark = pytest.mark.stress


def _start_writer(url: str, name: str, env: dict[str, str], logs: Path) -> subprocess.Popen[str]:
    # stderr to a file: warnings must not fill a pipe that is read only at the end
    with open(logs / f"{name}.stderr", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.core.store_churn", url, name, str(SNAPSHOTS_PER_WRITER)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, **env},
        )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "ready", (logs / f"{name}.stderr").read_text() or line
    return process


def _record_bytes(record) -> dict[ParamId, bytes]:
    return {entry.param_id: entry.array.tobytes() for entry in record}


def _grads_bytes(seed: int) -> dict[ParamId, bytes]:
    grads = seeded_grads(seed, CHURN_SHAPES)
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


async def _churn(store: SnapshotStore, writers: list[subprocess.Popen[str]]) -> set[str]:
    """gc in one loop, deletes and retention in another, until the writers finish.

    Returns the ids that the deletes and retention passes reported deleted.
    """
    rng = random.Random(7)
    deleted: set[str] = set()

    def writing() -> bool:
        return any(process.poll() is None for process in writers)

    async def collect() -> None:
        while writing():
            await store.gc(grace_seconds=0)
            await asyncio.sleep(0.01)

    async def delete_and_expire() -> None:
        while writing():
            listed = await store.list()
            newest = {}  # of each run: never deleted here, so every run keeps one to check
            for info in listed:
                newest.setdefault(info.run, info.id)
            candidates = [info.id for info in listed if info.id not in newest.values()]
            if candidates and rng.random() < 0.2:
                victim = rng.choice(candidates)
                try:
                    await store.delete(victim)
                except SnapshotNotFoundError:
                    pass  # gone already: retention or another delete got there first
                else:
                    deleted.add(victim)
            run = f"writer{rng.randrange(WRITERS)}"
            deleted.update(await store.apply_retention(keep_last=4, run=run))
            await asyncio.sleep(0.02)

    await asyncio.gather(collect(), delete_and_expire())
    return deleted


@pytest.mark.parametrize("kind", ["local", "s3"])
async def test_writers_gc_delete_and_retention_at_once_lose_nothing_reported(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env: dict[str, str] = {}
    options: dict[str, object] = {}
    if kind == "local":
        url = str(tmp_path / "store")
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        url = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/stress"
        options = {"endpoint": endpoint, "allow_http": True, **S3_CREDENTIALS}
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": S3_CREDENTIALS["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": S3_CREDENTIALS["secret_access_key"],
            "AWS_REGION": S3_CREDENTIALS["region"],
        }
    writers = [_start_writer(url, f"writer{i}", env, tmp_path) for i in range(WRITERS)]
    async with open_store(url, **options) as store:
        try:
            deleted = await _churn(store, writers)
        finally:
            for process in writers:
                if process.poll() is None:
                    process.kill()
        committed: dict[str, int] = {}
        failures: list[str] = []
        for index, process in enumerate(writers):
            out, _ = process.communicate()
            assert process.returncode == 0, (tmp_path / f"writer{index}.stderr").read_text()
            for line in out.splitlines():
                kind_of_line, _, rest = line.partition(" ")
                if kind_of_line == "committed":
                    snapshot_id, seed = rest.split()
                    committed[snapshot_id] = int(seed)
                elif kind_of_line == "retained-deleted":
                    deleted.add(rest)
                else:
                    failures.append(line)
        # a write gc took fails clearly, and nothing else fails
        for failure in failures:
            assert failure.startswith("failed StoreUnavailableError "), failure
            assert "collected by gc before commit" in failure, failure
        assert committed, failures
        print(f"{len(committed)} committed, {len(deleted)} deleted, {len(failures)} taken by gc")

        await store.gc(grace_seconds=0)
    async with open_store(url, **options) as fresh:
        listed = {info.id for info in await fresh.list()}
        assert listed <= set(committed)  # a failed write is never visible
        survivors = set(committed) - deleted
        assert survivors
        assert survivors <= listed, "snapshots reported committed and never deleted are gone"
        for snapshot_id in sorted(survivors):
            record = await fresh.read_snapshot(snapshot_id)
            assert _record_bytes(record) == _grads_bytes(committed[snapshot_id]), snapshot_id
        if kind == "local":
            assert os.listdir(Path(url) / ".staging") == []
        else:
            prefix = url.removeprefix(f"s3://{S3_BUCKET}/") + "/snapshots/"
            listing = request.getfixturevalue("boto3_s3").get_paginator("list_objects_v2")
            for page in listing.paginate(Bucket=S3_BUCKET, Prefix=prefix):
                for item in page.get("Contents", []):
                    snapshot_id, _, key = item["Key"].removeprefix(prefix).partition("/")
                    if not key:
                        continue  # the snapshots group's own zarr.json
                    # everything else of a collected write is gone; its marker may stay
                    assert snapshot_id in listed or key == GC_MARKER_NAME, item
            _empty_prefix(request.getfixturevalue("boto3_s3"), url)


def _empty_prefix(boto3_s3, url: str) -> None:
    """Remove the run's objects: the S3 server is shared by the session, and what this run
    leaves would hold its disk until the session ends."""
    root = url.removeprefix(f"s3://{S3_BUCKET}/").rpartition("/")[0] + "/"
    for page in boto3_s3.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=root):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            boto3_s3.delete_objects(Bucket=S3_BUCKET, Delete={"Objects": keys})
