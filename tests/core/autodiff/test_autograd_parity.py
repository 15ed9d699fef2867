"""Parity with PyTorch: random expressions, ``autograd.grad`` and higher derivatives.

Each expression is a random DAG of unary, binary, reduction, shape and loss ops over 2-3
float64 inputs with broadcastable shapes, built from a seeded generator and evaluated side
by side in gradvault and in torch; forward values and every input's gradient must agree to
1e-6 relative. ``test_gpu.py`` runs the same expressions with gradvault on ``cuda:0``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import autograd

torch = pytest.importorskip("torch")
functional = pytest.importorskip("torch.nn.functional")

pytestmark = pytest.mark.torch

RTOL = 1e-6
ATOL = 1e-9
EXPRESSIONS = 320


def assert_close(actual: Any, expected: Any, what: str) -> None:
    np.testing.assert_allclose(
        np.asarray(actual), np.asarray(expected), rtol=RTOL, atol=ATOL, err_msg=what
    )


def to_numpy(t: Any) -> np.ndarray:
    """Host values of a gradvault or torch tensor."""
    if isinstance(t, gv.Tensor):
        return np.asarray(t.detach().numpy())
    return t.detach().cpu().numpy(force=True)


def libraries(device: str) -> tuple[SimpleNamespace, SimpleNamespace]:
    """The same vocabulary over gradvault (on ``device``) and over torch (cpu)."""
    gv_lib = SimpleNamespace(
        name="gradvault",
        const=lambda a: gv.tensor(np.asarray(a), device=device),
        leaf=lambda a: gv.tensor(
            np.asarray(a, dtype=np.float64), dtype=gv.float64, device=device, requires_grad=True
        ),
        gelu=gv.gelu,
        cross_entropy=gv.cross_entropy,
        mse_loss=gv.mse_loss,
        **{n: getattr(gv, n) for n in _SHARED},
    )
    torch_lib = SimpleNamespace(
        name="torch",
        const=lambda a: torch.tensor(np.asarray(a)),
        leaf=lambda a: torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True),
        gelu=functional.gelu,
        cross_entropy=functional.cross_entropy,
        mse_loss=functional.mse_loss,
        **{n: getattr(torch, n) for n in _SHARED},
    )
    return gv_lib, torch_lib


_SHARED = (
    "exp",
    "log",
    "sqrt",
    "abs",
    "tanh",
    "sigmoid",
    "relu",
    "softmax",
    "log_softmax",
    "cat",
    "stack",
    "where",
    "clamp",
    "matmul",
    "pow",
    "sum",
    "mean",
    "max",
    "min",
    "var",
    "reshape",
    "transpose",
    "permute",
)


@dataclass(eq=False)
class Node:
    """One value of the expression in both libraries."""

    g: Any
    t: Any
    values: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.values = to_numpy(self.g)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def ndim(self) -> int:
        return self.values.ndim


Op = Callable[..., Any]


class Expression:
    """A random expression built in lock-step in both libraries."""

    def __init__(self, seed: int, device: str = "cpu") -> None:
        self.rng = np.random.default_rng(seed)
        self.gv_lib, self.torch_lib = libraries(device)
        self.log: list[str] = []
        rng = self.rng
        base = tuple(int(n) for n in rng.integers(1, 5, rng.integers(1, 4)))
        self.inputs: list[Node] = []
        for _ in range(int(rng.integers(2, 4))):
            drop = int(rng.integers(0, len(base) + 1)) if rng.random() < 0.3 else 0
            shape = tuple(1 if rng.random() < 0.25 else n for n in base[drop:])
            values = rng.uniform(-2, 2, shape)
            self.inputs.append(Node(self.gv_lib.leaf(values), self.torch_lib.leaf(values)))
        self.roots: list[Node] = list(self.inputs)
        for _ in range(int(rng.integers(3, 9))):
            self.step()
        while len(self.roots) > 1:
            a, b = self.roots.pop(0), self.roots.pop(0)
            self.roots.append(self.combine(a, b))
        self.output = self.roots[0]

    # -------------------------------------------------------------- helpers
    def apply(self, name: str, fn: Op, *args: Node) -> Node:
        """``fn(lib, *tensors)`` in both libraries, squashed when values grow large."""
        self.log.append(f"{name}{[a.shape for a in args]}")
        node = Node(fn(self.gv_lib, *(a.g for a in args)), fn(self.torch_lib, *(a.t for a in args)))
        if node.values.size and np.abs(node.values).max() > 30:
            node = Node((node.g / 30).tanh() * 30, (node.t / 30).tanh() * 30)
            self.log.append("squash")
        return node

    def pick(self) -> Node:
        pool = self.roots if self.rng.random() < 0.8 else self.inputs
        return pool[int(self.rng.integers(0, len(pool)))]

    def take(self) -> Node:
        """A node, removed from the roots when it was one (it becomes an operand)."""
        node = self.pick()
        if node in self.roots and len(self.roots) > 1:
            self.roots.remove(node)
        return node

    def positive(self, x: Node) -> Node:
        if x.values.size and x.values.min() > 0.2:
            return x
        return self.apply("x*x+0.5", lambda L, a: a * a + 0.5, x)

    def nonzero(self, x: Node) -> Node:
        if x.values.size and np.abs(x.values).min() > 0.2:
            return x
        return self.apply("x*x+0.5", lambda L, a: a * a + 0.5, x)

    def combine(self, a: Node, b: Node) -> Node:
        try:
            np.broadcast_shapes(a.shape, b.shape)
        except ValueError:
            b = self.apply("sum", lambda L, x: x.sum(), b)
        choice = self.rng.integers(0, 3)
        if choice == 0:
            return self.apply("add", lambda L, x, y: x + y, a, b)
        if choice == 1:
            return self.apply("mul", lambda L, x, y: x * y, a, b)
        return self.apply("sub", lambda L, x, y: x - y, a, b)

    # -------------------------------------------------------------- ops
    def step(self) -> None:
        kind = self.rng.choice(["unary", "unary", "binary", "binary", "reduce", "shape", "nn"])
        x = self.take()
        node = getattr(self, f"_{kind}")(x)
        self.roots.append(node)

    def _unary(self, x: Node) -> Node:
        rng = self.rng
        c = float(np.round(rng.uniform(-2, 2), 3)) or 1.0
        ops: dict[str, Callable[[], Node]] = {
            "neg": lambda: self.apply("neg", lambda L, a: -a, x),
            "exp": lambda: self.apply("exp", lambda L, a: L.exp(a.tanh() * 2), x),
            "log": lambda: self.apply("log", lambda L, a: L.log(a), self.positive(x)),
            "sqrt": lambda: self.apply("sqrt", lambda L, a: a.sqrt(), self.positive(x)),
            "abs": lambda: self.apply("abs", lambda L, a: L.abs(a), x),
            "tanh": lambda: self.apply("tanh", lambda L, a: a.tanh(), x),
            "sigmoid": lambda: self.apply("sigmoid", lambda L, a: L.sigmoid(a), x),
            "relu": lambda: self.apply("relu", lambda L, a: L.relu(a), x),
            "gelu": lambda: self.apply("gelu", lambda L, a: L.gelu(a), x),
            "gelu tanh": lambda: self.apply(
                "gelu tanh", lambda L, a: L.gelu(a, approximate="tanh"), x
            ),
            "clamp": lambda: self.apply(
                "clamp", lambda L, a: L.clamp(a, min=-0.7, max=c * 0.5 + 1.5), x
            ),
            "clamp_min": lambda: self.apply("clamp min", lambda L, a: a.clamp(min=c * 0.5), x),
            "pow int": lambda: self.apply("pow 3", lambda L, a: a**3, x),
            "pow float": lambda: self.apply("pow 1.5", lambda L, a: a**1.5, self.positive(x)),
            "pow negative": lambda: self.apply(
                "pow -1", lambda L, a: L.pow(a, -1.0), self.nonzero(x)
            ),
            "rpow": lambda: self.apply("rpow", lambda L, a: 1.5 ** a.tanh(), x),
            "scalar": lambda: self.apply("scalar", lambda L, a: (a * c + c) - c / 2, x),
            "rdiv": lambda: self.apply("rdiv", lambda L, a: c / a, self.nonzero(x)),
            "inplace": lambda: self.apply("inplace", _inplace_chain(c), x),
        }
        name = str(rng.choice(list(ops)))
        return ops[name]()

    def _binary(self, x: Node) -> Node:
        y = self.pick()
        try:
            np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            y = self.apply("mean", lambda L, a: a.mean(), y)
        rng = self.rng
        name = str(
            rng.choice(
                [
                    "add",
                    "sub",
                    "mul",
                    "div",
                    "pow",
                    "where",
                    "where mask",
                    "matmul",
                    "setitem",
                    "mse",
                ]
            )
        )
        if name == "add":
            return self.apply("add", lambda L, a, b: a + b, x, y)
        if name == "sub":
            return self.apply("sub", lambda L, a, b: a - b, x, y)
        if name == "mul":
            return self.apply("mul", lambda L, a, b: a * b, x, y)
        if name == "div":
            return self.apply("div", lambda L, a, b: a / b, x, self.nonzero(y))
        if name == "pow":
            return self.apply("pow", lambda L, a, b: L.pow(a, b.tanh()), self.positive(x), y)
        if name == "where":
            full = np.broadcast_shapes(x.shape, y.shape)
            gap = np.abs(np.broadcast_to(x.values, full) - np.broadcast_to(y.values, full))
            if gap.size and gap.min() < 1e-6:
                return self.apply("add", lambda L, a, b: a + b, x, y)
            return self.apply("where cmp", lambda L, a, b: L.where(a > b, a * 2, b.tanh()), x, y)
        if name == "where mask":
            mask = rng.random(np.broadcast_shapes(x.shape, y.shape)) < 0.5
            return self.apply("where mask", lambda L, a, b: L.where(L.const(mask), a, b), x, y)
        if name == "matmul":
            if x.ndim >= 1:
                k = x.shape[-1]
                w = rng.uniform(-1, 1, (k, int(rng.integers(1, 4))))
                other = self.apply("weights", lambda L, a: a * 0 + L.const(w), self.scalar_of(y))
                return self.apply("matmul", lambda L, a, b: L.matmul(a, b), x, other)
            return self.apply("mul", lambda L, a, b: a * b, x, y)
        if name == "setitem":
            if x.ndim == 0:
                return self.apply("mul", lambda L, a, b: a * b, x, y)
            row = int(rng.integers(0, x.shape[0]))
            value = self.scalar_of(y)

            def setitem(L: Any, a: Any, v: Any) -> Any:
                out = a * 1
                out[row] = v * 2
                return out

            return self.apply("setitem", setitem, x, value)
        if x.shape == y.shape:
            reduction = str(rng.choice(["mean", "sum", "none"]))
            return self.apply("mse", lambda L, a, b: L.mse_loss(a, b, reduction=reduction), x, y)
        return self.apply("mul", lambda L, a, b: a * b, x, y)

    def scalar_of(self, x: Node) -> Node:
        return self.apply("mean", lambda L, a: a.mean(), x)

    def _reduce(self, x: Node) -> Node:
        rng = self.rng
        if x.ndim == 0:
            return self.apply("mul self", lambda L, a: a * a, x)
        dim = int(rng.integers(-x.ndim, x.ndim))
        keepdim = bool(rng.random() < 0.5)
        name = str(
            rng.choice(
                [
                    "sum",
                    "mean",
                    "sum tuple",
                    "var",
                    "std",
                    "max",
                    "min",
                    "max all",
                    "softmax",
                    "log_softmax",
                ]
            )
        )
        if name == "sum":
            return self.apply("sum", lambda L, a: L.sum(a, dim, keepdim=keepdim), x)
        if name == "mean":
            return self.apply("mean", lambda L, a: a.mean(dim, keepdim=keepdim), x)
        if name == "sum tuple":
            dims = tuple(sorted({dim % x.ndim, int(rng.integers(0, x.ndim))}))
            return self.apply("sum tuple", lambda L, a: a.sum(dims, keepdim=keepdim), x)
        if name in ("var", "std"):
            if x.shape[dim] < 2 or np.ptp(x.values, axis=dim).min() < 1e-3:
                return self.apply("mean", lambda L, a: a.mean(dim), x)
            correction = int(rng.integers(0, 2))
            return self.apply(
                name, lambda L, a: getattr(a, name)(dim, correction=correction, keepdim=keepdim), x
            )
        if name in ("max", "min"):
            ordered = np.sort(x.values, axis=dim)
            if x.shape[dim] > 1 and np.diff(ordered, axis=dim).min() < 1e-6:
                return self.apply("sum", lambda L, a: a.sum(dim), x)
            return self.apply(name, lambda L, a: getattr(L, name)(a, dim, keepdim=keepdim)[0], x)
        if name == "max all":
            flat = np.sort(x.values.reshape(-1))
            if flat.size > 1 and np.diff(flat).min() < 1e-6:
                return self.apply("sum", lambda L, a: a.sum(), x)
            return self.apply("max all", lambda L, a: L.max(a), x)
        return self.apply(name, lambda L, a: getattr(L, name)(a, dim), x)

    def _shape(self, x: Node) -> Node:
        rng = self.rng
        if x.ndim == 0:
            return self.apply("reshape", lambda L, a: a.reshape(1, 1) * 2, x)
        name = str(
            rng.choice(
                [
                    "reshape",
                    "transpose",
                    "permute",
                    "mT",
                    "unsqueeze",
                    "squeeze",
                    "expand",
                    "flatten",
                    "slice",
                    "index",
                    "mask",
                    "cat",
                    "stack",
                ]
            )
        )
        if name == "reshape":
            shape = tuple(reversed(x.shape)) if rng.random() < 0.5 else (-1,)
            return self.apply("reshape", lambda L, a: L.reshape(a, shape), x)
        if name == "transpose":
            d0, d1 = (int(d) for d in rng.integers(-x.ndim, x.ndim, 2))
            return self.apply("transpose", lambda L, a: a.transpose(d0, d1), x)
        if name == "permute":
            order = tuple(int(d) for d in rng.permutation(x.ndim))
            return self.apply("permute", lambda L, a: L.permute(a, order), x)
        if name == "mT" and x.ndim >= 2:
            return self.apply("mT", lambda L, a: a.mT * 1, x)
        if name == "unsqueeze":
            dim = int(rng.integers(-x.ndim - 1, x.ndim + 1))
            return self.apply("unsqueeze", lambda L, a: a.unsqueeze(dim), x)
        if name == "squeeze" and 1 in x.shape:
            dim = x.shape.index(1)
            return self.apply("squeeze", lambda L, a: a.squeeze(dim), x)
        if name == "expand" and 1 in x.shape:
            target = tuple(3 if n == 1 else n for n in x.shape)
            return self.apply("expand", lambda L, a: a.expand(*target), x)
        if name == "flatten":
            return self.apply("flatten", lambda L, a: a.flatten(), x)
        if name == "slice":
            stop = int(rng.integers(1, x.shape[-1] + 1))
            return self.apply("slice", lambda L, a: a[..., :stop], x)
        if name == "index":
            index = rng.integers(0, x.shape[0], int(rng.integers(1, 5)))
            return self.apply("index", lambda L, a: a[L.const(index)], x)
        if name == "mask":
            mask = rng.random(x.shape) < 0.6
            mask.reshape(-1)[0] = True
            return self.apply("mask", lambda L, a: a[L.const(mask)], x)
        if name == "cat":
            dim = int(rng.integers(0, x.ndim))
            return self.apply("cat", lambda L, a: L.cat([a, a.exp()], dim), x)
        dim = int(rng.integers(0, x.ndim + 1))
        return self.apply("stack", lambda L, a: L.stack([a, a * a], dim), x)

    def _nn(self, x: Node) -> Node:
        rng = self.rng
        if x.ndim == 2 and x.shape[1] >= 2:
            labels = rng.integers(0, x.shape[1], x.shape[0])
            reduction = str(rng.choice(["mean", "sum", "none"]))
            smoothing = float(rng.choice([0.0, 0.1]))
            ignore = -100
            if x.shape[0] > 1 and rng.random() < 0.4:
                ignore = int(labels[0])
                if (labels != ignore).sum() == 0:
                    ignore = -100
            return self.apply(
                "cross_entropy",
                lambda L, a: L.cross_entropy(
                    a,
                    L.const(labels),
                    reduction=reduction,
                    ignore_index=ignore,
                    label_smoothing=smoothing,
                ),
                x,
            )
        if x.ndim >= 1 and x.shape[-1] >= 2:
            probs = rng.random(x.shape) + 0.1
            probs /= probs.sum(axis=1 if x.ndim > 1 else 0, keepdims=True)
            return self.apply(
                "soft cross_entropy",
                lambda L, a: L.cross_entropy(a, L.const(probs), reduction="sum"),
                x,
            )
        return self.apply("softmax", lambda L, a: L.softmax(a.reshape(-1), 0), x)


def _inplace_chain(c: float) -> Op:
    def chain(L: Any, a: Any) -> Any:
        out = a.clone()
        out.mul_(c)
        out.add_(a)
        out -= 0.25
        out.clamp_(-3.0, 3.0)
        return out

    return chain


def check_expression(seed: int, device: str = "cpu") -> None:
    """Forward values and every input's gradient agree between gradvault and torch."""
    expr = Expression(seed, device)
    where = f"seed {seed}: {' -> '.join(expr.log)}"
    out = expr.output
    assert_close(to_numpy(out.g), to_numpy(out.t), f"forward, {where}")
    if out.values.size == 1:
        out.g.backward()
        out.t.sum().backward() if out.t.ndim else out.t.backward()
    else:
        seed_grad = expr.rng.standard_normal(out.shape)
        out.g.backward(gv.tensor(seed_grad, dtype=gv.float64, device=device))
        out.t.backward(torch.tensor(seed_grad))
    for index, node in enumerate(expr.inputs):
        if node.t.grad is None:
            assert node.g.grad is None, f"input {index} should get no gradient, {where}"
            continue
        assert node.g.grad is not None, f"input {index} got no gradient, {where}"
        assert node.g.grad.shape == tuple(node.t.grad.shape)
        assert_close(to_numpy(node.g.grad), to_numpy(node.t.grad), f"grad {index}, {where}")


def check_grad_second_order(seed: int, device: str = "cpu") -> None:
    """``autograd.grad`` with ``create_graph=True``, then a Hessian-vector product, as torch."""
    expr = Expression(seed, device)
    where = f"seed {seed}: {' -> '.join(expr.log)}"
    out = expr.output
    total_g = out.g.sum()
    total_t = out.t.sum()
    first_g = autograd.grad(
        total_g, [n.g for n in expr.inputs], create_graph=True, allow_unused=True
    )
    first_t = torch.autograd.grad(
        total_t, [n.t for n in expr.inputs], create_graph=True, allow_unused=True
    )
    pairs = []
    for index, (g, t) in enumerate(zip(first_g, first_t, strict=True)):
        assert (g is None) == (t is None), f"input {index} used differently, {where}"
        if g is not None:
            assert_close(to_numpy(g), to_numpy(t), f"first derivative {index}, {where}")
            pairs.append((g, t))
    # Where a first derivative is piecewise constant (abs, relu, clamp, max), whether it
    # still requires grad is an implementation choice (torch itself differs between abs and
    # clamp); its derivative must then be zero in whichever library kept it differentiable.
    for lib_index, grad_fn in ((0, autograd.grad), (1, torch.autograd.grad)):
        lone = [
            p[lib_index]
            for p in pairs
            if p[lib_index].requires_grad and not p[1 - lib_index].requires_grad
        ]
        lib_inputs = [(n.g, n.t)[lib_index] for n in expr.inputs]
        for first in lone:
            for value in grad_fn(first.sum(), lib_inputs, allow_unused=True, retain_graph=True):
                if value is not None:
                    assert_close(to_numpy(value), 0.0, f"zero second derivative, {where}")
    differentiable = [(g, t) for g, t in pairs if t.requires_grad and g.requires_grad]
    if not differentiable:
        return
    rng = np.random.default_rng(seed + 1)
    vs = [rng.standard_normal(t.shape) for _, t in differentiable]
    dot_g = sum(
        (g * gv.tensor(v, dtype=gv.float64, device=device)).sum()
        for (g, _), v in zip(differentiable, vs, strict=True)
    )
    dot_t = sum((t * torch.tensor(v)).sum() for (_, t), v in zip(differentiable, vs, strict=True))
    second_g = autograd.grad(dot_g, [n.g for n in expr.inputs], allow_unused=True)
    second_t = torch.autograd.grad(dot_t, [n.t for n in expr.inputs], allow_unused=True)
    for index, (g, t) in enumerate(zip(second_g, second_t, strict=True)):
        if t is None or g is None:
            # torch prunes paths it knows are zero; what it returns must then be zeros here
            value = g if g is not None else t
            if value is not None:
                assert_close(to_numpy(value), 0.0, f"second derivative {index}, {where}")
            continue
        assert_close(to_numpy(g), to_numpy(t), f"second derivative {index}, {where}")


@pytest.mark.parametrize("seed", range(EXPRESSIONS))
def test_random_expression_matches_torch(seed: int) -> None:
    check_expression(seed)


@pytest.mark.parametrize("seed", range(1000, 1060))
def test_random_expression_second_order_matches_torch(seed: int) -> None:
    check_grad_second_order(seed)


# ---------------------------------------------------------------------- autograd.grad
def _pair(values: Any) -> tuple[gv.Tensor, Any]:
    array = np.asarray(values, dtype=np.float64)
    return (
        gv.tensor(array, dtype=gv.float64, requires_grad=True),
        torch.tensor(array, requires_grad=True),
    )


def test_grad_with_grad_outputs_matches_torch() -> None:
    rng = np.random.default_rng(7)
    xg, xt = _pair(rng.uniform(-1, 1, (3, 4)))
    wg, wt = _pair(rng.uniform(-1, 1, (4, 2)))
    seed = rng.standard_normal((3, 2))
    out_g = (xg @ wg).tanh()
    out_t = (xt @ wt).tanh()
    got = autograd.grad(out_g, (xg, wg), grad_outputs=gv.tensor(seed, dtype=gv.float64))
    want = torch.autograd.grad(out_t, (xt, wt), grad_outputs=torch.tensor(seed))
    assert isinstance(got, tuple) and len(got) == 2
    for g, t in zip(got, want, strict=True):
        assert_close(g.numpy(), t.numpy(), "grad")
    assert xg.grad is None and wg.grad is None


def test_grad_of_several_outputs_sums_them_like_torch() -> None:
    rng = np.random.default_rng(8)
    xg, xt = _pair(rng.uniform(0.5, 2, (5,)))
    outs_g = [xg.log().sum(), (xg * xg).mean(), xg.softmax(0)[1]]
    outs_t = [xt.log().sum(), (xt * xt).mean(), xt.softmax(0)[1]]
    (got,) = autograd.grad(outs_g, [xg])
    (want,) = torch.autograd.grad(outs_t, [xt])
    assert_close(got.numpy(), want.numpy(), "sum of outputs")


def test_grad_create_graph_gives_torchs_third_derivative() -> None:
    rng = np.random.default_rng(9)
    xg, xt = _pair(rng.uniform(-1, 1, (4,)))
    results = []
    for lib_x, grad_fn in ((xg, autograd.grad), (xt, torch.autograd.grad)):
        y = (lib_x.sigmoid() * lib_x.exp()).sum()
        (d1,) = grad_fn(y, [lib_x], create_graph=True)
        (d2,) = grad_fn(d1.sum(), [lib_x], create_graph=True)
        (d3,) = grad_fn(d2.sum(), [lib_x])
        results.append([to_numpy(d) for d in (d1, d2, d3)])
    for order, (got, want) in enumerate(zip(*results, strict=True), start=1):
        assert_close(got, want, f"derivative of order {order}")


def test_grad_allow_unused_matches_torch() -> None:
    xg, xt = _pair([1.0, 2.0])
    ug, ut = _pair([3.0])
    got = autograd.grad((xg * xg).sum(), [xg, ug], allow_unused=True)
    want = torch.autograd.grad((xt * xt).sum(), [xt, ut], allow_unused=True)
    assert got[1] is None and want[1] is None
    assert_close(got[0].numpy(), want[0].numpy(), "used input")
