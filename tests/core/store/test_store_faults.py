"""Faults: a writer killed mid-snapshot, a full disk, two writers at once."""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import GradientsParams, ParamId, Recorder, StoreUnavailableError
from gradvault.core.autodiff.tensor import wrap

from ..conftest import S3_BUCKET, S3_CREDENTIALS
from ..snapshot_writer import seeded_grads

ROOT = Path(__file__).resolve().parents[3]


def _writer(
    url: str,
    name: str,
    count: int,
    env: dict[str, str] | None = None,
    keep_last: int | None = None,
) -> subprocess.Popen[str]:
    command = [sys.executable, "-X", "faulthandler", "-m", "tests.core.snapshot_writer"]
    kept = [] if keep_last is None else [str(keep_last)]
    process = subprocess.Popen(
        [*command, url, name, str(count), *kept],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0", **(env or {})},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.strip() == "ready", process.stderr.read() if process.stderr else line
    return process


def _bytes(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


def _next_line(process: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The writer's next line of output (a bound on the wait, not a figure under test)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout)
    assert ready, f"the writer printed nothing for {timeout} s"
    line = process.stdout.readline()
    assert line.startswith("committed "), line or process.stderr
    return line.rstrip("\n")


def test_sigkill_during_snapshots_never_shows_a_partial_one(tmp_path: Path) -> None:
    store = tmp_path / "store"
    rng = random.Random(7)
    committed: dict[str, int] = {}
    kills = 0
    for round_index in range(22):
        process = _writer(str(store), f"crash{round_index}", 0)
        time.sleep(rng.uniform(0.02, 0.35))
        process.send_signal(signal.SIGKILL)
        out, _ = process.communicate()
        assert process.returncode == -signal.SIGKILL
        kills += 1
        for line in out.splitlines():
            _, snapshot_id, seed = line.split()
            committed[snapshot_id] = int(seed)
    assert kills >= 20
    with Recorder(store) as recorder:
        listed = recorder.sync.list()
        listed_ids = {s.id for s in listed}
        # everything a writer saw committed is listed, and nothing else is
        assert set(committed) <= listed_ids
        for info in listed:
            seed = int(recorder.sync.info(info.id)["tags"]["seed"])
            assert _bytes(recorder.sync.restore(info.id)) == _bytes(seeded_grads(seed))
            # one chunk: the snapshot's node is the packed array, a chunk beside its document
            folder = store / "snapshots" / info.id
            assert sorted(p.name for p in folder.iterdir()) == ["c.0", "zarr.json"]
            assert json.loads((folder / "zarr.json").read_bytes())["node_type"] == "array"
        leftovers = recorder.sync.gc(grace_seconds=0)
        assert leftovers, "no kill landed inside a snapshot; the test proved nothing"
        assert {s.id for s in recorder.sync.list()} == listed_ids
        assert recorder.sync.gc(grace_seconds=0) == []
    staging = [p for p in store.rglob("*") if ".staging" in p.parts and p.is_file()]
    assert staging == []


def test_sigkill_while_commits_reuse_deleted_folders_never_shows_a_partial_one(
    tmp_path: Path,
) -> None:
    """Writers with retention (keep_last=1): each commit writes into the folder of the
    snapshot the last pass deleted (a spare folder), whose old document is still there
    until the new one replaces it. Killed at random points, none ever shows a snapshot
    that is not bit for bit the one it committed, and gc leaves nothing behind."""
    store = tmp_path / "store"
    rng = random.Random(11)
    last_of_round: dict[str, str] = {}  # run: the last id its writer saw committed
    reused = 0
    for round_index in range(10):
        process = _writer(str(store), f"spare{round_index}", 0, keep_last=1)
        # killed a random while after its third to eighth commit (however busy the
        # machine, so that commits into spare folders happen in every round)
        seen = [_next_line(process) for _ in range(rng.randint(3, 8))]
        time.sleep(rng.uniform(0.0, 0.03))
        process.send_signal(signal.SIGKILL)
        out, _ = process.communicate()
        assert process.returncode == -signal.SIGKILL
        lines = seen + out.splitlines()
        reused += max(0, len(lines) - 2)
        if lines:
            last_of_round[f"spare{round_index}"] = lines[-1].split()[1]
    assert reused >= 10, "too few commits into spare folders; the test proved little"
    with Recorder(store) as recorder:
        listed = recorder.sync.list()
        listed_ids = {s.id for s in listed}
        # the last snapshot a writer saw committed is listed, or a newer one of its run
        # whose retention pass deleted it before the kill
        for run, last in last_of_round.items():
            assert max(s.id for s in listed if s.run == run) >= last
        for info in listed:
            seed = int(recorder.sync.info(info.id)["tags"]["seed"])
            assert _bytes(recorder.sync.restore(info.id)) == _bytes(seeded_grads(seed))
            folder = store / "snapshots" / info.id
            assert sorted(p.name for p in folder.iterdir()) == ["c.0", "zarr.json"]
        leftovers = recorder.sync.gc(grace_seconds=0)
        # a staging folder named by its snapshot id: a kill landed inside a commit
        assert [name for name in leftovers if not name.startswith(".")], (
            f"no kill landed inside a commit ({leftovers}); the test proved nothing"
        )
        assert {s.id for s in recorder.sync.list()} == listed_ids
    assert list((store / ".staging").iterdir()) == []


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MiB tmpfs mounted for this test; skipped where mounting is not allowed."""
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_raises_commits_nothing_and_keeps_earlier_snapshots(small_disk: Path) -> None:
    rng = np.random.default_rng(0)
    small, big = GradientsParams(), GradientsParams()
    small.register(ParamId(), wrap(rng.standard_normal(1000).astype(np.float32)))
    for _ in range(4):
        big.register(ParamId(), wrap(rng.standard_normal(300_000).astype(np.float32)))
    with Recorder(small_disk / "store") as recorder:
        first = recorder.sync.snapshot(small, run="disk", step=0)
        with pytest.raises(StoreUnavailableError) as info:
            recorder.sync.snapshot(big, run="disk", step=1)
        message = str(info.value).lower()
        assert "space" in message or "full" in message, message
        assert [s.id for s in recorder.sync.list()] == [first.id]
        assert _bytes(recorder.sync.restore(first.id)) == _bytes(small)
        recorder.sync.gc(grace_seconds=0)
        # the failed snapshot left no partial files behind: a new one still fits
        again = recorder.sync.snapshot(small, run="disk", step=2)
        assert {s.id for s in recorder.sync.list()} == {first.id, again.id}


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_two_processes_snapshot_into_one_store(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    env: dict[str, str] = {}
    if kind == "local":
        url = str(tmp_path / "store")
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        url = f"s3://{S3_BUCKET}/{tmp_path.name}/two-writers"
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": S3_CREDENTIALS["access_key_id"],
            "AWS_SECRET_ACCESS_KEY": S3_CREDENTIALS["secret_access_key"],
            "AWS_REGION": S3_CREDENTIALS["region"],
        }
    writers = [_writer(url, f"writer{i}", 6, env) for i in range(2)]
    ids: list[str] = []
    for process in writers:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, f"writer exited {process.returncode}: {err}"
        ids += [line.split()[1] for line in out.splitlines()]
    assert len(ids) == 12 and len(set(ids)) == 12
    old_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with Recorder(url) as recorder:
            listed = recorder.sync.list()
            assert {s.id for s in listed} == set(ids)
            assert {s.run for s in listed} == {"writer0", "writer1"}
            for info in listed[:4]:
                seed = int(recorder.sync.info(info.id)["tags"]["seed"])
                assert _bytes(recorder.sync.restore(info.id)) == _bytes(seeded_grads(seed))
    finally:
        for key, value in old_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
