"""Who may see the pages: the service's access policy, with a token kept in a cookie.

A browser cannot add ``Authorization`` to a link, so the pages take a token once, in a
form (``POST /ui/login``, never in a URL), and keep it in an HttpOnly, SameSite=Strict
cookie scoped to ``/ui``: scripts cannot read it, other sites cannot send it. The cookie
is honoured by the ``/ui`` routes only; the ``/v1`` API still wants ``Authorization``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request
from fastapi.responses import RedirectResponse

from gradvault.core import GradvaultError

from ..auth import Refusal, access_refusal
from ..deps import SettingsDep
from ..errors import AuthenticationError, InvalidFormError
from ..settings import Scope, Settings

TOKEN_COOKIE = "gradvault_ui_token"
UI_PREFIX = "/ui"
#: the login form sends ``token`` and ``next``; a few more (a password manager's) are ignored
MAX_LOGIN_FIELDS = 4


class LoginRequiredError(GradvaultError):
    """A page was asked for without a token the service knows; the browser is sent to log in."""

    def __init__(self, message: str, next_path: str) -> None:
        super().__init__(message)
        self.next_path = next_path


def request_token(request: Request) -> str | None:
    """The token a request carries: ``Authorization: Bearer``, else the pages' cookie."""
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials:
        return credentials.strip()
    return request.cookies.get(TOKEN_COOKIE) or None


def read_refusal(request: Request, settings: Settings) -> Refusal | None:
    """Why ``request`` may not read (by its bearer token or the pages' cookie), or None."""
    return access_refusal(settings, request_token(request), Scope.READ)


def safe_next(path: str | None) -> str:
    """``path`` if it is a page of this service (``/ui...``), else ``/ui``: no open redirect."""
    if (
        path
        and (path == UI_PREFIX or path.startswith((UI_PREFIX + "/", UI_PREFIX + "?")))
        and "\\" not in path
        and ".." not in path
        and all(" " < character < "\x7f" for character in path)
    ):
        return path
    return UI_PREFIX


@dataclass(frozen=True)
class LoginForm:
    """What the login form sent: the token, and the page to go to (only a page of /ui)."""

    token: str
    next_path: str


async def read_login_form(request: Request) -> LoginForm:
    """The login form's fields; InvalidFormError (422) for a body that is not that form.

    The body is at most ``max_body_bytes`` (RequestLimits refuses a larger one, 413,
    before reading it).
    """
    text = (await request.body()).decode("utf-8", "replace")
    try:
        fields = parse_qs(text, max_num_fields=MAX_LOGIN_FIELDS)
    except ValueError:
        found = text.count("&") + 1
        raise InvalidFormError(
            f"the login form has the fields token and next (at most {MAX_LOGIN_FIELDS} "
            f"fields); got {found}"
        ) from None
    token = (fields.get("token") or [""])[0].strip()
    next_values = fields.get("next")
    return LoginForm(token=token, next_path=safe_next(next_values[0] if next_values else None))


def _here(request: Request) -> str:
    query = request.url.query
    return request.url.path + (f"?{query}" if query else "")


def require_page_reader(request: Request, settings: SettingsDep) -> None:
    """Lets a page through if its request may read; else LoginRequiredError (to the form)."""
    refusal = read_refusal(request, settings)
    if refusal is not None:
        raise LoginRequiredError(refusal.page_reason, _here(request))


def require_data_reader(request: Request, settings: SettingsDep) -> None:
    """Lets a JSON or download request through if it may read; else AuthenticationError (401)."""
    refusal = read_refusal(request, settings)
    if refusal is not None:
        raise AuthenticationError(
            f"{refusal.page_reason}: log in at {UI_PREFIX}/login or send "
            "Authorization: Bearer <token>"
        )


PageReader = Depends(require_page_reader)
DataReader = Depends(require_data_reader)
TokenDep = Annotated[str | None, Depends(request_token)]


async def login_redirect(request: Request, error: Exception) -> RedirectResponse:
    """Answer LoginRequiredError with a redirect to the login form, remembering the page."""
    assert isinstance(error, LoginRequiredError)
    return RedirectResponse(
        f"{UI_PREFIX}/login?next={quote(error.next_path, safe='')}", status_code=303
    )
