"""Copy-on-write: no alias of a gradient can change a snapshot or another gradient."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams


def _model_with_grads() -> gv.Linear:
    gv.manual_seed(0)
    model = gv.Linear(3, 2)
    model(gv.randn(4, 3)).sum().backward()
    return model


MUTATIONS: dict[str, Callable[[gv.Tensor], object]] = {
    "grad.data.mul_": lambda g: g.data.mul_(0.5),
    "grad.detach().zero_": lambda g: g.detach().zero_(),
    "grad.view(-1).zero_": lambda g: g.view(-1).zero_(),
    "grad.T.zero_": lambda g: g.T.zero_(),
    "grad[0] = 5": lambda g: g.__setitem__(0, 5.0),
    "grad[0].zero_": lambda g: g[0].zero_(),
    "grad.copy_": lambda g: g.copy_(gv.ones_like(g)),
    "grad += 1": lambda g: g.add_(1.0),
    "grad.numpy()[...] = 0": lambda g: g.numpy().__setitem__(Ellipsis, 0),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_no_write_through_an_alias_reaches_the_snapshot(mutation: str) -> None:
    model = _model_with_grads()
    record = GradientsParams.from_module_grad(model).try_to_record()
    frozen = {e.param_id: e.array.tobytes() for e in record}
    expected_weight = model.weight.grad.numpy().copy()
    MUTATIONS[mutation](model.weight.grad)
    assert {e.param_id: e.array.tobytes() for e in record} == frozen
    # and the write did reach the gradient itself, as it would in PyTorch
    assert model.weight.grad.numpy().tobytes() != expected_weight.tobytes()


def test_leaves_sharing_one_incoming_gradient_stay_independent() -> None:
    p = gv.tensor([1.0, 2.0], requires_grad=True)
    q = gv.tensor([3.0, 4.0], requires_grad=True)
    ((p + q) * gv.tensor([5.0, 6.0])).sum().backward()  # Add hands one array to both
    p.grad.data.zero_()
    assert q.grad.tolist() == [5.0, 6.0]


def test_pass_gradients_and_grad_do_not_write_into_each_other() -> None:
    model = gv.Linear(3, 1, bias=False)
    passed = GradientsParams.from_grads(model(gv.ones(1, 3)).sum().backward(), model)
    before = model.weight.grad.numpy().copy()
    record = GradientsParams.from_module_grad(model).try_to_record()
    passed.get(model.weight.id).mul_(10)
    np.testing.assert_array_equal(model.weight.grad.numpy(), before)
    np.testing.assert_array_equal(record[model.weight.id].array, before)


def test_the_callers_seed_is_not_the_leaf_grad() -> None:
    x = gv.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    seed = gv.ones(2, 2)
    x.reshape(2, 2).backward(seed)
    seed.zero_()
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 1.0]
    y = gv.tensor([1.0, 2.0], requires_grad=True)
    seed = gv.ones(2)
    y.backward(seed)
    seed.mul_(100)
    assert y.grad.tolist() == [1.0, 1.0]


def test_broadcast_gradients_are_writable() -> None:
    w = gv.tensor([1.0, 2.0, 3.0], requires_grad=True)
    w.sum().backward()  # the gradient is a broadcast of a scalar
    w.grad.mul_(2)
    w.grad.numpy()[0] = 7
    assert w.grad.tolist() == [7.0, 2.0, 2.0]


def test_accumulator_does_not_alias_its_input() -> None:
    model = _model_with_grads()
    grads = GradientsParams.from_module_grad(model)
    expected = {pid: grads.get(pid).numpy() * 1 for pid in grads}
    accumulator = gv.GradientsAccumulator()
    accumulator.accumulate(model, grads)
    record = accumulator.current().try_to_record()
    for pid in grads:
        grads.get(pid).mul_(0)
    for pid, value in expected.items():
        np.testing.assert_array_equal(record[pid].array, value)
        np.testing.assert_array_equal(accumulator.current().get(pid).numpy(), value)


def test_accumulating_keeps_the_dtype_after_a_snapshot() -> None:
    model = _model_with_grads()
    accumulator = gv.GradientsAccumulator()
    accumulator.accumulate(model, GradientsParams.from_module_grad(model))
    accumulator.current().try_to_record()
    wider = GradientsParams()
    for name, p in model.named_parameters():
        wider.register(p.id, gv.ones(p.shape, dtype=gv.float64), name=name)
    accumulator.accumulate(model, wider)
    assert {accumulator.current().get(p.id).dtype for p in model.parameters()} == {gv.float32}
