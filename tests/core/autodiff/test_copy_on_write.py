"""Copy-on-write: no alias of a gradient can change a snapshot or another gradient."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import numpy as np
import pytest

import gradvault.core as gv
from gradvault.core import GradientsParams
from gradvault.core.autodiff.tensor import wrap


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


# --- every way a buffer leaves a tensor is an alias ----------------------------------
# Each handle gives something that writes into the gradient's buffer without passing
# through the gradient; each write goes through that handle.


def _write_numpy(handle: np.ndarray) -> None:
    handle += 1


def _write_tensor(handle: gv.Tensor) -> None:
    handle.add_(1.0)


HANDLES: dict[str, tuple[Callable[[gv.Tensor], object], Callable[[object], None]]] = {
    "numpy()": (lambda g: g.numpy(), _write_numpy),
    "np.asarray": (lambda g: np.asarray(g), _write_numpy),
    "np.array(copy=False)": (lambda g: np.array(g, copy=False), _write_numpy),
    "np.asarray(dtype=same)": (lambda g: np.asarray(g, dtype=g.dtype), _write_numpy),
    ".data": (lambda g: g.data, _write_tensor),
    "detach()": (lambda g: g.detach(), _write_tensor),
    "view(-1)": (lambda g: g.view(-1), _write_tensor),
    "[0]": (lambda g: g[0], _write_tensor),
    ".T": (lambda g: g.T, _write_tensor),
    ".data.numpy()": (lambda g: g.data.numpy(), _write_numpy),
    "np.from_dlpack": (lambda g: np.from_dlpack(g), _write_numpy),
}


@pytest.mark.parametrize("handle", list(HANDLES))
def test_an_alias_taken_before_the_capture_cannot_change_the_record(handle: str) -> None:
    take, write = HANDLES[handle]
    model = _model_with_grads()
    alias = take(model.weight.grad)
    record = GradientsParams.from_module_grad(model).try_to_record()
    frozen = record[model.weight.id].array.copy()
    write(alias)
    np.testing.assert_array_equal(record[model.weight.id].array, frozen)
    # the alias still is one: the gradient sees the write, as in PyTorch
    assert not np.array_equal(model.weight.grad.numpy(), frozen)


@pytest.mark.parametrize("handle", list(HANDLES))
def test_an_alias_taken_after_the_capture_cannot_change_the_record(handle: str) -> None:
    take, write = HANDLES[handle]
    model = _model_with_grads()
    record = GradientsParams.from_module_grad(model).try_to_record()
    frozen = record[model.weight.id].array.copy()
    alias = take(model.weight.grad)
    write(alias)
    np.testing.assert_array_equal(record[model.weight.id].array, frozen)
    assert not np.array_equal(model.weight.grad.numpy(), frozen)


def test_asarray_after_the_capture_does_not_write_into_the_record() -> None:
    model = _model_with_grads()
    record = GradientsParams.from_module_grad(model).try_to_record()
    frozen = record[model.weight.id].array.copy()
    np.asarray(model.weight.grad)[:] = 5
    np.testing.assert_array_equal(record[model.weight.id].array, frozen)
    assert (model.weight.grad.numpy() == 5).all()


def test_no_other_protocol_hands_out_the_buffer() -> None:
    # numpy(), __array__ and __dlpack__ are the only ways out; a new one must join the
    # mechanism (and HANDLES)
    grad = _model_with_grads().weight.grad
    for protocol in ("__array_interface__", "__cuda_array_interface__"):
        assert not hasattr(grad, protocol), protocol
    with pytest.raises(TypeError):
        memoryview(grad)  # type: ignore[arg-type]


def test_a_copying_conversion_is_not_an_alias() -> None:
    model = _model_with_grads()
    as_double = np.asarray(model.weight.grad, dtype=np.float64)
    record = GradientsParams.from_module_grad(model).try_to_record()
    frozen = record[model.weight.id].array.copy()
    as_double += 1
    np.testing.assert_array_equal(record[model.weight.id].array, frozen)
    np.testing.assert_array_equal(model.weight.grad.numpy(), frozen)
    with pytest.raises(ValueError, match="without a copy"):
        np.array(model.weight.grad, dtype=np.float64, copy=False)


def test_capture_shares_buffers_that_nothing_else_reaches() -> None:
    # what keeps the trainer's wait proportional to the number of gradients
    buffers = [np.arange(6, dtype=np.float32) + i for i in range(3)]
    grads = GradientsParams()
    for i, array in enumerate(buffers):
        grads.register(gv.ParamId(), wrap(array), name=f"p{i}")
    record = grads.try_to_record()
    assert all(np.shares_memory(e.array, b) for e, b in zip(record, buffers, strict=True))
    grads.get(next(iter(grads))).add_(1.0)  # and the first write moves the gradient off
    assert record.entries[0].array.tolist() == list(range(6))


def test_the_recorders_snapshot_on_disk_ignores_writes_through_aliases(
    tmp_path, monkeypatch
) -> None:
    from gradvault.core.store import SnapshotStore

    model = _model_with_grads()
    grads = GradientsParams.from_module_grad(model)
    before = model.weight.grad.numpy().copy()
    early = model.bias.grad.numpy()  # handed out before the snapshot
    bias_before = early.copy()
    release = threading.Event()
    original = SnapshotStore.write_snapshot

    async def held(self, record, **kwargs):  # the capture is done; the write waits
        await asyncio.to_thread(release.wait)
        return await original(self, record, **kwargs)

    monkeypatch.setattr(SnapshotStore, "write_snapshot", held)
    with gv.Recorder(tmp_path / "store") as recorder:
        handle = recorder.start_snapshot(grads, run="r", step=0)
        np.asarray(model.weight.grad)[:] = 5  # handed out after the snapshot
        early += 1
        release.set()
        info = handle.result(timeout=60)
    monkeypatch.undo()
    with gv.Recorder(tmp_path / "store") as fresh:
        restored = fresh.sync.restore(info.id, "cpu")
    assert restored.get(model.weight.id).numpy().tobytes() == before.tobytes()
    assert restored.get(model.bias.id).numpy().tobytes() == bias_before.tobytes()


def test_a_seed_with_an_array_out_is_not_the_leaf_grad() -> None:
    y = gv.tensor([1.0, 2.0], requires_grad=True)
    seed = gv.ones(2)
    handle = seed.numpy()
    y.backward(seed)
    handle[:] = 100
    assert y.grad.tolist() == [1.0, 1.0]


def _cat_graph(seed: gv.Tensor) -> tuple[gv.Tensor, gv.Gradients]:
    p = gv.tensor([1.0, 2.0], requires_grad=True)
    q = gv.tensor([3.0], requires_grad=True)
    return p, gv.cat([p, q]).backward(seed)  # each leaf gets a slice of the seed


def _setitem_graph(seed: gv.Tensor) -> tuple[gv.Tensor, gv.Gradients]:
    v = gv.tensor([1.0, 2.0], requires_grad=True)
    y = gv.zeros(3)
    y[1:3] = v  # v's gradient is a slice of the seed
    return v, y.backward(seed)


@pytest.mark.parametrize("graph", [_cat_graph, _setitem_graph])
def test_slices_of_the_seed_are_views_like_any_other(graph: Callable) -> None:
    seed = gv.ones(3)
    leaf, passed = graph(seed)
    grads = GradientsParams()
    grads.register(gv.ParamId(), passed.get(leaf), name="passed")
    record = grads.try_to_record()
    seed.mul_(100)
    assert leaf.grad.tolist() == [1.0, 1.0]
    assert record.entries[0].array.tolist() == [1.0, 1.0]


# --- the accumulator -----------------------------------------------------------------


@pytest.mark.parametrize("handle", list(HANDLES))
def test_an_alias_of_an_accumulated_gradient_cannot_reach_the_running_sum(handle: str) -> None:
    take, write = HANDLES[handle]
    model = _model_with_grads()
    grads = GradientsParams.from_module_grad(model)
    expected = model.weight.grad.numpy().copy()
    alias = take(grads.get(model.weight.id))
    accumulator = gv.GradientsAccumulator()
    accumulator.accumulate(model, grads)
    write(alias)  # after accumulate, before the mid-window snapshot
    np.testing.assert_array_equal(accumulator.current().get(model.weight.id).numpy(), expected)
    record = accumulator.current().try_to_record()
    write(alias)  # after the snapshot
    np.testing.assert_array_equal(record[model.weight.id].array, expected)
    accumulator.accumulate(model, GradientsParams.from_module_grad(model))
    np.testing.assert_array_equal(record[model.weight.id].array, expected)
