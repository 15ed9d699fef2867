"""The op table: every op registered once, which yields its function, its Tensor methods and
its export.

An op module writes::

    @register_op(methods=("exp",), export="core")
    def exp(a: Tensor) -> Tensor:
        return Exp.apply(a)

and that one registration makes ``op_table.exp`` (what Tensor's own methods call),
``Tensor.exp`` (the function itself, so ``t.exp()`` is ``exp(t)``) and the public names
``gradvault.core.autodiff.ops.exp`` and ``gradvault.core.exp`` (``export="core"``; ``"ops"`` exports
from ``gradvault.core.autodiff.ops`` only, None from neither). ``reflected=("__radd__",)`` adds
operators that take the tensor as the second operand (``1 + t`` is ``add(1, t)``).

``tensor.py`` sits below the ops: it imports this table, never ``ops``, and hands it the
Tensor class (``attach``); the ops import Tensor and register. The table is full once
``gradvault.core`` is imported (its ``__init__`` imports the ops).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

F = TypeVar("F", bound=Callable[..., Any])
Export = Literal["core", "ops"] | None
EXPORTS = ("core", "ops", None)


@dataclass(frozen=True)
class OpEntry:
    """What one registration yields: the function, its Tensor methods and where it is public."""

    function: Callable[..., Any]
    methods: tuple[str, ...]
    reflected: tuple[str, ...]
    export: Export


def _reflected_method(function: Callable[..., Any], name: str) -> Callable[..., Any]:
    def method(self: Any, other: Any) -> Any:
        return function(other, self)

    method.__name__ = name
    method.__qualname__ = f"Tensor.{name}"
    method.__doc__ = f"``{function.__name__}(other, self)``"
    return method


class OpTable:
    """The registered ops by name: ``op_table.add``, ``op_table.reshape``, ... are the functions."""

    def __init__(self) -> None:
        self._entries: dict[str, OpEntry] = {}
        self._tensor_class: type | None = None

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"no op {name!r} is registered; import gradvault.core (which registers the ops)"
        )

    def attach(self, tensor_class: type) -> None:
        """Make ``tensor_class`` (Tensor, from tensor.py) the class that receives op methods."""
        if self._tensor_class is not None:
            raise InvalidArgumentError(f"the op table serves {self._tensor_class.__name__} already")
        self._tensor_class = tensor_class
        for entry in self._entries.values():
            self._add_methods(entry)

    @overload
    def register(self, function: F) -> F: ...

    @overload
    def register(
        self,
        function: None = None,
        *,
        methods: Sequence[str] = (),
        reflected: Sequence[str] = (),
        export: Export = None,
    ) -> Callable[[F], F]: ...

    def register(
        self,
        function: F | None = None,
        *,
        methods: Sequence[str] = (),
        reflected: Sequence[str] = (),
        export: Export = None,
    ) -> F | Callable[[F], F]:
        """Register an op under its function's name; the function is returned unchanged.

        ``methods``: Tensor methods that are the function itself (``t.name(...)`` calls
        ``function(t, ...)``), such as ``("add", "__add__")``. ``reflected``: operators
        that call ``function(other, t)``, such as ``("__radd__",)``. ``export``: ``"core"``
        for ``gradvault.core`` and ``gradvault.core.autodiff.ops``, ``"ops"`` for
        ``gradvault.core.autodiff.ops`` only, None for neither. Used bare (``@register_op``) or
        with these keywords.
        """
        if export not in EXPORTS:
            raise InvalidArgumentError(f"export must be 'core', 'ops' or None; got {export!r}")
        for names in (methods, reflected):
            if isinstance(names, str):
                raise InvalidArgumentTypeError(
                    f"methods and reflected are sequences of names; got {names!r}"
                )

        def decorate(function: F) -> F:
            name = function.__name__
            if name in self._entries:
                raise InvalidArgumentError(f"op {name!r} is registered twice")
            if hasattr(OpTable, name):
                raise InvalidArgumentError(f"an op cannot be named {name!r} (an OpTable method)")
            entry = OpEntry(function, tuple(methods), tuple(reflected), export)
            if self._tensor_class is not None:
                self._add_methods(entry)
            self._entries[name] = entry
            setattr(self, name, function)
            return function

        return decorate if function is None else decorate(function)

    def unregister(self, name: str) -> None:
        """Remove op ``name`` and the Tensor methods its registration added.

        Names already exported stay where they were copied to (the package namespaces
        are filled when ``gradvault.core`` is imported).
        """
        entry = self._entries.pop(name, None)
        if entry is None:
            raise InvalidArgumentError(f"no op {name!r} is registered")
        delattr(self, name)
        if self._tensor_class is not None:
            for method in (*entry.methods, *entry.reflected):
                delattr(self._tensor_class, method)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        """The names of the registered ops, in the order they were registered."""
        return iter(list(self._entries))

    def entry(self, name: str) -> OpEntry:
        """The registration of op ``name``."""
        try:
            return self._entries[name]
        except KeyError:
            raise InvalidArgumentError(f"no op {name!r} is registered") from None

    def exports(self, package: Literal["core", "ops"]) -> dict[str, Callable[..., Any]]:
        """The op functions ``package`` exports, by name (``"ops"`` includes ``"core"``'s)."""
        levels = ("core",) if package == "core" else ("core", "ops")
        return {
            name: entry.function for name, entry in self._entries.items() if entry.export in levels
        }

    def _add_methods(self, entry: OpEntry) -> None:
        cls = self._tensor_class
        assert cls is not None
        wanted = (*entry.methods, *entry.reflected)
        taken = [name for name in wanted if name in vars(cls)]
        if taken or len(set(wanted)) != len(wanted):
            raise InvalidArgumentError(
                f"op {entry.function.__name__!r}: {cls.__name__} already has "
                f"{', '.join(taken) or 'a method named twice in this registration'}"
            )
        for name in entry.methods:
            setattr(cls, name, entry.function)
        for name in entry.reflected:
            setattr(cls, name, _reflected_method(entry.function, name))


op_table = OpTable()
register_op = op_table.register
