"""Every way a request can go wrong is a 4xx with the documented JSON error body.

A walk over the service's error paths, against a real uvicorn on loopback with tokens
configured and one snapshot in the store: malformed uploads (the corpus of
``safetensors_bodies`` and shapes NumPy cannot hold), bad snapshot and param ids, bad
ranges and validators, bad query values, unknown routes, wrong methods and oversized
values. No answer is a 5xx, and every error is ``{"detail": str, "error": str}`` as
application/json: never a plain-text body, never a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gradvault.core import open_store
from gradvault.service import Settings, create_app

from .conftest import UvicornThread, make_record
from .safetensors_bodies import PARAM_A, file_bytes, good_file, good_tensors, malformed_files

READ_TOKEN = "error-paths-read"
WRITE_TOKEN = "error-paths-write"
MAX_HEADER_BYTES = 4096
MAX_UPLOAD_BYTES = 64 * 1024
MISSING_SNAPSHOT = "01ARZ3NDEKTSV4RRFFQ69G5FAV"  # well-formed, in no store
MISSING_PARAM = "00000000000000ff"


@dataclass(frozen=True)
class Served:
    base_url: str
    snapshot_id: str
    param_id: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    path = tmp_path_factory.mktemp("error-paths") / "store"
    spool = path.parent / "spool"
    spool.mkdir()
    record = make_record()

    async def fill() -> str:
        store = open_store(path)
        try:
            return (await store.write_snapshot(record, run="r", step=0)).id
        finally:
            await store.close()

    snapshot_id = asyncio.run(fill())
    settings = Settings(
        store=str(path),
        tokens=f"{READ_TOKEN}:read,{WRITE_TOKEN}:write",
        index_refresh_seconds=0,
        max_header_bytes=MAX_HEADER_BYTES,
        max_upload_bytes=MAX_UPLOAD_BYTES,
        spool_dir=str(spool),
    )
    server = UvicornThread(create_app(settings))
    server.start()
    try:
        yield Served(server.base_url, snapshot_id, str(record.entries[0].param_id))
    finally:
        server.stop()


@dataclass(frozen=True)
class Case:
    """One request expected to fail: method, path (``{id}`` and ``{param}`` filled in)."""

    method: str
    path: str
    token: str | None = READ_TOKEN
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    #: statuses that answer the case rightly besides an error (an ignored Range: 200)
    answers: frozenset[int] = frozenset()


def _upload(body: bytes, **params: Any) -> Case:
    return Case("POST", "/v1/snapshots", WRITE_TOKEN, {"run": "r", "step": 1, **params}, body=body)


def _with_shape(shape: list[int]) -> bytes:
    """A file of one float32 tensor of ``shape``, its offsets and data as the shape needs."""
    size = 4 * math.prod(shape)
    return file_bytes(
        {PARAM_A: {"dtype": "F32", "shape": shape, "data_offsets": [0, size]}}, bytes(size)
    )


BAD_SNAPSHOT_IDS = {
    "short": "01ARZ3NDEKTSV4RRFFQ69G5FA",
    "long": "01ARZ3NDEKTSV4RRFFQ69G5FAVX",
    "lowercase": "01arz3ndektsv4rrffq69g5fav",
    "past-the-largest": "8ZZZZZZZZZZZZZZZZZZZZZZZZZ",
    "not-crockford": "01ARZ3NDEKTSV4RRFFQ69G5FAU",
    "unicode": "é" * 26,
    "nul": "%00" * 26,
    "8000-chars": "A" * 8000,
}
BAD_PARAM_IDS = {
    "short": "00000000000000a",
    "long": "00000000000000a10",
    "uppercase": "00000000000000A1",
    "not-hex": "zzzzzzzzzzzzzzzz",
    "negative": "-0000000000000a1",
    "8000-chars": "a" * 8000,
}
#: a Range no byte of the resource satisfies: 416
UNSATISFIABLE_RANGES = {
    "past-the-end": "bytes=999999-",
    "past-the-end-huge": "bytes=" + "9" * 400 + "-",
    "empty-suffix": "bytes=-0",
}
#: a Range that is not one (RFC 9110 says to ignore it) or that runs past the end (cut
#: there): answered with the resource, whole or from the start, never an error
IGNORED_RANGES = {
    "not-bytes": "items=0-1",
    "not-numbers": "bytes=a-b",
    "reversed": "bytes=10-5",
    "garbage": "bytes=0-1,,,;;",
    "huge-end": "bytes=0-" + "9" * 400,
}
BAD_LIST_QUERIES = {
    "limit-0": {"limit": 0},
    "limit-negative": {"limit": -1},
    "limit-not-a-number": {"limit": "ten"},
    "limit-huge": {"limit": 10**40},
    "step-min-negative": {"step_min": -1},
    "step-min-past-int64": {"step_min": 2**63},
    "step-max-a-float": {"step_max": 1.5},
    "cursor-malformed": {"cursor": "not-a-cursor"},
    "cursor-8000-chars": {"cursor": "A" * 8000},
}
BAD_UPLOAD_QUERIES = {
    "run-missing": {"run": None},
    "run-empty": {"run": ""},
    "step-missing": {"step": None},
    "step-negative": {"step": -1},
    "step-past-int64": {"step": 2**63},
    "step-a-float": {"step": "1.5"},
    "tags-not-json": {"tags": "{lr: 1"},
    "tags-a-list": {"tags": "[1]"},
    "tags-not-strings": {"tags": '{"lr": 1}'},
    "tags-nested-deep": {"tags": "[" * 5000 + "]" * 5000},
}
UNHOLDABLE_SHAPES = {
    "65-dims": [1] * 65,
    "65-empty-dims": [0] * 65,
    "empty-by-2**62": [0, 2**62],
    "2**70-by-empty": [2**70, 0],
    "empty-by-2**64": [0, 2**64],
}


def cases() -> dict[str, Case]:
    found: dict[str, Case] = {}
    for kind, body in malformed_files(MAX_HEADER_BYTES).items():
        found[f"upload-{kind}"] = _upload(body)
    for kind, shape in UNHOLDABLE_SHAPES.items():
        found[f"upload-shape-{kind}"] = _upload(_with_shape(shape))
    found["upload-over-the-limit"] = _upload(good_file() + bytes(MAX_UPLOAD_BYTES))
    header, data, _ = good_tensors()
    found["upload-declares-too-much"] = _upload(
        file_bytes({PARAM_A: {"dtype": "U8", "shape": [2**40], "data_offsets": [0, 2**40]}}, b"")
    )
    for kind, query in BAD_UPLOAD_QUERIES.items():
        found[f"upload-{kind}"] = _upload(file_bytes(header, data), **query)
    found["upload-read-token"] = Case("POST", "/v1/snapshots", READ_TOKEN, {"run": "r", "step": 1})
    found["upload-no-token"] = Case("POST", "/v1/snapshots", None, {"run": "r", "step": 1})
    found["upload-unknown-token"] = Case("POST", "/v1/snapshots", "nope", {"run": "r", "step": 1})

    for kind, bad in BAD_SNAPSHOT_IDS.items():
        for route in (
            "/v1/snapshots/{bad}",
            "/v1/snapshots/{bad}/grads/{param}",
            "/v1/snapshots/{bad}/safetensors",
            "/ui/snapshots/{bad}",
            "/ui/snapshots/{bad}/grads/{param}.npy",
            "/ui/snapshots/{bad}/safetensors",
        ):
            found[f"id-{kind}-{route}"] = Case("GET", route.replace("{bad}", bad))
        found[f"id-{kind}-delete"] = Case("DELETE", f"/v1/snapshots/{bad}", WRITE_TOKEN)
        found[f"id-{kind}-diff"] = Case("GET", "/ui/diff", params={"a": bad, "b": "{id}"})
    for route in (
        "/v1/snapshots/{missing}",
        "/v1/snapshots/{missing}/grads/{param}",
        "/v1/snapshots/{missing}/safetensors",
        "/ui/snapshots/{missing}",
        "/v1/zarr/snapshots/{missing}/zarr.json",
    ):
        found[f"id-missing-{route}"] = Case("GET", route.replace("{missing}", MISSING_SNAPSHOT))
    found["id-missing-delete"] = Case("DELETE", f"/v1/snapshots/{MISSING_SNAPSHOT}", WRITE_TOKEN)
    found["id-missing-diff"] = Case("GET", "/ui/diff", params={"a": "{id}", "b": MISSING_SNAPSHOT})

    for kind, bad in BAD_PARAM_IDS.items():
        found[f"param-{kind}"] = Case("GET", f"/v1/snapshots/{{id}}/grads/{bad}")
        found[f"param-{kind}-npy"] = Case("GET", f"/ui/snapshots/{{id}}/grads/{bad}.npy")
    found["param-missing"] = Case("GET", f"/v1/snapshots/{{id}}/grads/{MISSING_PARAM}")

    ranged = {
        "": "/v1/snapshots/{id}/grads/{param}",
        "-safetensors": "/v1/snapshots/{id}/safetensors",
        "-zarr": "/v1/zarr/snapshots/{id}/zarr.json",
    }
    for suffix, route in ranged.items():
        for kind, value in UNSATISFIABLE_RANGES.items():
            found[f"range-{kind}{suffix}"] = Case("GET", route, headers={"Range": value})
        for kind, value in IGNORED_RANGES.items():
            found[f"range-{kind}{suffix}"] = Case(
                "GET", route, headers={"Range": value}, answers=frozenset({200, 206})
            )
    found["format-unknown"] = Case(
        "GET", "/v1/snapshots/{id}/grads/{param}", params={"format": "xml"}
    )

    for kind, query in BAD_LIST_QUERIES.items():
        found[f"list-{kind}"] = Case("GET", "/v1/snapshots", params=query)
    for kind, query in {
        "sort-unknown": {"sort": "size"},
        "order-unknown": {"order": "up"},
        "page-0": {"page": 0},
        "page-not-a-number": {"page": "two"},
        "page-past-the-last": {"page": 2},
        "page-huge": {"page": 10**40},
    }.items():
        found[f"ui-snapshot-{kind}"] = Case("GET", "/ui/snapshots/{id}", params=query)
    for kind, query in {
        "run-missing": {},
        "run-empty": {"run": ""},
        "max-points-1": {"run": "r", "max_points": 1},
        "max-points-huge": {"run": "r", "max_points": 10**40},
        "step-min-negative": {"run": "r", "step_min": -1},
    }.items():
        found[f"ui-run-stats-{kind}"] = Case("GET", "/ui/api/run-stats", params=query)
    found["ui-run-cursor"] = Case("GET", "/ui/run", params={"run": "r", "cursor": "x"})
    found["ui-overview-cursor"] = Case("GET", "/ui", params={"cursor": "x" * 8000})
    found["ui-diff-sort"] = Case("GET", "/ui/diff", params={"a": "{id}", "b": "{id}", "sort": "x"})
    found["ui-diff-missing-b"] = Case("GET", "/ui/diff", params={"a": "{id}"})

    for path in (
        "/v1/zarr/..%2F..%2Fetc/passwd",
        "/v1/zarr/snapshots/{id}/../../x",
        "/v1/zarr/snapshots/{id}/nope",
        "/v1/zarr/" + "a/" * 2000,
    ):
        found[f"zarr-{path[:30]}"] = Case("GET", path)

    for path in ("/nope", "/v1", "/v1/nope", "/v1/snapshots/{id}/nope", "/ui/nope", "/v2/x"):
        found[f"unknown-route-{path}"] = Case("GET", path)
    found["unknown-static"] = Case("GET", "/ui/static/nope.js")
    found["unknown-static-traversal"] = Case("GET", "/ui/static/../pages.py")
    for method, path in (
        ("PUT", "/v1/snapshots"),
        ("PATCH", "/v1/snapshots/{id}"),
        ("POST", "/v1/snapshots/{id}"),
        ("POST", "/healthz"),
        ("DELETE", "/metrics"),
        ("POST", "/v1/snapshots/{id}/grads/{param}"),
        ("DELETE", "/v1/snapshots/{id}/safetensors"),
        ("PUT", "/v1/zarr/snapshots/{id}/zarr.json"),
        ("PUT", "/ui"),
        ("DELETE", "/ui/snapshots/{id}"),
        ("GET", "/ui/logout"),
        ("PURGE", "/v1/snapshots"),
    ):
        found[f"method-{method}-{path}"] = Case(method, path, WRITE_TOKEN)

    for route in ("/v1/snapshots", "/v1/snapshots/{id}", "/ui/api/run-stats"):
        found[f"auth-none-{route}"] = Case("GET", route, None, {"run": "r"})
        found[f"auth-unknown-{route}"] = Case("GET", route, "not-a-token", {"run": "r"})
    found["auth-read-token-delete"] = Case("DELETE", "/v1/snapshots/{id}", READ_TOKEN)
    found["auth-malformed-header"] = Case(
        "GET", "/v1/snapshots", None, headers={"Authorization": "Bearer"}
    )
    found["auth-other-scheme"] = Case(
        "GET", "/v1/snapshots", None, headers={"Authorization": "Basic dTpw"}
    )
    return found


CASES = cases()


def json_error_problem(response: httpx.Response, case: Case) -> str | None:
    """What is wrong with ``response`` as the answer to ``case``, or None if nothing."""
    if response.status_code in case.answers:
        return None
    if not 400 <= response.status_code < 500:
        return f"status {response.status_code}: {response.text[:300]!r}"
    if case.method == "HEAD":
        return None
    content_type = response.headers.get("content-type")
    if content_type != "application/json":
        return f"status {response.status_code}, {content_type}: {response.text[:300]!r}"
    try:
        body = response.json()
    except ValueError:
        return f"status {response.status_code}, not JSON: {response.text[:300]!r}"
    if (
        not isinstance(body, dict)
        or set(body) != {"detail", "error"}
        or not isinstance(body["detail"], str)
        or not body["detail"]
        or not isinstance(body["error"], str)
        or not body["error"].isidentifier()
    ):
        return f"status {response.status_code}, not the error object: {body!r:.300}"
    return None


def send(client: httpx.Client, served: Served, case: Case) -> httpx.Response:
    def fill(text: str) -> str:
        return text.replace("{id}", served.snapshot_id).replace("{param}", served.param_id)

    headers = dict(case.headers)
    if case.token is not None:
        headers["Authorization"] = f"Bearer {case.token}"
    params = {key: fill(str(value)) for key, value in case.params.items() if value is not None}
    request = client.build_request(
        case.method, fill(case.path), params=params, headers=headers, content=case.body
    )
    return client.send(request)


def test_every_error_path_is_a_4xx_with_a_json_error_body(served: Served) -> None:
    problems, statuses = {}, set()
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        for name, case in CASES.items():
            try:
                response = send(client, served, case)
            except httpx.HTTPError as error:  # a dropped connection, as a bare 500 did
                problems[name] = f"no answer: {error!r}"
                continue
            statuses.add(response.status_code)
            problem = json_error_problem(response, case)
            if problem is not None:
                problems[name] = problem
    assert problems == {}, "\n".join(f"{name}: {text}" for name, text in problems.items())
    # the walk met every status the API documents for a client's mistakes
    assert statuses >= {400, 401, 403, 404, 405, 413, 416, 422}, sorted(statuses)


def test_a_shape_numpy_cannot_hold_names_the_tensor(served: Served) -> None:
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        for kind, shape in UNHOLDABLE_SHAPES.items():
            response = client.post(
                "/v1/snapshots",
                params={"run": "r", "step": 1},
                content=_with_shape(shape),
                headers={"Authorization": f"Bearer {WRITE_TOKEN}"},
            )
            assert json_error_problem(response, _upload(b"")) is None, (kind, response.text)
            body = response.json()
            assert response.status_code == 400, (kind, body)
            assert body["error"] == "InvalidUploadError", (kind, body)
            assert f"tensor '{PARAM_A}' of dtype F32 has shape [{shape[0]}, " in body["detail"]
            assert "expected at most" in body["detail"], body


def test_uploads_after_the_walk_still_work(served: Served) -> None:
    """No error left the service in a state that refuses a good upload."""
    with httpx.Client(base_url=served.base_url, timeout=60) as client:
        response = client.post(
            "/v1/snapshots",
            params={"run": "after", "step": 1},
            content=good_file(),
            headers={"Authorization": f"Bearer {WRITE_TOKEN}"},
        )
        assert response.status_code == 201, response.text
        assert json.loads(response.content)["num_params"] == 2
