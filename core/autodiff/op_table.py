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

Type checkers do not run the registrations, so ``tensor.py`` also declares the methods
they add, under ``if TYPE_CHECKING:``: ``method_declarations()`` writes that block from
the registrations (``python scripts/op_methods.py`` puts it into ``tensor.py``), and a
test checks that the block in ``tensor.py`` is what the table says today.
"""

from __future__ import annotations

import builtins
import inspect
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from ..errors import InvalidArgumentError, InvalidArgumentTypeError

F = TypeVar("F", bound=Callable[..., Any])
Export = Literal["core", "ops"] | None
EXPORTS = ("core", "ops", None)

#: The lines around the generated declarations in ``tensor.py`` (``method_declarations``).
DECLARATIONS_BEGIN = "    if TYPE_CHECKING:  # the op methods, written by scripts/op_methods.py\n\n"
DECLARATIONS_END = "\n        # (end of the op methods written by scripts/op_methods.py)\n"
LINE_LENGTH = 100  # ruff's, from pyproject.toml: the block is written as ruff formats it


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

    def method_declarations(self) -> str:
        """The body of ``tensor.py``'s ``if TYPE_CHECKING:`` block: the op methods' signatures.

        One stub per method and reflected operator, ops in name order, written as ruff
        formats them. A method's parameters are its function's, the first (the tensor)
        becoming ``self``; a reflected operator's one parameter is the function's first.
        Annotations are copied as written, so each must name something ``tensor.py``
        has, and not a Tensor attribute (inside the class, ``float`` would be the method).
        """
        cls = self._tensor_class
        if cls is None:
            raise InvalidArgumentError("no Tensor class is attached to the op table yet")
        namespace = vars(sys.modules[cls.__module__])
        lines: list[str] = []
        for name in sorted(self._entries):
            entry = self._entries[name]
            if not (entry.methods or entry.reflected):
                continue
            signature = inspect.signature(entry.function)
            parameters = list(signature.parameters.values())
            if not parameters or parameters[0].kind is not parameters[0].POSITIONAL_OR_KEYWORD:
                raise InvalidArgumentError(
                    f"op {name!r} has methods, so its first parameter must be the tensor; "
                    f"its signature is {signature}"
                )
            returns = _annotation(name, signature.return_annotation, cls, namespace)
            rest = [_parameter(name, p, cls, namespace) for p in parameters[1:]]
            keyword_only = [p.kind is p.KEYWORD_ONLY for p in parameters[1:]]
            if True in keyword_only and not any(p.kind is p.VAR_POSITIONAL for p in parameters):
                rest.insert(keyword_only.index(True), "*")
            for method in entry.methods:
                lines += _stub(method, ["self", *rest], returns, cls)
            for method in entry.reflected:
                first = _parameter(name, parameters[0], cls, namespace).split(":")[1].strip()
                lines += _stub(method, ["self", f"other: {first}"], returns, cls)
        return "".join(line + "\n" for line in lines)

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


def _annotation(op: str, annotation: Any, cls: type, namespace: dict[str, Any]) -> str:
    """``annotation`` as written (a string: the op modules use postponed annotations)."""
    if annotation is inspect.Parameter.empty:
        raise InvalidArgumentError(f"op {op!r}: every parameter and the result need annotations")
    if not isinstance(annotation, str):
        raise InvalidArgumentError(
            f"op {op!r}: annotations must be postponed (from __future__ import annotations); "
            f"found {annotation!r}"
        )
    for word in re.findall(r"(?<![.\w])[A-Za-z_]\w*", annotation):
        if word in vars(cls):
            raise InvalidArgumentError(
                f"op {op!r}: annotation {annotation!r} names {word!r}, which inside "
                f"{cls.__name__} is its attribute; write the type another way"
            )
        if word not in namespace and not hasattr(builtins, word):
            raise InvalidArgumentError(
                f"op {op!r}: annotation {annotation!r} names {word!r}, which "
                f"{cls.__module__} does not define or import"
            )
    return annotation


def _parameter(op: str, parameter: inspect.Parameter, cls: type, namespace: dict[str, Any]) -> str:
    """One parameter as a stub writes it: ``*shape: Any``, ``dim: int | None = None``."""
    kind = parameter.kind
    stars = "*" if kind is kind.VAR_POSITIONAL else "**" if kind is kind.VAR_KEYWORD else ""
    text = f"{stars}{parameter.name}: "
    text += _annotation(op, parameter.annotation, cls, namespace)
    default = parameter.default
    if default is parameter.empty:
        return text
    if default is None or isinstance(default, bool | int | float):
        return f"{text} = {default!r}"
    if isinstance(default, str) and re.fullmatch(r"[\w .,-]*", default):
        return f'{text} = "{default}"'
    raise InvalidArgumentError(
        f"op {op!r}: parameter {parameter.name!r} has default {default!r}; the declarations "
        "take None, a bool, a number or a plain string"
    )


def _stub(method: str, parameters: list[str], returns: str, cls: type) -> list[str]:
    """``def method(...) -> returns: ...`` in ruff's layout, on one line or wrapped.

    ``__eq__`` and ``__ne__`` carry the ignore their override needs: ``object`` declares
    them returning bool, and an op returns a Tensor (as in PyTorch and NumPy).
    """
    ignore = "  # type: ignore[override]" if method in ("__eq__", "__ne__") else ""
    indent = " " * 8
    one_line = f"{indent}def {method}({', '.join(parameters)}) -> {returns}: ...{ignore}"
    if len(one_line) <= LINE_LENGTH:
        return [one_line]
    inner = f"{indent}    {', '.join(parameters)}"
    if len(inner) <= LINE_LENGTH:
        return [f"{indent}def {method}(", inner, f"{indent}) -> {returns}: ...{ignore}"]
    return [
        f"{indent}def {method}(",
        *(f"{indent}    {parameter}," for parameter in parameters),
        f"{indent}) -> {returns}: ...{ignore}",
    ]


op_table = OpTable()
register_op = op_table.register
