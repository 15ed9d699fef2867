"""What routes depend on, as ``Annotated`` aliases: settings, the store, the index, access."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gradvault.core import SnapshotStore

from .errors import AuthenticationError, PermissionDeniedError
from .index import SnapshotIndex
from .metrics import ServiceMetrics
from .settings import Scope, Settings


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


def token_scope(settings: Settings, token: str) -> Scope | None:
    """The scope of ``token``, comparing it with every configured token in constant time."""
    given = token.encode()
    found: Scope | None = None
    for known, scope in settings.tokens.items():
        # no early exit: the time taken does not say which token, or how much of one, matched
        if hmac.compare_digest(known.encode(), given):
            found = scope
    return found


def _authorize(
    settings: Settings, credentials: HTTPAuthorizationCredentials | None, needed: Scope
) -> None:
    if settings.is_open:
        return
    if credentials is None:
        if needed is Scope.READ and settings.public_read:
            return
        raise AuthenticationError(
            f"this route needs a bearer token with {needed} scope (Authorization: Bearer <token>)"
        )
    scope = token_scope(settings, credentials.credentials)
    if scope is None:
        raise AuthenticationError("the bearer token is not one this service knows")
    if not scope.allows(needed):
        raise PermissionDeniedError(
            f"this route needs a token with {needed} scope; yours is {scope}"
        )


def require_read(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Lets a request through if it may read (a read or write token, or public reads)."""
    _authorize(settings, credentials, Scope.READ)


def require_write(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Lets a request through if it carries a write token (or the service is open)."""
    _authorize(settings, credentials, Scope.WRITE)


ReadAccess = Depends(require_read)
WriteAccess = Depends(require_write)
