"""Edge cases where gradvault follows PyTorch (or refuses clearly where it cannot)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import AutogradError
from gradvault.core.autodiff.autograd import (
    gradcheck,
    inference_mode,
    is_grad_enabled,
    set_grad_enabled,
)

torch = pytest.importorskip("torch")


def test_in_place_on_a_base_whose_view_is_in_the_graph_raises() -> None:
    x = gv.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * 1
    view = y[0:2]
    with pytest.raises(AutogradError, match="mul_"):
        y.mul_(3)
    view.sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 0.0]


def test_retain_grad_follows_an_in_place_op() -> None:
    x = gv.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    y.retain_grad()
    y.add_(1)
    (y * y).sum().backward()
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    ty = tx * 2
    ty.retain_grad()
    ty.add_(1)
    (ty * ty).sum().backward()
    assert y.grad.tolist() == ty.grad.tolist()
    assert x.grad.tolist() == tx.grad.tolist()


def test_backward_inputs_fills_a_non_leaf_grad() -> None:
    x = gv.tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    (y * y).sum().backward(inputs=[y])
    assert y.grad.tolist() == [6.0, 12.0]
    assert x.grad is None


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: gv.ones(2, dtype=gv.float16) * gv.tensor(2.0, dtype=gv.float64), "float16"),
        (lambda: gv.ones(2) * np.array(2.0), "float32"),
        (lambda: gv.tensor([1, 2]) / 2, "float32"),
        (lambda: gv.tensor([1, 2]) * 2.5, "float32"),
        (lambda: gv.tensor([1, 2]) * 2, "int64"),
        (lambda: gv.ones(2, dtype=gv.float64) * gv.ones(2), "float64"),
        (lambda: gv.tensor([1, 2]) * gv.tensor(2.0, dtype=gv.float64), "float64"),
    ],
)
def test_type_promotion_follows_pytorch(make, expected: str) -> None:
    assert str(make().dtype) == expected


def test_cross_entropy_with_every_target_ignored() -> None:
    logits = gv.randn(3, 4, requires_grad=True)
    loss = gv.cross_entropy(logits, gv.tensor([-100, -100, -100]))
    loss.backward()
    assert math.isnan(loss.item())
    assert not logits.grad.numpy().any()


def test_pow_gradient_at_zero_to_the_zero() -> None:
    a = gv.tensor([0.0, 2.0], dtype=gv.float64, requires_grad=True)
    b = gv.tensor([0.0, 3.0], dtype=gv.float64, requires_grad=True)
    (a**b).sum().backward()
    ta = torch.tensor([0.0, 2.0], dtype=torch.float64, requires_grad=True)
    tb = torch.tensor([0.0, 3.0], dtype=torch.float64, requires_grad=True)
    (ta**tb).sum().backward()
    assert a.grad.tolist() == ta.grad.tolist()
    assert b.grad.tolist() == tb.grad.tolist()


def test_grad_mode_switches() -> None:
    x = gv.ones(2, requires_grad=True)
    with set_grad_enabled(False):
        assert not (x * 2).requires_grad
    assert (x * 2).requires_grad
    set_grad_enabled(False)
    assert not is_grad_enabled()
    set_grad_enabled(True)
    with inference_mode(), inference_mode(False):
        assert (x * 2).requires_grad


def test_std_takes_unbiased() -> None:
    x = gv.tensor([1.0, 2.0, 4.0], dtype=gv.float64)
    assert x.std(unbiased=False).item() == pytest.approx(np.std([1, 2, 4]))
    assert x.std().item() == pytest.approx(np.std([1, 2, 4], ddof=1))


def test_gradcheck_on_a_non_contiguous_input() -> None:
    a = gv.randn(3, 4, dtype=gv.float64).T.detach().requires_grad_()
    assert gradcheck(lambda t: (t * t).sum(), (a,))


def test_bare_no_grad_decorator() -> None:
    @gv.no_grad
    def double(t: gv.Tensor) -> gv.Tensor:
        return t * 2

    assert not double(gv.ones(2, requires_grad=True)).requires_grad


@pytest.mark.parametrize("x_shape", [(4,), (3, 4), (2, 3, 4)])
def test_linear_matches_pytorch_and_gradcheck(x_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(x_shape), rng.standard_normal((5, 4)), rng.standard_normal(5)]
    ours = [gv.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    seed = rng.standard_normal(x_shape[:-1] + (5,))
    out = gv.linear(*ours)
    out.backward(gv.tensor(seed))
    reference = torch.nn.functional.linear(*theirs)
    reference.backward(torch.tensor(seed))
    np.testing.assert_allclose(out.detach().numpy(), reference.detach().numpy(), rtol=1e-6)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-6, atol=1e-12)
    assert gradcheck(gv.linear, tuple(ours), check_second_order=True)
