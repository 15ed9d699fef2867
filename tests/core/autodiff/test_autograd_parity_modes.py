"""Parity with PyTorch in grad modes, dtypes and shape ops, side by side with torch.

Each test writes one small program once for both libraries (``lib`` is ``gv`` or
``torch``) and compares what a user sees: dtypes, ``is_leaf``, ``requires_grad``, whether
a result is the input itself, memory sharing, byte strides, gradients and raises-or-not.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams, autograd

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.torch

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]


def torch_dtype(name: str) -> Any:
    return torch.bool if name == "bool" else getattr(torch, name)


def leaf(lib: Any, values: Any = ((1.0, 2.0, 3.0), (4.0, 5.0, 6.0))) -> Any:
    return lib.tensor(values, dtype=lib.float64, requires_grad=True)


def host(t: Any) -> np.ndarray:
    return np.asarray(t.detach().numpy())


def outcome(program: Callable[[], Any]) -> tuple[str, Any]:
    """``("ok", value)`` or ``("raises", None)``: what the program did."""
    try:
        return "ok", program()
    except (RuntimeError, gv.GradvaultError):
        return "raises", None


def both(program: Callable[[Any], Any]) -> tuple[Any, Any]:
    return program(gv), program(torch)


# ---------------------------------------------------------------------- integer results
CASTS = {
    "long()": lambda lib, t: t.long(),
    "to(int32)": lambda lib, t: t.to(dtype=lib.int32),
    "to(bool)": lambda lib, t: t.to(dtype=lib.bool if lib is torch else lib.bool_),
    "to(uint8)": lambda lib, t: t.to(dtype=lib.uint8 if lib is torch else np.uint8),
    "argmax()": lambda lib, t: t.argmax(),
    "max(dim).indices": lambda lib, t: t.max(1)[1],
    "x > 2": lambda lib, t: t > 2,
    "long() + 1": lambda lib, t: t.long() + 1,
}


@pytest.mark.parametrize("op", list(CASTS))
def test_integer_and_bool_results_never_require_grad(op: str) -> None:
    def program(lib: Any) -> tuple[bool, bool, bool]:
        out = CASTS[op](lib, leaf(lib))
        return out.requires_grad, out.grad_fn is None, out.is_leaf

    ours, theirs = both(program)
    assert ours == theirs == (False, True, True)


def test_a_cast_to_an_integer_dtype_cuts_the_graph() -> None:
    def program(lib: Any) -> tuple[str, Any]:
        x = leaf(lib)
        result = outcome(lambda: x.long().double().sum().backward())[0]
        return result, x.grad

    ours, theirs = both(program)
    assert ours == theirs == ("raises", None)
    # a float cast stays in the graph and brings the gradient back in x's dtype
    x = leaf(gv)
    x.float().sum().backward()
    assert x.grad.dtype == gv.float64
    np.testing.assert_array_equal(host(x.grad), np.ones((2, 3)))


# ---------------------------------------------------------------------- type promotion
def _operand(lib: Any, dtype: str, zero_dim: bool) -> Any:
    dt = torch_dtype(dtype) if lib is torch else np.dtype(dtype)
    values = 1 if zero_dim else [1, 0, 1]
    return lib.tensor(values, dtype=dt)


@pytest.mark.parametrize("right", DTYPES)
@pytest.mark.parametrize("left", DTYPES)
def test_result_dtype_is_torch_result_type(left: str, right: str) -> None:
    # every rank pairing: both sized, sized with 0-d (either side), both 0-d
    for left_zero, right_zero in [(False, False), (False, True), (True, False), (True, True)]:
        expected = torch.result_type(
            _operand(torch, left, left_zero), _operand(torch, right, right_zero)
        )
        a, b = _operand(gv, left, left_zero), _operand(gv, right, right_zero)
        where = f"{left}{'(0-d)' if left_zero else ''} * {right}{'(0-d)' if right_zero else ''}"
        assert str((a * b).dtype) == str(expected).removeprefix("torch."), where
        cond = gv.tensor([True, False, True])
        assert str(gv.where(cond, a, b).dtype) == str(expected).removeprefix("torch."), where
        expected_div = torch.div(
            _operand(torch, left, left_zero), _operand(torch, right, right_zero)
        ).dtype
        assert str((a / b).dtype) == str(expected_div).removeprefix("torch."), where


@pytest.mark.parametrize("scalar", [True, 3, 2.5])
@pytest.mark.parametrize("dtype", DTYPES)
def test_result_dtype_with_a_python_number_is_torch_result_type(dtype: str, scalar: Any) -> None:
    for zero_dim in (False, True):
        expected = torch.result_type(_operand(torch, dtype, zero_dim), scalar)
        ours = _operand(gv, dtype, zero_dim)
        name = str(expected).removeprefix("torch.")
        assert str((ours * scalar).dtype) == name, (dtype, zero_dim, scalar)
        assert str((scalar * ours).dtype) == name, (dtype, zero_dim, scalar)
    if dtype != "bool":
        theirs = str((_operand(torch, dtype, False) ** 2.5).dtype).removeprefix("torch.")
        assert str((_operand(gv, dtype, False) ** 2.5).dtype) == theirs


@pytest.mark.parametrize(
    ("left", "right"),
    [("int64", "float32"), ("int32", "float16"), ("uint8", "int8"), ("bool", "int32")],
)
def test_promoted_values_match_torch(left: str, right: str) -> None:
    a = np.array([3, 0, 7]).astype(left)
    b = np.array([1.5, 2, -1]).astype(right)
    ours = gv.tensor(a) * gv.tensor(b)
    theirs = torch.tensor(a) * torch.tensor(b)
    assert str(ours.dtype) == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(host(ours), theirs.numpy())


FLOATS = ["float16", "float32", "float64"]


@pytest.mark.parametrize("right", FLOATS)
@pytest.mark.parametrize("left", FLOATS)
@pytest.mark.parametrize("right_zero", [False, True])
def test_gradients_come_back_in_each_inputs_dtype(left: str, right: str, right_zero: bool) -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        dt = (lambda n: getattr(torch, n)) if lib is torch else np.dtype
        a = lib.tensor([1.5, -2.0, 3.0], dtype=dt(left), requires_grad=True)
        b = lib.tensor(0.5 if right_zero else [2.0, 0.25, -1.0], dtype=dt(right))
        b.requires_grad_()
        out = a * b + a / b
        out.sum().backward()
        return tuple(
            (str(t.dtype).removeprefix("torch."), host(t).astype(np.float64))
            for t in (out, a.grad, b.grad)
        )

    ours, theirs = both(program)
    for (our_dtype, our_values), (their_dtype, their_values) in zip(ours, theirs, strict=True):
        assert our_dtype == their_dtype
        np.testing.assert_allclose(our_values, their_values, rtol=2e-3)


# ---------------------------------------------------------------------- grad modes
def autograd_lib() -> SimpleNamespace:
    """``gv`` with the mode queries that torch has at its top level."""
    return SimpleNamespace(
        tensor=gv.tensor,
        float64=gv.float64,
        set_grad_enabled=gv.set_grad_enabled,
        no_grad=gv.no_grad,
        enable_grad=gv.enable_grad,
        inference_mode=gv.inference_mode,
        is_grad_enabled=autograd.is_grad_enabled,
        is_inference_mode_enabled=autograd.is_inference_mode_enabled,
    )


def test_set_grad_enabled_as_a_decorator_changes_the_mode_only_inside() -> None:
    def program(lib: Any) -> tuple[bool, ...]:
        x = leaf(lib)

        @lib.set_grad_enabled(False)
        def double(t: Any) -> Any:
            return t * 2, lib.is_grad_enabled()

        after_definition = lib.is_grad_enabled()
        y, inside = double(x)
        return after_definition, inside, y.requires_grad, lib.is_grad_enabled()

    try:
        ours = program(autograd_lib())
    finally:
        gv.set_grad_enabled(True)  # the old decorator left grad mode off
    assert ours == program(torch) == (True, False, False, True)


def test_inference_mode_decorates_without_parentheses() -> None:
    def program(lib: Any) -> tuple[bool, ...]:
        x = leaf(lib)

        @lib.inference_mode
        def double(t: Any) -> Any:
            return t * 2, lib.is_inference_mode_enabled()

        y, inside = double(x)
        return callable(double), inside, y.requires_grad, lib.is_inference_mode_enabled()

    assert program(autograd_lib()) == program(torch) == (True, True, False, False)


def test_inference_mode_wins_over_enable_grad() -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        x = leaf(lib)
        with lib.inference_mode(), lib.enable_grad():
            mode = lib.is_grad_enabled()
            status, y = outcome(lambda: x * 2)
            status_set, z = outcome(lambda: x.exp())
        return mode, status, y.requires_grad, y.grad_fn is None, status_set, z.requires_grad

    assert program(autograd_lib()) == program(torch) == (True, "ok", False, True, "ok", False)


@pytest.mark.parametrize("mode", ["no_grad", "enable_grad", "set_grad_enabled(False)"])
def test_a_decorated_generator_runs_under_the_mode_between_its_yields_only(mode: str) -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        # set_grad_enabled switches the mode as soon as it is made: make only the one used
        decorator = {
            "no_grad": lambda: lib.no_grad(),
            "enable_grad": lambda: lib.enable_grad(),
            "set_grad_enabled(False)": lambda: lib.set_grad_enabled(False),
        }[mode]

        @decorator()
        def steps() -> Iterator[bool]:
            for _ in range(2):
                yield lib.is_grad_enabled()

        # the loop runs under the opposite mode, which the generator's body must not see
        opposite = lib.no_grad if mode == "enable_grad" else lib.enable_grad
        with opposite():
            seen = tuple((inside, lib.is_grad_enabled()) for inside in steps())
        return seen, lib.is_grad_enabled()

    ours = program(autograd_lib())
    gv.set_grad_enabled(True)
    assert ours == program(torch)


def test_the_grad_mode_is_per_thread() -> None:
    def program(lib: Any) -> tuple[bool, bool]:
        seen = []
        with lib.no_grad():
            thread = threading.Thread(target=lambda: seen.append(lib.is_grad_enabled()))
            thread.start()
            thread.join()
            return seen[0], lib.is_grad_enabled()

    assert program(autograd_lib()) == program(torch) == (True, False)


# ---------------------------------------------------------------------- views that change nothing
SAME_SHAPE = {
    "reshape(2, 3)": lambda t: t.reshape(2, 3),
    "view(2, 3)": lambda t: t.view(2, 3),
    "view_as(x)": lambda t: t.view_as(t),
    "expand(2, 3)": lambda t: t.expand(2, 3),
    "expand_as(x)": lambda t: t.expand_as(t),
    "squeeze(0)": lambda t: t.squeeze(0),
    "squeeze()": lambda t: t.squeeze(),
    "unsqueeze(0).squeeze(0)": lambda t: t.unsqueeze(0).squeeze(0),
    "permute(0, 1)": lambda t: t.permute(0, 1),
    "transpose(0, 0)": lambda t: t.transpose(0, 0),
    "T.T": lambda t: t.T.T,
    "flatten(1)": lambda t: t.flatten(1),
    "contiguous()": lambda t: t.contiguous(),
    "flatten() of 1-d": lambda t: t[0].flatten(),
}


@pytest.mark.parametrize("op", list(SAME_SHAPE))
def test_a_view_that_changes_nothing_is_what_pytorch_returns(op: str) -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        x = leaf(lib)
        base = x[0] if op == "flatten() of 1-d" else x
        y = SAME_SHAPE[op](x)
        facts = (y is base, y.is_leaf, y.requires_grad, y.grad_fn is None)
        seen = []
        y.register_hook(lambda g: seen.append(host(g).tolist()))
        if not y.is_leaf:
            y.retain_grad()
        (y * y).sum().backward()
        grads = (host(x.grad).tolist(), None if y.grad is None else host(y.grad).tolist())
        # the view follows its base
        with lib.no_grad():
            x.add_(1.0)
        follows = np.array_equal(host(y), host(SAME_SHAPE[op](x)))
        in_place = outcome(lambda: y.mul_(2))[0]
        return facts, seen, grads, follows, in_place

    assert program(gv) == program(torch)


def test_a_view_of_a_tensor_that_needs_no_grad_is_a_new_tensor_sharing_its_memory() -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        x = lib.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
        facts = []
        for op in ("reshape(2, 3)", "view(2, 3)", "expand(2, 3)", "squeeze(0)"):
            y = SAME_SHAPE[op](x)
            x.add_(1.0)
            facts.append((y is x, np.array_equal(host(y), host(x))))
        return tuple(facts)

    assert program(gv) == program(torch)


def _model_with_grads() -> gv.Linear:
    gv.manual_seed(0)
    model = gv.Linear(3, 2)
    model(gv.randn(4, 3)).sum().backward()
    return model


@pytest.mark.parametrize("taken", ["before the capture", "after the capture"])
def test_an_expanded_gradient_follows_it_across_a_capture(taken: str) -> None:
    model = _model_with_grads()
    grad = model.weight.grad
    expanded = grad.expand(2, 2, 3) if taken == "before the capture" else None
    record = GradientsParams.from_module_grad(model).try_to_record()
    frozen = record[model.weight.id].array.copy()
    if expanded is None:
        expanded = grad.expand(2, 2, 3)
    grad.add_(1.0)
    # a view, as in PyTorch: it sees the write; the snapshot does not
    np.testing.assert_array_equal(host(expanded), np.broadcast_to(host(grad), (2, 2, 3)))
    np.testing.assert_array_equal(record[model.weight.id].array, frozen)


# ---------------------------------------------------------------------- contiguous()
LAYOUTS = {
    "x.T": lambda x: x.T,
    "x.T.T": lambda x: x.T.T,
    "x.expand(2, 3, 4)": lambda x: x.expand(2, 3, 4),
    "x[:, ::2]": lambda x: x[:, ::2],
    "x.permute(1, 0)[1:]": lambda x: x.permute(1, 0)[1:],
}


@pytest.mark.parametrize("make", list(LAYOUTS))
def test_contiguous_is_a_c_ordered_copy_or_the_tensor_itself(make: str) -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        values = np.arange(12.0).reshape(3, 4)
        x = lib.tensor(values, dtype=lib.float64, requires_grad=True)
        source = LAYOUTS[make](x)
        out = source.contiguous()
        strides = host(out).strides if lib is gv else tuple(8 * s for s in out.stride())
        (out * lib.tensor(np.arange(out.numel()).reshape(out.shape))).sum().backward()
        return (
            out is source,
            out.is_leaf,
            strides,
            host(out).tolist(),
            host(x.grad).tolist(),
            out.contiguous() is out,
        )

    assert program(gv) == program(torch)


# ---------------------------------------------------------------------- inference tensors
USES = {
    "c + x": lambda c, x: c + x,
    "c - x": lambda c, x: c - x,
    "c.exp() + x": lambda c, x: c.exp() + x,
    "c.view(2) + x": lambda c, x: c.view(2) + x,
    "c.reshape(1, 2) + x": lambda c, x: c.reshape(1, 2) + x,
    "c * x": lambda c, x: c * x,
    "x * c": lambda c, x: x * c,
    "x / c": lambda c, x: x / c,
    "c[0] * x": lambda c, x: c[0] * x,
    "x ** c": lambda c, x: x**c,
}


@pytest.mark.parametrize("use", list(USES))
def test_inference_tensors_are_refused_only_where_a_graph_saves_them(use: str) -> None:
    def program(lib: Any) -> tuple[Any, ...]:
        x = lib.tensor([1.0, 2.0], dtype=lib.float64, requires_grad=True)
        with lib.inference_mode():
            c = lib.tensor([3.0, 4.0], dtype=lib.float64)
        status, _ = outcome(lambda: USES[use](c, x).sum().backward())
        grad = None if x.grad is None else host(x.grad).tolist()
        return status, grad

    assert program(gv) == program(torch)


def test_inference_tensors_still_refuse_in_place_updates_and_requires_grad() -> None:
    def program(lib: Any) -> tuple[str, ...]:
        with lib.inference_mode():
            c = lib.tensor([3.0, 4.0], dtype=lib.float64)
        results = [outcome(lambda: c.add_(1.0))[0], outcome(lambda: c.requires_grad_())[0]]
        with lib.no_grad():
            results.append(outcome(lambda: c.add_(1.0))[0])
        results.append(outcome(lambda: c.view(2).add_(1.0))[0])
        return tuple(results)

    assert program(gv) == program(torch) == ("raises",) * 4
