"""gradvault.service: the HTTP service (FastAPI) that lists, serves, accepts and deletes snapshots.

``create_app(settings)`` builds the ASGI app; ``serve(settings)`` runs it under uvicorn;
``python -m gradvault.service --store URL`` does both. docs/SERVICE.md describes settings,
routes, authentication and errors.
"""

from .app import create_app
from .errors import (
    AuthenticationError,
    CrossSiteRequestError,
    InsufficientStorageError,
    InvalidCursorError,
    InvalidFormError,
    OpenBindingError,
    PermissionDeniedError,
    RangeNotSatisfiableError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
    UploadTooLargeError,
)
from .server import serve
from .settings import Scope, Settings

__all__ = [
    "AuthenticationError",
    "CrossSiteRequestError",
    "InsufficientStorageError",
    "InvalidCursorError",
    "InvalidFormError",
    "OpenBindingError",
    "PermissionDeniedError",
    "RangeNotSatisfiableError",
    "RequestTimeoutError",
    "Scope",
    "Settings",
    "UnsupportedMediaTypeError",
    "UploadTooLargeError",
    "create_app",
    "serve",
]
