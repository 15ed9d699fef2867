"""Every differentiable op as a function; each is registered once in ``op_table``
(core/autodiff/op_table.py), which gives it its Tensor methods and says where it is public.

The imports below name each public op, so that type checkers see them; a test checks
them, and ``gradvault.core``'s, against the registrations.
"""

from __future__ import annotations

from typing import Any

from .. import backend
from ..function import Function
from ..graph import Context
from ..op_table import register_op
from ..tensor import Tensor, array_of
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
from .nn import (
    cross_entropy,
    linear,
    log_softmax,
    matmul,
    mse_loss,
    softmax,
)
from .reduction import (
    ValuesIndices,
    argmax,
    max,
    mean,
    min,
    std,
    sum,
    var,
)
from .shape import (
    cat,
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
        return array_of(a).astype(dtype)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g.to(dtype=ctx.dtype)


class ToDevice(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, device: backend.Device) -> Any:
        ctx.device = a.device
        return backend.to_device(array_of(a), device)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g.to(ctx.device)


class Clone(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        return array_of(a).copy()

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g


@register_op(methods=("clone",), export="core")
def clone(a: Tensor) -> Tensor:
    """A copy with its own storage, still in the graph."""
    return Clone.apply(a)


@register_op
def to_dtype(a: Tensor, dtype: Any) -> Tensor:
    """``a`` as ``dtype``, in the graph (``Tensor.to(dtype=...)``)."""
    return ToDtype.apply(a, dtype)


@register_op
def to_device(a: Tensor, device: backend.Device) -> Tensor:
    """``a`` on ``device``, in the graph (``Tensor.to(device)``)."""
    return ToDevice.apply(a, device)


# the functions registered with export="ops" or "core" (core/autodiff/op_table.py), and two names
# that are no registration of their own: max/min's result type and reshape's alias;
# tests/core/autodiff/test_op_table.py checks this list against the registrations
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
