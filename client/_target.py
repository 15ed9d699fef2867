"""Target: where snapshots go, a service (by URL) or a store (by path or URL), decided once.

The command line (``--url``/``--store``), the :class:`Snapshotter` and the Hugging Face
callback all take a place as text; this class is the one place that says which it is and
what is wrong with it. It needs neither httpx nor the store to decide: it opens the one
it names on request (:meth:`Target.client`, :meth:`Target.recorder`, ...).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse
from urllib.request import url2pathname

from gradvault.core import InvalidArgumentError, InvalidArgumentTypeError

if TYPE_CHECKING:
    from gradvault.core import Recorder
    from gradvault.core.store import SnapshotStore

    from ._async import AsyncClient
    from ._sync import Client

#: URL schemes of a service (compared without case, as URL schemes are).
SERVICE_SCHEMES = frozenset({"http", "https"})
#: URL schemes of a store: a folder path has none.
STORE_SCHEMES = frozenset({"", "file", "s3"})
#: The environment variable a service's token comes from when none is given.
TOKEN_VARIABLE = "GRADVAULT_TOKEN"

_EXPECTED = "a service URL (http:// or https://) or a store (a folder path, file:// or s3://)"


class Target:
    """A service or a store, named by ``location``; for a service, its bearer ``token``.

    ``location`` is a service URL (``http://host:8000``, ``https://...``; the scheme in
    any case) or a store: a folder path (``str`` or ``os.PathLike``), a ``file://`` URL or
    ``s3://bucket/prefix``. ``token`` is for a service; when it is None the service's
    token is ``$GRADVAULT_TOKEN`` (None if unset or empty). A store takes no token.

    Refused when made, before anything is opened: a ``location`` that is not text or a
    path (``InvalidArgumentTypeError``, a ``TypeError``); an empty one, a service URL
    without a host, a URL of another scheme, or a ``token`` given for a store
    (``InvalidArgumentError``, a ``ValueError``). Each message names what was found.
    """

    __slots__ = ("is_service", "location", "token")

    def __init__(self, location: str | os.PathLike[str], token: str | None = None) -> None:
        if not isinstance(location, str | os.PathLike):
            raise InvalidArgumentTypeError(
                f"a target is {_EXPECTED}; got {type(location).__name__} {location!r}"
            )
        text = os.fspath(location)
        if not isinstance(text, str):  # a PathLike of bytes
            raise InvalidArgumentTypeError(f"a target is {_EXPECTED}; got bytes {text!r}")
        if not text:
            raise InvalidArgumentError(f"the target is empty; give {_EXPECTED}")
        parsed = urlparse(text)
        scheme = parsed.scheme.lower()
        if scheme in SERVICE_SCHEMES:
            if not parsed.netloc:
                raise InvalidArgumentError(
                    f"a service URL names its host (http://host:port); got {text!r}"
                )
        elif scheme not in STORE_SCHEMES or (scheme == "s3" and "://" not in text):
            hint = (
                "; a URL has '//' after its scheme (s3://<bucket>/<prefix>), and a folder "
                "whose name has a ':' is written ./<name>"
                if "://" not in text
                else ""
            )
            raise InvalidArgumentError(f"a target is {_EXPECTED}; got {text!r}{hint}")
        is_service = scheme in SERVICE_SCHEMES
        if not is_service and token is not None:
            raise InvalidArgumentError(
                f"a token is for a service URL (http:// or https://); {text!r} is a store, "
                "opened by this process"
            )
        self.location = text
        self.is_service = is_service
        self.token: str | None = None
        if is_service:
            self.token = token if token is not None else os.environ.get(TOKEN_VARIABLE) or None

    @classmethod
    def of(cls, target: Target | str | os.PathLike[str], token: str | None = None) -> Target:
        """``target`` if it is a Target already (then ``token`` must be None: the Target
        holds its own), else ``Target(target, token)``."""
        if isinstance(target, Target):
            if token is not None:
                raise InvalidArgumentError(
                    f"a token goes into the Target itself; got one beside {target!r}"
                )
            return target
        return cls(target, token)

    @classmethod
    def service(cls, url: str, token: str | None = None) -> Target:
        """The service at ``url``; ``InvalidArgumentError`` if ``url`` names a store."""
        target = cls(url, token)
        if not target.is_service:
            raise InvalidArgumentError(
                f"a service is an http:// or https:// URL with a host; got {url!r}"
            )
        return target

    @classmethod
    def store(cls, location: str | os.PathLike[str]) -> Target:
        """The store at ``location``; ``InvalidArgumentError`` if it names a service."""
        target = cls(location)
        if target.is_service:
            raise InvalidArgumentError(
                "a store is a folder path, a file:// or an s3:// URL; "
                f"got the service URL {target.location!r}"
            )
        return target

    @property
    def local_folder(self) -> Path | None:
        """The folder of a local store (a path or a ``file://`` URL); None otherwise."""
        if self.is_service:
            return None
        parsed = urlparse(self.location)
        scheme = parsed.scheme.lower()
        if scheme == "":
            return Path(self.location).expanduser()
        if scheme == "file":
            return Path(url2pathname(unquote(parsed.path))).expanduser()
        return None

    def __repr__(self) -> str:
        return f"Target({self.location!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Target):
            return NotImplemented
        return (self.location, self.token) == (other.location, other.token)

    def __hash__(self) -> int:
        return hash((self.location, self.token))

    # ------------------------------------------------------------------ opening
    def client(self, **options: Any) -> Client:
        """A blocking :class:`Client` of this service (``options`` go to it)."""
        from ._sync import Client

        return Client(self._service_url(), self.token, **options)

    def async_client(self, **options: Any) -> AsyncClient:
        """An :class:`AsyncClient` of this service (``options`` go to it)."""
        from ._async import AsyncClient

        return AsyncClient(self._service_url(), self.token, **options)

    def open_store(self, **options: Any) -> SnapshotStore:
        """This store, opened (``gradvault.core.store.open_store``; ``options`` go to it)."""
        from gradvault.core.store import open_store

        return open_store(self._store_location(), **options)

    def recorder(self, **options: Any) -> Recorder:
        """A core :class:`Recorder` of this store (``options`` go to it)."""
        from gradvault.core import Recorder

        return Recorder(self._store_location(), **options)

    def _service_url(self) -> str:
        if not self.is_service:
            raise InvalidArgumentError(f"{self.location!r} is a store, not a service URL")
        return self.location

    def _store_location(self) -> str:
        if self.is_service:
            raise InvalidArgumentError(f"{self.location!r} is a service URL, not a store")
        return self.location
