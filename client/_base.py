"""Everything the two clients share except I/O: requests, retries, answers and errors.

:class:`Client` and :class:`AsyncClient` build their requests and read their answers
here; they only send them (httpx's own split between ``BaseClient`` and its two clients).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import crc32c
import httpx

from gradvault.core import (
    AuthError,
    ChecksumMismatchError,
    ClientRequestError,
    GradientsParams,
    GradientsParamsRecord,
    GradvaultError,
    ParamIdMismatchError,
    SnapshotNotFoundError,
)
from gradvault.core.autodiff.torch_adapter import is_torch_module
from gradvault.core.records.safetensors_file import record_header, safetensors_chunks
from gradvault.core.store import SnapshotInfo

#: Statuses worth another try: the service or a proxy in front of it is briefly unable.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
#: Methods sent again after a failure; a POST is too, when its body can be made again.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "DELETE"})
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
SNAPSHOTS = "/v1/snapshots"


#: One snapshot as a listing shows it: the core's summary, read from the service's JSON.
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


class BaseClient:
    """Request building, retry decisions, answer parsing and error mapping (no I/O)."""

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
    def _page(body: Mapping[str, Any]) -> tuple[list[SnapshotSummary], str | None]:
        return [SnapshotSummary.from_manifest(item) for item in body["data"]], body["next_cursor"]

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
            got = f"crc32c:{crc32c.crc32c(entry.data):08x}"
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
