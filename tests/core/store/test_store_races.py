"""The store under races: gc, delete, retention and commits forced into their worst order.

Each test pauses one party at the step that matters (a hook on ``os.unlink`` or on one of
the S3 backend's requests) and runs the other party there, so the interleaving is
certain rather than hoped for.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gradvault.core import GradientsParams, ParamId, Recorder
from gradvault.core.autodiff.tensor import wrap
from gradvault.core.errors import SnapshotNotFoundError, StoreUnavailableError
from gradvault.core.records.record import GradientRecordEntry, GradientsParamsRecord
from gradvault.core.store import GC_MARKER_NAME, SnapshotStore, new_snapshot_id, open_store

from ..conftest import S3_BUCKET, S3_CREDENTIALS

# --- helpers --------------------------------------------------------------------------


def make_record(seed: int) -> GradientsParamsRecord:
    """A record with a multi-chunk array and packed ones (under the stores' small chunks)."""
    rng = np.random.default_rng(seed)
    arrays = {
        "big": rng.standard_normal((64, 40)).astype(np.float32),
        "small": rng.standard_normal(7).astype(np.float32),
        "tiny": np.array([seed], dtype=np.int64),
    }
    return GradientsParamsRecord(
        [GradientRecordEntry.from_array(ParamId(), name, a) for name, a in arrays.items()]
    )


def record_bytes(record: GradientsParamsRecord) -> dict[ParamId, bytes]:
    return {entry.param_id: entry.array.tobytes() for entry in record}


def grads_bytes(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


def small_grads(seed: int) -> GradientsParams:
    grads = GradientsParams()
    array = np.random.default_rng(seed).standard_normal((5, 3)).astype(np.float32)
    grads.register(ParamId(), wrap(array), name="w")
    return grads


async def assert_reads_back(store: SnapshotStore, snapshot_id: str, record) -> None:
    assert snapshot_id in {info.id for info in await store.list()}
    assert record_bytes(await store.read_snapshot(snapshot_id)) == record_bytes(record)


class FirstUnlinkPause:
    """Pauses the first ``os.unlink`` call (whoever makes it) until ``resume`` is set.

    ``shutil.rmtree`` unlinks through ``os.unlink``, so this stops a removal after it has
    listed the folders it is in and before it removed anything: the moment at which the
    races of gc and delete happen.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reached = threading.Event()
        self.resume = threading.Event()
        self._lock = threading.Lock()
        self._taken = False
        real_unlink = os.unlink

        def unlink(*args: Any, **kwargs: Any) -> None:
            with self._lock:
                first, self._taken = not self._taken, True
            if first:
                self.reached.set()
                assert self.resume.wait(60), "the paused unlink was never resumed"
            real_unlink(*args, **kwargs)

        monkeypatch.setattr(os, "unlink", unlink)

    async def wait_reached(self) -> None:
        assert await asyncio.to_thread(self.reached.wait, 60), "nothing was unlinked"


@pytest.fixture
def pause_first_unlink(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], FirstUnlinkPause]]:
    """Starts a FirstUnlinkPause; a test that fails leaves no thread paused behind it."""
    pauses: list[FirstUnlinkPause] = []

    def start() -> FirstUnlinkPause:
        pauses.append(FirstUnlinkPause(monkeypatch))
        return pauses[-1]

    yield start
    for pause in pauses:
        pause.resume.set()


def age_tree(path: Path, seconds: float) -> None:
    """Set the mtime of ``path`` and everything under it ``seconds`` into the past."""
    past = time.time() - seconds
    for folder, subfolders, files in os.walk(path):
        for name in subfolders + files:
            os.utime(os.path.join(folder, name), (past, past), follow_symlinks=False)
    os.utime(path, (past, past))


def staging_entries(root: Path) -> list[str]:
    return sorted(os.listdir(root / ".staging"))


@pytest.fixture
async def local_stores(tmp_path: Path) -> AsyncIterator[Callable[[], SnapshotStore]]:
    """Independent store objects on one folder, as separate processes would hold them."""
    opened: list[SnapshotStore] = []

    def factory() -> SnapshotStore:
        store = open_store(tmp_path / "store", chunk_bytes=4096, pack_threshold=512)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def s3_stores(s3_endpoint: str) -> AsyncIterator[Callable[[], SnapshotStore]]:
    """Independent store objects on one fresh S3 prefix."""
    url = f"s3://{S3_BUCKET}/{uuid.uuid4().hex}/store"
    opened: list[SnapshotStore] = []

    def factory() -> SnapshotStore:
        store = open_store(
            url,
            endpoint=s3_endpoint,
            allow_http=True,
            chunk_bytes=4096,
            pack_threshold=512,
            **S3_CREDENTIALS,
        )
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
def stores(store_kind: str, request: pytest.FixtureRequest) -> Callable[[], SnapshotStore]:
    """``local_stores`` or ``s3_stores``, by the test's store kind."""
    return request.getfixturevalue(f"{store_kind}_stores")


# --- gc racing a commit: local folder -------------------------------------------------


async def test_gc_removing_a_staging_folder_as_it_commits_never_loses_a_reported_snapshot(
    local_stores, monkeypatch, pause_first_unlink
) -> None:
    """gc (grace 0) is halfway through removing a staging folder when the writer commits."""
    writer, collector = local_stores(), local_stores()
    record = make_record(1)
    staged, go = asyncio.Event(), asyncio.Event()
    begin = writer.backend.begin

    async def begin_and_pause_before_commit(snapshot_id: str, **options: bool):
        snapshot_writer = await begin(snapshot_id, **options)
        commit = snapshot_writer.commit

        async def paused_commit(document: bytes) -> None:
            staged.set()
            await go.wait()
            await commit(document)

        snapshot_writer.commit = paused_commit
        return snapshot_writer

    monkeypatch.setattr(writer.backend, "begin", begin_and_pause_before_commit)
    write = asyncio.ensure_future(writer.write_snapshot(record, run="r", step=0))
    await staged.wait()
    pause = pause_first_unlink()
    collect = asyncio.ensure_future(collector.gc(grace_seconds=0))
    await pause.wait_reached()  # gc is removing the staging folder's files ...
    go.set()  # ... when the writer commits it
    outcome = (await asyncio.gather(write, return_exceptions=True))[0]
    pause.resume.set()
    await collect

    if isinstance(outcome, BaseException):
        assert isinstance(outcome, StoreUnavailableError), outcome
        assert "collected by gc before commit" in str(outcome)
        assert await collector.list() == []
    else:  # a write reported committed must be whole
        await assert_reads_back(collector, outcome.id, record)
    await collector.gc(grace_seconds=0)
    assert staging_entries(Path(collector.location)) == []


async def test_gc_taking_a_staging_folder_before_commit_fails_the_write_clearly(
    local_stores, monkeypatch
) -> None:
    writer, collector = local_stores(), local_stores()
    begin = writer.backend.begin

    async def begin_then_gc_before_commit(snapshot_id: str, **options: bool):
        snapshot_writer = await begin(snapshot_id, **options)
        commit = snapshot_writer.commit

        async def commit_after_gc(document: bytes) -> None:
            assert await collector.gc(grace_seconds=0) == [snapshot_id]
            await commit(document)

        snapshot_writer.commit = commit_after_gc
        return snapshot_writer

    monkeypatch.setattr(writer.backend, "begin", begin_then_gc_before_commit)
    with pytest.raises(StoreUnavailableError, match="collected by gc before commit") as caught:
        await writer.write_snapshot(make_record(2), run="r", step=0)
    assert "snapshot " in str(caught.value)
    assert await collector.list() == []
    assert staging_entries(Path(collector.location)) == []


async def test_a_staged_file_removed_before_commit_fails_the_write(
    local_stores, monkeypatch
) -> None:
    """Someone removes one chunk from the staging folder: the write must not report success."""
    store = local_stores()
    begin = store.backend.begin

    async def begin_then_lose_a_chunk(snapshot_id: str, **options: bool):
        snapshot_writer = await begin(snapshot_id, **options)
        commit = snapshot_writer.commit

        async def commit_without_a_chunk(document: bytes) -> None:
            staged = Path(store.location) / ".staging" / snapshot_id
            chunk = next(p for p in sorted(staged.rglob("c.*")) if p.is_file())
            chunk.unlink()
            await commit(document)

        snapshot_writer.commit = commit_without_a_chunk
        return snapshot_writer

    monkeypatch.setattr(store.backend, "begin", begin_then_lose_a_chunk)
    with pytest.raises(StoreUnavailableError, match="vanished"):
        await store.write_snapshot(make_record(3), run="r", step=0)
    assert await store.list() == []


# --- gc racing a commit: S3 -----------------------------------------------------------


async def test_s3_gc_between_a_writers_check_and_its_manifest_makes_the_commit_fail(
    s3_stores, monkeypatch
) -> None:
    """gc removes a prefix while the writer's manifest PUT is on its way."""
    writer, collector = s3_stores(), s3_stores()
    record = make_record(4)
    put = writer.backend.put  # S3Backend.put: every PUT of the writer
    collected: list[list[str]] = []

    async def put_after_gc(key: str, body: Any) -> None:
        if key.endswith("/zarr.json") and key.count("/") == 2:  # snapshots/<id>/zarr.json
            collected.append(await collector.gc(grace_seconds=0))
        await put(key, body)

    monkeypatch.setattr(writer.backend, "put", put_after_gc)
    try:
        info = await writer.write_snapshot(record, run="r", step=0)
    except StoreUnavailableError as error:
        assert "collected by gc before commit" in str(error)
        assert await collector.list() == []
    else:
        await assert_reads_back(collector, info.id, record)
    assert len(collected) == 1 and len(collected[0]) == 1


async def test_s3_a_commit_between_gcs_check_and_its_delete_is_refused(
    s3_stores, monkeypatch
) -> None:
    """The writer commits after gc decided the prefix is a leftover, before gc deletes it."""
    writer, collector = s3_stores(), s3_stores()
    record = make_record(5)
    staged, go = asyncio.Event(), asyncio.Event()
    begin = writer.backend.begin

    async def begin_and_pause_before_commit(snapshot_id: str, **options: bool):
        snapshot_writer = await begin(snapshot_id, **options)
        commit = snapshot_writer.commit

        async def paused_commit(document: bytes) -> None:
            staged.set()
            await go.wait()
            await commit(document)

        snapshot_writer.commit = paused_commit
        return snapshot_writer

    monkeypatch.setattr(writer.backend, "begin", begin_and_pause_before_commit)
    write = asyncio.ensure_future(writer.write_snapshot(record, run="r", step=0))
    await staged.wait()
    delete = collector.backend.delete_keys  # S3Backend.delete_keys
    write_outcome: list[Any] = []

    async def let_the_writer_commit_then_delete(keys: list[str]) -> None:
        if not write_outcome:
            go.set()
            write_outcome.extend(await asyncio.gather(write, return_exceptions=True))
        await delete(keys)

    monkeypatch.setattr(collector.backend, "delete_keys", let_the_writer_commit_then_delete)
    await collector.gc(grace_seconds=0)
    if not write_outcome:  # gc deleted nothing
        go.set()
        write_outcome.extend(await asyncio.gather(write, return_exceptions=True))
    outcome = write_outcome[0]
    if isinstance(outcome, BaseException):
        assert isinstance(outcome, StoreUnavailableError), outcome
        assert "collected by gc before commit" in str(outcome)
        assert await collector.list() == []
    else:
        await assert_reads_back(collector, outcome.id, record)


async def test_s3_gc_leaves_only_an_unlisted_marker_until_it_is_old(
    s3_stores, boto3_s3, monkeypatch
) -> None:
    """What gc leaves behind on S3 is not listed, and goes once older than its lifetime."""
    store = s3_stores()
    kept = await store.write_snapshot(make_record(6), run="r", step=0)
    leftover = new_snapshot_id()
    writer = await store.backend.begin(leftover)
    await writer.write_array("0123456789abcdef", b"{}", iter([("c/0", [b"\0" * 8])]))
    assert await store.gc(grace_seconds=0) == [leftover]
    prefix = store.location.removeprefix(f"s3://{S3_BUCKET}/") + f"/snapshots/{leftover}/"

    def keys() -> list[str]:
        listing = boto3_s3.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix)
        return [item["Key"].removeprefix(prefix) for item in listing.get("Contents", [])]

    assert keys() == [GC_MARKER_NAME]
    assert await store.gc(grace_seconds=0) == []  # the marker is young: kept, not reported
    assert keys() == [GC_MARKER_NAME]
    assert [info.id for info in await s3_stores().list()] == [kept.id]
    monkeypatch.setattr(store.backend, "marker_lifetime_seconds", 0.0)
    assert await store.gc(grace_seconds=0) == []
    assert keys() == []
    assert [info.id for info in await s3_stores().list()] == [kept.id]


# --- retention ------------------------------------------------------------------------


@pytest.fixture
def recorders(store_url: str, connection_options: dict[str, object]):
    made: list[Recorder] = []

    def factory(**options: object) -> Recorder:
        recorder = Recorder(store_url, **connection_options, **options)
        made.append(recorder)
        return recorder

    yield factory
    for recorder in made:
        recorder.close()


def test_retention_never_deletes_the_snapshot_its_own_commit_wrote(recorders, monkeypatch):
    """Two recorders on one run, keep_last=1: the older id commits after the newer one."""
    slow, fast = recorders(keep_last=1), recorders(keep_last=1)
    slow_backend = slow.store.backend
    staged, go = threading.Event(), threading.Event()
    begin = slow_backend.begin

    async def begin_and_pause_before_commit(snapshot_id: str, **options: bool):
        snapshot_writer = await begin(snapshot_id, **options)
        commit = snapshot_writer.commit

        async def paused_commit(document: bytes) -> None:
            staged.set()
            await asyncio.to_thread(go.wait, 60)
            await commit(document)

        snapshot_writer.commit = paused_commit
        return snapshot_writer

    monkeypatch.setattr(slow_backend, "begin", begin_and_pause_before_commit)
    old_grads, new_grads = small_grads(1), small_grads(2)
    handle = slow.start_snapshot(old_grads, run="shared", step=1)
    assert staged.wait(60)
    newer = fast.sync.snapshot(new_grads, run="shared", step=2)
    go.set()
    older = handle.result(60)
    assert older.id < newer.id  # minted first, committed last

    # the pass of its own commit kept it: it is listed and restores
    assert {info.id for info in fast.sync.list(run="shared")} == {older.id, newer.id}
    assert grads_bytes(fast.sync.restore(older.id)) == grads_bytes(old_grads)
    # keep_last counts by id (creation order): the next pass keeps only the newest
    newest = fast.sync.snapshot(small_grads(3), run="shared", step=3)
    assert [info.id for info in fast.sync.list(run="shared")] == [newest.id]


async def cut_off_delete(store_kind: str, store: SnapshotStore, snapshot_id: str, boto3_s3):
    """Leave ``snapshot_id`` the way a delete stopped after its first step leaves it."""
    if store_kind == "local":
        root = Path(store.location)
        os.rename(root / "snapshots" / snapshot_id, root / ".staging" / f"{snapshot_id}.deleting-x")
    else:
        bucket_prefix = store.location.removeprefix(f"s3://{S3_BUCKET}/")
        boto3_s3.delete_object(
            Bucket=S3_BUCKET, Key=f"{bucket_prefix}/snapshots/{snapshot_id}/zarr.json"
        )


async def test_retention_decides_from_a_fresh_listing(
    stores, store_kind, request: pytest.FixtureRequest
) -> None:
    """A long-lived store still lists a snapshot whose manifest another process deleted."""
    boto3_s3 = request.getfixturevalue("boto3_s3") if store_kind == "s3" else None
    long_lived, other = stores(), stores()
    records = [make_record(10 + i) for i in range(3)]
    infos = [await other.write_snapshot(r, run="r", step=i) for i, r in enumerate(records)]
    assert len(await long_lived.list()) == 3  # its listing cache knows all three
    await cut_off_delete(store_kind, other, infos[2].id, boto3_s3)

    assert await long_lived.apply_retention(keep_last=1) == [infos[0].id]
    fresh = stores()
    assert [info.id for info in await fresh.list()] == [infos[1].id]
    await assert_reads_back(fresh, infos[1].id, records[1])


async def test_retention_rechecks_the_newest_before_deleting(stores, monkeypatch) -> None:
    """The newest snapshot is deleted by someone else after retention listed the store."""
    store, other = stores(), stores()
    records = [make_record(20 + i) for i in range(3)]
    infos = [await store.write_snapshot(r, run="r", step=i) for i, r in enumerate(records)]
    committed_ids = store.backend.committed_ids
    deleted_meanwhile: list[str] = []

    async def listing_then_someone_deletes_the_newest(*args: Any, **kwargs: Any) -> list[str]:
        listed = await committed_ids(*args, **kwargs)
        if not deleted_meanwhile:
            await other.delete(infos[2].id)
            deleted_meanwhile.append(infos[2].id)
        return listed

    monkeypatch.setattr(store.backend, "committed_ids", listing_then_someone_deletes_the_newest)
    await store.apply_retention(keep_last=1)
    assert [info.id for info in await other.list()] == [infos[1].id]
    await assert_reads_back(other, infos[1].id, records[1])


@pytest.mark.parametrize(
    "rules",
    [
        {"keep_last": -1},
        {"keep_last": True},
        {"keep_last": False},
        {"keep_last": 1.5},
        {"keep_last": "2"},
        {"keep_every": 0},
        {"keep_every": -3},
        {"keep_every": True},
        {"keep_every": 2.0},
    ],
)
async def test_bad_retention_rules_are_refused_up_front(tmp_path: Path, rules: dict) -> None:
    name, value = next(iter(rules.items()))
    with pytest.raises(ValueError, match=f"{name} must be") as caught:
        Recorder(tmp_path / "store", **rules)
    assert repr(value) in str(caught.value)
    store = open_store(tmp_path / "store")
    with pytest.raises(ValueError, match=f"{name} must be"):
        await store.apply_retention(**rules)
    await store.close()


def test_any_failure_of_retention_leaves_the_commit_reported(recorders, caplog) -> None:
    recorder = recorders(keep_last=1)
    store = recorder.store

    async def broken(*args: object, **kwargs: object) -> list[str]:
        raise ValueError("keep_last went bad (injected)")

    store.apply_retention = broken  # unit-level fault injection
    grads = small_grads(4)
    with caplog.at_level("WARNING", logger="gradvault.recorder"):
        info = recorder.start_snapshot(grads, run="r", step=0).result(60)
    assert grads_bytes(recorder.sync.restore(info.id)) == grads_bytes(grads)
    assert info.id in caplog.text and "injected" in caplog.text


# --- delete racing gc (local folder) --------------------------------------------------


async def test_gc_leaves_a_delete_in_progress_alone(local_stores, pause_first_unlink) -> None:
    """An old snapshot's files keep their old mtimes while a delete removes them."""
    deleter, collector = local_stores(), local_stores()
    info = await deleter.write_snapshot(make_record(30), run="r", step=0)
    age_tree(Path(deleter.location) / "snapshots" / info.id, 7200)
    pause = pause_first_unlink()
    delete = asyncio.ensure_future(deleter.delete(info.id))
    await pause.wait_reached()
    assert await collector.gc() == []
    assert await collector.gc(grace_seconds=0) == []
    pause.resume.set()
    await delete  # no error: the delete finished its own removal
    assert await collector.list() == []
    assert staging_entries(Path(collector.location)) == []


async def test_delete_tolerates_files_removed_by_someone_else(
    local_stores, pause_first_unlink
) -> None:
    store = local_stores()
    info = await store.write_snapshot(make_record(31), run="r", step=0)
    pause = pause_first_unlink()
    delete = asyncio.ensure_future(store.delete(info.id))
    await pause.wait_reached()
    staging = Path(store.location) / ".staging"
    (doomed,) = staging.iterdir()
    await asyncio.to_thread(shutil.rmtree, doomed)  # another process got there first
    pause.resume.set()
    await delete
    assert await store.list() == []
    with pytest.raises(SnapshotNotFoundError):
        await store.delete(info.id)
    assert staging_entries(Path(store.location)) == []


async def test_gc_finishes_when_files_appear_in_what_it_removes(
    local_stores, pause_first_unlink
) -> None:
    """A write lands in a leftover while gc removes it: gc goes on instead of failing."""
    store = local_stores()
    await store.backend.prepare()
    writer = await store.backend.begin(new_snapshot_id())
    await writer.write_array(
        "0123456789abcdef", b"{}", iter([("c/0/0", [b"\0" * 8]), ("c/0/1", [b"\1" * 8])])
    )
    staging = Path(store.location) / ".staging"
    pause = pause_first_unlink()
    collect = asyncio.ensure_future(store.gc(grace_seconds=0))
    await pause.wait_reached()
    for folder, _, _ in os.walk(staging):  # gc has listed these folders already
        if Path(folder) != staging:
            Path(folder, "late").write_bytes(b"late")
    pause.resume.set()
    assert len(await collect) == 1
    assert staging_entries(Path(store.location)) == []


async def test_retention_and_gc_at_once_finish_and_keep_what_they_should(
    local_stores, pause_first_unlink
) -> None:
    """gc (grace 0) runs while a retention pass is in the middle of its first delete."""
    store, collector = local_stores(), local_stores()
    records = [make_record(40 + i) for i in range(4)]
    infos = [await store.write_snapshot(r, run="r", step=i) for i, r in enumerate(records)]
    for info in infos:
        age_tree(Path(store.location) / "snapshots" / info.id, 7200)
    pause = pause_first_unlink()
    retention = asyncio.ensure_future(store.apply_retention(keep_last=2))
    await pause.wait_reached()
    assert await collector.gc(grace_seconds=0) == []
    pause.resume.set()
    assert await retention == [infos[1].id, infos[0].id]
    assert [info.id for info in await collector.list()] == [infos[3].id, infos[2].id]
    for info, record in zip(infos[2:], records[2:], strict=True):
        await assert_reads_back(collector, info.id, record)
    assert staging_entries(Path(store.location)) == []


async def test_a_delete_whose_cleanup_fails_still_deletes_and_gc_finishes_it(
    stores, store_kind, monkeypatch, caplog
) -> None:
    """Once the snapshot is invisible it is deleted; failing to remove its data is gc's job."""
    store = stores()
    records = [make_record(50 + i) for i in range(3)]
    infos = [await store.write_snapshot(r, run="r", step=i) for i, r in enumerate(records)]
    with monkeypatch.context() as patched:  # unit-level fault injection
        if store_kind == "local":

            def refuse(*args: Any, **kwargs: Any) -> None:
                raise PermissionError(13, "Permission denied (injected)")

            patched.setattr(os, "unlink", refuse)
        else:

            async def refuse(prefix: str) -> list:
                raise StoreUnavailableError(f"listing {prefix} failed (injected)")

            patched.setattr(store.backend, "list_objects", refuse)
        with caplog.at_level("WARNING", logger="gradvault.store"):
            assert await store.apply_retention(keep_last=1) == [infos[1].id, infos[0].id]
    assert "injected" in caplog.text and infos[0].id in caplog.text
    assert [info.id for info in await stores().list()] == [infos[2].id]
    assert len(await store.gc(grace_seconds=0)) == 2
    await assert_reads_back(stores(), infos[2].id, records[2])
    if store_kind == "local":
        assert staging_entries(Path(store.location)) == []


async def test_a_file_system_without_flock_still_deletes_and_collects(
    local_stores, monkeypatch
) -> None:
    def unsupported(fd: int, operation: int) -> None:
        raise OSError(errno.EOPNOTSUPP, "Operation not supported (injected)")

    monkeypatch.setattr(fcntl, "flock", unsupported)  # unit-level fault injection
    store = local_stores()
    kept = await store.write_snapshot(make_record(60), run="r", step=0)
    gone = await store.write_snapshot(make_record(61), run="r", step=1)
    await store.delete(gone.id)
    await store.backend.begin(new_snapshot_id())  # a write that never finishes
    assert len(await store.gc(grace_seconds=0)) == 1
    assert [info.id for info in await store.list()] == [kept.id]
    assert staging_entries(Path(store.location)) == []


async def test_retention_keeps_the_newest_snapshot_readers_can_read(
    stores, store_kind, request: pytest.FixtureRequest
) -> None:
    """The newest snapshot this store wrote became unreadable: the good one before it stays."""
    store = stores()
    records = [make_record(70 + i) for i in range(3)]
    infos = [await store.write_snapshot(r, run="r", step=i) for i, r in enumerate(records)]
    manifest_key = f"snapshots/{infos[2].id}/zarr.json"
    if store_kind == "local":
        path = Path(store.location) / manifest_key
        document = json.loads(path.read_bytes())
        document["attributes"]["gradvault"]["format_version"] = 999
        path.write_text(json.dumps(document))
    else:
        boto3_s3 = request.getfixturevalue("boto3_s3")
        key = store.location.removeprefix(f"s3://{S3_BUCKET}/") + "/" + manifest_key
        document = json.loads(boto3_s3.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read())
        document["attributes"]["gradvault"]["format_version"] = 999
        boto3_s3.put_object(Bucket=S3_BUCKET, Key=key, Body=json.dumps(document).encode())

    assert await store.apply_retention(keep_last=1) == [infos[0].id]
    assert [info.id for info in await stores().list()] == [infos[1].id]
    await assert_reads_back(stores(), infos[1].id, records[1])
