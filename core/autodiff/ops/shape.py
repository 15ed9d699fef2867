"""Shape ops: reshape/view, transpose, permute, expand, indexing, cat and stack."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import InvalidArgumentError
from ..function import Function, sum_to_shape
from ..graph import Context
from ..op_table import register_op
from ..tensor import Tensor, array_of, wrap
from ._common import as_tensor_like, xp


def _as_view(out: Tensor, base: Tensor) -> Tensor:
    """Mark ``out`` as a view of ``base``: they share storage and the version counter."""
    if (
        xp(base).shares_memory(array_of(out), array_of(base))
        if array_of(out).size and array_of(base).size
        else False
    ):
        base.adopt_view(out)
    return out


class Reshape(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, shape: tuple[int, ...]) -> Any:
        ctx.shape = a.shape
        return array_of(a).reshape(shape)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return reshape(g, ctx.shape)


class Permute(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, dims: tuple[int, ...]) -> Any:
        ctx.inverse = tuple(int(i) for i in np.argsort(dims))
        return array_of(a).transpose(dims)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return permute(g, ctx.inverse)


class Expand(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, shape: tuple[int, ...]) -> Any:
        ctx.shape = a.shape
        return xp(a).broadcast_to(array_of(a), shape)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return sum_to_shape(g, ctx.shape)


class Contiguous(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        return xp(a).ascontiguousarray(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return g


def _index_arrays(index: Any, m: Any) -> Any:
    """``index`` with tensors replaced by arrays (kept a tuple when it was one)."""

    def one(i: Any) -> Any:
        if isinstance(i, Tensor):
            return array_of(i)
        if isinstance(i, list):
            return m.asarray(i)
        return i

    return tuple(one(i) for i in index) if isinstance(index, tuple) else one(index)


def _is_basic(index: Any) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return all(isinstance(p, int | slice | type(None)) or p is Ellipsis for p in parts)


class Index(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, index: Any) -> Any:
        ctx.shape, ctx.index = a.shape, index
        return array_of(a)[index]

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return IndexScatter.apply(g, ctx.shape, ctx.index)


class IndexScatter(Function):
    """Zeros of ``shape`` with ``g`` summed in at ``index``: the backward of indexing."""

    @staticmethod
    def forward(ctx: Context, g: Tensor, shape: tuple[int, ...], index: Any) -> Any:
        ctx.index = index
        m = xp(g)
        out = m.zeros(shape, dtype=g.dtype)
        if _is_basic(index):
            out[index] = array_of(g)
        elif m is np:
            np.add.at(out, index, array_of(g))
        else:  # pragma: no cover - CUDA path
            import cupyx

            cupyx.scatter_add(out, index, array_of(g))
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor]:
        return (getitem(g, ctx.index),)


class IndexPut(Function):
    """``a`` with ``value`` written at ``index`` (the out-of-place form of ``a[index] = v``)."""

    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, a: Tensor, value: Tensor, index: Any) -> Any:
        ctx.index, ctx.value_shape = index, value.shape
        out = array_of(a).copy()
        out[index] = array_of(value)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor, Tensor]:
        return _masked(g, ctx.index), sum_to_shape(getitem(g, ctx.index), ctx.value_shape)


def _masked(g: Tensor, index: Any) -> Tensor:
    mask = xp(g).ones(g.shape, dtype=bool)
    mask[index] = False
    return g * wrap(mask)


class Cat(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, *args: Any) -> Any:
        *tensors, dim = args
        ctx.dim = dim
        ctx.sizes = [t.shape[dim] for t in tensors]
        return xp(tensors[0]).concatenate([array_of(t) for t in tensors], axis=dim)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor, ...]:
        # getitem, not Index.apply: a slice of g is a view, tracked like any other (g may be
        # the caller's seed, and the slices become .grad and the pass's gradients)
        out, start = [], 0
        for size in ctx.sizes:
            index = (slice(None),) * ctx.dim + (slice(start, start + size),)
            out.append(getitem(g, index))
            start += size
        return tuple(out)


# ---------------------------------------------------------------------- functional API
@register_op(methods=("reshape", "view"), export="core")
def reshape(a: Tensor, *shape: Any) -> Tensor:
    """The same elements in ``shape`` (one dim may be -1)."""
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = tuple(shape[0])
    shape = tuple(int(n) for n in shape)
    # a new view even when the shape is unchanged, as in PyTorch (never ``a`` itself)
    a.unshare_()
    return _as_view(Reshape.apply(a, shape), a)


view = reshape


@register_op(methods=("permute",), export="core")
def permute(a: Tensor, *dims: Any) -> Tensor:
    """Dimensions reordered as ``dims``."""
    if len(dims) == 1 and isinstance(dims[0], tuple | list):
        dims = tuple(dims[0])
    dims = tuple(int(d) % max(a.ndim, 1) for d in dims)
    if sorted(dims) != list(range(a.ndim)):
        raise InvalidArgumentError(f"permute dims {dims} are not a permutation of {a.ndim} dims")
    a.unshare_()
    return _as_view(Permute.apply(a, dims), a)


@register_op(methods=("transpose",), export="core")
def transpose(a: Tensor, dim0: int, dim1: int) -> Tensor:
    """Dims ``dim0`` and ``dim1`` swapped."""
    dims = list(range(a.ndim))
    dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
    return permute(a, tuple(dims))


@register_op(methods=("expand",), export="ops")
def expand(a: Tensor, *shape: Any) -> Tensor:
    """A broadcast view of ``a`` with ``shape`` (-1 keeps a dim)."""
    if len(shape) == 1 and isinstance(shape[0], tuple | list):
        shape = tuple(shape[0])
    lead = len(shape) - a.ndim
    shape = tuple(a.shape[i - lead] if n == -1 else int(n) for i, n in enumerate(shape))
    # a read-only broadcast of a's buffer: a view like any other, so that it follows a
    # (copy-on-write keeps a's buffer in place while the view lives)
    a.unshare_()
    return _as_view(Expand.apply(a, shape), a)


@register_op(methods=("unsqueeze",), export="ops")
def unsqueeze(a: Tensor, dim: int) -> Tensor:
    dim = dim % (a.ndim + 1)
    return reshape(a, a.shape[:dim] + (1,) + a.shape[dim:])


@register_op(methods=("squeeze",), export="ops")
def squeeze(a: Tensor, dim: int | None = None) -> Tensor:
    if dim is None:
        return reshape(a, tuple(n for n in a.shape if n != 1))
    dim = dim % max(a.ndim, 1)
    if a.ndim == 0 or a.shape[dim] != 1:
        return reshape(a, a.shape)  # nothing to squeeze: still a new view, as in PyTorch
    return reshape(a, a.shape[:dim] + a.shape[dim + 1 :])


@register_op(methods=("flatten",), export="ops")
def flatten(a: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Dims ``start_dim`` to ``end_dim`` merged into one; ``a`` itself when that is one dim
    already (PyTorch returns the tensor itself there, a new view otherwise)."""
    if a.ndim == 0:
        return reshape(a, (1,))
    start, end = start_dim % a.ndim, end_dim % a.ndim
    if start == end:
        return a
    size = 1
    for n in a.shape[start : end + 1]:
        size *= n
    return reshape(a, a.shape[:start] + (size,) + a.shape[end + 1 :])


@register_op(methods=("contiguous",))
def contiguous(a: Tensor) -> Tensor:
    """``a`` itself when its elements lie in C order, else a C-ordered copy in the graph."""
    if array_of(a).flags.c_contiguous:
        return a
    return Contiguous.apply(a)


@register_op(methods=("__getitem__",), export="ops")
def getitem(a: Tensor, index: Any) -> Tensor:
    """``a[index]`` with NumPy/PyTorch indexing; differentiable (repeated indices sum)."""
    index = _index_arrays(index, xp(a))
    if _is_basic(index):
        parts = index if isinstance(index, tuple) else (index,)
        if Ellipsis not in parts:
            # x[0] of a 1-d array is a NumPy scalar (a copy); x[0, ...] is a 0-d view
            index = (*parts, Ellipsis)
        a.unshare_()
        return _as_view(Index.apply(a, index), a)
    return Index.apply(a, index)


@register_op(export="ops")
def index_put(a: Tensor, index: Any, value: Any) -> Tensor:
    """A copy of ``a`` with ``value`` written at ``index``."""
    index = _index_arrays(index, xp(a))
    value = as_tensor_like(value, a)
    if value.dtype != a.dtype:
        value = value.to(dtype=a.dtype)
    return IndexPut.apply(a, value, index)


@register_op(export="core")
def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The tensors joined along ``dim``."""
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("cat needs at least one tensor")
    dim = dim % max(tensors[0].ndim, 1)
    return Cat.apply(*tensors, dim)


@register_op(export="core")
def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    """The tensors joined along a new dim ``dim``."""
    tensors = list(tensors)
    if not tensors:
        raise InvalidArgumentError("stack needs at least one tensor")
    dim = dim % (tensors[0].ndim + 1)
    return cat([unsqueeze(t, dim) for t in tensors], dim)
