"""Recorder: snapshots queued while earlier ones commit, in order, each durable before its
handle completes; the bound on what the queue holds; and CommitOrder on its own."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from gradvault.core import (
    GradientsParams,
    InvalidArgumentError,
    ParamId,
    Recorder,
    StoreUnavailableError,
)
from gradvault.core.autodiff.tensor import wrap
from gradvault.core.store._commit_order import CommitOrder
from tests.core.os_probes import record_fsyncs_and_renames

SHAPES = [(64, 40), (300,), (3,)]


def make_grads(seed: int) -> GradientsParams:
    rng = np.random.default_rng(seed)
    grads = GradientsParams()
    for index, shape in enumerate(SHAPES):
        grads.register(
            ParamId(), wrap(rng.standard_normal(shape).astype(np.float32)), name=f"p{index}"
        )
    return grads


def grads_bytes(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


NBYTES = sum(int(np.prod(shape)) * 4 for shape in SHAPES)


class PausedFirstCommit:
    """Holds the commit of the snapshot of step 0 written after it is made, just before
    the commit starts (writes begin in any order; their commits wait for their turns)."""

    def __init__(self, recorder: Recorder) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        backend = recorder.store.backend
        begin = backend.begin

        async def begin_and_pause_step_0(snapshot_id: str, **options: bool):
            writer = await begin(snapshot_id, **options)
            commit = writer.commit

            async def paused_commit(document: bytes) -> None:
                if json.loads(document)["attributes"]["gradvault"]["step"] == 0:
                    self.reached.set()
                    await asyncio.to_thread(self.go.wait, 60)
                await commit(document)

            writer.commit = paused_commit
            return writer

        backend.begin = begin_and_pause_step_0


@pytest.fixture
def recorders(tmp_path: Path) -> Iterator[Callable[..., Recorder]]:
    made: list[Recorder] = []

    def factory(**options: object) -> Recorder:
        recorder = Recorder(tmp_path / "store", chunk_bytes=4096, pack_threshold=512, **options)
        recorder.sync.snapshot(make_grads(0), run="warm-up", step=0)  # the folders exist
        made.append(recorder)
        return recorder

    yield factory
    for recorder in made:
        recorder.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_queued_snapshots_commit_in_start_order_each_durable_before_its_handle(
    recorders, tmp_path: Path, monkeypatch
) -> None:
    recorder = recorders()
    pause = PausedFirstCommit(recorder)
    events = record_fsyncs_and_renames(monkeypatch)
    sets = [make_grads(seed) for seed in range(1, 6)]
    handles = []

    def start_all() -> None:
        handles.extend(
            recorder.start_snapshot(grads, run="q", step=step) for step, grads in enumerate(sets)
        )

    starter = threading.Thread(target=start_all)
    starter.start()
    starter.join(60)
    # every start_snapshot returned while the first commit is held: they were queued
    assert not starter.is_alive() and len(handles) == len(sets)
    assert pause.reached.wait(60)
    assert not any(handle.done() for handle in handles)  # none passes the first
    pause.go.set()

    snapshots = str(tmp_path.resolve() / "store" / "snapshots")
    staging = str(tmp_path.resolve() / "store" / ".staging")
    infos = []
    for handle in handles:
        info = handle.result(60)
        seen = list(events)  # what had happened when the handle completed
        renamed = seen.index(("rename", str(tmp_path / "store" / ".staging" / info.id)))
        # both folders the rename changed: its new name and its old one gone
        for folder in (snapshots, staging):
            assert ("fsync", folder) in seen[renamed + 1 :], "handle completed before durable"
        infos.append(info)
    monkeypatch.undo()

    ids = [info.id for info in infos]
    assert ids == sorted(ids)  # minted in start order
    assert [info.step for info in infos] == list(range(len(sets)))
    renames = [path for kind, path in events if kind == "rename" and ".staging" in path]
    assert [Path(path).name for path in renames] == ids  # visible in start order
    listed = {info.id for info in recorder.sync.list(run="q")}
    assert listed == set(ids)
    for info, grads in zip(infos, sets, strict=True):
        assert grads_bytes(recorder.sync.restore(info.id)) == grads_bytes(grads)


@pytest.mark.parametrize("bound", [0, NBYTES + NBYTES // 2])
def test_a_snapshot_that_does_not_fit_the_queue_waits_for_room(recorders, bound: int) -> None:
    recorder = recorders(max_pending_bytes=bound)
    pause = PausedFirstCommit(recorder)
    first = recorder.start_snapshot(make_grads(1), run="b", step=0)
    assert pause.reached.wait(60)
    second_grads = make_grads(2)
    second = []
    waiter = threading.Thread(
        target=lambda: second.append(recorder.start_snapshot(second_grads, run="b", step=1))
    )
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not second  # both together exceed the bound
    assert not first.done()
    pause.go.set()
    waiter.join(60)
    infos = [first.result(60), second[0].result(60)]
    assert infos[0].id < infos[1].id
    assert grads_bytes(recorder.sync.restore(infos[1].id)) == grads_bytes(second_grads)


def test_a_failed_queued_snapshot_holds_up_none_after_it(recorders) -> None:
    recorder = recorders()
    pause = PausedFirstCommit(recorder)
    backend = recorder.store.backend
    begin = backend.begin

    async def begin_failing_the_marked_one(snapshot_id: str, **options: bool):
        writer = await begin(snapshot_id, **options)
        write_array = writer.write_array

        async def full_disk_for_the_marked(name, metadata, chunks) -> None:
            if b'"marked"' in metadata:  # an own array's document holds its name
                raise OSError(28, "No space left on device (injected)")
            await write_array(name, metadata, chunks)

        writer.write_array = full_disk_for_the_marked
        return writer

    backend.begin = begin_failing_the_marked_one
    sets = [make_grads(seed) for seed in (7, 8, 9)]
    marked = GradientsParams()
    for pid in sets[1]:
        marked.register(pid, sets[1].get(pid), name="marked")
    sets[1] = marked
    handles = [recorder.start_snapshot(g, run="f", step=s) for s, g in enumerate(sets)]
    assert pause.reached.wait(60)
    pause.go.set()
    first, third = handles[0].result(60), handles[2].result(60)
    with pytest.raises(StoreUnavailableError, match="No space left"):
        handles[1].result(60)
    assert [info.id for info in recorder.sync.list(run="f")] == [third.id, first.id]
    assert grads_bytes(recorder.sync.restore(third.id)) == grads_bytes(sets[2])


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_max_pending_bytes_is_checked(tmp_path: Path, bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="max_pending_bytes"):
        Recorder(tmp_path / "store", max_pending_bytes=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "store").exists()


async def settle() -> None:
    """Let every task that can run do so (a few loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_commit_order_lets_each_turn_pass_only_after_every_earlier_one() -> None:
    order = CommitOrder()
    turns = [order.take() for _ in range(4)]
    assert [t.snapshot_id for t in turns] == sorted(t.snapshot_id for t in turns)
    assert len({t.snapshot_id for t in turns}) == 4
    passed: list[int] = []

    async def go(index: int) -> None:
        await turns[index].wait()
        passed.append(index)

    tasks = [asyncio.ensure_future(go(i)) for i in (3, 2, 1, 0)]
    await settle()
    assert passed == [0]  # the first turn waits for nothing
    turns[2].release()  # released early (a failed write): passes nobody yet
    turns[2].release()  # again: nothing changes
    await settle()
    assert passed == [0]
    turns[0].release()
    await settle()
    assert sorted(passed) == [0, 1]  # turn 2 still waits for turn 1
    turns[1].release()
    await asyncio.gather(*tasks)
    assert sorted(passed) == [0, 1, 2, 3]
    later = order.take()
    turns[3].release()
    await asyncio.wait_for(later.wait(), 60)


def test_queued_snapshots_become_visible_in_start_order_on_every_store(
    store_url: str, connection_options: dict[str, object], monkeypatch
) -> None:
    """The same order on S3, where the manifest PUT makes a snapshot visible."""
    with Recorder(store_url, **connection_options) as recorder:
        recorder.sync.snapshot(make_grads(0), run="warm-up", step=0)
        pause = PausedFirstCommit(recorder)
        backend = recorder.store.backend
        visible: list[str] = []
        if store_url.startswith("s3://"):
            put = backend.put

            async def recording_put(key: str, body, **options):
                result = await put(key, body, **options)
                parts = key.split("/")
                if parts[-1] == "zarr.json" and parts[-3] == "snapshots":
                    visible.append(parts[-2])
                return result

            backend.put = recording_put
        else:
            real_rename = os.rename

            def recording_rename(source, destination) -> None:
                real_rename(source, destination)
                if Path(destination).parent.name == "snapshots":
                    visible.append(Path(destination).name)

            monkeypatch.setattr(os, "rename", recording_rename)
        sets = [make_grads(seed) for seed in range(11, 15)]
        handles = [recorder.start_snapshot(g, run="o", step=s) for s, g in enumerate(sets)]
        assert pause.reached.wait(60)
        assert not any(handle.done() for handle in handles)
        pause.go.set()
        ids = [handle.result(60).id for handle in handles]
        monkeypatch.undo()
        assert ids == sorted(ids)
        assert visible == ids
        assert [info.id for info in recorder.sync.list(run="o")] == ids[::-1]
        for snapshot_id, grads in zip(ids, sets, strict=True):
            assert grads_bytes(recorder.sync.restore(snapshot_id)) == grads_bytes(grads)


def test_a_turn_released_from_another_thread_wakes_its_waiter_on_the_loop() -> None:
    order = CommitOrder()
    first, second = order.take(), order.take()

    async def wait_for_second() -> bool:
        waiting = asyncio.ensure_future(second.wait())
        await asyncio.sleep(0)
        assert not waiting.done()
        releaser = threading.Thread(target=first.release)
        releaser.start()
        await asyncio.wait_for(waiting, 30)
        releaser.join()
        return second.is_open()

    assert asyncio.run(wait_for_second())
