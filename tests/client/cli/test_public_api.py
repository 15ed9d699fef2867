"""The names gradvault.client.cli exports, pinned; the CLI's errors sit in the project's tree."""

from __future__ import annotations

import gradvault.client.cli
from gradvault.client.cli.errors import MissingExtraError, ServeError, UsageError
from gradvault.core import GradvaultError


def test_the_exported_names() -> None:
    assert gradvault.client.cli.__all__ == ["main"]
    assert callable(gradvault.client.cli.main)


def test_errors_are_in_the_project_tree() -> None:
    assert issubclass(UsageError, GradvaultError) and issubclass(UsageError, ValueError)
    assert issubclass(MissingExtraError, GradvaultError) and issubclass(
        MissingExtraError, ImportError
    )
    assert issubclass(ServeError, GradvaultError) and issubclass(ServeError, RuntimeError)
    assert UsageError("--limit is wrong", prog="gradvault ls").prog == "gradvault ls"
