"""The asyncio client: :class:`BaseClient` plus httpx's ``AsyncClient`` for I/O."""

from __future__ import annotations

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, cast

import httpx

from gradvault.core import GradientsParams, GradientsParamsRecord
from gradvault.core.records.safetensors_file import record_from_safetensors

from ._base import BaseClient, ProgressCallback, Resumption, SnapshotSummary, TransferMeter, Upload
from ._files import part_beside, place


async def _async_chunks(chunks: Iterator[bytes | memoryview]) -> AsyncIterator[bytes | memoryview]:
    for chunk in chunks:  # views of the record's arrays: nothing here blocks
        yield chunk


def _flush_to_disk(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())


class AsyncClient(BaseClient):
    """:class:`gradvault.client.Client` for asyncio: the same methods, awaited.

    ``list`` is an async iterator; use it as an async context manager, or ``aclose``.
    """

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

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        upload: Upload | None = None,
        stream: bool = False,
    ) -> httpx.Response:
        """The first answer that is not an error, after retries; the core error otherwise."""
        attempt = 0
        while True:
            content = None
            if upload is not None:  # a fresh generator each try: the body is made again
                # httpx types a body's pieces as bytes; it writes any buffer (the pieces are
                # memoryviews of the record's arrays, sent without a copy)
                chunks = cast("AsyncIterator[bytes]", _async_chunks(upload.chunks()))
                headers, content = upload.headers, chunks
            request = self._http.build_request(
                method, path, params=params, headers=headers, content=content
            )
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                delay = self._retry_delay(attempt, method, upload, None)
                if delay is None:
                    raise self._unreachable(request, error) from error
            else:
                if not response.is_error:
                    return response
                delay = self._retry_delay(attempt, method, upload, response)
                await response.aread()
                await response.aclose()
                if delay is None:
                    raise self._error(response)
            await self._sleep(delay)
            attempt += 1

    async def _json(self, method: str, path: str, **options: Any) -> Any:
        return (await self._send(method, path, **options)).json()

    # ------------------------------------------------------------------ the API
    async def list(
        self,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        page_size: int = 100,
    ) -> AsyncIterator[SnapshotSummary]:
        """Every snapshot matching the filters, newest first, one page request at a time."""
        params = self._list_params(run, step_min, step_max, page_size)
        while True:
            page, cursor = self._page(await self._json("GET", "/v1/snapshots", params=params))
            for summary in page:
                yield summary
            if cursor is None:
                return
            params = {**params, "cursor": cursor}

    async def info(self, snapshot_id: str) -> dict[str, Any]:
        """The snapshot's manifest (``GET /v1/snapshots/{id}``) as a dict."""
        return await self._json("GET", self._snapshot_path(snapshot_id))

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
        record = (
            await grads_or_record.to_record_async()
            if isinstance(grads_or_record, GradientsParams)
            else grads_or_record
        )
        body = await self._json(
            "POST",
            "/v1/snapshots",
            params=self._push_params(run, step, tags),
            upload=Upload(record, progress),
        )
        return SnapshotSummary.from_manifest(body)

    async def _download_to(
        self, snapshot_id: str, path: Path, progress: ProgressCallback | None
    ) -> GradientsParamsRecord:
        """Download the file to ``path`` (resumed after a drop), fsync it, verify it."""
        manifest = await self.info(snapshot_id)
        meter = TransferMeter(progress)
        resumption = Resumption()
        attempt = furthest = 0
        with open(path, "wb") as file:
            while True:  # a connection dropped mid-body: the rest is asked for (Range)
                response = await self._send(
                    "GET",
                    self._snapshot_path(snapshot_id) + "/safetensors",
                    headers=resumption.request_headers(),
                    stream=True,
                )
                try:
                    file.seek(resumption.begin(response))
                    file.truncate()
                    meter.start(resumption.written, resumption.total)
                    async for chunk in response.aiter_bytes():
                        await asyncio.to_thread(file.write, chunk)
                        resumption.wrote(len(chunk))
                        meter.moved(len(chunk))
                    break
                except httpx.TransportError as error:
                    if resumption.written > furthest:  # got further: the tries count anew
                        attempt, furthest = 0, resumption.written
                    delay = self._retry_delay(attempt, "GET", None, None)
                    if delay is None:
                        raise self._unreachable(response.request, error) from error
                finally:
                    await response.aclose()
                await self._sleep(delay)
                attempt += 1
            await asyncio.to_thread(_flush_to_disk, file)
        if resumption.changed:  # the file changed between tries: check against its manifest
            manifest = await self.info(snapshot_id)
        record = await asyncio.to_thread(record_from_safetensors, path)
        await asyncio.to_thread(self._verify, snapshot_id, record, manifest)
        return record

    async def fetch(
        self, snapshot_id: str, *, progress: ProgressCallback | None = None
    ) -> GradientsParamsRecord:
        """The snapshot as a record, every gradient checked against the manifest's crc32c.

        ``progress(done_bytes, total_bytes)`` is told as the file's bytes arrive.
        """
        descriptor, name = tempfile.mkstemp(suffix=".safetensors")
        os.close(descriptor)
        try:  # the record maps the file; the mapping outlives its name
            return await self._download_to(snapshot_id, Path(name), progress)
        finally:
            os.unlink(name)

    async def restore(
        self,
        snapshot_id: str,
        device: str = "cpu",
        *,
        module: Any = None,
        match: str = "id",
        progress: ProgressCallback | None = None,
    ) -> GradientsParams:
        """The snapshot as gradients on ``device`` (``GradientsParams.from_record``)."""
        return self._restored(
            await self.fetch(snapshot_id, progress=progress), device, module, match
        )

    async def download(
        self,
        snapshot_id: str,
        path: str | os.PathLike[str],
        *,
        progress: ProgressCallback | None = None,
    ) -> Path:
        """Write the snapshot to ``path``: ``.npz`` by its suffix, else safetensors."""
        path = Path(path)
        part = part_beside(path)
        try:
            record = await self._download_to(snapshot_id, part, progress)
            await asyncio.to_thread(place, path, part, record)
        finally:
            part.unlink(missing_ok=True)
        return path

    async def delete(self, snapshot_id: str) -> None:
        """Delete the snapshot; SnapshotNotFoundError if there is none by that id."""
        await self._send("DELETE", self._snapshot_path(snapshot_id))
