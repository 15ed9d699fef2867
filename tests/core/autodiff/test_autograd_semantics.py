"""The engine's rules, one test each: leaves, .grad, graphs, in-place checks, grad modes."""

from __future__ import annotations

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import autograd


def leaf(values: object, dtype: object = gv.float64) -> gv.Tensor:
    return gv.tensor(values, dtype=dtype, requires_grad=True)


def values(t: gv.Tensor) -> np.ndarray:
    return np.asarray(t.detach().numpy())


# ---------------------------------------------------------------------- .grad
def test_grad_is_none_until_backward_reaches_the_leaf() -> None:
    x = leaf([1.0, 2.0])
    unused = leaf([3.0])
    loss = (x * x).sum()
    assert x.grad is None
    loss.backward()
    np.testing.assert_allclose(values(x.grad), [2.0, 4.0])
    assert unused.grad is None  # requires grad, but the pass never reached it


def test_later_backward_passes_accumulate_into_grad() -> None:
    x = leaf([1.0, -2.0])
    (x * 3).sum().backward()
    first = x.grad
    np.testing.assert_allclose(values(first), [3.0, 3.0])
    gradients = (x * x).sum().backward()
    # accumulated into the same tensor, never replaced
    assert x.grad is first
    np.testing.assert_allclose(values(x.grad), [3.0 + 2.0, 3.0 - 4.0])
    # what backward returns is this pass's gradient alone
    np.testing.assert_allclose(values(gradients.get(x)), [2.0, -4.0])


def test_only_leaves_that_require_grad_get_grad() -> None:
    w = leaf([2.0, 3.0])
    constant = gv.tensor([5.0, 7.0], dtype=gv.float64)
    hidden = w * constant
    hidden.exp().sum().backward()
    assert w.grad is not None
    assert constant.grad is None
    assert hidden.grad is None
    assert not constant.requires_grad


def test_non_leaf_grad_is_kept_only_after_retain_grad() -> None:
    x = leaf([1.0, 2.0])
    kept = x * 2
    dropped = x * 3
    kept.retain_grad()
    assert kept.retains_grad and not dropped.retains_grad
    (kept * dropped).sum().backward()
    np.testing.assert_allclose(values(kept.grad), [3.0, 6.0])  # d/dkept = dropped
    assert dropped.grad is None
    np.testing.assert_allclose(values(x.grad), [12.0, 24.0])


def test_tensors_that_do_not_require_grad_are_leaves() -> None:
    a = gv.tensor([1.0, 2.0])
    b = gv.ones(2) * a + 1
    assert a.is_leaf and b.is_leaf
    assert a.grad_fn is None and b.grad_fn is None
    assert not b.requires_grad
    x = leaf([1.0])
    assert x.is_leaf and x.grad_fn is None
    detached = (x * 2).detach()
    assert detached.is_leaf and not detached.requires_grad


def test_ops_on_tensors_that_require_grad_give_non_leaves_with_grad_fn() -> None:
    x = leaf([1.0, 2.0])
    constant = gv.tensor([3.0, 4.0], dtype=gv.float64)
    for result in (
        x + constant,
        constant * x,
        x.exp(),
        x.sum(),
        x[0],
        x.reshape(2, 1),
        gv.cat([constant, x]),
        gv.where(constant > 3.5, x, constant),
    ):
        assert result.requires_grad
        assert not result.is_leaf
        assert result.grad_fn is not None


def test_backward_on_a_non_scalar_without_gradient_raises() -> None:
    x = leaf([1.0, 2.0])
    y = x * 2
    with pytest.raises(gv.AutogradError, match="scalar"):
        y.backward()
    assert x.grad is None
    y.backward(gv.tensor([1.0, 0.5], dtype=gv.float64))
    np.testing.assert_allclose(values(x.grad), [2.0, 1.0])


def test_backward_on_a_tensor_outside_any_graph_raises() -> None:
    with pytest.raises(gv.AutogradError):
        gv.tensor([1.0]).sum().backward()


def test_second_backward_through_a_freed_graph_raises() -> None:
    x = leaf([1.0, 2.0])
    loss = (x * x).exp().sum()
    loss.backward()
    with pytest.raises(gv.AutogradError, match="retain_graph"):
        loss.backward()


def test_retain_graph_allows_a_second_backward() -> None:
    x = leaf([1.0, 2.0])
    loss = (x * x).sum()
    loss.backward(retain_graph=True)
    loss.backward()
    np.testing.assert_allclose(values(x.grad), [4.0, 8.0])


def test_create_graph_makes_the_gradient_differentiable() -> None:
    x = leaf([0.5, -1.0, 2.0])
    (x**3).sum().backward(create_graph=True)
    first = x.grad
    assert first.requires_grad and first.grad_fn is not None
    np.testing.assert_allclose(values(first), 3 * np.array([0.5, -1.0, 2.0]) ** 2)
    (second,) = autograd.grad(first.sum(), [x])
    np.testing.assert_allclose(values(second), 6 * np.array([0.5, -1.0, 2.0]))


def test_gradient_without_create_graph_is_not_differentiable() -> None:
    x = leaf([0.5, 2.0])
    (x**3).sum().backward()
    assert not x.grad.requires_grad and x.grad.grad_fn is None


def test_backward_inputs_limits_which_leaves_accumulate() -> None:
    x = leaf([1.0])
    y = leaf([2.0])
    (x * y).sum().backward(inputs=[x])
    np.testing.assert_allclose(values(x.grad), [2.0])
    assert y.grad is None


# ---------------------------------------------------------------------- in-place
def _mul_(t: gv.Tensor) -> None:
    t.mul_(2.0)


def _add_(t: gv.Tensor) -> None:
    t.add_(1.0)


def _sub_(t: gv.Tensor) -> None:
    t.sub_(1.0)


def _div_(t: gv.Tensor) -> None:
    t.div_(2.0)


def _iadd(t: gv.Tensor) -> None:
    t += 1.0


def _zero_(t: gv.Tensor) -> None:
    t.zero_()


def _fill_(t: gv.Tensor) -> None:
    t.fill_(3.0)


def _copy_(t: gv.Tensor) -> None:
    t.copy_(gv.zeros(t.shape, dtype=t.dtype))


def _clamp_(t: gv.Tensor) -> None:
    t.clamp_(0.0, 1.5)


def _setitem(t: gv.Tensor) -> None:
    t[0] = 5.0


@pytest.mark.parametrize(
    ("modify", "op_name"),
    [
        (_mul_, "mul_"),
        (_add_, "add_"),
        (_sub_, "sub_"),
        (_div_, "div_"),
        (_iadd, "add_"),
        (_zero_, "zero_"),
        (_fill_, "fill_"),
        (_copy_, "copy_"),
        (_clamp_, "clamp_"),
        (_setitem, "setitem"),
    ],
)
def test_changing_a_saved_tensor_in_place_raises_naming_the_op(
    modify: object, op_name: str
) -> None:
    x = leaf([1.0, 2.0, 3.0])
    saved = x * 1  # a non-leaf: in-place ops on it are allowed
    loss = (saved * saved).sum()  # Mul saves both operands
    modify(saved)
    with pytest.raises(gv.InplaceModificationError, match=op_name):
        loss.backward()


def test_changing_a_saved_output_in_place_raises() -> None:
    x = leaf([0.5, 1.0])
    out = x.exp()  # exp saves its output
    loss = out.sum()
    out.mul_(2.0)
    with pytest.raises(gv.InplaceModificationError, match="mul_"):
        loss.backward()


def test_changing_a_view_of_a_saved_tensor_under_no_grad_is_detected() -> None:
    x = leaf([1.0, 2.0, 3.0])
    saved = x * 1
    loss = (saved * saved).sum()
    with gv.no_grad():
        saved[0:2].mul_(10.0)
    with pytest.raises(gv.InplaceModificationError, match="mul_"):
        loss.backward()


def test_changing_a_tensor_that_backward_does_not_need_is_allowed() -> None:
    x = leaf([1.0, 2.0])
    shifted = x + 1  # add saves nothing
    loss = (shifted + 3).exp().sum()
    shifted.add_(100.0)
    loss.backward()
    np.testing.assert_allclose(values(x.grad), np.exp([5.0, 6.0]))


@pytest.mark.parametrize(
    ("combine", "expected"),
    [(lambda s, c: s * c, 2.0), (lambda s, c: s / c, 0.5), (lambda s, c: s * 3, 3.0)],
    ids=["mul tensor", "div tensor", "mul scalar"],
)
def test_changing_an_operand_whose_partner_needs_no_grad_is_allowed(
    combine: object, expected: float
) -> None:
    # As in PyTorch: d(s * c)/ds needs only c, so s is not needed for backward when c
    # does not require grad, and changing s in place afterwards must not make backward fail.
    x = leaf([1.0, 2.0])
    constant = gv.tensor([2.0, 2.0], dtype=gv.float64)
    shifted = x + 1
    loss = combine(shifted, constant).sum()
    shifted.add_(100.0)
    loss.backward()
    np.testing.assert_allclose(values(x.grad), [expected, expected])


def test_in_place_ops_are_differentiated() -> None:
    x = leaf([1.0, 2.0])
    w = leaf([3.0, -1.0])
    y = x * 1
    y.mul_(w)
    y.add_(x)
    y.sum().backward()
    np.testing.assert_allclose(values(x.grad), [4.0, 0.0])  # w + 1
    np.testing.assert_allclose(values(w.grad), [1.0, 2.0])  # x


def test_in_place_op_on_a_leaf_that_requires_grad_raises_outside_no_grad() -> None:
    x = leaf([1.0, 2.0])
    with pytest.raises(gv.AutogradError, match="leaf"):
        x.mul_(2.0)
    with gv.no_grad():
        x.mul_(2.0)  # an optimizer step
    np.testing.assert_allclose(values(x), [2.0, 4.0])
    assert x.is_leaf and x.requires_grad


def test_in_place_ops_bump_the_version_counter() -> None:
    x = gv.tensor([1.0, 2.0])
    start = x.version
    x.add_(1.0)
    x[0] = 3.0
    x.zero_()
    assert x.version == start + 3 and x.last_inplace_op == "zero_"
    assert x[0].version == x.version  # a view shares the counter


# ---------------------------------------------------------------------- grad modes
def test_no_grad_records_nothing() -> None:
    x = leaf([1.0, 2.0])
    with gv.no_grad():
        y = (x * 2).exp().sum()
        assert not autograd.is_grad_enabled()
    assert autograd.is_grad_enabled()
    assert not y.requires_grad and y.grad_fn is None and y.is_leaf


def test_no_grad_as_a_decorator_records_nothing() -> None:
    x = leaf([1.0, 2.0])

    @gv.no_grad()
    def double(t: gv.Tensor) -> gv.Tensor:
        return t * 2

    y = double(x)
    assert not y.requires_grad and y.grad_fn is None
    assert autograd.is_grad_enabled()
    assert (x * 2).requires_grad


def test_no_grad_restores_the_mode_after_an_exception() -> None:
    with pytest.raises(ValueError), gv.no_grad():
        raise ValueError("boom")
    assert autograd.is_grad_enabled()


def test_enable_grad_inside_no_grad_records() -> None:
    x = leaf([1.0, 2.0])
    with gv.no_grad():
        with gv.enable_grad():
            y = (x * x).sum()
        z = x * 2
    assert y.requires_grad and y.grad_fn is not None
    assert not z.requires_grad
    y.backward()
    np.testing.assert_allclose(values(x.grad), [2.0, 4.0])


def test_enable_grad_as_a_decorator_inside_no_grad() -> None:
    x = leaf([3.0])

    @gv.enable_grad()
    def square(t: gv.Tensor) -> gv.Tensor:
        return t * t

    with gv.no_grad():
        y = square(x)
    assert y.requires_grad and y.grad_fn is not None


def test_inference_mode_records_nothing() -> None:
    x = leaf([1.0, 2.0])
    with gv.inference_mode():
        y = x * 2
        assert autograd.is_inference_mode_enabled()
    assert not autograd.is_inference_mode_enabled()
    assert not y.requires_grad and y.grad_fn is None


def test_inference_tensors_cannot_enter_a_graph_later() -> None:
    w = leaf([1.0, 2.0])
    with gv.inference_mode():
        made_inside = gv.tensor([3.0, 4.0], dtype=gv.float64) * 1
    with pytest.raises(gv.AutogradError, match="inference"):
        w * made_inside
    with pytest.raises(gv.AutogradError, match="inference"):
        made_inside.requires_grad_()
    with pytest.raises(gv.AutogradError, match="inference"):
        made_inside.add_(1.0)
    # outside the graph it is an ordinary value, and a clone may enter one
    assert not (made_inside * 2).requires_grad
    (w * made_inside.clone()).sum().backward()
    np.testing.assert_allclose(values(w.grad), [3.0, 4.0])


def test_inference_mode_as_a_decorator() -> None:
    x = leaf([1.0])

    @gv.inference_mode()
    def predict(t: gv.Tensor) -> gv.Tensor:
        return t.exp()

    y = predict(x)
    assert not y.requires_grad and y.grad_fn is None
    with pytest.raises(gv.AutogradError):
        x * y


# ---------------------------------------------------------------------- autograd.grad
def test_autograd_grad_leaves_grad_untouched() -> None:
    x = leaf([1.0, 2.0])
    (g,) = autograd.grad((x * x).sum(), [x])
    np.testing.assert_allclose(values(g), [2.0, 4.0])
    assert x.grad is None
    (x * 5).sum().backward()
    (autograd.grad((x * x).sum(), x))
    np.testing.assert_allclose(values(x.grad), [5.0, 5.0])


def test_autograd_grad_allow_unused() -> None:
    x = leaf([1.0, 2.0])
    unused = leaf([3.0])
    loss = (x * x).sum()
    with pytest.raises(gv.AutogradError, match="allow_unused"):
        autograd.grad(loss, [x, unused], retain_graph=True)
    gx, gu = autograd.grad(loss, [x, unused], allow_unused=True)
    assert gu is None
    np.testing.assert_allclose(values(gx), [2.0, 4.0])


def test_autograd_grad_with_respect_to_a_non_leaf() -> None:
    x = leaf([1.0, 2.0])
    hidden = x * 3
    (g,) = autograd.grad((hidden * hidden).sum(), [hidden])
    np.testing.assert_allclose(values(g), [6.0, 12.0])
    assert x.grad is None and hidden.grad is None


# ---------------------------------------------------------------------- hooks
def test_a_leaf_hook_can_replace_the_gradient() -> None:
    x = leaf([1.0, 2.0])
    seen = []

    def double(g: gv.Tensor) -> gv.Tensor:
        seen.append(values(g).copy())
        return g * 2

    x.register_hook(double)
    (x * x).sum().backward()
    np.testing.assert_allclose(seen[0], [2.0, 4.0])
    np.testing.assert_allclose(values(x.grad), [4.0, 8.0])


def test_a_non_leaf_hook_replaces_what_flows_upstream() -> None:
    x = leaf([1.0, 2.0])
    hidden = x * 3
    hidden.register_hook(lambda g: g * 0 + 1)
    (hidden * hidden).sum().backward()
    np.testing.assert_allclose(values(x.grad), [3.0, 3.0])


def test_a_hook_returning_none_keeps_the_gradient_and_can_be_removed() -> None:
    x = leaf([1.0])
    calls = []
    handle = x.register_hook(lambda g: calls.append(1))
    (x * 4).sum().backward()
    np.testing.assert_allclose(values(x.grad), [4.0])
    handle.remove()
    (x * 4).sum().backward()
    assert len(calls) == 1
    np.testing.assert_allclose(values(x.grad), [8.0])


# ---------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [gv.float16, gv.float32, gv.float64])
def test_dtype_is_preserved_through_ops_and_grads(dtype: np.dtype) -> None:
    x = gv.tensor([[0.5, -1.0, 1.5], [2.0, 0.25, -0.5]], dtype=dtype, requires_grad=True)
    w = gv.tensor([[1.0], [-0.5], [0.25]], dtype=dtype, requires_grad=True)
    labels = gv.tensor([0, 2])
    steps = [
        x * 2.0,
        1.0 - x,
        x / 3,
        x**2,
        2.0**x,
        x.exp(),
        x.abs().log(),
        x.abs().sqrt(),
        x.tanh(),
        x.sigmoid(),
        x.relu(),
        gv.gelu(x),
        gv.gelu(x, approximate="tanh"),
        x.clamp(-1, 1),
        x @ w,
        x.sum(1),
        x.mean(0, keepdim=True),
        x.var(1),
        x.std(),
        x.max(1)[0],
        x.min(),
        x.softmax(1),
        x.log_softmax(-1),
        x.T,
        x.reshape(-1),
        x[0, 1:],
        x[[1, 0]],
        gv.cat([x, x], 0),
        gv.stack([x, x]),
        gv.where(x > 0, x, 0.5),
        gv.cross_entropy(x, labels),
        gv.mse_loss(x, x * 0.5),
    ]
    total = None
    for index, step in enumerate(steps):
        assert step.dtype == dtype, f"op {index} gave {step.dtype}"
        term = step.sum()
        total = term if total is None else total + term
    assert total.dtype == dtype
    total.backward()
    assert x.grad.dtype == dtype and w.grad.dtype == dtype
    assert x.grad.shape == x.shape and w.grad.shape == w.shape
    assert np.isfinite(values(x.grad).astype(np.float64)).all()


def test_integer_tensors_cannot_require_grad() -> None:
    with pytest.raises(gv.AutogradError, match="floating"):
        gv.tensor([1, 2, 3], requires_grad=True)
    with pytest.raises(gv.AutogradError, match="floating"):
        gv.arange(3).requires_grad_()
    with pytest.raises(gv.AutogradError, match="floating"):
        gv.zeros(2, dtype=gv.int64, requires_grad=True)
    assert not gv.arange(3).requires_grad
