"""The object-store backend (S3 or anything S3-compatible) through obstore.

Object stores have no rename, so the commit protocol is ordering: every chunk and every
array's ``zarr.json`` is written first, and the snapshot group's ``zarr.json`` (which
carries the manifest) last. Listings only show snapshots whose manifest exists; deleting
removes the manifest first. Prefixes without a manifest are leftovers of writes that never
finished, and ``gc`` removes them once none of their objects is younger than the grace
period.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import S3Store

from ..errors import StoreUnavailableError
from ._backend import (
    MANIFEST_NAME,
    SNAPSHOTS_PREFIX,
    Backend,
    EncodedChunk,
    MissingKeyError,
    SnapshotWriter,
    ThreadRunner,
    UnexpectedObjectError,
    snapshot_key,
)
from ._format import dump_json, group_metadata
from ._ids import parse_snapshot_id, snapshot_id_time_ms

_DELETE_BATCH = 1000
#: Pieces a GET body is streamed in when it is read into place.
_STREAM_PIECE = 1 << 20


def _next_joined(chunks: Iterator[EncodedChunk]) -> tuple[str, bytes] | None:
    """The next chunk as one bytes object (an object-store PUT takes one body)."""
    item = next(chunks, None)
    if item is None:
        return None
    key, buffers = item
    return key, b"".join(buffers)


class S3Backend(Backend):
    """Snapshots under ``s3://bucket/prefix`` (see the module docstring)."""

    def __init__(self, store: S3Store, location: str, threads: ThreadRunner, max_concurrency: int):
        self._store = store
        self.location = location
        self._threads = threads
        self._requests = asyncio.Semaphore(max_concurrency)
        self._prepared = False
        self._known_committed: set[str] = set()

    def _unavailable(self, action: str, error: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(f"object store {self.location}: {action} failed: {error}")

    async def _put(self, key: str, body: bytes | memoryview) -> None:
        async with self._requests:
            try:
                await obstore.put_async(self._store, key, body, use_multipart=False)
            except Exception as error:
                raise self._unavailable(f"writing {key}", error) from error

    async def _head(self, key: str) -> dict[str, Any] | None:
        async with self._requests:
            try:
                return await obstore.head_async(self._store, key)  # type: ignore[return-value]
            except (NotFoundError, FileNotFoundError):
                return None
            except Exception as error:
                raise self._unavailable(f"reading {key}", error) from error

    async def _list(self, prefix: str) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        try:
            async for batch in obstore.list(self._store, prefix, chunk_size=1000):
                found.extend(batch)  # type: ignore[arg-type]
        except Exception as error:
            raise self._unavailable(f"listing {prefix}", error) from error
        return found

    async def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = keys[start : start + _DELETE_BATCH]
            try:
                await obstore.delete_async(self._store, batch)
            except (NotFoundError, FileNotFoundError):
                pass
            except Exception as error:
                raise self._unavailable(f"deleting {len(batch)} objects", error) from error

    async def prepare(self) -> None:
        if self._prepared:
            return
        for key in (MANIFEST_NAME, f"{SNAPSHOTS_PREFIX}/{MANIFEST_NAME}"):
            if await self._head(key) is None:
                await self._put(key, dump_json(group_metadata()))
        self._prepared = True

    async def begin(self, snapshot_id: str) -> SnapshotWriter:
        return _S3SnapshotWriter(self, snapshot_id)

    async def read(self, key: str, max_size: int | None = None) -> memoryview:
        async with self._requests:
            try:
                result = await obstore.get_async(self._store, key)
                size = result.meta["size"]
                if max_size is not None and size > max_size:
                    raise UnexpectedObjectError(f"is {size} bytes; at most {max_size} expected")
                return memoryview(await result.bytes_async())
            except (NotFoundError, FileNotFoundError):
                raise MissingKeyError(key) from None
            except UnexpectedObjectError:
                raise
            except Exception as error:
                raise self._unavailable(f"reading {key}", error) from error

    async def read_into(self, key: str, buffers: list[memoryview]) -> None:
        expected = sum(len(view) for view in buffers)
        async with self._requests:
            try:
                result = await obstore.get_async(self._store, key)
                size = result.meta["size"]
                if size != expected:
                    raise UnexpectedObjectError(f"is {size} bytes; expected {expected}")
                # streamed into place: no second buffer as large as the object
                views = [view for view in buffers if len(view)]
                async for piece in result.stream(min_chunk_size=_STREAM_PIECE):
                    piece = memoryview(piece)
                    while len(piece):
                        if not views:
                            raise UnexpectedObjectError(f"grew while read; it had {size} bytes")
                        count = min(len(piece), len(views[0]))
                        views[0][:count] = piece[:count]
                        piece = piece[count:]
                        views[0] = views[0][count:]
                        if not len(views[0]):
                            views.pop(0)
                if views:
                    raise UnexpectedObjectError(f"shrank while read; it had {size} bytes")
            except (NotFoundError, FileNotFoundError):
                raise MissingKeyError(key) from None
            except UnexpectedObjectError:
                raise
            except Exception as error:
                raise self._unavailable(f"reading {key}", error) from error

    async def object_sizes(self, prefix: str) -> dict[str, int | None]:
        start = len(prefix) + 1
        return {meta["path"][start:]: meta["size"] for meta in await self._list(prefix + "/")}

    async def _snapshot_prefixes(self) -> list[str]:
        try:
            listing = await obstore.list_with_delimiter_async(self._store, f"{SNAPSHOTS_PREFIX}/")
        except Exception as error:
            raise self._unavailable("listing snapshots", error) from error
        names = []
        for prefix in listing["common_prefixes"]:
            name = prefix.rstrip("/").rpartition("/")[2]
            try:
                names.append(parse_snapshot_id(name))
            except ValueError:
                continue
        return names

    async def committed_ids(self) -> list[str]:
        names = await self._snapshot_prefixes()
        unknown = [name for name in names if name not in self._known_committed]
        heads = await asyncio.gather(
            *(self._head(snapshot_key(name, MANIFEST_NAME)) for name in unknown)
        )
        self._known_committed.update(
            name for name, head in zip(unknown, heads, strict=True) if head
        )
        self._known_committed.intersection_update(names)
        return [name for name in names if name in self._known_committed]

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        manifest_key = snapshot_key(snapshot_id, MANIFEST_NAME)
        if await self._head(manifest_key) is None:
            return False
        await self._delete([manifest_key])  # invisible from here on
        self._known_committed.discard(snapshot_id)
        objects = await self._list(snapshot_key(snapshot_id) + "/")
        await self._delete([meta["path"] for meta in objects])
        return True

    async def collect_garbage(self, grace_seconds: float) -> list[str]:
        cutoff = time.time() - grace_seconds
        removed = []
        for name in await self._snapshot_prefixes():
            if snapshot_id_time_ms(name) / 1000 > cutoff:
                continue
            if await self._head(snapshot_key(name, MANIFEST_NAME)) is not None:
                continue
            objects = await self._list(snapshot_key(name) + "/")
            if any(meta["last_modified"].timestamp() > cutoff for meta in objects):
                continue
            await self._delete([meta["path"] for meta in objects])
            removed.append(name)
        return sorted(removed)

    async def close(self) -> None:
        """Nothing to release: obstore's client pool goes with the S3Store."""


class _S3SnapshotWriter(SnapshotWriter):
    def __init__(self, backend: S3Backend, snapshot_id: str) -> None:
        self._backend = backend
        self._snapshot_id = snapshot_id

    async def write_array(self, name: str, metadata: bytes, chunks: Iterator[EncodedChunk]) -> None:
        uploads: list[asyncio.Task[None]] = []
        try:
            while True:
                item = await self._backend._threads.run(_next_joined, chunks)
                if item is None:
                    break
                key, body = item
                key = snapshot_key(self._snapshot_id, name, key)
                uploads.append(asyncio.ensure_future(self._backend._put(key, body)))
                # Bound the encoded chunks held in memory: wait once a few are in flight.
                if len(uploads) >= 4:
                    await uploads.pop(0)
            await asyncio.gather(*uploads)
        except BaseException:
            for upload in uploads:
                upload.cancel()
            await asyncio.gather(*uploads, return_exceptions=True)
            raise
        await self._backend._put(snapshot_key(self._snapshot_id, name, MANIFEST_NAME), metadata)

    async def commit(self, group_metadata: bytes) -> None:
        await self._backend._put(snapshot_key(self._snapshot_id, MANIFEST_NAME), group_metadata)
        self._backend._known_committed.add(self._snapshot_id)

    async def abort(self) -> None:
        try:
            objects = await self._backend._list(snapshot_key(self._snapshot_id) + "/")
            await self._backend._delete([meta["path"] for meta in objects])
        except Exception:  # noqa: BLE001 - best effort; gc collects what remains
            pass
