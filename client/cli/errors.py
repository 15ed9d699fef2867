"""The errors of the ``gradvault`` command, under the core's root::

    GradvaultError
    ├── UsageError (ValueError)       the command line asks for something impossible (exit 2)
    ├── ServeError (RuntimeError)     the service could not start (a port in use ...)
    └── MissingExtraError (ImportError)  a command needs an extra that is not installed (exit 1)

Every other error a command meets is the core's (``gradvault.core.errors``) or an
``OSError`` from a file; :func:`gradvault.client.cli.main` prints each as one line.
"""

from __future__ import annotations

from gradvault.core.errors import GradvaultError


class UsageError(GradvaultError, ValueError):
    """A command line that cannot be carried out as given: exit status 2.

    ``prog`` names the command whose line it is (``"gradvault ls"``), when known.
    """

    def __init__(self, message: str, prog: str | None = None) -> None:
        super().__init__(message)
        self.prog = prog


class MissingExtraError(GradvaultError, ImportError):
    """A command needs an optional dependency (an extra) that is not installed."""

    def __init__(self, what: str, extra: str, cause: ImportError) -> None:
        missing = cause.name or str(cause)
        super().__init__(
            f"{what} needs the {extra} extra ({missing} is not installed): "
            f"pip install 'gradvault[{extra}]'"
        )


class ServeError(GradvaultError, RuntimeError):
    """The service could not start, or stopped on an error (uvicorn has logged why)."""
