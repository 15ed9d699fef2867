"""Who may do what: the service's one access policy, for the API and the pages alike.

The settings decide (docs/SERVICE.md, "Authentication"): an open service (no tokens)
lets everything through; otherwise a request needs a token the service knows whose scope
allows what it asks, except a read when reads are public. :func:`access_refusal` is that
decision; the API's dependencies (:mod:`.deps`) and the pages (:mod:`.ui.access`) each
ask it, and differ only in where they find the token and in how they answer a refusal.
"""

from __future__ import annotations

import enum
import hmac
from dataclasses import dataclass

from .errors import AuthenticationError, PermissionDeniedError
from .settings import Scope, Settings


def token_scope(settings: Settings, token: str) -> Scope | None:
    """The scope of ``token``, comparing it with every configured token in constant time."""
    given = token.encode()
    found: Scope | None = None
    for known, scope in settings.tokens.items():
        # no early exit: the time taken does not say which token, or how much of one, matched
        if hmac.compare_digest(known.encode(), given):
            found = scope
    return found


class RefusalReason(enum.Enum):
    """Why a request is refused."""

    NO_TOKEN = "no token"
    UNKNOWN_TOKEN = "unknown token"
    NARROW_SCOPE = "narrow scope"


@dataclass(frozen=True)
class Refusal:
    """A request refused: why, the scope it needed, and the scope its token has (if known)."""

    reason: RefusalReason
    needed: Scope
    held: Scope | None = None

    def api_error(self) -> AuthenticationError | PermissionDeniedError:
        """The error the API answers with: 401 for a missing or unknown token, else 403."""
        if self.reason is RefusalReason.NO_TOKEN:
            return AuthenticationError(
                f"this route needs a bearer token with {self.needed} scope "
                "(Authorization: Bearer <token>)"
            )
        if self.reason is RefusalReason.UNKNOWN_TOKEN:
            return AuthenticationError("the bearer token is not one this service knows")
        return PermissionDeniedError(
            f"this route needs a token with {self.needed} scope; yours is {self.held}"
        )

    @property
    def page_reason(self) -> str:
        """The refusal in the words of the pages (a login form shows it)."""
        if self.reason is RefusalReason.NO_TOKEN:
            return f"this service needs a {self.needed} token"
        if self.reason is RefusalReason.UNKNOWN_TOKEN:
            return "the token is not one this service knows"
        return f"this page needs a token with {self.needed} scope; yours is {self.held}"


def access_refusal(settings: Settings, token: str | None, needed: Scope) -> Refusal | None:
    """Why a request carrying ``token`` (None: none) may not do what needs ``needed``;
    None when it may."""
    if settings.is_open:
        return None
    if token is None:
        if needed is Scope.READ and settings.public_read:
            return None
        return Refusal(RefusalReason.NO_TOKEN, needed)
    held = token_scope(settings, token)
    if held is None:
        return Refusal(RefusalReason.UNKNOWN_TOKEN, needed)
    if not held.allows(needed):
        return Refusal(RefusalReason.NARROW_SCOPE, needed, held)
    return None
