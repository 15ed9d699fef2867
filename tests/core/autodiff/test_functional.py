"""``autograd.functional``: structure, detaching, strict mode, values, and parity with torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import autograd
from gradvault.core.autodiff.autograd import functional as F

RTOL = 1e-6
ATOL = 1e-9


def leaf(values: Any, requires_grad: bool = True) -> gv.Tensor:
    return gv.tensor(
        np.asarray(values, dtype=np.float64), dtype=gv.float64, requires_grad=requires_grad
    )


def arr(t: gv.Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy())


X = np.array([0.3, -0.8, 1.2])
Y = np.array([[0.5, -1.0, 0.25], [1.5, 0.75, -0.5]])


def vector_fn(x: Any) -> Any:
    return (x.exp() * x.tanh()).softmax(0) * 2 + x * x


def pair_fn(x: Any, y: Any) -> Any:
    return (y @ x).tanh(), (y * x).sigmoid().sum(0) + x.exp()


def scalar_fn(x: Any) -> Any:
    return (x.exp() * x).sum() + (x * x).sum() ** 2


def scalar_pair_fn(x: Any, y: Any) -> Any:
    return (y @ x).tanh().sum() + (y * y * y).mean() * x.sum()


# ---------------------------------------------------------------------- structure
def test_single_tensor_in_gives_single_tensor_out() -> None:
    x = leaf(X)
    out, grad = F.vjp(vector_fn, x, gv.ones(3, dtype=gv.float64))
    assert isinstance(out, gv.Tensor) and isinstance(grad, gv.Tensor)
    out, tangent = F.jvp(vector_fn, x, gv.ones(3, dtype=gv.float64))
    assert isinstance(out, gv.Tensor) and isinstance(tangent, gv.Tensor)
    assert isinstance(F.jacobian(vector_fn, x), gv.Tensor)
    assert F.jacobian(vector_fn, x).shape == (3, 3)
    assert isinstance(F.hessian(scalar_fn, x), gv.Tensor)
    value, hv = F.hvp(scalar_fn, x, gv.ones(3, dtype=gv.float64))
    assert isinstance(value, gv.Tensor) and isinstance(hv, gv.Tensor)
    value, vh = F.vhp(scalar_fn, x, gv.ones(3, dtype=gv.float64))
    assert isinstance(value, gv.Tensor) and isinstance(vh, gv.Tensor)


def test_tuple_in_gives_tuple_out() -> None:
    x, y = leaf(X), leaf(Y)
    out, grads = F.vjp(
        pair_fn, (x, y), (gv.ones(2, dtype=gv.float64), gv.ones(3, dtype=gv.float64))
    )
    assert isinstance(out, tuple) and len(out) == 2
    assert isinstance(grads, tuple) and [g.shape for g in grads] == [(3,), (2, 3)]
    out, tangents = F.jvp(
        pair_fn, (x, y), (gv.ones(3, dtype=gv.float64), gv.ones((2, 3), dtype=gv.float64))
    )
    assert isinstance(tangents, tuple) and [t.shape for t in tangents] == [(2,), (3,)]
    # a one-element tuple stays a tuple
    _, grads = F.vjp(lambda a: a.sum(), (x,))
    assert isinstance(grads, tuple) and len(grads) == 1
    jac = F.jacobian(pair_fn, (x, y))
    assert [[block.shape for block in row] for row in jac] == [
        [(2, 3), (2, 2, 3)],
        [(3, 3), (3, 2, 3)],
    ]
    jac_single_out = F.jacobian(lambda a, b: (b @ a).sum(), (x, y))
    assert isinstance(jac_single_out, tuple) and [j.shape for j in jac_single_out] == [(3,), (2, 3)]
    jac_single_in = F.jacobian(lambda a: (a, a * 2), x)
    assert isinstance(jac_single_in, tuple) and [j.shape for j in jac_single_in] == [(3, 3), (3, 3)]
    hess = F.hessian(scalar_pair_fn, (x, y))
    assert [[block.shape for block in row] for row in hess] == [
        [(3, 3), (3, 2, 3)],
        [(2, 3, 3), (2, 3, 2, 3)],
    ]
    _, hv = F.hvp(
        scalar_pair_fn, (x, y), (gv.ones(3, dtype=gv.float64), gv.ones((2, 3), dtype=gv.float64))
    )
    assert isinstance(hv, tuple) and [h.shape for h in hv] == [(3,), (2, 3)]


# ---------------------------------------------------------------------- detaching
def _all_results(create_graph: bool, x: gv.Tensor) -> list[gv.Tensor]:
    v = gv.tensor([1.0, -1.0, 0.5], dtype=gv.float64)
    results = [
        *F.vjp(vector_fn, x, v, create_graph=create_graph),
        *F.jvp(vector_fn, x, v, create_graph=create_graph),
        F.jacobian(vector_fn, x, create_graph=create_graph),
        F.hessian(scalar_fn, x, create_graph=create_graph),
        *F.hvp(scalar_fn, x, v, create_graph=create_graph),
        *F.vhp(scalar_fn, x, v, create_graph=create_graph),
    ]
    return results


def test_results_are_detached_without_create_graph() -> None:
    x = leaf(X)
    for index, result in enumerate(_all_results(False, x)):
        assert not result.requires_grad, f"result {index}"
        assert result.grad_fn is None, f"result {index}"
    assert x.grad is None


def test_create_graph_keeps_results_differentiable() -> None:
    x = leaf(X)
    for index, result in enumerate(_all_results(True, x)):
        assert result.requires_grad and result.grad_fn is not None, f"result {index}"
    # d/dx of the vjp of sum(x**3) with v = 1 is 6x
    _, grad = F.vjp(lambda a: (a**3).sum(), x, create_graph=True)
    (second,) = autograd.grad(grad.sum(), [x])
    np.testing.assert_allclose(arr(second), 6 * X, rtol=RTOL)
    # d/dx of the hvp of sum(x**4) with v = 1 is 24x
    _, hv = F.hvp(lambda a: (a**4).sum(), x, gv.ones(3, dtype=gv.float64), create_graph=True)
    (third,) = autograd.grad(hv.sum(), [x])
    np.testing.assert_allclose(arr(third), 24 * X, rtol=RTOL)
    assert x.grad is None


def test_inputs_that_do_not_require_grad_work() -> None:
    x = leaf(X, requires_grad=False)
    jac = F.jacobian(lambda a: a * a, x)
    np.testing.assert_allclose(arr(jac), np.diag(2 * X), rtol=RTOL)
    assert not x.requires_grad


# ---------------------------------------------------------------------- strict
def _ignores_y(x: Any, y: Any) -> Any:
    return (x * x).sum()


def test_strict_raises_where_an_output_does_not_depend_on_an_input() -> None:
    x, y = leaf(X), leaf([1.0, 2.0])
    v_in = (gv.ones(3, dtype=gv.float64), gv.ones(2, dtype=gv.float64))
    calls: list[Callable[[bool], Any]] = [
        lambda strict: F.vjp(_ignores_y, (x, y), strict=strict),
        lambda strict: F.jvp(_ignores_y, (x, y), v_in, strict=strict),
        lambda strict: F.jacobian(_ignores_y, (x, y), strict=strict),
        lambda strict: F.hessian(_ignores_y, (x, y), strict=strict),
        lambda strict: F.hvp(_ignores_y, (x, y), v_in, strict=strict),
        lambda strict: F.vhp(_ignores_y, (x, y), v_in, strict=strict),
    ]
    for call in calls:
        with pytest.raises(gv.AutogradError, match="independent"):
            call(True)
        call(False)  # without strict it returns zeros instead


def test_without_strict_an_unused_input_gets_zeros() -> None:
    x, y = leaf(X), leaf([1.0, 2.0])
    _, (gx, gy) = F.vjp(_ignores_y, (x, y))
    np.testing.assert_allclose(arr(gx), 2 * X)
    np.testing.assert_array_equal(arr(gy), [0.0, 0.0])
    jx, jy = F.jacobian(_ignores_y, (x, y))
    np.testing.assert_array_equal(arr(jy), [0.0, 0.0])
    (hxx, hxy), (hyx, hyy) = F.hessian(_ignores_y, (x, y))
    np.testing.assert_allclose(arr(hxx), 2 * np.eye(3))
    for block in (hxy, hyx, hyy):
        np.testing.assert_array_equal(arr(block), np.zeros(block.shape))


def test_strict_hvp_raises_for_a_linear_function() -> None:
    x = leaf(X)
    with pytest.raises(gv.AutogradError, match="independent"):
        F.hvp(lambda a: a.sum() * 3, x, gv.ones(3, dtype=gv.float64), strict=True)
    _, hv = F.hvp(lambda a: a.sum() * 3, x, gv.ones(3, dtype=gv.float64))
    np.testing.assert_array_equal(arr(hv), np.zeros(3))


# ---------------------------------------------------------------------- values
def test_values_match_closed_forms() -> None:
    x = leaf(X)
    v = gv.tensor([1.0, 2.0, -1.0], dtype=gv.float64)
    out, grad = F.vjp(lambda a: a**3, x, v)
    np.testing.assert_allclose(arr(out), X**3, rtol=RTOL)
    np.testing.assert_allclose(arr(grad), 3 * X**2 * [1.0, 2.0, -1.0], rtol=RTOL)
    _, tangent = F.jvp(lambda a: a.exp().sum(), x, v)
    np.testing.assert_allclose(arr(tangent), np.exp(X) @ [1.0, 2.0, -1.0], rtol=RTOL)
    np.testing.assert_allclose(arr(F.jacobian(lambda a: a.exp(), x)), np.diag(np.exp(X)), rtol=RTOL)
    np.testing.assert_allclose(arr(F.hessian(lambda a: (a**3).sum(), x)), np.diag(6 * X), rtol=RTOL)
    _, hv = F.hvp(lambda a: (a**3).sum(), x, v)
    np.testing.assert_allclose(arr(hv), 6 * X * [1.0, 2.0, -1.0], rtol=RTOL)


def test_jvp_is_the_jacobian_times_v() -> None:
    x = leaf(X)
    rng = np.random.default_rng(3)
    v = rng.standard_normal(3)
    jac = arr(F.jacobian(vector_fn, x))
    _, tangent = F.jvp(vector_fn, x, gv.tensor(v, dtype=gv.float64))
    np.testing.assert_allclose(arr(tangent), jac @ v, rtol=RTOL, atol=ATOL)
    _, cotangent = F.vjp(vector_fn, x, gv.tensor(v, dtype=gv.float64))
    np.testing.assert_allclose(arr(cotangent), v @ jac, rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------------- parity with torch
def _compare(got: Any, want: Any, where: str) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            _compare(g, w, f"{where}[{index}]")
        return
    assert isinstance(got, gv.Tensor), where
    assert got.shape == tuple(want.shape), where
    np.testing.assert_allclose(arr(got), want.detach().numpy(), rtol=RTOL, atol=ATOL, err_msg=where)


def _torch_inputs(torch: Any, arrays: list[np.ndarray], was_tuple: bool) -> Any:
    made = tuple(torch.tensor(a) for a in arrays)
    return made if was_tuple else made[0]


def _gv_inputs(arrays: list[np.ndarray], was_tuple: bool) -> Any:
    made = tuple(gv.tensor(a, dtype=gv.float64) for a in arrays)
    return made if was_tuple else made[0]


CASES = {
    "single": (vector_fn, scalar_fn, [X]),
    "pair": (pair_fn, scalar_pair_fn, [X, Y]),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("create_graph", [False, True])
def test_functional_matches_torch(name: str, create_graph: bool) -> None:
    torch = pytest.importorskip("torch")
    tf = torch.autograd.functional
    vector, scalar, arrays = CASES[name]
    was_tuple = len(arrays) > 1
    rng = np.random.default_rng(11)
    gi, ti = _gv_inputs(arrays, was_tuple), _torch_inputs(torch, arrays, was_tuple)
    outs = vector(*(gi if was_tuple else (gi,)))
    out_arrays = [
        rng.standard_normal(o.shape) for o in (outs if isinstance(outs, tuple) else (outs,))
    ]
    v_out_g = _gv_inputs(out_arrays, isinstance(outs, tuple))
    v_out_t = _torch_inputs(torch, out_arrays, isinstance(outs, tuple))
    in_arrays = [rng.standard_normal(a.shape) for a in arrays]
    v_in_g, v_in_t = _gv_inputs(in_arrays, was_tuple), _torch_inputs(torch, in_arrays, was_tuple)
    kw = {"create_graph": create_graph}
    _compare(F.vjp(vector, gi, v_out_g, **kw), tf.vjp(vector, ti, v_out_t, **kw), "vjp")
    _compare(F.jvp(vector, gi, v_in_g, **kw), tf.jvp(vector, ti, v_in_t, **kw), "jvp")
    _compare(F.jacobian(vector, gi, **kw), tf.jacobian(vector, ti, **kw), "jacobian")
    _compare(F.jacobian(scalar, gi, **kw), tf.jacobian(scalar, ti, **kw), "jacobian scalar")
    _compare(F.hessian(scalar, gi, **kw), tf.hessian(scalar, ti, **kw), "hessian")
    _compare(F.hvp(scalar, gi, v_in_g, **kw), tf.hvp(scalar, ti, v_in_t, **kw), "hvp")
    _compare(F.vhp(scalar, gi, v_in_g, **kw), tf.vhp(scalar, ti, v_in_t, **kw), "vhp")


@pytest.mark.torch
def test_functional_create_graph_derivatives_match_torch() -> None:
    torch = pytest.importorskip("torch")
    tf = torch.autograd.functional
    xg = gv.tensor(X, dtype=gv.float64, requires_grad=True)
    xt = torch.tensor(X, requires_grad=True)
    v = np.array([0.5, -1.0, 2.0])
    _, hv_g = F.hvp(scalar_fn, xg, gv.tensor(v, dtype=gv.float64), create_graph=True)
    _, hv_t = tf.hvp(scalar_fn, xt, torch.tensor(v), create_graph=True)
    (third_g,) = autograd.grad(hv_g.sum(), [xg])
    (third_t,) = torch.autograd.grad(hv_t.sum(), [xt])
    np.testing.assert_allclose(arr(third_g), third_t.numpy(), rtol=RTOL, atol=ATOL)
    jac_g = F.jacobian(vector_fn, xg, create_graph=True)
    jac_t = tf.jacobian(vector_fn, xt, create_graph=True)
    (mixed_g,) = autograd.grad((jac_g * jac_g).sum(), [xg])
    (mixed_t,) = torch.autograd.grad((jac_t * jac_t).sum(), [xt])
    np.testing.assert_allclose(arr(mixed_g), mixed_t.numpy(), rtol=RTOL, atol=ATOL)


@pytest.mark.torch
def test_functional_strict_errors_match_torch() -> None:
    torch = pytest.importorskip("torch")
    tf = torch.autograd.functional
    arrays = [X, np.array([1.0, 2.0])]
    gi, ti = _gv_inputs(arrays, True), _torch_inputs(torch, arrays, True)
    for name in ("vjp", "jacobian", "hessian"):
        with pytest.raises(RuntimeError):
            getattr(tf, name)(_ignores_y, ti, strict=True)
        with pytest.raises(gv.AutogradError):
            getattr(F, name)(_ignores_y, gi, strict=True)
        _compare(getattr(F, name)(_ignores_y, gi), getattr(tf, name)(_ignores_y, ti), name)


def test_hessian_passes_its_jacobian_options_on() -> None:
    x = gv.tensor([1.0, 2.0], dtype=gv.float64)

    def cube(t: gv.Tensor) -> gv.Tensor:
        return (t**3).sum()

    expected = F.hessian(cube, x)
    forward = F.hessian(cube, x, vectorize=True, outer_jacobian_strategy="forward-mode")
    assert np.array_equal(forward.numpy(), expected.numpy())
    with pytest.raises(gv.UnsupportedOptionError, match="vectorize"):
        F.hessian(cube, x, outer_jacobian_strategy="forward-mode")
    with pytest.raises(gv.InvalidArgumentError, match="strategy"):
        F.hessian(cube, x, outer_jacobian_strategy="sideways")


def test_a_failed_gradcheck_raises_an_error_of_the_tree() -> None:
    assert issubclass(gv.GradcheckError, gv.AutogradError)
    assert issubclass(gv.GradcheckError, gv.GradvaultError)
