"""The asyncio client: :class:`BaseClient`'s logic, its I/O steps awaited with httpx's
``AsyncClient`` (files and checksums in a thread)."""

from __future__ import annotations

import asyncio
import builtins
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from gradvault.core import GradientsParams, GradientsParamsRecord, ShardInfo

from ._base import BaseClient, ProgressCallback, SnapshotSummary, Upload
from ._steps import Blocking, Capture, Close, Discard, Receive, Send, Sleep, Step, Steps

T = TypeVar("T")


async def _async_chunks(chunks: Iterator[bytes | memoryview]) -> AsyncIterator[bytes | memoryview]:
    for chunk in chunks:  # views of the record's arrays: nothing here blocks
        yield chunk


class AsyncClient(BaseClient):
    """:class:`gradvault.client.Client` for asyncio: the same methods, awaited.

    ``list`` is an async iterator; use it as an async context manager, or ``aclose``.
    """

    _http: httpx.AsyncClient

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_url, token, **options)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=self._timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ the I/O
    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _content(self, upload: Upload) -> AsyncIterator[bytes | memoryview]:
        return _async_chunks(upload.chunks())

    async def _perform(self, step: Step) -> Any:
        """Do what ``step`` asks, awaited (files and the CPU in a thread); its outcome."""
        match step:
            case Send(request, stream):
                return await self._http.send(request, stream=stream)
            case Discard(response):
                await response.aread()
                await response.aclose()
            case Close(response):
                await response.aclose()
            case Sleep(seconds):
                await self._sleep(seconds)
            case Receive(response, file, moved):
                async for chunk in response.aiter_bytes():
                    await asyncio.to_thread(file.write, chunk)
                    moved(len(chunk))
            case Blocking(function, args):
                return await asyncio.to_thread(function, *args)
            case Capture(grads):
                return await grads.to_record_async()
        return None

    async def _run(self, steps: Steps[T]) -> T:
        """Drive ``steps`` to its end: each step awaited, its outcome or error sent back."""
        outcome: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(outcome) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            outcome, failure = None, None
            try:
                outcome = await self._perform(step)
            except BaseException as error:  # noqa: BLE001 - the logic decides, and re-raises
                failure = error

    # ------------------------------------------------------------------ the API
    async def list(
        self,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[SnapshotSummary]:
        """Every snapshot matching the filters, newest first, one page request at a time."""
        params: dict[str, Any] | None = self._list_params(run, step_min, step_max, page_size)
        while params is not None:
            page, params = await self._run(self._page_of(params))
            for summary in page:
                yield summary

    async def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]:
        """The snapshot's manifest (``GET /v1/snapshots/{id}``) as a dict; of a sharded
        snapshot its ranks (``world_size``, ``shards``), or with ``rank`` that rank's shard's."""
        return await self._run(self._info_of(snapshot_id, rank))

    async def push(
        self,
        grads_or_record: GradientsParams | GradientsParamsRecord,
        *,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> SnapshotSummary:
        """Upload gradients as a new snapshot, streamed as safetensors; its summary.

        ``progress(done_bytes, total_bytes)`` is told as the body's pieces are sent.
        """
        return await self._run(self._pushing(grads_or_record, run, step, tags, progress))

    async def push_shard(
        self,
        grads_or_record: GradientsParams | GradientsParamsRecord,
        *,
        snapshot_id: str,
        rank: int,
        world_size: int,
        run: str,
        step: int,
        tags: Mapping[str, str] | None = None,
        progress: ProgressCallback | None = None,
    ) -> ShardInfo:
        """Upload gradients as rank ``rank``'s shard of the sharded snapshot ``snapshot_id``;
        its ``ShardInfo`` once durable (``committed``: this upload completed the snapshot).

        Every rank passes the same id (drawn once, e.g. by rank 0 with
        :func:`gradvault.core.new_snapshot_id`), world size, run, step and tags, as the
        store's ``write_shard`` asks. ``progress(done_bytes, total_bytes)`` is told as the
        body's pieces are sent.
        """
        return await self._run(
            self._pushing_shard(
                grads_or_record, (snapshot_id, rank, world_size), run, step, tags, progress
            )
        )

    async def fetch(
        self,
        snapshot_id: str,
        *,
        rank: int | None = None,
        progress: ProgressCallback | None = None,
    ) -> GradientsParamsRecord:
        """The snapshot as a record, every gradient checked against the manifest's crc32c.

        A sharded snapshot needs ``rank``: that rank's shard (ShardedSnapshotError without).

        ``progress(done_bytes, total_bytes)`` is told as the file's bytes arrive.
        """
        return await self._run(self._fetching(snapshot_id, progress, rank))

    async def restore(
        self,
        snapshot_id: str,
        device: str = "cpu",
        *,
        module: Any = None,
        match: str = "id",
        rank: int | None = None,
        progress: ProgressCallback | None = None,
    ) -> GradientsParams:
        """The snapshot as gradients on ``device`` (``GradientsParams.from_record``); of a
        sharded snapshot, rank ``rank``'s shard (ShardedSnapshotError without)."""
        return await self._run(self._restoring(snapshot_id, device, module, match, progress, rank))

    async def download(
        self,
        snapshot_id: str,
        path: str | os.PathLike[str],
        *,
        rank: int | None = None,
        progress: ProgressCallback | None = None,
    ) -> Path:
        """Write the snapshot to ``path``: ``.npz`` by its suffix, else safetensors; of a
        sharded snapshot, rank ``rank``'s shard (ShardedSnapshotError without)."""
        return await self._run(self._downloading_to(snapshot_id, path, progress, rank))

    async def delete(self, snapshot_id: str) -> None:
        """Delete the snapshot; SnapshotNotFoundError if there is none by that id."""
        await self._run(self._deleting(snapshot_id))

    async def apply_retention(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        run: str | None = None,
    ) -> builtins.list[str]:
        """Delete the snapshots (of ``run``, or all) that no retention rule keeps; their ids.

        The rules and the checks of a store's ``apply_retention`` (docs/CLIENT.md): the
        newest snapshot is always kept, and checked before each deletion.
        """
        return await self._run(self._retaining(keep_last, keep_every, run))
