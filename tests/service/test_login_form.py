"""The login form's body: any malformed one is a 4xx with the JSON error body, never a 500."""

from __future__ import annotations

import httpx
import pytest

from gradvault.client.cli.serve import BackgroundService
from gradvault.service import Settings

TOKEN = "form-read-token"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    settings = Settings(
        store=str(tmp_path_factory.mktemp("form") / "store"), port=0, tokens=f"{TOKEN}:read"
    )
    with BackgroundService(settings) as served:
        yield served


@pytest.mark.parametrize(
    "body",
    [
        b"token=a&next=/ui&c=1&d=2&e=3",
        b"a=1&b=2&c=3&d=4&e=5",
        b"&" * 200,
        b"token=" + b"&x" * 1000,
    ],
)
def test_a_form_of_too_many_fields_is_a_422(service, body):
    with httpx.Client(base_url=service.url, timeout=30) as client:
        response = client.post(
            "/ui/login",
            content=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/json"
    error = response.json()
    assert error["error"] == "InvalidFormError"
    assert "token and next" in error["detail"]


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"token=" + TOKEN.encode() + b"&next=/ui/run?run=a", 303),
        (b"token=" + TOKEN.encode() + b"&next=/ui&remember=on", 303),  # a few extra: ignored
        (b"\xff\xfe=\xff", 401),  # not UTF-8: no token in it
        (b"", 401),
        (b"x" * 5000, 413),  # over max_body_bytes
    ],
)
def test_other_forms_get_the_form_or_a_json_error(service, body, status):
    with httpx.Client(base_url=service.url, timeout=30) as client:
        response = client.post(
            "/ui/login",
            content=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert response.status_code == status
    if status == 413:
        assert response.json()["error"] == "UploadTooLargeError"
