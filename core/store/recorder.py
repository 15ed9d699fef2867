"""Recorder: snapshots gradients into a store in the background, and restores them.

The async API is the source of truth and runs every store operation on the recorder's
own event loop, in a background thread, so that the store is bound to one loop whatever
the caller does. ``start_snapshot`` captures the gradients in the caller's thread (a
copy-on-write capture whose cost grows with the number of parameters) and returns a
``SnapshotHandle`` at once; the encoding, checksums and writes happen in the background.
``recorder.sync`` is the blocking facade for plain training loops.
"""

from __future__ import annotations

import asyncio
import builtins  # builtins.list in annotations: inside the classes, list is a method
import concurrent.futures
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from ..autodiff import backend as array_backend
from ..autodiff.gradients_params import GradientsCapture, GradientsParams
from ..errors import (
    InvalidArgumentError,
    InvalidArgumentTypeError,
    RecorderError,
    SnapshotBusyError,
    StoreNotFoundError,
)
from ..records.record import GradientsParamsRecord
from ..records.record_rules import check_snapshot_fields
from . import (
    RetentionRules,
    ShardInfo,
    SnapshotInfo,
    SnapshotStore,
    check_rank,
    open_store,
    parse_compression,
    parse_snapshot_id,
)
from ._commit_order import CommitOrder, CommitTurn
from ._device_snapshot import DeviceSnapshot
from ._device_stream import CupyCopier, RingPool

#: how long a commit waits before its first step, so that start_snapshot returns at once,
#: unless the caller waits for it first (``_HandBack``)
_HANDBACK_SECONDS = 0.002
#: the default bound on the bytes of snapshots captured and not yet committed
DEFAULT_MAX_PENDING_BYTES = 256 << 20

if TYPE_CHECKING:
    from ..autodiff.nn.module import Module

T = TypeVar("T")
R = TypeVar("R", SnapshotInfo, ShardInfo)
_log = logging.getLogger("gradvault.recorder")
BusyPolicy = Literal["wait", "reject"]


class SnapshotHandle(Generic[R]):
    """A snapshot whose capture is done and whose commit may still be running.

    ``handle.result(timeout)`` blocks for the ``SnapshotInfo`` (a shard's ``ShardInfo``);
    ``await handle`` does the same in async code; ``done()`` says whether the commit has
    finished.
    """

    def __init__(
        self,
        future: concurrent.futures.Future[R],
        nbytes: int,
        num_params: int,
        hand_back: _HandBack | None = None,
    ) -> None:
        self._future: concurrent.futures.Future[R] = future
        self._hand_back = hand_back
        self.nbytes = nbytes
        self.num_params = num_params

    def done(self) -> bool:
        return self._future.done()

    def result(self, timeout: float | None = None) -> R:
        """The committed snapshot's info; re-raises the error if the commit failed."""
        self._waited_for()
        return self._future.result(timeout)

    def __await__(self) -> Generator[Any, None, R]:
        self._waited_for()
        return asyncio.wrap_future(self._future).__await__()

    def _waited_for(self) -> None:
        """The caller waits: nothing left to hand back to, the commit may start at once."""
        if self._hand_back is not None and not self._future.done():
            self._hand_back.now()


class _HandBack:
    """When a commit takes its first step: ``_HANDBACK_SECONDS`` after its launch, so that
    the caller's thread has the interpreter while ``start_snapshot`` returns, or as soon as
    the caller waits for the commit (its thread is then blocked, competing for nothing).

    ``now`` may be called from any thread; ``wait`` runs on the recorder's loop, or, for a
    commit in the recorder's commit thread (made with no loop), ``wait_blocking`` there.
    """

    __slots__ = ("_loop", "_waiter", "_asked", "_asked_event")

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._waiter: asyncio.Future[None] | None = None
        self._asked = False
        self._asked_event = threading.Event()

    def now(self) -> None:
        """The caller waits for the commit: let it start at once."""
        if not self._asked:
            self._asked = True
            self._asked_event.set()
            if self._loop is None:
                return
            try:
                self._loop.call_soon_threadsafe(self._release)
            except RuntimeError:  # the loop is closed: the recorder saw every commit end
                pass

    def wait_blocking(self) -> None:
        """Return once the commit may take its first step (in the commit's own thread)."""
        self._asked_event.wait(_HANDBACK_SECONDS)

    def _release(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Return once the commit may take its first step."""
        if self._asked:
            return
        assert self._loop is not None, "a hand-back made with no loop is waited for blocking"
        # on the loop, with no await before the waiter exists: a ``now`` from here on
        # schedules a ``_release`` that finds it
        self._waiter = self._loop.create_future()
        timer = self._loop.call_later(_HANDBACK_SECONDS, self._release)
        try:
            await self._waiter
        finally:
            timer.cancel()


class Recorder:
    """Snapshots and restores gradients against a store (a store object, a path or a URL).

    ``on_busy`` chooses what a snapshot started while another is committing does: "wait"
    (queue it behind the ones in flight, as long as their bytes together stay within
    ``max_pending_bytes``, else wait for room), or "reject" with ``SnapshotBusyError``.
    Queued snapshots are written alongside each other (their fsyncs share the file
    system's journal commits) and become visible in the order they were started; each
    handle completes once its snapshot is durable. ``keep_last`` / ``keep_every`` apply the
    retention policy to the snapshot's run after each commit: ``keep_last`` counts by id
    (creation order), the newest snapshot is never deleted, and neither is the one whose
    commit the pass follows. Bad values raise InvalidArgumentError (a ValueError) or
    InvalidArgumentTypeError (a TypeError) here, not at the first commit.
    """

    def __init__(
        self,
        store: SnapshotStore | str | os.PathLike[str],
        *,
        on_busy: BusyPolicy = "wait",
        keep_last: int | None = None,
        keep_every: int | None = None,
        compression: str | None = None,
        max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
        **store_options: Any,
    ) -> None:
        if on_busy not in ("wait", "reject"):
            raise InvalidArgumentError(f"on_busy must be 'wait' or 'reject'; got {on_busy!r}")
        if type(max_pending_bytes) is not int or max_pending_bytes < 0:
            raise InvalidArgumentError(
                f"max_pending_bytes must be an int >= 0 (0: one snapshot at a time); "
                f"got {max_pending_bytes!r}"
            )
        try:
            parse_compression(compression)
        except ValueError as error:
            raise InvalidArgumentError(str(error)) from None
        self._retention = RetentionRules(keep_last, keep_every)
        # opening reads and creates nothing; it refuses a malformed URL or option here
        self._store = (
            store if isinstance(store, SnapshotStore) else open_store(store, **store_options)
        )
        self.on_busy = on_busy
        self.keep_last, self.keep_every = self._retention.keep_last, self._retention.keep_every
        self.compression = compression
        self.max_pending_bytes = max_pending_bytes
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="gradvault-recorder", daemon=True
        )
        self._thread.start()
        #: the thread a small snapshot launched with nothing in flight commits in, from
        #: start to end, with no trip through the loop (``_commit_blocking``)
        self._commit_thread = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="gradvault-commit"
        )
        # started here, not by the first snapshot: a thread's start waits until the new
        # thread runs, which with a training step's BLAS threads on both cores took
        # 1.6-2.1 ms of the first start_snapshot call (later calls: 0.22 ms)
        self._commit_thread.submit(_nothing)
        #: every commit launched and not finished, with its captured bytes
        self._inflight: dict[concurrent.futures.Future[Any], int] = {}
        #: the commit launched last, and whether it is a shard's
        self._last: tuple[concurrent.futures.Future[Any], bool] | None = None
        self._order = CommitOrder()
        self._lock = threading.RLock()  # a done callback may run inside it
        self._closed = False
        #: per CUDA device, the rings its gradients are streamed to host through
        self._ring_pools: dict[str, RingPool] = {}
        self.sync = SyncRecorder(self)

    # ------------------------------------------------------------------ plumbing
    @property
    def store(self) -> SnapshotStore:
        """The SnapshotStore this recorder writes to and reads from."""
        return self._store

    def _existing_store(self) -> SnapshotStore:
        """The store, for a read: a local store folder that does not exist is an error.

        Only a snapshot creates the folder, so a mistyped path raises StoreNotFoundError
        instead of reading as a store without snapshots.
        """
        location = self._store.location
        if "://" not in location and not os.path.isdir(location):
            raise StoreNotFoundError(
                f"no store folder at {location}; a snapshot creates it, a read does not "
                "(is the path right?)"
            )
        return self._store

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self._closed:
            coro.close()
            raise RecorderError("the recorder is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _read(self, operation: Callable[[SnapshotStore], Awaitable[T]]) -> T:
        """Run ``operation(store)`` on the recorder's loop, once the store is known to exist."""

        async def run() -> T:
            return await operation(self._existing_store())

        return await asyncio.wrap_future(self._submit(run()))

    # ------------------------------------------------------------------ snapshots
    def _in_flight(self) -> list[concurrent.futures.Future[Any]]:
        with self._lock:
            return [future for future in self._inflight if not future.done()]

    def _finished(self, future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._inflight.pop(future, None)

    def _try_launch(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        commit: _Commit[R],
        shard: bool,
        captured: GradientsCapture | GradientsParamsRecord | None = None,
        blocking: _BlockingCommit | None = None,
    ) -> tuple[SnapshotHandle[R] | None, GradientsCapture | GradientsParamsRecord]:
        """Capture (unless ``captured`` is given) and launch the commit if there is room.

        Returns the handle, or None and the capture while the snapshots in flight leave
        no room for it: a snapshot enters the queue when nothing is in flight, or when
        its bytes and theirs together stay within ``max_pending_bytes``. The bound is
        what the queue holds in memory (each capture keeps its gradients' buffers).

        With ``blocking`` (a whole snapshot's commit in one step, in the calling thread),
        host gradients launched while nothing is in flight are committed by it in the
        recorder's commit thread (``_commit_blocking``); ``commit`` writes them on the
        loop where ``blocking`` does not take them.
        """
        with self._lock:
            if self._closed:
                raise RecorderError("the recorder is closed")
            pending = [nbytes for future, nbytes in self._inflight.items() if not future.done()]
            if pending and self.on_busy == "reject":
                raise SnapshotBusyError(
                    "a snapshot is still committing and this recorder rejects new ones "
                    "while busy (on_busy='reject'); wait for its handle or use "
                    "on_busy='wait'"
                )
            if captured is None:
                captured = _capture(grads)
            nbytes, count = captured.nbytes, len(captured)  # before the commit competes for the GIL
            if pending and not (
                self.max_pending_bytes and sum(pending) + nbytes <= self.max_pending_bytes
            ):
                return None, captured
            previous = self._last
            # a shard is published alone, after every commit started before it: no turn
            turn = None if shard else self._order.take()
            future: concurrent.futures.Future[Any]
            if blocking is not None and turn is not None and not pending and _on_host(captured):
                # nothing in flight: its turn is open, no other commit to wait for
                hand_back = _HandBack(None)
                future = concurrent.futures.Future()
                self._commit_thread.submit(
                    self._commit_blocking, blocking, commit, captured, turn, hand_back, future
                )
            else:
                hand_back = _HandBack(self._loop)
                future = self._submit(commit(captured, _Queued(turn, previous, hand_back)))
            self._inflight[future] = nbytes
            self._last = (future, shard)
            future.add_done_callback(self._finished)
            return SnapshotHandle(future, nbytes, count, hand_back), captured

    async def _commit(
        self,
        captured: GradientsCapture | GradientsParamsRecord,
        queued: _Queued,
        run: str,
        step: int,
        tags: dict[str, str],
    ) -> SnapshotInfo:
        turn = queued.turn
        assert turn is not None  # every whole snapshot takes one (_try_launch)
        with turn.held():  # released even if no write starts (the record cannot be built)
            await queued.after_shard()
            record = await self._write_source(captured, queued.hand_back)
            info = await self._store.write_snapshot(
                record,
                run=run,
                step=step,
                tags=tags,
                device=_device_of(record),
                compression=self.compression,
                turn=turn,
            )
        # handles complete, and retention passes run, in the order snapshots were started
        await queued.after_previous()
        await self._retain(info, run)
        return info

    def _commit_blocking(
        self,
        blocking: _BlockingCommit,
        commit: _Commit[Any],
        captured: GradientsCapture | GradientsParamsRecord,
        turn: CommitTurn,
        hand_back: _HandBack,
        future: concurrent.futures.Future[Any],
    ) -> None:
        """Commit ``captured`` in this thread (the recorder's commit thread) with
        ``blocking``, then run the retention pass on the loop; ``future`` gets the info.

        A snapshot that ``blocking`` does not take (not one step: large, compressed, or a
        store that commits nothing so) is handed to the loop as ``commit``, in the same
        turn.
        """
        try:
            hand_back.wait_blocking()
            record = (
                captured if isinstance(captured, GradientsParamsRecord) else captured.to_record()
            )
            info = blocking(record, turn)
        except BaseException as error:  # noqa: BLE001 - the handle raises it
            turn.release()  # a failed write holds up no later one
            future.set_exception(error)
            return
        if info is None:  # written on the loop, whose commit holds the turn from here on
            handed_back = _HandBack(self._loop)
            handed_back.now()  # waited for here already
            queued = _Queued(turn, None, handed_back)
            written = asyncio.run_coroutine_threadsafe(commit(record, queued), self._loop)
            _chain(written, future)
            return
        turn.release()  # visible: later snapshots may become visible too
        if self._retention.keeps_everything:
            future.set_result(info)
            return
        retained = asyncio.run_coroutine_threadsafe(self._retain(info, info.run), self._loop)
        retained.add_done_callback(lambda _: future.set_result(info))

    async def _commit_shard(
        self,
        captured: GradientsCapture | GradientsParamsRecord,
        queued: _Queued,
        shard: tuple[str, int, int],
        run: str,
        step: int,
        tags: dict[str, str],
    ) -> ShardInfo:
        # a shard is published alone: after every commit started before it
        await queued.after_previous()
        record = await self._write_source(captured, queued.hand_back)
        snapshot_id, rank, world_size = shard
        written = await self._store.write_shard(
            record,
            snapshot_id=snapshot_id,
            rank=rank,
            world_size=world_size,
            run=run,
            step=step,
            tags=tags,
            device=_device_of(record),
            compression=self.compression,
        )
        if written.snapshot is not None:  # this rank's call completed the snapshot
            await self._retain(written.snapshot, run)
        return written

    async def _write_source(
        self, captured: GradientsCapture | GradientsParamsRecord, hand_back: _HandBack
    ) -> GradientsParamsRecord | DeviceSnapshot:
        """What the store writes: a host record, or the capture still on its CUDA device.

        Gradients on one CUDA device are not read to host whole: the store streams each
        large one chunk by chunk through this recorder's ring pool for the device (host
        memory bounded by the pool), and reads only the small ones to host.
        """
        device = captured.device if isinstance(captured, GradientsCapture) else "cpu"
        if device == "cpu" or "," in device:  # host arrays, or several devices: read whole
            return await _host_record(captured, hand_back)
        assert isinstance(captured, GradientsCapture)
        pool = self._ring_pools.get(device)
        if pool is None:
            index = array_backend.device(device).index or 0
            pool = RingPool(CupyCopier(index), slot_bytes=self._store.chunk_bytes)
            self._ring_pools[device] = pool
        await hand_back.wait()  # as _host_record: let start_snapshot return
        ids, names, arrays = zip(*captured.entries, strict=True) if len(captured) else ((), (), ())
        return DeviceSnapshot.of(ids, names, arrays, pool, {"device": device})

    async def _retain(self, info: SnapshotInfo, run: str) -> None:
        """The retention pass after ``info``'s commit; a failure is logged, not raised."""
        if not self._retention.keeps_everything:
            try:
                await self._store.apply_retention(
                    self.keep_last, self.keep_every, run=run, keep=[info.id]
                )
            except Exception as error:  # the snapshot itself is committed
                _log.warning(
                    "snapshot %s committed; retention failed: %s: %s",
                    info.id,
                    type(error).__name__,
                    error,
                )

    def start_snapshot(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> SnapshotHandle[SnapshotInfo]:
        """Capture ``grads`` now and commit them in the background; returns once capture is safe.

        Nothing training does after this returns changes what is written. With
        ``on_busy="wait"`` this blocks only while the snapshots still committing leave no
        room for this one within ``max_pending_bytes`` (in async code, ``await
        recorder.snapshot(...)`` waits without blocking the loop).
        """
        run, step, plain_tags = check_snapshot_fields(run, step, tags)  # before the capture
        return self._launch_blocking(
            grads,
            lambda captured, queued: self._commit(captured, queued, run, step, plain_tags),
            blocking=self._blocking_commit(run, step, plain_tags),
        )

    def _launch_blocking(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        commit: _Commit[R],
        shard: bool = False,
        blocking: _BlockingCommit | None = None,
    ) -> SnapshotHandle[R]:
        handle, captured = self._try_launch(grads, commit, shard, blocking=blocking)
        while handle is None:
            concurrent.futures.wait(
                self._in_flight(), return_when=concurrent.futures.FIRST_COMPLETED
            )
            handle, captured = self._try_launch(grads, commit, shard, captured, blocking)
        return handle

    async def _launch_waiting(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        commit: _Commit[R],
        shard: bool = False,
        blocking: _BlockingCommit | None = None,
    ) -> R:
        handle, captured = self._try_launch(grads, commit, shard, blocking=blocking)
        while handle is None:
            busy = self._in_flight()
            if busy:
                await asyncio.wait(
                    [asyncio.wrap_future(future) for future in busy],
                    return_when=asyncio.FIRST_COMPLETED,
                )
            handle, captured = self._try_launch(grads, commit, shard, captured, blocking)
        return await handle

    def _blocking_commit(self, run: str, step: int, tags: dict[str, str]) -> _BlockingCommit:
        """The store's one-step commit of a snapshot of ``run``/``step``/``tags`` in the
        calling thread (``SnapshotStore.write_snapshot_blocking``)."""

        def commit(record: GradientsParamsRecord, turn: CommitTurn) -> SnapshotInfo | None:
            return self._store.write_snapshot_blocking(
                record,
                run=run,
                step=step,
                tags=tags,
                device=_device_of(record),
                compression=self.compression,
                turn=turn,
            )

        return commit

    async def snapshot(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> SnapshotInfo:
        """Capture and commit ``grads``; returns the committed snapshot's info."""
        run, step, plain_tags = check_snapshot_fields(run, step, tags)  # before the capture
        return await self._launch_waiting(
            grads,
            lambda captured, queued: self._commit(captured, queued, run, step, plain_tags),
            blocking=self._blocking_commit(run, step, plain_tags),
        )

    def start_snapshot_shard(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> SnapshotHandle[ShardInfo]:
        """Capture ``grads`` now as rank ``rank``'s shard of sharded snapshot ``snapshot_id``
        and write it in the background; the handle's result is a ``ShardInfo``.

        Every rank of ``world_size`` passes the same ``snapshot_id`` (drawn once, e.g. by
        rank 0 with ``new_snapshot_id()``, and shared as the trainer shares other values),
        run, step and tags; the snapshot commits in the call of the rank whose shard
        completes it (docs/FORMAT.md, "Sharded snapshots").
        """
        shard = _checked_shard(snapshot_id, rank, world_size)
        run, step, plain_tags = check_snapshot_fields(run, step, tags)  # before the capture
        return self._launch_blocking(
            grads,
            lambda captured, queued: self._commit_shard(
                captured, queued, shard, run, step, plain_tags
            ),
            shard=True,
        )

    async def snapshot_shard(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> ShardInfo:
        """Capture and write ``grads`` as rank ``rank``'s shard; its ``ShardInfo`` once
        durable (``committed`` says whether the whole snapshot is)."""
        shard = _checked_shard(snapshot_id, rank, world_size)
        run, step, plain_tags = check_snapshot_fields(run, step, tags)  # before the capture
        return await self._launch_waiting(
            grads,
            lambda captured, queued: self._commit_shard(
                captured, queued, shard, run, step, plain_tags
            ),
            shard=True,
        )

    # ------------------------------------------------------------------ reads
    async def restore(
        self,
        snapshot_id: str,
        device: array_backend.Device | str = "cpu",
        *,
        rank: int | None = None,
        module: Module | None = None,
        match: str = "id",
    ) -> GradientsParams:
        """The snapshot's gradients on ``device`` (checksums verified); ``rank`` picks one
        shard of a sharded snapshot."""
        record = await self.fetch(snapshot_id, rank=rank)
        # the record was read for this call alone: its buffers can become the tensors'
        return GradientsParams.from_record(record, device, module=module, match=match, copy=False)

    async def fetch(self, snapshot_id: str, *, rank: int | None = None) -> GradientsParamsRecord:
        """The snapshot (or rank ``rank``'s shard of it) as a record (checksums verified)."""
        return await self._read(lambda store: store.read_snapshot(snapshot_id, rank=rank))

    async def list(
        self, run: str | None = None, step_min: int | None = None, step_max: int | None = None
    ) -> list[SnapshotInfo]:
        """Committed snapshots, newest first."""
        return await self._read(
            lambda store: store.list(run=run, step_min=step_min, step_max=step_max)
        )

    async def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]:
        """The snapshot's manifest (or rank ``rank``'s shard's)."""
        return await self._read(lambda store: store.info(snapshot_id, rank=rank))

    async def delete(self, snapshot_id: str) -> None:
        """Delete one committed snapshot."""
        await self._read(lambda store: store.delete(snapshot_id))

    async def gc(self, grace_seconds: float = 3600.0) -> builtins.list[str]:
        """Remove leftovers of interrupted snapshots older than ``grace_seconds``."""
        return await self._read(lambda store: store.gc(grace_seconds=grace_seconds))

    async def apply_retention(
        self, keep_last: int | None = None, keep_every: int | None = None, run: str | None = None
    ) -> builtins.list[str]:
        """Delete what the retention policy does not keep; returns the deleted ids."""
        return await self._read(lambda store: store.apply_retention(keep_last, keep_every, run=run))

    # ------------------------------------------------------------------ lifetime
    async def aclose(self) -> None:
        """Wait for the snapshot in flight, close the store and stop the background loop."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Blocking form of ``aclose``: no new snapshot starts; those in flight commit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._inflight)
        concurrent.futures.wait(pending)
        self._commit_thread.shutdown()
        asyncio.run_coroutine_threadsafe(self._store.close(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def __aenter__(self) -> Recorder:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Queued:
    """A launched commit's place in the recorder's queue: its turn (the snapshot id and
    the order it becomes visible in; None for a shard) and the commit launched just
    before it."""

    __slots__ = ("turn", "_previous", "hand_back")

    def __init__(
        self,
        turn: CommitTurn | None,
        previous: tuple[concurrent.futures.Future[Any], bool] | None,
        hand_back: _HandBack,
    ) -> None:
        self.turn = turn
        self._previous = previous
        self.hand_back = hand_back

    async def after_previous(self) -> None:
        """Return once the commit launched before this one has finished (either way)."""
        if self._previous is not None:
            future, _ = self._previous
            if not future.done():
                await asyncio.wait([asyncio.wrap_future(future)])

    async def after_shard(self) -> None:
        """Return once a shard launched just before this snapshot has been published."""
        if self._previous is not None and self._previous[1]:
            await self.after_previous()


_Commit = Callable[[GradientsCapture | GradientsParamsRecord, _Queued], Coroutine[Any, Any, R]]
#: A whole snapshot's commit in the calling thread: its info, or None where it is not one
#: step (``SnapshotStore.write_snapshot_blocking``)
_BlockingCommit = Callable[[GradientsParamsRecord, CommitTurn], SnapshotInfo | None]


def _nothing() -> None:
    """A task that only starts the thread it runs in."""


def _on_host(captured: GradientsCapture | GradientsParamsRecord) -> bool:
    """Whether the captured gradients are in host memory already (no device to read)."""
    return isinstance(captured, GradientsParamsRecord) or captured.device == "cpu"


def _chain(source: concurrent.futures.Future[T], target: concurrent.futures.Future[T]) -> None:
    """Give ``target`` the outcome of ``source`` once it has one."""

    def copy(done: concurrent.futures.Future[T]) -> None:
        error = done.exception()
        if error is not None:
            target.set_exception(error)
        else:
            target.set_result(done.result())

    source.add_done_callback(copy)


def _checked_shard(snapshot_id: str, rank: int, world_size: int) -> tuple[str, int, int]:
    """The shard's coordinates, checked before the capture (InvalidArgumentError)."""
    rank, world_size = check_rank(rank, world_size)
    return parse_snapshot_id(snapshot_id), rank, world_size


async def _host_record(
    captured: GradientsCapture | GradientsParamsRecord, hand_back: _HandBack
) -> GradientsParamsRecord:
    """The captured gradients as a host record (device reads in a thread, off the loop)."""
    # The caller's thread still has a few lines to run before start_snapshot returns;
    # waiting here (off the GIL) lets it have the interpreter, not wait for a switch.
    await hand_back.wait()
    if isinstance(captured, GradientsParamsRecord):
        return captured
    return await captured.to_record_async()


def _capture(
    grads: GradientsParams | GradientsParamsRecord,
) -> GradientsCapture | GradientsParamsRecord:
    """The point-in-time capture of ``grads`` (copy-on-write; a record is taken as it is)."""
    if isinstance(grads, GradientsParamsRecord):
        return grads
    if not isinstance(grads, GradientsParams):
        raise InvalidArgumentTypeError(
            f"expected GradientsParams or a record; got {type(grads).__name__}"
        )
    return grads.capture()


class SyncRecorder:
    """Blocking twins of the Recorder's async methods, for plain training loops.

    Calling one from inside a running event loop raises instead of deadlocking.
    """

    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def _run(self, name: str, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise RecorderError(
                f"recorder.sync.{name}() was called from inside a running event loop, where "
                f"it would block the loop; use 'await recorder.{name}(...)' instead"
            )
        return asyncio.run(coro)

    def snapshot(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> SnapshotInfo:
        return self._recorder.start_snapshot(grads, run=run, step=step, tags=tags).result()

    def start_snapshot(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> SnapshotHandle[SnapshotInfo]:
        return self._recorder.start_snapshot(grads, run=run, step=step, tags=tags)

    def snapshot_shard(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> ShardInfo:
        return self.start_snapshot_shard(
            grads,
            snapshot_id=snapshot_id,
            rank=rank,
            world_size=world_size,
            run=run,
            step=step,
            tags=tags,
        ).result()

    def start_snapshot_shard(
        self,
        grads: GradientsParams | GradientsParamsRecord,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
    ) -> SnapshotHandle[ShardInfo]:
        return self._recorder.start_snapshot_shard(
            grads,
            snapshot_id=snapshot_id,
            rank=rank,
            world_size=world_size,
            run=run,
            step=step,
            tags=tags,
        )

    def restore(
        self, snapshot_id: str, device: array_backend.Device | str = "cpu", **kwargs: Any
    ) -> GradientsParams:
        return self._run("restore", self._recorder.restore(snapshot_id, device, **kwargs))

    def fetch(self, snapshot_id: str, *, rank: int | None = None) -> GradientsParamsRecord:
        return self._run("fetch", self._recorder.fetch(snapshot_id, rank=rank))

    def list(
        self, run: str | None = None, step_min: int | None = None, step_max: int | None = None
    ) -> list[SnapshotInfo]:
        return self._run("list", self._recorder.list(run, step_min, step_max))

    def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]:
        return self._run("info", self._recorder.info(snapshot_id, rank=rank))

    def delete(self, snapshot_id: str) -> None:
        self._run("delete", self._recorder.delete(snapshot_id))

    def gc(self, grace_seconds: float = 3600.0) -> builtins.list[str]:
        return self._run("gc", self._recorder.gc(grace_seconds))

    def apply_retention(
        self, keep_last: int | None = None, keep_every: int | None = None, run: str | None = None
    ) -> builtins.list[str]:
        return self._run(
            "apply_retention", self._recorder.apply_retention(keep_last, keep_every, run)
        )

    def close(self) -> None:
        self._recorder.close()


def _device_of(record: GradientsParamsRecord | DeviceSnapshot) -> str:
    """The device the record's gradients were captured on, as its metadata says."""
    return str(record.metadata.get("device", "cpu"))
