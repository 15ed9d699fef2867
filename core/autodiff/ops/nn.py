"""Neural-network functions: matmul, softmax, log_softmax, cross_entropy, mse_loss."""

from __future__ import annotations

from typing import Any

from ...errors import InvalidArgumentError
from ...records.dtypes import is_floating
from .. import backend
from ..function import Function, sum_to_shape
from ..graph import Context
from ..op_table import register_op
from ..tensor import Tensor, array_of
from ._common import constant, xp
from .reduction import mean, sum
from .shape import getitem, reshape, transpose


def _swap(t: Tensor) -> Tensor:
    return transpose(t, -1, -2)


class Matmul(Function):
    """Batched matrix product with NumPy's rules for 1-d operands."""

    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Any:
        ctx.save_for_backward(a, b)
        return backend.matmul(array_of(a), array_of(b))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
        b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
        g2 = g
        if a.ndim == 1:
            g2 = (
                reshape(g2, g2.shape[:-1] + (1,) + g2.shape[-1:])
                if b.ndim > 1
                else reshape(g2, (1,) + g2.shape)
            )
        if b.ndim == 1:
            g2 = reshape(g2, g2.shape + (1,))
        grad_a = grad_b = None
        if need_a:
            grad_a = _reshaped(sum_to_shape(g2 @ _swap(b2), a2.shape), a.shape)
        if need_b:
            grad_b = _reshaped(sum_to_shape(_swap(a2) @ g2, b2.shape), b.shape)
        return grad_a, grad_b


def _reshaped(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    # a gradient keeps its own buffer when no reshape is needed, rather than becoming a view
    return t if t.shape == shape else reshape(t, shape)


class Linear(Function):
    """``x @ weight.T + bias`` in one op, with each gradient computed in its own layout.

    ``grad_weight = g.T @ x`` comes out (out_features, in_features) and contiguous, as
    PyTorch's addmm does, rather than as a transposed view that would need a copy.
    """

    @staticmethod
    def forward(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Any:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        out = backend.matmul(array_of(x), array_of(weight).T)
        if bias is not None:
            out += array_of(bias)
        return out

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_x = g @ weight if needs[0] else None
        grad_weight = grad_bias = None
        # 2-d operands are used as they are: a reshape would make the gradient a view
        flat_g = g if g.ndim == 2 else reshape(g, (-1, g.shape[-1]))
        if needs[1]:
            flat_x = x if x.ndim == 2 else reshape(x, (-1, x.shape[-1]))
            grad_weight = _swap(flat_g) @ flat_x
        if ctx.has_bias and needs[2]:
            grad_bias = sum(flat_g, 0)
        return (grad_x, grad_weight, grad_bias) if ctx.has_bias else (grad_x, grad_weight)


class Softmax(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, dim: int) -> Any:
        ctx.dim = dim
        ctx.save_output()
        m = xp(a)
        shifted = array_of(a) - array_of(a).max(axis=dim, keepdims=True)
        e = m.exp(shifted)
        return e / e.sum(axis=dim, keepdims=True)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return out * (g - sum(g * out, ctx.dim, keepdim=True))


class LogSoftmax(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, dim: int) -> Any:
        ctx.dim = dim
        ctx.save_output()
        m = xp(a)
        shifted = array_of(a) - array_of(a).max(axis=dim, keepdims=True)
        return shifted - m.log(m.exp(shifted).sum(axis=dim, keepdims=True))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return g - out.exp() * sum(g, ctx.dim, keepdim=True)


@register_op(methods=("matmul", "__matmul__"), reflected=("__rmatmul__",), export="core")
def matmul(a: Tensor, other: Tensor) -> Tensor:
    """Matrix product, batched over leading dims."""
    if a.ndim == 0 or other.ndim == 0:
        raise InvalidArgumentError(
            "matmul needs tensors of at least one dimension; use * for scalars"
        )
    return Matmul.apply(a, other)


@register_op(export="core")
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias`` (PyTorch's ``F.linear``)."""
    if input.ndim == 0 or weight.ndim != 2:
        raise InvalidArgumentError(
            f"linear needs an input of at least 1 dim and a 2-d weight; got {input.shape} and "
            f"{weight.shape}"
        )
    if input.shape[-1] != weight.shape[1]:
        raise InvalidArgumentError(
            f"linear: input has {input.shape[-1]} features; weight expects {weight.shape[1]}"
        )
    if bias is None:
        return Linear.apply(input, weight)
    return Linear.apply(input, weight, bias)


@register_op(methods=("softmax",), export="core")
def softmax(a: Tensor, dim: int) -> Tensor:
    """exp(a) normalised along ``dim``."""
    return Softmax.apply(a, dim % max(a.ndim, 1))


@register_op(methods=("log_softmax",), export="core")
def log_softmax(a: Tensor, dim: int) -> Tensor:
    """log(softmax(a, dim)), computed stably."""
    return LogSoftmax.apply(a, dim % max(a.ndim, 1))


def _reduce(loss: Tensor, reduction: str, count: Any = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return sum(loss)
    if reduction == "mean":
        if count == 0:  # every target ignored: the loss is NaN, the gradient zero (PyTorch)
            return sum(loss) * 0 + float("nan")
        return mean(loss) if count is None else sum(loss) / count
    raise InvalidArgumentError(f"reduction must be 'mean', 'sum' or 'none'; got {reduction!r}")


@register_op(export="core")
def cross_entropy(
    input: Tensor,
    target: Tensor,
    *,
    reduction: str = "mean",
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross-entropy of logits ``input`` (N, C) or (C,) against class indices or probabilities.

    As in PyTorch: class-index targets skip ``ignore_index`` and the mean divides by the
    number of targets kept; probability targets have ``input``'s shape.
    """
    logp = log_softmax(input, 1 if input.ndim > 1 else 0)
    if is_floating(target.dtype):
        if target.shape != input.shape:
            raise InvalidArgumentError(
                f"probability targets must have the input's shape {input.shape}; got {target.shape}"
            )
        class_dim = 1 if input.ndim > 1 else 0
        classes = input.shape[class_dim]
        if label_smoothing:
            target = target * (1 - label_smoothing) + label_smoothing / classes
        return _reduce(-sum(logp * target, class_dim), reduction)
    if input.ndim == 1:
        logp = reshape(logp, (1,) + logp.shape)
        target = reshape(target, (1,))
    elif input.ndim > 2:  # (N, C, d1, ...) -> (N * d1 * ..., C)
        moved = logp
        for d in range(1, input.ndim - 1):
            moved = transpose(moved, d, d + 1)
        logp = reshape(moved, (-1, input.shape[1]))
        target = reshape(target, (-1,))
    m = xp(logp)
    labels = array_of(target)
    keep = labels != ignore_index
    classes = logp.shape[1]
    if bool(((labels < 0) & keep).any()) or bool((labels >= classes).any()):
        raise IndexError(f"target holds a class index outside [0, {classes})")
    safe = m.where(keep, labels, 0)
    rows = m.arange(logp.shape[0])
    picked = getitem(logp, (rows, safe))
    nll = -picked
    if label_smoothing:
        nll = nll * (1 - label_smoothing) - sum(logp, 1) * (label_smoothing / classes)
    nll = nll * constant(keep.astype(logp.dtype))
    if input.ndim == 1 and reduction == "none":
        return reshape(nll, ())
    if input.ndim > 2 and reduction == "none":
        return reshape(nll, (input.shape[0],) + input.shape[2:])
    return _reduce(nll, reduction, int(keep.sum()))


@register_op(export="core")
def mse_loss(input: Tensor, target: Tensor, *, reduction: str = "mean") -> Tensor:
    """Mean squared error."""
    diff = input - target
    return _reduce(diff * diff, reduction)
