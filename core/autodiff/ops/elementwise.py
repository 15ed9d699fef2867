"""Elementwise ops: arithmetic, comparisons and activations, each with its backward rule."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...errors import InvalidArgumentError, InvalidArgumentTypeError
from ...records.dtypes import bfloat16, is_floating
from ..function import Function
from ..graph import Context
from ..op_table import register_op
from ..tensor import DEFAULT_FLOAT, Tensor, array_of
from ._common import as_tensor_like, constant, xp


class Add(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Any:
        return array_of(a) + array_of(b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor, Tensor]:
        return g, g


class Sub(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Any:
        return array_of(a) - array_of(b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor, Tensor]:
        return g, -g


def _needs(ctx: Context) -> tuple[bool, ...]:
    return ctx.needs_input_grad if ctx.needs_input_grad else (False, False)


class Mul(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Any:
        need_a, need_b = _needs(ctx)
        # keep only what the backward reads, so changing the other operand is allowed
        ctx.save_for_backward(a if need_b else None, b if need_a else None)
        return array_of(a) * array_of(b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        return (g * b if need_a else None), (g * a if need_b else None)


class Div(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Any:
        need_a, need_b = _needs(ctx)
        ctx.save_for_backward(a if need_b else None, b)
        return array_of(a) / array_of(b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        return (g / b if need_a else None), (-g * a / (b * b) if need_b else None)


class Neg(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        return -array_of(a)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        return -g


class Pow(Function):
    """``a ** b`` for two tensors."""

    @staticmethod
    def forward(ctx: Context, a: Tensor, b: Tensor) -> Any:
        ctx.save_for_backward(a, b)
        ctx.save_output()
        return array_of(a) ** array_of(b)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[Tensor | None, Tensor | None]:
        a, b, out = ctx.saved_tensors
        need_a, need_b = ctx.needs_input_grad
        grad_a = None
        if need_a:  # b * a**(b-1), taken as 0 where b == 0 (PyTorch's rule, also at a == 0)
            grad_a = where(b == 0, as_tensor_like(0, g), g * b * a ** (b - 1))
        grad_b = None
        if need_b:  # d/db a**b = a**b log a; PyTorch takes 0 where a == 0 and b >= 0
            safe = where(a == 0, as_tensor_like(1, a), a)
            grad_b = where((a == 0) & (b >= 0), as_tensor_like(0, g), g * out * safe.log())
        return grad_a, grad_b


class PowScalar(Function):
    """``a ** exponent`` for a Python number."""

    @staticmethod
    def forward(ctx: Context, a: Tensor, exponent: float) -> Any:
        ctx.save_for_backward(a)
        ctx.exponent = exponent
        return array_of(a) ** exponent

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (a,) = ctx.saved_tensors
        e = ctx.exponent
        if e == 0:
            return g * 0
        return g * e * (a ** (e - 1) if e != 1 else 1)


class Exp(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_output()
        return xp(a).exp(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return g * out


class Log(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_for_backward(a)
        return xp(a).log(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (a,) = ctx.saved_tensors
        return g / a


class Sqrt(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_output()
        return xp(a).sqrt(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return g / (out * 2)


class Abs(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_for_backward(a)
        return xp(a).abs(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (a,) = ctx.saved_tensors
        return g * constant(xp(a).sign(array_of(a)))


class Tanh(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_output()
        return xp(a).tanh(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return g * (1 - out * out)


class Sigmoid(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_output()
        m = xp(a)
        x = array_of(a)
        # split by sign so that exp never overflows
        e = m.exp(-m.abs(x))
        return m.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return g * out * (1 - out)


class Relu(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_output()
        return xp(a).maximum(array_of(a), 0)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (out,) = ctx.saved_tensors
        return g * constant(array_of(out) > 0)


def _erf_array(x: Any) -> Any:
    m = np if isinstance(x, np.ndarray | np.generic) else None
    if m is None:
        from cupyx.scipy.special import erf  # only on the CUDA path

        return erf(x)
    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x.copy()


class Erf(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_for_backward(a)
        return _erf_array(array_of(a))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (a,) = ctx.saved_tensors
        return g * (2 / math.sqrt(math.pi)) * (-(a * a)).exp()


class Gelu(Function):
    """GELU with the exact erf form (PyTorch's ``approximate='none'``)."""

    @staticmethod
    def forward(ctx: Context, a: Tensor) -> Any:
        ctx.save_for_backward(a)
        x = array_of(a)
        return (x * 0.5 * (1 + _erf_array(x / math.sqrt(2)))).astype(x.dtype, copy=False)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (a,) = ctx.saved_tensors
        cdf = 0.5 * (1 + erf(a * (1 / math.sqrt(2))))
        pdf = (-(a * a) * 0.5).exp() * (1 / math.sqrt(2 * math.pi))
        return g * (cdf + a * pdf)


class Clamp(Function):
    @staticmethod
    def forward(ctx: Context, a: Tensor, low: Any, high: Any) -> Any:
        ctx.save_for_backward(a)
        ctx.low, ctx.high = low, high
        return xp(a).clip(array_of(a), low, high).astype(a.dtype, copy=False)

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> Tensor:
        (a,) = ctx.saved_tensors
        x = array_of(a)
        mask = xp(a).ones(x.shape, dtype=bool)
        if ctx.low is not None:
            mask &= x >= ctx.low
        if ctx.high is not None:
            mask &= x <= ctx.high
        return g * constant(mask)


class Where(Function):
    computes = False  # moves data: bf16 bits pass unchanged

    @staticmethod
    def forward(ctx: Context, cond: Tensor, a: Tensor, b: Tensor) -> Any:
        ctx.cond = cond
        return xp(a).where(array_of(cond), array_of(a), array_of(b))

    @staticmethod
    def backward(ctx: Context, g: Tensor) -> tuple[None, Tensor, Tensor]:
        zero = as_tensor_like(0, g)
        return None, where(ctx.cond, g, zero), where(ctx.cond, zero, g)


# ---------------------------------------------------------------------- functional API
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _category(dtype: np.dtype) -> int:
    return 2 if is_floating(dtype) else _CATEGORY.get(dtype.kind, -1)  # bfloat16 is kind "V"


_FLOAT16 = np.dtype(np.float16)
_FLOAT32 = np.dtype(np.float32)


def promote_types(a: np.dtype, b: np.dtype) -> np.dtype:
    """PyTorch's ``torch.promote_types``: the smallest dtype both operands fit in.

    NumPy's table except that an integer or bool meeting a float gives that float
    (``int64`` with ``float32`` is float32, ``int32`` with ``float16`` is float16).
    """
    if a == b:
        return a
    if _category(a) == 2 and b.kind in "biu":
        return a
    if _category(b) == 2 and a.kind in "biu":
        return b
    if {a, b} == {bfloat16, _FLOAT16}:
        # neither holds the other; said here because ml_dtypes before 0.7 has no such rule
        return _FLOAT32
    return np.promote_types(a, b)


def result_type(a: Tensor, b: Tensor) -> np.dtype:
    """PyTorch's ``torch.result_type`` for two operands (the one promotion rule of the ops).

    Operands of the same kind (both 0-d or both with dims) promote with ``promote_types``;
    a 0-d operand decides only when its category (bool < int < float) is higher, so
    ``float16 * tensor(2.0, dtype=float64)`` stays float16. A Python number arrives here as
    a 0-d tensor already in the dtype PyTorch gives it (``as_tensor_like``).
    """
    if a.dtype == b.dtype:
        return a.dtype
    if (a.ndim == 0) != (b.ndim == 0):
        sized, zero = (b, a) if a.ndim == 0 else (a, b)
        if _category(sized.dtype) >= _category(zero.dtype):
            return sized.dtype
        return promote_types(sized.dtype, zero.dtype)
    return promote_types(a.dtype, b.dtype)


def _promoted(a: Tensor, b: Tensor, target: np.dtype) -> tuple[Tensor, Tensor]:
    """Both operands cast to ``target`` (each cast is in the graph, so gradients come back
    in each input's own dtype)."""
    if a.dtype != target:
        a = a.to(dtype=target)
    if b.dtype != target:
        b = b.to(dtype=target)
    return a, b


def _binary(fn: type[Function], a: Any, b: Any, *, true_division: bool = False) -> Tensor:
    if not isinstance(a, Tensor):
        a = as_tensor_like(a, b)
    elif not isinstance(b, Tensor):
        b = as_tensor_like(b, a)
    target = result_type(a, b)
    if true_division and not is_floating(target):
        target = DEFAULT_FLOAT  # int / int is a float32 tensor, as in PyTorch
    return fn.apply(*_promoted(a, b, target))


@register_op(methods=("add", "__add__"), reflected=("__radd__",), export="ops")
def add(a: Any, other: Any) -> Tensor:
    return _binary(Add, a, other)


@register_op(methods=("sub", "__sub__"), reflected=("__rsub__",), export="ops")
def sub(a: Any, other: Any) -> Tensor:
    return _binary(Sub, a, other)


@register_op(methods=("mul", "__mul__"), reflected=("__rmul__",), export="ops")
def mul(a: Any, other: Any) -> Tensor:
    return _binary(Mul, a, other)


@register_op(methods=("div", "__truediv__"), reflected=("__rtruediv__",), export="ops")
def div(a: Any, other: Any) -> Tensor:
    return _binary(Div, a, other, true_division=True)


@register_op(methods=("neg", "__neg__"), export="ops")
def neg(a: Tensor) -> Tensor:
    return Neg.apply(a)


@register_op(methods=("pow", "__pow__"), reflected=("__rpow__",), export="core")
def pow(a: Any, exponent: Any) -> Tensor:  # PyTorch's name
    """``a ** exponent``; a Python-number exponent keeps the graph small."""
    if (
        isinstance(a, Tensor)
        and isinstance(exponent, int | float)
        and not isinstance(exponent, bool)
    ):
        if isinstance(exponent, float) and not is_floating(a.dtype):
            a = a.to(dtype=DEFAULT_FLOAT)  # int ** 0.5 is float32, as in PyTorch
        return PowScalar.apply(a, exponent)
    return _binary(Pow, a, exponent)


@register_op(methods=("exp",), export="core")
def exp(a: Tensor) -> Tensor:
    return Exp.apply(a)


@register_op(methods=("log",), export="core")
def log(a: Tensor) -> Tensor:
    return Log.apply(a)


@register_op(methods=("sqrt",), export="core")
def sqrt(a: Tensor) -> Tensor:
    return Sqrt.apply(a)


@register_op(methods=("abs",), export="core")
def abs(a: Tensor) -> Tensor:  # PyTorch's name
    return Abs.apply(a)


@register_op(methods=("tanh",), export="core")
def tanh(a: Tensor) -> Tensor:
    return Tanh.apply(a)


@register_op(methods=("sigmoid",), export="core")
def sigmoid(a: Tensor) -> Tensor:
    return Sigmoid.apply(a)


@register_op(methods=("relu",), export="core")
def relu(a: Tensor) -> Tensor:
    return Relu.apply(a)


@register_op(methods=("erf",), export="ops")
def erf(a: Tensor) -> Tensor:
    return Erf.apply(a)


@register_op(export="core")
def gelu(a: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate='tanh'`` uses the tanh formula, as in PyTorch."""
    if approximate == "none":
        return Gelu.apply(a)
    if approximate == "tanh":
        c = math.sqrt(2 / math.pi)
        return a * 0.5 * (1 + tanh((a + a * a * a * 0.044715) * c))
    raise InvalidArgumentError(f"approximate must be 'none' or 'tanh'; got {approximate!r}")


@register_op(methods=("clamp", "clip"), export="core")
def clamp(a: Tensor, min: Any = None, max: Any = None) -> Tensor:
    """Values limited to [min, max]; the gradient passes where min <= a <= max."""
    if min is None and max is None:
        raise InvalidArgumentError("clamp needs at least one of min and max")
    if isinstance(min, Tensor) or isinstance(max, Tensor):
        out = a
        if min is not None:
            out = where(out < min, as_tensor_like(min, a), out)
        if max is not None:
            out = where(out > max, as_tensor_like(max, a), out)
        return out
    return Clamp.apply(a, min, max)


@register_op(export="core")
def where(condition: Any, a: Any, b: Any) -> Tensor:
    """Elements of ``a`` where ``condition`` holds, else of ``b``."""
    like = a if isinstance(a, Tensor) else b if isinstance(b, Tensor) else condition
    if not isinstance(like, Tensor):
        raise InvalidArgumentTypeError("where needs at least one tensor argument")
    cond = condition if isinstance(condition, Tensor) else as_tensor_like(condition, like)
    if cond.dtype != np.dtype(bool):
        cond = constant(array_of(cond).astype(bool))
    a = as_tensor_like(a, like)
    b = as_tensor_like(b, like)
    return Where.apply(cond, *_promoted(a, b, result_type(a, b)))


def _compare(ufunc: str, a: Tensor, b: Any) -> Tensor:
    b = as_tensor_like(b, a)
    return constant(getattr(xp(a), ufunc)(array_of(a), array_of(b)))


@register_op(methods=("__lt__",))
def less(a: Tensor, b: Any) -> Tensor:
    return _compare("less", a, b)


@register_op(methods=("__le__",))
def less_equal(a: Tensor, b: Any) -> Tensor:
    return _compare("less_equal", a, b)


@register_op(methods=("__gt__",))
def greater(a: Tensor, b: Any) -> Tensor:
    return _compare("greater", a, b)


@register_op(methods=("__ge__",))
def greater_equal(a: Tensor, b: Any) -> Tensor:
    return _compare("greater_equal", a, b)


@register_op(methods=("__eq__",))
def equal(a: Tensor, b: Any) -> Tensor:
    return _compare("equal", a, b)


@register_op(methods=("__ne__",))
def not_equal(a: Tensor, b: Any) -> Tensor:
    return _compare("not_equal", a, b)


@register_op(methods=("__invert__",))
def logical_not(a: Tensor) -> Tensor:
    return constant(xp(a).logical_not(array_of(a)))


@register_op(methods=("__and__",), export="ops")
def logical_and(a: Tensor, b: Any) -> Tensor:
    return _compare("logical_and", a, b)


@register_op(methods=("__or__",), export="ops")
def logical_or(a: Tensor, b: Any) -> Tensor:
    return _compare("logical_or", a, b)
