"""Receiving a safetensors upload: header checked first, body spooled to disk, then a record.

The 8-byte length and the JSON header are read and validated before any byte of data is
written anywhere, so a malformed upload is refused after at most ``8 + max_header_bytes``
bytes. The data is then spooled to a temporary file with aiofiles, counting as it goes:
past ``max_upload_bytes`` or past the end the header declares, the upload is refused at
once. The spool file is locked while this process lives (:mod:`gradvault.service.spool`)
and removed whatever happens; the record read from it maps the file (no copy) and is
written to the store before the file goes. The store's write lets each slice of the
mapping go from the service's memory once it has read and written it, so a commit holds
a slice or so of the file per array in flight, not the file.

The header is checked, and the record read, on a worker thread: a header of 100,000
tensors takes seconds of CPU, which on the event loop would hold up every other request.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
from collections.abc import AsyncIterator

import aiofiles
import aiofiles.os
from fastapi import Request
from starlette.requests import ClientDisconnect

from gradvault.core import GradientsParamsRecord, InvalidFieldError, InvalidUploadError
from gradvault.core.records.safetensors_file import SafetensorsHeader, record_from_safetensors

from .errors import InsufficientStorageError, UploadTooLargeError
from .settings import Settings
from .spool import spool_locks

_LENGTH_BYTES = 8


class _Body:
    """The request body as it arrives, with the bytes that were read ahead and not used."""

    def __init__(self, chunks: AsyncIterator[bytes], limit: int) -> None:
        self._chunks = chunks
        self._limit = limit
        self.received = 0
        self.pending = bytearray()
        self.finished = False

    def _count(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self._limit:
            raise UploadTooLargeError(
                f"the upload is over the limit of {self._limit} bytes (max_upload_bytes)"
            )

    async def next_chunk(self) -> bytes | None:
        async for chunk in self._chunks:
            if chunk:
                self._count(chunk)
                return chunk
        self.finished = True
        return None

    async def read_ahead(self, count: int) -> bytes:
        """At least ``count`` bytes from the start (fewer only if the body ends first)."""
        while len(self.pending) < count:
            chunk = await self.next_chunk()
            if chunk is None:
                break
            self.pending += chunk
        return bytes(self.pending)


def _spool_error(error: OSError, path: str) -> Exception:
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorageError(f"no room to spool the upload to {path}: {error}")
    return error


async def receive_safetensors(
    chunks: AsyncIterator[bytes],
    *,
    content_length: int | None,
    max_upload_bytes: int,
    max_header_bytes: int,
    spool_dir: str | None,
) -> tuple[GradientsParamsRecord, str]:
    """The record an uploaded safetensors file holds, and the spool file it maps.

    The caller removes the spool file (:func:`remove_spool`) once done with the record.
    Raises UploadTooLargeError (413), InvalidUploadError (400) or InsufficientStorageError.
    """
    if content_length is not None and content_length > max_upload_bytes:
        raise UploadTooLargeError(
            f"the upload is {content_length} bytes (Content-Length); the limit is "
            f"{max_upload_bytes} bytes (max_upload_bytes)"
        )
    body = _Body(chunks, max_upload_bytes)
    prefix = await body.read_ahead(_LENGTH_BYTES)
    length = SafetensorsHeader.declared_length(
        prefix, max_header_bytes=max_header_bytes, body_bytes=content_length
    )
    prefix = await body.read_ahead(_LENGTH_BYTES + length)
    # a header of 100,000 tensors takes seconds to check: off the event loop
    header = await asyncio.to_thread(
        SafetensorsHeader.parse,
        prefix,
        max_header_bytes=max_header_bytes,
        body_bytes=content_length,
    )
    expected = header.file_length
    if expected > max_upload_bytes:
        raise UploadTooLargeError(
            f"the upload's header declares a file of {expected} bytes; the limit is "
            f"{max_upload_bytes} bytes (max_upload_bytes)"
        )
    # locked while this process lives, so that a start-up sweep knows it is not an orphan
    path = await asyncio.to_thread(spool_locks.create, spool_dir)
    try:
        await _spool(body, path, header)
        record = await asyncio.to_thread(
            record_from_safetensors, path, max_header_bytes=max_header_bytes
        )
    except BaseException:
        await remove_spool(path)
        raise
    return record, path


async def _spool(body: _Body, path: str, header: SafetensorsHeader) -> None:
    expected = header.file_length
    try:
        async with aiofiles.open(path, "wb") as spool:
            await spool.write(bytes(body.pending))
            written = len(body.pending)
            body.pending.clear()
            while written <= expected:
                chunk = await body.next_chunk()
                if chunk is None:
                    break
                await spool.write(chunk)
                written += len(chunk)
    except OSError as error:
        raise _spool_error(error, path) from error
    # the header was checked against a Content-Length; a body without one is checked here
    if written > expected:
        raise InvalidUploadError(
            f"safetensors file: trailing bytes: the tensors end at byte {expected}; more follow"
        )
    if written < expected:
        raise InvalidUploadError(
            f"safetensors file: the body ends early, after {written} bytes; its tensors end "
            f"at byte {expected}"
        )


async def remove_spool(path: str) -> None:
    """Remove a spool file, then let its lock go; gone already is fine."""
    try:
        with contextlib.suppress(FileNotFoundError):
            await aiofiles.os.remove(path)
    finally:
        spool_locks.release(path)


def parse_tags(text: str | None) -> dict[str, str]:
    """The ``tags`` query of an upload (a JSON object of strings), or {} without one."""
    if text is None:
        return {}
    try:
        tags = json.loads(text)
    except (ValueError, RecursionError):  # nested past the parser's depth: not tags either
        tags = None
    if not isinstance(tags, dict):
        raise InvalidFieldError(
            f'tags is a JSON object of strings, e.g. {{"lr": "0.1"}}; got {text[:200]!r}'
        )
    return tags


def content_length(request: Request) -> int | None:
    """The request's ``Content-Length``, None if it has none; InvalidUploadError if it is
    not a byte count."""
    text = request.headers.get("content-length")
    if text is None:
        return None
    if not text.isdigit():
        raise InvalidUploadError(f"Content-Length {text[:40]!r} is not a byte count")
    return int(text)


async def receive_upload(request: Request, settings: Settings) -> tuple[GradientsParamsRecord, str]:
    """The record the request's safetensors body holds, and its spool file, within the
    settings' limits (:func:`receive_safetensors`); a client that goes away mid-body is
    InvalidUploadError. The caller removes the spool file once done with the record."""
    try:
        return await receive_safetensors(
            request.stream(),
            content_length=content_length(request),
            max_upload_bytes=settings.max_upload_bytes,
            max_header_bytes=settings.max_header_bytes,
            spool_dir=settings.spool_dir,
        )
    except ClientDisconnect:
        raise InvalidUploadError(
            "safetensors file: the body ends early: the client closed the connection"
        ) from None
