"""The op table: the functions Tensor's methods call, each registered once by its op module.

``tensor.py`` sits below the ops: it imports this table, never ``ops``. Each op module
marks its public functions with ``@register_op``; ``Tensor.exp`` is then a one-line call
to ``op_table.exp``. The table is full once ``gradvault.core`` is imported (its
``__init__`` imports the ops).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class OpTable:
    """The registered op functions, by name (``op_table.add``, ``op_table.reshape``, ...)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"no op {name!r} is registered; import gradvault.core (which registers the ops)"
        )

    def register(self, function: F) -> F:
        """Register ``function`` under its own name and return it unchanged (a decorator)."""
        name = function.__name__
        if name in vars(self):
            raise RuntimeError(f"op {name!r} is registered twice")
        setattr(self, name, function)
        return function


op_table = OpTable()
register_op = op_table.register
