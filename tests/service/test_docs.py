"""The API's documentation: behind the read rule, and drawn from this package's own files."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gradvault.client.cli.serve import BackgroundService
from gradvault.service import Settings

READ_TOKEN = "docs-read-token"
STATIC = Path(__file__).parents[2] / "service" / "ui" / "static"


@pytest.fixture(scope="module")
def protected(tmp_path_factory) -> Iterator[BackgroundService]:
    store = tmp_path_factory.mktemp("docs") / "store"
    settings = Settings(store=str(store), port=0, tokens=f"{READ_TOKEN}:read")
    with BackgroundService(settings) as service:
        yield service


@pytest.fixture(scope="module")
def open_service(tmp_path_factory) -> Iterator[BackgroundService]:
    store = tmp_path_factory.mktemp("docs-open") / "store"
    with BackgroundService(Settings(store=str(store), port=0)) as service:
        yield service


def _client(service: BackgroundService, **options) -> httpx.Client:
    return httpx.Client(base_url=service.url, timeout=30, **options)


@pytest.mark.parametrize("path", ["/openapi.json", "/ui/openapi.json"])
def test_the_schema_needs_a_token_when_tokens_are_configured(protected, path):
    with _client(protected) as client:
        refused = client.get(path)
        given = client.get(path, headers={"Authorization": f"Bearer {READ_TOKEN}"})
    assert refused.status_code == 401 and refused.json()["error"] == "AuthenticationError"
    assert given.status_code == 200 and "/v1/snapshots" in given.json()["paths"]


@pytest.mark.parametrize("page", ["docs", "redoc"])
def test_the_doc_pages_send_a_browser_to_the_login_form(protected, page):
    with _client(protected) as client:
        for path in (f"/{page}", f"/ui/{page}"):
            response = client.get(path)
            assert response.status_code == 303
            assert response.headers["location"] == f"/ui/login?next=/ui/{page}"


@pytest.mark.parametrize("page", ["docs", "redoc"])
def test_after_login_the_pages_and_their_schema_open(protected, page):
    with _client(protected) as client:
        login = client.post("/ui/login", data={"token": READ_TOKEN, "next": f"/ui/{page}"})
        assert login.status_code == 303 and login.headers["location"] == f"/ui/{page}"
        html = client.get(f"/ui/{page}")
        schema = client.get("/ui/openapi.json")  # the cookie is sent under /ui
    assert html.status_code == 200 and "/ui/openapi.json" in html.text
    assert schema.status_code == 200


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("docs", ["swagger-ui-bundle.js", "swagger-ui.css", "favicon.svg"]),
        ("redoc", ["redoc.standalone.js", "favicon.svg"]),
    ],
)
def test_the_pages_load_nothing_from_another_host(open_service, page, assets):
    with _client(open_service) as client:
        html = client.get(f"/{page}")
        assert html.status_code == 200
        assert "default-src 'self'" in html.headers["content-security-policy"]
        # every URL the page names is one of this service's
        urls = re.findall(r"""(?:src|href|url|spec-url)\s*[=:]\s*['"]([^'"]+)['"]""", html.text)
        assert urls and all(url.startswith("/") for url in urls), urls
        for asset in assets:
            assert f"/ui/static/{asset}" in html.text
            served = client.get(f"/ui/static/{asset}")
            assert served.status_code == 200
            assert served.content == (STATIC / asset).read_bytes()


def test_the_vendored_files_carry_their_licences():
    for licence in ("swagger-ui.LICENSE", "swagger-ui.NOTICE", "redoc.LICENSE"):
        assert (STATIC / licence).stat().st_size > 0
    readme = (STATIC / "README.md").read_text()
    assert "swagger-ui-dist" in readme and "redoc" in readme
