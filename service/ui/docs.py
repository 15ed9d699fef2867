"""The API's documentation: ``/openapi.json``, and Swagger UI and ReDoc drawn from it.

Both pages and their scripts are served by this package (``static/``, see its README),
never from a CDN, so they work offline. Who may see them follows the service's settings,
as every read does:

- ``/openapi.json`` is for programs: it wants a read token in ``Authorization`` when
  tokens are configured (and reads are not public), as ``/v1`` does.
- ``/docs`` and ``/redoc`` (and their twins ``/ui/docs``, ``/ui/redoc``) are for browsers:
  they draw ``/ui/openapi.json``, which takes the pages' cookie too. Asked for without a
  token the service knows, they send the browser to the pages' login form, which comes
  back to the ``/ui`` twin (the cookie is scoped to ``/ui``).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import JSONResponse, RedirectResponse

from ..deps import ReadAccess, SettingsDep
from .access import UI_PREFIX, DataReader, read_refusal

#: the schema as the documentation pages fetch it (under /ui, where the cookie goes)
PAGE_SCHEMA_URL = f"{UI_PREFIX}/openapi.json"
STATIC_URL = f"{UI_PREFIX}/static"
TITLE = "gradvault API"

#: everything the pages load comes from this service: Swagger UI and ReDoc start from an
#: inline script or element, draw with inline styles and data: images, ReDoc searches in a
#: worker made from a blob, and both bundles probe for eval, so those stay allowed
DOCS_SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self' 'unsafe-inline' 'unsafe-eval' blob: data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)


def _schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/openapi.json", dependencies=[ReadAccess])
async def openapi_document(request: Request) -> Response:
    """The OpenAPI document of the API (a read token when tokens are configured)."""
    return _schema(request)


@router.get(PAGE_SCHEMA_URL, dependencies=[DataReader])
async def openapi_document_for_pages(request: Request) -> Response:
    """The OpenAPI document, for the documentation pages (the pages' cookie works here)."""
    return _schema(request)


def _page_or_login(request: Request, settings: SettingsDep, page: str) -> Response | None:
    """None if the request may read; else the redirect to the login form, back to ``page``."""
    if read_refusal(request, settings) is None:
        return None
    return RedirectResponse(f"{UI_PREFIX}/login?next={UI_PREFIX}/{page}", status_code=303)


def _secured(response: Response) -> Response:
    response.headers.update(DOCS_SECURITY_HEADERS)
    return response


@router.get("/docs")
@router.get(f"{UI_PREFIX}/docs")
async def swagger_ui(request: Request, settings: SettingsDep) -> Response:
    """Swagger UI over the API's schema."""
    login = _page_or_login(request, settings, "docs")
    if login is not None:
        return login
    return _secured(
        get_swagger_ui_html(
            openapi_url=PAGE_SCHEMA_URL,
            title=TITLE,
            swagger_js_url=f"{STATIC_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{STATIC_URL}/swagger-ui.css",
            swagger_favicon_url=f"{STATIC_URL}/favicon.svg",
        )
    )


@router.get("/redoc")
@router.get(f"{UI_PREFIX}/redoc")
async def redoc(request: Request, settings: SettingsDep) -> Response:
    """ReDoc over the API's schema."""
    login = _page_or_login(request, settings, "redoc")
    if login is not None:
        return login
    return _secured(
        get_redoc_html(
            openapi_url=PAGE_SCHEMA_URL,
            title=TITLE,
            redoc_js_url=f"{STATIC_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{STATIC_URL}/favicon.svg",
            with_google_fonts=False,
        )
    )
