"""Every op's backward against finite differences (``gradcheck``), first and second order.

Shapes come from hypothesis (at most 3 dims of at most 4, with broadcasting between
operands and size-1 dims); values come from a NumPy generator seeded by hypothesis and are
kept away from the points where an op is not differentiable (kinks, ties, bounds, zero for
log/sqrt/division). ``test_gpu.py`` runs the same cases on ``cuda:0`` through ``check_case``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gradvault.core as gv
from gradvault.core import autograd
from gradvault.core.autodiff.autograd.function import Function
from gradvault.core.autodiff.tensor import array_of

MAX_DIMS = 3
MAX_SIDE = 4

Draw = Callable[[st.SearchStrategy[Any]], Any]
Build = Callable[[Draw, np.random.Generator, str], tuple[Callable[..., Any], list[np.ndarray]]]


@dataclass(frozen=True)
class OpCase:
    """One op under test: ``build`` draws shapes and values and returns ``(fn, arrays)``."""

    name: str
    build: Build


CASES: dict[str, OpCase] = {}


def case(name: str) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        assert name not in CASES, name
        CASES[name] = OpCase(name, build)
        return build

    return register


# ---------------------------------------------------------------------- shapes and values
def shapes(min_dims: int = 0, max_dims: int = MAX_DIMS) -> st.SearchStrategy[tuple[int, ...]]:
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=MAX_SIDE)


def broadcast_shapes(draw: Draw, count: int, min_dims: int = 0) -> tuple[tuple[int, ...], ...]:
    """``count`` shapes that broadcast together (size-1 and missing leading dims included)."""
    drawn = draw(
        hnp.mutually_broadcastable_shapes(
            num_shapes=count,
            min_dims=min_dims,
            max_dims=MAX_DIMS,
            min_side=1,
            max_side=MAX_SIDE,
        )
    )
    return tuple(drawn.input_shapes)


def uniform(
    rng: np.random.Generator, shape: tuple[int, ...], low: float = -2.0, high: float = 2.0
) -> np.ndarray:
    return rng.uniform(low, high, shape)


def away_from(
    rng: np.random.Generator,
    shape: tuple[int, ...],
    points: tuple[float, ...],
    margin: float = 0.15,
    low: float = -2.0,
    high: float = 2.0,
) -> np.ndarray:
    """Uniform values at least ``margin`` from every point in ``points``."""
    values = rng.uniform(low, high, shape)
    for _ in range(1000):
        bad = np.zeros(values.shape, dtype=bool)
        for p in points:
            bad |= np.abs(values - p) < margin
        if not bad.any():
            return values
        values[bad] = rng.uniform(low, high, int(bad.sum()))
    raise AssertionError("could not draw values away from the given points")


def nonzero(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return away_from(rng, shape, (0.0,), margin=0.3)


def positive(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.uniform(0.3, 2.0, shape)


def distinct(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Values at least 0.3 apart from each other (no ties for max/min)."""
    count = int(np.prod(shape, dtype=np.int64))
    values = (rng.permutation(count) - count / 2) * 0.5 + rng.uniform(-0.1, 0.1, count)
    return values.reshape(shape)


def const(array: Any, device: str, dtype: Any = None) -> gv.Tensor:
    return gv.tensor(np.asarray(array), dtype=dtype, device=device)


# ---------------------------------------------------------------------- elementwise
BINARY: dict[str, tuple[Callable[..., Any], Any, Any]] = {
    "add": (lambda a, b: a + b, uniform, uniform),
    "sub": (lambda a, b: a - b, uniform, uniform),
    "mul": (lambda a, b: a * b, uniform, uniform),
    "div": (lambda a, b: a / b, uniform, nonzero),
    "pow": (lambda a, b: a**b, positive, uniform),
    "gv.pow": (lambda a, b: gv.pow(a, b), positive, uniform),
    "method add/sub/mul/div": (
        lambda a, b: a.add(b).mul(b).sub(a).div(b * b + 1),
        uniform,
        uniform,
    ),
}


def _binary_case(name: str, fn: Callable[..., Any], left: Any, right: Any) -> None:
    @case(name)
    def build(draw: Draw, rng: np.random.Generator, device: str) -> Any:
        shape_a, shape_b = broadcast_shapes(draw, 2)
        return fn, [left(rng, shape_a), right(rng, shape_b)]


for _name, (_fn, _left, _right) in BINARY.items():
    _binary_case(_name, _fn, _left, _right)

UNARY: dict[str, tuple[Callable[..., Any], Any]] = {
    "neg": (lambda a: -a, uniform),
    "radd": (lambda a: 1.5 + a, uniform),
    "rsub": (lambda a: 1.5 - a, uniform),
    "rmul": (lambda a: 2.5 * a, uniform),
    "rdiv": (lambda a: 2.0 / a, nonzero),
    "sub scalar": (lambda a: a - 0.5, uniform),
    "div scalar": (lambda a: a / 3.0, uniform),
    "pow int": (lambda a: a**3, uniform),
    "pow square": (lambda a: a**2, uniform),
    "pow one": (lambda a: a**1, uniform),
    "pow zero": (lambda a: a**0 + a, uniform),
    "pow fractional": (lambda a: a**2.5, positive),
    "pow negative": (lambda a: a**-1.5, positive),
    "rpow": (lambda a: 2.0**a, uniform),
    "square": (lambda a: a.square(), uniform),
    "exp": (lambda a: a.exp(), uniform),
    "gv.exp": (lambda a: gv.exp(a), uniform),
    "log": (lambda a: a.log(), positive),
    "gv.log": (lambda a: gv.log(a), positive),
    "sqrt": (lambda a: a.sqrt(), positive),
    "gv.sqrt": (lambda a: gv.sqrt(a), positive),
    "abs": (lambda a: a.abs(), nonzero),
    "gv.abs": (lambda a: gv.abs(a), nonzero),
    "tanh": (lambda a: a.tanh(), uniform),
    "gv.tanh": (lambda a: gv.tanh(a), uniform),
    "sigmoid": (lambda a: a.sigmoid(), lambda rng, s: uniform(rng, s, -5.0, 5.0)),
    "gv.sigmoid": (lambda a: gv.sigmoid(a), uniform),
    "relu": (lambda a: a.relu(), nonzero),
    "gv.relu": (lambda a: gv.relu(a), nonzero),
    "gelu": (lambda a: gv.gelu(a), lambda rng, s: uniform(rng, s, -3.0, 3.0)),
    "gelu tanh": (
        lambda a: gv.gelu(a, approximate="tanh"),
        lambda rng, s: uniform(rng, s, -3.0, 3.0),
    ),
    "erf": (lambda a: a.erf(), uniform),
    "clamp": (lambda a: a.clamp(-0.5, 0.75), lambda rng, s: away_from(rng, s, (-0.5, 0.75))),
    "gv.clamp min only": (
        lambda a: gv.clamp(a, min=-0.5),
        lambda rng, s: away_from(rng, s, (-0.5,)),
    ),
    "clamp max only": (lambda a: a.clamp(max=0.25), lambda rng, s: away_from(rng, s, (0.25,))),
    "clone": (lambda a: a.clone() * a, uniform),
}


def _unary_case(name: str, fn: Callable[..., Any], values: Any) -> None:
    @case(name)
    def build(draw: Draw, rng: np.random.Generator, device: str) -> Any:
        return fn, [values(rng, draw(shapes()))]


for _name, (_fn, _values) in UNARY.items():
    _unary_case(_name, _fn, _values)


@case("clamp with tensor bounds")
def _clamp_tensor_bounds(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape_x, shape_lo, shape_hi = broadcast_shapes(draw, 3)
    x = uniform(rng, shape_x)
    full = np.broadcast_shapes(shape_x, shape_lo, shape_hi)
    # bounds at least 0.2 from every x they meet; low below high
    lo = np.full(shape_lo, -0.3) + rng.uniform(-0.05, 0.05, shape_lo)
    hi = np.full(shape_hi, 0.6) + rng.uniform(-0.05, 0.05, shape_hi)
    x = away_from(rng, shape_x, (-0.3, 0.6), margin=0.3)
    assert np.broadcast_shapes(x.shape, lo.shape, hi.shape) == full
    return (lambda a, low, high: gv.clamp(a, min=low, max=high)), [x, lo, hi]


@case("where")
def _where(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape_c, shape_a, shape_b = broadcast_shapes(draw, 3)
    cond = const(rng.random(shape_c) < 0.5, device)
    return (lambda a, b: gv.where(cond, a, b)), [uniform(rng, shape_a), uniform(rng, shape_b)]


@case("where from comparison")
def _where_comparison(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape_a, shape_b = broadcast_shapes(draw, 2)
    # one pool of well-separated values: a > b is never a near-tie
    pool = distinct(rng, (int(np.prod(shape_a)) + int(np.prod(shape_b)),)) / 4
    a = pool[: int(np.prod(shape_a))].reshape(shape_a)
    b = pool[int(np.prod(shape_a)) :].reshape(shape_b)
    return (lambda x, y: gv.where(x > y, x * y, y.exp())), [a, b]


@case("where with a scalar branch")
def _where_scalar(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    cond = const(rng.random(shape) < 0.5, device)
    return (lambda a: gv.where(cond, a, 0.5) * a), [uniform(rng, shape)]


# ---------------------------------------------------------------------- reductions
def _dims(draw: Draw, ndim: int) -> Any:
    """None, one dim (possibly negative) or a tuple of distinct dims."""
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none" or ndim == 0:
        return None
    if kind == "int":
        return draw(st.integers(-ndim, ndim - 1))
    return tuple(draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)))


def _count(shape: tuple[int, ...], dims: Any) -> int:
    if dims is None:
        return int(np.prod(shape, dtype=np.int64))
    dims = (dims,) if isinstance(dims, int) else dims
    return int(np.prod([shape[d] for d in dims], dtype=np.int64))


for _reduction in ("sum", "mean"):

    def _sum_like(reduction: str) -> None:
        @case(reduction)
        def build(draw: Draw, rng: np.random.Generator, device: str) -> Any:
            shape = draw(shapes())
            dims = _dims(draw, len(shape))
            keepdim = draw(st.booleans())
            if dims is None and not keepdim:
                return (lambda a: getattr(a, reduction)()), [uniform(rng, shape)]
            return (lambda a: getattr(a, reduction)(dims, keepdim=keepdim)), [uniform(rng, shape)]

        @case(f"gv.{reduction}")
        def build_function(draw: Draw, rng: np.random.Generator, device: str) -> Any:
            shape = draw(shapes(min_dims=1))
            dim = draw(st.integers(-len(shape), len(shape) - 1))
            return (lambda a: getattr(gv, reduction)(a, dim)), [uniform(rng, shape)]

    _sum_like(_reduction)


def _var_like(name: str, method: str) -> None:
    @case(name)
    def build(draw: Draw, rng: np.random.Generator, device: str) -> Any:
        shape = draw(shapes(min_dims=1))
        dims = _dims(draw, len(shape))
        count = _count(shape, dims)
        # at least two elements per variance keeps var > 0 (std differentiable) and
        # count - correction > 0
        if count < 2:
            shape = (2, *shape)
            dims = None if dims is None else ((dims,) if isinstance(dims, int) else dims)
            dims = None if dims is None else tuple(d % (len(shape) - 1) + 1 for d in dims) + (0,)
        correction = draw(st.sampled_from([0, 1]))
        keepdim = draw(st.booleans())
        return (lambda a: getattr(a, method)(dims, correction=correction, keepdim=keepdim)), [
            distinct(rng, shape)
        ]


_var_like("var", "var")
_var_like("std", "std")


@case("gv.var default")
def _var_default(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    shape = (shape[0] + 1, *shape[1:]) if shape[0] == 1 else shape
    return (lambda a: gv.var(a, 0)), [uniform(rng, shape)]


for _largest in (True, False):

    def _extreme(largest: bool) -> None:
        name = "max" if largest else "min"

        @case(f"{name} of all elements")
        def build_all(draw: Draw, rng: np.random.Generator, device: str) -> Any:
            shape = draw(shapes())
            return (lambda a: getattr(gv, name)(a)), [distinct(rng, shape)]

        @case(f"{name} along a dim")
        def build_dim(draw: Draw, rng: np.random.Generator, device: str) -> Any:
            shape = draw(shapes(min_dims=1))
            dim = draw(st.integers(-len(shape), len(shape) - 1))
            keepdim = draw(st.booleans())
            return (lambda a: getattr(a, name)(dim, keepdim=keepdim)[0]), [distinct(rng, shape)]

    _extreme(_largest)


# ---------------------------------------------------------------------- shape ops
@case("reshape")
def _reshape(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    target = draw(st.sampled_from(["flat", "reversed", "leading one", "minus one"]))
    size = int(np.prod(shape, dtype=np.int64))
    new = {
        "flat": (size,),
        "reversed": tuple(reversed(shape)),
        "leading one": (1, *shape),
        "minus one": (-1, shape[-1]) if shape else (-1,),
    }[target]
    return (lambda a: a.reshape(new) * a.reshape(new)), [uniform(rng, shape)]


@case("gv.reshape and view")
def _view(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    return (lambda a: gv.reshape(a, (-1,)).view(*reversed(shape)).exp()), [uniform(rng, shape)]


@case("transpose")
def _transpose(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    d0 = draw(st.integers(-len(shape), len(shape) - 1))
    d1 = draw(st.integers(-len(shape), len(shape) - 1))
    return (lambda a: gv.transpose(a, d0, d1) * a.transpose(d0, d1).tanh()), [uniform(rng, shape)]


@case("permute")
def _permute(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    order = tuple(draw(st.permutations(range(len(shape)))))
    return (lambda a: a.permute(*order) * gv.permute(a, order) ** 2), [uniform(rng, shape)]


@case("T and mT")
def _t(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=2))
    return (lambda a: (a.T.exp() + a.mT.mT.T) * a.mT.T.T.sum()), [uniform(rng, shape)]


@case("unsqueeze squeeze flatten")
def _unsqueeze(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    dim = draw(st.integers(-len(shape) - 1, len(shape)))
    return (lambda a: a.unsqueeze(dim).squeeze(dim).unsqueeze(0).flatten().square()), [
        uniform(rng, shape)
    ]


@case("squeeze all")
def _squeeze(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    return (lambda a: a.squeeze() * 3), [uniform(rng, shape)]


@case("expand")
def _expand(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    target = draw(shapes(min_dims=1))
    drop = draw(st.integers(0, len(target)))
    shape = tuple(1 if draw(st.booleans()) else n for n in target[drop:])
    return (
        lambda a: (
            a.expand(*target)
            * gv.arange(int(np.prod(target)), dtype=gv.float64, device=device).reshape(target)
        )
    ), [uniform(rng, shape)]


@case("expand_as with -1")
def _expand_minus_one(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    n = draw(st.integers(1, MAX_SIDE))
    m = draw(st.integers(1, MAX_SIDE))
    return (lambda a: a.expand(m, -1).exp()), [uniform(rng, (1, n))]


def _basic_index(draw: Draw, shape: tuple[int, ...]) -> tuple[Any, ...]:
    parts: list[Any] = []
    for n in shape:
        kind = draw(st.sampled_from(["int", "slice", "full", "none"]))
        if kind == "int":
            parts.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.integers(0, n - 1))
            stop = draw(st.integers(start + 1, n))
            step = draw(st.integers(1, 2))
            parts.append(slice(start, stop, step))
        elif kind == "none":
            parts.extend([None, slice(None)])
        else:
            parts.append(slice(None))
    if parts and draw(st.booleans()):
        parts = [Ellipsis, *parts[1:]] if parts[0] == slice(None) else parts
    return tuple(parts)


@case("basic indexing")
def _basic(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    index = _basic_index(draw, shape)
    return (lambda a: a[index] * 2 + a[index] ** 2), [uniform(rng, shape)]


@case("integer array indexing with repeats")
def _advanced(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    picks = draw(st.lists(st.integers(-shape[0], shape[0] - 1), min_size=1, max_size=6))
    index = const(np.array(picks, dtype=np.int64), device)
    return (lambda a: a[index] * a[index]), [uniform(rng, shape)]


@case("list and mixed indexing")
def _mixed(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=2))
    rows = draw(st.lists(st.integers(0, shape[0] - 1), min_size=1, max_size=5))
    cols = draw(st.lists(st.integers(0, shape[1] - 1), min_size=len(rows), max_size=len(rows)))
    return (lambda a: a[rows, cols].exp() + a[rows][:, 0:1].sum()), [uniform(rng, shape)]


@case("boolean mask indexing")
def _mask(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    mask = rng.random(shape) < 0.6
    mask.reshape(-1)[0] = True
    mask_t = const(mask, device)
    return (lambda a: a[mask_t].tanh()), [uniform(rng, shape)]


@case("cat")
def _cat(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    dim = draw(st.integers(-len(shape), len(shape) - 1))
    sizes = draw(st.lists(st.integers(1, MAX_SIDE), min_size=1, max_size=3))
    arrays = []
    for size in sizes:
        part = list(shape)
        part[dim] = size
        arrays.append(uniform(rng, tuple(part)))
    return (lambda *ts: gv.cat([t * t for t in ts], dim)), arrays


@case("stack")
def _stack(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    dim = draw(st.integers(-len(shape) - 1, len(shape)))
    count = draw(st.integers(1, 3))
    return (lambda *ts: gv.stack([t.exp() for t in ts], dim)), [
        uniform(rng, shape) for _ in range(count)
    ]


@case("index assignment")
def _setitem(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes(min_dims=1))
    index = _basic_index(draw, shape)
    target_shape = np.zeros(shape)[index].shape
    value_shape = tuple(1 if draw(st.booleans()) else n for n in target_shape)

    def fn(a: gv.Tensor, v: gv.Tensor) -> gv.Tensor:
        out = a * 1
        out[index] = v * v
        return out * a

    return fn, [uniform(rng, shape), uniform(rng, value_shape)]


@case("in-place arithmetic")
def _inplace(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape_a, shape_b = broadcast_shapes(draw, 2)
    full = np.broadcast_shapes(shape_a, shape_b)
    shape_a = full  # in-place results keep the left operand's shape

    def fn(a: gv.Tensor, b: gv.Tensor) -> gv.Tensor:
        out = a.clone()
        out.mul_(b)
        out.add_(a)
        out.sub_(b, alpha=0.5)
        out.div_(b * b + 1)
        out += a
        out *= b
        out.clamp_(-20.0, 20.0)
        return out

    return fn, [uniform(rng, shape_a, -1.0, 1.0), uniform(rng, shape_b, -1.0, 1.0)]


# ---------------------------------------------------------------------- nn functions
@case("matmul")
def _matmul(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    n, k, m, b = (draw(st.integers(1, MAX_SIDE)) for _ in range(4))
    layout = draw(
        st.sampled_from(
            [
                ((k,), (k,)),
                ((k,), (k, m)),
                ((n, k), (k,)),
                ((n, k), (k, m)),
                ((b, n, k), (k, m)),
                ((b, n, k), (b, k, m)),
                ((1, n, k), (b, k, m)),
                ((n, k), (b, k, m)),
                ((b, n, k), (k,)),
                ((k,), (b, k, m)),
            ]
        )
    )
    return (lambda x, y: x @ y), [uniform(rng, layout[0]), uniform(rng, layout[1])]


@case("gv.matmul chain")
def _matmul_chain(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    n, k, m = (draw(st.integers(1, MAX_SIDE)) for _ in range(3))
    return (lambda x, y: gv.matmul(x, y) @ y.mT), [uniform(rng, (n, k)), uniform(rng, (k, m))]


for _softmax_name in ("softmax", "log_softmax"):

    def _softmax_case(name: str) -> None:
        @case(name)
        def build(draw: Draw, rng: np.random.Generator, device: str) -> Any:
            shape = draw(shapes(min_dims=1))
            dim = draw(st.integers(-len(shape), len(shape) - 1))
            if draw(st.booleans()):
                return (lambda a: getattr(a, name)(dim)), [uniform(rng, shape, -3.0, 3.0)]
            return (lambda a: getattr(gv, name)(a, dim=dim)), [uniform(rng, shape, -3.0, 3.0)]

    _softmax_case(_softmax_name)


@case("cross_entropy with class indices")
def _cross_entropy(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    layout = draw(st.sampled_from(["1d", "2d", "3d"]))
    classes = draw(st.integers(2, MAX_SIDE))
    batch = draw(st.integers(1, MAX_SIDE))
    extra = draw(st.integers(1, 3))
    shape = {"1d": (classes,), "2d": (batch, classes), "3d": (batch, classes, extra)}[layout]
    target_shape = {"1d": (), "2d": (batch,), "3d": (batch, extra)}[layout]
    labels = rng.integers(0, classes, target_shape)
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    smoothing = draw(st.sampled_from([0.0, 0.1]))
    ignore = -100
    if layout != "1d" and labels.size > 1 and draw(st.booleans()):
        labels.reshape(-1)[0] = ignore = draw(st.sampled_from([-100, 0]))
        if (labels != ignore).sum() == 0:
            ignore = -100
    target = const(labels.astype(np.int64), device)
    return (
        lambda x: gv.cross_entropy(
            x, target, reduction=reduction, ignore_index=ignore, label_smoothing=smoothing
        )
    ), [uniform(rng, shape)]


@case("cross_entropy with probabilities")
def _cross_entropy_probabilities(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(st.sampled_from([(3,), (2, 3), (4, 2), (1, 4), (2, 3, 2)]))
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    smoothing = draw(st.sampled_from([0.0, 0.2]))
    probs = rng.random(shape) + 0.1
    probs = probs / probs.sum(axis=1 if len(shape) > 1 else 0, keepdims=True)
    # the target requires grad too: soft cross-entropy is differentiable in both arguments
    return (lambda x, p: gv.cross_entropy(x, p, reduction=reduction, label_smoothing=smoothing)), [
        uniform(rng, shape),
        probs,
    ]


@case("mse_loss")
def _mse(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    shape = draw(shapes())
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))
    return (lambda x, y: gv.mse_loss(x, y, reduction=reduction)), [
        uniform(rng, shape),
        uniform(rng, shape),
    ]


@case("composite network")
def _network(draw: Draw, rng: np.random.Generator, device: str) -> Any:
    batch, features, hidden = (draw(st.integers(1, 3)) for _ in range(3))
    labels = const(rng.integers(0, 2, (batch,)).astype(np.int64), device)

    def fn(x: gv.Tensor, w1: gv.Tensor, b1: gv.Tensor, w2: gv.Tensor) -> gv.Tensor:
        h = gv.gelu(x @ w1 + b1)
        return gv.cross_entropy(h @ w2, labels) + (w1 * w1).mean() * 0.1

    return fn, [
        uniform(rng, (batch, features)),
        uniform(rng, (features, hidden)),
        uniform(rng, (hidden,)),
        uniform(rng, (hidden, 2)),
    ]


# ---------------------------------------------------------------------- the checks
def check_case(op: OpCase, data: st.DataObject, device: str, second_order: bool) -> None:
    """gradcheck (and gradgradcheck when ``second_order``) of one drawn instance of ``op``."""
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    fn, arrays = op.build(data.draw, rng, device)
    inputs = tuple(
        gv.tensor(a, dtype=gv.float64, device=device, requires_grad=True) for a in arrays
    )
    assert autograd.gradcheck(fn, inputs, check_second_order=second_order)


HYPOTHESIS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("name", sorted(CASES))
@HYPOTHESIS
@given(data=st.data())
def test_first_order_gradient_matches_finite_differences(name: str, data: st.DataObject) -> None:
    check_case(CASES[name], data, "cpu", second_order=False)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(HYPOTHESIS, max_examples=10)
@given(data=st.data())
def test_second_order_gradient_matches_finite_differences(name: str, data: st.DataObject) -> None:
    check_case(CASES[name], data, "cpu", second_order=True)


# ---------------------------------------------------------------------- gradcheck itself
class _WrongSquare(Function):
    """x**2 with a backward that is off by a factor: gradcheck must catch it."""

    @staticmethod
    def forward(ctx: Any, a: gv.Tensor) -> Any:
        ctx.save_for_backward(a)
        return array_of(a) * array_of(a)

    @staticmethod
    def backward(ctx: Any, g: gv.Tensor) -> gv.Tensor:
        (a,) = ctx.saved_tensors
        return g * a * 3


class _CubeWithFrozenBackward(Function):
    """x**3 with a correct first derivative that is not itself differentiable in x."""

    @staticmethod
    def forward(ctx: Any, a: gv.Tensor) -> Any:
        ctx.save_for_backward(a)
        return array_of(a) ** 3

    @staticmethod
    def backward(ctx: Any, g: gv.Tensor) -> gv.Tensor:
        (a,) = ctx.saved_tensors
        return g * gv.tensor(3 * array_of(a) ** 2)


def test_gradcheck_rejects_a_wrong_first_derivative() -> None:
    x = gv.tensor([0.5, -1.0, 2.0], dtype=gv.float64, requires_grad=True)
    assert not autograd.gradcheck(_WrongSquare.apply, (x,), raise_exception=False)
    with pytest.raises(gv.AutogradError, match="input 0"):
        autograd.gradcheck(_WrongSquare.apply, (x,))


def test_gradcheck_rejects_a_wrong_second_derivative() -> None:
    x = gv.tensor([0.5, -1.0, 2.0], dtype=gv.float64, requires_grad=True)
    assert autograd.gradcheck(_CubeWithFrozenBackward.apply, (x,))
    assert not autograd.gradcheck(
        _CubeWithFrozenBackward.apply, (x,), raise_exception=False, check_second_order=True
    )
    assert not autograd.gradgradcheck(_CubeWithFrozenBackward.apply, (x,), raise_exception=False)


def test_gradcheck_accepts_float32_inputs_by_checking_in_float64() -> None:
    x = gv.tensor([0.3, 0.7], dtype=gv.float32, requires_grad=True)
    assert autograd.gradcheck(lambda a: (a * a).exp(), (x,), check_second_order=True)


def test_comparisons_give_bool_tensors_outside_the_graph() -> None:
    x = gv.tensor([1.0, -2.0, 3.0], dtype=gv.float64, requires_grad=True)
    y = gv.tensor([0.0, 0.0, 5.0], dtype=gv.float64, requires_grad=True)
    for result in (x < y, x <= y, x > y, x >= y, x == y, x != y, x > 0.5):
        assert result.dtype == gv.bool_
        assert not result.requires_grad
        assert result.grad_fn is None
    np.testing.assert_array_equal((x < y).numpy(), [False, True, True])
    np.testing.assert_array_equal((x > 0.5).numpy(), [True, False, True])
