"""Writes from other sites' pages, and bodies of undocumented types, are refused.

A page on another site can make a browser POST to a service on 127.0.0.1 without a
preflight (``Content-Type: text/plain``, a form); the browser then names the page's
origin in ``Origin``. These tests send what such a browser sends, to a real uvicorn.
"""

from __future__ import annotations

import httpx
import pytest

from gradvault.client.cli.serve import BackgroundService
from gradvault.service import Settings

from .safetensors_bodies import good_file

TOKEN = "origin-write-token"
UPLOAD = "/v1/snapshots?run=r&step=1"


@pytest.fixture
def open_service(make_served) -> BackgroundService:
    """No tokens, on loopback: the developer's own service that a web page aims at."""
    return make_served()


def _client(service: BackgroundService, **headers: str) -> httpx.Client:
    return httpx.Client(base_url=service.url, headers=headers, timeout=30)


def _listed(service: BackgroundService) -> list:
    with _client(service) as client:
        return client.get("/v1/snapshots").json()["data"]


def test_a_cross_site_upload_to_an_open_service_is_refused(open_service):
    with _client(open_service, Origin="http://attacker.example") as client:
        response = client.post(UPLOAD, content=good_file(), headers={"Content-Type": "text/plain"})
    assert response.status_code == 403
    assert response.json()["error"] == "CrossSiteRequestError"
    assert "attacker.example" in response.json()["detail"]
    assert _listed(open_service) == []


def test_an_upload_of_an_undocumented_content_type_is_refused(open_service):
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        with _client(open_service) as client:
            response = client.post(
                UPLOAD, content=good_file(), headers={"Content-Type": content_type}
            )
        assert response.status_code == 415, content_type
        assert response.json()["error"] == "UnsupportedMediaTypeError"
        assert "application/octet-stream" in response.json()["detail"]
    assert _listed(open_service) == []


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "application/octet-stream"},
        {"Content-Type": "Application/Octet-Stream; charset=binary"},
        {},  # no Content-Type: curl -T, httpx's content=
        {"Content-Type": "application/octet-stream", "Origin": "same"},
    ],
)
def test_a_documented_upload_is_taken(open_service, headers):
    if headers.get("Origin") == "same":
        headers["Origin"] = open_service.url
    with _client(open_service, **headers) as client:
        response = client.post(UPLOAD, content=good_file())
    assert response.status_code == 201, response.text


def test_a_cross_site_delete_is_refused(open_service):
    with _client(open_service) as client:
        created = client.post(UPLOAD, content=good_file()).json()["id"]
        refused = client.delete(
            f"/v1/snapshots/{created}", headers={"Origin": "https://attacker.example"}
        )
        assert refused.status_code == 403
        assert client.get(f"/v1/snapshots/{created}").status_code == 200
        assert client.delete(f"/v1/snapshots/{created}").status_code == 204


@pytest.mark.parametrize("origin", ["null", "not an origin", "http://127.0.0.1:1"])
def test_an_opaque_or_other_origin_is_another_site(open_service, origin):
    with _client(open_service, Origin=origin) as client:
        assert client.post(UPLOAD, content=good_file()).status_code == 403


def test_a_rebound_name_is_another_site_for_an_open_service(open_service):
    # DNS rebinding: evil.example resolves to 127.0.0.1, so the browser sends both headers
    # with the attacker's name, and they agree
    name = f"evil.example:{open_service.port}"
    with _client(open_service, Origin=f"http://{name}", Host=name) as client:
        response = client.post(UPLOAD, content=good_file())
    assert response.status_code == 403


def test_reads_from_any_origin_are_answered(open_service):
    with _client(open_service, Origin="http://attacker.example") as client:
        assert client.get("/v1/snapshots").status_code == 200


def test_the_login_form_refuses_another_sites_post(make_served):
    service = make_served(tokens=f"{TOKEN}:write")
    with _client(service, Origin="http://attacker.example") as client:
        response = client.post("/ui/login", data={"token": TOKEN})
    assert response.status_code == 403
    assert "set-cookie" not in response.headers
    with _client(service, Origin=service.url) as client:
        assert client.post("/ui/login", data={"token": TOKEN}).status_code == 303


def test_allowed_origins_may_write(make_served):
    service = make_served(tokens=f"{TOKEN}:write", allowed_origins="https://grads.example.org:443")
    headers = {"Origin": "https://grads.example.org", "Authorization": f"Bearer {TOKEN}"}
    with _client(service, **headers) as client:
        assert client.post(UPLOAD, content=good_file()).status_code == 201
    headers["Origin"] = "https://other.example.org"
    with _client(service, **headers) as client:
        assert client.post(UPLOAD, content=good_file()).status_code == 403


def test_an_allowed_origin_must_be_an_origin():
    with pytest.raises(ValueError, match="scheme://host"):
        Settings(allowed_origins="grads.example.org/ui")


def test_the_schema_documents_the_refusals(open_service):
    with _client(open_service) as client:
        upload = client.get("/openapi.json").json()["paths"]["/v1/snapshots"]["post"]
    assert {"403", "408", "413", "415"} <= set(upload["responses"])
