"""What routes depend on, as ``Annotated`` aliases: settings, the store, the index, access,
a request's range and validators.

Two dependencies guard every route of the app (``create_app`` gives them to the app
itself, so no route can miss them): :func:`require_same_site` refuses a write from a page
of another site, :func:`require_documented_body` a body of a type the route does not take.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gradvault.core import SnapshotStore

from .auth import access_refusal
from .auth import token_scope as token_scope  # re-exported: known from here
from .errors import CrossSiteRequestError, UnsupportedMediaTypeError
from .index import SnapshotIndex
from .metrics import ServiceMetrics
from .ranges import Conditions
from .settings import Scope, Settings, is_loopback, parse_origin


def get_settings(request: Request) -> Settings:
    """The settings the app was created with (tests override this dependency)."""
    return request.app.state.settings


def get_store(request: Request) -> SnapshotStore:
    """The store opened in the app's lifespan."""
    return request.app.state.store


def get_index(request: Request) -> SnapshotIndex:
    return request.app.state.index


def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[SnapshotStore, Depends(get_store)]
IndexDep = Annotated[SnapshotIndex, Depends(get_index)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]

_bearer = HTTPBearer(auto_error=False, description="a token from GRADVAULT_TOKENS")


def _check(
    settings: Settings, credentials: HTTPAuthorizationCredentials | None, needed: Scope
) -> None:
    """The access policy on the ``Authorization: Bearer`` token alone (the API's rule)."""
    token = None if credentials is None else credentials.credentials
    refusal = access_refusal(settings, token, needed)
    if refusal is not None:
        raise refusal.api_error()


def require_read(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Lets a request through if it may read (a read or write token, or public reads)."""
    _check(settings, credentials, Scope.READ)


def require_write(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Lets a request through if it carries a write token (or the service is open)."""
    _check(settings, credentials, Scope.WRITE)


ReadAccess = Depends(require_read)
WriteAccess = Depends(require_write)


#: methods that change nothing; every other one is a write
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _host_name(netloc: str) -> str:
    """``"[::1]:8000"`` as ``"[::1]"``, ``"localhost:8000"`` as ``"localhost"``."""
    if netloc.startswith("["):
        return netloc[: netloc.find("]") + 1]
    return netloc.rpartition(":")[0] if ":" in netloc else netloc


def is_own_origin(origin: str, host: str | None, settings: Settings) -> bool:
    """Whether a page of ``origin`` is this service's own, for a request sent to ``host``.

    Its own: an origin listed in ``allowed_origins``, or one whose host and port are the
    ``Host`` the request was sent to. ``null`` (a sandboxed frame, a file) never is. On an
    open service bound to loopback, only a loopback host is its own: a page whose name was
    made to resolve to 127.0.0.1 (DNS rebinding) names itself in both headers alike.
    """
    try:
        origin = parse_origin(origin)
    except ValueError:
        return False  # "null", or not an origin at all
    if origin in settings.allowed_origins:
        return True
    if host is None:
        return False
    scheme, _, netloc = origin.partition("://")
    default_port = {"http": ":80", "https": ":443"}[scheme]
    if netloc != host.strip().lower().removesuffix(default_port):
        return False
    if settings.is_open and is_loopback(settings.host):
        return is_loopback(_host_name(netloc))
    return True


async def require_same_site(request: Request, settings: SettingsDep) -> None:
    """Refuses a write (any method but GET, HEAD, OPTIONS) sent by a page of another site.

    Browsers name the page's origin in ``Origin`` on every cross-site write, with or
    without a preflight; a request without one comes from a program (curl, the clients),
    which tokens govern.
    """
    if request.method in SAFE_METHODS:
        return
    origin = request.headers.get("origin")
    if origin is None or is_own_origin(origin, request.headers.get("host"), settings):
        return
    raise CrossSiteRequestError(
        f"{request.method} from a page of another site is refused: Origin {origin[:100]!r} "
        f"is not this service's (Host {request.headers.get('host', '')[:100]!r}; "
        f"GRADVAULT_ALLOWED_ORIGINS lists others)"
    )


def documented_media_types(route: object) -> frozenset[str]:
    """The request body media types a route documents in its OpenAPI ``requestBody``."""
    extra = getattr(route, "openapi_extra", None) or {}
    content = extra.get("requestBody", {}).get("content", {})
    return frozenset(media_type.lower() for media_type in content)


async def require_documented_body(request: Request) -> None:
    """Refuses a body whose ``Content-Type`` is not one its route documents (415).

    A body sent without a ``Content-Type`` is taken (curl -T, a plain httpx ``content=``):
    a browser page sending one to another site also sends ``Origin``, which
    :func:`require_same_site` checks.
    """
    media_types = documented_media_types(request.scope.get("route"))
    content_type = request.headers.get("content-type")
    if not media_types or content_type is None:
        return
    if content_type.partition(";")[0].strip().lower() not in media_types:
        raise UnsupportedMediaTypeError(
            f"{request.method} {request.url.path[:100]} takes a body of Content-Type "
            f"{' or '.join(sorted(media_types))}; got {content_type[:100]!r}"
        )


SameSiteWrites = Depends(require_same_site)
DocumentedBody = Depends(require_documented_body)


def get_conditions(
    request: Request,
    range_header: Annotated[str | None, Header(alias="Range")] = None,
    if_none_match: Annotated[str | None, Header(alias="If-None-Match")] = None,
    if_range: Annotated[str | None, Header(alias="If-Range")] = None,
) -> Conditions:
    """The request's method and the headers a byte resource's answer depends on."""
    return Conditions(request.method, range_header, if_none_match, if_range)


ConditionsDep = Annotated[Conditions, Depends(get_conditions)]
