"""One handler maps every error to a status and {"detail", "error"}; never a bare 500."""

from __future__ import annotations

import errno

import pytest

from gradvault.core import (
    ChecksumMismatchError,
    DtypeMismatchError,
    FormatVersionError,
    InvalidFieldError,
    InvalidParamIdError,
    InvalidSnapshotIdError,
    MissingGradientError,
    SnapshotBusyError,
    SnapshotNotFoundError,
    StoreUnavailableError,
)
from gradvault.service import (
    AuthenticationError,
    InsufficientStorageError,
    InvalidCursorError,
    PermissionDeniedError,
    RangeNotSatisfiableError,
    UploadTooLargeError,
)
from gradvault.service.error_handlers import PUBLIC_DETAIL_BY_STATUS, status_for

from .spy import spy_on_store

SNAPSHOT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


def _raised_from(cause: BaseException, error: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as outer:
        return outer


def _full_disk() -> StoreUnavailableError:
    # as the local backend reports it: the OSError from the write is the cause
    return _raised_from(
        OSError(errno.ENOSPC, "No space left on device"),
        StoreUnavailableError(f"local store /s: writing snapshot {SNAPSHOT} failed"),
    )


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (AuthenticationError("x"), 401),
        (PermissionDeniedError("x"), 403),
        (SnapshotNotFoundError("x"), 404),
        (MissingGradientError("x"), 404),
        (InvalidSnapshotIdError("x"), 400),
        (InvalidParamIdError("x"), 400),
        (InvalidCursorError("x"), 400),
        (SnapshotBusyError("x"), 409),
        (UploadTooLargeError("x"), 413),
        (RangeNotSatisfiableError("x", 10), 416),
        (InvalidFieldError("x"), 422),
        (DtypeMismatchError("x"), 422),
        (StoreUnavailableError("x"), 503),
        (InsufficientStorageError("x"), 507),
        (ChecksumMismatchError("x"), 500),
        (FormatVersionError("x"), 500),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_each_error_has_its_status(error, status):
    assert status_for(error) == status


def test_a_full_disk_inside_store_unavailable_is_507():
    assert status_for(_full_disk()) == 507


@pytest.fixture
def store_kind() -> str:
    return "local"


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (StoreUnavailableError(f"object store s3://b/p: reading snapshots/{SNAPSHOT} failed"), 503),
        (_full_disk(), 507),
        (SnapshotBusyError(f"snapshot {SNAPSHOT} is being written"), 409),
    ],
    ids=["unavailable", "full", "busy"],
)
async def test_store_failures_answer_json_with_their_status(service, error, status):
    await spy_on_store(service, fail_with=error)
    async with service.client() as client:
        for response in (
            await client.get(f"/v1/snapshots/{SNAPSHOT}"),
            await client.delete(f"/v1/snapshots/{SNAPSHOT}"),
            await client.get("/v1/snapshots"),
        ):
            assert response.status_code == status
            assert response.headers["content-type"] == "application/json"
            # a 503's or 507's own text is the backend's: the log has it, the body a sentence
            detail = PUBLIC_DETAIL_BY_STATUS.get(status, str(error))
            assert response.json() == {"detail": detail, "error": type(error).__name__}


async def test_readyz_is_503_when_the_store_cannot_be_reached(service):
    await spy_on_store(service, fail_with=StoreUnavailableError("object store s3://b: unreachable"))
    async with service.client() as client:
        response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["error"] == "StoreUnavailableError"


async def test_unknown_routes_and_bad_parameters_answer_error_bodies(service):
    async with service.client() as client:
        missing = await client.get("/v2/nothing")
        assert missing.status_code == 404 and missing.json()["error"] == "HTTPException"
        wrong_method = await client.put(f"/v1/snapshots/{SNAPSHOT}")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"] == "HTTPException"
        assert wrong_method.headers["allow"] == "DELETE, GET"  # every route at that path
        bad_limit = await client.get("/v1/snapshots", params={"limit": 0})
        assert bad_limit.status_code == 422
        assert bad_limit.json()["error"] == "RequestValidationError"
        assert "limit" in bad_limit.json()["detail"]
