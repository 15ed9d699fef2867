"""One place that turns errors into HTTP answers: a status and ``{"detail", "error"}``."""

from __future__ import annotations

import errno
import logging

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


async def _gradvault_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, GradvaultError)
    status = status_for(error)
    name = type(error).__name__
    if status >= 500:
        _log.error("%s %s failed: %s: %s", request.method, request.url.path, name, error)
    count_error(request, name)
    return error_response(status, str(error), name, headers_for(error))


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
