"""GradientsParams and GradientsAccumulator: Burn's semantics, one test each."""

from __future__ import annotations

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsAccumulator, GradientsParams, ParamId, ShapeMismatchError


class TwoHeads(gv.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = gv.Linear(4, 3)
        self.head = gv.Linear(3, 2)

    def forward(self, x: gv.Tensor) -> gv.Tensor:
        return self.head(self.body(x).relu())


def _backward(model: gv.Module) -> gv.Gradients:
    x = gv.randn(5, 4)
    return model(x).sum().backward()


def test_backward_returns_the_pass_gradients_and_accumulates_grad() -> None:
    model = TwoHeads()
    first = _backward(model)
    weight = model.body.weight
    np.testing.assert_array_equal(first.get(weight).numpy(), weight.grad.numpy())
    second = _backward(model)
    np.testing.assert_allclose(
        weight.grad.numpy(), first.get(weight).numpy() + second.get(weight).numpy(), rtol=1e-6
    )


def test_from_grads_consumes_the_gradients() -> None:
    model = TwoHeads()
    grads = _backward(model)
    assert len(grads) == 4
    params = GradientsParams.from_grads(grads, model)
    assert len(params) == 4
    assert len(grads) == 0
    assert set(params) == {p.id for p in model.parameters()}


def test_from_module_removes_only_the_module_gradients_and_can_be_called_again() -> None:
    model = TwoHeads()
    grads = _backward(model)
    body = GradientsParams.from_module(grads, model.body)
    assert set(body) == {model.body.weight.id, model.body.bias.id}
    assert len(grads) == 2  # the head's gradients are still there
    head = GradientsParams.from_module(grads, model.head)
    assert set(head) == {model.head.weight.id, model.head.bias.id}
    assert grads.is_empty()
    assert GradientsParams.from_module(grads, model.head).is_empty()


def test_from_params_filters_by_id() -> None:
    model = TwoHeads()
    grads = _backward(model)
    only = GradientsParams.from_params(grads, model, [model.head.bias.id])
    assert list(only) == [model.head.bias.id]
    assert len(grads) == 3


def test_get_and_remove_return_none_for_a_missing_id() -> None:
    params = GradientsParams()
    assert params.get(ParamId()) is None
    assert params.remove(ParamId()) is None


def test_wrong_ndim_raises_a_clear_error() -> None:
    model = TwoHeads()
    params = GradientsParams.from_grads(_backward(model), model)
    pid = model.body.weight.id
    assert params.get(pid, ndim=2).shape == (3, 4)
    with pytest.raises(ShapeMismatchError, match=str(pid)) as info:
        params.get(pid, ndim=1)
    assert "body.weight" in str(info.value) and "2 dims" in str(info.value)
    with pytest.raises(ShapeMismatchError):
        params.remove(pid, ndim=3)
    assert pid in params  # a refused remove keeps the gradient


def test_register_replaces() -> None:
    params = GradientsParams()
    pid = ParamId()
    params.register(pid, gv.ones(2))
    params.register(pid, gv.zeros(3))
    assert len(params) == 1
    assert params.get(pid).shape == (3,)


def test_to_device_moves_only_the_module_entries() -> None:
    model = TwoHeads()
    params = GradientsParams.from_grads(_backward(model), model)
    outside = ParamId()
    stray = gv.ones(2)
    params.register(outside, stray)
    moved_before = {pid: params.get(pid) for pid in params}
    assert params.to_device("cpu", model.body) is params
    assert params.get(outside) is stray
    assert all(params.get(pid) is t for pid, t in moved_before.items())


def test_accumulator_sums_and_resets() -> None:
    model = TwoHeads()
    accumulator = GradientsAccumulator()
    a = GradientsParams.from_grads(_backward(model), model)
    b = GradientsParams.from_grads(_backward(model), model)
    expected = {pid: a.get(pid).numpy() + b.get(pid).numpy() for pid in a}
    accumulator.accumulate(model, a)
    accumulator.accumulate(model, b)
    total = accumulator.grads()
    for pid, value in expected.items():
        np.testing.assert_array_equal(total.get(pid).numpy(), value)
    assert accumulator.grads().is_empty()


def test_accumulating_does_not_change_the_inputs() -> None:
    model = TwoHeads()
    accumulator = GradientsAccumulator()
    a = GradientsParams.from_grads(_backward(model), model)
    before = {pid: a.get(pid).numpy().copy() for pid in a}
    accumulator.accumulate(model, a)
    accumulator.accumulate(model, GradientsParams.from_grads(_backward(model), model))
    for pid, value in before.items():
        np.testing.assert_array_equal(a.get(pid).numpy(), value)


def test_repr_names_ids_names_and_shapes() -> None:
    model = TwoHeads()
    params = GradientsParams.from_grads(_backward(model), model)
    text = repr(params)
    assert str(model.body.weight.id) in text and "body.weight" in text and "[3, 4]" in text


def test_param_id_text_form_round_trips_and_orders() -> None:
    ids = [ParamId() for _ in range(50)]
    for pid in ids:
        assert ParamId.parse(str(pid)) == pid
        assert len(str(pid)) == 16
    assert sorted(ids) == sorted(ids, key=lambda p: p.value)
    with pytest.raises(ValueError, match="16 lowercase hex"):
        ParamId.parse("../etc/passwd")
