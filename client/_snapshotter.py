"""Snapshotter: a training loop's snapshots every N steps, uploaded in the background.

The loop pays for the capture only (a copy-on-write record of the gradients; a device's
gradients are read to the host); a background thread (:class:`Snapshotter`) or task
(:class:`AsyncSnapshotter`) uploads it to a service (through the client) or commits it
to a store (through the core's :class:`Recorder`). A failed upload is logged and counted
and training goes on; the failures come back on close (docs/CLIENT.md, Snapshotter).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gradvault.core import (
    GradientsParams,
    GradientsParamsRecord,
    InvalidFieldError,
    Recorder,
)
from gradvault.core.autodiff.torch_adapter import is_torch_module
from gradvault.core.records.record_rules import check_snapshot_fields
from gradvault.core.store import SnapshotInfo, SnapshotStore

from ._async import AsyncClient
from ._sync import Client
from ._target import Target

_log = logging.getLogger("gradvault.client.snapshotter")

#: What ``step`` takes: gradients, a record taken already, or a torch.nn.Module (its .grad)
StepGradients = Any


class SnapshotterWarning(RuntimeWarning):
    """Warned on close when some snapshots failed (the summary says which)."""


@dataclass
class SnapshotterSummary:
    """What a snapshotter did: counts, the failures (step and error) and the last commit."""

    taken: int = 0
    committed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: list[tuple[int, Exception]] = field(default_factory=list)
    last: SnapshotInfo | None = None

    def __str__(self) -> str:
        return (
            f"{self.taken} taken, {self.committed} committed, {self.failed} failed, "
            f"{self.skipped} skipped"
        )


class _Snapshots:
    """Everything both snapshotters share but the waiting: when, what and the counts."""

    def __init__(
        self,
        *,
        run: str,
        every: int,
        tags: Mapping[str, str] | None,
        raise_on_failure: bool,
    ) -> None:
        if not isinstance(every, int) or isinstance(every, bool) or every < 1:
            raise InvalidFieldError(f"every is a number of steps >= 1; got {every!r}")
        self.run, _, self.tags = check_snapshot_fields(run, 0, tags)
        self.every = every
        self.raise_on_failure = raise_on_failure
        self._summary = SnapshotterSummary()
        self._pending: tuple[int, GradientsParamsRecord] | None = None
        self._closing = False

    @property
    def summary(self) -> SnapshotterSummary:
        """The counts so far (a copy)."""
        s = self._summary
        return SnapshotterSummary(s.taken, s.committed, s.failed, s.skipped, list(s.errors), s.last)

    def _due(self, step: int) -> bool:
        if self._closing:
            raise InvalidFieldError("this snapshotter is closed; step() after close")
        check_snapshot_fields(self.run, step, None)
        return step % self.every == 0

    def _hold(self, step: int, record: GradientsParamsRecord) -> None:
        """Make ``record`` the next upload; one still waiting is replaced (skipped)."""
        if self._pending is not None:
            self._summary.skipped += 1
            _log.warning(
                "run %r: snapshot of step %d skipped: step %d was taken before its upload began",
                self.run,
                self._pending[0],
                step,
            )
        self._pending = (step, record)
        self._summary.taken += 1

    def _committed(self, info: SnapshotInfo) -> None:
        self._summary.committed += 1
        self._summary.last = info

    def _failed(self, step: int, error: Exception) -> None:
        self._summary.failed += 1
        self._summary.errors.append((step, error))
        _log.warning(
            "run %r: snapshot of step %d failed; training goes on: %s: %s",
            self.run,
            step,
            type(error).__name__,
            error,
        )

    def _report(self, exc_type: type[BaseException] | None = None) -> SnapshotterSummary:
        """Warn about failures; raise them as a group if asked to and nothing else is raised."""
        summary = self.summary
        if summary.failed:
            message = f"run {self.run!r}: {summary.failed} snapshot(s) failed ({summary})"
            warnings.warn(message, SnapshotterWarning, stacklevel=3)
            if self.raise_on_failure and exc_type is None:
                raise ExceptionGroup(message, [error for _, error in summary.errors])
        return summary


def _gradients(grads: StepGradients) -> GradientsParams | GradientsParamsRecord:
    """``grads`` as gradients or a record (a torch.nn.Module's .grad, shared); TypeError."""
    if is_torch_module(grads):
        return GradientsParams.from_torch(grads)
    if not isinstance(grads, GradientsParams | GradientsParamsRecord):
        raise TypeError(
            "step() takes GradientsParams, a GradientsParamsRecord or a torch.nn.Module; "
            f"got {type(grads).__name__}"
        )
    return grads


class Snapshotter(_Snapshots):
    """Snapshots every ``every`` steps to ``target``, uploading in a background thread.

    ``target`` is a service URL (``http://host:8000``; ``token``, else
    ``$GRADVAULT_TOKEN``, and ``client_options`` go to :class:`Client`) or a
    :class:`Client`; or a store (a path, a ``file://`` or ``s3://`` URL, a
    ``SnapshotStore``; ``recorder_options`` go to the core's :class:`Recorder`) or a
    :class:`Recorder`. A URL or path is read as a :class:`Target` (its errors); a Target
    is taken as it is. Objects
    passed in are not closed here.

    ``step(step, grads)`` takes a snapshot when ``step % every == 0``: the capture runs
    in the caller's thread, the upload in the background. A snapshot still waiting when
    the next one is taken is replaced by it (counted as skipped): the newest always goes
    next, and at most one waits. Failures are logged and counted; ``close()`` waits for
    the uploads, warns (``SnapshotterWarning``) if any failed and returns the summary, or
    with ``raise_on_failure=True`` raises them as an ``ExceptionGroup``.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | Target | Client | Recorder | SnapshotStore,
        *,
        run: str,
        every: int = 1,
        tags: Mapping[str, str] | None = None,
        token: str | None = None,
        raise_on_failure: bool = False,
        client_options: Mapping[str, Any] | None = None,
        recorder_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(run=run, every=every, tags=tags, raise_on_failure=raise_on_failure)
        if isinstance(target, AsyncClient):
            raise TypeError("Snapshotter uploads with a Client; use AsyncSnapshotter")
        self._owned: Client | Recorder | None = None
        if isinstance(target, Client | Recorder):
            self._sink = target
        elif isinstance(target, SnapshotStore):
            self._sink = self._owned = Recorder(target, **dict(recorder_options or {}))
        else:
            where = Target.of(target, token)
            self._sink = self._owned = (
                where.client(**dict(client_options or {}))
                if where.is_service
                else where.recorder(**dict(recorder_options or {}))
            )
        self._changed = threading.Condition()
        self._uploading = False
        self._worker = threading.Thread(
            target=self._work, name="gradvault-snapshotter", daemon=True
        )
        self._worker.start()

    def step(self, step: int, grads: StepGradients) -> bool:
        """Take a snapshot of ``grads`` at ``step`` if it is due; whether one was taken.

        Returns once the capture is done; nothing the loop does afterwards changes it.
        """
        if not self._due(step):
            return False
        grads = _gradients(grads)
        record = grads if isinstance(grads, GradientsParamsRecord) else grads.try_to_record()
        with self._changed:
            self._hold(step, record)
            self._changed.notify_all()
        return True

    def flush(self) -> None:
        """Wait until every snapshot taken so far is committed or has failed."""
        with self._changed:
            self._changed.wait_for(lambda: self._pending is None and not self._uploading)

    def _work(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._pending is not None or self._closing)
                if self._pending is None:
                    return
                (step, record), self._pending = self._pending, None
                self._uploading = True
            info: SnapshotInfo | None = None
            try:
                info = self._upload(step, record)
            except Exception as error:  # noqa: BLE001 - reported, and training goes on
                failure: Exception | None = error
            else:
                failure = None
            with self._changed:
                if failure is not None:
                    self._failed(step, failure)
                elif info is not None:
                    self._committed(info)
                self._uploading = False
                self._changed.notify_all()

    def _upload(self, step: int, record: GradientsParamsRecord) -> SnapshotInfo:
        if isinstance(self._sink, Client):
            return self._sink.push(record, run=self.run, step=step, tags=self.tags)
        return self._sink.sync.snapshot(record, run=self.run, step=step, tags=self.tags)

    def close(self) -> SnapshotterSummary:
        """Wait for the uploads, close what this snapshotter opened; the summary."""
        return self._close(None)

    def _close(self, exc_type: type[BaseException] | None) -> SnapshotterSummary:
        with self._changed:
            if self._closing:
                return self.summary
            self._closing = True
            self._changed.notify_all()
        self._worker.join()
        if self._owned is not None:
            self._owned.close()
        return self._report(exc_type)

    def __enter__(self) -> Snapshotter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._close(exc_type)


class AsyncSnapshotter(_Snapshots):
    """:class:`Snapshotter` for asyncio: ``await snap.step(step, grads)``, uploads in a task.

    ``target`` is a service URL or an :class:`AsyncClient`, or a store or a
    :class:`Recorder`, as for :class:`Snapshotter`; use it with ``async with`` or
    ``await snap.aclose()``.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | Target | AsyncClient | Recorder | SnapshotStore,
        *,
        run: str,
        every: int = 1,
        tags: Mapping[str, str] | None = None,
        token: str | None = None,
        raise_on_failure: bool = False,
        client_options: Mapping[str, Any] | None = None,
        recorder_options: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(run=run, every=every, tags=tags, raise_on_failure=raise_on_failure)
        if isinstance(target, Client):
            raise TypeError("AsyncSnapshotter uploads with an AsyncClient; use Snapshotter")
        self._owned: AsyncClient | Recorder | None = None
        if isinstance(target, AsyncClient | Recorder):
            self._sink = target
        elif isinstance(target, SnapshotStore):
            self._sink = self._owned = Recorder(target, **dict(recorder_options or {}))
        else:
            where = Target.of(target, token)
            self._sink = self._owned = (
                where.async_client(**dict(client_options or {}))
                if where.is_service
                else where.recorder(**dict(recorder_options or {}))
            )
        self._worker: asyncio.Task[None] | None = None

    async def step(self, step: int, grads: StepGradients) -> bool:
        """Take a snapshot of ``grads`` at ``step`` if it is due; whether one was taken.

        The capture happens before the first await (device reads then run in a thread);
        the upload runs in a task of the running loop.
        """
        if not self._due(step):
            return False
        grads = _gradients(grads)
        if isinstance(grads, GradientsParamsRecord):
            record = grads
        else:
            record = await grads.to_record_async()
        self._hold(step, record)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        return True

    async def flush(self) -> None:
        """Wait until every snapshot taken so far is committed or has failed."""
        while self._worker is not None and not self._worker.done():
            await asyncio.shield(self._worker)

    async def _work(self) -> None:
        while self._pending is not None:
            (step, record), self._pending = self._pending, None
            try:
                if isinstance(self._sink, AsyncClient):
                    info = await self._sink.push(record, run=self.run, step=step, tags=self.tags)
                else:
                    info = await self._sink.snapshot(
                        record, run=self.run, step=step, tags=self.tags
                    )
            except Exception as error:  # noqa: BLE001 - reported, and training goes on
                self._failed(step, error)
            else:
                self._committed(info)

    async def aclose(self) -> SnapshotterSummary:
        """Wait for the uploads, close what this snapshotter opened; the summary."""
        return await self._aclose(None)

    async def _aclose(self, exc_type: type[BaseException] | None) -> SnapshotterSummary:
        if self._closing:
            return self.summary
        self._closing = True
        await self.flush()
        if self._owned is not None:
            await self._owned.aclose()
        return self._report(exc_type)

    async def __aenter__(self) -> AsyncSnapshotter:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        await self._aclose(exc_type)
