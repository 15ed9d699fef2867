"""The errors the service adds to the core's tree (gradvault.core.errors).

Routes and dependencies raise these or the core's errors; one handler
(:mod:`gradvault.service.error_handlers`) turns each into a status and a JSON body::

    GradvaultError
    ├── OpenBindingError (ValueError)         no tokens, and a host other machines reach
    ├── AuthenticationError                   401: no bearer token, or an unknown one
    ├── PermissionDeniedError                 403: a read token on a write route
    │   └── CrossSiteRequestError             403: a write whose Origin is another site
    ├── InvalidCursorError (ValueError)       400: a listing cursor this service did not make
    ├── RequestTimeoutError                   408: a request body that stopped arriving
    ├── UploadTooLargeError (ValueError)      413: a body over its limit (max_upload_bytes,
    │                                              max_body_bytes)
    ├── UnsupportedMediaTypeError (ValueError) 415: a body of a Content-Type not documented
    ├── PageOutOfRangeError (ValueError)      422: a page past the last of a snapshot's table
    ├── InvalidFormError (ValueError)         422: a login form that is not the page's form
    ├── RangeNotSatisfiableError (ValueError) 416: a Range that misses the resource
    └── InsufficientStorageError (OSError)    507: no room to spool an upload
"""

from __future__ import annotations

from gradvault.core import GradvaultError


class OpenBindingError(GradvaultError, ValueError):
    """The service would be open (no tokens) on an address other machines can reach."""


class AuthenticationError(GradvaultError):
    """The request carries no bearer token, or one that is not configured."""


class PermissionDeniedError(GradvaultError):
    """The request's token does not have the scope the route needs."""


class CrossSiteRequestError(PermissionDeniedError):
    """A write (POST, DELETE) from a page of another site, by its ``Origin`` header."""


class RequestTimeoutError(GradvaultError):
    """The client stopped sending a request body (``body_timeout_seconds``)."""


class UnsupportedMediaTypeError(GradvaultError, ValueError):
    """A request body whose ``Content-Type`` is not one its route documents."""


class InvalidFormError(GradvaultError, ValueError):
    """A form body that is not the form its page sends (too many fields, say)."""


class InvalidCursorError(GradvaultError, ValueError):
    """A listing cursor that this service did not hand out."""


class PageOutOfRangeError(GradvaultError, ValueError):
    """A page number past the last page of a snapshot's gradient table (``/ui``)."""


class UploadTooLargeError(GradvaultError, ValueError):
    """A body over its limit, by its Content-Length or by what arrived.

    Uploads have ``max_upload_bytes``; every other body, read whole, ``max_body_bytes``.
    """


class RangeNotSatisfiableError(GradvaultError, ValueError):
    """A Range header none of whose ranges overlaps the resource of ``size`` bytes."""

    def __init__(self, message: str, size: int) -> None:
        super().__init__(message)
        self.size = size


class InsufficientStorageError(GradvaultError, OSError):
    """The service's own disk (where uploads are spooled) is full."""
