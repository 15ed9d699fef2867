"""Recorder: snapshot, restore, backpressure, sync facade and point in time, on both stores."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams, ParamId, Recorder, RecorderError, SnapshotBusyError
from gradvault.core.autodiff.tensor import wrap
from gradvault.core.store import recorder as recorder_module


@pytest.fixture
def recorder_factory(
    store_url: str, connection_options: dict[str, object]
) -> Iterator[Callable[..., Recorder]]:
    made: list[Recorder] = []

    def factory(**options: object) -> Recorder:
        recorder = Recorder(store_url, **connection_options, **options)
        made.append(recorder)
        return recorder

    yield factory
    for recorder in made:
        recorder.close()


def _grads(seed: int, shapes: list[tuple[int, ...]], dtype: str = "float32") -> GradientsParams:
    rng = np.random.default_rng(seed)
    grads = GradientsParams()
    for index, shape in enumerate(shapes):
        array = rng.standard_normal(shape).astype(dtype)
        grads.register(ParamId(), wrap(array), name=f"layer{index}.weight")
    return grads


def _bytes(grads: GradientsParams) -> dict[ParamId, bytes]:
    return {pid: grads.get(pid).numpy().tobytes() for pid in grads}


SHAPES = [(), (0,), (1,), (7,), (33, 17), (3, 4, 5), (256, 300), (2, 1, 1, 3)]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_sync_snapshot_and_restore_are_bit_identical(recorder_factory, dtype: str) -> None:
    recorder = recorder_factory()
    grads = _grads(1, SHAPES, dtype)
    info = recorder.start_snapshot(grads, run="r", step=3, tags={"why": "test"}).result()
    assert info.run == "r" and info.step == 3 and info.num_params == len(SHAPES)
    assert info.nbytes == sum(grads.get(pid).numpy().nbytes for pid in grads)
    restored = recorder.sync.restore(info.id, "cpu")
    assert _bytes(restored) == _bytes(grads)
    assert [restored.name(pid) for pid in restored] == [grads.name(pid) for pid in grads]
    assert [s.id for s in recorder.sync.list()] == [info.id]
    manifest = recorder.sync.info(info.id)
    assert manifest["tags"] == {"why": "test"}


async def test_async_snapshot_list_info_delete(recorder_factory) -> None:
    recorder = recorder_factory()
    infos = [
        await recorder.snapshot(_grads(s, [(4, 4)]), run="a" if s % 2 else "b", step=s)
        for s in range(4)
    ]
    listed = await recorder.list()
    assert [s.id for s in listed] == [i.id for i in reversed(infos)]
    assert [s.step for s in await recorder.list(run="a")] == [3, 1]
    assert [s.step for s in await recorder.list(step_min=1, step_max=2)] == [2, 1]
    await recorder.delete(infos[0].id)
    assert infos[0].id not in {s.id for s in await recorder.list()}
    with pytest.raises(gv.SnapshotNotFoundError):
        await recorder.restore(infos[0].id)
    restored = await recorder.restore(infos[1].id)
    assert len(restored) == 1


async def test_point_in_time_while_the_commit_streams(recorder_factory) -> None:
    recorder = recorder_factory(chunk_bytes=1 << 16)
    gv.manual_seed(0)
    model = gv.MLP(64, [256, 256], 8)
    x, y = gv.randn(32, 64), gv.tensor(np.arange(32) % 8)
    accumulator = gv.GradientsAccumulator()

    def micro_batch() -> None:
        loss = gv.cross_entropy(model(x), y)
        accumulator.accumulate(model, GradientsParams.from_grads(loss.backward(), model))

    micro_batch()
    current = accumulator.current()
    expected = _bytes(current)
    handle = recorder.start_snapshot(current, run="pit", step=0)
    steps = 0
    while not handle.done() or steps < 3:  # keep training on the same gradients
        micro_batch()
        steps += 1
        await asyncio.sleep(0)
    info = await handle
    assert _bytes(accumulator.current()) != expected
    restored = await recorder.restore(info.id)
    assert _bytes(restored) == expected


def test_busy_reject_policy_raises_and_keeps_the_first(recorder_factory) -> None:
    recorder = recorder_factory(on_busy="reject")
    big = _grads(2, [(1024, 1024)] * 8)
    first = recorder.start_snapshot(big, run="busy", step=0)
    rejected = 0
    while not first.done():
        try:
            recorder.start_snapshot(_grads(3, [(2,)]), run="busy", step=1).result()
        except SnapshotBusyError as error:
            assert "on_busy" in str(error)
            rejected += 1
            break
    info = first.result()
    assert _bytes(recorder.sync.restore(info.id)) == _bytes(big)
    # once the first has committed, a new snapshot is accepted
    second = recorder.start_snapshot(_grads(3, [(2,)]), run="busy", step=1).result()
    assert {s.id for s in recorder.sync.list()} >= {info.id, second.id}
    assert rejected in (0, 1)  # 0 only when the first commit beat the loop above


def test_busy_wait_policy_commits_both(recorder_factory) -> None:
    recorder = recorder_factory(on_busy="wait")
    a, b = _grads(4, [(512, 512)] * 4), _grads(5, [(512, 512)] * 4)
    handle_a = recorder.start_snapshot(a, run="wait", step=0)
    handle_b = recorder.start_snapshot(b, run="wait", step=1)
    info_a, info_b = handle_a.result(), handle_b.result()
    assert info_a.id < info_b.id
    assert _bytes(recorder.sync.restore(info_a.id)) == _bytes(a)
    assert _bytes(recorder.sync.restore(info_b.id)) == _bytes(b)


async def test_sync_facade_inside_a_running_loop_raises(recorder_factory) -> None:
    recorder = recorder_factory()
    with pytest.raises(RecorderError, match="await recorder.list"):
        recorder.sync.list()


def test_retention_runs_after_each_commit(recorder_factory) -> None:
    recorder = recorder_factory(keep_last=2)
    ids = [recorder.sync.snapshot(_grads(s, [(3,)]), run="keep", step=s).id for s in range(5)]
    assert [s.id for s in recorder.sync.list()] == ids[::-1][:2]


def test_snapshot_arguments_are_checked(recorder_factory) -> None:
    recorder = recorder_factory()
    with pytest.raises(ValueError, match="run"):
        recorder.start_snapshot(_grads(0, [(1,)]), run="", step=0)
    with pytest.raises(ValueError, match="step"):
        recorder.start_snapshot(_grads(0, [(1,)]), run="x", step=-1)


async def test_concurrent_async_snapshots_commit_one_at_a_time(recorder_factory) -> None:
    recorder = recorder_factory(on_busy="wait")
    sets = [_grads(10 + i, [(256, 512)] * 4) for i in range(3)]
    infos = await asyncio.gather(
        *(recorder.snapshot(g, run="many", step=i) for i, g in enumerate(sets))
    )
    assert len({info.id for info in infos}) == 3
    for info, grads in zip(infos, sets, strict=True):
        assert _bytes(await recorder.restore(info.id)) == _bytes(grads)


async def test_aclose_waits_for_every_snapshot_in_flight(recorder_factory) -> None:
    recorder = recorder_factory(on_busy="wait")
    tasks = [
        asyncio.ensure_future(
            recorder.snapshot(_grads(20 + i, [(512, 512)] * 4), run="close", step=i)
        )
        for i in range(3)
    ]
    await asyncio.sleep(0)
    await recorder.aclose()
    infos = await asyncio.gather(*tasks, return_exceptions=True)
    committed = [i for i in infos if not isinstance(i, BaseException)]
    refused = [i for i in infos if isinstance(i, BaseException)]
    assert committed  # the first was in flight and committed
    assert all(isinstance(error, RecorderError) and "closed" in str(error) for error in refused)


def test_a_closed_recorder_refuses_new_work(recorder_factory) -> None:
    recorder = recorder_factory()
    recorder.close()
    with pytest.raises(RecorderError, match="closed"):
        recorder.start_snapshot(_grads(0, [(2,)]), run="x", step=0)
    with pytest.raises(RecorderError, match="closed"):
        recorder.sync.list()


def test_a_failing_retention_does_not_hide_the_commit(recorder_factory, caplog) -> None:
    recorder = recorder_factory(keep_last=1)
    store = recorder.store

    async def broken(*args: object, **kwargs: object) -> list[str]:
        raise gv.StoreUnavailableError("delete failed (injected)")

    store.apply_retention = broken  # unit-level fault injection
    with caplog.at_level("WARNING", logger="gradvault.recorder"):
        info = recorder.sync.snapshot(_grads(1, [(3,)]), run="keep", step=0)
    assert [s.id for s in recorder.sync.list()] == [info.id]
    assert "retention failed" in caplog.text and "injected" in caplog.text


def test_a_commit_the_caller_waits_for_starts_without_the_hand_back_delay(
    recorder_factory, monkeypatch
) -> None:
    """A commit waits before its first step so that start_snapshot returns first, unless
    its caller waits for it: ``result()`` (and ``await``) let it start at once. With the
    delay made an hour, the waited-for commits still finish; one nobody waits for does
    not start."""
    monkeypatch.setattr(recorder_module, "_HANDBACK_SECONDS", 3600.0)
    recorder = recorder_factory()
    grads = _grads(5, [(64, 40), (300,)])
    info = recorder.start_snapshot(grads, run="r", step=0).result(timeout=60)
    assert info.step == 0

    async def awaited() -> int:
        return (await recorder.snapshot(grads, run="r", step=1)).step

    assert asyncio.run(asyncio.wait_for(awaited(), 60)) == 1
    idle = recorder.start_snapshot(grads, run="r", step=2)
    time.sleep(0.5)
    assert not idle.done()  # an hour before its first step
    assert idle.result(timeout=60).step == 2  # waiting for it now starts it
    assert sorted(info.step for info in recorder.sync.list()) == [0, 1, 2]


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer")
def test_a_snapshot_waited_for_in_a_signal_handler_commits_while_another_is_waited_for(
    recorder_factory, monkeypatch
) -> None:
    """A SIGTERM-style handler that snapshots and waits, arriving while the main thread
    waits in ``result()`` for a slow commit, gets its snapshot: the commit it interrupted
    goes on in the recorder's thread, so neither waits for the other forever."""
    recorder = recorder_factory()
    grads = _grads(7, [(64, 40), (300,)])
    recorder.start_snapshot(grads, run="r", step=0).result()  # the store's folders made
    store = recorder.store
    write = store.write_snapshot_blocking

    def slow(*args: object, **kwargs: object) -> object:
        time.sleep(0.5)  # unit-level fault injection: a slow disk
        return write(*args, **kwargs)

    monkeypatch.setattr(store, "write_snapshot_blocking", slow)
    in_handler: list[object] = []

    def handler(signum: int, frame: object) -> None:
        try:
            in_handler.append(recorder.start_snapshot(grads, run="r", step=2).result(timeout=10))
        except BaseException as error:  # noqa: BLE001 - asserted below
            in_handler.append(error)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)  # during the first commit's wait
        # no timeout: the wait a training loop makes (the handler's own is bounded)
        waited = recorder.start_snapshot(grads, run="r", step=1).result()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert waited.step == 1
    assert len(in_handler) == 1 and getattr(in_handler[0], "step", in_handler[0]) == 2
    assert sorted(info.step for info in recorder.sync.list()) == [0, 1, 2]


def test_an_interrupt_inside_a_commit_is_raised_by_result_and_holds_up_no_later_one(
    recorder_factory, monkeypatch
) -> None:
    """A KeyboardInterrupt raised inside a commit (in the recorder's commit thread) is
    raised by ``result()``; nothing of that snapshot is committed, and the next commits."""
    recorder = recorder_factory()
    grads = _grads(8, [(64, 40), (300,)])
    first = recorder.start_snapshot(grads, run="r", step=0).result()
    store = recorder.store
    write = store.write_snapshot_blocking

    def interrupted(*args: object, **kwargs: object) -> object:
        raise KeyboardInterrupt  # unit-level fault injection: Ctrl-C during the write

    monkeypatch.setattr(store, "write_snapshot_blocking", interrupted)
    with pytest.raises(KeyboardInterrupt):
        recorder.start_snapshot(grads, run="r", step=1).result()
    monkeypatch.setattr(store, "write_snapshot_blocking", write)
    after = recorder.start_snapshot(grads, run="r", step=2).result()
    assert [info.step for info in recorder.sync.list()] == [2, 0]
    assert [first.id, after.id] == sorted([first.id, after.id])


def test_a_handle_waited_for_after_close_gives_its_snapshot(recorder_factory) -> None:
    """close() lets every commit in flight finish; their handles, waited for afterwards (in
    sync or async code), give the committed snapshots, not an error about the closed loop."""
    recorder = recorder_factory()
    grads = _grads(6, [(64, 40), (300,)])
    handles = [recorder.start_snapshot(grads, run="r", step=step) for step in range(3)]
    recorder.close()
    assert [handle.result(timeout=60).step for handle in handles[:2]] == [0, 1]

    async def awaited() -> int:
        return (await handles[2]).step

    assert asyncio.run(awaited()) == 2
