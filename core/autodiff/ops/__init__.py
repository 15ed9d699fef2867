"""Every differentiable op as a function; each is registered once in ``op_table``
(core/autodiff/op_table.py), which gives it its Tensor methods and its place in ``__all__``."""

from __future__ import annotations

from typing import Any

from .. import backend
from ..function import Function
from ..graph import Context
from ..op_table import op_table, register_op
from ..tensor import Tensor, array_of
from . import elementwise, nn, reduction, shape
from .reduction import ValuesIndices
from .shape import view

#: importing each op module registered its ops, with their methods and exports
_OP_MODULES = (elementwise, nn, reduction, shape)


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
# that are no registration of their own: max/min's result type and reshape's alias
globals().update(op_table.exports("ops"))
__all__ = ["ValuesIndices", "view", *sorted(op_table.exports("ops"))]
