"""Every differentiable op, as functions and as Tensor methods (installed here)."""

from __future__ import annotations

from typing import Any

from .. import backend
from ..autograd.function import Context, Function
from ..tensor import Tensor
from ._common import as_tensor_like, constant, xp
from .elementwise import (
    abs,
    add,
    clamp,
    div,
    erf,
    exp,
    gelu,
    log,
    logical_and,
    logical_or,
    mul,
    neg,
    pow,
    relu,
    sigmoid,
    sqrt,
    sub,
    tanh,
    where,
)
from .nn import cross_entropy, linear, log_softmax, matmul, mse_loss, softmax
from .reduction import ValuesIndices, argmax, max, mean, min, std, sum, var
from .shape import (
    cat,
    contiguous,
    expand,
    flatten,
    getitem,
    index_put,
    permute,
    reshape,
    squeeze,
    stack,
    transpose,
    unsqueeze,
    view,
)


class ToDtype(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, dtype: Any) -> Any:
        ctx.dtype = a.dtype
        return a._data.astype(dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g.to(dtype=ctx.dtype)


class ToDevice(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, device: backend.Device) -> Any:
        ctx.device = a.device
        return backend.to_device(a._data, device)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g.to(ctx.device)


class Clone(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        return a._data.copy()

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g


def clone(a: Tensor) -> Tensor:
    """A copy with its own storage, still in the graph."""
    return Clone.apply(a)


def _compare(name: str) -> Any:
    def method(self: Tensor, other: Any) -> Tensor:
        other = as_tensor_like(other, self)
        return constant(getattr(xp(self), name)(self._data, other._data))

    return method


def _reflected(fn: Any) -> Any:
    return lambda self, other: fn(other, self)


def install_methods(cls: type[Tensor]) -> None:
    """Give Tensor its operator and method forms of the ops."""
    cls.__add__ = add
    cls.__radd__ = _reflected(add)
    cls.__sub__ = sub
    cls.__rsub__ = _reflected(sub)
    cls.__mul__ = mul
    cls.__rmul__ = _reflected(mul)
    cls.__truediv__ = div
    cls.__rtruediv__ = _reflected(div)
    cls.__pow__ = pow
    cls.__rpow__ = _reflected(pow)
    cls.__neg__ = neg
    cls.__matmul__ = matmul
    cls.__rmatmul__ = _reflected(matmul)
    cls.__getitem__ = getitem
    for dunder, ufunc in [
        ("__lt__", "less"),
        ("__le__", "less_equal"),
        ("__gt__", "greater"),
        ("__ge__", "greater_equal"),
        ("__eq__", "equal"),
        ("__ne__", "not_equal"),
        ("__and__", "logical_and"),
        ("__or__", "logical_or"),
    ]:
        setattr(cls, dunder, _compare(ufunc))
    cls.__invert__ = lambda self: constant(xp(self).logical_not(self._data))
    cls.__hash__ = object.__hash__
    for name, fn in {
        "add": add,
        "sub": sub,
        "mul": mul,
        "div": div,
        "pow": pow,
        "neg": neg,
        "exp": exp,
        "log": log,
        "sqrt": sqrt,
        "abs": abs,
        "tanh": tanh,
        "sigmoid": sigmoid,
        "relu": relu,
        "erf": erf,
        "clamp": clamp,
        "clip": clamp,
        "matmul": matmul,
        "sum": sum,
        "mean": mean,
        "max": max,
        "min": min,
        "var": var,
        "std": std,
        "argmax": argmax,
        "reshape": reshape,
        "view": view,
        "permute": permute,
        "transpose": transpose,
        "expand": expand,
        "unsqueeze": unsqueeze,
        "squeeze": squeeze,
        "flatten": flatten,
        "softmax": softmax,
        "log_softmax": log_softmax,
        "clone": clone,
    }.items():
        setattr(cls, name, fn)
    cls.T = property(lambda self: permute(self, tuple(reversed(range(self.ndim)))))
    cls.mT = property(lambda self: transpose(self, -1, -2))
    cls.square = lambda self: mul(self, self)
    cls.contiguous = contiguous
    cls.is_contiguous = lambda self: bool(self._data.flags.c_contiguous)
    cls.view_as = lambda self, other: reshape(self, other.shape)
    cls.expand_as = lambda self, other: expand(self, other.shape)


install_methods(Tensor)

__all__ = [
    "ValuesIndices",
    "abs",
    "add",
    "argmax",
    "cat",
    "clamp",
    "clone",
    "cross_entropy",
    "div",
    "erf",
    "exp",
    "expand",
    "flatten",
    "gelu",
    "getitem",
    "index_put",
    "linear",
    "log",
    "log_softmax",
    "logical_and",
    "logical_or",
    "matmul",
    "max",
    "mean",
    "min",
    "mse_loss",
    "mul",
    "neg",
    "permute",
    "pow",
    "relu",
    "reshape",
    "sigmoid",
    "softmax",
    "sqrt",
    "squeeze",
    "stack",
    "std",
    "sub",
    "sum",
    "tanh",
    "transpose",
    "unsqueeze",
    "var",
    "view",
    "where",
]
