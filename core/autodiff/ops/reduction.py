"""Reductions: sum, mean, max, min, var, each with ``dim`` and ``keepdim`` as in PyTorch."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..function import Function
from ..graph import Context
from ..op_table import register_op
from ..tensor import Tensor, array_of
from ._common import constant, normalize_dims, xp
from .shape import expand, reshape


def _restore_dims(
    g: Tensor, shape: tuple[int, ...], dims: tuple[int, ...] | None, keepdim: bool
) -> Tensor:
    """``g`` with the reduced dims put back as size 1 (so that it broadcasts over ``shape``)."""
    if keepdim or not shape:
        return g
    dims = tuple(range(len(shape))) if dims is None else dims
    kept = [1 if i in dims else n for i, n in enumerate(shape)]
    return reshape(g, tuple(kept))


class Sum(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, dims: tuple[int, ...] | None, keepdim: bool) -> Any:
        ctx.shape, ctx.dims, ctx.keepdim = a.shape, dims, keepdim
        out = array_of(a).sum(axis=dims, keepdims=keepdim)
        return xp(a).asarray(out, dtype=a.dtype) if a.dtype.kind == "f" else xp(a).asarray(out)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return expand(_restore_dims(g, ctx.shape, ctx.dims, ctx.keepdim), ctx.shape)


class Extreme(Function):
    """max/min over all elements (ties share the gradient) or along one dim (argmax wins)."""

    @staticmethod
    def forward(
        ctx: Context, a: Tensor, dim: int | None, keepdim: bool, largest: bool, index: Any = None
    ) -> Any:
        m = xp(a)
        x = array_of(a)
        if x.size == 0:
            raise RuntimeError(f"max()/min() of an empty tensor of shape {a.shape}")
        ctx.shape, ctx.dim, ctx.keepdim = a.shape, dim, keepdim
        if dim is None:
            out = x.max() if largest else x.min()
            ctx.mask = x == out
            ctx.count = int(ctx.mask.sum())
            return m.asarray(out)
        mask = m.zeros(x.shape, dtype=bool)
        m.put_along_axis(mask, index, True, axis=dim)
        ctx.mask, ctx.count = mask, 1
        out = m.take_along_axis(x, index, axis=dim)
        return out if keepdim else out.squeeze(axis=dim)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        dims = None if ctx.dim is None else (ctx.dim,)
        spread = _restore_dims(g, ctx.shape, dims, ctx.keepdim)
        mask = constant(ctx.mask)
        if ctx.count != 1:
            spread = spread / ctx.count
        return spread * mask


class ValuesIndices(NamedTuple):
    """What ``max``/``min`` along a dim return, as in PyTorch."""

    values: Tensor
    indices: Tensor


@register_op(methods=("sum",), export="core")
def sum(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Sum over ``dim`` (all dims when None)."""
    return Sum.apply(a, normalize_dims(dim, a.ndim), keepdim)


@register_op(methods=("mean",), export="core")
def mean(a: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """Mean over ``dim`` (all dims when None)."""
    dims = normalize_dims(dim, a.ndim)
    count = 1
    for d in range(a.ndim) if dims is None else dims:
        count *= a.shape[d]
    return sum(a, dims, keepdim) / count if count else sum(a, dims, keepdim) * float("nan")


def _extreme(a: Tensor, dim: int | None, keepdim: bool, largest: bool) -> Any:
    if dim is None:
        return Extreme.apply(a, None, False, largest)
    (d,) = normalize_dims(dim, a.ndim) or (0,)
    if a.numel() == 0:
        raise RuntimeError(f"max()/min() of an empty tensor of shape {a.shape}")
    # one arg-reduction serves both the values (and their gradient) and the indices
    index = (xp(a).argmax if largest else xp(a).argmin)(array_of(a), axis=d, keepdims=True)
    values = Extreme.apply(a, d, keepdim, largest, index)
    indices = index if keepdim else index.squeeze(axis=d)
    return ValuesIndices(values, constant(indices.astype("int64")))


@register_op(methods=("max",), export="core")
def max(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """Largest element, or ``(values, indices)`` along ``dim``."""
    return _extreme(a, dim, keepdim, True)


@register_op(methods=("min",), export="core")
def min(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Any:
    """Smallest element, or ``(values, indices)`` along ``dim``."""
    return _extreme(a, dim, keepdim, False)


@register_op(methods=("var",), export="core")
def var(
    a: Tensor,
    dim: Any = None,
    *,
    correction: int = 1,
    unbiased: bool | None = None,
    keepdim: bool = False,
) -> Tensor:
    """Variance over ``dim`` with Bessel's ``correction`` (1 by default, as in PyTorch)."""
    if unbiased is not None:
        correction = 1 if unbiased else 0
    dims = normalize_dims(dim, a.ndim)
    count = 1
    for d in range(a.ndim) if dims is None else dims:
        count *= a.shape[d]
    centered = a - mean(a, dims, keepdim=True)
    return sum(centered * centered, dims, keepdim) / (count - correction)


@register_op(methods=("std",), export="ops")
def std(
    a: Tensor,
    dim: Any = None,
    *,
    correction: int = 1,
    unbiased: bool | None = None,
    keepdim: bool = False,
) -> Tensor:
    """Standard deviation: ``var(...).sqrt()``."""
    return var(a, dim, correction=correction, unbiased=unbiased, keepdim=keepdim).sqrt()


@register_op(methods=("argmax",), export="core")
def argmax(a: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Index of the largest element (no gradient)."""
    return constant(xp(a).argmax(array_of(a), axis=dim, keepdims=keepdim).astype("int64"))
