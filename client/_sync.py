"""The blocking client: :class:`BaseClient` plus httpx's ``Client`` for I/O."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import httpx

from gradvault.core import GradientsParams, GradientsParamsRecord
from gradvault.core.records.safetensors_file import record_from_safetensors

from ._base import BaseClient, ProgressCallback, Resumption, SnapshotSummary, TransferMeter, Upload
from ._files import part_beside, place


class Client(BaseClient):
    """The service at ``base_url`` (``http://host:8000``), with a bearer ``token`` if given.

    ``retries`` more tries after a connection error, 429, 502, 503 or 504 (never after
    another error status). Use it as a context manager, or call :meth:`close`.
    """

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

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _send(
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
                headers, content = upload.headers, cast("Iterator[bytes]", upload.chunks())
            request = self._http.build_request(
                method, path, params=params, headers=headers, content=content
            )
            try:
                response = self._http.send(request, stream=stream)
            except httpx.TransportError as error:
                delay = self._retry_delay(attempt, method, upload, None)
                if delay is None:
                    raise self._unreachable(request, error) from error
            else:
                if not response.is_error:
                    return response
                delay = self._retry_delay(attempt, method, upload, response)
                response.read()
                response.close()
                if delay is None:
                    raise self._error(response)
            self._sleep(delay)
            attempt += 1

    def _json(self, method: str, path: str, **options: Any) -> Any:
        return self._send(method, path, **options).json()

    # ------------------------------------------------------------------ the API
    def list(
        self,
        run: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
        page_size: int = 100,
    ) -> Iterator[SnapshotSummary]:
        """Every snapshot matching the filters, newest first, one page request at a time."""
        params = self._list_params(run, step_min, step_max, page_size)
        while True:
            page, cursor = self._page(self._json("GET", "/v1/snapshots", params=params))
            yield from page
            if cursor is None:
                return
            params = {**params, "cursor": cursor}

    def info(self, snapshot_id: str) -> dict[str, Any]:
        """The snapshot's manifest (``GET /v1/snapshots/{id}``) as a dict."""
        return self._json("GET", self._snapshot_path(snapshot_id))

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
        record = (
            grads_or_record.try_to_record()
            if isinstance(grads_or_record, GradientsParams)
            else grads_or_record
        )
        body = self._json(
            "POST",
            "/v1/snapshots",
            params=self._push_params(run, step, tags),
            upload=Upload(record, progress),
        )
        return SnapshotSummary.from_manifest(body)

    def _download_to(
        self, snapshot_id: str, path: Path, progress: ProgressCallback | None
    ) -> GradientsParamsRecord:
        """Download the file to ``path`` (resumed after a drop), fsync it, verify it."""
        manifest = self.info(snapshot_id)
        meter = TransferMeter(progress)
        resumption = Resumption()
        attempt = furthest = 0
        with open(path, "wb") as file:
            while True:  # a connection dropped mid-body: the rest is asked for (Range)
                response = self._send(
                    "GET",
                    self._snapshot_path(snapshot_id) + "/safetensors",
                    headers=resumption.request_headers(),
                    stream=True,
                )
                try:
                    file.seek(resumption.begin(response))
                    file.truncate()
                    meter.start(resumption.written, resumption.total)
                    for chunk in response.iter_bytes():
                        file.write(chunk)
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
                    response.close()
                self._sleep(delay)
                attempt += 1
            file.flush()
            os.fsync(file.fileno())
        if resumption.changed:  # the file changed between tries: check against its manifest
            manifest = self.info(snapshot_id)
        record = record_from_safetensors(path)
        self._verify(snapshot_id, record, manifest)
        return record

    def fetch(
        self, snapshot_id: str, *, progress: ProgressCallback | None = None
    ) -> GradientsParamsRecord:
        """The snapshot as a record, every gradient checked against the manifest's crc32c.

        ``progress(done_bytes, total_bytes)`` is told as the file's bytes arrive.
        """
        descriptor, name = tempfile.mkstemp(suffix=".safetensors")
        os.close(descriptor)
        try:  # the record maps the file; the mapping outlives its name
            return self._download_to(snapshot_id, Path(name), progress)
        finally:
            os.unlink(name)

    def restore(
        self,
        snapshot_id: str,
        device: str = "cpu",
        *,
        module: Any = None,
        match: str = "id",
        progress: ProgressCallback | None = None,
    ) -> GradientsParams:
        """The snapshot as gradients on ``device`` (``GradientsParams.from_record``)."""
        return self._restored(self.fetch(snapshot_id, progress=progress), device, module, match)

    def download(
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
            place(path, part, self._download_to(snapshot_id, part, progress))
        finally:
            part.unlink(missing_ok=True)
        return path

    def delete(self, snapshot_id: str) -> None:
        """Delete the snapshot; SnapshotNotFoundError if there is none by that id."""
        self._send("DELETE", self._snapshot_path(snapshot_id))
