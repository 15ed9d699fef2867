"""The object-store backend (S3 or anything S3-compatible) through obstore.

Object stores have no rename, so the commit protocol is ordering: every chunk and every
array's ``zarr.json`` is written first, and the snapshot group's ``zarr.json`` (which
carries the manifest) last. Listings only show snapshots whose manifest exists; deleting
removes the manifest first, then the other objects and the emptied folders (on servers
that keep folders, such as SeaweedFS, a listing would show the prefix for minutes, and a
store that had seen the manifest would still list the snapshot). Prefixes without a
manifest are leftovers of writes that never finished, and ``gc`` removes them once none
of their objects is younger than the grace period.

gc and a late commit are kept apart by a marker and two checks in opposite orders. gc
PUTs ``snapshots/<id>/gc-collected`` (``GC_MARKER_NAME``), then checks for the manifest,
and removes the prefix only if there is none. A writer PUTs its manifest, then checks for
the marker, and if it is there withdraws the manifest and fails. With the
read-after-write consistency S3 gives, at least one of the two sees the other's PUT:
either gc backs off, or the writer does (or both). The marker stays until a gc finds it
older than ``max(grace, marker_lifetime_seconds)``. Not covered: a writer stalled between
its manifest PUT and its check for longer than that; and between those two requests a
listing may show a manifest that the writer then withdraws.

Every request the backend makes goes through a public method of :class:`S3Backend`
(``read``, ``read_into`` and ``size`` of the StoreBackend, and the primitives ``put``,
``head``, ``list_objects``, ``folder_names`` and ``delete_keys``), so that a test can
wrap one on the store's instance to pause or fail it (tests/core/store/test_store_races.py).

Requests are made with obstore's blocking functions, each in one of the backend's request
threads (as many as ``max_concurrency``), not with its coroutines. A coroutine of obstore
hands its result to Python from a thread of obstore's own runtime; one still doing so
while the process exits (Python finalizing) makes that thread take the GIL, which Python
refuses by ending the thread, and the process aborts (SIGABRT) after its work was done:
about one rank process in a hundred of tests/core/store/test_store_shards.py did. A blocking
call returns in the thread that made it, so no thread of obstore's runtime ever enters
Python. A caller cancelled while its request runs waits for the request to end, so no
request of a cancelled write lands after the write has cleaned up.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import urlparse

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError
from obstore.store import S3Store

from ..errors import InvalidArgumentError, InvalidArgumentTypeError, StoreUnavailableError
from ._backend import (
    GC_MARKER_NAME,
    MANIFEST_NAME,
    RANKS_GROUP,
    SNAPSHOTS_PREFIX,
    EncodedChunk,
    MissingKeyError,
    ShardWriter,
    SnapshotWriter,
    StoreBackend,
    ThreadRunner,
    UnexpectedObjectError,
    collected_error,
    shard_prefix,
    snapshot_key,
)
from ._checksums import resolved
from ._commit_order import CommitTurn, holding
from ._ids import parse_snapshot_id, snapshot_id_time_ms
from ._shard_publish import ShardSteps, Taken, publish_shard, written_twice
from ._shards import ShardedSet, rank_of_folder, ranks_group_document
from ._zarr_format import dump_json, group_metadata

_log = logging.getLogger("gradvault.store")
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]")
S3_OPTIONS = (
    "endpoint",
    "region",
    "access_key_id",
    "secret_access_key",
    "session_token",
    "allow_http",
    "client_options",
    "retry_config",
)
_TRUE = {"1", "true", "yes", "on"}
#: obstore's errors carry a Rust debug dump after this line; it goes to the log only
_DEBUG_SOURCE = "\n\nDebug source:"
_XML_FIELD = re.compile(r"<(Code|Message)>([^<]{1,200})</\1>")
_STATUS = re.compile(r"non-2xx status code: (\d{3})")


_DELETE_BATCH = 1000
#: Pieces a GET body is streamed in when it is read into place.
_STREAM_PIECE = 1 << 20

T = TypeVar("T")


def describe_s3_error(error: BaseException) -> str:
    """One readable sentence for an obstore error: the server's status, code and message,
    or what failed on the way to it, without the request's URL or the Rust debug dump
    (both stay on the error, which the service logs)."""
    text = str(error).split(_DEBUG_SOURCE, 1)[0]
    fields = {match[1]: match[2] for match in _XML_FIELD.finditer(text)}
    status = _STATUS.search(text)
    if status:
        said = ": ".join(fields[key] for key in ("Code", "Message") if key in fields)
        return f"the server answered {status[1]}" + (f" ({said})" if said else "")
    if "/latest/api/token" in text or "/latest/meta-data" in text:
        return "no credentials were given, and the instance metadata service gave none"
    if "Connection refused" in str(error):
        return "the connection was refused"
    if "dns error" in str(error).lower():
        return "the server's name did not resolve"
    if "error sending request" in text or "tcp connect error" in str(error):
        return "the server could not be reached"
    first = " ".join(text.split())
    return first if len(first) <= 200 else first[:200] + "…"


def _list_all(store: S3Store, prefix: str) -> list[dict[str, Any]]:
    """The metadata of every object under ``prefix``, listed in pages of 1000 (blocking)."""
    found: list[dict[str, Any]] = []
    for batch in obstore.list(store, prefix, chunk_size=1000):
        found.extend(batch)  # type: ignore[arg-type]
    return found


def _get_bytes(store: S3Store, key: str, max_size: int | None) -> memoryview:
    """The bytes of the object at ``key`` (blocking); UnexpectedObjectError if it is larger
    than ``max_size``, before its body is read."""
    result = obstore.get(store, key)
    size = result.meta["size"]
    if max_size is not None and size > max_size:
        raise UnexpectedObjectError(f"is {size} bytes; at most {max_size} expected")
    return memoryview(result.bytes())


def _get_into(store: S3Store, key: str, buffers: list[memoryview], expected: int) -> None:
    """Stream the object at ``key`` into ``buffers`` (blocking), exactly as long as they
    are: no second buffer as large as the object."""
    result = obstore.get(store, key)
    size = result.meta["size"]
    if size != expected:
        raise UnexpectedObjectError(f"is {size} bytes; expected {expected}")
    views = [view for view in buffers if len(view)]
    for streamed in result.stream(min_chunk_size=_STREAM_PIECE):
        piece = memoryview(streamed)
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


def _next_joined(chunks: Iterator[EncodedChunk]) -> tuple[str, bytes] | None:
    """The next chunk as one bytes object (an object-store PUT takes one body).

    Its crc32c trailer, if the writer is to compute it, is computed here.
    """
    item = next(chunks, None)
    if item is None:
        return None
    key, buffers = item
    return key, b"".join(resolved(buffers))


def _folders(keys: list[str], root: str) -> list[str]:
    """The folders ``keys`` lie in, from the deepest up to ``root``, as object keys.

    Some S3 servers keep folders: SeaweedFS's filer holds a folder for every key prefix
    and keeps an emptied one (listed as a common prefix) for minutes, unless the folder
    itself is deleted once empty. Deleting a folder that is not empty does nothing
    there, and deleting a key that does not exist does nothing on any S3 server.
    """
    folders = {root}
    for key in keys:
        parent = key.rpartition("/")[0]
        while parent.startswith(root + "/"):
            folders.add(parent)
            parent = parent.rpartition("/")[0]
    return sorted(folders, key=lambda folder: folder.count("/"), reverse=True)


def _unset_settings(settings: dict[str, Any]) -> list[str]:
    """The settings a store that cannot be listed may be missing, as a person sets them."""
    unset = []
    if not settings["endpoint"]:
        unset.append("AWS_ENDPOINT_URL (without an endpoint, requests go to AWS S3)")
    if not (settings["access_key_id"] and settings["secret_access_key"]):
        unset.append("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (credentials)")
    return unset


class S3Backend(StoreBackend):
    """Snapshots under ``s3://bucket/prefix`` (see the module docstring)."""

    #: The least time gc's marker stays, however short the grace period gc runs with.
    marker_lifetime_seconds: float = 3600.0

    @classmethod
    def from_url(
        cls, url: str, options: dict[str, Any], threads: ThreadRunner, concurrency: int
    ) -> S3Backend:
        """The backend of ``s3://bucket/prefix``, its settings from ``options`` and the
        environment (see :func:`open_store`); InvalidArgumentTypeError (a TypeError) for an
        unknown option, InvalidArgumentError (a ValueError) for a bad bucket or prefix."""
        unknown = sorted(set(options) - set(S3_OPTIONS))
        if unknown:
            raise InvalidArgumentTypeError(
                f"unknown S3 store options {unknown}; known: {list(S3_OPTIONS)}"
            )
        parsed = urlparse(url)
        bucket = parsed.netloc
        if not _BUCKET.fullmatch(bucket):
            raise InvalidArgumentError(
                f"an S3 URL is s3://<bucket>/<prefix>; bucket {bucket!r} is not valid"
            )
        parts = [part for part in parsed.path.split("/") if part]
        if any(part in (".", "..") for part in parts):
            raise InvalidArgumentError(
                f"an S3 prefix may not contain '.' or '..' segments; got {url!r}"
            )
        environ = os.environ
        endpoint = (
            options.get("endpoint")
            or environ.get("AWS_ENDPOINT_URL_S3")
            or environ.get("AWS_ENDPOINT_URL")
        )
        config: dict[str, Any] = {}
        settings = {
            "endpoint": endpoint,
            "region": options.get("region")
            or environ.get("AWS_REGION")
            or environ.get("AWS_DEFAULT_REGION")
            or "us-east-1",
            "access_key_id": options.get("access_key_id") or environ.get("AWS_ACCESS_KEY_ID"),
            "secret_access_key": options.get("secret_access_key")
            or environ.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": options.get("session_token") or environ.get("AWS_SESSION_TOKEN"),
        }
        config.update({key: value for key, value in settings.items() if value})
        allow_http = options.get("allow_http")
        if allow_http is None:
            if "AWS_ALLOW_HTTP" in environ:
                allow_http = environ["AWS_ALLOW_HTTP"].strip().lower() in _TRUE
            else:  # an explicit http:// endpoint is a request for plain HTTP
                allow_http = bool(endpoint and endpoint.startswith("http://"))
        client_options = dict(options.get("client_options") or {})
        client_options.setdefault("allow_http", allow_http)
        store = S3Store(
            bucket,
            prefix="/".join(parts) or None,
            config=config,  # type: ignore[arg-type]
            client_options=client_options,  # type: ignore[arg-type]
            retry_config=options.get("retry_config"),
        )
        location = f"s3://{bucket}/{'/'.join(parts)}".rstrip("/")
        backend = cls(store, location, threads, concurrency)
        backend.unset_settings = _unset_settings(settings)
        return backend

    def __init__(self, store: S3Store, location: str, threads: ThreadRunner, max_concurrency: int):
        self._store = store
        self.location = location
        self._threads = threads
        self._requests = asyncio.Semaphore(max_concurrency)
        #: where each request runs (obstore's blocking functions; see the module docstring)
        self._request_threads = ThreadRunner(max_concurrency)
        self._prepared = False
        self._known_committed: set[str] = set()
        #: settings given neither as options nor in the environment (see ``check``)
        self.unset_settings: list[str] = []

    def _unavailable(self, action: str, error: BaseException) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"object store {self.location}: {action} failed: {describe_s3_error(error)}"
        )

    async def _request(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)`` (a blocking request) in a request thread.

        A cancelled caller waits for the request to end before it is cancelled: the thread
        cannot be stopped, and a write must not land after its caller cleaned up.
        """
        call = functools.partial(function, *args, **kwargs)
        running = asyncio.ensure_future(self._request_threads.run(call))
        try:
            return await asyncio.shield(running)
        except asyncio.CancelledError:
            await asyncio.wait([running])
            if not running.cancelled():
                running.exception()  # retrieved: the cancelled caller drops its outcome
            raise

    async def put(self, key: str, body: bytes | memoryview, *, create: bool = False) -> None:
        """PUT ``key``; with ``create``, only if it does not exist (AlreadyExistsError if it
        does: a conditional create, of which exactly one of several racing writers wins).

        StoreUnavailableError if the request fails.
        """
        async with self._requests:
            try:
                await self._request(
                    obstore.put,
                    self._store,
                    key,
                    body,
                    use_multipart=False,
                    mode="create" if create else "overwrite",
                )
            except AlreadyExistsError:
                if create:
                    raise
                raise self._unavailable(f"writing {key}", AlreadyExistsError(key)) from None
            except Exception as error:
                raise self._unavailable(f"writing {key}", error) from error

    async def head(self, key: str) -> dict[str, Any] | None:
        """The metadata of the object at ``key`` (``path``, ``size``, ``last_modified``, ...),
        or None if there is none; StoreUnavailableError if the request fails."""
        async with self._requests:
            try:
                meta = await self._request(obstore.head, self._store, key)
                return dict(meta)
            except (NotFoundError, FileNotFoundError):
                return None
            except Exception as error:
                raise self._unavailable(f"reading {key}", error) from error

    async def list_objects(self, prefix: str) -> list[dict[str, Any]]:
        """The metadata of every object whose key starts with ``prefix``, as :meth:`head`
        gives it, in pages of 1000; StoreUnavailableError if a request fails."""
        try:
            return await self._request(_list_all, self._store, prefix)
        except Exception as error:
            raise self._unavailable(f"listing {prefix}", error) from error

    async def delete_keys(self, keys: list[str]) -> None:
        """Delete ``keys``, 1000 per request; a key that is not there is not an error.

        StoreUnavailableError if a request fails.
        """
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = keys[start : start + _DELETE_BATCH]
            try:
                await self._request(obstore.delete, self._store, batch)
            except (NotFoundError, FileNotFoundError):
                pass
            except Exception as error:
                raise self._unavailable(f"deleting {len(batch)} objects", error) from error

    async def prepare(self) -> None:
        if self._prepared:
            return
        for key in (MANIFEST_NAME, f"{SNAPSHOTS_PREFIX}/{MANIFEST_NAME}"):
            if await self.head(key) is None:
                await self.put(key, dump_json(group_metadata()))
        self._prepared = True

    async def begin(self, snapshot_id: str, *, in_one_step: bool = False) -> SnapshotWriter:
        return _S3SnapshotWriter(self, snapshot_id)  # nothing to make before the first write

    async def begin_shard(self, snapshot_id: str, rank: int) -> ShardWriter:
        # Before any chunk is written: a second write of a rank would overwrite the
        # chunks of the shard it published (objects have no private staging folder).
        if await self.head(f"{shard_prefix(snapshot_id, rank)}/{MANIFEST_NAME}") is not None:
            raise written_twice(snapshot_id, rank)
        return _S3ShardWriter(self, snapshot_id, rank)

    async def read(self, key: str, max_size: int | None = None) -> memoryview:
        async with self._requests:
            try:
                return await self._request(_get_bytes, self._store, key, max_size)
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
                await self._request(_get_into, self._store, key, buffers, expected)
            except (NotFoundError, FileNotFoundError):
                raise MissingKeyError(key) from None
            except UnexpectedObjectError:
                raise
            except Exception as error:
                raise self._unavailable(f"reading {key}", error) from error

    async def size(self, key: str) -> int:
        meta = await self.head(key)
        if meta is None:
            raise MissingKeyError(key)
        return int(meta["size"])

    async def object_sizes(self, prefix: str) -> dict[str, int | None]:
        start = len(prefix) + 1
        return {
            meta["path"][start:]: meta["size"] for meta in await self.list_objects(prefix + "/")
        }

    async def folder_names(self, prefix: str) -> list[str]:
        """The names of the "folders" directly under ``prefix`` (its common prefixes, one
        listing request); StoreUnavailableError if the request fails."""
        try:
            listing = await self._request(obstore.list_with_delimiter, self._store, prefix)
        except Exception as error:
            raise self._unavailable(f"listing {prefix}", error) from error
        return [name.rstrip("/").rpartition("/")[2] for name in listing["common_prefixes"]]

    async def _snapshot_prefixes(self) -> list[str]:
        names = []
        for name in await self.folder_names(f"{SNAPSHOTS_PREFIX}/"):
            try:
                names.append(parse_snapshot_id(name))
            except ValueError:
                continue
        return names

    async def committed_ids(self, *, fresh: bool = False) -> list[str]:
        """Ids of the prefixes that hold a manifest.

        A manifest seen once is remembered (committed manifests are only ever deleted,
        never changed) unless ``fresh`` asks to check every one again: a snapshot that
        another process is deleting, or stopped deleting halfway, has lost its manifest
        but not its prefix.
        """
        names = await self._snapshot_prefixes()
        checked = names if fresh else [name for name in names if name not in self._known_committed]
        heads = await asyncio.gather(
            *(self.head(snapshot_key(name, MANIFEST_NAME)) for name in checked)
        )
        for name, head in zip(checked, heads, strict=True):
            if head:
                self._known_committed.add(name)
            else:
                self._known_committed.discard(name)
        self._known_committed.intersection_update(names)
        return [name for name in names if name in self._known_committed]

    def note_committed(self, snapshot_id: str) -> None:
        self._known_committed.add(snapshot_id)

    async def is_committed(self, snapshot_id: str) -> bool:
        if await self.head(snapshot_key(snapshot_id, MANIFEST_NAME)) is None:
            self._known_committed.discard(snapshot_id)
            return False
        return True

    async def delete_snapshot(self, snapshot_id: str) -> bool:
        manifest_key = snapshot_key(snapshot_id, MANIFEST_NAME)
        if await self.head(manifest_key) is None:
            return False
        await self.delete_keys([manifest_key])  # invisible from here on
        self._known_committed.discard(snapshot_id)
        # Deleted whatever happens next: what is left is a prefix without a manifest,
        # which gc removes, so a failure here must not fail the delete (nor a retention
        # pass that called it).
        try:
            objects = await self.list_objects(snapshot_key(snapshot_id) + "/")
            keys = [meta["path"] for meta in objects]
            await self.delete_keys(keys + _folders(keys, snapshot_key(snapshot_id)))
        except StoreUnavailableError as error:
            _log.warning(
                "store %s: snapshot %s is deleted but removing its objects failed (%s); "
                "gc removes them later",
                self.location,
                snapshot_id,
                error,
            )
        return True

    async def collect_garbage(self, grace_seconds: float) -> list[str]:
        removed = []
        for name in await self._snapshot_prefixes():
            if snapshot_id_time_ms(name) / 1000 > time.time() - grace_seconds:
                continue
            manifest_key = snapshot_key(name, MANIFEST_NAME)
            marker_key = snapshot_key(name, GC_MARKER_NAME)
            if await self.head(manifest_key) is not None:
                continue
            # "now" is when this prefix is looked at: a pass over many prefixes is slow
            now = time.time()
            cutoff = now - grace_seconds
            marker_cutoff = now - max(grace_seconds, self.marker_lifetime_seconds)
            objects = await self.list_objects(snapshot_key(name) + "/")
            leftovers = [meta for meta in objects if meta["path"] != marker_key]
            if not leftovers:  # only the marker of an earlier collection
                if all(meta["last_modified"].timestamp() <= marker_cutoff for meta in objects):
                    await self.delete_keys([meta["path"] for meta in objects])
                continue
            if any(meta["last_modified"].timestamp() > cutoff for meta in leftovers):
                continue
            # Claim, then look again: a writer that committed before the claim is seen
            # here; one that commits after it finds the marker (see the module docstring).
            await self.put(marker_key, b"")
            if await self.head(manifest_key) is not None:
                await self.delete_keys([marker_key])
                continue
            objects = await self.list_objects(snapshot_key(name) + "/")
            await self.delete_keys([meta["path"] for meta in objects if meta["path"] != marker_key])
            removed.append(name)
        return sorted(removed)

    async def check(self) -> None:
        """List the snapshots' folders once (one request); StoreUnavailableError naming
        what is unset if that fails."""
        try:
            await self.folder_names(f"{SNAPSHOTS_PREFIX}/")
        except StoreUnavailableError as error:
            cause = error.__cause__ or error
            unset = ", ".join(self.unset_settings)
            raise StoreUnavailableError(
                f"cannot list the object store {self.location}: {describe_s3_error(cause)}"
                + (f"; not set (nor in the store options): {unset}" if unset else "")
            ) from cause

    async def close(self) -> None:
        """Let the request threads go (each ends once its request has); obstore's client
        pool goes with the S3Store."""
        await asyncio.to_thread(self._request_threads.close)


class _S3SnapshotWriter(SnapshotWriter):
    def __init__(self, backend: S3Backend, snapshot_id: str, prefix: str | None = None) -> None:
        self._backend = backend
        self._snapshot_id = snapshot_id
        #: where the arrays go: the snapshot's prefix, or a shard's
        self._prefix = snapshot_key(snapshot_id) if prefix is None else prefix

    async def write_array(
        self, name: str, metadata: bytes | None, chunks: Iterator[EncodedChunk]
    ) -> None:
        uploads: list[asyncio.Task[None]] = []
        try:
            while True:
                item = await self._backend.threads.run(_next_joined, chunks)
                if item is None:
                    break
                key, body = item
                key = f"{self._prefix}/{name}/{key}" if name else f"{self._prefix}/{key}"
                uploads.append(asyncio.ensure_future(self._backend.put(key, body)))
                # Bound the encoded chunks held in memory: wait once a few are in flight.
                if len(uploads) >= 4:
                    await uploads.pop(0)
            await asyncio.gather(*uploads)
        except BaseException:
            for upload in uploads:
                upload.cancel()
            await asyncio.gather(*uploads, return_exceptions=True)
            raise
        if metadata is not None:  # None: the array is the snapshot's node (PACKED_AT_ROOT)
            await self._backend.put(f"{self._prefix}/{name}/{MANIFEST_NAME}", metadata)

    @property
    def written_where(self) -> str:
        """What this write put in the store, as messages name it."""
        return f"its objects in {self._backend.location} were"

    def _collected(self) -> StoreUnavailableError:
        return collected_error(self._snapshot_id, self.written_where)

    async def commit(self, group_metadata: bytes) -> None:
        turn = self.turn
        with holding(turn):  # released once the manifest is in place, or has failed
            await self._commit(group_metadata, turn)

    async def _commit(self, group_metadata: bytes, turn: CommitTurn | None) -> None:
        backend = self._backend
        manifest_key = snapshot_key(self._snapshot_id, MANIFEST_NAME)
        marker_key = snapshot_key(self._snapshot_id, GC_MARKER_NAME)
        if turn is not None:
            await turn.wait()
        if await backend.head(marker_key) is not None:
            raise self._collected()  # spares readers a manifest that is withdrawn at once
        await backend.put(manifest_key, group_metadata)
        # The check that matters: gc PUTs its marker before it looks for a manifest, so a
        # gc that did not see this manifest left a marker that this HEAD sees.
        if await backend.head(marker_key) is not None:
            await backend.delete_keys([manifest_key])
            raise self._collected()
        backend.note_committed(self._snapshot_id)

    async def abort(self) -> None:
        try:
            objects = await self._backend.list_objects(self._prefix + "/")
            await self._backend.delete_keys([meta["path"] for meta in objects])
        except Exception:  # noqa: BLE001 - best effort; gc collects what remains
            pass


class _S3ShardWriter(_S3SnapshotWriter, ShardWriter, ShardSteps):
    """Writes one rank's shard under ``snapshots/<id>/ranks/<rank>/``; publishes it in the
    steps of ``_shard_publish``.

    The shard's ``zarr.json`` is PUT last and only if absent (a conditional create), so a
    second write of the same rank is refused; the snapshot's ``zarr.json`` is likewise a
    conditional create, so of the ranks that find every shard there exactly one writes it,
    and the others read it back.
    """

    def __init__(self, backend: S3Backend, snapshot_id: str, rank: int) -> None:
        super().__init__(backend, snapshot_id, shard_prefix(snapshot_id, rank))
        self._rank = rank
        #: once published (or once another writer's shard of this rank is found), the
        #: objects under the prefix are not this writer's to remove
        self._keep = False

    async def publish(self, shard_document: bytes, shards: ShardedSet) -> bytes | None:
        return await publish_shard(self, shard_document, shards, self._backend.threads)

    @contextlib.asynccontextmanager
    async def claim_shard_set(self) -> AsyncIterator[Taken | None]:
        """Nothing is held (an object store has no lock): gc's marker is checked after each
        step instead, and the conditional creates keep ranks apart."""
        backend = self._backend
        if await backend.head(snapshot_key(self._snapshot_id, GC_MARKER_NAME)) is not None:
            yield Taken.COLLECTED
        elif await backend.head(snapshot_key(self._snapshot_id, MANIFEST_NAME)) is not None:
            yield Taken.COMMITTED
        else:
            yield None

    async def place_shard(self, shard_document: bytes) -> bool:
        try:
            await self._backend.put(f"{self._prefix}/{MANIFEST_NAME}", shard_document, create=True)
        except AlreadyExistsError:
            self._keep = True  # the other write's shard: its chunks share these keys
            return False
        self._keep = True
        return True

    async def shard_set_collected(self) -> bool:
        marker_key = snapshot_key(self._snapshot_id, GC_MARKER_NAME)
        return await self._backend.head(marker_key) is not None

    async def commit_shard_set(self, document: bytes) -> bytes | Taken | None:
        backend = self._backend
        manifest_key = snapshot_key(self._snapshot_id, MANIFEST_NAME)
        ranks_key = snapshot_key(self._snapshot_id, RANKS_GROUP, MANIFEST_NAME)
        await backend.put(ranks_key, ranks_group_document())
        try:
            await backend.put(manifest_key, document, create=True)
        except AlreadyExistsError:
            # Another rank found every shard at the same time and wrote the manifest. Its
            # own marker check (below) may still withdraw it, after any check made here,
            # so only that rank reports the commit; this shard is published either way.
            return None
        # As for a snapshot written whole: a gc that did not see the manifest left a
        # marker that this HEAD sees (see the module docstring).
        if await self.shard_set_collected():
            await backend.delete_keys([manifest_key])
            return Taken.COLLECTED
        backend.note_committed(self._snapshot_id)
        return document

    async def published_shards(self, known: dict[str, memoryview]) -> dict[str, memoryview]:
        ranks_prefix = snapshot_key(self._snapshot_id, RANKS_GROUP)
        names = [
            name
            for name in await self._backend.folder_names(ranks_prefix + "/")
            if rank_of_folder(name) is not None and name not in known
        ]
        documents = await asyncio.gather(
            *(self._shard_document(f"{ranks_prefix}/{name}/{MANIFEST_NAME}") for name in names)
        )
        found = dict(known)
        found.update((n, raw) for n, raw in zip(names, documents, strict=True) if raw is not None)
        return found

    async def _shard_document(self, key: str) -> memoryview | None:
        try:
            return await self._backend.read(key)
        except MissingKeyError:
            return None  # that rank is still writing

    async def abort(self) -> None:
        if not self._keep:
            await super().abort()
