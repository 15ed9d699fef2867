"""The gradcheck and PyTorch-parity suites again, with gradvault on ``cuda:0``.

Skipped cleanly when CuPy is not installed or sees no CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradvault.core as gv

from ..cuda import require_cuda

pytestmark = pytest.mark.gpu

require_cuda()

from tests.core.autodiff.test_autograd_ops import CASES, HYPOTHESIS, check_case  # noqa: E402

DEVICE = "cuda:0"


@pytest.mark.parametrize("name", sorted(CASES))
@HYPOTHESIS
@given(data=st.data())
def test_first_order_gradient_matches_finite_differences_on_gpu(
    name: str, data: st.DataObject
) -> None:
    check_case(CASES[name], data, DEVICE, second_order=False)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(HYPOTHESIS, max_examples=5)
@given(data=st.data())
def test_second_order_gradient_matches_finite_differences_on_gpu(
    name: str, data: st.DataObject
) -> None:
    check_case(CASES[name], data, DEVICE, second_order=True)


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(320))
def test_random_expression_matches_torch_on_gpu(seed: int) -> None:
    pytest.importorskip("torch")
    from tests.core.autodiff.test_autograd_parity import check_expression

    check_expression(seed, DEVICE)


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(1000, 1030))
def test_random_expression_second_order_matches_torch_on_gpu(seed: int) -> None:
    pytest.importorskip("torch")
    from tests.core.autodiff.test_autograd_parity import check_grad_second_order

    check_grad_second_order(seed, DEVICE)


def test_tensors_and_grads_stay_on_the_gpu() -> None:
    x = gv.tensor([0.5, -1.0, 2.0], dtype=gv.float64, device=DEVICE, requires_grad=True)
    loss = (x.exp() * x).sum()
    assert str(loss.device) == DEVICE
    loss.backward()
    assert str(x.grad.device) == DEVICE
    values = np.array([0.5, -1.0, 2.0])
    np.testing.assert_allclose(x.grad.numpy(), np.exp(values) * (1 + values), rtol=1e-12)


def test_moving_between_cpu_and_gpu_is_differentiable() -> None:
    x = gv.tensor([1.0, 2.0], dtype=gv.float64, requires_grad=True)
    on_gpu = x.to(DEVICE)
    assert str(on_gpu.device) == DEVICE and on_gpu.grad_fn is not None
    (on_gpu * on_gpu).sum().backward()
    assert str(x.grad.device) == "cpu"
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


def test_a_seed_gradient_on_another_device_is_refused_naming_both() -> None:
    x = gv.tensor([1.0, 2.0], dtype=gv.float64, device=DEVICE, requires_grad=True)
    out = x * 3
    on_cpu = gv.tensor([1.0, 1.0], dtype=gv.float64)
    with pytest.raises(gv.AutogradError, match=rf"grad_outputs entry is on cpu; .* on {DEVICE}"):
        gv.autograd.grad(out, x, grad_outputs=on_cpu)
    with pytest.raises(gv.AutogradError, match=rf"entry is on cpu; its output is on {DEVICE}"):
        out.backward(on_cpu)
    assert x.grad is None


def test_gradgradcheck_draws_its_grad_outputs_on_the_outputs_device() -> None:
    x = gv.tensor([[0.5, -0.25]], dtype=gv.float64, device=DEVICE, requires_grad=True)
    assert gv.autograd.gradgradcheck(lambda t: (t * t).mT, (x,))
