"""Sharded snapshots: ranks in separate processes write one snapshot id, on both stores.

The multi-process tests run real ranks (``tests/core/shard_writer.py``), one process each,
against a local folder and the SeaweedFS S3 server; one of them kills a rank mid-write.
The others check, in process, what a rank may not do and how a sharded snapshot reads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import SnapshotStore, new_snapshot_id, open_store
from tests.core.os_probes import record_fsyncs_and_renames
from tests.core.shard_writer import RUN, STEP, rank_record

ROOT = Path(__file__).resolve().parents[3]
WORLD = 4
#: chunk 4 x 1024 float32 / 4 KiB = 4 chunks per array: chunk 5 is the second array's first
STALL_AT_CHUNK = 5


def _environment(store_url: str, options: dict[str, object]) -> dict[str, str]:
    """The ranks' environment: the S3 settings a Recorder reads from ``AWS_*``."""
    env = dict(os.environ)
    if store_url.startswith("s3://"):
        env.update(
            AWS_ENDPOINT_URL=str(options["endpoint"]),
            AWS_ACCESS_KEY_ID=str(options["access_key_id"]),
            AWS_SECRET_ACCESS_KEY=str(options["secret_access_key"]),
            AWS_REGION=str(options["region"]),
            AWS_ALLOW_HTTP="true",
        )
    return env


def _start_rank(
    store_url: str, env: dict[str, str], snapshot_id: str, rank: int, *extra: str
) -> subprocess.Popen[str]:
    command = [sys.executable, "-X", "faulthandler", "-m", "tests.core.shard_writer"]
    command += [store_url, snapshot_id]
    return subprocess.Popen(
        [*command, str(rank), str(WORLD), *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen[str]) -> dict[str, object]:
    out, err = process.communicate(timeout=180)
    assert process.returncode == 0, f"rank exited {process.returncode}: {err}"
    return json.loads(out.strip().splitlines()[-1])


def _merged(records: list[GradientsParamsRecord]) -> GradientsParamsRecord:
    return GradientsParamsRecord([entry for record in records for entry in record.entries])


def _objects_under(
    store_url: str, boto3_client: Callable[[], object], snapshot_id: str
) -> list[str]:
    """Every file or object the store holds for ``snapshot_id``, committed or not."""
    if store_url.startswith("s3://"):
        bucket, _, prefix = store_url.removeprefix("s3://").partition("/")
        pages = boto3_client().get_paginator("list_objects_v2")  # type: ignore[attr-defined]
        return [
            item["Key"]
            for page in pages.paginate(Bucket=bucket, Prefix=f"{prefix}/snapshots/{snapshot_id}")
            for item in page.get("Contents", [])
        ]
    root = Path(store_url)
    found = []
    for top in (root / "snapshots", root / ".staging"):
        for folder, _, files in os.walk(top):
            found.extend(
                os.path.join(folder, name)
                for name in files
                if snapshot_id in os.path.relpath(os.path.join(folder, name), top)
            )
    return found


@pytest.fixture
def boto3_client(store_kind: str, request: pytest.FixtureRequest) -> Callable[[], object]:
    """A boto3 client of the S3 server, made only for S3 stores."""
    return lambda: request.getfixturevalue("boto3_s3")


async def test_four_rank_processes_write_one_snapshot(
    store_url: str, connection_options: dict[str, object]
) -> None:
    env = _environment(store_url, connection_options)
    snapshot_id = gv.new_snapshot_id()  # rank 0 draws it; the trainer hands it to every rank
    ranks = [_start_rank(store_url, env, snapshot_id, rank) for rank in range(WORLD)]
    written = [_finish(process) for process in ranks]

    assert [shard["rank"] for shard in written] == list(range(WORLD))
    assert any(shard["committed"] for shard in written)  # the last to finish committed it
    expected = [rank_record(rank) for rank in range(WORLD)]
    assert [shard["nbytes"] for shard in written] == [record.nbytes for record in expected]
    store = open_store(store_url, **connection_options)
    try:
        (info,) = await store.list()
        assert (info.id, info.run, info.step, info.world_size) == (snapshot_id, RUN, STEP, WORLD)
        assert info.nbytes == sum(record.nbytes for record in expected)
        assert info.num_params == sum(len(record) for record in expected)
        manifest = await store.info(snapshot_id)
        assert manifest["world_size"] == WORLD
        assert manifest["shards"]["nbytes"] == [record.nbytes for record in expected]
        for rank in range(WORLD):
            shard = await store.read_snapshot(snapshot_id, rank=rank)
            assert shard == expected[rank]  # ids, names, dtypes, shapes and bytes, in order
            assert shard.metadata["snapshot"]["rank"] == rank
            assert (await store.info(snapshot_id, rank=rank))["shard"] == {
                "rank": rank,
                "world_size": WORLD,
            }
        whole = await store.read_snapshot(snapshot_id)
        assert whole == _merged(expected)
        assert whole.metadata["snapshot"]["world_size"] == WORLD
    finally:
        await store.close()
    async with gv.Recorder(store_url, **connection_options) as recorder:
        restored = await recorder.restore(snapshot_id, rank=2)
        assert restored.try_to_record() == expected[2]


async def test_a_rank_killed_mid_write_commits_nothing_and_gc_removes_what_it_left(
    store_url: str,
    connection_options: dict[str, object],
    boto3_client: Callable[[], object],
) -> None:
    env = _environment(store_url, connection_options)
    snapshot_id = gv.new_snapshot_id()
    doomed = _start_rank(store_url, env, snapshot_id, WORLD - 1, str(STALL_AT_CHUNK))
    try:
        assert doomed.stdout is not None
        assert doomed.stdout.readline().strip() == "stalled", doomed.stderr.read()  # type: ignore[union-attr]
        others = [_start_rank(store_url, env, snapshot_id, rank) for rank in range(WORLD - 1)]
        written = [_finish(process) for process in others]
    finally:
        doomed.send_signal(signal.SIGKILL)
        doomed.communicate(timeout=60)
    assert doomed.returncode == -signal.SIGKILL
    assert not any(shard["committed"] for shard in written)
    left = _objects_under(store_url, boto3_client, snapshot_id)
    # the three published shards and the killed rank's first array are there, uncommitted
    assert any("ranks/2/" in key or "/ranks/2" in key for key in left)
    assert any("rank3" in key or "ranks/3/" in key for key in left)

    store = open_store(store_url, **connection_options)
    try:
        assert await store.list() == []
        with pytest.raises(gv.SnapshotNotFoundError):
            await store.info(snapshot_id)
        with pytest.raises(gv.SnapshotNotFoundError):
            await store.read_snapshot(snapshot_id, rank=0)
        with pytest.raises(gv.SnapshotNotFoundError):
            await store.read_snapshot(snapshot_id)
        removed = await store.gc(grace_seconds=0)
        assert removed and all(name.startswith(snapshot_id) for name in removed)
        remaining = _objects_under(store_url, boto3_client, snapshot_id)
        # on S3 only gc's own marker stays (docs/FORMAT.md), until a later gc finds it old
        assert [key.rpartition("/")[2] for key in remaining] in ([], ["gc-collected"])
        assert await store.list() == []
        with pytest.raises(gv.SnapshotNotFoundError):
            await store.info(snapshot_id)
    finally:
        await store.close()


# --- in process: what ranks may not do ------------------------------------------------


def _record(rank: int, count: int = 3, shared: bool = False) -> GradientsParamsRecord:
    """Small gradients (packed and own arrays); ``shared`` ids are the same on every rank."""
    rng = np.random.default_rng(rank)
    entries = []
    for index in range(count):
        array = rng.standard_normal(100 + 300 * index).astype(np.float32)
        pid = gv.ParamId(index + 1 if shared else 1000 * (rank + 1) + index)
        entries.append(GradientRecordEntry.from_array(pid, f"layer{index}", array))
    return GradientsParamsRecord(entries)


async def _write(store: SnapshotStore, snapshot_id: str, rank: int, **overrides: object):
    arguments: dict[str, object] = {
        "snapshot_id": snapshot_id,
        "rank": rank,
        "world_size": 2,
        "run": "r",
        "step": 1,
        "tags": {"lr": "0.1"},
    }
    arguments.update(overrides)
    record = arguments.pop("record", None) or _record(0 if rank is True else max(rank, 0))
    return await store.write_shard(record, **arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rank", "world_size", "message"),
    [
        (2, 2, "rank must be an int in 0..1"),
        (-1, 2, "rank must be an int in 0..1"),
        (True, 2, "rank must be an int"),
        (0, 0, "world_size must be an int >= 1"),
        (0, 2.0, "world_size must be an int >= 1"),
    ],
)
async def test_a_rank_outside_the_world_is_refused_before_any_io(
    tmp_path: Path, rank: object, world_size: object, message: str
) -> None:
    store = open_store(tmp_path / "store")
    with pytest.raises(gv.InvalidArgumentError, match=message):
        await _write(store, new_snapshot_id(), rank, world_size=world_size)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()
    with gv.Recorder(tmp_path / "store") as recorder, pytest.raises(gv.InvalidArgumentError):
        recorder.sync.snapshot_shard(
            _record(0),
            snapshot_id=new_snapshot_id(),
            rank=rank,
            world_size=world_size,
            run="r",
            step=0,
        )  # type: ignore[arg-type]
    with gv.Recorder(tmp_path / "store") as recorder, pytest.raises(gv.InvalidSnapshotIdError):
        recorder.sync.snapshot_shard(
            _record(0), snapshot_id="../x", rank=0, world_size=1, run="r", step=0
        )


async def test_ranks_that_disagree_commit_nothing_and_say_why(store: SnapshotStore) -> None:
    snapshot_id = new_snapshot_id()
    first = await _write(store, snapshot_id, 0)
    assert (first.committed, first.snapshot) == (False, None)
    with pytest.raises(gv.InvalidArgumentError, match="rank 0 has written its shard already"):
        await _write(store, snapshot_id, 0)
    with pytest.raises(
        gv.InvalidArgumentError, match="declares world_size 2; rank 1 declares world_size 3"
    ):
        await _write(store, snapshot_id, 1, world_size=3)
    with pytest.raises(gv.InvalidFieldError, match="has step 1; rank 1 writes step 2"):
        await _write(store, snapshot_id, 1, step=2)
    with pytest.raises(gv.InvalidFieldError, match="has run 'r'; rank 1 writes run 'other'"):
        await _write(store, snapshot_id, 1, run="other")
    with pytest.raises(gv.InvalidFieldError, match="has tags"):
        await _write(store, snapshot_id, 1, tags={})
    assert await store.list() == []  # none of those published a shard, nor committed
    last = await _write(store, snapshot_id, 1)
    assert last.committed and last.snapshot is not None
    assert last.snapshot.world_size == 2
    assert [info.id for info in await store.list()] == [snapshot_id]
    with pytest.raises(gv.InvalidArgumentError, match="is committed already"):
        await _write(store, snapshot_id, 0)
    assert await store.read_snapshot(snapshot_id, rank=0) == _record(0)


async def test_a_world_of_one_commits_at_once(store: SnapshotStore) -> None:
    snapshot_id = new_snapshot_id()
    shard = await _write(store, snapshot_id, 0, world_size=1)
    assert shard.committed and shard.snapshot == (await store.list())[0]
    assert await store.read_snapshot(snapshot_id) == _record(0)


async def test_replicas_with_the_same_param_ids_read_one_rank_at_a_time(
    store: SnapshotStore,
) -> None:
    snapshot_id = new_snapshot_id()
    for rank in range(2):
        await _write(store, snapshot_id, rank, record=_record(rank, shared=True))
    first, pid = (entry.param_id for entry in _record(0, shared=True).entries[::2])
    with pytest.raises(gv.ShardedSnapshotError, match=f"param {first} is in .* ranks 0 and 1"):
        await store.read_snapshot(snapshot_id)
    for rank in range(2):
        assert await store.read_snapshot(snapshot_id, rank=rank) == _record(rank, shared=True)
        entry = await store.read_gradient(snapshot_id, pid, rank=rank)
        assert entry.data == _record(rank, shared=True)[pid].data
        length, pieces = await store.iter_safetensors(snapshot_id, rank=rank)
        assert sum([len(piece) async for piece in pieces]) == length
    with pytest.raises(gv.ShardedSnapshotError, match="pass rank="):
        await store.read_gradient(snapshot_id, pid)
    with pytest.raises(gv.ShardedSnapshotError, match="pass rank="):
        await store.iter_safetensors(snapshot_id)
    with pytest.raises(gv.InvalidArgumentError, match="has ranks 0..1"):
        await store.read_snapshot(snapshot_id, rank=2)
    whole = await store.write_snapshot(_record(0), run="r", step=2)
    with pytest.raises(gv.InvalidArgumentError, match="is not sharded"):
        await store.read_snapshot(whole.id, rank=0)


async def test_the_zarr_view_serves_each_shard_as_a_snapshot(store: SnapshotStore) -> None:
    snapshot_id = new_snapshot_id()
    for rank in range(2):
        await _write(store, snapshot_id, rank)
    top = json.loads(bytes(await store.read_key(f"snapshots/{snapshot_id}/zarr.json")))
    assert top["attributes"]["gradvault"]["world_size"] == 2
    ranks = json.loads(bytes(await store.read_key(f"snapshots/{snapshot_id}/ranks/zarr.json")))
    assert ranks["node_type"] == "group"
    shard = json.loads(bytes(await store.read_key(f"snapshots/{snapshot_id}/ranks/1/zarr.json")))
    table = shard["attributes"]["gradvault"]["gradients"]
    own = [name for name in table["array"] if name != "packed"][0]
    position = table["array"].index(own)
    chunk = await store.read_key(f"snapshots/{snapshot_id}/ranks/1/{own}/c.0")
    assert bytes(chunk[:-4])[:400] == _record(1).entries[position].data[:400]
    for missing in ("ranks/2/zarr.json", "ranks/x/zarr.json", "packed/zarr.json"):
        with pytest.raises(gv.StoreKeyNotFoundError):
            await store.read_key(f"snapshots/{snapshot_id}/{missing}")


async def test_delete_and_retention_take_every_shard(
    store_url: str, store: SnapshotStore, boto3_client: Callable[[], object]
) -> None:
    older = new_snapshot_id()
    for rank in range(2):
        await _write(store, older, rank)
    newer = (await store.write_snapshot(_record(0), run="r", step=2)).id
    assert await store.apply_retention(keep_last=1) == [older]
    assert [info.id for info in await store.list()] == [newer]
    assert _objects_under(store_url, boto3_client, older) == []
    sharded = new_snapshot_id()
    for rank in range(2):
        await _write(store, sharded, rank)
    await store.delete(sharded)
    assert _objects_under(store_url, boto3_client, sharded) == []
    with pytest.raises(gv.SnapshotNotFoundError):
        await store.info(sharded)


async def test_a_shard_manifest_or_the_snapshot_manifest_edited_in_place_is_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    snapshot_id = new_snapshot_id()
    async with open_store(root) as store:
        for rank in range(2):
            await _write(store, snapshot_id, rank)
    folder = root / "snapshots" / snapshot_id
    for document in (folder / "zarr.json", folder / "ranks" / "1" / "zarr.json"):
        manifest = json.loads(document.read_text())["attributes"]["gradvault"]
        assert manifest["format_version"] == 4 and manifest["manifest_checksum"].startswith(
            "crc32c:"
        )
    shard = folder / "ranks" / "1" / "zarr.json"
    raw = shard.read_bytes()
    shard.write_bytes(raw.replace(b'"layer2"', b'"layerX"', 1))  # a name, same byte count
    async with open_store(root) as store:
        assert (await store.read_snapshot(snapshot_id, rank=0)) == _record(0)
        with pytest.raises(gv.ManifestError, match=f"{snapshot_id}.*rank 1.*checksum"):
            await store.read_snapshot(snapshot_id, rank=1)
    top = folder / "zarr.json"
    top.write_bytes(top.read_bytes().replace(b'"step":1', b'"step":9', 1))
    async with open_store(root) as store:
        with pytest.raises(gv.ManifestError, match=f"{snapshot_id}.*checksum"):
            await store.info(snapshot_id)
        assert await store.list() == []


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_every_rename_out_of_staging_is_made_durable_in_both_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rank's shard moves from its private folder in .staging/ to the set's ranks/, and
    the set from .staging/ to snapshots/: after each rename, the folder the name went to
    and .staging/, where it was, are fsynced before the write returns. On a file system
    that does not journal its folders, a stale name in .staging/ for a committed folder
    would be emptied by gc as an abandoned write."""
    root = tmp_path.resolve() / "store"
    store = open_store(root)
    await store.write_snapshot(_record(0), run="r", step=0)  # the store's own folders exist
    snapshot_id = new_snapshot_id()
    staging, committed = str(root / ".staging"), str(root / "snapshots" / snapshot_id)
    for rank in range(2):
        events = record_fsyncs_and_renames(monkeypatch)
        written = await _write(store, snapshot_id, rank)
        monkeypatch.undo()
        renames = [i for i, (kind, path) in enumerate(events) if kind == "rename"]
        placed = next(i for i in renames if f"{snapshot_id}.rank{rank}-" in events[i][1])
        ranks = os.path.join(staging, snapshot_id, "ranks")
        for folder in (ranks, staging):
            assert ("fsync", folder) in events[placed + 1 :], folder
        if rank == 1:  # the last rank commits the set
            assert written.committed
            moved = events.index(("rename", os.path.join(staging, snapshot_id)))
            assert events[moved + 1 :] == [
                ("fsync", str(root / "snapshots")),
                ("fsync", staging),
            ]
    assert os.path.isdir(committed)
    assert await store.read_snapshot(snapshot_id, rank=1) == _record(1)
    await store.close()


@pytest.mark.parametrize("folder", ["snapshot", "rank"])
async def test_gc_leaves_a_staging_name_that_is_another_name_of_a_committed_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, folder: str
) -> None:
    """A power cut on a file system that does not journal its folders can leave a
    committed folder (a snapshot's, or one rank's shard in it) with its old name in
    .staging/ as well: two names of one folder, which no system call makes, so the
    committed folder's ``lstat`` answers here for the stale one. gc must leave that name
    alone (emptying it would empty the snapshot) and say why, and still collect an
    ordinary leftover in the same pass."""
    root = tmp_path.resolve() / "store"
    store = open_store(root)
    snapshot_id = new_snapshot_id()
    for rank in range(2):
        await _write(store, snapshot_id, rank)
    committed = root / "snapshots" / snapshot_id
    named = committed if folder == "snapshot" else committed / "ranks" / "0"
    old = time.time() - 7200
    stale, leftover = (root / ".staging" / new_snapshot_id() for _ in range(2))
    for made in (stale, leftover):
        made.mkdir()
        (made / "c.0").write_bytes(b"123")
        for path in (made / "c.0", made):
            os.utime(path, (old, old))
    real_lstat = os.lstat

    def two_names(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if os.fspath(path) == str(named):  # type: ignore[arg-type]
            return real_lstat(stale)
        return real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]

    with monkeypatch.context() as patched:  # unit-level fault injection
        patched.setattr(os, "lstat", two_names)
        assert await store.gc(grace_seconds=60) == [leftover.name]
    assert (stale / "c.0").read_bytes() == b"123" and not leftover.exists()
    assert f"gc leaves {stale}: it is another name of the committed folder {named}" in (caplog.text)
    assert await store.gc(grace_seconds=60) == [stale.name]  # one name per folder again
    assert await store.read_snapshot(snapshot_id, rank=0) == _record(0)
    await store.close()
