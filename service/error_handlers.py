"""One place that turns errors into HTTP answers: a status and ``{"detail", "error"}``.

What a client reads is for strangers too: a detail names the snapshot or the input, never
a path or URL of the server's own (the store's location reads "the store"); a 503 or 507
says in one sentence what kind of trouble the service has, and the store's or the
operating system's own text goes to the log only. Echoed input is cut at the source
(``gradvault.core.errors.shown``), and no detail is longer than ``MAX_DETAIL_CHARACTERS``.
The log has every error's full message (5xx as errors, a 4xx whose detail was changed at
info).
"""

from __future__ import annotations

import errno
import logging
import os
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.routing import Match

from gradvault.core import (
    ChecksumMismatchError,
    FormatVersionError,
    GradvaultError,
    InvalidParamIdError,
    InvalidSnapshotIdError,
    InvalidStorePathError,
    InvalidUploadError,
    MissingGradientError,
    ShardedSnapshotError,
    SnapshotBusyError,
    SnapshotNotFoundError,
    StoreKeyNotFoundError,
    StoreUnavailableError,
)

from .errors import (
    AuthenticationError,
    InsufficientStorageError,
    InvalidCursorError,
    PermissionDeniedError,
    RangeNotSatisfiableError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
    UploadTooLargeError,
)
from .schemas import ErrorBody

_log = logging.getLogger("gradvault.service")

#: checked in order; the first class the error is an instance of gives the status
STATUS_BY_ERROR: list[tuple[type[BaseException] | tuple[type[BaseException], ...], int]] = [
    (AuthenticationError, 401),
    (PermissionDeniedError, 403),
    ((SnapshotNotFoundError, MissingGradientError, StoreKeyNotFoundError), 404),
    (
        (
            InvalidSnapshotIdError,
            InvalidParamIdError,
            InvalidCursorError,
            InvalidUploadError,
            InvalidStorePathError,
        ),
        400,
    ),
    # a whole-snapshot read of a sharded snapshot: the snapshot's state, not the request's form
    ((SnapshotBusyError, ShardedSnapshotError), 409),
    (RequestTimeoutError, 408),
    (UploadTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (RangeNotSatisfiableError, 416),
    (InsufficientStorageError, 507),
    (StoreUnavailableError, 503),
    # the stored data is damaged or written by another release: the server's fault
    ((ChecksumMismatchError, FormatVersionError), 500),
    # a name, run, step, tags or record the store refuses: the client's input
    (ValueError, 422),
]

_FULL_DISK = {errno.ENOSPC, errno.EDQUOT}

#: the longest detail an error body carries; a longer one is cut, with an ellipsis
MAX_DETAIL_CHARACTERS = 400
#: what a client reads for errors whose own text is the backend's or the system's
PUBLIC_DETAIL_BY_STATUS = {
    503: "the store could not be reached or read; the service's log says why",
    507: "no room is left on the store's disk or on the service's spool disk",
}


def is_full_disk(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, says a disk or quota is full."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_DISK:
            return True
        current = current.__cause__ or current.__context__
    return False


def status_for(error: GradvaultError) -> int:
    """The HTTP status that answers ``error``."""
    if isinstance(error, StoreUnavailableError) and is_full_disk(error):
        return 507
    for kinds, status in STATUS_BY_ERROR:
        if isinstance(error, kinds):
            return status
    return 500


def error_response(
    status: int, detail: str, error: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(detail=detail, error=error)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def headers_for(error: GradvaultError) -> dict[str, str] | None:
    if isinstance(error, AuthenticationError):
        return {"WWW-Authenticate": 'Bearer realm="gradvault"'}
    if isinstance(error, RangeNotSatisfiableError):
        return {"Content-Range": f"bytes */{error.size}"}
    return None


def count_error(request: Request, name: str) -> None:
    metrics = getattr(request.app.state, "metrics", None)
    if metrics is not None:
        metrics.errors.labels(name).inc()


def _server_locations(request: Request) -> list[str]:
    """The store's location as the service names it and as it was configured, longest first."""
    found = set()
    store = getattr(request.app.state, "store", None)
    if store is not None:
        found.add(store.location)
    configured = getattr(getattr(request.app.state, "settings", None), "store", None)
    if configured:
        found.add(configured)
        if "://" not in configured:
            found.add(os.path.abspath(os.path.expanduser(configured)))
    return sorted((place for place in found if place), key=len, reverse=True)


def public_detail(request: Request, error: GradvaultError, status: int) -> str:
    """The detail a client reads for ``error`` (see the module docstring)."""
    if status in PUBLIC_DETAIL_BY_STATUS:
        return PUBLIC_DETAIL_BY_STATUS[status]
    detail = str(error)
    for place in _server_locations(request):
        detail = re.sub(rf"(?:(?:local|object) )?store {re.escape(place)}", "the store", detail)
        if len(place) > 1 and (os.path.isabs(place) or "://" in place):
            detail = detail.replace(place, "the store")
    if len(detail) > MAX_DETAIL_CHARACTERS:
        detail = detail[: MAX_DETAIL_CHARACTERS - 1] + "…"
    return detail


def _log_text(error: BaseException) -> str:
    """The error's message and those of the errors it was raised from (a backend's own text)."""
    parts = [f"{type(error).__name__}: {error}"]
    cause = error.__cause__
    while cause is not None and len(parts) < 4:
        parts.append(f"from {type(cause).__name__}: {cause}")
        cause = cause.__cause__
    return "; ".join(parts)


async def _gradvault_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, GradvaultError)
    status = status_for(error)
    name = type(error).__name__
    detail = public_detail(request, error, status)
    if status >= 500:
        _log.error("%s %s failed: %s", request.method, request.url.path, _log_text(error))
    elif detail != str(error):
        _log.info("%s %s answered %d: %s", request.method, request.url.path, status, error)
    count_error(request, name)
    return error_response(status, detail, name, headers_for(error))


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    problems = []
    for problem in error.errors():
        where = ".".join(str(part) for part in problem.get("loc", ()))
        problems.append(f"{where}: {problem.get('msg', 'invalid')}")
    count_error(request, "RequestValidationError")
    return error_response(422, "; ".join(problems) or "invalid request", "RequestValidationError")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.state.api_routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, HTTPException)
    count_error(request, "HTTPException")
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return error_response(error.status_code, str(error.detail), "HTTPException", headers or None)


def install_error_handlers(app: FastAPI) -> None:
    """Answer the core's and the service's errors, and FastAPI's own, as ErrorBody JSON."""
    app.add_exception_handler(GradvaultError, _gradvault_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)


def error_responses(
    *statuses: int, binary_route: bool = False
) -> dict[int | str, dict[str, object]]:
    """OpenAPI ``responses`` documenting an ErrorBody for each of ``statuses``.

    On a route whose own responses are binary, FastAPI would document a model under the
    route's media type; there the JSON schema is given explicitly instead.
    """
    descriptions = {
        400: "Malformed id, path, cursor or upload",
        401: "No bearer token, or an unknown one",
        403: "The token's scope does not allow this",
        404: "No such snapshot, gradient or key",
        409: "The store is busy with this snapshot",
        408: "The request body stopped arriving (body_timeout_seconds)",
        413: "The upload is larger than max_upload_bytes",
        415: "The body's Content-Type is not one this route documents",
        416: "The Range misses the resource",
        422: "A parameter or field the service or the store refuses",
        500: "Stored data is damaged or of another format version",
        503: "The store cannot be reached",
        507: "The store's disk, or the service's spool, is full",
    }
    if binary_route:
        content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        return {
            status: {"content": content, "description": descriptions[status]} for status in statuses
        }
    return {
        status: {"model": ErrorBody, "description": descriptions[status]} for status in statuses
    }
