"""The service's limits on connections and bodies, over real sockets to a real uvicorn.

Each test talks raw HTTP/1.1 over a socket to the service on 127.0.0.1, as an attacker
would: half a request line, a body that never ends, more connections than allowed. The
sockets carry a generous timeout only so that a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import pytest

from gradvault.client.cli.serve import BackgroundService

from .processes import ServiceProcess
from .safetensors_bodies import good_file

#: bounds every read: a service that never answers fails the test, it is never waited out
SOCKET_TIMEOUT_SECONDS = 30
TOKEN = "limits-write-token"


@pytest.fixture
def make_served(make_served) -> Callable[..., BackgroundService]:
    """The shared ``make_served``, every service with a write token unless told otherwise."""
    return lambda **settings: make_served(**({"tokens": f"{TOKEN}:write"} | settings))


def connect(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=SOCKET_TIMEOUT_SECONDS)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def read_until_closed(connection: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def read_response(connection: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response: status, headers (lower-case names) and its Content-Length body."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(65536)
        assert chunk, f"the connection closed before a response; got {received!r}"
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = connection.recv(65536)
        assert chunk, "the connection closed inside the response body"
        body += chunk
    return int(status_line.split()[1]), headers, body


def login_head(**headers: str) -> bytes:
    lines = [
        "POST /ui/login HTTP/1.1",
        "Host: 127.0.0.1",
        "Content-Type: application/x-www-form-urlencoded",
    ] + [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# A1: a body read whole is refused before it is buffered


def test_a_login_body_larger_than_its_limit_is_refused_by_its_content_length(make_served):
    service = make_served()
    with connect(service.port) as connection:
        # 128 MiB announced, a few bytes sent: the answer must not wait for the rest
        connection.sendall(login_head(Content_Length=str(128 << 20)) + b"token=x")
        status, headers, body = read_response(connection)
        assert status == 413
        assert headers["connection"] == "close"
        error = json.loads(body)
        assert error["error"] == "UploadTooLargeError"
        assert "134217728 bytes" in error["detail"] and "at most 4096" in error["detail"]
        assert read_until_closed(connection) == b""  # and the connection is closed


def test_a_chunked_login_body_is_refused_once_past_the_limit(make_served):
    service = make_served(max_body_bytes=2048)
    with connect(service.port) as connection:
        connection.sendall(login_head(Transfer_Encoding="chunked"))
        chunk = b"a" * 1024
        for _ in range(3):  # 3 KiB sent, and the body never ends
            connection.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        status, headers, body = read_response(connection)
    assert status == 413 and headers["connection"] == "close"
    assert "passed 2048 bytes" in json.loads(body)["detail"]


def test_a_body_within_the_limit_is_read(make_served):
    service = make_served()
    form = f"token={TOKEN}&next=/ui".encode()
    with connect(service.port) as connection:
        connection.sendall(login_head(Content_Length=str(len(form))) + form)
        status, headers, _ = read_response(connection)
    assert status == 303 and headers["location"] == "/ui"


def test_uploads_are_bounded_by_their_own_limit_not_the_form_limit(make_served):
    service = make_served(max_body_bytes=64)
    body = good_file()
    assert len(body) > 64
    head = (
        f"POST /v1/snapshots?run=r&step=1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/octet-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(service.port) as connection:
        connection.sendall(head + body)
        status, _, answer = read_response(connection)
    assert status == 201, answer


def test_a_body_that_stops_arriving_is_answered_408(make_served):
    service = make_served(body_timeout_seconds=0.5)
    with connect(service.port) as connection:
        connection.sendall(login_head(Content_Length="100") + b"token=")
        status, headers, body = read_response(connection)
    assert status == 408 and headers["connection"] == "close"
    assert json.loads(body)["error"] == "RequestTimeoutError"


# A3: connection limits from settings


@pytest.fixture(scope="module")
def strict_service(tmp_path_factory) -> Iterator[ServiceProcess]:
    """``python -m gradvault.service`` with a 1 s head deadline: the command as deployed."""
    store = tmp_path_factory.mktemp("limits") / "store"
    env = {"GRADVAULT_HEADER_TIMEOUT_SECONDS": "1", "GRADVAULT_KEEP_ALIVE_SECONDS": "30"}
    with ServiceProcess(str(store), env=env) as service:
        yield service


def _port(service: ServiceProcess) -> int:
    return int(service.base_url.rpartition(":")[2])


def test_half_a_request_line_is_answered_408_and_closed(strict_service):
    with connect(_port(strict_service)) as connection:
        connection.sendall(b"GET /hea")
        answer = read_until_closed(connection)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b"header_timeout_seconds" in answer


def test_a_connection_that_sends_nothing_is_closed(strict_service):
    with connect(_port(strict_service)) as connection:
        assert read_until_closed(connection) == b""


def test_a_head_sent_a_byte_at_a_time_does_not_move_its_deadline(strict_service):
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"x" * 200
    with connect(_port(strict_service)) as connection:
        sent = 0
        try:
            for byte in head:  # up to 200 * 0.1 s: far past the 1 s deadline
                connection.sendall(bytes([byte]))
                sent += 1
                time.sleep(0.1)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_until_closed(connection)
    assert sent < len(head), "the whole head was taken, a byte at a time"
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_kept_alive_connection_has_a_deadline_for_its_next_head(strict_service):
    with connect(_port(strict_service)) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, _, _ = read_response(connection)
        assert status == 200
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127")  # and no more
        assert read_until_closed(connection).startswith(b"HTTP/1.1 408 ")


def test_a_complete_request_is_answered_whatever_the_deadline(strict_service):
    with connect(_port(strict_service)) as connection:
        for _ in range(3):
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(connection)[0] == 200


def test_connections_beyond_limit_concurrency_are_answered_503(make_served):
    service = make_served(limit_concurrency=3)
    held = [connect(service.port) for _ in range(3)]
    try:
        for connection in held:  # each is open and known to the server
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            read_response(connection)
        with connect(service.port) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_response(extra)[0] == 503
    finally:
        for connection in held:
            connection.close()


def test_keep_alive_comes_from_the_settings(make_served):
    service = make_served(keep_alive_seconds=1)
    with connect(service.port) as connection:
        connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(connection)[0] == 200
        assert read_until_closed(connection) == b""  # closed once idle


@pytest.mark.parametrize(
    "request_head",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        # 40 KiB of a head that never ends: cut at 16 KiB, not buffered to the deadline
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"x" * (40 << 10),
    ],
    ids=["garbage", "unfinished-head-over-16KiB"],
)
def test_an_unparsable_request_gets_the_json_error_body(strict_service, request_head):
    with connect(_port(strict_service)) as connection:
        connection.sendall(request_head)
        status, headers, body = read_response(connection)
    assert status == 400 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == "RemoteProtocolError"
