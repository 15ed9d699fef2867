"""The API's documentation pages draw in a browser that can reach nothing but the service."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from .conftest import READ_TOKEN, PageWatch, Served

REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def _watch_hosts(watch: PageWatch, base_url: str) -> list[str]:
    """Every request the page makes to another host is recorded and refused."""
    elsewhere: list[str] = []
    own = urlsplit(base_url).netloc

    def route(request_route) -> None:
        url = request_route.request.url
        if urlsplit(url).scheme in ("http", "https") and urlsplit(url).netloc != own:
            elsewhere.append(url)
            request_route.abort()
        else:
            request_route.continue_()

    watch.page.route("**/*", route)
    return elsewhere


@pytest.mark.parametrize(
    ("path", "drawn"),
    [("/docs", "#swagger-ui .opblock"), ("/redoc", "[data-section-id]")],
)
def test_the_doc_pages_draw_offline(page: PageWatch, open_service: Served, path, drawn):
    elsewhere = _watch_hosts(page, open_service.base_url)
    page.page.goto(open_service.base_url + path)
    page.page.wait_for_selector(drawn)
    assert page.page.locator(drawn).count() > 3  # the API's operations are drawn
    page.screenshot(path.strip("/"))
    assert elsewhere == []
    # ReDoc's sidebar shows its maker's logo from their CDN; the page's policy blocks it
    # before any request, and ReDoc drops the image when it fails to load
    blocked_logo = [
        f"console error: Loading the image '{REDOC_LOGO}' violates",
        f"request failed: {REDOC_LOGO} (csp)",
    ]
    assert [p for p in page.problems if not p.startswith(tuple(blocked_logo))] == []


def test_the_doc_pages_open_after_login(page: PageWatch, protected_service: Served):
    page.page.goto(protected_service.base_url + "/docs")
    assert "/ui/login" in page.page.url
    page.page.fill("input[name=token]", READ_TOKEN)
    page.page.click("button[type=submit], input[type=submit]")
    page.page.wait_for_selector("#swagger-ui .opblock")
    assert page.page.url.endswith("/ui/docs")
