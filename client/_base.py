"""Everything the two clients share except I/O: requests, retries, answers and errors.

Every method of :class:`Client` and :class:`AsyncClient` is written once here, as a
generator of I/O steps (:mod:`._steps`): it decides what to send, when to try again,
where a download resumes, what a retention pass deletes; the two clients only perform
the steps, blocking or awaited (httpx's own split between ``BaseClient`` and its two
clients).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

import crc32c_rs
import httpx

from gradvault.core import (
    AuthError,
    ChecksumMismatchError,
    ClientRequestError,
    GradientsParams,
    GradientsParamsRecord,
    GradvaultError,
    InvalidArgumentError,
    ParamIdMismatchError,
    ShardedSnapshotError,
    ShardInfo,
    SnapshotNotFoundError,
)
from gradvault.core.autodiff.torch_adapter import is_torch_module
from gradvault.core.records.safetensors_file import (
    record_from_safetensors,
    record_header,
    safetensors_chunks,
)
from gradvault.core.store import RetentionRules, SnapshotInfo, check_rank, parse_snapshot_id

from ._files import part_beside, place
from ._steps import Blocking, Capture, Close, Discard, Receive, Send, Sleep, Steps

_log = logging.getLogger("gradvault.client")

#: Statuses worth another try: the service or a proxy in front of it is briefly unable.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Methods sent again after a failure; a POST is too, when its body can be made again.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "DELETE"})
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
SNAPSHOTS = "/v1/snapshots"
#: The most snapshots one listing page asks for (the service's own limit).
MAX_PAGE_SIZE = 1000
#: What a shard upload's answer says of the shard, besides the committed snapshot's summary.
_SHARD_FIELDS = (
    *("id", "run", "step", "created_at", "rank", "world_size", "nbytes", "num_params"),
    "committed",
)
#: The service's error names for a manifest that readers refuse (answered 500).
UNREADABLE_ERRORS = frozenset({"FormatVersionError", "ManifestError"})


#: One snapshot as a listing shows it: the core's :class:`SnapshotInfo` itself, read from
#: the service's JSON (whose schema is the service's pydantic ``SnapshotSummary``, the same
#: fields; the client never imports the service). Kept under this name, which it exports.
SnapshotSummary = SnapshotInfo

#: ``progress(done_bytes, total_bytes)``: told how far a transfer is, each time bytes move.
#: ``total_bytes`` is None when the service did not say. A try sent again starts again at
#: the bytes it keeps (0 for an upload; what was written, for a resumed download).
ProgressCallback = Callable[[int, "int | None"], None]


@dataclass
class TransferMeter:
    """Counts one transfer's bytes and tells ``progress`` (if any) after each step."""

    progress: ProgressCallback | None
    done: int = 0
    total: int | None = None

    def start(self, done: int, total: int | None) -> None:
        """A try begins with ``done`` bytes already in place, of ``total``."""
        self.done, self.total = done, total
        self._tell()

    def moved(self, count: int) -> None:
        """``count`` more bytes were sent or written."""
        self.done += count
        self._tell()

    def _tell(self) -> None:
        if self.progress is not None:
            self.progress(self.done, self.total)


@dataclass(frozen=True)
class Upload:
    """A record as a safetensors request body that can be generated again for a retry."""

    record: GradientsParamsRecord
    progress: ProgressCallback | None = field(default=None, compare=False)

    @cached_property
    def length(self) -> int:
        return len(record_header(self.record)) + self.record.nbytes

    @property
    def headers(self) -> dict[str, str]:
        """The request headers of the body: its length is known before any byte is made."""
        return {"Content-Length": str(self.length), "Content-Type": "application/octet-stream"}

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The body from its first byte, ``progress`` told as each piece is taken to send."""
        meter = TransferMeter(self.progress)
        meter.start(0, self.length)
        for chunk in safetensors_chunks(self.record):
            yield chunk
            meter.moved(memoryview(chunk).nbytes)


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


@dataclass
class Resumption:
    """A download between tries: the bytes kept, and the ETag they were sent under.

    A try after a dropped connection asks for the rest only (``Range: bytes=<kept>-``)
    and only if the file is still the one those bytes came from (``If-Range: <ETag>``);
    otherwise the service sends the whole file, and the kept bytes are dropped.
    """

    written: int = 0
    total: int | None = None
    etag: str | None = None
    #: the file changed under the download (another ETag): its manifest must be read again
    changed: bool = False

    def request_headers(self) -> dict[str, str]:
        """The next try's headers; bytes as stored (no content coding) so offsets hold."""
        headers = {"Accept-Encoding": "identity"}
        if self.written and self.etag is not None:
            headers.update({"Range": f"bytes={self.written}-", "If-Range": self.etag})
        return headers

    def begin(self, response: httpx.Response) -> int:
        """Where in the file this answer's body goes; the bytes before it are kept.

        ClientRequestError if a 206 is not the rest of the same file.
        """
        etag = response.headers.get("etag")
        strong = etag if etag and not etag.startswith("W/") else None
        if response.status_code == 206:
            content_range = response.headers.get("content-range", "")
            match = _CONTENT_RANGE.fullmatch(content_range.strip())
            if (
                match is None
                or int(match[1]) != self.written
                or int(match[2]) + 1 != int(match[3])
                or strong != self.etag
            ):
                request = response.request
                error = ClientRequestError(
                    f"{request.method} {request.url}: HTTP 206 with Content-Range "
                    f"{content_range!r} and ETag {etag!r}; the download asked for "
                    f"bytes={self.written}- of ETag {self.etag}"
                )
                error.status = 206
                error.request, error.response = request, response
                raise error
            self.total = int(match[3])
        else:
            self.changed = self.changed or (self.etag is not None and strong != self.etag)
            self.written = 0
            self.total = BaseClient._body_length(response)
        self.etag = strong
        return self.written

    def wrote(self, count: int) -> None:
        self.written += count


class BaseClient(ABC):
    """Every method's logic, as generators of I/O steps; a subclass performs the steps.

    Besides performing the steps (and driving the generators), a subclass gives
    :meth:`_content`, an upload's body in the iteration its transport reads, and sets
    ``_http``, the httpx client that builds and sends its requests.
    """

    _http: httpx.Client | httpx.AsyncClient

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float | httpx.Timeout = DEFAULT_TIMEOUT,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        max_backoff_seconds: float = 30.0,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries is a count >= 0; got {retries}")
        self.base_url = base_url.rstrip("/")
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token is not None else {}

    # ------------------------------------------------------------------ requests
    @staticmethod
    def _list_params(
        run: str | None, step_min: int | None, step_max: int | None, page_size: int
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"limit": page_size}
        for key, value in (("run", run), ("step_min", step_min), ("step_max", step_max)):
            if value is not None:
                params[key] = value
        return params

    @staticmethod
    def _push_params(run: str, step: int, tags: Mapping[str, str] | None) -> dict[str, Any]:
        params: dict[str, Any] = {"run": run, "step": step}
        if tags:
            params["tags"] = json.dumps(dict(tags), separators=(",", ":"))
        return params

    @staticmethod
    def _snapshot_path(snapshot_id: str) -> str:
        return f"{SNAPSHOTS}/{snapshot_id}"

    # ------------------------------------------------------------------ retries
    def _retry_delay(
        self, attempt: int, method: str, upload: Upload | None, response: httpx.Response | None
    ) -> float | None:
        """Seconds to wait before sending again, or None to stop (``attempt`` counts from 0).

        ``response`` is None after a connection error. Exponential backoff with full
        jitter; a 429's ``Retry-After`` seconds are honoured, up to the backoff cap.
        """
        if attempt >= self.retries:
            return None
        if method not in IDEMPOTENT_METHODS and upload is None:
            return None
        if response is not None and response.status_code not in RETRY_STATUSES:
            return None
        if response is not None and response.status_code == 429:
            retry_after = _retry_after_seconds(response)
            if retry_after is not None:
                return min(retry_after, self.max_backoff_seconds)
        ceiling = min(self.max_backoff_seconds, self.backoff_seconds * 2**attempt)
        return random.uniform(0, ceiling)

    # ------------------------------------------------------------------ answers
    @staticmethod
    def _error(response: httpx.Response) -> GradvaultError:
        """The core error for an error answer (its body read), naming the request."""
        request = response.request
        detail, error_name = _error_body(response)
        what = f"{request.method} {request.url}: HTTP {response.status_code}"
        message = f"{what}: {detail}" if detail else what
        error: GradvaultError
        if response.status_code == 404:
            error = SnapshotNotFoundError(message)
        elif response.status_code in (401, 403):
            error = AuthError(message)
        else:
            error = ClientRequestError(message)
        # the fields ClientRequestError declares, on whichever of the three errors it is
        vars(error).update(
            status=response.status_code,
            detail=detail,
            error=error_name,
            request=request,
            response=response,
        )
        return error

    @staticmethod
    def _unreachable(request: httpx.Request, cause: httpx.TransportError) -> ClientRequestError:
        error = ClientRequestError(
            f"{request.method} {request.url}: no answer from the service: "
            f"{type(cause).__name__}: {cause}"
        )
        error.request = request
        return error

    @staticmethod
    def _body_length(response: httpx.Response) -> int | None:
        """The answer's body length from ``Content-Length``; None if it does not say."""
        text = response.headers.get("content-length", "")
        return int(text) if text.isdigit() else None

    @staticmethod
    def _summary(item: Mapping[str, Any]) -> SnapshotSummary:
        """A summary from the service's JSON, whose ``shards`` (a sharded snapshot's) are one
        object per rank where a manifest has them by column."""
        rows = item.get("shards")
        if not rows:
            return SnapshotSummary.from_manifest(dict(item))
        columns = {key: [row[key] for row in rows] for key in rows[0]}
        return SnapshotSummary.from_manifest({**item, "shards": columns})

    @classmethod
    def _page(cls, body: Mapping[str, Any]) -> tuple[list[SnapshotSummary], str | None]:
        return [cls._summary(item) for item in body["data"]], body["next_cursor"]

    @staticmethod
    def _rank_params(rank: int | None) -> dict[str, Any]:
        """The query that picks rank ``rank``'s shard of a sharded snapshot (none for None)."""
        if rank is None:
            return {}
        if type(rank) is not int or rank < 0:  # bools are refused
            raise InvalidArgumentError(f"rank must be an int >= 0 or None; got {rank!r}")
        return {"rank": rank}

    @staticmethod
    def _whole_or_shard(manifest: Mapping[str, Any], rank: int | None) -> None:
        """ShardedSnapshotError if ``manifest`` is a sharded snapshot's and no rank is given:
        its gradients are in its ranks' shards, and ParamIds may repeat across them."""
        world_size = manifest.get("world_size")
        if rank is None and manifest.get("rank") is None and world_size is not None:
            raise ShardedSnapshotError(
                f"snapshot {manifest['id']} is sharded over {world_size} ranks: pass rank= "
                f"(0..{world_size - 1}) to get one rank's shard"
            )

    @staticmethod
    def _verify(
        snapshot_id: str, record: GradientsParamsRecord, manifest: Mapping[str, Any]
    ) -> None:
        """Every gradient of ``record`` has the manifest's crc32c, and none is missing."""
        expected = {g["param_id"]: g for g in manifest["gradients"]}
        found = {str(entry.param_id) for entry in record}
        if found != set(expected):
            raise ParamIdMismatchError(
                f"snapshot {snapshot_id}: the download holds ParamIds {sorted(found)}; "
                f"its manifest lists {sorted(expected)}"
            )
        for entry in record:
            want = expected[str(entry.param_id)]["checksum"]
            got = f"crc32c:{crc32c_rs.crc32c(entry.data):08x}"
            if got != want:
                raise ChecksumMismatchError(
                    f"snapshot {snapshot_id}, gradient {entry.param_id} ({entry.name!r}): "
                    f"the downloaded bytes have {got}; the manifest says {want}"
                )

    @staticmethod
    def _restored(
        record: GradientsParamsRecord, device: str, module: Any, match: str
    ) -> GradientsParams:
        if is_torch_module(module):  # the gradients become its parameters' .grad
            grads = GradientsParams.from_record(record, device)
            grads.to_torch(module, match=match)
            return grads
        return GradientsParams.from_record(record, device, module=module, match=match)

    # ------------------------------------------------------------------ the logic
    @abstractmethod
    def _content(self, upload: Upload) -> Any:
        """``upload``'s body made anew: an iterator, or an async iterator for asyncio."""

    def _sending(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        upload: Upload | None = None,
        stream: bool = False,
    ) -> Steps[httpx.Response]:
        """The first answer that is not an error, after retries; the core error otherwise."""
        attempt = 0
        while True:
            content = None
            if upload is not None:  # a fresh generator each try: the body is made again
                headers, content = upload.headers, self._content(upload)
            request = self._http.build_request(
                method, path, params=params, headers=headers, content=content
            )
            try:
                response = yield Send(request, stream)
            except httpx.TransportError as error:
                delay = self._retry_delay(attempt, method, upload, None)
                if delay is None:
                    raise self._unreachable(request, error) from error
            else:
                if not response.is_error:
                    return response
                delay = self._retry_delay(attempt, method, upload, response)
                yield Discard(response)
                if delay is None:
                    raise self._error(response)
            yield Sleep(delay)
            attempt += 1

    def _json_of(self, method: str, path: str, **options: Any) -> Steps[Any]:
        response = yield from self._sending(method, path, **options)
        return response.json()

    def _page_of(
        self, params: dict[str, Any]
    ) -> Steps[tuple[list[SnapshotSummary], dict[str, Any] | None]]:
        """One listing page: its summaries, and the next page's params (None after the last)."""
        page, cursor = self._page((yield from self._json_of("GET", SNAPSHOTS, params=params)))
        return page, (None if cursor is None else {**params, "cursor": cursor})

    def _info_of(self, snapshot_id: str, rank: int | None = None) -> Steps[dict[str, Any]]:
        params = self._rank_params(rank)
        return (yield from self._json_of("GET", self._snapshot_path(snapshot_id), params=params))

    def _pushing(
        self,
        grads_or_record: GradientsParams | GradientsParamsRecord,
        run: str,
        step: int,
        tags: Mapping[str, str] | None,
        progress: ProgressCallback | None,
    ) -> Steps[SnapshotSummary]:
        record = (
            (yield Capture(grads_or_record))
            if isinstance(grads_or_record, GradientsParams)
            else grads_or_record
        )
        body = yield from self._json_of(
            "POST",
            SNAPSHOTS,
            params=self._push_params(run, step, tags),
            upload=Upload(record, progress),
        )
        return self._summary(body)

    def _pushing_shard(
        self,
        grads_or_record: GradientsParams | GradientsParamsRecord,
        shard: tuple[str, int, int],
        run: str,
        step: int,
        tags: Mapping[str, str] | None,
        progress: ProgressCallback | None,
    ) -> Steps[ShardInfo]:
        """Upload one rank's shard of a sharded snapshot (docs/SERVICE.md, "Shard uploads")."""
        snapshot_id, rank, world_size = shard
        snapshot_id = parse_snapshot_id(snapshot_id)  # before any capture or request
        rank, world_size = check_rank(rank, world_size)
        record = (
            (yield Capture(grads_or_record))
            if isinstance(grads_or_record, GradientsParams)
            else grads_or_record
        )
        params = {**self._push_params(run, step, tags), "rank": rank, "world_size": world_size}
        body = yield from self._json_of(
            "POST",
            self._snapshot_path(snapshot_id) + "/shards",
            params=params,
            upload=Upload(record, progress),
        )
        snapshot = body.get("snapshot")
        return ShardInfo(
            **{key: body[key] for key in _SHARD_FIELDS},
            snapshot=None if snapshot is None else self._summary(snapshot),
        )

    def _downloading(
        self,
        snapshot_id: str,
        path: Path,
        progress: ProgressCallback | None,
        rank: int | None = None,
    ) -> Steps[GradientsParamsRecord]:
        """Download the file to ``path`` (resumed after a drop), fsync it, verify it; of a
        sharded snapshot, rank ``rank``'s shard."""
        manifest = yield from self._info_of(snapshot_id, rank)
        self._whole_or_shard(manifest, rank)
        meter = TransferMeter(progress)
        resumption = Resumption()

        def moved(count: int) -> None:
            resumption.wrote(count)
            meter.moved(count)

        attempt = furthest = 0
        with open(path, "wb") as file:
            while True:  # a connection dropped mid-body: the rest is asked for (Range)
                response = yield from self._sending(
                    "GET",
                    self._snapshot_path(snapshot_id) + "/safetensors",
                    params=self._rank_params(rank),
                    headers=resumption.request_headers(),
                    stream=True,
                )
                try:
                    file.seek(resumption.begin(response))
                    file.truncate()
                    meter.start(resumption.written, resumption.total)
                    yield Receive(response, file, moved)
                    break
                except httpx.TransportError as error:
                    if resumption.written > furthest:  # got further: the tries count anew
                        attempt, furthest = 0, resumption.written
                    delay = self._retry_delay(attempt, "GET", None, None)
                    if delay is None:
                        raise self._unreachable(response.request, error) from error
                finally:
                    yield Close(response)
                yield Sleep(delay)
                attempt += 1
            yield Blocking(_flush_to_disk, (file,))
        if resumption.changed:  # the file changed between tries: check against its manifest
            manifest = yield from self._info_of(snapshot_id, rank)
        record = yield Blocking(record_from_safetensors, (path,))
        yield Blocking(self._verify, (snapshot_id, record, manifest))
        return record

    def _fetching(
        self, snapshot_id: str, progress: ProgressCallback | None, rank: int | None = None
    ) -> Steps[GradientsParamsRecord]:
        descriptor, name = tempfile.mkstemp(suffix=".safetensors")
        os.close(descriptor)
        try:  # the record maps the file; the mapping outlives its name
            return (yield from self._downloading(snapshot_id, Path(name), progress, rank))
        finally:
            os.unlink(name)

    def _restoring(
        self,
        snapshot_id: str,
        device: str,
        module: Any,
        match: str,
        progress: ProgressCallback | None,
        rank: int | None = None,
    ) -> Steps[GradientsParams]:
        record = yield from self._fetching(snapshot_id, progress, rank)
        return self._restored(record, device, module, match)

    def _downloading_to(
        self,
        snapshot_id: str,
        path: str | os.PathLike[str],
        progress: ProgressCallback | None,
        rank: int | None = None,
    ) -> Steps[Path]:
        path = Path(path)
        part = part_beside(path)
        try:
            record = yield from self._downloading(snapshot_id, part, progress, rank)
            yield Blocking(place, (path, part, record))
        finally:
            part.unlink(missing_ok=True)
        return path

    def _deleting(self, snapshot_id: str) -> Steps[None]:
        yield from self._sending("DELETE", self._snapshot_path(snapshot_id))

    def _retaining(
        self, keep_last: int | None, keep_every: int | None, run: str | None
    ) -> Steps[list[str]]:
        """What a store's retention pass does, over HTTP: decide from a fresh listing, and
        before each deletion check that the newest snapshot kept is still there; if it is
        not, decide again (``RetentionRules.rounds`` times at most)."""
        rules = RetentionRules(keep_last, keep_every)
        if rules.keeps_everything:
            return []
        deleted: list[str] = []
        for _ in range(rules.rounds):
            infos = yield from self._readable_newest_first(run)
            for snapshot_id in rules.doomed(infos, protected=()):
                if not (yield from self._still_there(infos[0].id)):
                    break  # the newest we keep is gone: decide again from a new listing
                try:
                    yield from self._deleting(snapshot_id)
                except SnapshotNotFoundError:
                    continue  # deleted by someone else meanwhile: not by this pass
                deleted.append(snapshot_id)
            else:
                return deleted
        _log.warning(
            "service %s: retention stopped: in each of %d rounds the newest snapshot it "
            "kept was deleted by someone else before it was done; it deleted %s",
            self.base_url,
            rules.rounds,
            deleted,
        )
        return deleted

    def _readable_newest_first(self, run: str | None) -> Steps[list[SnapshotSummary]]:
        """Every snapshot (of ``run``), newest first, the first one's manifest just read.

        A newest snapshot that is gone since the listing, or whose manifest readers refuse,
        is left out (and alone): retention must not keep it as "the newest" and delete the
        newest good one for it.
        """
        infos: list[SnapshotSummary] = []
        params: dict[str, Any] | None = self._list_params(run, None, None, MAX_PAGE_SIZE)
        while params is not None:
            page, params = yield from self._page_of(params)
            infos.extend(page)
        while infos:
            try:
                yield from self._info_of(infos[0].id)
            except SnapshotNotFoundError:
                pass  # deleted since the listing
            except ClientRequestError as error:
                if getattr(error, "error", None) not in UNREADABLE_ERRORS:
                    raise
                _log.warning(
                    "service %s: retention leaves snapshot %s alone, readers refuse it: %s",
                    self.base_url,
                    infos[0].id,
                    error,
                )
            else:
                return infos
            infos = infos[1:]
        return infos

    def _still_there(self, snapshot_id: str) -> Steps[bool]:
        try:
            yield from self._info_of(snapshot_id)
        except SnapshotNotFoundError:
            return False
        return True


def _flush_to_disk(file: BinaryIO) -> None:
    file.flush()
    os.fsync(file.fileno())


def _retry_after_seconds(response: httpx.Response) -> float | None:
    text = response.headers.get("retry-after", "").strip()
    try:
        seconds = float(text)
    except ValueError:
        return None  # an HTTP date, or nothing: the backoff decides
    return max(seconds, 0.0)


def _error_body(response: httpx.Response) -> tuple[str | None, str | None]:
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        text = response.text.strip()[:200] if response.content else ""
        return (text or None), None
    if not isinstance(body, dict):
        return None, None
    detail, error = body.get("detail"), body.get("error")
    return (
        detail if isinstance(detail, str) else (json.dumps(detail) if detail else None),
        error if isinstance(error, str) else None,
    )
