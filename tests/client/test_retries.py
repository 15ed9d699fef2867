"""Retries and error mapping at unit level: answers scripted with httpx.MockTransport.

The client's ``_sleep`` is replaced by one that records the delay, so nothing waits.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import google_crc32c
import httpx
import pytest

from gradvault.client import AsyncClient, Client
from gradvault.core import (
    AuthError,
    ChecksumMismatchError,
    ClientRequestError,
    GradientsParamsRecord,
    SnapshotNotFoundError,
)
from gradvault.core.records.safetensors_file import safetensors_chunks
from tests.service.conftest import make_record

SNAPSHOT_ID = "01JBZ7Q5W6X8Y9Z0A1B2C3D4E5"
PAGE = {"data": [], "next_cursor": None}


class Script:
    """Answers requests in order from ``answers``; keeps every request and every sleep."""

    def __init__(self, answers: list[Callable[[httpx.Request], httpx.Response]]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.sleeps: list[float] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        request.read()
        self.requests.append(request)
        return self.answers.pop(0)(request)


def status(code: int, headers: dict[str, str] | None = None, body: Any = None):  # type: ignore[no-untyped-def]
    return lambda request: httpx.Response(
        code, headers=headers, json=body if body is not None else {"detail": "x", "error": "E"}
    )


def refuse_connection(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


async def call(
    script: Script,
    kind: str,
    method: str,
    *args: Any,
    client_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """``method`` of a ``kind`` client over ``script``, its sleeps recorded, not slept."""
    transport = httpx.MockTransport(script)
    options = client_options or {}
    if kind == "sync":
        client: Any = Client("http://service", transport=transport, **options)
        client._sleep = script.sleeps.append
    else:
        client = AsyncClient("http://service", transport=transport, **options)

        async def sleep(seconds: float) -> None:
            script.sleeps.append(seconds)

        client._sleep = sleep
    try:
        if method == "list":
            if kind == "sync":
                return list(client.list())
            return [item async for item in client.list()]
        result = getattr(client, method)(*args, **kwargs)
        return await result if inspect.isawaitable(result) else result
    finally:
        closed = client.close() if kind == "sync" else client.aclose()
        if inspect.isawaitable(closed):
            await closed


@pytest.fixture(params=["sync", "async"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


async def test_503_then_200_is_retried(kind: str) -> None:
    script = Script([status(503), status(502), status(200, body=PAGE)])
    assert await call(script, kind, "list") == []
    assert len(script.requests) == 3
    assert len(script.sleeps) == 2 and all(s >= 0 for s in script.sleeps)


async def test_connection_errors_are_retried_then_reported(kind: str) -> None:
    script = Script([refuse_connection] * 3)
    with pytest.raises(ClientRequestError, match="no answer from the service: ConnectError"):
        await call(script, kind, "info", SNAPSHOT_ID, client_options={"retries": 2})
    assert len(script.requests) == 3 and len(script.sleeps) == 2


async def test_429_waits_for_retry_after(kind: str) -> None:
    script = Script([status(429, headers={"Retry-After": "7"}), status(200, body=PAGE)])
    await call(script, kind, "list")
    assert script.sleeps == [7.0]


async def test_retry_after_is_capped(kind: str) -> None:
    script = Script([status(429, headers={"Retry-After": "86400"}), status(200, body=PAGE)])
    await call(script, kind, "list", client_options={"max_backoff_seconds": 5.0})
    assert script.sleeps == [5.0]


async def test_a_400_is_not_retried(kind: str) -> None:
    script = Script([status(400, body={"detail": "step is not an int", "error": "Bad"})])
    with pytest.raises(ClientRequestError, match="HTTP 400: step is not an int") as caught:
        await call(script, kind, "list")
    assert (caught.value.status, caught.value.error) == (400, "Bad")
    assert len(script.requests) == 1 and script.sleeps == []


async def test_retries_give_up_with_the_last_answer(kind: str) -> None:
    script = Script([status(503)] * 2)
    with pytest.raises(ClientRequestError, match="HTTP 503") as caught:
        await call(script, kind, "list", client_options={"retries": 1})
    assert caught.value.status == 503
    assert len(script.requests) == 2


async def test_a_retried_upload_sends_the_whole_body_again(kind: str) -> None:
    record = make_record(seed=3)
    expected = b"".join(bytes(chunk) for chunk in safetensors_chunks(record))
    summary = {"id": SNAPSHOT_ID, "run": "r", "step": 1, "created_at": "t", "nbytes": 1}
    script = Script([status(503), status(201, body={**summary, "num_params": 2})])
    result = await call(script, kind, "push", record, run="r", step=1)
    assert result.id == SNAPSHOT_ID
    for request in script.requests:
        assert request.content == expected
        assert request.headers["content-length"] == str(len(expected))


async def test_a_corrupted_byte_served_is_detected(kind: str) -> None:
    record = make_record(seed=4)
    body = bytearray(b"".join(bytes(chunk) for chunk in safetensors_chunks(record)))
    body[-1] ^= 0x01  # the last byte of the last gradient's data
    manifest = {
        "gradients": [{"param_id": str(e.param_id), "checksum": _crc(e.data)} for e in record]
    }
    script = Script(
        [status(200, body=manifest), lambda request: httpx.Response(200, content=bytes(body))]
    )
    with pytest.raises(ChecksumMismatchError, match=SNAPSHOT_ID):
        await call(script, kind, "fetch", SNAPSHOT_ID)


async def test_a_404_is_snapshot_not_found_and_not_retried(kind: str) -> None:
    script = Script([status(404, body={"detail": f"no snapshot {SNAPSHOT_ID}", "error": "E"})])
    with pytest.raises(SnapshotNotFoundError, match=SNAPSHOT_ID):
        await call(script, kind, "delete", SNAPSHOT_ID)
    assert len(script.requests) == 1


def _crc(data: memoryview) -> str:
    return f"crc32c:{google_crc32c.value(bytes(data)):08x}"


class DroppedBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body whose connection drops after its first ``keep`` bytes."""

    def __init__(self, body: bytes, keep: int) -> None:
        self.body, self.keep = body, keep

    def __iter__(self):  # type: ignore[no-untyped-def]
        yield self.body[: self.keep]
        raise httpx.ReadError("connection reset by peer")

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        yield self.body[: self.keep]
        raise httpx.ReadError("connection reset by peer")


async def test_a_download_dropped_mid_body_is_fetched_again(kind: str) -> None:
    record = make_record(seed=5)
    body = b"".join(bytes(chunk) for chunk in safetensors_chunks(record))
    manifest = {
        "gradients": [{"param_id": str(e.param_id), "checksum": _crc(e.data)} for e in record]
    }
    script = Script(
        [
            status(200, body=manifest),
            lambda request: httpx.Response(200, stream=DroppedBody(body, len(body) // 2)),
            lambda request: httpx.Response(200, content=body),
        ]
    )
    fetched = await call(script, kind, "fetch", SNAPSHOT_ID)
    assert [bytes(e.data) for e in fetched] == [bytes(e.data) for e in record]
    assert len(script.sleeps) == 1


async def test_a_download_that_keeps_dropping_is_reported(kind: str) -> None:
    body = b"x" * 64
    script = Script(
        [status(200, body={"gradients": []})]
        + [lambda request: httpx.Response(200, stream=DroppedBody(body, 8))] * 2
    )
    with pytest.raises(ClientRequestError, match="ReadError"):
        await call(script, kind, "fetch", SNAPSHOT_ID, client_options={"retries": 1})


@pytest.mark.parametrize(
    ("code", "error"),
    [
        (400, ClientRequestError),
        (401, AuthError),
        (403, AuthError),
        (404, SnapshotNotFoundError),
        (409, ClientRequestError),
        (413, ClientRequestError),
        (416, ClientRequestError),
        (422, ClientRequestError),
    ],
)
async def test_no_other_4xx_is_retried(kind: str, code: int, error: type[Exception]) -> None:
    script = Script([status(code)])
    with pytest.raises(error, match=f"HTTP {code}"):
        await call(script, kind, "info", SNAPSHOT_ID)
    assert len(script.requests) == 1 and script.sleeps == []


def _served(record: GradientsParamsRecord) -> tuple[bytes, dict[str, Any]]:
    body = b"".join(bytes(chunk) for chunk in safetensors_chunks(record))
    manifest = {
        "gradients": [{"param_id": str(e.param_id), "checksum": _crc(e.data)} for e in record]
    }
    return body, manifest


async def test_a_dropped_download_asks_for_the_rest_under_its_etag(kind: str) -> None:
    record = make_record(seed=6, sizes=((40, 40), (9,)))
    body, manifest = _served(record)
    half = len(body) // 2
    etag = '"st-0badf00d"'

    def rest(request: httpx.Request) -> httpx.Response:
        assert request.headers["range"] == f"bytes={half}-"
        assert request.headers["if-range"] == etag
        assert request.headers["accept-encoding"] == "identity"
        return httpx.Response(
            206,
            headers={"ETag": etag, "Content-Range": f"bytes {half}-{len(body) - 1}/{len(body)}"},
            content=body[half:],
        )

    script = Script(
        [
            status(200, body=manifest),
            lambda request: httpx.Response(
                200, headers={"ETag": etag}, stream=DroppedBody(body, half)
            ),
            rest,
        ]
    )
    dones: list[int] = []
    fetched = await call(
        script, kind, "fetch", SNAPSHOT_ID, progress=lambda done, total: dones.append(done)
    )
    assert [bytes(e.data) for e in fetched] == [bytes(e.data) for e in record]
    assert "range" not in script.requests[1].headers
    assert dones == sorted(dones) and dones[-1] == len(body)


async def test_a_file_changed_between_tries_is_taken_whole_and_checked_anew(kind: str) -> None:
    old_body, old_manifest = _served(make_record(seed=7))
    new_body, new_manifest = _served(make_record(seed=8))
    script = Script(
        [
            status(200, body=old_manifest),
            lambda request: httpx.Response(
                200, headers={"ETag": '"st-1"'}, stream=DroppedBody(old_body, 40)
            ),
            # If-Range names "st-1"; the service has "st-2" now, so it sends all of it
            lambda request: httpx.Response(200, headers={"ETag": '"st-2"'}, content=new_body),
            status(200, body=new_manifest),
        ]
    )
    fetched = await call(script, kind, "fetch", SNAPSHOT_ID)
    assert script.requests[2].headers["if-range"] == '"st-1"'
    assert [bytes(e.data) for e in fetched] == [bytes(e.data) for e in make_record(seed=8)]
    assert len(script.requests) == 4  # the manifest was read again


async def test_a_206_that_is_not_the_rest_is_refused(kind: str) -> None:
    body, manifest = _served(make_record(seed=9))
    script = Script(
        [
            status(200, body=manifest),
            lambda request: httpx.Response(
                200, headers={"ETag": '"st-1"'}, stream=DroppedBody(body, 40)
            ),
            lambda request: httpx.Response(
                206,
                headers={"ETag": '"st-1"', "Content-Range": f"bytes 0-9/{len(body)}"},
                content=body[:10],
            ),
        ]
    )
    with pytest.raises(ClientRequestError, match=r"HTTP 206 with Content-Range 'bytes 0-9/"):
        await call(script, kind, "fetch", SNAPSHOT_ID)


async def test_without_an_etag_a_dropped_download_starts_again(kind: str) -> None:
    body, manifest = _served(make_record(seed=10))
    script = Script(
        [
            status(200, body=manifest),
            lambda request: httpx.Response(200, stream=DroppedBody(body, 40)),
            lambda request: httpx.Response(200, content=body),
        ]
    )
    fetched = await call(script, kind, "fetch", SNAPSHOT_ID)
    assert "range" not in script.requests[2].headers
    assert [bytes(e.data) for e in fetched] == [bytes(e.data) for e in make_record(seed=10)]
