"""``vjp``, ``jvp``, ``jacobian``, ``hessian``, ``hvp`` and ``vhp`` with PyTorch's signatures.

All are built on ``autograd.grad`` (reverse mode); ``jvp`` uses the double-vjp trick.
Tuple inputs give tuple results, a single tensor gives a single tensor; results are
detached unless ``create_graph=True``; ``strict=True`` raises where an output does not
depend on an input instead of returning zeros.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import (
    AutogradError,
    InvalidArgumentError,
    InvalidArgumentTypeError,
    UnsupportedOptionError,
)
from ..factories import ones_like, zeros, zeros_like
from ..grad_mode import enable_grad
from ..ops import reshape, stack
from ..tensor import Tensor
from ._arguments import as_tuple
from .engine import grad


def _shape_like(values: tuple[Any, ...], was_tuple: bool) -> Any:
    return values if was_tuple else values[0]


def _prepare_inputs(inputs: tuple[Any, ...], create_graph: bool) -> tuple[Any, ...]:
    out = []
    for t in inputs:
        if not isinstance(t, Tensor):
            raise InvalidArgumentTypeError(f"inputs must be tensors; got {type(t).__name__}")
        if create_graph and t.requires_grad:
            out.append(t.view_as(t) if t.grad_fn is None else t)
        else:
            out.append(t.detach().requires_grad_(True))
    return tuple(out)


def _finish(values: tuple[Any, ...], create_graph: bool) -> tuple[Any, ...]:
    return tuple(v if v is None or create_graph else v.detach() for v in values)


def _grad(
    outputs: tuple[Any, ...],
    inputs: tuple[Any, ...],
    grad_outputs: tuple[Any, ...],
    create_graph: bool,
) -> tuple[Any, ...]:
    kept = [(o, g) for o, g in zip(outputs, grad_outputs, strict=True) if o.requires_grad]
    if not kept:
        return (None,) * len(inputs)
    return grad(
        [o for o, _ in kept],
        list(inputs),
        [g for _, g in kept],
        retain_graph=True,
        create_graph=create_graph,
        allow_unused=True,
    )


def _fill_unused(
    grads: tuple[Any, ...], like: tuple[Any, ...], strict: bool, what: str
) -> tuple[Any, ...]:
    out = []
    for i, (g, t) in enumerate(zip(grads, like, strict=True)):
        if g is None:
            if strict:
                raise AutogradError(
                    f"the output of the function is independent of input {i} ({what}); this "
                    "is not allowed in strict mode"
                )
            g = zeros_like(t)
        out.append(g)
    return tuple(out)


def _check_v(v: Any, like: tuple[Any, ...], name: str) -> tuple[Any, ...]:

    if v is None:
        for t in like:
            if t.numel() != 1:
                raise AutogradError(
                    f"{name} can be omitted only when every tensor it pairs with has one "
                    f"element; got shape {t.shape}"
                )
        return tuple(ones_like(t) for t in like)
    values = as_tuple(v)
    if len(values) != len(like):
        raise AutogradError(f"{name} has {len(values)} tensors; expected {len(like)}")
    for value, t in zip(values, like, strict=True):
        if not isinstance(value, Tensor) or value.shape != t.shape:
            raise AutogradError(
                f"{name} entries must be tensors of shape {t.shape}; got "
                f"{getattr(value, 'shape', type(value).__name__)}"
            )
    return values


def vjp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(inputs), v^T J)``."""
    was_tuple = isinstance(inputs, tuple | list)
    with enable_grad():
        inp = _prepare_inputs(as_tuple(inputs), create_graph)
        outputs = func(*inp)
        out_tuple = isinstance(outputs, tuple | list)
        outs = as_tuple(outputs)
        vs = _check_v(v, outs, "v")
        grads = _grad(outs, inp, vs, create_graph)
    grads = _fill_unused(grads, inp, strict, "vjp")
    return (
        _shape_like(_finish(outs, create_graph), out_tuple),
        _shape_like(_finish(grads, create_graph), was_tuple),
    )


def jvp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(inputs), J v)``, by the double-vjp trick."""
    with enable_grad():
        inp = _prepare_inputs(as_tuple(inputs), create_graph)
        vs = _check_v(v, inp, "v")
        outputs = func(*inp)
        out_tuple = isinstance(outputs, tuple | list)
        outs = as_tuple(outputs)
        dummies = tuple(zeros_like(o).requires_grad_(True) for o in outs)
        grads = _grad(outs, inp, dummies, create_graph=True)
        if strict and any(g is None for g in grads):
            index = next(i for i, g in enumerate(grads) if g is None)
            raise AutogradError(
                f"the output of the function is independent of input {index} (jvp); this is "
                "not allowed in strict mode"
            )
        pairs = [
            (g, v_) for g, v_ in zip(grads, vs, strict=True) if g is not None and g.requires_grad
        ]
        if pairs:
            result = _grad(
                tuple(g for g, _ in pairs), dummies, tuple(v_ for _, v_ in pairs), create_graph
            )
        else:
            result = (None,) * len(outs)
    result = _fill_unused(result, outs, False, "jvp")
    return (
        _shape_like(_finish(outs, create_graph), out_tuple),
        _shape_like(_finish(result, create_graph), out_tuple),
    )


def jacobian(
    func: Callable[..., Any],
    inputs: Any,
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    strategy: str = "reverse-mode",
) -> Any:
    """The Jacobian: ``J[i][j]`` has shape ``outputs[i].shape + inputs[j].shape``."""

    if strategy not in ("reverse-mode", "forward-mode"):
        raise InvalidArgumentError(
            f"strategy must be 'reverse-mode' or 'forward-mode'; got {strategy!r}"
        )
    if strategy == "forward-mode":
        # PyTorch's limits for forward mode; the values themselves come from reverse mode
        if create_graph:
            raise UnsupportedOptionError(
                "jacobian: create_graph=True and strategy='forward-mode' are not supported "
                "together; set create_graph=False or strategy='reverse-mode'"
            )
        if strict:
            raise AutogradError(
                "jacobian: strict=True and strategy='forward-mode' are not supported together; "
                "set strict=False or strategy='reverse-mode'"
            )
        if not vectorize:
            raise UnsupportedOptionError(
                "jacobian: strategy='forward-mode' is only implemented with vectorize=True; "
                "got vectorize=False"
            )
    was_tuple = isinstance(inputs, tuple | list)
    with enable_grad():
        inp = _prepare_inputs(as_tuple(inputs), create_graph)
        outputs = func(*inp)
        out_tuple = isinstance(outputs, tuple | list)
        outs = as_tuple(outputs)
        table = []
        for i, o in enumerate(outs):
            flat = reshape(o, (-1,))
            rows: list[list[Any]] = [[] for _ in inp]
            for k in range(o.numel()):
                grads = (
                    _grad((flat[k],), inp, (_one(flat[k]),), create_graph)
                    if o.requires_grad
                    else (None,) * len(inp)
                )
                for j, (g, t) in enumerate(zip(grads, inp, strict=True)):
                    if g is None:
                        if strict:
                            raise AutogradError(
                                f"output {i} of the function is independent of input {j} "
                                "(jacobian); this is not allowed in strict mode"
                            )
                        g = zeros(t.shape, dtype=t.dtype, device=t.device)
                    rows[j].append(g)
            row = []
            for j, t in enumerate(inp):
                if rows[j]:
                    block = reshape(stack(rows[j]), o.shape + t.shape)
                else:
                    block = zeros(o.shape + t.shape, dtype=t.dtype, device=t.device)
                row.append(block if create_graph else block.detach())
            table.append(tuple(row))
    if out_tuple:
        return tuple(_shape_like(row, was_tuple) for row in table)
    return _shape_like(table[0], was_tuple)


def _one(t: Any) -> Any:
    return ones_like(t)


def hessian(
    func: Callable[..., Any],
    inputs: Any,
    create_graph: bool = False,
    strict: bool = False,
    vectorize: bool = False,
    outer_jacobian_strategy: str = "reverse-mode",
) -> Any:
    """The Hessian of a scalar function: the Jacobian of its gradient.

    ``vectorize`` and ``outer_jacobian_strategy`` go to ``jacobian`` as in PyTorch (the
    outer Jacobian takes the strategy), with ``jacobian``'s rules for them.
    """
    was_tuple = isinstance(inputs, tuple | list)

    def gradient(*args: Any) -> Any:
        out = func(*args)
        _check_scalar(out, "hessian")
        return jacobian(
            func,
            args if was_tuple else args[0],
            create_graph=True,
            strict=strict,
            vectorize=vectorize,
        )

    return jacobian(
        gradient,
        inputs,
        create_graph=create_graph,
        strict=strict,
        vectorize=vectorize,
        strategy=outer_jacobian_strategy,
    )


def _check_scalar(out: Any, name: str) -> None:
    if not isinstance(out, Tensor) or out.numel() != 1:
        raise AutogradError(
            f"the function given to {name} should return a single tensor with a single element"
        )


def _first_gradient(
    func: Callable[..., Any], inputs: Any, v: Any, create_graph: bool, strict: bool, name: str
) -> tuple[tuple[Any, ...], tuple[Any, ...], Any, tuple[Any, ...]]:
    """What vhp and hvp share: ``(inputs, v, func(inputs), its gradient with a graph)``.

    Runs under ``enable_grad``; the gradient keeps its graph so it can be differentiated.
    """
    inp = _prepare_inputs(as_tuple(inputs), create_graph)
    vs = _check_v(v, inp, "v")
    out = func(*inp)
    _check_scalar(out, name)
    jac = _fill_unused(_grad((out,), inp, (_one(out),), create_graph=True), inp, strict, name)
    return inp, vs, out, tuple(jac)


def vhp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(inputs), v^T H)`` for a scalar function."""
    with enable_grad():
        inp, vs, out, jac = _first_gradient(func, inputs, v, create_graph, strict, "vhp")
        result = _grad(jac, inp, vs, create_graph)
    result = _fill_unused(result, inp, strict, "vhp")
    was_tuple = isinstance(inputs, tuple | list)
    return _finish((out,), create_graph)[0], _shape_like(_finish(result, create_graph), was_tuple)


def hvp(
    func: Callable[..., Any],
    inputs: Any,
    v: Any = None,
    create_graph: bool = False,
    strict: bool = False,
) -> tuple[Any, Any]:
    """``(func(inputs), H v)`` for a scalar function, by the double-backward trick."""
    with enable_grad():
        inp, vs, out, jac = _first_gradient(func, inputs, v, create_graph, strict, "hvp")
        dummies = tuple(zeros_like(t).requires_grad_(True) for t in inp)
        double_back = _grad(jac, inp, dummies, create_graph=True)
        pairs = [
            (d, v_)
            for d, v_ in zip(double_back, vs, strict=True)
            if d is not None and d.requires_grad
        ]
        if pairs:
            result = _grad(
                tuple(d for d, _ in pairs), dummies, tuple(v_ for _, v_ in pairs), create_graph
            )
        else:
            result = (None,) * len(inp)
    result = _fill_unused(result, inp, strict, "hvp")
    was_tuple = isinstance(inputs, tuple | list)
    return _finish((out,), create_graph)[0], _shape_like(_finish(result, create_graph), was_tuple)
