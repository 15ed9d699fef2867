"""The recorder's commit thread: a small snapshot started with nothing in flight is
written and committed in one thread, with no trip through the recorder's event loop, and
is in every way a snapshot the loop would have written (bytes, ids, order, errors)."""

from __future__ import annotations

import errno
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import (
    GradientsParams,
    ParamId,
    Recorder,
    StoreUnavailableError,
)
from gradvault.core.autodiff.tensor import wrap

#: one gradient of 256 KiB (above the default pack threshold) and two small ones: one
#: chunk of the packed array, the snapshot the commit thread takes
SMALL = [(256, 256), (3, 4), (17,)]


def _grads(seed: int, shapes: list[tuple[int, ...]]) -> GradientsParams:
    rng = np.random.default_rng(seed)
    grads = GradientsParams()
    for index, shape in enumerate(shapes):
        array = rng.standard_normal(shape).astype("float32")
        grads.register(ParamId(), wrap(array), name=f"p{index}")
    return grads


def _oldest_first(recorder: Recorder) -> list:
    """The store's snapshots, oldest first (``list`` gives the newest first)."""
    return list(reversed(recorder.sync.list()))


def _bytes(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


class _Calls:
    """Which of the store's two writes ran, in which thread, and what the blocking one
    returned (the store's public methods, wrapped on the instance)."""

    def __init__(self, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
        store = recorder.store
        self.blocking: list[tuple[str, object]] = []
        self.on_loop: list[str] = []
        blocking, on_loop = store.write_snapshot_blocking, store.write_snapshot

        def write_snapshot_blocking(*args: object, **kwargs: object) -> object:
            info = blocking(*args, **kwargs)
            self.blocking.append((threading.current_thread().name, info))
            return info

        async def write_snapshot(*args: object, **kwargs: object) -> object:
            self.on_loop.append(threading.current_thread().name)
            return await on_loop(*args, **kwargs)

        monkeypatch.setattr(store, "write_snapshot_blocking", write_snapshot_blocking)
        monkeypatch.setattr(store, "write_snapshot", write_snapshot)


@pytest.fixture
def recorder(tmp_path: Path) -> Iterator[Recorder]:
    made = Recorder(tmp_path / "store")
    yield made
    made.close()


def test_a_small_snapshot_commits_in_the_commit_thread_bit_for_bit(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _Calls(recorder, monkeypatch)
    root = Path(recorder.store.location)
    assert not root.exists()
    first = recorder.start_snapshot(_grads(0, SMALL), run="r", step=0).result(timeout=60)
    # the store's first write makes its folders (and their documents), in that thread too
    thread, info = calls.blocking[0]
    assert thread.startswith("gradvault-commit") and info == first
    for folder in (root, root / "snapshots"):
        assert json.loads((folder / "zarr.json").read_bytes())["node_type"] == "group"
    grads = _grads(1, SMALL)
    second = recorder.start_snapshot(grads, run="r", step=1, tags={"k": "v"}).result(timeout=60)
    thread, info = calls.blocking[-1]
    assert thread.startswith("gradvault-commit") and info == second
    assert calls.on_loop == []  # neither written on the loop
    assert second.id > first.id and second.step == 1
    assert recorder.sync.info(second.id)["tags"] == {"k": "v"}
    assert [s.id for s in _oldest_first(recorder)] == [first.id, second.id]
    assert _bytes(recorder.sync.restore(second.id, "cpu")) == _bytes(grads)
    assert os.listdir(Path(recorder.store.location) / ".staging") == []


def test_large_compressed_or_queued_snapshots_are_written_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Recorder(tmp_path / "plain", chunk_bytes=1 << 20) as plain:
        calls = _Calls(plain, monkeypatch)
        large = _grads(1, [(600, 600)])  # 1.4 MB: more than one chunk
        plain.start_snapshot(large, run="r", step=0).result(timeout=60)  # the store's first
        plain.start_snapshot(large, run="r", step=1).result(timeout=60)
        assert [info for _, info in calls.blocking] == [None, None]
        assert len(calls.on_loop) == 2
    with Recorder(tmp_path / "zstd", compression="zstd") as compressed:
        calls = _Calls(compressed, monkeypatch)
        for step in range(2):
            compressed.start_snapshot(_grads(step, SMALL), run="r", step=step).result(timeout=60)
        assert [info for _, info in calls.blocking] == [None, None]
        assert len(calls.on_loop) == 2


def test_a_snapshot_started_while_one_commits_there_becomes_visible_after_it(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second snapshot goes through the loop and waits for the first one's turn,
    released by the commit thread: it is visible only after the first, and ids follow."""
    recorder.start_snapshot(_grads(0, SMALL), run="r", step=0).result(timeout=60)
    store = recorder.store
    blocking = store.write_snapshot_blocking
    entered, go = threading.Event(), threading.Event()

    def paused(*args: object, **kwargs: object) -> object:
        entered.set()
        assert go.wait(60)
        return blocking(*args, **kwargs)

    monkeypatch.setattr(store, "write_snapshot_blocking", paused)
    first = recorder.start_snapshot(_grads(1, SMALL), run="r", step=1)
    assert entered.wait(60)
    second = recorder.start_snapshot(_grads(2, SMALL), run="r", step=2)
    # the second one's files are written meanwhile; it stays invisible until the first is
    staging = Path(store.location) / ".staging"
    pause = threading.Event()
    for _ in range(1200):  # a bound on the wait, not a figure under test
        staged = [n for n in os.listdir(staging) if (staging / n / "zarr.json").exists()]
        if staged:
            break
        pause.wait(0.05)
    assert staged, "the second snapshot's manifest was never written"
    assert [s.step for s in _oldest_first(recorder)] == [0]
    go.set()
    first_info = first.result(timeout=60)
    # the release must wake the loop itself: nothing else here does (result() would)
    for _ in range(1200):  # a bound on the wait, not a figure under test
        if second.done():
            break
        pause.wait(0.05)
    woken = second.done()
    infos = [first_info, second.result(timeout=60)]  # (this wakes the loop if need be)
    assert woken, "the first one's release did not wake the second one's wait"
    assert [s.id for s in _oldest_first(recorder)][1:] == [info.id for info in infos]
    assert infos[0].id < infos[1].id


def test_a_failed_commit_in_the_thread_leaves_nothing_and_holds_up_nothing(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder.start_snapshot(_grads(0, SMALL), run="r", step=0).result(timeout=60)
    backend = recorder.store.backend
    begin_blocking = backend.begin_blocking

    def begin_on_a_full_disk(snapshot_id: str) -> object:
        writer = begin_blocking(snapshot_id)
        write = writer.write_array_and_commit_blocking

        def full(name: str, metadata: bytes, chunks: Iterator, group: Callable) -> None:
            def failing_group() -> bytes:
                raise OSError(errno.ENOSPC, "No space left on device")

            write(name, metadata, chunks, failing_group)

        writer.write_array_and_commit_blocking = full
        return writer

    monkeypatch.setattr(backend, "begin_blocking", begin_on_a_full_disk)
    failed = recorder.start_snapshot(_grads(1, SMALL), run="r", step=1)
    with pytest.raises(StoreUnavailableError, match="No space left on device"):
        failed.result(timeout=60)
    assert [s.step for s in _oldest_first(recorder)] == [0]
    assert os.listdir(Path(recorder.store.location) / ".staging") == []
    monkeypatch.setattr(backend, "begin_blocking", begin_blocking)
    # its turn was released: the next snapshot, started while nothing is in flight or
    # while one is, becomes visible
    later = [recorder.start_snapshot(_grads(s, SMALL), run="r", step=s) for s in (2, 3)]
    assert [handle.result(timeout=60).step for handle in later] == [2, 3]
    assert [s.step for s in _oldest_first(recorder)] == [0, 2, 3]


def test_retention_runs_after_a_commit_in_the_thread(tmp_path: Path) -> None:
    with Recorder(tmp_path / "store", keep_last=2) as recorder:
        infos = [
            recorder.start_snapshot(_grads(s, SMALL), run="r", step=s).result(timeout=60)
            for s in range(5)
        ]
        assert [s.id for s in _oldest_first(recorder)] == [infos[3].id, infos[4].id]


def test_a_first_snapshot_that_cannot_make_the_store_folders_names_them(
    tmp_path: Path,
) -> None:
    """The first one-step snapshot makes the store's folders in the commit thread: where
    it cannot (a file took the store's place after the recorder opened), the handle raises
    StoreUnavailableError naming the store and what failed, and the recorder goes on once
    the place is free again."""
    root = tmp_path / "store"
    with Recorder(root) as recorder:
        root.write_bytes(b"not a folder")
        handle = recorder.start_snapshot(_grads(0, SMALL), run="r", step=0)
        with pytest.raises(StoreUnavailableError, match="creating the store folders") as error:
            handle.result(timeout=60)
        assert str(root) in str(error.value)
        root.unlink()
        grads = _grads(1, SMALL)
        info = recorder.start_snapshot(grads, run="r", step=1).result(timeout=60)
        assert [s.id for s in recorder.sync.list()] == [info.id]
        assert _bytes(recorder.sync.restore(info.id, "cpu")) == _bytes(grads)


def test_the_commit_thread_runs_from_the_recorders_construction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread's start waits for the new thread to run: the recorder starts its commit
    thread when made, so that the first ``start_snapshot`` of a training loop starts no
    thread in the caller's (the process's one direct-write thread, started by the first
    direct write of the process, starts in the commit thread)."""
    before = set(threading.enumerate())
    with Recorder(tmp_path / "store") as recorder:
        made = set(threading.enumerate()) - before
        assert len([t for t in made if t.name.startswith("gradvault-commit")]) == 1
        recorder.store.backend.fsyncs.IN_LINE_BELOW = float("inf")  # no fsync thread either
        started: list[tuple[str, str]] = []  # (thread started, thread that started it)
        real_start = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            started.append((thread.name, threading.current_thread().name))
            real_start(thread)

        monkeypatch.setattr(threading.Thread, "start", start)
        caller = threading.current_thread().name
        handle = recorder.start_snapshot(_grads(0, SMALL), run="r", step=0)
        info = handle.result(timeout=60)
        monkeypatch.undo()
        assert [name for name, by in started if by == caller] == []
        assert [name for name, _ in started if name.startswith("gradvault-commit")] == []
        assert [s.id for s in recorder.sync.list()] == [info.id]


def test_closing_a_recorder_whose_store_started_no_thread_starts_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Snapshots committed in the commit thread leave the store's pools and fsync threads
    unstarted and no spare folder: closing the recorder releases nothing by way of a
    thread (its loop's default pool included) and leaves only the committed snapshots."""
    started: list[str] = []
    real_start = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        started.append(thread.name)
        real_start(thread)

    recorder = Recorder(tmp_path / "store")
    # fsyncs in line however slow this machine's are now (slow ones start threads)
    recorder.store.backend.fsyncs.IN_LINE_BELOW = float("inf")
    for step in range(3):
        recorder.start_snapshot(_grads(step, SMALL), run="r", step=step).result()
    assert not recorder.store.backend.fsyncs.started
    monkeypatch.setattr(threading.Thread, "start", start)
    recorder.close()
    monkeypatch.undo()
    assert started == []
    assert os.listdir(tmp_path / "store" / ".staging") == []
    assert len(os.listdir(tmp_path / "store" / "snapshots")) == 4  # and its zarr.json


def test_closing_a_recorder_ends_the_fsync_threads_its_store_started(tmp_path: Path) -> None:
    """Where the store handed its fsyncs to threads (a device whose fsyncs are slow),
    closing the recorder ends them."""
    recorder = Recorder(tmp_path / "store")
    fsyncs = recorder.store.backend.fsyncs
    fsyncs.IN_LINE_BELOW = 0.0  # as if every fsync were slow: a round goes to the threads
    fsyncs.PROBE_EVERY = 1 << 30
    for step in range(2):
        recorder.start_snapshot(_grads(step, SMALL), run="r", step=step).result()
    assert fsyncs.started
    recorder.close()
    assert not fsyncs.started
    assert not any(t.name.startswith("gradvault-fsync") for t in threading.enumerate())
