"""The blocking client: :class:`BaseClient`'s logic, its I/O steps performed with httpx's
``Client``."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import httpx

from gradvault.core import GradientsParams, GradientsParamsRecord, ShardInfo

from ._base import BaseClient, ProgressCallback, SnapshotSummary, Upload
from ._steps import Blocking, Capture, Close, Discard, Receive, Send, Sleep, Step, Steps

T = TypeVar("T")


class Client(BaseClient):
    """The service at ``base_url`` (``http://host:8000``), with a bearer ``token`` if given.

    ``retries`` more tries after a connection error, 429, 502, 503 or 504 (never after
    another error status). Use it as a context manager, or call :meth:`close`.
    """

    _http: httpx.Client

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_url, token, **options)
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers,
            timeout=self._timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the I/O
    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _content(self, upload: Upload) -> Iterator[bytes | memoryview]:
        return upload.chunks()

    def _perform(self, step: Step) -> Any:
        """Do what ``step`` asks, blocking; its outcome."""
        match step:
            case Send(request, stream):
                return self._http.send(request, stream=stream)
            case Discard(response):
                response.read()
                response.close()
            case Close(response):
                response.close()
            case Sleep(seconds):
                self._sleep(seconds)
            case Receive(response, file, moved):
                for chunk in response.iter_bytes():
                    file.write(chunk)
                    moved(len(chunk))
            case Blocking(function, args):
                return function(*args)
            case Capture(grads):
                return grads.try_to_record()
        return None

    def _run(self, steps: Steps[T]) -> T:
        """Drive ``steps`` to its end: each step performed, its outcome or error sent back."""
        outcome: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(outcome) if failure is None else steps.throw(failure)
            except StopIteration as done:
                return done.value
            outcome, failure = None, None
            try:
                outcome = self._perform(step)
            except BaseException as error:  # noqa: BLE001 - the logic decides, and re-raises
                failure = error

    # ------------------------------------------------------------------ the API
    def list(
        self,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        page_size: int = 100,
    ) -> Iterator[SnapshotSummary]:
        """Every snapshot matching the filters, newest first, one page request at a time."""
        params: dict[str, Any] | None = self._list_params(run, step_min, step_max, page_size)
        while params is not None:
            page, params = self._run(self._page_of(params))
            yield from page

    def info(self, snapshot_id: str, *, rank: int | None = None) -> dict[str, Any]:
        """The snapshot's manifest (``GET /v1/snapshots/{id}``) as a dict; of a sharded
        snapshot its ranks (``world_size``, ``shards``), or with ``rank`` that rank's shard's."""
        return self._run(self._info_of(snapshot_id, rank))

    def push(
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
        return self._run(self._pushing(grads_or_record, run, step, tags, progress))

    def push_shard(
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
        return self._run(
            self._pushing_shard(
                grads_or_record, (snapshot_id, rank, world_size), run, step, tags, progress
            )
        )

    def fetch(
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
        return self._run(self._fetching(snapshot_id, progress, rank))

    def restore(
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
        return self._run(self._restoring(snapshot_id, device, module, match, progress, rank))

    def download(
        self,
        snapshot_id: str,
        path: str | os.PathLike[str],
        *,
        rank: int | None = None,
        progress: ProgressCallback | None = None,
    ) -> Path:
        """Write the snapshot to ``path``: ``.npz`` by its suffix, else safetensors; of a
        sharded snapshot, rank ``rank``'s shard (ShardedSnapshotError without)."""
        return self._run(self._downloading_to(snapshot_id, path, progress, rank))

    def delete(self, snapshot_id: str) -> None:
        """Delete the snapshot; SnapshotNotFoundError if there is none by that id."""
        self._run(self._deleting(snapshot_id))

    def apply_retention(
        self,
        keep_last: int | None = None,
        keep_every: int | None = None,
        run: str | None = None,
    ) -> builtins.list[str]:
        """Delete the snapshots (of ``run``, or all) that no retention rule keeps; their ids.

        The rules and the checks of a store's ``apply_retention`` (docs/CLIENT.md): the
        newest snapshot is always kept, and checked before each deletion.
        """
        return self._run(self._retaining(keep_last, keep_every, run))
