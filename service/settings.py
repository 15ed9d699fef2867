"""The service's settings: keyword arguments, else ``GRADVAULT_*`` environment variables."""

from __future__ import annotations

import ipaddress
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from .errors import OpenBindingError


class Scope(StrEnum):
    """What a bearer token may do: ``read`` (every GET) or ``write`` (reads too)."""

    READ = "read"
    WRITE = "write"

    def allows(self, needed: Scope) -> bool:
        return self is Scope.WRITE or needed is Scope.READ


def parse_tokens(text: str) -> dict[str, Scope]:
    """``"tokenA:write,tokenB:read"`` as ``{token: scope}``; ValueError naming a bad pair."""
    tokens: dict[str, Scope] = {}
    for pair in text.split(","):
        pair = pair.strip()
        if not pair:
            continue
        token, colon, scope = pair.rpartition(":")
        if not colon or not token:
            raise ValueError(f"a token is given as 'token:scope'; got {_redact(pair)!r}")
        if scope not in (Scope.READ, Scope.WRITE):
            raise ValueError(
                f"a token's scope is 'read' or 'write'; token {_redact(token)!r} has {scope!r}"
            )
        if not token.isascii() or not token.isprintable() or " " in token:
            raise ValueError(
                f"a token is printable ASCII without spaces; got {_redact(token)!r} "
                f"({len(token)} characters)"
            )
        tokens[token] = Scope(scope)
    return tokens


def _redact(token: str) -> str:
    """Enough of a token to recognise it in an error message, not enough to use it."""
    return token[:3] + "..." if len(token) > 6 else "..."


def parse_origin(text: str) -> str:
    """``"HTTPS://Example.org:8443"`` as ``"https://example.org:8443"``; ValueError otherwise.

    An origin is what browsers send in ``Origin``: a scheme, a host and maybe a port, no
    path. Default ports are dropped, as browsers drop them.
    """
    scheme, separator, rest = text.strip().lower().partition("://")
    if scheme not in ("http", "https") or not separator or not rest or "/" in rest:
        raise ValueError(
            f"an allowed origin is scheme://host[:port] (http or https, no path); got {text!r}"
        )
    default_port = {"http": ":80", "https": ":443"}[scheme]
    return f"{scheme}://{rest.removesuffix(default_port)}"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the service reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve to anything


class Settings(BaseSettings):
    """Everything the service is configured with (docs/SERVICE.md lists each setting)."""

    # hide_input_in_errors: a validation error never echoes what was given, so a malformed
    # GRADVAULT_TOKENS (or store_options holding S3 keys) is never printed or logged
    model_config = SettingsConfigDict(
        env_prefix="GRADVAULT_", extra="forbid", hide_input_in_errors=True
    )

    store: str = Field(".gradvault/store", description="folder path, file:// or s3:// URL")
    store_options: dict[str, Any] = Field(
        default_factory=dict, description="extra open_store options (JSON), e.g. an S3 endpoint"
    )
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8000, ge=0, le=65535, description="port to bind (0: a free one)")
    tokens: Annotated[dict[str, Scope], NoDecode] = Field(
        default_factory=dict, description="comma-separated token:scope pairs"
    )
    public_read: bool = Field(False, description="reads need no token (writes still do)")
    allow_open: bool = Field(
        False, description="allow serving without tokens on a non-loopback address"
    )
    max_upload_bytes: int = Field(8 << 30, ge=1, description="largest upload (413 beyond)")
    max_header_bytes: int = Field(
        16 << 20, ge=8, description="largest safetensors JSON header in an upload"
    )
    index_refresh_seconds: float = Field(1.0, ge=0, description="how old the listing index may be")
    spool_dir: str | None = Field(None, description="where uploads are spooled (system temp)")
    max_body_bytes: int = Field(
        4096, ge=1, description="largest body a route reads whole, the login form (413 beyond)"
    )
    header_timeout_seconds: float = Field(
        10.0, gt=0, description="time a connection has to send a request's line and headers"
    )
    body_timeout_seconds: float = Field(
        60.0, gt=0, description="longest wait for the next part of a request body (408 beyond)"
    )
    keep_alive_seconds: int = Field(
        5, ge=1, description="how long an idle kept-alive connection stays open"
    )
    limit_concurrency: int = Field(
        1000, ge=1, description="open connections or requests in progress beyond which 503"
    )
    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="comma-separated origins whose pages may write, besides the service's own",
    )

    @field_validator("tokens", mode="before")
    @classmethod
    def _parse_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return parse_tokens(value)
        return value

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _parse_origins(cls, value: object) -> object:
        if isinstance(value, str):
            value = [item.strip() for item in value.split(",") if item.strip()]
        if isinstance(value, list):
            return [parse_origin(item) if isinstance(item, str) else item for item in value]
        return value

    @property
    def is_open(self) -> bool:
        """No tokens configured: anyone who can connect may read, write and delete."""
        return not self.tokens

    def __repr_args__(self):  # tokens are secrets: never in a repr or a log line
        for name, value in super().__repr_args__():
            yield name, (f"<{len(value)} tokens>" if name == "tokens" else value)


def check_binding(settings: Settings) -> None:
    """Refuse to serve without tokens anywhere but loopback, unless allow_open says so."""
    if settings.is_open and not settings.allow_open and not is_loopback(settings.host):
        raise OpenBindingError(
            f"no tokens are configured (GRADVAULT_TOKENS), so the service would let anyone "
            f"who reaches {settings.host}:{settings.port} read, write and delete snapshots; "
            f"bind 127.0.0.1, configure tokens, or set GRADVAULT_ALLOW_OPEN=true"
        )
