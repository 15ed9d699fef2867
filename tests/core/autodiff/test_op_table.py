"""Adding an op is one registration: it yields the function, its Tensor methods and its export.

The op added here, ``remainder`` (PyTorch's ``torch.remainder`` and ``%``), is registered
for one test and removed after it; the core's own ops are checked against what their
registrations say.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import InvalidArgumentError, InvalidArgumentTypeError
from gradvault.core.autodiff import tensor as tensor_module
from gradvault.core.autodiff.autograd import Context, gradcheck
from gradvault.core.autodiff.autograd.function import Function
from gradvault.core.autodiff.op_table import (
    DECLARATIONS_BEGIN,
    DECLARATIONS_END,
    op_table,
    register_op,
)
from gradvault.core.autodiff.tensor import Tensor, array_of, wrap


class Remainder(Function):
    """``a - floor(a / other) * other``, with the sign of ``other`` (``torch.remainder``)."""

    @staticmethod
    def forward(ctx: Context, a: gv.Tensor, other: gv.Tensor) -> Any:
        ctx.save_for_backward(a, other)
        return np.remainder(array_of(a), array_of(other))

    @staticmethod
    def backward(ctx: Context, g: gv.Tensor) -> tuple[gv.Tensor, gv.Tensor]:
        a, other = ctx.saved_tensors
        quotient = wrap(np.floor(array_of(a) / array_of(other)))  # piecewise constant
        return g, -g * quotient


@pytest.fixture
def remainder() -> Iterator[Callable[..., gv.Tensor]]:
    """The op, registered as an op module would register it; unregistered after the test."""

    @register_op(methods=("remainder", "__mod__"), reflected=("__rmod__",), export="core")
    def remainder(a: Any, other: Any) -> gv.Tensor:
        if not isinstance(a, gv.Tensor):
            a = gv.full_like(other, a)
        if not isinstance(other, gv.Tensor):
            other = gv.full_like(a, other)
        return Remainder.apply(a, other)

    try:
        yield remainder
    finally:
        op_table.unregister("remainder")


def _operands() -> tuple[gv.Tensor, gv.Tensor]:
    # quotients 1.25, 2.33, -0.75: away from the jumps, where finite differences hold
    a = gv.tensor([2.5, 3.5, -1.5], dtype=gv.float64, requires_grad=True)
    b = gv.tensor([2.0, 1.5, 2.0], dtype=gv.float64, requires_grad=True)
    return a, b


def test_one_registration_gives_the_function_the_methods_and_the_operators(remainder) -> None:
    a, b = _operands()
    expected = np.remainder(a.detach().numpy(), b.detach().numpy())
    for result in (remainder(a, b), a.remainder(b), a % b, op_table.remainder(a, b)):
        np.testing.assert_array_equal(result.detach().numpy(), expected)
        assert result.grad_fn is not None and result.grad_fn.name == "RemainderBackward"
    assert gv.Tensor.remainder is remainder and gv.Tensor.__mod__ is remainder
    np.testing.assert_array_equal((a % 2.0).detach().numpy(), np.remainder([2.5, 3.5, -1.5], 2))
    # the reflected operator puts the tensor second: 5 % b is remainder(5, b)
    np.testing.assert_array_equal((5.0 % b).detach().numpy(), np.remainder(5.0, [2.0, 1.5, 2.0]))
    assert op_table.exports("core")["remainder"] is remainder
    assert op_table.entry("remainder").methods == ("remainder", "__mod__")


def test_the_registered_op_has_a_working_backward(remainder) -> None:
    a, b = _operands()
    gradients = (a % b * gv.tensor([1.0, 2.0, 3.0], dtype=gv.float64)).sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(b.grad.numpy(), [-1.0, -4.0, 3.0])  # -g * floor(a / b)
    np.testing.assert_array_equal(gradients.get(b).numpy(), b.grad.numpy())
    assert gradcheck(remainder, _operands())
    assert gradcheck(lambda x, y: x.remainder(y) * (7.0 % y), _operands())


def test_unregistering_removes_the_op_and_its_methods(remainder) -> None:
    op_table.unregister("remainder")
    a, b = _operands()
    assert "remainder" not in op_table and not hasattr(op_table, "remainder")
    assert not hasattr(a, "remainder")
    with pytest.raises(TypeError, match="unsupported operand"):
        a % b
    register_op(methods=("remainder", "__mod__"), reflected=("__rmod__",))(remainder)
    np.testing.assert_array_equal((a % b).detach().numpy(), [0.5, 0.5, 0.5])


def test_a_registration_never_replaces_an_op_or_a_method() -> None:
    def exp(a: gv.Tensor) -> gv.Tensor:
        return a

    with pytest.raises(InvalidArgumentError, match="op 'exp' is registered twice"):
        register_op(exp)

    def to_array(a: gv.Tensor) -> gv.Tensor:
        return a

    with pytest.raises(InvalidArgumentError, match="Tensor already has numpy"):
        register_op(methods=("to_array", "numpy"))(to_array)
    assert "to_array" not in op_table and not hasattr(gv.Tensor, "to_array")
    with pytest.raises(InvalidArgumentTypeError, match="sequences of names; got 'to_array'"):
        register_op(methods="to_array")
    with pytest.raises(InvalidArgumentError, match="export must be 'core', 'ops' or None"):
        register_op(export="public")  # type: ignore[arg-type]

    def register(a: gv.Tensor) -> gv.Tensor:
        return a

    with pytest.raises(InvalidArgumentError, match="cannot be named 'register'"):
        register_op(register)
    with pytest.raises(InvalidArgumentError, match="no op 'to_array' is registered"):
        op_table.unregister("to_array")


def test_the_packages_export_and_tensor_has_what_the_registrations_say() -> None:
    names = list(op_table)
    assert {"add", "exp", "matmul", "cross_entropy", "to_dtype", "backward"} <= set(names)
    for name in names:
        entry = op_table.entry(name)
        assert getattr(op_table, name) is entry.function
        for method in entry.methods:
            assert vars(gv.Tensor)[method] is entry.function, (name, method)
        for method in entry.reflected:
            assert vars(gv.Tensor)[method].__name__ == method, (name, method)
        assert (name in gv.__all__) == (entry.export == "core"), name
        assert (name in gv.ops.__all__) == (entry.export in ("core", "ops")), name
        if entry.export is not None:
            assert getattr(gv.ops, name) is entry.function, name
        if entry.export == "core":
            assert getattr(gv, name) is entry.function, name
    # the two names of gradvault.core.autodiff.ops that are no op registration of their own
    assert set(gv.ops.__all__) - set(names) == {"ValuesIndices", "view"}
    assert gv.ops.view is gv.ops.reshape


def _declared_in_tensor_py() -> str:
    text = Path(tensor_module.__file__).read_text()
    assert text.count(DECLARATIONS_BEGIN) == 1 and text.count(DECLARATIONS_END) == 1
    return text.split(DECLARATIONS_BEGIN)[1].split(DECLARATIONS_END)[0]


def test_tensor_declares_for_type_checkers_the_methods_the_registrations_add() -> None:
    declared = _declared_in_tensor_py()
    assert declared == op_table.method_declarations(), (
        "core/autodiff/tensor.py declares other op methods than the op table adds; "
        "rewrite them with: .venv/bin/python scripts/op_methods.py"
    )
    stubs = ast.parse("class Tensor:\n    if True:\n" + declared).body[0].body[0].body
    names = [stub.name for stub in stubs]
    added = [
        method
        for name in op_table
        for method in (*op_table.entry(name).methods, *op_table.entry(name).reflected)
    ]
    assert sorted(names) == sorted(added) and len(names) == len(set(names))
    assert {"matmul", "__matmul__", "__rmatmul__", "sum", "reshape", "__getitem__"} <= set(names)
    # each declaration has the parameters of the method the table adds (self first)
    for stub in stubs:
        entry = next(
            op_table.entry(name)
            for name in op_table
            if stub.name in (*op_table.entry(name).methods, *op_table.entry(name).reflected)
        )
        parameters = [a.arg for a in (*stub.args.args, *stub.args.kwonlyargs)]
        if stub.args.vararg is not None:
            parameters.insert(len(stub.args.args), stub.args.vararg.arg)
        if stub.name in entry.reflected:
            assert parameters == ["self", "other"], stub.name
        else:
            function = entry.function.__code__
            count = function.co_argcount + function.co_kwonlyargcount + bool(stub.args.vararg)
            assert parameters[1:] == list(function.co_varnames[1:count]), stub.name


def test_a_registration_adds_its_declarations() -> None:
    @register_op(methods=("fmod", "__mod__"), reflected=("__rmod__",))
    def fmod(a: Tensor, other: Any, *, exact: bool = False) -> Tensor:
        return a

    try:
        declarations = op_table.method_declarations()
    finally:
        op_table.unregister("fmod")
    assert "        def fmod(self, other: Any, *, exact: bool = False) -> Tensor: ...\n" in (
        declarations
    )
    assert "        def __rmod__(self, other: Tensor) -> Tensor: ...\n" in declarations
    assert declarations != op_table.method_declarations()  # what tensor.py then lacks


def test_declarations_refuse_what_tensor_py_could_not_read() -> None:
    def shadowed(a: Tensor, scale: float) -> Tensor:
        return a

    def foreign(a: Tensor, other: gv.Tensor) -> Tensor:
        return a

    def unannotated(a: Tensor, other) -> Tensor:
        return a

    for function, message in (
        (shadowed, "annotation 'float' names 'float', which inside Tensor is its attribute"),
        (foreign, "annotation 'gv.Tensor' names 'gv', which .*tensor does not define"),
        (unannotated, "every parameter and the result need annotations"),
    ):
        register_op(methods=(f"{function.__name__}_method",))(function)
        try:
            with pytest.raises(InvalidArgumentError, match=f"op '{function.__name__}': {message}"):
                op_table.method_declarations()
        finally:
            op_table.unregister(function.__name__)
    assert op_table.method_declarations() == _declared_in_tensor_py()
